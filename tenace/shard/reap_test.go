package shard

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
)

// owner drives a table as Shard.handle does: Tidy after each batch; a reap
// request that a releaser got from ReleaseByCAS reaches it only if the
// mailbox had room (TrySend), and then only as a wake-up for a batch.
type owner struct {
	tb *Table[int]
}

func (o owner) batch() { o.tb.Tidy() }

// grantKeys acquires n new keys, prefix followed by 0 … n-1, and returns
// their Helds.
func grantKeys(t *testing.T, tb *Table[int], prefix string, n int) []*Held[int] {
	t.Helper()
	hs := make([]*Held[int], n)
	for i := range hs {
		hs[i] = grantKey(t, tb, fmt.Sprint(prefix, i))
	}
	return hs
}

// grantKey acquires key and returns its Held, on the heap as a lease keeps it.
func grantKey(t *testing.T, tb *Table[int], key string) *Held[int] {
	t.Helper()
	w := &Waiter[int]{}
	require.True(t, tb.Acquire(key, w))
	return heldOf(w)
}

// The releaser whose CAS makes the sweep due is told so, exactly when at
// least reapDepth entries are free and at least as many as are held; the
// ones before it are not.
func TestReleaseByCASAsksForASweepWhenItIsDue(t *testing.T) {
	const n = 3 * reapDepth
	tb := NewTable[int]()
	hs := grantKeys(t, tb, "k", n)
	free, sweeps := 0, 0
	for i, h := range hs {
		released, reap := tb.ReleaseByCAS(h)
		require.True(t, released)
		free++
		held := n - i - 1
		require.Equal(t, free >= reapDepth && free >= held, reap, "release %d: %d free, %d held", i, free, held)
		require.Equal(t, reap, tb.ReapDue())
		if reap {
			// The owner sweeps: only the keys still held are left.
			owner{tb}.batch()
			require.Equal(t, held, tb.Entries())
			require.NoError(t, tb.CheckInvariants())
			free = 0
			sweeps++
		}
	}
	require.Equal(t, 2, sweeps, "at 96 free / 96 held, then at 64 free / 32 held")
	require.Less(t, tb.Entries(), reapDepth, "an idle table keeps fewer than reapDepth free entries")
}

// Grant.Release says that when its reap request is dropped because the
// mailbox is full, a batch comes next and the shard checks after every
// batch: the batch after the dropped request finds the sweep due.
func TestADroppedReapRequestIsFoundDueByTheNextBatch(t *testing.T) {
	tb := NewTable[int]()
	hs := grantKeys(t, tb, "k", reapDepth)
	var reap bool
	for _, h := range hs {
		_, reap = tb.ReleaseByCAS(h)
	}
	require.True(t, reap, "the last release asked")
	// Its TrySend found the mailbox full and dropped the request.
	require.True(t, tb.ReapDue(), "the next batch finds the sweep due anyway")
	owner{tb}.batch()
	require.Zero(t, tb.Entries())
	require.False(t, tb.ReapDue())
}

// The owner's own changes can make a sweep due with no releaser to see it:
// releases by message delete held entries, and the held count drops under
// the free ones. The owner's Tidy after the batch sweeps.
func TestTheOwnerSweepsWhenItsOwnBatchMadeItDue(t *testing.T) {
	const n = 200
	tb := NewTable[int]()
	var ws []*Waiter[int]
	for i := range n {
		w := &Waiter[int]{}
		require.True(t, tb.Acquire(fmt.Sprint("k", i), w))
		ws = append(ws, w)
	}
	// reapDepth released by CAS: as many free, but fewer than held.
	for _, w := range ws[:reapDepth] {
		released, reap := tb.ReleaseByCAS(heldOf(w))
		require.True(t, released)
		require.False(t, reap)
	}
	owner{tb}.batch()
	require.Equal(t, n, tb.Entries(), "not due: fewer free than held")
	// One batch of releases by message: the held count falls under the
	// free entries, and no releaser's CAS saw it.
	for i, w := range ws[reapDepth : n-36] {
		released, _ := tb.Release(fmt.Sprint("k", reapDepth+i), w.Token())
		require.True(t, released)
	}
	require.True(t, tb.ReapDue(), "%d free, %d held", tb.Entries()-tb.Len(), tb.Len())
	owner{tb}.batch()
	require.Equal(t, 36, tb.Entries(), "only the keys still held")
	require.NoError(t, tb.CheckInvariants())
}

// A burst released by message (every key had waiters, or its holder used
// Shard.Release) leaves no free entry, so no sweep comes due; the owner's
// Tidy still rebuilds the map once it has shrunk far below its peak.
// (Found in review: only a Sync did, after reaping became lazy.)
func TestTidyRebuildsTheMapAfterABurstReleasedByMessage(t *testing.T) {
	tb := NewTable[int]()
	var ws []*Waiter[int]
	for i := range 2 * shrinkMin {
		w := &Waiter[int]{}
		require.True(t, tb.Acquire(fmt.Sprint("k", i), w))
		ws = append(ws, w)
	}
	for i, w := range ws {
		released, next := tb.Release(fmt.Sprint("k", i), w.Token())
		require.True(t, released)
		require.Nil(t, next)
	}
	require.False(t, tb.ReapDue(), "nothing was released by CAS")
	require.Equal(t, 2*shrinkMin, tb.peak)
	tb.Tidy()
	require.Zero(t, tb.peak, "the map was rebuilt at its new size")
	require.NoError(t, tb.CheckInvariants())
}

// A burst of a million keys held at once and released by CAS is swept a
// geometric number of times (each sweep when half the entries are free):
// the entries a sweep walks stay within a small multiple of the releases.
func TestSweepsOfABurstWalkFewEntriesPerRelease(t *testing.T) {
	const n = 100_000
	tb := NewTable[int]()
	hs := grantKeys(t, tb, "k", n)
	walked := 0
	for _, h := range hs {
		if _, reap := tb.ReleaseByCAS(h); reap {
			walked += tb.Entries()
			tb.Reap()
		}
	}
	require.Less(t, tb.Entries(), reapDepth)
	require.LessOrEqual(t, walked, 3*n, "sweeps walked %d entries for %d releases", walked, n)
}

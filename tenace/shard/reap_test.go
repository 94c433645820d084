package shard

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
)

// owner drives a table as Shard.handle does: Tidy at the start of each
// batch; a reap request that a releaser got from ReleaseByCAS / link
// reaches it only if the mailbox had room (TrySend).
type owner struct {
	tb *Table[int]
}

func (o owner) batch() { o.tb.Tidy() }

// grantKey acquires key and returns its Held, on the heap as a lease keeps it.
func grantKey(t *testing.T, tb *Table[int], key string) *Held[int] {
	t.Helper()
	w := &Waiter[int]{}
	require.True(t, tb.Acquire(key, w))
	return heldOf(w)
}

// pausedPush is the first half of ReleaseByCAS: the CAS and the swap,
// then the releaser is descheduled before link. It returns what link needs.
func pausedPush(t *testing.T, tb *Table[int], h *Held[int]) (below *Held[int]) {
	t.Helper()
	require.True(t, h.lock.state.CompareAndSwap(held(h.token), stFree))
	tb.held.Add(-1)
	return tb.freed.Swap(h)
}

// The pushes below a Held that Reap found unlinked (kept awaited) are
// counted as reaped though their entries are still in the map. If the
// releaser's reap request, once it links, is dropped on a full mailbox, the
// owner must still come back to them: ReapDue holds while a Held awaits its
// link, so the next batch reaps them. (Found in review: before, an idle
// shard kept every entry below the cut — 499 here.)
func TestADroppedWakeAfterAnAwaitedHeldStrandsNoEntries(t *testing.T) {
	const n = 500
	tb := NewTable[int]()
	o := owner{tb}
	var hs []*Held[int]
	for i := range n {
		hs = append(hs, grantKey(t, tb, fmt.Sprint("k", i)))
	}
	// A burst of releases by CAS while the owner is busy with one long
	// batch: their every-reapDepth-th requests are queued in the mailbox.
	requests := 0
	for _, h := range hs[:n-1] {
		released, reap := tb.ReleaseByCAS(h)
		require.True(t, released)
		if reap {
			requests++
		}
	}
	require.Equal(t, (n-1)/reapDepth, requests)
	// The last releaser swaps, then is descheduled before its link.
	paused := hs[n-1]
	below := pausedPush(t, tb, paused)
	// The owner's next batch: the reap is due, and finds paused unlinked;
	// the queued requests are applied in that batch, still before the link.
	o.batch()
	for range requests {
		tb.Reap() // msgReap
	}
	require.Equal(t, []*Held[int]{paused}, tb.awaited)
	// The releaser links, and asks for a reap; the mailbox is full by now
	// (other callers' acquires), so this one TrySend drops the request —
	// the only message dropped in the whole scenario.
	require.True(t, tb.link(paused, below))
	// The mailbox drains: more batches, no more releases by CAS.
	o.batch()
	o.batch()
	require.Zero(t, tb.Len(), "nothing is held")
	require.Less(t, tb.Entries(), reapDepth,
		"an idle shard keeps %d idle entries (ReapDue=%v): every key below the awaited Held", tb.Entries(), tb.ReapDue())
}

// Grant.Release says that when its reap request is dropped because the
// mailbox is full, "the next batch finds the reap due anyway". The request
// fires when pushes is a multiple of reapDepth, and Reap counts the pushes
// it covered rounded down to a multiple, so the batch after the dropped
// request finds the reap due. (Found in review: before, the last Reap's
// exact count made it miss, leaving up to 2*reapDepth-2 idle entries.)
func TestADroppedReapRequestIsFoundDueByTheNextBatch(t *testing.T) {
	tb := NewTable[int]()
	o := owner{tb}
	var hs []*Held[int]
	for i := range 2*reapDepth - 1 {
		hs = append(hs, grantKey(t, tb, fmt.Sprint("k", i)))
	}
	released, _ := tb.ReleaseByCAS(hs[0])
	require.True(t, released)
	tb.Reap() // a Sync, after one push
	for i, h := range hs[1:reapDepth] {
		released, reap := tb.ReleaseByCAS(h)
		require.True(t, released)
		require.Equal(t, i+2 == reapDepth, reap)
	}
	// The request of push reapDepth was dropped: the mailbox was full, so a
	// batch comes next.
	require.True(t, tb.ReapDue(), "the next batch finds the reap due anyway (Grant.Release's doc)")
	o.batch()
	require.Equal(t, len(hs)-reapDepth, tb.Entries(), "only the keys still held are left")
	require.False(t, tb.ReapDue())
}

// A burst released by message (every key had waiters, or its holder used
// Shard.Release) pushes nothing on the reclaim list, so no reap comes due;
// the owner's Tidy still rebuilds the map once it has shrunk far below its
// peak. (Found in review: only a Sync did, after reaping became lazy.)
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

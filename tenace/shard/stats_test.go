package shard

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
)

// sharedWaiter is a waiter that asks for its key shared, with permits.
func sharedWaiter(permits int) *Waiter[int] {
	w := &Waiter[int]{}
	w.SetShared(true, permits)
	return w
}

// requireCounts checks the table's counts at a settled point: SharedStats
// (keys held shared, shared holders, shared waiters), Len and Waiting,
// and the invariants (6 included: the counts are the entries').
func requireCounts(t *testing.T, tb *Table[int], keys, holders, sharedWaiting, held, waiting int, msg string) {
	t.Helper()
	k, h, w := tb.SharedStats()
	require.Equal(t, [3]int{keys, holders, sharedWaiting}, [3]int{k, h, w}, "%s: keys held shared, shared holders, shared waiters", msg)
	require.Equal(t, held, tb.Len(), "%s: keys held", msg)
	require.Equal(t, waiting, tb.Waiting(), "%s: waiters", msg)
	require.NoError(t, tb.CheckInvariants(), msg)
}

// TestTableCountsByMode walks readers, a writer and a bulkhead through
// grants, queues, cancels (queued and raced), releases and a drain, with
// the counts by mode exact after every step.
func TestTableCountsByMode(t *testing.T) {
	tb := NewTable[int]()
	requireCounts(t, tb, 0, 0, 0, 0, 0, "empty")

	// rw: two readers hold it; a writer, then a reader, queue.
	r1, r2, wr, r3 := sharedWaiter(0), sharedWaiter(0), &Waiter[int]{}, sharedWaiter(0)
	require.True(t, tb.Acquire("rw", r1))
	require.True(t, tb.Acquire("rw", r2))
	require.False(t, tb.Acquire("rw", wr))
	require.False(t, tb.Acquire("rw", r3), "behind the writer")
	requireCounts(t, tb, 1, 2, 1, 1, 2, "two readers, a writer and a reader queued")

	// x: a writer holds it; a reader queues.
	x, r4 := &Waiter[int]{}, sharedWaiter(0)
	require.True(t, tb.Acquire("x", x))
	require.False(t, tb.Acquire("x", r4))
	requireCounts(t, tb, 1, 2, 2, 2, 3, "x held exclusive, a reader queued")

	removed, _ := tb.Cancel(r3)
	require.True(t, removed)
	requireCounts(t, tb, 1, 2, 1, 2, 2, "the queued reader gave up")

	h1, h2 := heldOf(r1), heldOf(r2)
	copied := *h1 // released below, after h1
	released, next := tb.ReleaseHeld(h1)
	require.True(t, released)
	require.Nil(t, next)
	requireCounts(t, tb, 1, 1, 1, 2, 2, "one reader left")
	released, next = tb.ReleaseHeld(h1)
	require.False(t, released, "a second release gives back nothing")
	require.Nil(t, next)
	requireCounts(t, tb, 1, 1, 1, 2, 2, "still one reader")
	released, next = tb.ReleaseHeld(&copied)
	require.False(t, released, "a copy released again gives back nothing either")
	require.Nil(t, next)
	requireCounts(t, tb, 1, 1, 1, 2, 2, "still one reader")
	_, next = tb.ReleaseHeld(h2)
	require.Same(t, wr, next, "the writer's turn")
	requireCounts(t, tb, 0, 0, 1, 2, 1, "rw held exclusive")

	_, next = tb.Release("x", x.Token())
	require.Same(t, r4, next)
	requireCounts(t, tb, 1, 1, 0, 2, 0, "x held shared by the reader")

	// bulk: one permit; the second caller's grant races its give-up.
	b1, b2 := sharedWaiter(1), sharedWaiter(1)
	require.True(t, tb.Acquire("bulk", b1))
	require.False(t, tb.Acquire("bulk", b2), "the only permit is taken")
	requireCounts(t, tb, 2, 2, 1, 3, 1, "bulk full, one waiting")
	_, next = tb.ReleaseHeld(heldOf(b1))
	require.Same(t, b2, next)
	requireCounts(t, tb, 2, 2, 0, 3, 0, "b2 granted")
	removed, next = tb.Cancel(b2)
	require.False(t, removed)
	require.Nil(t, next)
	requireCounts(t, tb, 1, 1, 0, 2, 0, "b2's raced grant gave its permit back")

	// A reader queued behind rw's writer, then the drain.
	require.False(t, tb.Acquire("rw", sharedWaiter(0)))
	requireCounts(t, tb, 1, 1, 1, 2, 1, "a reader waits for rw")
	require.Len(t, tb.Drain(), 1)
	requireCounts(t, tb, 0, 0, 0, 0, 0, "drained")
}

func TestCheckInvariantsCatchesAWrongCountByMode(t *testing.T) {
	tb := NewTable[int]()
	require.True(t, tb.Acquire("k", sharedWaiter(0)))
	require.False(t, tb.Acquire("k", &Waiter[int]{}))
	require.NoError(t, tb.CheckInvariants())
	for name, count := range map[string]*int{"keys": &tb.sharedKeys, "holders": &tb.sharedHolders, "waiting": &tb.sharedWaiting} {
		*count++
		require.ErrorContains(t, tb.CheckInvariants(), "invariant 6", name)
		*count--
	}
}

// TestShardPublishesCountsByMode: the shard publishes the table's counts
// by mode after each batch, before its replies, so a caller that has its
// reply (or a Sync) reads them exact.
func TestShardPublishesCountsByMode(t *testing.T) {
	g, queued := newTestGroup(t, 1)
	s := g.Shard(0)
	counts := func() [3]int {
		k, h, w := s.SharedStats()
		return [3]int{k, h, w}
	}
	require.Equal(t, [3]int{}, counts(), "idle")
	r1, err := s.AcquireShared(bg, "k", 0, Wait, nil)
	require.NoError(t, err)
	r2, err := s.AcquireShared(bg, "k", 0, Wait, nil)
	require.NoError(t, err)
	require.Equal(t, [3]int{1, 2, 0}, counts(), "two readers: counted before their replies")

	w := acquireAsync(bg, s, "k", nil) // a writer waits
	require.Equal(t, "k", <-queued)
	ch := make(chan Outcome, 1)
	go func() {
		o, _ := s.AcquireShared(bg, "k", 0, Wait, nil)
		ch <- o
	}()
	require.Equal(t, "k", <-queued)
	require.Equal(t, [3]int{1, 2, 1}, counts(), "a reader queued behind the writer")
	waiting, longest := s.Waiting()
	require.Equal(t, [2]int{2, 2}, [2]int{waiting, longest})

	r1.Grant().Release()
	r2.Grant().Release()
	wo := <-w
	require.NoError(t, wo.err)
	require.True(t, wo.out.Granted)
	require.NoError(t, s.Sync(bg))
	require.Equal(t, [3]int{0, 0, 1}, counts(), "the writer holds the key")

	wo.out.Grant().Release() // a message: a reader waits
	r3 := <-ch
	require.True(t, r3.Granted)
	require.Equal(t, [3]int{1, 1, 0}, counts(), "the last reader holds the key")
	r3.Grant().Release()
	require.NoError(t, s.Sync(bg))
	require.Equal(t, [3]int{}, counts(), "idle again")
	require.Zero(t, s.Size())
}

var bg = context.Background()

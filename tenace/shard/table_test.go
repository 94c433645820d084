package shard

import (
	"fmt"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestTableAbortDuringGrantCancelBeforeGrant(t *testing.T) {
	tb := NewTable[int]()
	a, b := &Waiter[int]{}, &Waiter[int]{}
	require.True(t, tb.Acquire("k", a))
	require.False(t, tb.Acquire("k", b))
	removed, next := tb.Cancel(b) // b gives up first
	require.True(t, removed)
	require.Nil(t, next)
	released, next := tb.Release("k", a.Token())
	require.True(t, released)
	require.Nil(t, next, "b left the queue, so nobody is granted")
	require.Zero(t, tb.Len(), "the key is free")
	require.NoError(t, tb.CheckInvariants())
}

func TestTableAbortDuringGrantGrantBeforeCancel(t *testing.T) {
	tb := NewTable[int]()
	a, b, c := &Waiter[int]{}, &Waiter[int]{}, &Waiter[int]{}
	require.True(t, tb.Acquire("k", a))
	require.False(t, tb.Acquire("k", b))
	require.False(t, tb.Acquire("k", c))
	_, next := tb.Release("k", a.Token()) // the grant reaches b first
	require.Same(t, b, next)
	removed, next := tb.Cancel(b) // then b's give-up arrives
	require.False(t, removed)
	require.Same(t, c, next, "b's grant passes straight on to c")
	_, next = tb.Release("k", c.Token())
	require.Nil(t, next)
	require.Zero(t, tb.Len(), "nothing leaked")
	// A late second cancel of b, or a release with b's token, is stale.
	removed, next = tb.Cancel(b)
	require.False(t, removed)
	require.Nil(t, next)
	released, _ := tb.Release("k", b.Token())
	require.False(t, released)
}

func TestTableStaleReleaseDoesNotFreeTheCurrentHolder(t *testing.T) {
	tb := NewTable[int]()
	a, b := &Waiter[int]{}, &Waiter[int]{}
	tb.Acquire("k", a)
	tb.Release("k", a.Token())
	tb.Acquire("k", b)
	released, _ := tb.Release("k", a.Token())
	require.False(t, released)
	holder, held := tb.Holder("k")
	require.True(t, held)
	require.Equal(t, b.Token(), holder)
}

func TestTableDrainReturnsEveryWaiter(t *testing.T) {
	tb := NewTable[int]()
	for i := range 6 {
		tb.Acquire(fmt.Sprint("k", i%2), &Waiter[int]{Value: i})
	}
	drained := tb.Drain()
	require.Len(t, drained, 4, "two holders, four waiters")
	for _, w := range drained {
		require.Equal(t, Cancelled, w.State())
	}
	require.Zero(t, tb.Len())
	require.Zero(t, tb.Waiting())
	require.NoError(t, tb.CheckInvariants())
}

func TestCheckInvariantsCatchesCorruption(t *testing.T) {
	tb := NewTable[int]()
	a, b := &Waiter[int]{}, &Waiter[int]{}
	tb.Acquire("k", a)
	tb.Acquire("k", b)
	require.NoError(t, tb.CheckInvariants())
	b.state = Granted // corrupt: a granted waiter left in the queue
	require.ErrorContains(t, tb.CheckInvariants(), "invariant 4")
	b.state = Queued
	tb.entries["k"].state.Store(heldWord(a.Token())) // corrupt: waiters, but a holder's CAS would free the key
	require.ErrorContains(t, tb.CheckInvariants(), "invariant 3")
	tb.entries["k"].state.Store(stDead) // corrupt: a dead entry in the map
	require.ErrorContains(t, tb.CheckInvariants(), "invariant 1")
}

func TestStateStrings(t *testing.T) {
	for s, want := range map[State]string{Queued: "queued", Granted: "granted", Refused: "refused", Cancelled: "cancelled", 0: "State(0)"} {
		require.Equal(t, want, s.String())
	}
}

// heldOf is what a holder keeps of w's grant, on the heap as a lease would.
func heldOf(w *Waiter[int]) *Held[int] {
	h := w.Held()
	return &h
}

func TestTableReleaseByCASFreesAKeyNobodyWaitsFor(t *testing.T) {
	tb := NewTable[int]()
	a := &Waiter[int]{}
	require.True(t, tb.Acquire("k", a))
	released, reap := tb.ReleaseByCAS(heldOf(a))
	require.True(t, released)
	require.False(t, reap)
	require.Zero(t, tb.Len(), "free at once")
	require.Equal(t, 1, tb.Entries(), "the entry waits for the owner's reap")
	require.NoError(t, tb.CheckInvariants())
	released, _ = tb.ReleaseByCAS(heldOf(a))
	require.False(t, released, "a second CAS of the same grant frees nothing")
	tb.Reap()
	require.Zero(t, tb.Entries())
	require.NoError(t, tb.CheckInvariants())
}

func TestTableReleaseByCASFailsWhenSomeoneWaits(t *testing.T) {
	tb := NewTable[int]()
	a, b := &Waiter[int]{}, &Waiter[int]{}
	tb.Acquire("k", a)
	require.False(t, tb.Acquire("k", b), "b queues, and the key is marked contended")
	released, _ := tb.ReleaseByCAS(heldOf(a))
	require.False(t, released, "the holder must send its release as a message")
	require.Equal(t, 1, tb.Len())
	ok, next := tb.Release("k", a.Token())
	require.True(t, ok)
	require.Same(t, b, next)
	released, _ = tb.ReleaseByCAS(heldOf(b))
	require.True(t, released, "b's grant has nobody behind it")
	require.NoError(t, tb.CheckInvariants())
}

func TestTableCancellingTheLastWaiterLetsTheHolderReleaseByCAS(t *testing.T) {
	tb := NewTable[int]()
	a, b := &Waiter[int]{}, &Waiter[int]{}
	tb.Acquire("k", a)
	tb.Acquire("k", b)
	removed, _ := tb.Cancel(b)
	require.True(t, removed)
	released, _ := tb.ReleaseByCAS(heldOf(a))
	require.True(t, released, "nobody waits any more")
	require.NoError(t, tb.CheckInvariants())
}

// TestTableAcquireOfAKeyFreedByCASBeforeTheReap: the key's entry is still in
// the map, free; the acquire takes it, and the reap that follows must leave
// it, because it is held again.
func TestTableAcquireOfAKeyFreedByCASBeforeTheReap(t *testing.T) {
	tb := NewTable[int]()
	a, b, c := &Waiter[int]{}, &Waiter[int]{}, &Waiter[int]{}
	tb.Acquire("k", a)
	released, _ := tb.ReleaseByCAS(heldOf(a))
	require.True(t, released)
	require.True(t, tb.Acquire("k", b), "a free entry is granted at once")
	tb.Reap()
	holder, held := tb.Holder("k")
	require.True(t, held, "the reap keeps a held entry")
	require.Equal(t, b.Token(), holder)
	require.False(t, tb.TryAcquire("k", c))
	require.NoError(t, tb.CheckInvariants())
}

// TestTableStaleCASOnARecycledEntry: an entry reaped and recycled for
// another key keeps its old holder's pointer valid, and that holder's CAS
// (the token differs) frees nothing.
func TestTableStaleCASOnARecycledEntry(t *testing.T) {
	tb := NewTable[int]()
	a, b := &Waiter[int]{}, &Waiter[int]{}
	tb.Acquire("k", a)
	ha := heldOf(a)
	released, _ := tb.ReleaseByCAS(ha)
	require.True(t, released)
	tb.Reap()
	tb.Acquire("other", b)
	require.Same(t, a.entry, b.entry, "the entry was recycled")
	released, _ = tb.ReleaseByCAS(ha)
	require.False(t, released)
	require.Equal(t, 1, tb.Len())
	require.NoError(t, tb.CheckInvariants())
}

// A sweep deletes the free entries wherever they are in the entry list
// (remove moves the last entry into the hole) and keeps the held ones.
func TestTableSweepKeepsHeldEntries(t *testing.T) {
	tb := NewTable[int]()
	hs := grantKeys(t, tb, "", 10)
	for _, i := range []int{0, 3, 4, 8, 9} {
		released, _ := tb.ReleaseByCAS(hs[i])
		require.True(t, released)
	}
	tb.Reap()
	require.Equal(t, 5, tb.Entries())
	for _, i := range []int{1, 2, 5, 6, 7} {
		_, held := tb.Holder(fmt.Sprint(i))
		require.True(t, held, "key %d", i)
	}
	require.NoError(t, tb.CheckInvariants())
}

func TestTableRebuildsItsMapAfterABurst(t *testing.T) {
	tb := NewTable[int]()
	hs := grantKeys(t, tb, "", 10*shrinkMin)
	require.Equal(t, 10*shrinkMin, tb.peak)
	for _, h := range hs[:len(hs)-10] {
		tb.ReleaseByCAS(h)
	}
	tb.Reap()
	require.Equal(t, 10, tb.Entries())
	require.Equal(t, 10, tb.peak, "the map was rebuilt at its new size")
	require.NoError(t, tb.CheckInvariants())
}

func TestTableDrainMakesEveryWordDead(t *testing.T) {
	tb := NewTable[int]()
	a, b, c := &Waiter[int]{}, &Waiter[int]{}, &Waiter[int]{}
	tb.Acquire("k", a)
	tb.Acquire("k", b)
	tb.Acquire("j", c)
	released, _ := tb.ReleaseByCAS(heldOf(c))
	require.True(t, released)
	require.Equal(t, []*Waiter[int]{b}, tb.Drain())
	require.Zero(t, tb.Len())
	released, _ = tb.ReleaseByCAS(heldOf(a))
	require.False(t, released, "a lease of a drained table frees nothing")
	require.Zero(t, tb.Len())
	require.NoError(t, tb.CheckInvariants())
}

// Releasers release by CAS while the owner sweeps, all at once: once every
// release has returned, one more sweep leaves the table empty, whatever the
// interleaving (and -race checks that releasers touch only atomics).
func TestTableReapsWhileReleasersPush(t *testing.T) {
	const releasers, perReleaser = 4, 2000
	tb := NewTable[int]()
	hs := make([][]*Held[int], releasers)
	for r := range hs {
		for i := range perReleaser {
			w := &Waiter[int]{}
			tb.Acquire(fmt.Sprint(r, "/", i), w)
			hs[r] = append(hs[r], heldOf(w))
		}
	}
	var wg sync.WaitGroup
	start := make(chan struct{})
	for r := range hs {
		wg.Go(func() {
			<-start
			for _, h := range hs[r] {
				if released, _ := tb.ReleaseByCAS(h); !released {
					t.Error("a release by CAS of a key nobody waits for failed")
				}
			}
		})
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	close(start)
	for reaping := true; reaping; {
		select {
		case <-done:
			reaping = false
		default:
		}
		tb.Reap() // the owner, concurrently with the releases
	}
	tb.Reap()
	require.Zero(t, tb.Len())
	require.Zero(t, tb.Entries(), "every freed entry reaped once the releases returned")
	require.NoError(t, tb.CheckInvariants())
}

package shard

import (
	"fmt"
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
	tb.entries["k"].state.Store(held(a.Token())) // corrupt: waiters, but a holder's CAS would free the key
	require.ErrorContains(t, tb.CheckInvariants(), "invariant 3")
	tb.entries["k"].state.Store(stDead) // corrupt: a dead entry in the map
	require.ErrorContains(t, tb.CheckInvariants(), "invariant 1")
}

func TestStateStrings(t *testing.T) {
	for s, want := range map[State]string{Queued: "queued", Granted: "granted", Refused: "refused", Cancelled: "cancelled", 0: "State(0)"} {
		require.Equal(t, want, s.String())
	}
}

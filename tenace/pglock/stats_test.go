package pglock_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"tenace.dev/tenace"
	"tenace.dev/tenace/pglock"
)

// statsEventually waits until p's Stats are want: for counts that an ender
// running on its own (the watcher, the TTL timer) brings down.
func statsEventually(t *testing.T, p *pglock.Provider, want tenace.LockStats) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for p.Stats() != want {
		if time.Now().After(deadline) {
			t.Fatalf("Stats = %+v, want %+v within 10s", p.Stats(), want)
		}
		time.Sleep(time.Millisecond) // polling interval
	}
}

// Every path of Acquire and of a lease brings Stats up and back down once,
// and Stats are zero once everything is released or closed.
func TestStatsOnEveryPath(t *testing.T) {
	srv := server(t)
	p := newProvider(t, srv, pglock.WithMaxConns(3))
	a, b := keyOf(t, "a"), keyOf(t, "b")
	zero := tenace.LockStats{}

	// Refusals: NoWait on a held key, a Timeout, a ctx cancelled.
	la := mustAcquire(t, p, a, tenace.LockAcquireOptions{})
	require.Equal(t, tenace.LockStats{Held: 1}, p.Stats())
	l, err := p.Acquire(bg, a, tenace.LockAcquireOptions{Timeout: tenace.NoWait})
	require.NoError(t, err)
	require.Nil(t, l)
	require.Equal(t, tenace.LockStats{Held: 1}, p.Stats())
	l, err = p.Acquire(bg, a, tenace.LockAcquireOptions{Timeout: 50 * time.Millisecond})
	require.NoError(t, err)
	require.Nil(t, l)
	require.Equal(t, tenace.LockStats{Held: 1}, p.Stats())
	ctx, cancel := context.WithCancel(bg)
	r1 := acquireAsync(ctx, p, a, tenace.LockAcquireOptions{})
	r2 := acquireAsync(ctx, p, a, tenace.LockAcquireOptions{})
	waitForWaiters(t, srv, a, 2)
	require.Equal(t, tenace.LockStats{Held: 1, Waiting: 2, LongestQueue: 2}, p.Stats())
	// The pool is full (3): a third waiter waits for a connection, on
	// another key; NoWait gets ErrPoolExhausted.
	r3 := acquireAsync(ctx, p, b, tenace.LockAcquireOptions{})
	statsEventually(t, p, tenace.LockStats{Held: 1, Waiting: 3, LongestQueue: 2})
	_, err = p.Acquire(bg, b, tenace.LockAcquireOptions{Timeout: tenace.NoWait})
	require.ErrorIs(t, err, pglock.ErrPoolExhausted)
	require.Equal(t, tenace.LockStats{Held: 1, Waiting: 3, LongestQueue: 2}, p.Stats())
	cancel()
	for _, r := range []<-chan result{r1, r2, r3} {
		res := <-r
		require.ErrorIs(t, res.err, context.Canceled)
	}
	require.Equal(t, tenace.LockStats{Held: 1}, p.Stats())
	require.NoError(t, la.Release(bg))
	require.Equal(t, zero, p.Stats())

	// Loss by TTL, then the Release that reports it.
	l = mustAcquire(t, p, a, tenace.LockAcquireOptions{TTL: 50 * time.Millisecond})
	<-l.(tenace.LosableLease).Lost()
	require.ErrorIs(t, l.Release(bg), tenace.ErrLeaseExpired)
	statsEventually(t, p, zero)

	// Loss of the connection.
	l = mustAcquire(t, p, a, tenace.LockAcquireOptions{})
	srv.Terminate(t, pglock.BackendPID(l))
	<-l.(tenace.LosableLease).Lost()
	statsEventually(t, p, zero)
	require.ErrorIs(t, l.Release(bg), tenace.ErrLeaseLost)
	require.Equal(t, zero, p.Stats())

	// Many at once on two keys, then Close with leases held and waiters.
	var wg sync.WaitGroup
	for range 20 {
		wg.Go(func() {
			for _, k := range []string{a, b} {
				if l, err := p.Acquire(bg, k, tenace.LockAcquireOptions{Timeout: time.Second}); err == nil && l != nil {
					_ = l.Release(bg)
				}
			}
		})
	}
	wg.Wait()
	require.Equal(t, zero, p.Stats())
	la = mustAcquire(t, p, a, tenace.LockAcquireOptions{})
	lb := mustAcquire(t, p, b, tenace.LockAcquireOptions{})
	r1 = acquireAsync(bg, p, a, tenace.LockAcquireOptions{})
	waitForWaiters(t, srv, a, 1)
	require.Equal(t, tenace.LockStats{Held: 2, Waiting: 1, LongestQueue: 1}, p.Stats())
	require.NoError(t, p.Close())
	require.Equal(t, 0, p.Stats().Held, "Close returns once every lease ended")
	require.ErrorIs(t, (<-r1).err, tenace.ErrProviderClosed)
	require.Equal(t, zero, p.Stats())
	require.ErrorIs(t, la.Release(bg), tenace.ErrLeaseLost)
	require.ErrorIs(t, lb.Release(bg), tenace.ErrLeaseLost)
	require.Equal(t, zero, p.Stats())
}

// A lease lost to its TTL counts in Held until its unlock has run, also
// after the Release that reported the loss: its lock is held on the
// server until then (and its connection pinned), as the doc of Stats says.
func TestStatsCountALostLeaseUntilItsUnlock(t *testing.T) {
	srv := server(t)
	stopping, proceed := make(chan struct{}), make(chan struct{})
	p := newProvider(t, srv)
	p.SetHooks(pglock.Hooks{Stopping: func() { close(stopping); <-proceed }})
	key := keyOf(t, "k")
	clock := &manualClock{now: time.Unix(0, 0)}
	l := mustAcquire(t, p, key, tenace.LockAcquireOptions{TTL: time.Hour, Clock: clock})
	clock.advance(time.Hour)
	<-stopping // the TTL's ender, before its unlock
	require.ErrorIs(t, l.Release(bg), tenace.ErrLeaseExpired)
	require.Equal(t, tenace.LockStats{Held: 1}, p.Stats())
	require.Equal(t, fmt.Sprintf("%d:true", pglock.BackendPID(l)), locks(t, srv, key), "still locked on the server")
	close(proceed)
	statsEventually(t, p, tenace.LockStats{})
	require.Equal(t, "", locks(t, srv, key))
}

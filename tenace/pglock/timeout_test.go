package pglock_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"tenace.dev/tenace"
	"tenace.dev/tenace/pglock"
)

// A full pool is the key's contention when others of the process hold or
// wait for the same key: a Timeout that passes while waiting for a
// connection is then (nil, nil), a LockNotAcquiredError through a Lock, as
// it was before a full pool became an error for a key nobody else wants
// (TestPoolExhausted).
func TestAFullPoolOfCallersForTheSameKeyIsContention(t *testing.T) {
	srv := server(t)
	p := newProvider(t, srv, pglock.WithMaxConns(2))
	key := keyOf(t, "k")
	held := mustAcquire(t, p, key, tenace.LockAcquireOptions{})
	ctx, cancel := context.WithCancel(bg)
	waiting := acquireAsync(ctx, p, key, tenace.LockAcquireOptions{})
	waitForWaiters(t, srv, key, 1) // both connections pinned, by this key
	l, err := p.Acquire(bg, key, tenace.LockAcquireOptions{Timeout: 50 * time.Millisecond})
	require.NoError(t, err)
	require.Nil(t, l)
	var rejected *tenace.LockNotAcquiredError
	err = tenace.NewPolicy().WithLock(tenace.LockOptions{Provider: p, Key: key, Timeout: 50 * time.Millisecond}).Execute(bg, func(context.Context) error { return nil })
	require.ErrorAs(t, err, &rejected)
	cancel()
	require.ErrorIs(t, (<-waiting).err, context.Canceled)
	require.NoError(t, held.Release(bg))
}

// A Timeout that passes while a new connection goes unanswered (the
// postmaster stalled: the kernel accepts the connection, nobody answers its
// startup) is a failure that says so, not "not granted": an error wrapping
// ErrNoReply by the Timeout and its 30ms allowance (not after a grace of
// 250ms, as before issue 25), and through a Lock, lock.failed and an
// UnexpectedError, not contention. Before issue 22, (nil, nil).
func TestATimeoutWhileConnectingToAStalledServerIsAFailure(t *testing.T) {
	srv := server(t)
	p := newProvider(t, srv)
	// The pool's one idle connection, from New's check, is pinned here:
	// the next Acquire has to dial.
	held := mustAcquire(t, p, keyOf(t, "a"), tenace.LockAcquireOptions{})
	srv.Pause()
	resumed := false
	t.Cleanup(func() {
		if !resumed {
			srv.Resume()
		}
	})
	const timeout = 100 * time.Millisecond
	l, err := p.Acquire(bg, keyOf(t, "b"), tenace.LockAcquireOptions{Timeout: timeout})
	require.Nil(t, l, "granted on a connection that was not dialled: the test needs the pool to dial")
	require.ErrorIs(t, err, pglock.ErrNoReply)
	require.ErrorContains(t, err, `acquiring "`+keyOf(t, "b")+`", connecting got no answer within its 100ms Timeout and 30ms more`)
	require.False(t, errors.Is(err, context.DeadlineExceeded), "DeadlineExceeded is the caller's ctx's, which did not end: %v", err)

	var events []string
	err = tenace.NewPolicy().WithLock(tenace.LockOptions{Provider: p, Key: keyOf(t, "b"), Timeout: timeout}).
		OnEvent(func(e tenace.Event) { events = append(events, e.Name) }).
		Execute(bg, func(context.Context) error { return nil })
	var ue *tenace.UnexpectedError
	require.ErrorAs(t, err, &ue, "a provider failure, not contention")
	require.Equal(t, []string{"lock.acquiring", "lock.failed"}, events)

	srv.Resume()
	resumed = true
	require.NoError(t, held.Release(bg))
	mustRelease := mustAcquire(t, p, keyOf(t, "b"), tenace.LockAcquireOptions{Timeout: 10 * time.Second})
	require.NoError(t, mustRelease.Release(bg), "and the provider works once the server answers")
}

// TestAnyTimeoutWaits: a Timeout longer than the server's largest
// lock_timeout (about 24.8 days), up to math.MaxInt64, is valid: a free key
// is granted; a held one is waited for in steps of the largest bound (made
// 20 ms here), by an exclusive caller and by a bulkhead's caller behind a
// writer, until the holder releases it after several steps.
func TestAnyTimeoutWaits(t *testing.T) {
	srv := server(t)
	p := newProvider(t, srv)
	for _, d := range []time.Duration{math.MaxInt32 * time.Millisecond, 30 * 24 * time.Hour, math.MaxInt64} {
		for _, opts := range []tenace.LockAcquireOptions{{Timeout: d}, {Timeout: d, Shared: true}, {Timeout: d, Shared: true, Permits: 2}} {
			l, err := p.Acquire(bg, keyOf(t, "free"), opts)
			require.NoError(t, err, "%+v", opts)
			require.NotNil(t, l, "%+v", opts)
			require.NoError(t, l.Release(bg))
		}
		s, err := tenace.AcquireAll(bg, p, []string{keyOf(t, "a"), keyOf(t, "b")}, tenace.LockAcquireOptions{Timeout: d})
		require.NoError(t, err)
		require.NotNil(t, s)
		require.NoError(t, s.Release(bg))
	}

	defer pglock.SetMaxLockTimeout(20 * time.Millisecond)()
	for _, opts := range []tenace.LockAcquireOptions{{Timeout: math.MaxInt64}, {Timeout: time.Hour, Shared: true, Permits: 2}} {
		t.Run(fmt.Sprintf("Permits%d", opts.Permits), func(t *testing.T) {
			key := keyOf(t, "held")
			w := mustAcquire(t, newProvider(t, srv), key, tenace.LockAcquireOptions{})
			waiter := newProvider(t, srv)
			steps := make(chan struct{}, 100)
			waiter.SetHooks(pglock.Hooks{StatementDone: func(uint32, bool) {
				select {
				case steps <- struct{}{}:
				default:
				}
			}})
			r := acquireAsync(bg, waiter, key, opts)
			for range 3 {
				<-steps // the server's verdict at the end of a step: the wait goes on
			}
			select {
			case res := <-r:
				t.Fatalf("the wait ended after three steps: %v, %v", res.lease, res.err)
			default:
			}
			require.NoError(t, w.Release(bg))
			res := <-r
			require.NoError(t, res.err)
			require.NotNil(t, res.lease, "granted once the holder released it")
			require.NoError(t, res.lease.Release(bg))
		})
	}
}

package pglock_test

import (
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"tenace.dev/tenace"
	"tenace.dev/tenace/pglock"
)

// TestReleaseAsTheLossIsSignalled: a Release in the instant between an
// ender claiming the lease as lost (the watcher, after a backend
// termination; the TTL timer) and its signal of the loss returns the loss,
// as a Release after the signal does — not nil, which would tell the caller
// that the lock was held to the end. The hooks hold the ender inside that
// instant while the Release runs.
func TestReleaseAsTheLossIsSignalled(t *testing.T) {
	srv := server(t)
	for _, ender := range []string{"watcher", "TTL"} {
		t.Run(ender, func(t *testing.T) {
			losing, proceed, waiting := make(chan struct{}), make(chan struct{}), make(chan struct{})
			p := newProvider(t, srv)
			p.SetHooks(pglock.Hooks{
				Losing:       func() { close(losing); <-proceed },
				ReleaseWaits: sync.OnceFunc(func() { close(waiting) }), // every Release after the claim calls it
			})
			clock := &manualClock{now: time.Unix(0, 0)}
			l := mustAcquire(t, p, keyOf(t, "k"), tenace.LockAcquireOptions{TTL: time.Hour, Clock: clock})
			switch ender {
			case "watcher":
				srv.Terminate(t, pglock.BackendPID(l))
			case "TTL":
				clock.advance(time.Hour)
			}
			<-losing
			released := make(chan error, 1) // the Release never blocks on it
			go func() { released <- l.Release(bg) }()
			var err error
			select {
			case err = <-released: // returned while the ender was held
				close(proceed)
			case <-waiting: // waits for the ender's signal
				close(proceed)
				err = <-released
			}
			require.ErrorIs(t, err, tenace.ErrLeaseLost, "a Release as the loss was being signalled")
			<-l.(tenace.LosableLease).Lost()
			require.NoError(t, l.Release(bg), "a second Release does nothing")
		})
	}
}

// TestReleaseRightAfterATermination: a Release that comes after the lease's
// backend was terminated (pg_terminate_backend), before the watcher has read
// the end of the connection, finds the connection ended when it unlocks.
// The server released the lock with the session, so the lease was lost
// before the Release: it says so, wrapping tenace.ErrLeaseLost, as after the
// watcher's signal — not as an unlock that failed, after which the caller
// would believe the lock was held to the end. The hooks keep the watcher
// from reading until the Release has stopped it.
func TestReleaseRightAfterATermination(t *testing.T) {
	srv := server(t)
	stopped := make(chan struct{})
	p := newProvider(t, srv)
	p.SetHooks(pglock.Hooks{
		Watching: func() { <-stopped },
		Stopping: sync.OnceFunc(func() { close(stopped) }), // the later lease's Release calls it too
	})
	key := keyOf(t, "k")
	l := mustAcquire(t, p, key, tenace.LockAcquireOptions{})
	srv.Terminate(t, pglock.BackendPID(l)) // returns once the backend has exited
	err := l.Release(bg)
	t.Logf("Release after the termination: %v", err)
	require.ErrorIs(t, err, tenace.ErrLeaseLost, "the lease was lost before the Release")
	require.ErrorIs(t, l.(tenace.LosableLease).Err(), tenace.ErrLeaseLost)
	require.NoError(t, l.Release(bg), "a second Release does nothing")
	next := mustAcquire(t, p, key, tenace.LockAcquireOptions{Timeout: tenace.NoWait})
	require.NoError(t, next.Release(bg))
	require.Equal(t, tenace.LockStats{}, p.Stats())
}

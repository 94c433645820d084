package pglock_test

import (
	"context"
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"tenace.dev/internal/pgtest"
	"tenace.dev/tenace"
	"tenace.dev/tenace/pglock"
)

// lossBound bounds the wait for a loss that the server has caused already
// (a backend terminated, a socket closed): its signal comes within
// milliseconds, and within this bound on a loaded machine. A loss never
// signalled fails the test here.
const lossBound = 20 * time.Second

// requireLost fails unless l's Lost closes within lossBound.
func requireLost(t *testing.T, l tenace.LockLease, what string) {
	t.Helper()
	select {
	case <-l.(tenace.LosableLease).Lost():
	case <-time.After(lossBound):
		t.Fatalf("%s, and Lost did not close within %v", what, lossBound)
	}
}

// idleKill is a session whose socket its lease's Release closes while the
// session is idle: a lease of keys[0] and, nested in its Lock on the same
// session, a wait for keys[1] (held by another provider) that outlives the
// outer Lock (its context detached). The outer Release cannot take the
// session while the nested wait runs; past its bound it closes the socket
// (session.kill) — and in the window before it does (the Killing hook),
// keys[1] is released, so that the nested wait is granted and gives the
// session back idle, its socket in the poller (checked). nested is that
// grant's lease, held until finish is closed; done says how its Lock ended.
type idleKill struct {
	srv    *pgtest.Server
	p      *pglock.Provider
	keys   []string
	nested tenace.LockLease
	fd     int32 // the killed session's socket descriptor
	finish chan struct{}
	done   chan error
}

func newIdleKill(t *testing.T) *idleKill {
	t.Helper()
	t.Cleanup(pglock.SetReleaseTimeout(300 * time.Millisecond))
	srv := server(t)
	x := &idleKill{srv: srv, p: newProvider(t, srv, pglock.WithMaxConns(40)), keys: setKeys(t, 2),
		finish: make(chan struct{}), done: make(chan error, 1)}
	other := newProvider(t, srv)
	granted := make(chan tenace.LockLease, 1)
	var k1 tenace.LockLease
	killed := false
	x.p.SetHooks(pglock.Hooks{Killing: func() {
		// The test's goroutine: the outer Lock's release runs in it.
		killed = true
		require.NoError(t, k1.Release(bg))
		select {
		case x.nested = <-granted:
		case <-time.After(lossBound):
			t.Fatal("the nested wait was not granted once its key was released")
		}
		require.True(t, pglock.Registered(x.nested), "the nested grant gave its session back without putting its socket in the poller")
		x.fd = pglock.SessionFD(x.nested)
	}})
	registerKeys(t, x.p, x.keys...)
	k1 = mustAcquire(t, other, x.keys[1], tenace.LockAcquireOptions{})
	err := lockIn(bg, x.p, x.keys[0], 0, func(ctx context.Context) error {
		go func() {
			x.done <- lockIn(context.WithoutCancel(ctx), x.p, x.keys[1], 0, func(ctx context.Context) error {
				l, _ := tenace.LeaseFrom(ctx)
				granted <- l
				<-x.finish
				return nil
			})
		}()
		waitForWaiters(t, srv, x.keys[1], 1)
		return nil
	})
	require.NoError(t, err)
	require.True(t, killed, "the outer Release took the session: it was never busy past the Release's bound")
	return x
}

// end lets the nested Lock return and waits for it.
func (x *idleKill) end(t *testing.T) error {
	t.Helper()
	close(x.finish)
	select {
	case err := <-x.done:
		return err
	case <-time.After(lossBound):
		t.Fatal("the nested Lock did not return")
		return nil
	}
}

// TestKillOfAnIdleSessionSignalsLoss: a Release that could not take its
// session in time closes the session's socket; when the nested taker gave
// the session back in the meantime (idle, its socket in the provider's
// epoll set, which Linux leaves silently when the socket closes), the
// lease left on it — whose lock the server freed with the connection —
// is lost, and says so.
func TestKillOfAnIdleSessionSignalsLoss(t *testing.T) {
	x := newIdleKill(t)
	requireLost(t, x.nested, "the nested lease's connection was closed (its lock freed on the server)")
	require.ErrorIs(t, x.nested.(tenace.LosableLease).Err(), tenace.ErrLeaseLost)
	_ = x.end(t)
	require.Equal(t, 0, x.p.Stats().Held)
	requireNoLocks(t, x.srv, x.keys...)
}

// TestKilledSocketNeverUnregistersAnother: the descriptor number of a
// socket closed under an idle session is the next socket's; another
// session then registers that number, and the killed session's release
// (or anything else) must not take that registration off the set — the
// other session's loss would go unseen. Sessions are opened until one
// gets the number; its registration outlives the nested lease's Release,
// and its backend's termination is signalled.
func TestKilledSocketNeverUnregistersAnother(t *testing.T) {
	x := newIdleKill(t)
	var b tenace.LockLease
	var others []tenace.LockLease
	defer func() {
		for _, l := range others {
			_ = l.Release(bg)
		}
	}()
	for i := range 30 {
		l := mustAcquire(t, x.p, keyOf(t, fmt.Sprint("b", i)), tenace.LockAcquireOptions{})
		if pglock.SessionFD(l) == x.fd {
			b = l
			break
		}
		others = append(others, l)
	}
	require.NotNil(t, b, "no session of 30 reused the closed socket's descriptor %d", x.fd)
	require.True(t, pglock.Registered(b))
	_ = x.end(t) // the nested lease's Release
	require.True(t, pglock.Registered(b), "the release of the killed session took the registration of descriptor %d, now another session's, off the poller", x.fd)
	x.srv.Terminate(t, pglock.BackendPID(b))
	requireLost(t, b, "b's backend was terminated")
	require.Error(t, b.Release(bg))
}

// TestPollerEndFallsBackToWatchers: the provider's epoll goroutine ends —
// epoll_wait fails, or the set's descriptor is closed under it — while
// sessions are registered: each starts its watcher, and a session given
// back later is watched too, so that every loss is still signalled.
func TestPollerEndFallsBackToWatchers(t *testing.T) {
	for _, how := range []string{"epoll_wait fails", "the set's descriptor closed"} {
		t.Run(how, func(t *testing.T) {
			srv := server(t)
			p := newProvider(t, srv)
			a := mustAcquire(t, p, keyOf(t, "a"), tenace.LockAcquireOptions{})
			b := mustAcquire(t, p, keyOf(t, "b"), tenace.LockAcquireOptions{})
			require.True(t, pglock.Registered(a))
			require.True(t, pglock.Registered(b))
			if how == "epoll_wait fails" {
				// The next wake-up (a's termination) finds the failure.
				pglock.FailPoll(p, syscall.EBADF)
				srv.Terminate(t, pglock.BackendPID(a))
			} else {
				pglock.ClosePollSet(p)
				srv.Terminate(t, pglock.BackendPID(a))
			}
			requireLost(t, a, "a's backend was terminated")
			srv.Terminate(t, pglock.BackendPID(b))
			requireLost(t, b, "b's backend was terminated after the poller ended")
			c := mustAcquire(t, p, keyOf(t, "c"), tenace.LockAcquireOptions{})
			require.False(t, pglock.Registered(c), "a session was put in a poller that has ended")
			srv.Terminate(t, pglock.BackendPID(c))
			requireLost(t, c, "c's backend was terminated after the poller ended")
		})
	}
}

package pglock_test

import (
	"context"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"tenace.dev/tenace"
	"tenace.dev/tenace/pglock"
)

// The Lock step releases with a context that has no deadline. When the
// backend that holds the lock is stalled (SIGSTOP on its process), that
// Release must still return — bounded, with an error that says the
// connection was closed instead — and once the backend runs again the
// server ends the session and the next caller gets the lock.
func TestReleaseOnAStalledBackendReturns(t *testing.T) {
	srv := server(t)
	defer pglock.SetReleaseTimeout(200 * time.Millisecond)()
	p := newProvider(t, srv)
	key := keyOf(t, "k")
	l := mustAcquire(t, p, key, tenace.LockAcquireOptions{})
	pid := int(pglock.BackendPID(l))
	require.NoError(t, syscall.Kill(pid, syscall.SIGSTOP))
	stopped := true
	defer func() {
		if stopped {
			_ = syscall.Kill(pid, syscall.SIGCONT)
		}
	}()
	start := time.Now()
	err := l.Release(bg)
	took := time.Since(start)
	require.NoError(t, syscall.Kill(pid, syscall.SIGCONT))
	stopped = false
	t.Logf("Release on a stalled backend returned after %v: %v", took.Round(time.Millisecond), err)
	require.Error(t, err)
	require.Contains(t, err.Error(), "connection was closed instead")
	// The release bound (a deadline on the unlock's socket, past which
	// the connection is closed), within the bound of a Release cut short
	// by its ctx (that bound, then the cancel requests' grace, cancelGrace,
	// 2 s), with room for a loaded machine.
	require.Less(t, took, 200*time.Millisecond+2*time.Second+time.Second)
	// The backend, running again, sees its connection closed and ends the
	// session, which frees the lock: a waiter gets it within its Timeout.
	next, err := p.Acquire(bg, key, tenace.LockAcquireOptions{Timeout: 10 * time.Second})
	require.NoError(t, err)
	require.NotNil(t, next, "the lock was freed once the backend ran again")
	require.NoError(t, next.Release(bg))
}

// TestCutShortOnAStallingBackend: an Acquire whose wait is cut short gives
// back what its session may hold (pg_advisory_unlock_all) before it closes
// the connection; here the backend stalls (SIGSTOP) just before that
// unlock, once the acquire statement has returned (the hook stops it
// then):
//
//   - granted: the caller's ctx ends just as the server grants the lock
//     (the hook cancels it before Acquire looks at it);
//   - waiting: ctx ends while the statement waits, and the server answers
//     the cancel.
//
// Acquire returns ctx's error within the cancel's grace — the doc's bound
// when the server does not answer, 2 s from ctx's end — not after the
// unlock's own bound and a second grace; once the backend runs again the
// lock is free, and the fence shows whether the grant had landed. The wait
// is real: the grace runs on the client's clock.
func TestCutShortOnAStallingBackend(t *testing.T) {
	srv := server(t)
	for _, tc := range []struct {
		name    string
		granted bool
	}{{"granted", true}, {"waiting", false}} {
		t.Run(tc.name, func(t *testing.T) {
			p, other := newProvider(t, srv), newProvider(t, srv)
			key := keyOf(t, "k")
			held := mustAcquire(t, other, key, tenace.LockAcquireOptions{})
			ctx, cancel := context.WithCancel(bg)
			defer cancel()
			var stopped atomic.Int64 // the pid the hook stopped
			defer func() {
				if pid := stopped.Load(); pid != 0 {
					_ = syscall.Kill(int(pid), syscall.SIGCONT)
				}
			}()
			var ended time.Time // when ctx ended: written before cancel, read after the Acquire
			done := make(chan struct{})
			p.SetHooks(pglock.Hooks{StatementDone: func(pid uint32, locked bool) {
				defer close(done) // p runs one acquire statement
				if locked != tc.granted {
					t.Errorf("the acquire statement took the lock: %v, want %v", locked, tc.granted)
				}
				if tc.granted {
					ended = time.Now()
					cancel()
				}
				if err := syscall.Kill(int(pid), syscall.SIGSTOP); err != nil {
					t.Errorf("stopping backend %d: %v", pid, err)
					return
				}
				stopped.Store(int64(pid))
			}})
			r := acquireAsync(ctx, p, key, tenace.LockAcquireOptions{})
			waitForWaiters(t, srv, key, 1)
			if tc.granted {
				require.NoError(t, held.Release(bg))
			} else {
				ended = time.Now()
				cancel()
			}
			res := <-r
			took := time.Since(ended)
			<-done
			require.NoError(t, syscall.Kill(int(stopped.Swap(0)), syscall.SIGCONT))
			t.Logf("Acquire returned %v after its ctx ended, on a backend stalled before the give-back", took.Round(time.Millisecond))
			require.ErrorIs(t, res.err, context.Canceled)
			require.Nil(t, res.lease)
			// The cancel's grace (2 s), with room for a loaded machine; the
			// unlock's bound followed by a second grace is 4 s.
			require.Less(t, took, 2*time.Second+time.Second, "the give-back on a stalled backend outlasted the cancel's grace")
			if !tc.granted {
				require.NoError(t, held.Release(bg))
			}
			next := mustAcquire(t, other, key, tenace.LockAcquireOptions{Timeout: 10 * time.Second})
			landed := map[bool]uint64{true: 2, false: 1}[tc.granted]
			require.Equal(t, held.(tenace.FencedLease).Token()+landed, next.(tenace.FencedLease).Token(), "the fence: whether the grant had landed")
			require.NoError(t, next.Release(bg))
		})
	}
}

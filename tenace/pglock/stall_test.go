package pglock_test

import (
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
	// The release bound, then the cancel requests' grace before the
	// connection is given up (cancelGrace, 2 s), with room for a loaded
	// machine.
	require.Less(t, took, 200*time.Millisecond+2*time.Second+time.Second)
	// The backend, running again, sees its connection closed and ends the
	// session, which frees the lock: a waiter gets it within its Timeout.
	next, err := p.Acquire(bg, key, tenace.LockAcquireOptions{Timeout: 10 * time.Second})
	require.NoError(t, err)
	require.NotNil(t, next, "the lock was freed once the backend ran again")
	require.NoError(t, next.Release(bg))
}

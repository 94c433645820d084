package pglock_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"tenace.dev/tenace"
	"tenace.dev/tenace/locktest"
	"tenace.dev/tenace/pglock"
)

// TestConformance runs the provider contract. FIFO is left out: the order
// pglock promises is arrival at the server's lock queue, which a caller
// cannot observe from Stats (a waiter counts as waiting from the moment it
// enters Acquire, before its statement reaches the server);
// TestFIFOAcrossProcesses checks the promise with pg_locks instead.
func TestConformance(t *testing.T) {
	srv := server(t)
	locktest.Run(t, func(t *testing.T) tenace.LockProvider {
		return newProvider(t, srv)
	}, locktest.Capabilities{
		ExactStats: true,
		Fencing:    true,
		Losable:    true,
		TTL:        true,
		Close:      true,
		Shared:     true,
		ReadWrite:  true,
		Permits:    true,
		Lose: func(t *testing.T, l tenace.LockLease) {
			srv.Terminate(t, pglock.BackendPID(l))
		},
	})
}

// TestConformanceWithoutFencing: the same contract, with leases that carry
// no token.
func TestConformanceWithoutFencing(t *testing.T) {
	srv := server(t)
	locktest.Run(t, func(t *testing.T) tenace.LockProvider {
		return newProvider(t, srv, pglock.WithoutFencing())
	}, locktest.Capabilities{
		ExactStats: true,
		Losable:    true,
		TTL:        true,
		Close:      true,
		Shared:     true,
		ReadWrite:  true,
		Permits:    true,
		Lose: func(t *testing.T, l tenace.LockLease) {
			srv.Terminate(t, pglock.BackendPID(l))
		},
	})
	p := newProvider(t, srv, pglock.WithoutFencing())
	l := mustAcquire(t, p, keyOf(t, "k"), tenace.LockAcquireOptions{})
	_, fenced := l.(tenace.FencedLease)
	require.False(t, fenced, "WithoutFencing leases are not FencedLease")
	require.NoError(t, l.Release(bg))
}

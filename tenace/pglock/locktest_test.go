package pglock_test

import (
	"context"
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
		// pg_locks shows every session that waits for the key.
		InspectWaiters: true,
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
		return uninspected{newProvider(t, srv, pglock.WithoutFencing())}
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

// uninspected is a provider without its Inspector: a provider
// WithoutFencing writes nothing with a grant, so it records no owners, and
// the suite's inspection cases (which check the grant's owner label) are
// not its. Its Inspect is tested in inspect_test.go.
type uninspected struct{ p *pglock.Provider }

func (u uninspected) Acquire(ctx context.Context, key string, opts tenace.LockAcquireOptions) (tenace.LockLease, error) {
	return u.p.Acquire(ctx, key, opts)
}

func (u uninspected) AcquireSet(ctx context.Context, keys []string, opts tenace.LockAcquireOptions) (*tenace.SetLease, error) {
	return u.p.AcquireSet(ctx, keys, opts)
}

func (u uninspected) Stats() tenace.LockStats { return u.p.Stats() }
func (u uninspected) SupportsShared() bool    { return u.p.SupportsShared() }
func (u uninspected) Close() error            { return u.p.Close() }

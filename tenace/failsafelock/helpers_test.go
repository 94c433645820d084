package failsafelock_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"tenace.dev/tenace"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var bg = context.Background()

// newMemory returns a memory provider of the test's own, closed at the end.
func newMemory(t *testing.T) *tenace.MemoryLockProvider {
	t.Helper()
	p := tenace.NewMemoryLockProvider()
	t.Cleanup(func() { _ = p.Close() })
	return p
}

// hold acquires key on p for the test, and returns the lease.
func hold(t *testing.T, p tenace.LockProvider, key string) tenace.LockLease {
	t.Helper()
	l, err := p.Acquire(bg, key, tenace.LockAcquireOptions{Timeout: tenace.NoWait})
	require.NoError(t, err)
	require.NotNil(t, l, "%q should be free", key)
	return l
}

// requireFree checks that nothing leaked: key can be had at once (so every
// acquire and cancel sent before has been applied: they come first on the
// key), and once it is given back the provider reports nothing held or
// waited for.
func requireFree(t *testing.T, p tenace.LockProvider, key string) {
	t.Helper()
	l, err := p.Acquire(bg, key, tenace.LockAcquireOptions{Timeout: tenace.NoWait})
	require.NoError(t, err)
	require.NotNil(t, l, "%q is still held: a lock leaked", key)
	require.NoError(t, l.Release(bg))
	if sp, ok := p.(tenace.StatsProvider); ok {
		require.Equal(t, tenace.LockStats{}, sp.Stats(), "the provider still holds or queues something")
	}
	if m, ok := p.(*tenace.MemoryLockProvider); ok {
		require.Zero(t, m.Size())
	}
}

// eventually polls cond every millisecond until it holds, failing after
// 10 s: for a state another goroutine reaches and signals no other way (a
// caller queued inside a provider).
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not reached within 10s: %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// waiting returns once n callers wait in p (a StatsProvider).
func waiting(t *testing.T, p tenace.StatsProvider, n int) {
	t.Helper()
	eventually(t, "callers waiting", func() bool { return p.Stats().Waiting == n })
}

// countingProvider counts the acquires that reach the provider inside.
type countingProvider struct {
	tenace.LockProvider
	acquires atomic.Int64
}

func (p *countingProvider) Acquire(ctx context.Context, key string, opts tenace.LockAcquireOptions) (tenace.LockLease, error) {
	p.acquires.Add(1)
	return p.LockProvider.Acquire(ctx, key, opts)
}

// losableProvider hands out leases of the memory provider inside that can
// be lost (tenace.LosableLease); the last one handed out is in last.
type losableProvider struct {
	*tenace.MemoryLockProvider
	last atomic.Pointer[losableLease]
}

type losableLease struct {
	tenace.FencedLease
	tenace.LeaseSignal
}

func (p *losableProvider) Acquire(ctx context.Context, key string, opts tenace.LockAcquireOptions) (tenace.LockLease, error) {
	l, err := p.MemoryLockProvider.Acquire(ctx, key, opts)
	if l == nil {
		return nil, err
	}
	ll := &losableLease{FencedLease: l.(tenace.FencedLease)}
	p.last.Store(ll)
	return ll, nil
}

// grantAll grants every acquire at once, whoever holds the key: a provider
// under which executions overlap, for the tests of what an execution sees
// rather than of exclusion.
type grantAll struct{}

type nopLease struct{}

func (nopLease) Release(context.Context) error { return nil }

func (grantAll) Acquire(context.Context, string, tenace.LockAcquireOptions) (tenace.LockLease, error) {
	return nopLease{}, nil
}

// awaitDone returns once ctx has ended, and fails the test if it has not
// within 10 s: a bridge that never ends fn's context fails instead of
// hanging the run.
func awaitDone(t *testing.T, ctx context.Context) {
	t.Helper()
	select {
	case <-ctx.Done():
	case <-time.After(10 * time.Second):
		t.Error("fn's context did not end within 10s")
	}
}

package tenace_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"tenace.dev/tenace"
)

// requireStats checks p's Stats at a settled point: once every shard has
// applied every message sent so far (a shared release is a message).
func requireStats(t *testing.T, p *tenace.MemoryLockProvider, want tenace.LockStats, msg string) {
	t.Helper()
	require.NoError(t, tenace.SyncProvider(p))
	require.Equal(t, want, p.Stats(), msg)
}

// TestStatsCountByMode: readers and a writer on one key, a bulkhead on
// another, a writer on a third, with waiters of both modes; the counts by
// mode are exact at every settled point, through a give-up, releases that
// admit several callers, and back to idle.
func TestStatsCountByMode(t *testing.T) {
	p, queued := newProvider(t, tenace.WithShards(2))
	await := func(key string) {
		t.Helper()
		require.Equal(t, key, <-queued)
	}
	r1, r2 := acquireOpts(t, p, "rw", reader), acquireOpts(t, p, "rw", reader)
	w := acquireAsync(bg, p, "rw", writer)
	await("rw")
	ctx, cancel := context.WithCancel(bg)
	defer cancel()
	late := acquireAsync(ctx, p, "rw", reader) // behind the writer
	await("rw")
	b1, b2 := acquireOpts(t, p, "bulk", bulkhead(2)), acquireOpts(t, p, "bulk", bulkhead(2))
	b3 := acquireAsync(bg, p, "bulk", bulkhead(2))
	await("bulk")
	x := mustAcquire(t, p, "x")
	x2 := acquireAsync(bg, p, "x", writer)
	await("x")
	requireStats(t, p, tenace.LockStats{
		Held: 3, Waiting: 4, LongestQueue: 2,
		SharedKeys: 2, SharedHolders: 4, SharedWaiting: 2,
	}, "rw read by two, bulk full, x held; a writer, two shared callers and a writer wait")

	cancel()
	require.ErrorIs(t, (<-late).err, context.Canceled)
	requireStats(t, p, tenace.LockStats{
		Held: 3, Waiting: 3, LongestQueue: 1,
		SharedKeys: 2, SharedHolders: 4, SharedWaiting: 1,
	}, "the late reader gave up")

	require.NoError(t, b1.Release(bg))
	b3l := (<-b3).lease
	require.NotNil(t, b3l)
	requireStats(t, p, tenace.LockStats{
		Held: 3, Waiting: 2, LongestQueue: 1,
		SharedKeys: 2, SharedHolders: 4, SharedWaiting: 0,
	}, "b1's permit went to b3")

	require.NoError(t, r1.Release(bg))
	requireStats(t, p, tenace.LockStats{
		Held: 3, Waiting: 2, LongestQueue: 1,
		SharedKeys: 2, SharedHolders: 3,
	}, "one reader left")
	require.NoError(t, r2.Release(bg))
	wl := (<-w).lease
	require.NotNil(t, wl)
	requireStats(t, p, tenace.LockStats{
		Held: 3, Waiting: 1, LongestQueue: 1,
		SharedKeys: 1, SharedHolders: 2,
	}, "the writer holds rw")

	require.NoError(t, x.Release(bg))
	x2l := (<-x2).lease
	require.NotNil(t, x2l)
	for _, l := range []tenace.LockLease{wl, x2l, b2, b3l} {
		require.NoError(t, l.Release(bg))
	}
	requireStats(t, p, tenace.LockStats{}, "idle")
	requireIdle(t, p, "rw", "bulk", "x")
}

// TestStatsCountASharedLockStep: a Lock step with Shared counts as a
// shared holder while fn runs, and not once it returned.
func TestStatsCountASharedLockStep(t *testing.T) {
	p, _ := newProvider(t)
	pol := tenace.NewPolicy().WithLock(tenace.LockOptions{Provider: p, Key: "k", Shared: true, Permits: 3})
	err := pol.Execute(bg, func(context.Context) error {
		require.Equal(t, tenace.LockStats{Held: 1, SharedKeys: 1, SharedHolders: 1}, p.Stats(), "inside fn")
		return nil
	})
	require.NoError(t, err)
	requireStats(t, p, tenace.LockStats{}, "after the call")
}

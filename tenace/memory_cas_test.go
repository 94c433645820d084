package tenace_test

import (
	"context"
	"fmt"
	"runtime"
	"testing"
	"testing/synctest"

	"github.com/stretchr/testify/require"

	"tenace.dev/tenace"
)

// TestReleaseNobodyWaitsForIsUncountedAtOnce: a release of a key nobody
// waits for is a compare-and-swap, and Size drops with it, before the shard
// runs again (no Sync here).
func TestReleaseNobodyWaitsForIsUncountedAtOnce(t *testing.T) {
	p, _ := newProvider(t, tenace.WithShards(1))
	a, b := mustAcquire(t, p, "a"), mustAcquire(t, p, "b")
	require.Equal(t, 2, p.Size())
	require.NoError(t, a.Release(bg))
	require.Equal(t, 1, p.Size(), "right after the release")
	require.NoError(t, b.Release(bg))
	require.Zero(t, p.Size(), "right after the last release")
	require.Equal(t, tenace.LockStats{}, p.Stats())
	requireIdle(t, p, "a", "b")
}

// TestStatsAreExactOnceSettled holds two keys with three waiters on one and
// one on the other, then lets them go one by one.
func TestStatsAreExactOnceSettled(t *testing.T) {
	p, queued := newProvider(t, tenace.WithShards(2))
	var sp tenace.StatsProvider = p
	require.Equal(t, tenace.LockStats{}, sp.Stats(), "idle")
	a, b := mustAcquire(t, p, "a"), mustAcquire(t, p, "b")
	ctx, cancel := context.WithCancel(bg)
	var onA []<-chan acquired
	for i := range 3 {
		c := bg
		if i == 1 {
			c = ctx // the middle one will give up
		}
		onA = append(onA, acquireAsync(c, p, "a", tenace.LockAcquireOptions{}))
		require.Equal(t, "a", <-queued)
	}
	onB := acquireAsync(bg, p, "b", tenace.LockAcquireOptions{})
	require.Equal(t, "b", <-queued)
	require.NoError(t, tenace.SyncProvider(p))
	require.Equal(t, tenace.LockStats{Held: 2, Waiting: 4, LongestQueue: 3}, p.Stats())

	cancel()
	require.ErrorIs(t, (<-onA[1]).err, context.Canceled)
	require.NoError(t, tenace.SyncProvider(p))
	require.Equal(t, tenace.LockStats{Held: 2, Waiting: 3, LongestQueue: 2}, p.Stats())

	require.NoError(t, b.Release(bg)) // hands b on: a message
	b2 := <-onB
	require.NoError(t, tenace.SyncProvider(p))
	require.Equal(t, tenace.LockStats{Held: 2, Waiting: 2, LongestQueue: 2}, p.Stats())
	require.NoError(t, b2.lease.Release(bg)) // nobody waits for b: a CAS
	require.Equal(t, tenace.LockStats{Held: 1, Waiting: 2, LongestQueue: 2}, p.Stats(), "at once")

	require.NoError(t, a.Release(bg))
	a0 := <-onA[0]
	require.NoError(t, a0.lease.Release(bg))
	a2 := <-onA[2]
	require.NoError(t, a2.lease.Release(bg))
	requireIdle(t, p, "a", "b")
	require.Equal(t, tenace.LockStats{}, p.Stats(), "idle again")
}

// TestEveryConcurrentCloseWaitsForTheShards: with a shard goroutine stuck
// (in the test's queued hook), two Closes run at once; neither may return
// before the shard goroutine has exited.
func TestEveryConcurrentCloseWaitsForTheShards(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		gate := make(chan struct{})
		p := tenace.NewMemoryLockProvider(tenace.WithShards(1), tenace.WithQueuedHook(func(string) { <-gate }))
		l := mustAcquire(t, p, "k")
		waiter := acquireAsync(bg, p, "k", tenace.LockAcquireOptions{})
		synctest.Wait() // the shard is stuck in the hook
		closed := make(chan int, 2)
		for i := range 2 {
			go func() {
				require.NoError(t, p.Close())
				closed <- i
			}()
		}
		synctest.Wait()
		select {
		case i := <-closed:
			t.Fatalf("Close #%d returned while the shard goroutine still runs", i)
		default:
		}
		close(gate)
		<-closed
		<-closed
		require.ErrorIs(t, (<-waiter).err, tenace.ErrProviderClosed)
		require.NoError(t, l.Release(bg), "a lease of a closed provider releases as a no-op")
		require.Zero(t, p.Size())
	})
}

// TestAnIdleProviderReturnsToItsBaselineHeapAfterABurst holds many keys at
// once, releases them all, and lets the provider settle (in a synctest
// bubble: until every goroutine is blocked, with no message sent to help):
// the heap must come back to within 2 MiB of where it was. Go maps never
// shrink, so without the shard rebuilding its map the burst's buckets
// (~117 B a key) would stay for the provider's life.
func TestAnIdleProviderReturnsToItsBaselineHeapAfterABurst(t *testing.T) {
	n := 1_000_000
	switch {
	case verifying: // the invariant check walks the table after every message
		n = 2_000
	case testing.Short() || raceEnabled:
		n = 100_000
	}
	synctest.Test(t, func(t *testing.T) {
		p := tenace.NewMemoryLockProvider()
		defer func() { require.NoError(t, p.Close()) }()
		keys := make([]string, n)
		for i := range keys {
			keys[i] = fmt.Sprintf("burst-%d", i)
		}
		require.NoError(t, mustAcquire(t, p, "warm-up").Release(bg))
		synctest.Wait()
		base := heapAfterGC()

		leases := make([]tenace.LockLease, n)
		for i, k := range keys {
			leases[i] = mustAcquire(t, p, k)
		}
		synctest.Wait()
		peak := heapAfterGC()
		for _, l := range leases {
			require.NoError(t, l.Release(bg))
		}
		clear(leases)
		require.Zero(t, p.Size())
		synctest.Wait()
		after := heapAfterGC()
		t.Logf("%d keys: heap %.1f MiB at rest, %.1f MiB holding them, %.1f MiB after", n, mib(base), mib(peak), mib(after))
		require.Less(t, after, base+2<<20, "the burst's memory is given back")
		runtime.KeepAlive(keys)
	})
}

func heapAfterGC() uint64 {
	var ms runtime.MemStats
	runtime.GC()
	runtime.GC()
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

func mib(b uint64) float64 { return float64(b) / (1 << 20) }

package tenace_test

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"tenace.dev/tenace"
)

// TestSetDoesNotStarve: a set of two keys keeps being granted while a
// stream of single-key callers (8 goroutines, each looping on one of the
// two keys with no pause) holds them in turn. FIFO per key bounds its wait:
// in each key's queue it is granted after the callers ahead of it when it
// arrived, at most one per streaming goroutine. The test fails if a set
// waits more than 10 s; it logs the median and worst wait.
func TestSetDoesNotStarve(t *testing.T) {
	p := tenace.NewMemoryLockProvider(tenace.WithShards(2))
	defer p.Close()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var singles atomic.Int64
	for g := range 8 {
		key := []string{"a", "b"}[g%2]
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				l, err := p.Acquire(ctx, key, tenace.LockAcquireOptions{})
				if err != nil {
					return
				}
				singles.Add(1)
				_ = l.Release(ctx)
			}
		}()
	}
	defer wg.Wait()
	defer cancel()
	const sets = 200
	waits := make([]time.Duration, 0, sets)
	for range sets {
		start := time.Now()
		sctx, scancel := context.WithTimeout(ctx, 10*time.Second)
		l, err := tenace.AcquireAll(sctx, p, []string{"b", "a"}, tenace.LockAcquireOptions{})
		scancel()
		if err != nil || l == nil {
			t.Fatalf("a set not granted within 10s while single-key callers stream: (%v, %v)", l, err)
		}
		waits = append(waits, time.Since(start))
		_ = l.Release(ctx)
	}
	slices.Sort(waits)
	t.Logf("%d sets granted among %d single-key grants: median wait %v, worst %v", sets, singles.Load(), waits[sets/2], waits[sets-1])
}

package tenace_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"tenace.dev/tenace"
)

// Callers that give up at random, on keys spread over several shards: a
// waiter whose caller gave up is reused only after its cancel was applied,
// by the shard it was sent to. (Waiters were pooled per group, so one could
// be reused on another shard while its cancel still waited in the first
// shard's mailbox; that shard then withdrew it from the other shard's
// table: lost grants, a spurious "provider closed", data races, and once
// an index out of range in the table.)
func TestCallersGivingUpOnManyShardsKeepEveryKeyExclusiveAndLive(t *testing.T) {
	p := tenace.NewMemoryLockProvider(tenace.WithShards(4))
	defer p.Close()
	const nkeys, callers, rounds = 8, 16, 1500
	var holders [nkeys]atomic.Int32
	var violations, stuck, unexpected atomic.Int64
	var firstErr atomic.Value
	var wg sync.WaitGroup
	for g := range callers {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(g), 1))
			for range rounds {
				k := rng.IntN(nkeys)
				// Nobody holds a key for long: a caller that does not give up
				// waits 10 s only if a grant was lost or a key leaked.
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				if rng.IntN(2) == 0 {
					go func() {
						runtime.Gosched()
						cancel() // gives up at a random moment: queued, granted, or not yet sent
					}()
				}
				l, err := p.Acquire(ctx, fmt.Sprint("key-", k), tenace.LockAcquireOptions{})
				cancel()
				if err != nil {
					switch {
					case errors.Is(err, context.DeadlineExceeded):
						stuck.Add(1)
					case !errors.Is(err, context.Canceled):
						unexpected.Add(1)
						firstErr.CompareAndSwap(nil, err.Error())
					}
					continue
				}
				if holders[k].Add(1) != 1 {
					violations.Add(1)
				}
				runtime.Gosched()
				holders[k].Add(-1)
				_ = l.Release(context.Background())
			}
		})
	}
	wg.Wait()
	if n := violations.Load(); n != 0 {
		t.Errorf("two holders of one key at once, %d times", n)
	}
	if n := stuck.Load(); n != 0 {
		t.Errorf("%d acquires waited 10 s for a key: a grant was lost or a key leaked", n)
	}
	if n := unexpected.Load(); n != 0 {
		t.Errorf("%d unexpected errors, the first: %v", n, firstErr.Load())
	}
	if err := tenace.SyncProvider(p); err != nil {
		t.Fatal(err)
	}
	if n := p.Size(); n != 0 {
		t.Errorf("Size %d after every caller is done", n)
	}
}

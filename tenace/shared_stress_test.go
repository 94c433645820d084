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

// sharedStressOps is how many acquires TestSharedStress makes: 10^6, or
// 5×10^4 under the race detector (several times slower), so that it takes
// seconds either way on two loaded cores.
func sharedStressOps() int {
	if raceEnabled {
		return 50_000
	}
	return 1_000_000
}

// sharedStressKey is one key of the stress test, with the permit count
// every caller of it gives and the holders inside it now.
type sharedStressKey struct {
	name             string
	permits          int  // for shared callers; 0: read/write
	writers          bool // whether exclusive callers take it too
	readers, writing atomic.Int32
	peak             atomic.Int32 // most shared holders seen at once
}

// TestSharedStress makes 10^6 acquires from 64 goroutines on a
// MemoryLockProvider: readers and writers of two read/write keys, shared
// callers of two bulkheads (3 and 1 permits) and of a bulkhead that
// writers take too. Each waits without a bound, with NoWait, with a random
// Timeout, or until its ctx is cancelled at a random moment (the cancel
// races shared grants: abort during grant). Inside, counters check that a
// key never has more shared holders than permits and never an exclusive
// holder beside anyone (each side increments its own counter, then reads
// the other's: with sequentially consistent atomics, two holders that
// overlap cannot both miss each other). At the end nothing is held:
// Size()==0, so no permit leaked.
func TestSharedStress(t *testing.T) {
	keys := []*sharedStressKey{
		{name: "rw0", writers: true},
		{name: "rw1", writers: true},
		{name: "bulk3", permits: 3},
		{name: "bulk1", permits: 1},
		{name: "bulk2w", permits: 2, writers: true},
	}
	p := tenace.NewMemoryLockProvider(tenace.WithShards(3))
	defer p.Close()
	const goroutines = 64
	n := sharedStressOps()
	var granted, refused, cancelled atomic.Int64
	var wg sync.WaitGroup
	errc := make(chan error, goroutines)
	for g := range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(g), 28))
			for i := g; i < n; i += goroutines {
				ok, err := sharedStressOne(rng, p, keys[rng.IntN(len(keys))])
				switch {
				case err == nil && ok:
					granted.Add(1)
				case err == nil:
					refused.Add(1)
				case errors.Is(err, context.Canceled):
					cancelled.Add(1)
				default:
					errc <- err
					return
				}
			}
		}()
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(2 * time.Minute):
		t.Fatalf("the acquires have not all returned after two minutes; held or waited for: %d", p.Size())
	}
	close(errc)
	for err := range errc {
		t.Error(err)
	}
	if err := tenace.SyncProvider(p); err != nil {
		t.Fatal(err)
	}
	if s := p.Size(); s != 0 {
		t.Fatalf("%d keys left held or waited for: a permit leaked", s)
	}
	for _, k := range keys {
		if k.permits > 0 && int(k.peak.Load()) > k.permits {
			t.Errorf("key %s: %d shared holders at once, %d permits", k.name, k.peak.Load(), k.permits)
		}
		t.Logf("key %s: at most %d shared holders at once", k.name, k.peak.Load())
	}
	t.Logf("%d acquires: %d granted, %d not granted in time, %d cancelled", n, granted.Load(), refused.Load(), cancelled.Load())
}

func sharedStressOne(rng *rand.Rand, p *tenace.MemoryLockProvider, k *sharedStressKey) (bool, error) {
	shared := !k.writers || rng.IntN(4) != 0
	opts := tenace.LockAcquireOptions{Shared: shared}
	if shared {
		opts.Permits = k.permits
	}
	ctx := context.Background()
	switch rng.IntN(6) {
	case 0:
		opts.Timeout = tenace.NoWait
	case 1:
		opts.Timeout = time.Duration(1+rng.IntN(200)) * time.Microsecond
	case 2:
		c, cancel := context.WithCancel(ctx)
		defer cancel()
		t := time.AfterFunc(time.Duration(rng.IntN(200))*time.Microsecond, cancel)
		defer t.Stop()
		ctx = c
	}
	l, err := p.Acquire(ctx, k.name, opts)
	if err != nil || l == nil {
		return false, err
	}
	defer l.Release(context.Background())
	if shared {
		r := k.readers.Add(1)
		defer k.readers.Add(-1)
		if w := k.writing.Load(); w != 0 {
			return true, fmt.Errorf("key %s: a reader beside %d writers", k.name, w)
		}
		if k.permits > 0 && int(r) > k.permits {
			return true, fmt.Errorf("key %s: %d shared holders of %d permits", k.name, r, k.permits)
		}
		for peak := k.peak.Load(); r > peak && !k.peak.CompareAndSwap(peak, r); peak = k.peak.Load() {
		}
		runtime.Gosched() // let others in beside it
		return true, nil
	}
	w := k.writing.Add(1)
	defer k.writing.Add(-1)
	if r := k.readers.Load(); w != 1 || r != 0 {
		return true, fmt.Errorf("key %s: a writer beside %d writers and %d readers", k.name, w-1, r)
	}
	return true, nil
}

package tenace_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"tenace.dev/tenace"
)

// stressExecutions is how many executions TestSetStress runs: 10^5, or
// 2×10^4 under the race detector (several times slower), so that the test
// takes a few seconds either way on two loaded cores.
func stressExecutions() int {
	if raceEnabled {
		return 20_000
	}
	return 100_000
}

// TestSetStress runs random sets of 1 to 4 of 8 keys, named in random
// orders, through a Lock step from 32 goroutines: each waits without a
// bound, with NoWait, with a random Timeout, or until its ctx is cancelled
// at a random moment. It checks mutual exclusion per key (a counter each
// fn increments and finds at 1), that every call ends (no deadlock: a
// watchdog fails the test if the calls have not all returned within a
// minute), that every error is one the contract allows, and that nothing
// is held at the end. It runs on the memory provider's AcquireSet and on
// AcquireAll's generic path.
func TestSetStress(t *testing.T) {
	keys := []string{"k0", "k1", "k2", "k3", "k4", "k5", "k6", "k7"}
	for name, p := range setProviders(t) {
		t.Run(name, func(t *testing.T) {
			var inside [8]atomic.Int32
			var ran, rejected, cancelled atomic.Int64
			const goroutines = 32
			n := stressExecutions()
			var wg sync.WaitGroup
			errc := make(chan error, goroutines)
			for g := range goroutines {
				wg.Add(1)
				go func() {
					defer wg.Done()
					rng := rand.New(rand.NewPCG(uint64(g), 27))
					for i := g; i < n; i += goroutines {
						if err := stressOne(rng, p, keys, &inside, &ran, &rejected, &cancelled); err != nil {
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
			case <-time.After(time.Minute):
				t.Fatalf("deadlock: the calls have not all returned after a minute; held or waited for: %d", size(p))
			}
			close(errc)
			for err := range errc {
				t.Error(err)
			}
			if s := size(p); s != 0 {
				t.Fatalf("%d keys left held or waited for", s)
			}
			t.Logf("%d executions: %d ran, %d rejected, %d cancelled", n, ran.Load(), rejected.Load(), cancelled.Load())
		})
	}
}

func stressOne(rng *rand.Rand, p tenace.LockProvider, keys []string, inside *[8]atomic.Int32, ran, rejected, cancelled *atomic.Int64) error {
	idx := rng.Perm(len(keys))[:1+rng.IntN(4)]
	set := make([]string, len(idx))
	for i, k := range idx {
		set[i] = keys[k]
	}
	opts := tenace.LockOptions{Provider: p, Keys: set}
	ctx := context.Background()
	switch rng.IntN(4) {
	case 0:
		opts.Timeout = tenace.NoWait
	case 1:
		opts.Timeout = time.Duration(1+rng.IntN(500)) * time.Microsecond
	case 2:
		c, cancel := context.WithCancel(ctx)
		defer cancel()
		t := time.AfterFunc(time.Duration(rng.IntN(500))*time.Microsecond, cancel)
		defer t.Stop()
		ctx = c
	}
	err := tenace.NewPolicy().WithLock(opts).Execute(ctx, func(context.Context) error {
		for _, k := range idx {
			if n := inside[k].Add(1); n != 1 {
				return fmt.Errorf("key %s: %d holders at once", keys[k], n)
			}
		}
		ran.Add(1)
		for _, k := range idx {
			inside[k].Add(-1)
		}
		return nil
	})
	var na *tenace.LockNotAcquiredError
	switch {
	case err == nil:
	case errors.As(err, &na):
		rejected.Add(1)
	case errors.Is(err, context.Canceled):
		cancelled.Add(1)
	default:
		return err
	}
	return nil
}

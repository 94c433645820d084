//go:build !race

package tenace_test

import (
	"context"
	"testing"

	"tenace.dev/tenace"
)

// setsOnly forwards Acquire and AcquireSet to a MemoryLockProvider, and
// not its DeadlockDetector: the same provider with detection off.
type setsOnly struct{ p *tenace.MemoryLockProvider }

func (s setsOnly) Acquire(ctx context.Context, key string, opts tenace.LockAcquireOptions) (tenace.LockLease, error) {
	return s.p.Acquire(ctx, key, opts)
}

func (s setsOnly) AcquireSet(ctx context.Context, keys []string, opts tenace.LockAcquireOptions) (*tenace.SetLease, error) {
	return s.p.AcquireSet(ctx, keys, opts)
}

// An uncontended Lock with Keys costs the same with deadlock detection on
// (the memory provider) and off (the same provider behind a wrapper that
// does not forward its detector): 17 allocations for a set of 3
// (AcquireAll and Release of the set 9, the rest the Lock step's and the
// pipeline's). A detector,
// which only a wait can need, costs nothing while every key is free: no
// node, no message, no one-key-at-a-time path; and a provider without one
// pays nothing for it.
func TestReviewUncontendedSetLockPaysNothingForTheDetector(t *testing.T) {
	p := tenace.NewMemoryLockProvider()
	defer p.Close()
	keys := []string{"c", "a", "b"}
	fn := func(context.Context) error { return nil }
	allocs := func(provider tenace.LockProvider) float64 {
		pol := tenace.NewPolicy().WithLock(tenace.LockOptions{Provider: provider, Keys: keys})
		return testing.AllocsPerRun(500, func() {
			if err := pol.Execute(bg, fn); err != nil {
				t.Fatal(err)
			}
		})
	}
	const budget = 17
	if off := allocs(setsOnly{p}); off > budget {
		t.Errorf("an uncontended Lock with Keys on a provider without a detector allocates %v times, want at most %v", off, budget)
	}
	if on := allocs(p); on > budget {
		t.Errorf("an uncontended Lock with Keys on the memory provider allocates %v times, want at most %v: a wait that never happens should cost nothing", on, budget)
	}
}

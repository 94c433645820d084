package tenace_test

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"tenace.dev/tenace"
)

// roundTrip forwards to a MemoryLockProvider, with its DeadlockDetector,
// after a round trip of a millisecond (on the synctest bubble's clock): a
// provider whose answer takes time, as a remote one's does.
type roundTrip struct{ p *tenace.MemoryLockProvider }

func (r roundTrip) Acquire(ctx context.Context, key string, opts tenace.LockAcquireOptions) (tenace.LockLease, error) {
	time.Sleep(time.Millisecond)
	return r.p.Acquire(ctx, key, opts)
}

func (r roundTrip) DeadlockDetector() *tenace.DeadlockDetector { return r.p.DeadlockDetector() }

// A NoWait Lock never waits, so it can never be part of a deadlock: asked
// for a key that the other member of what would be a cycle holds, it is not
// granted (*LockNotAcquiredError, lock.rejected), never a *DeadlockError.
// Here A holds k1, B holds k2 and waits for k1 (no Timeout), and A tries k2
// with NoWait, as one key and inside a set: B gets k1 once A's fn returns,
// so nothing waits forever.
func TestReviewNoWaitIsNeverADeadlock(t *testing.T) {
	for _, tc := range []struct {
		name   string
		rounds int
		wrap   func(*tenace.MemoryLockProvider) tenace.LockProvider
		try    tenace.LockOptions
	}{
		// Deterministic: the detector has run before the try answers.
		{"a provider with a round trip", 1, func(p *tenace.MemoryLockProvider) tenace.LockProvider { return roundTrip{p} }, tenace.LockOptions{Key: "k2"}},
		{"a set, a provider with a round trip", 1, func(p *tenace.MemoryLockProvider) tenace.LockProvider { return roundTrip{p} }, tenace.LockOptions{Keys: []string{"k2", "k3"}}},
		// The memory provider itself: a race between the detector and the
		// try, lost in a few rounds of a hundred.
		{"the memory provider", 100, func(p *tenace.MemoryLockProvider) tenace.LockProvider { return p }, tenace.LockOptions{Key: "k2"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for round := range tc.rounds {
				synctest.Test(t, func(t *testing.T) {
					mp := tenace.NewMemoryLockProvider()
					defer mp.Close()
					p := tc.wrap(mp)
					lock := func(o tenace.LockOptions) tenace.Policy {
						o.Provider = p
						return tenace.NewPolicy().WithLock(o)
					}
					bHolds := make(chan struct{})
					bErr := make(chan error, 1)
					aHolds := make(chan struct{})
					go func() {
						bErr <- lock(tenace.LockOptions{Key: "k2"}).Execute(context.Background(), func(ctx context.Context) error {
							close(bHolds)
							<-aHolds
							return lock(tenace.LockOptions{Key: "k1"}).Execute(ctx, func(context.Context) error { return nil })
						})
					}()
					<-bHolds
					var tried error
					err := lock(tenace.LockOptions{Key: "k1"}).Execute(context.Background(), func(ctx context.Context) error {
						close(aHolds)
						synctest.Wait() // B waits for k1
						try := tc.try
						try.Timeout = tenace.NoWait
						tried = lock(try).Execute(ctx, func(context.Context) error { return nil })
						return nil
					})
					if err != nil {
						t.Fatal(err)
					}
					var nl *tenace.LockNotAcquiredError
					if !errors.As(tried, &nl) {
						t.Errorf("round %d: a NoWait Lock on a held key returned %v, want *LockNotAcquiredError: a try that never waits cannot deadlock", round, tried)
					}
					if err := <-bErr; err != nil {
						t.Errorf("round %d: B: %v", round, err)
					}
				})
			}
		})
	}
}

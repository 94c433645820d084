package tenace_test

import (
	"context"
	"errors"
	"fmt"

	"tenace.dev/tenace"
)

// A transfer holds both accounts at once. Callers may name them in either
// order: a set is acquired in one global order, so two transfers between
// the same accounts in opposite directions never deadlock.
func ExampleLockOptions_keys() {
	p := tenace.NewMemoryLockProvider()
	defer p.Close()
	transfer := func(from, to string) error {
		return tenace.NewPolicy().
			WithLock(tenace.LockOptions{Provider: p, Keys: []string{from, to}}).
			OnEvent(func(e tenace.Event) {
				if e.Name == tenace.EventLockAcquired {
					fmt.Println("holding", e.Key)
				}
			}).
			Execute(context.Background(), func(ctx context.Context) error {
				l, _ := tenace.LeaseFrom(ctx)
				for i, key := range l.(*tenace.SetLease).Keys() {
					_ = i // l.(*tenace.SetLease).Leases()[i] has key's fencing token
					_ = key
				}
				return nil // move the money
			})
	}
	fmt.Println(transfer("account/7", "account/3"))
	fmt.Println(transfer("account/3", "account/7"))
	// Output:
	// holding account/3,account/7
	// <nil>
	// holding account/3,account/7
	// <nil>
}

// AcquireAll takes a set from any provider, all or none.
func ExampleAcquireAll() {
	p := tenace.NewMemoryLockProvider()
	defer p.Close()
	ctx := context.Background()

	blocker, _ := p.Acquire(ctx, "b", tenace.LockAcquireOptions{})
	set, err := tenace.AcquireAll(ctx, p, []string{"c", "b", "a"}, tenace.LockAcquireOptions{Timeout: tenace.NoWait})
	fmt.Println("granted:", set != nil, err, "held:", p.Size())

	_ = blocker.Release(ctx)
	set, _ = tenace.AcquireAll(ctx, p, []string{"c", "b", "a"}, tenace.LockAcquireOptions{Timeout: tenace.NoWait})
	fmt.Println("granted:", set.Keys(), "held:", p.Size())
	_ = set.Release(ctx)
	// Output:
	// granted: false <nil> held: 1
	// granted: [a b c] held: 3
}

// A nested Lock on a key its execution already holds would wait for itself
// forever: it returns a *DeadlockError at once instead.
func ExampleDeadlockError() {
	lock := tenace.NewPolicy().WithLock(tenace.LockOptions{Key: "report"})
	err := lock.Execute(context.Background(), func(ctx context.Context) error {
		return lock.Execute(ctx, func(context.Context) error { return nil })
	})
	var d *tenace.DeadlockError
	fmt.Println(errors.As(err, &d), d.Key)
	// Output:
	// true report
}

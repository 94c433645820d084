package policy_test

import (
	"context"
	"fmt"

	"tenace.dev/tenace"
	"tenace.dev/tenace/policy"
)

// countAttempts is a third-party strategy: it reports every call it wraps
// through the policy's events, and runs the inner steps once.
type countAttempts struct{}

func (countAttempts) Run(ctx context.Context, x policy.Execution, next policy.Next) error {
	x.Emit(policy.Event{Name: "attempt", Key: x.Key()})
	return next.Run(ctx)
}

// A strategy of your own goes in a policy like the built-in ones; a step
// wraps the steps added before it, so here the attempt is counted while the
// lock is held.
func Example_strategy() {
	provider := tenace.NewMemoryLockProvider()
	defer provider.Close()
	p := tenace.NewPolicy().
		With(countAttempts{}).
		WithLock(tenace.LockOptions{Provider: provider}).
		OnEvent(func(e tenace.Event) { fmt.Println(e.Name, e.Key) })
	_ = p.Execute(context.Background(), func(context.Context) error { return nil }, tenace.WithKey("job-1"))
	// Output:
	// lock.acquiring job-1
	// lock.acquired job-1
	// attempt job-1
	// lock.released job-1
}

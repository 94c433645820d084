package failsafelock_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/failsafe-go/failsafe-go"
	"github.com/failsafe-go/failsafe-go/circuitbreaker"
	"github.com/failsafe-go/failsafe-go/fallback"
	"github.com/failsafe-go/failsafe-go/retrypolicy"

	"tenace.dev/tenace"
	"tenace.dev/tenace/failsafelock"
)

// A lock on a key per call, innermost in a failsafe-go pipeline: the Retry
// retries contention with backoff, the CircuitBreaker opens on provider
// failures only, and fn reads the fencing token from its execution's
// context.
func Example() {
	provider := tenace.NewMemoryLockProvider() // or redislock.New(client), pglock.New(pool)
	defer provider.Close()

	retry := retrypolicy.NewBuilder[string]().
		HandleErrorTypes(&tenace.LockNotAcquiredError{}).
		WithBackoff(10*time.Millisecond, time.Second).
		WithMaxRetries(5).
		Build()
	breaker := circuitbreaker.NewBuilder[string]().
		HandleErrorTypes(&tenace.UnexpectedError{}).
		Build()
	lock := failsafelock.New[string](tenace.LockOptions{Provider: provider, Timeout: 100 * time.Millisecond})

	ctx := failsafelock.WithKey(context.Background(), "report:2026-12")
	report, err := failsafe.With(retry, breaker, lock).WithContext(ctx).
		GetWithExecution(func(exec failsafe.Execution[string]) (string, error) {
			lease, _ := tenace.LeaseFrom(exec.Context())
			token := lease.(tenace.FencedLease).Token()
			return fmt.Sprintf("report built under fencing token %d", token), nil
		})
	fmt.Println(report, err)
	// Output: report built under fencing token 1 <nil>
}

// Listeners in failsafe-go's style: a key held elsewhere is rejected at once
// (NoWait), retried once, and a Fallback answers instead.
func ExampleNewBuilder() {
	provider := tenace.NewMemoryLockProvider()
	defer provider.Close()
	other, _ := provider.Acquire(context.Background(), "stock", tenace.LockAcquireOptions{})
	defer other.Release(context.Background())

	lock := failsafelock.NewBuilder[int](tenace.LockOptions{Provider: provider, Key: "stock", Timeout: tenace.NoWait}).
		OnRejected(func(e failsafe.ExecutionEvent[int]) {
			var rejected *tenace.LockNotAcquiredError
			if errors.As(e.LastError(), &rejected) {
				fmt.Printf("attempt %d: %q is held\n", e.Attempts(), rejected.Key)
			}
		}).
		Build()
	retry := retrypolicy.NewBuilder[int]().WithMaxRetries(1).Build()

	n, err := failsafe.With(fallback.NewWithResult(-1), retry, lock).Get(func() (int, error) { return 42, nil })
	fmt.Println(n, err)
	// Output:
	// attempt 1: "stock" is held
	// attempt 2: "stock" is held
	// -1 <nil>
}

// A key from what the request already carries: here a tenant id that a
// middleware put in the context.
func ExampleBuilder_WithKeyFunc() {
	type tenantKey struct{}
	provider := tenace.NewMemoryLockProvider()
	defer provider.Close()

	lock := failsafelock.NewBuilder[string](tenace.LockOptions{Provider: provider}).
		WithKeyFunc(func(ctx context.Context) string {
			tenant, _ := ctx.Value(tenantKey{}).(string)
			return "billing:" + tenant
		}).
		OnAcquired(func(e failsafe.ExecutionEvent[string]) { fmt.Println("locked for", e.Context().Value(tenantKey{})) }).
		Build()

	ctx := context.WithValue(context.Background(), tenantKey{}, "acme")
	invoice, err := failsafe.With(lock).WithContext(ctx).Get(func() (string, error) { return "invoice 7", nil })
	fmt.Println(invoice, err)
	// Output:
	// locked for acme
	// invoice 7 <nil>
}

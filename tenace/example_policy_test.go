package tenace_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"tenace.dev/tenace"
)

// The source document's example: a lock on "reports" with a 5 s wait,
// around a one-minute timeout on the work.
func ExampleNewLock() {
	lock := tenace.NewLock(tenace.LockOptions{Key: "reports", Timeout: 5 * time.Second})
	p := tenace.NewPolicy().WithTimeout(time.Minute).With(lock)

	err := p.Execute(context.Background(), func(ctx context.Context) error {
		fmt.Println("building the report while holding the lock")
		return nil
	})
	fmt.Println("err:", err)
	// Output:
	// building the report while holding the lock
	// err: <nil>
}

// A key per call: every execution with the same key runs one at a time.
func ExampleWithKey() {
	provider := tenace.NewMemoryLockProvider()
	defer provider.Close()
	p := tenace.NewPolicy().WithLock(tenace.LockOptions{Provider: provider})

	for _, user := range []string{"alice", "bob"} {
		_ = p.Execute(context.Background(), func(ctx context.Context) error {
			fmt.Println("updating", user)
			return nil
		}, tenace.WithKey("user:"+user))
	}
	err := p.Execute(context.Background(), func(context.Context) error { return nil })
	fmt.Println(errors.Is(err, tenace.ErrMissingKey))
	// Output:
	// updating alice
	// updating bob
	// true
}

// Get returns fn's value; a lock that cannot be had at once gives a
// *LockNotAcquiredError and the lock.rejected event.
func ExampleGet() {
	provider := tenace.NewMemoryLockProvider()
	defer provider.Close()
	p := tenace.NewPolicy().
		WithLock(tenace.LockOptions{Provider: provider, Key: "stock", Timeout: tenace.NoWait}).
		OnEvent(func(e tenace.Event) { fmt.Println("event:", e.Name, e.Key) })

	n, err := tenace.Get(context.Background(), p, func(ctx context.Context) (int, error) {
		// While this call holds "stock", another one cannot get in. (Another
		// call: with this call's ctx, it would be this execution asking
		// again, a *DeadlockError.)
		_, err := tenace.Get(context.Background(), p, func(context.Context) (int, error) { return 0, nil })
		var nae *tenace.LockNotAcquiredError
		fmt.Println("nested call rejected:", errors.As(err, &nae))
		return 42, nil
	})
	fmt.Println(n, err)
	// Output:
	// event: lock.acquiring stock
	// event: lock.acquired stock
	// event: lock.acquiring stock
	// event: lock.rejected stock
	// nested call rejected: true
	// event: lock.released stock
	// 42 <nil>
}

// LeaseFrom gives fn the lease, for instance to hand its fencing token to
// the resource it reads and writes (which checks it on every access).
func ExampleLeaseFrom() {
	provider := tenace.NewMemoryLockProvider()
	defer provider.Close()
	p := tenace.NewPolicy().WithLock(tenace.LockOptions{Provider: provider, Key: "ledger"})
	_ = p.Execute(context.Background(), func(ctx context.Context) error {
		lease, _ := tenace.LeaseFrom(ctx)
		token := lease.(tenace.FencedLease).Token()
		fmt.Println("accessing with a fencing token:", token > 0)
		return nil
	})
	// Output: accessing with a fencing token: true
}

// TokenFrom reads the fencing token in one call, to pass it with every
// access, read or write, to the resource the lock guards (which refuses a
// token lower than the highest it has seen; see FencedLease).
func ExampleTokenFrom() {
	provider := tenace.NewMemoryLockProvider()
	defer provider.Close()
	p := tenace.NewPolicy().WithLock(tenace.LockOptions{Provider: provider, Key: "ledger"})
	for range 2 {
		_ = p.Execute(context.Background(), func(ctx context.Context) error {
			token, ok := tenace.TokenFrom(ctx)
			fmt.Println("access with token", token, ok)
			return nil
		})
	}
	// Output:
	// access with token 1 true
	// access with token 2 true
}

// WithTimeout's error unwraps to context.DeadlineExceeded.
func ExampleTimeoutError() {
	p := tenace.NewPolicy().WithTimeout(10 * time.Millisecond)
	err := p.Execute(context.Background(), func(ctx context.Context) error {
		<-ctx.Done() // well-behaved work stops when its context ends
		return ctx.Err()
	})
	var te *tenace.TimeoutError
	fmt.Println(errors.As(err, &te), errors.Is(err, context.DeadlineExceeded))
	// Output: true true
}

// A timeout added after the lock bounds the lock's wait too: when the wait
// takes all of it, the work never starts, and the error says so.
func ExampleTimeoutError_beforeFn() {
	p := tenace.NewMemoryLockProvider()
	defer p.Close()
	other, _ := p.Acquire(context.Background(), "reports", tenace.LockAcquireOptions{}) // another call holds the key
	defer other.Release(context.Background())

	pol := tenace.NewPolicy().WithLock(tenace.LockOptions{Provider: p}).WithTimeout(10 * time.Millisecond)
	err := pol.Execute(context.Background(), func(context.Context) error {
		fmt.Println("never printed")
		return nil
	}, tenace.WithKey("reports"))
	var te *tenace.TimeoutError
	if errors.As(err, &te) {
		fmt.Println(te.BeforeFn)
		fmt.Println(err)
	}
	// Output:
	// true
	// tenace: the work did not start within its 10ms timeout (key "reports"); add WithTimeout before the step that waited (a lock), or raise its duration
}

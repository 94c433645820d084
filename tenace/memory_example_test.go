package tenace_test

import (
	"context"
	"fmt"

	"tenace.dev/tenace"
)

// Stats reads what the shards publish, with no message: a grant is counted
// before Acquire returns, and a release nobody waited for is uncounted
// before Release returns.
func ExampleMemoryLockProvider_Stats() {
	ctx := context.Background()
	p := tenace.NewMemoryLockProvider()
	defer p.Close()

	a, _ := p.Acquire(ctx, "report-a", tenace.LockAcquireOptions{})
	b, _ := p.Acquire(ctx, "report-b", tenace.LockAcquireOptions{})
	st := p.Stats()
	fmt.Println("held:", st.Held, "waiting:", st.Waiting)
	_ = a.Release(ctx)
	st = p.Stats()
	fmt.Println("held:", st.Held, "waiting:", st.Waiting)
	_ = b.Release(ctx)
	fmt.Printf("%+v\n", p.Stats())
	// Output:
	// held: 2 waiting: 0
	// held: 1 waiting: 0
	// {Held:0 Waiting:0 LongestQueue:0 SharedKeys:0 SharedHolders:0 SharedWaiting:0}
}

// The Shared... counts tell a keyed bulkhead's permits in use from keys
// held exclusive: here, three exports of one customer hold 3 of its 5
// permits while a migration holds another key.
func ExampleLockStats_shared() {
	ctx := context.Background()
	p := tenace.NewMemoryLockProvider()
	defer p.Close()

	export := tenace.LockAcquireOptions{Shared: true, Permits: 5}
	for range 3 {
		l, _ := p.Acquire(ctx, "exports:customer-42", export)
		defer l.Release(ctx)
	}
	m, _ := p.Acquire(ctx, "migrations", tenace.LockAcquireOptions{})
	defer m.Release(ctx)

	st := p.Stats()
	fmt.Println("keys held:", st.Held)
	fmt.Println("  exclusive:", st.Held-st.SharedKeys)
	fmt.Println("  shared:", st.SharedKeys, "by", st.SharedHolders, "holders (permits in use)")
	// Output:
	// keys held: 2
	//   exclusive: 1
	//   shared: 1 by 3 holders (permits in use)
}

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
	fmt.Printf("%+v\n", p.Stats())
	_ = a.Release(ctx)
	fmt.Printf("%+v\n", p.Stats())
	_ = b.Release(ctx)
	fmt.Printf("%+v\n", p.Stats())
	// Output:
	// {Held:2 Waiting:0 LongestQueue:0}
	// {Held:1 Waiting:0 LongestQueue:0}
	// {Held:0 Waiting:0 LongestQueue:0}
}

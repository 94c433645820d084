package tenace_test

import (
	"context"
	"fmt"
	"time"

	"tenace.dev/tenace"
)

// A MemoryLockProvider used directly: one holder per key; a second Acquire
// with NoWait gives up at once; after Release the key is free again.
func ExampleMemoryLockProvider() {
	p := tenace.NewMemoryLockProvider()
	defer p.Close()
	ctx := context.Background()

	lease, err := p.Acquire(ctx, "invoice-42", tenace.LockAcquireOptions{})
	if err != nil {
		panic(err)
	}
	fmt.Println("held:", p.Size())

	other, err := p.Acquire(ctx, "invoice-42", tenace.LockAcquireOptions{Timeout: tenace.NoWait})
	fmt.Println("second holder:", other != nil, err)

	_ = lease.Release(ctx)
	again, _ := p.Acquire(ctx, "invoice-42", tenace.LockAcquireOptions{Timeout: time.Second})
	fmt.Println("after release:", again != nil)
	_ = again.Release(ctx)
	// Output:
	// held: 1
	// second holder: false <nil>
	// after release: true
}

// Every lease of a MemoryLockProvider carries a fencing token that grows
// grant after grant for the same key.
func ExampleFencedLease() {
	p := tenace.NewMemoryLockProvider()
	defer p.Close()
	ctx := context.Background()
	var last uint64
	for range 3 {
		l, _ := p.Acquire(ctx, "ledger", tenace.LockAcquireOptions{})
		tok := l.(tenace.FencedLease).Token()
		fmt.Println("token grew:", tok > last)
		last = tok
		_ = l.Release(ctx)
	}
	// Output:
	// token grew: true
	// token grew: true
	// token grew: true
}

// Close fails later acquires with ErrProviderClosed.
func ExampleMemoryLockProvider_Close() {
	p := tenace.NewMemoryLockProvider(tenace.WithShards(1))
	_ = p.Close()
	_, err := p.Acquire(context.Background(), "k", tenace.LockAcquireOptions{})
	fmt.Println(err == tenace.ErrProviderClosed)
	// Output: true
}

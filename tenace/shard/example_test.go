package shard_test

import (
	"context"
	"fmt"

	"tenace.dev/tenace/shard"
)

// A Group routes each key to its shard; the shard grants the key to one
// caller at a time, in arrival order. Most code uses the tenace package's
// MemoryLockProvider, which is built on this.
func Example() {
	g := shard.NewGroup(shard.Options{Shards: 2})
	defer g.Stop()
	ctx := context.Background()

	s := g.For("orders/42")
	held, err := s.Acquire(ctx, "orders/42", shard.Wait, nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("granted:", held.Granted)

	// While it is held, a Try is refused at once: not granted, no error.
	other, err := s.Acquire(ctx, "orders/42", shard.Try, nil)
	fmt.Println("second caller granted:", other.Granted, err)

	held.Grant().Release()
	again, err := s.Acquire(ctx, "orders/42", shard.Try, nil)
	fmt.Println("after the release:", again.Granted, err)
	again.Grant().Release()
	// Output:
	// granted: true
	// second caller granted: false <nil>
	// after the release: true <nil>
}

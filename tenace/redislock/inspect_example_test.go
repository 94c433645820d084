package redislock_test

import (
	"context"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"tenace.dev/tenace"
	"tenace.dev/tenace/redislock"
)

// A provider whose grants name the pod that holds them. (Not run: it needs
// a Redis server on localhost:6379.)
func ExampleWithOwner() {
	client := redis.NewClient(&redis.Options{Addr: "localhost:6379", ContextTimeoutEnabled: true})
	defer client.Close()
	locks := redislock.New(client, redislock.WithOwner("api-7f9c"))
	defer locks.Close()
	// A Lock's own label follows: Inspect shows "api-7f9c (nightly import)".
	_ = tenace.NewPolicy().WithLock(tenace.LockOptions{Provider: locks, Key: "import", Owner: "nightly import"})
}

// Who holds a stuck key, since when, and who waits. (Not run: it needs a
// Redis server on localhost:6379.)
func ExampleProvider_Inspect() {
	client := redis.NewClient(&redis.Options{Addr: "localhost:6379", ContextTimeoutEnabled: true})
	defer client.Close()
	locks := redislock.New(client)
	defer locks.Close()

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	info, err := locks.Inspect(ctx, "nightly-import")
	if err != nil {
		fmt.Println(err) // the server is down or silent: not "free"
		return
	}
	for _, h := range info.Holders {
		fmt.Printf("held by %s for %v (token %d)\n", h.Owner, time.Since(h.Since).Round(time.Second), h.Token)
	}
	fmt.Println(info.Waiting, "processes wait")
}

// Every key held under "jobs/", a page at a time. (Not run: it needs a
// Redis server on localhost:6379.)
func ExampleProvider_List() {
	client := redis.NewClient(&redis.Options{Addr: "localhost:6379", ContextTimeoutEnabled: true})
	defer client.Close()
	locks := redislock.New(client)
	defer locks.Close()

	opts := tenace.ListOptions{Prefix: "jobs/", Limit: 50}
	for {
		page, err := locks.List(context.Background(), opts)
		if err != nil {
			fmt.Println(err)
			return
		}
		for _, k := range page.Keys {
			fmt.Printf("%q: %d holders, %d waiting\n", k.Key, len(k.Holders), k.Waiting)
		}
		if page.Next == "" {
			return
		}
		opts.Cursor = page.Next
	}
}

// Owner returns the label grants record.
func ExampleProvider_Owner() {
	client := redis.NewClient(&redis.Options{Addr: "localhost:6379"})
	defer client.Close()
	locks := redislock.New(client, redislock.WithOwner("worker-3"))
	defer locks.Close()
	fmt.Println(locks.Owner())
	// Output: worker-3
}

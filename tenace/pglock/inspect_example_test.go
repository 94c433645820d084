package pglock_test

import (
	"context"
	"fmt"
	"time"

	"tenace.dev/tenace"
	"tenace.dev/tenace/pglock"
)

// A provider whose grants name the pod that holds them. (Not run: it needs
// a PostgreSQL server.)
func ExampleWithOwner() {
	ctx := context.Background()
	locks, err := pglock.New(ctx, "postgres://app@localhost/app", pglock.WithOwner("api-7f9c"))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer locks.Close()
	// A Lock's own label follows: Inspect shows "api-7f9c (nightly import)".
	_ = tenace.NewPolicy().WithLock(tenace.LockOptions{Provider: locks, Key: "import", Owner: "nightly import"})
}

// Who holds a stuck key, since when, and who waits. (Not run: it needs a
// PostgreSQL server.)
func ExampleProvider_Inspect() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	locks, err := pglock.New(ctx, "postgres://app@localhost/app")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer locks.Close()
	info, err := locks.Inspect(ctx, "nightly-import")
	if err != nil {
		fmt.Println(err) // the server is down or silent: not "free"
		return
	}
	for _, h := range info.Holders {
		fmt.Printf("held by %q since %v (token %d)\n", h.Owner, h.Since, h.Token)
	}
	fmt.Printf("%d waiting, the longest for %v\n", info.Waiting, info.LongestWait)
}

// Every key held under "jobs/", a page at a time. (Not run: it needs a
// PostgreSQL server.)
func ExampleProvider_List() {
	ctx := context.Background()
	locks, err := pglock.New(ctx, "postgres://app@localhost/app")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer locks.Close()
	opts := tenace.ListOptions{Prefix: "jobs/", Limit: 50}
	for {
		page, err := locks.List(ctx, opts)
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

// Owner returns the label grants record. (Not run: it needs a PostgreSQL
// server.)
func ExampleProvider_Owner() {
	locks, err := pglock.New(context.Background(), "postgres://app@localhost/app", pglock.WithOwner("worker-3"))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer locks.Close()
	fmt.Println(locks.Owner())
}

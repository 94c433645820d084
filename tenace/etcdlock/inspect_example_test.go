package etcdlock_test

import (
	"context"
	"fmt"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"tenace.dev/tenace"
	"tenace.dev/tenace/etcdlock"
)

// A provider whose grants name the pod that holds them. (Not run: it needs
// an etcd cluster.)
func ExampleWithOwner() {
	client, err := clientv3.New(clientv3.Config{Endpoints: []string{"localhost:2379"}, DialTimeout: 5 * time.Second})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer client.Close()
	locks := etcdlock.New(client, etcdlock.WithOwner("api-7f9c"))
	defer locks.Close()
	// A Lock's own label follows: Inspect shows "api-7f9c (nightly import)".
	_ = tenace.NewPolicy().WithLock(tenace.LockOptions{Provider: locks, Key: "import", Owner: "nightly import"})
}

// Who holds a stuck key, since when, and who waits. (Not run: it needs an
// etcd cluster.)
func ExampleProvider_Inspect() {
	client, err := clientv3.New(clientv3.Config{Endpoints: []string{"localhost:2379"}, DialTimeout: 5 * time.Second})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer client.Close()
	locks := etcdlock.New(client)
	defer locks.Close()

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	info, err := locks.Inspect(ctx, "nightly-import")
	if err != nil {
		fmt.Println(err) // the cluster is down or silent: not "free"
		return
	}
	for _, h := range info.Holders {
		fmt.Printf("held by %q since %v (token %d), expires %v\n", h.Owner, h.Since, h.Token, h.Expires)
	}
	for _, w := range info.Waiters {
		fmt.Printf("waiting: %q since %v\n", w.Owner, w.Since)
	}
}

// Every key held under "jobs/", a page at a time. (Not run: it needs an
// etcd cluster.)
func ExampleProvider_List() {
	client, err := clientv3.New(clientv3.Config{Endpoints: []string{"localhost:2379"}, DialTimeout: 5 * time.Second})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer client.Close()
	locks := etcdlock.New(client)
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
	client, err := clientv3.New(clientv3.Config{Endpoints: []string{"localhost:2379"}, DialTimeout: 5 * time.Second})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer client.Close()
	locks := etcdlock.New(client, etcdlock.WithOwner("worker-3"))
	defer locks.Close()
	fmt.Println(locks.Owner())
	// Output: worker-3
}

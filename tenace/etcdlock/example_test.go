package etcdlock_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"tenace.dev/tenace"
	"tenace.dev/tenace/etcdlock"
)

// exampleEndpoints are the test cluster's; a program passes its own, such
// as []string{"etcd-0.internal:2379", "etcd-1.internal:2379"}.
func exampleEndpoints() []string { return shared.Endpoints() }

// Locks on etcd through a Policy: calls with the same key run one at a
// time across every process that uses the cluster, in the order they
// queued.
func Example() {
	ctx := context.Background()
	client, err := clientv3.New(clientv3.Config{Endpoints: exampleEndpoints(), DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer client.Close()
	locks := etcdlock.New(client)
	defer locks.Close() // before the client's Close

	p := tenace.NewPolicy().
		WithTimeout(time.Minute).
		WithLock(tenace.LockOptions{Provider: locks, Key: "example/reports", Timeout: 5 * time.Second})
	err = p.Execute(ctx, func(ctx context.Context) error { // ctx ends if the lease is lost
		l, _ := tenace.LeaseFrom(ctx)
		token := l.(tenace.FencedLease).Token() // hand it to the storage, which refuses older ones
		fmt.Println("building the report under a fencing token:", token > 0)
		return nil
	})
	fmt.Println("done:", err)
	// Output:
	// building the report under a fencing token: true
	// done: <nil>
}

// The guard on the resource side, when the resource is in etcd too: a
// write in a Txn that holds only while the lease still holds the lock.
func ExampleIsOwner() {
	ctx := context.Background()
	client, err := clientv3.New(clientv3.Config{Endpoints: exampleEndpoints(), DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer client.Close()
	locks := etcdlock.New(client)
	defer locks.Close()

	lease, err := locks.Acquire(ctx, "example/config", tenace.LockAcquireOptions{Timeout: 5 * time.Second})
	if err != nil || lease == nil {
		fmt.Println("not acquired:", err)
		return
	}
	defer lease.Release(ctx)
	owner, _ := etcdlock.IsOwner(lease)
	resp, err := client.Txn(ctx).If(owner).Then(clientv3.OpPut("example/config-value", "v2")).Commit()
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("written under the lock:", resp.Succeeded)
	// Output:
	// written under the lock: true
}

// Direct use of the provider, without a Policy: the lease says when it is
// lost (its keepalives failed, its TTL passed), and the work stops.
func ExampleProvider_Acquire() {
	ctx := context.Background()
	client, err := clientv3.New(clientv3.Config{Endpoints: exampleEndpoints(), DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer client.Close()
	locks := etcdlock.New(client, etcdlock.WithWindow(10*time.Second))
	defer locks.Close()

	lease, err := locks.Acquire(ctx, "example/nightly-job", tenace.LockAcquireOptions{Timeout: tenace.NoWait, TTL: 50 * time.Millisecond})
	switch {
	case err != nil:
		fmt.Println("the provider failed:", err)
		return
	case lease == nil:
		fmt.Println("someone else runs the job")
		return
	}
	lost := lease.(tenace.LosableLease)
	select {
	case <-lost.Lost(): // long work would check this between steps
		fmt.Println("lost:", errors.Is(lost.Err(), tenace.ErrLeaseExpired))
	case <-time.After(time.Minute):
	}
	err = lease.Release(ctx) // after a loss: touches nothing, says why
	fmt.Println("release:", errors.Is(err, tenace.ErrLeaseLost))
	// Output:
	// lost: true
	// release: true
}

// A read/write lock across processes: readers of a tenant's configuration
// (Shared) run together, a writer (Shared false, the default) alone, and a
// waiting writer is not overtaken by readers that come after it.
func Example_readWrite() {
	ctx := context.Background()
	client, err := clientv3.New(clientv3.Config{Endpoints: exampleEndpoints(), DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer client.Close()
	locks := etcdlock.New(client)
	defer locks.Close()

	read := tenace.NewPolicy().WithLock(tenace.LockOptions{Provider: locks, Key: "example/tenant-42/config", Shared: true, Timeout: 5 * time.Second})
	err = read.Execute(ctx, func(ctx context.Context) error {
		// A second reader is admitted beside this one; a writer is not.
		other, _ := locks.Acquire(ctx, "example/tenant-42/config", tenace.LockAcquireOptions{Shared: true, Timeout: tenace.NoWait})
		fmt.Println("another reader beside:", other != nil)
		writer, _ := locks.Acquire(ctx, "example/tenant-42/config", tenace.LockAcquireOptions{Timeout: tenace.NoWait})
		fmt.Println("a writer beside:", writer != nil)
		if other != nil {
			return other.Release(ctx)
		}
		return nil
	})
	fmt.Println("done:", err)
	// Output:
	// another reader beside: true
	// a writer beside: false
	// done: <nil>
}

// A keyed bulkhead: at most 2 exports run at once per customer, across
// every process, first come, first served. Every caller of the key sets
// the same Permits.
func Example_bulkhead() {
	ctx := context.Background()
	client, err := clientv3.New(clientv3.Config{Endpoints: exampleEndpoints(), DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer client.Close()
	locks := etcdlock.New(client)
	defer locks.Close()

	exports := tenace.LockAcquireOptions{Shared: true, Permits: 2, Timeout: tenace.NoWait}
	var held []tenace.LockLease
	for i := range 3 {
		l, err := locks.Acquire(ctx, "example/customer-7/exports", exports)
		if err != nil {
			fmt.Println(err)
			return
		}
		fmt.Printf("export %d admitted: %v\n", i+1, l != nil)
		if l != nil {
			held = append(held, l)
		}
	}
	for _, l := range held {
		_ = l.Release(ctx)
	}
	// Output:
	// export 1 admitted: true
	// export 2 admitted: true
	// export 3 admitted: false
}

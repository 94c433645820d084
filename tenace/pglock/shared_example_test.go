package pglock_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"tenace.dev/tenace"
	"tenace.dev/tenace/pglock"
)

// A read/write lock per key on PostgreSQL: readers of a tenant's
// configuration set Shared and run together, in any process; its writer
// does not, and runs alone. A writer that waits is not overtaken by
// readers that come after it.
func ExampleProvider_readWrite() {
	ctx := context.Background()
	locks, err := pglock.New(ctx, exampleConnString())
	if err != nil {
		fmt.Println(err)
		return
	}
	defer locks.Close()
	const key = "example/tenant-42/config"
	read := tenace.NewPolicy().WithLock(tenace.LockOptions{Provider: locks, Key: key, Shared: true, Timeout: 5 * time.Second})
	write := tenace.NewPolicy().WithLock(tenace.LockOptions{Provider: locks, Key: key, Timeout: tenace.NoWait})

	hold, inside := make(chan struct{}), make(chan struct{})
	var wg sync.WaitGroup
	for range 2 {
		wg.Go(func() {
			_ = read.Execute(ctx, func(context.Context) error {
				inside <- struct{}{}
				<-hold
				return nil
			})
		})
	}
	<-inside
	<-inside // both readers are inside at once
	err = write.Execute(ctx, func(context.Context) error { return nil })
	var na *tenace.LockNotAcquiredError
	fmt.Println("writer beside the readers:", !errors.As(err, &na))
	close(hold)
	wg.Wait()
	fmt.Println("writer after them:", write.Execute(ctx, func(context.Context) error { return nil }))
	// Output:
	// writer beside the readers: false
	// writer after them: <nil>
}

// A keyed bulkhead on PostgreSQL: at most 2 exports at once per customer,
// across every process of the service. Every caller sets Shared and the
// same Permits; a third waits for a permit (here, NoWait: it is turned
// away).
func ExampleProvider_bulkhead() {
	ctx := context.Background()
	locks, err := pglock.New(ctx, exampleConnString())
	if err != nil {
		fmt.Println(err)
		return
	}
	defer locks.Close()
	export := func(timeout time.Duration) tenace.Policy {
		return tenace.NewPolicy().WithLock(tenace.LockOptions{Provider: locks, Key: "example/export/customer-7", Shared: true, Permits: 2, Timeout: timeout})
	}
	hold, inside := make(chan struct{}), make(chan struct{})
	var wg sync.WaitGroup
	for range 2 {
		wg.Go(func() {
			_ = export(5*time.Second).Execute(ctx, func(context.Context) error {
				inside <- struct{}{}
				<-hold
				return nil
			})
		})
	}
	<-inside
	<-inside // two exports run
	err = export(tenace.NoWait).Execute(ctx, func(context.Context) error { return nil })
	var na *tenace.LockNotAcquiredError
	fmt.Println("a third export while two run:", errors.As(err, &na))
	close(hold)
	wg.Wait()
	fmt.Println("once they ended:", export(tenace.NoWait).Execute(ctx, func(context.Context) error { return nil }))
	// Output:
	// a third export while two run: true
	// once they ended: <nil>
}

package tenace_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"tenace.dev/tenace"
)

// A read/write lock per key: readers of a tenant's configuration set
// Shared and run together; its writer does not, and runs alone. A writer
// that waits is not overtaken by readers that come after it.
func ExampleLockOptions_readWrite() {
	ctx := context.Background()
	p := tenace.NewMemoryLockProvider()
	defer p.Close()
	read := tenace.NewPolicy().WithLock(tenace.LockOptions{Provider: p, Key: "tenant-42/config", Shared: true})
	write := tenace.NewPolicy().WithLock(tenace.LockOptions{Provider: p, Key: "tenant-42/config", Timeout: tenace.NoWait})

	hold, inside := make(chan struct{}), make(chan struct{})
	var wg sync.WaitGroup
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = read.Execute(ctx, func(context.Context) error {
				inside <- struct{}{}
				<-hold
				return nil
			})
		}()
	}
	<-inside
	<-inside // both readers are inside at once
	err := write.Execute(ctx, func(context.Context) error { return nil })
	var na *tenace.LockNotAcquiredError
	fmt.Println("writer beside the readers:", !errors.As(err, &na))
	close(hold)
	wg.Wait()
	fmt.Println("writer after them:", write.Execute(ctx, func(context.Context) error { return nil }))
	// Output:
	// writer beside the readers: false
	// writer after them: <nil>
}

// A keyed bulkhead: at most 2 exports at once per customer. Every caller
// sets Shared and the same Permits; a third waits for a permit (here,
// NoWait: it is turned away).
func ExampleLockOptions_bulkhead() {
	ctx := context.Background()
	p := tenace.NewMemoryLockProvider()
	defer p.Close()
	export := func(timeout time.Duration) tenace.Policy {
		return tenace.NewPolicy().WithLock(tenace.LockOptions{Provider: p, Key: "export/customer-7", Shared: true, Permits: 2, Timeout: timeout})
	}
	hold, inside := make(chan struct{}), make(chan struct{})
	var wg sync.WaitGroup
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = export(0).Execute(ctx, func(context.Context) error {
				inside <- struct{}{}
				<-hold
				return nil
			})
		}()
	}
	<-inside
	<-inside // two exports run
	err := export(tenace.NoWait).Execute(ctx, func(context.Context) error { return nil })
	var na *tenace.LockNotAcquiredError
	fmt.Println("third export turned away:", errors.As(err, &na))
	close(hold)
	wg.Wait()
	fmt.Println("after they finish:", export(tenace.NoWait).Execute(ctx, func(context.Context) error { return nil }))
	// Output:
	// third export turned away: true
	// after they finish: <nil>
}

// A listener tells a shared Lock's events from an exclusive one's by
// Event.Shared, and reads a bulkhead's permit count in Event.Permits: here
// to count, or log, exports and migrations apart.
func ExampleEvent_shared() {
	ctx := context.Background()
	p := tenace.NewMemoryLockProvider()
	defer p.Close()
	show := func(e tenace.Event) {
		mode := "exclusive"
		if e.Shared {
			mode = fmt.Sprintf("shared, %d permits", e.Permits)
		}
		fmt.Printf("%s %s (%s)\n", e.Name, e.Key, mode)
	}
	export := tenace.NewPolicy().OnEvent(show).
		WithLock(tenace.LockOptions{Provider: p, Key: "export/customer-7", Shared: true, Permits: 2})
	migrate := tenace.NewPolicy().OnEvent(show).
		WithLock(tenace.LockOptions{Provider: p, Key: "schema"})
	_ = export.Execute(ctx, func(context.Context) error { return nil })
	_ = migrate.Execute(ctx, func(context.Context) error { return nil })
	// Output:
	// lock.acquiring export/customer-7 (shared, 2 permits)
	// lock.acquired export/customer-7 (shared, 2 permits)
	// lock.released export/customer-7 (shared, 2 permits)
	// lock.acquiring schema (exclusive)
	// lock.acquired schema (exclusive)
	// lock.released schema (exclusive)
}

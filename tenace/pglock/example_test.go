package pglock_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"tenace.dev/tenace"
	"tenace.dev/tenace/pglock"
)

// exampleConnString is the test server's; a program passes its own, such
// as "postgres://app@db.internal/app".
func exampleConnString() string { return shared.ConnString() }

// Locks on PostgreSQL through a Policy: calls with the same key run one at
// a time across every process that uses the database.
func Example() {
	ctx := context.Background()
	locks, err := pglock.New(ctx, exampleConnString())
	if err != nil {
		fmt.Println(err)
		return
	}
	defer locks.Close()

	p := tenace.NewPolicy().
		WithTimeout(time.Minute).
		WithLock(tenace.LockOptions{Provider: locks, Key: "example/reports", Timeout: 5 * time.Second})
	err = p.Execute(ctx, func(ctx context.Context) error {
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

// Direct use of the provider, without a Policy: the lease says when it is
// lost (its connection ended, or its TTL passed), and the work stops.
func ExampleProvider_Acquire() {
	ctx := context.Background()
	locks, err := pglock.New(ctx, exampleConnString(), pglock.WithMaxConns(4))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer locks.Close()

	lease, err := locks.Acquire(ctx, "example/nightly-job", tenace.LockAcquireOptions{TTL: 50 * time.Millisecond})
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

// The three outcomes of an Acquire with a Timeout: a lease; (nil, nil),
// which only the server's "held" gives; an error — ErrNoReply for a server
// that did not answer in time, the dial's cause for one that refused. On a
// machine so loaded that the server's "held" comes later than the Timeout
// and 30 ms, it is ErrNoReply too (see the package doc, Waiting): both
// call for a retry.
func ExampleErrNoReply() {
	ctx := context.Background()
	locks, err := pglock.New(ctx, exampleConnString())
	if err != nil {
		fmt.Println(err)
		return
	}
	defer locks.Close()
	holder, _ := locks.Acquire(ctx, "example/outage", tenace.LockAcquireOptions{})
	defer holder.Release(ctx)

	other, err := pglock.New(ctx, exampleConnString())
	if err != nil {
		fmt.Println(err)
		return
	}
	defer other.Close()
	lease, err := other.Acquire(ctx, "example/outage", tenace.LockAcquireOptions{Timeout: 500 * time.Millisecond})
	switch {
	case errors.Is(err, tenace.ErrNoReply): // pglock.ErrNoReply too
		// PostgreSQL did not answer in time: if it persists, an outage.
		fmt.Println("not granted: retry later")
	case err != nil:
		fmt.Println("the provider failed (errors.Is reaches the cause, such as syscall.ECONNREFUSED):", err)
	case lease == nil:
		// PostgreSQL says another holds it.
		fmt.Println("not granted: retry later")
	default:
		_ = lease.Release(ctx)
	}
	// Output:
	// not granted: retry later
}

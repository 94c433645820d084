package redislock_test

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"time"

	"github.com/redis/go-redis/v9"

	"tenace.dev/tenace"
	"tenace.dev/tenace/redislock"
)

// A provider on a client that honours ctx deadlines (ContextTimeoutEnabled),
// closed when done, guarding a report that only one process may build at a
// time. (Not run: it needs a Redis server on localhost:6379.)
func ExampleNew() {
	client := redis.NewClient(&redis.Options{Addr: "localhost:6379", ContextTimeoutEnabled: true})
	defer client.Close()
	// WithLogger: New warns if the client ignores ctx deadlines.
	locks := redislock.New(client, redislock.WithLogger(slog.New(slog.NewTextHandler(os.Stderr, nil))))
	defer locks.Close()

	p := tenace.NewPolicy().WithLock(tenace.LockOptions{Provider: locks, Key: "reports", Timeout: 5 * time.Second, TTL: time.Minute})
	err := p.Execute(context.Background(), func(ctx context.Context) error {
		l, _ := tenace.LeaseFrom(ctx)
		token := l.(tenace.FencedLease).Token() // give it to the storage that refuses stale writers
		_ = token
		return nil
	})
	var nae *tenace.LockNotAcquiredError
	if errors.As(err, &nae) {
		// another process is building it
	}
}

// CheckClient reports a client that ignores ctx deadlines.
func ExampleCheckClient() {
	err := redislock.CheckClient(redis.NewClient(&redis.Options{Addr: "localhost:6379"}))
	if errors.Is(err, redislock.ErrContextTimeoutDisabled) {
		// build the client with ContextTimeoutEnabled: true
	}
}

// Without a pipeline: hold a lock while long work runs, renewed in the
// background, and stop when it is lost. A holder that dies frees the key
// within one window (here 10s); the TTL caps the hold at an hour. (Not run:
// it needs a Redis server on localhost:6379.)
func ExampleProvider_Acquire() {
	client := redis.NewClient(&redis.Options{Addr: "localhost:6379", ContextTimeoutEnabled: true})
	defer client.Close()
	locks := redislock.New(client, redislock.WithWindow(10*time.Second))
	defer locks.Close()

	ctx := context.Background()
	l, err := locks.Acquire(ctx, "nightly-import", tenace.LockAcquireOptions{Timeout: time.Minute, TTL: time.Hour})
	switch {
	case err != nil:
		return // an outage, never contention: Redis refused (syscall.ECONNREFUSED) or did not answer (tenace.ErrNoReply)
	case l == nil:
		return // Redis answered that another holder kept it for the minute
	}
	defer l.Release(context.WithoutCancel(ctx))
	lost := l.(tenace.LosableLease)
	work, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	results := make(chan error, 1)
	go func() { results <- longImport(work) }()
	select {
	case <-lost.Lost():
		// lost.Err() wraps tenace.ErrLeaseLost (tenace.ErrLeaseExpired at
		// the TTL): the lock may be someone else's, so stop and do not commit.
		cancel(lost.Err())
		<-results
	case <-results:
	}
}

func longImport(context.Context) error { return nil }

// A read/write lock per tenant across every replica: readers of a tenant's
// configuration share the key, a writer has it alone, and a writer waiting
// holds back the readers that come after it. (Not run: it needs a Redis
// server on localhost:6379.)
func ExampleProvider_SupportsShared_readWrite() {
	client := redis.NewClient(&redis.Options{Addr: "localhost:6379", ContextTimeoutEnabled: true})
	defer client.Close()
	locks := redislock.New(client)
	defer locks.Close()

	read := tenace.NewPolicy().WithLock(tenace.LockOptions{Provider: locks, Key: "config:acme", Shared: true, Timeout: time.Second})
	write := tenace.NewPolicy().WithLock(tenace.LockOptions{Provider: locks, Key: "config:acme", Timeout: 5 * time.Second})
	ctx := context.Background()
	_ = read.Execute(ctx, func(context.Context) error { return nil })  // beside other readers
	_ = write.Execute(ctx, func(context.Context) error { return nil }) // alone
}

// A keyed bulkhead: at most 5 exports per customer at once, across every
// replica; a sixth waits up to its Timeout for a permit. Every caller of
// a key passes the same Permits (the first holder's count is the key's
// while any holds it). A holder that dies gives its permit back within
// one window. (Not run: it needs a Redis server on localhost:6379.)
func ExampleProvider_SupportsShared_bulkhead() {
	client := redis.NewClient(&redis.Options{Addr: "localhost:6379", ContextTimeoutEnabled: true})
	defer client.Close()
	locks := redislock.New(client)
	defer locks.Close()

	exports := tenace.NewPolicy().WithLock(tenace.LockOptions{
		Provider: locks, Key: "export:customer-42", Shared: true, Permits: 5, Timeout: 30 * time.Second,
	})
	err := exports.Execute(context.Background(), func(ctx context.Context) error {
		return nil // one of at most 5 exports of customer 42 running now
	})
	var nae *tenace.LockNotAcquiredError
	if errors.As(err, &nae) {
		// 5 exports of this customer ran for the whole 30s: try later
	}
}

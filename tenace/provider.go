package tenace

import (
	"context"
	"time"
)

// NoWait as a Timeout means: try once, and do not wait if the key is held.
const NoWait time.Duration = -1

// LockProvider hands out locks on keys. MemoryLockProvider is the in-process
// one; package tenace.dev/tenace/redislock has a distributed one.
//
// Acquire returns a lease when the lock was granted; (nil, nil) when it was
// not granted within opts.Timeout (at once with NoWait); (nil, err) with
// ctx's error when ctx ended first, or with the provider's own error. An
// implementation must never leave the lock held when it returns no lease.
type LockProvider interface {
	Acquire(ctx context.Context, key string, opts LockAcquireOptions) (LockLease, error)
}

// LockAcquireOptions are the per-call options of LockProvider.Acquire.
type LockAcquireOptions struct {
	// Timeout bounds the wait: 0 waits as long as ctx allows; NoWait tries
	// once. Other negative values are invalid.
	Timeout time.Duration
	// TTL is the longest the lock is held, for providers whose locks expire
	// (distributed ones): 0 means the provider's default. Negative is
	// invalid. MemoryLockProvider's locks never expire; it ignores TTL.
	TTL time.Duration
	// Clock is the time source for Timeout; nil means the system clock.
	Clock Clock
}

// LockLease is one grant of a lock.
type LockLease interface {
	// Release releases this grant, and only this one: a second call, or a
	// call after the grant ended some other way, does nothing and returns
	// nil. ctx bounds a release that has to reach a server.
	Release(ctx context.Context) error
}

// FencedLease is a lease that carries a fencing token: a number that
// strictly increases, grant after grant, for the same key. A resource that
// remembers the highest token it has seen can refuse a write from a holder
// whose lease has been superseded (a paused process, an expired distributed
// lock). MemoryLockProvider's leases implement it.
type FencedLease interface {
	LockLease
	Token() uint64
}

func validateAcquire(key string, opts LockAcquireOptions) error {
	if key == "" {
		return ErrMissingKey
	}
	if opts.Timeout < 0 && opts.Timeout != NoWait {
		return invalidOption("LockAcquireOptions.Timeout", opts.Timeout, "use a positive duration, 0 to wait as long as ctx allows, or NoWait")
	}
	if opts.TTL < 0 {
		return invalidOption("LockAcquireOptions.TTL", opts.TTL, "use a positive duration, or 0 for the provider's default")
	}
	return nil
}

// ExpiringLease is a lease that lapses on its own at Expiry unless released
// first — a distributed lock's TTL. From that instant the lock may be
// someone else's, so work under it must stop: the Lock step runs the inner
// steps with a context that ends at Expiry, with ErrLeaseExpired as its
// cause (context.Cause). A provider whose leases can lapse implements it,
// reporting a conservative Expiry (no later than the server's); the
// MemoryLockProvider's leases never expire and do not implement it.
type ExpiringLease interface {
	LockLease
	Expiry() time.Time
}

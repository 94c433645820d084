package tenace

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync/atomic"
	"time"

	"tenace.dev/tenace/clock"
)

// NoWait as a Timeout means: try once, and do not wait if the key is held.
const NoWait time.Duration = -1

// LockProvider hands out locks on keys. MemoryLockProvider is the in-process
// one; packages tenace.dev/tenace/redislock (Redis) and
// tenace.dev/tenace/pglock (PostgreSQL) have distributed ones, and package
// tenace.dev/tenace/locktest checks any implementation against this
// contract.
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
	// Clock is the time source for Timeout; nil means the system clock. A
	// provider that times TTL in the process uses it for TTL too (pglock);
	// one whose server expires the lock (redislock) times TTL in real time,
	// as the server does, and no test clock moves it.
	Clock Clock
	// Shared asks for the key shared: with other shared holders, never
	// beside an exclusive one (the default, Shared false, takes the whole
	// key). Only a provider that implements SharedLockProvider supports it;
	// others refuse it with an error wrapping ErrInvalidOption.
	Shared bool
	// Permits is the key's permit count for shared holders: 0 lets any
	// number hold it at once (the readers of a read/write lock), N > 0 at
	// most N (a keyed bulkhead). The first shared holder of a key not held
	// shared sets it; those admitted beside it share it, whatever they
	// asked for. It needs Shared; negative is invalid.
	Permits int
	// Owner is the caller's own label for this grant (LockOptions.Owner):
	// a provider that records owners stores it beside its own owner label,
	// and Inspect shows it (see HolderInfo.Owner). "" adds none.
	Owner string
	// OnHeld, when set, is called by a provider that is about to answer
	// "not granted" ((nil, nil)) and knows who holds the key without a
	// further round trip (the engine returned it with the refusal): once,
	// before Acquire returns — never after — with the holder it saw, as
	// much of it as it knows (for a key held shared, its oldest holder;
	// for a set, the holder of the key that refused it). A Lock sets it to
	// name the holder in its *LockNotAcquiredError. A provider that does
	// not know never calls it. MemoryLockProvider reports Owner, Shared
	// and Since, on a NoWait refusal and at a Timeout, from the answer its
	// shard sends anyway.
	OnHeld func(HolderInfo)
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
// checks it on every access can refuse a holder whose lease has been
// superseded (a paused process, an expired distributed lock): a read raises
// the highest token the resource has seen and refuses a lower one, a write
// refuses a token lower than the highest seen. Checking writes alone is not
// enough: a stale holder's write can still land between the new holder's
// read and its write, and lose an update. pglock.Fence and
// redislock.FencedGet/FencedSet are such guards. MemoryLockProvider's leases
// implement FencedLease. Inside fn, TokenFrom reads the token of the lease a
// Lock holds.
type FencedLease interface {
	LockLease
	Token() uint64
}

// ValidateAcquire checks the arguments of a LockProvider.Acquire, for
// provider authors: it returns an error wrapping ErrMissingKey for an empty
// key, an error wrapping ErrInvalidOption (naming the option and what to use
// instead) for a Timeout below zero other than NoWait, a negative TTL, or
// Permits out of range or without Shared, in that order, and nil otherwise.
// Every provider in this module calls it first, and the Lock step applies
// the same rules to LockOptions, so that they all refuse the same input
// with the same errors.
func ValidateAcquire(key string, opts LockAcquireOptions) error {
	return checkAcquire("LockAcquireOptions", key, nil, opts.Timeout, opts.TTL, opts.Shared, opts.Permits)
}

// ValidateSet checks the arguments of a MultiLockProvider.AcquireSet (and
// of AcquireAll, which calls it), for provider authors: the keys as
// ValidateKeys does, then an error wrapping ErrInvalidOption for Shared or
// Permits (a set is taken exclusive), then the options as ValidateAcquire
// does; nil when all are valid.
func ValidateSet(keys []string, opts LockAcquireOptions) error {
	if keys == nil {
		keys = []string{} // a set, though an empty one
	}
	return checkAcquire("LockAcquireOptions", "", keys, opts.Timeout, opts.TTL, opts.Shared, opts.Permits)
}

// checkAcquire is the one home of the acquire rules: ValidateAcquire's and
// ValidateSet's, and the Lock step's, whose options what names. keys not
// nil is a set, and key is then unused. The order is the precedence: what
// is locked (the key or the keys, a set not shared), then how.
func checkAcquire(what, key string, keys []string, timeout, ttl time.Duration, shared bool, permits int) error {
	if keys != nil {
		if err := ValidateKeys(keys); err != nil {
			return err
		}
		const exclusive = "a set of keys is taken exclusive; take shared keys one Lock each, in one order"
		if shared {
			return invalidOption(what+".Shared", true, exclusive)
		}
		if permits != 0 {
			return invalidOption(what+".Permits", permits, exclusive)
		}
	} else if key == "" {
		return ErrMissingKey
	}
	if timeout < 0 && timeout != NoWait {
		return invalidOption(what+".Timeout", timeout, "use a positive duration, 0 to wait as long as the context allows, or NoWait")
	}
	if ttl < 0 {
		return invalidOption(what+".TTL", ttl, "use a positive duration, or 0 for the provider's default")
	}
	return validatePermits(what, shared, permits)
}

// maxPermits is the largest permit count: the in-process table keeps it
// in 32 bits.
const maxPermits = math.MaxInt32

// validatePermits checks a Shared and Permits pair of the options named
// by what.
func validatePermits(what string, shared bool, permits int) error {
	switch {
	case permits < 0 || permits > maxPermits:
		return invalidOption(what+".Permits", permits, "use 0 for any number of shared holders (read/write), or N > 0 for at most N")
	case permits > 0 && !shared:
		return invalidOption(what+".Permits", permits, "permits count shared holders: set Shared too")
	}
	return nil
}

// SharedLockProvider is a LockProvider that supports LockAcquireOptions's
// Shared and Permits: read/write locks and N permits per key. A provider
// (or a wrapper around one) that does not implement it, or whose
// SupportsShared reports false, is refused them by the Lock step, with an
// error wrapping ErrInvalidOption that names it, never silently taken
// exclusive.
type SharedLockProvider interface {
	LockProvider
	// SupportsShared reports whether Acquire honours Shared and Permits.
	SupportsShared() bool
}

// refuseShared is the Lock step's check that provider supports a shared
// acquire.
func refuseShared(provider LockProvider) error {
	if sp, ok := provider.(SharedLockProvider); ok && sp.SupportsShared() {
		return nil
	}
	return fmt.Errorf("%w: LockOptions.Shared: %T is not a SharedLockProvider; take the key exclusive", ErrInvalidOption, provider)
}

// validateAcquire is ValidateAcquire. MemoryLockProvider.Acquire repeats
// its comparisons inline (and calls it only when one fails): keep the two
// together.
func validateAcquire(key string, opts LockAcquireOptions) error { return ValidateAcquire(key, opts) }

// AcquireContext returns a context for the whole of one Acquire, for
// provider authors: it ends when ctx ends or when opts.Timeout has passed on
// opts.Clock (nil: the system clock), whichever comes first. When the
// timeout ended it, context.Cause(actx) is ErrAcquireContextTimeout while ctx itself
// has not ended: the provider then returns (nil, nil), "not granted in
// time" — unless its server was never asked or never answered (a full
// connection pool, a stalled server: redislock and pglock return an error
// then, so that an outage is not reported as contention). Bounding every
// server call of the acquire with actx makes the
// Timeout bound the whole wait, server calls included. With a Timeout of 0
// or NoWait, actx only follows ctx. The caller must call cancel once the
// acquire is over, to release the timer.
//
// With the system clock actx has a real deadline (Deadline reports it), so
// clients that set socket deadlines from the context honour it; with another
// clock the deadline is the clock's, reported by Deadline but known only to
// code that uses the clock.
func AcquireContext(ctx context.Context, opts LockAcquireOptions) (actx context.Context, cancel context.CancelFunc) {
	if opts.Timeout <= 0 {
		return context.WithCancel(ctx)
	}
	return clock.WithTimeoutCause(ctx, opts.Clock, opts.Timeout, ErrAcquireContextTimeout)
}

// TimedOut reports whether actx, from AcquireContext(ctx, ...), ended
// because its Timeout passed while ctx itself still runs: the case in which
// a provider reports "not granted in time" with (nil, nil), when its server
// answered that the key is held (see AcquireContext).
func TimedOut(ctx, actx context.Context) bool {
	return ctx.Err() == nil && context.Cause(actx) == ErrAcquireContextTimeout
}

// LosableLease is a lease that can be lost before it is released: a
// distributed lock whose renewal failed or found another holder, whose
// connection dropped, whose session ended, or that reached its TTL — the
// longest time it may be held. From the moment it is lost the lock may be
// someone else's, so work under it must stop and not commit.
//
// The Lock step watches it: the moment Lost is closed it ends the inner
// steps' context with Err as the cause (context.Cause), and emits
// EventLockLost. Direct users of a provider select on Lost themselves:
//
//	select {
//	case <-lease.Lost():
//		return lease.Err() // errors.Is(err, tenace.ErrLeaseLost)
//	case r := <-results:
//		...
//	}
//
// A provider reports a loss no later than the last expiry it told its server
// (measured from before the request was sent), so that the holder learns of
// it before anyone else can be granted the lock — clocks drifting apart
// aside. MemoryLockProvider's leases are never lost and do not implement it.
// Embed LeaseSignal to implement the two methods.
type LosableLease interface {
	LockLease
	// Lost returns a channel that is closed when the lease is lost. Release
	// does not close it; after Release it may never be closed. Every call
	// returns the same channel.
	Lost() <-chan struct{}
	// Err is nil while the lease has not been lost; once it has, an error
	// wrapping ErrLeaseLost that says why (ErrLeaseExpired when its TTL was
	// reached).
	Err() error
}

// LeaseSignal is the lost-lease half of a LosableLease, for provider
// authors to embed in their lease type. The zero value is a lease not lost;
// Lose marks it lost. It is safe for concurrent use, and holds no lock: the
// channel is made on first use by compare-and-swap.
type LeaseSignal struct {
	ch  atomic.Pointer[chan struct{}]
	err atomic.Pointer[error]
}

// Lost returns the channel closed by the first Lose.
func (s *LeaseSignal) Lost() <-chan struct{} { return s.channel() }

func (s *LeaseSignal) channel() chan struct{} {
	if c := s.ch.Load(); c != nil {
		return *c
	}
	c := make(chan struct{})
	if s.ch.CompareAndSwap(nil, &c) {
		return c
	}
	return *s.ch.Load()
}

// Err is nil until Lose is called, then the error Lose recorded.
func (s *LeaseSignal) Err() error {
	if e := s.err.Load(); e != nil {
		return *e
	}
	return nil
}

// Lose marks the lease lost because of err, and closes Lost. Only the first
// call counts; it reports whether this call was it. An err that does not
// wrap ErrLeaseLost is wrapped in one that does; a nil err means
// ErrLeaseLost.
func (s *LeaseSignal) Lose(err error) bool {
	switch {
	case err == nil:
		err = ErrLeaseLost
	case !errors.Is(err, ErrLeaseLost):
		err = fmt.Errorf("%w: %w", ErrLeaseLost, err)
	}
	if !s.err.CompareAndSwap(nil, &err) {
		return false
	}
	close(s.channel())
	return true
}

// LockStats is what a provider knows of its locks. Each count is read on
// its own, with no lock held across them: while locks change hands they
// may come from slightly different moments (a LongestQueue above Waiting,
// say); when nothing changes, they agree.
//
// The Shared... fields count by mode (see LockAcquireOptions.Shared): they
// are parts of Held and Waiting, so that Held − SharedKeys keys are held
// exclusive and Waiting − SharedWaiting callers wait to take a key
// exclusive. A provider that does not count by mode leaves them 0.
// MemoryLockProvider counts them exactly, and keeps SharedKeys ≤ Held and
// SharedWaiting ≤ Waiting at every moment. The distributed providers of
// this module, whose Held counts the leases held through the provider
// value, count a shared lease once in SharedKeys and once in
// SharedHolders (one key held shared, one permit in use, from this
// process), and a shared caller waiting in this process in SharedWaiting.
type LockStats struct {
	// Held is the number of keys held: for a distributed provider, the
	// leases held through this provider value.
	Held int
	// Waiting is the number of callers waiting for a key: for a distributed
	// provider, those waiting in this process.
	Waiting int
	// LongestQueue is the most callers waiting for one key, or 0 when the
	// provider does not know.
	LongestQueue int
	// SharedKeys is the number of keys held shared, by readers of a
	// read/write lock or the callers of a keyed bulkhead (Held counts
	// them too).
	SharedKeys int
	// SharedHolders is the number of shared leases held, over all keys:
	// the permits in use. A key held shared has at least one.
	SharedHolders int
	// SharedWaiting is the number of callers waiting for a shared lease
	// (Waiting counts them too).
	SharedWaiting int
}

// StatsProvider is the optional interface of a provider that reports
// LockStats. Stats is cheap (a few atomic loads), safe for concurrent use,
// and never waits for the lock manager, so a gauge or a health endpoint can
// call it freely.
type StatsProvider interface {
	Stats() LockStats
}

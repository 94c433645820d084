// Package provkit holds what the distributed providers (redislock, pglock,
// etcdlock) do alike: the checks of their option constructors, the timer
// that ends a hold at its TTL, the end of every held lease at Close, and
// the wait for a context whose deadline has passed to report its end.
package provkit

import (
	"context"
	"sync"
	"time"

	"tenace.dev/tenace/clock"
)

// Duration returns the body of an option constructor that sets a duration
// to d: set, bound to d. It panics with "tenace: " and msg if d is under
// least (time.Nanosecond: d must be positive). msg names the constructor
// and the rule ("redislock.WithTTL: the TTL must be at least 1ms").
func Duration[P any](d, least time.Duration, msg string, set func(P, time.Duration)) func(P) {
	if d < least {
		panic("tenace: " + msg)
	}
	return func(p P) { set(p, d) }
}

// CapHold arms the timer that ends a hold at its TTL: ttl, or def when ttl
// is 0; none when that is not positive (nil is returned). The timer runs
// on clk, or on the system clock when clk is nil, and calls expired with
// the TTL it kept. It returns the timer's stop, for the lease to store
// where its end finds it: an end that comes before the store finds no
// timer to stop, and the timer then finds the lease ended, so expired must
// do nothing on an ended lease.
func CapHold(clk clock.Clock, ttl, def time.Duration, expired func(ttl time.Duration)) *func() bool {
	if ttl == 0 {
		ttl = def
	}
	if ttl <= 0 {
		return nil
	}
	f := func() { expired(ttl) }
	var stop func() bool
	if clk == nil {
		stop = time.AfterFunc(ttl, f).Stop
	} else {
		stop = clk.AfterFunc(ttl, f)
	}
	return &stop
}

// EndHeld closes a provider's books and ends the leases they hold: under
// mu, it sets *closed, runs atClose (if not nil) and takes the leases in
// held; then, with mu released, it calls end on each, in turn. It reports
// false, and does nothing, if *closed was set already.
func EndHeld[L comparable](mu *sync.Mutex, closed *bool, held map[L]struct{}, atClose func(), end func(L)) bool {
	mu.Lock()
	if *closed {
		mu.Unlock()
		return false
	}
	*closed = true
	if atClose != nil {
		atClose()
	}
	leases := make([]L, 0, len(held))
	for l := range held {
		leases = append(leases, l)
	}
	mu.Unlock()
	for _, l := range leases {
		end(l)
	}
	return true
}

// AwaitDeadline waits for ctx, whose deadline has passed, to report its
// end; it returns at once if ctx has no deadline, has not reached it, or
// has ended. A call cut short by a deadline (its own, or the server's) can
// fail before the timer that ends ctx at its deadline has run, on a loaded
// machine: the caller must see the Timeout's end, not a bare
// DeadlineExceeded. The wait ends the moment that timer runs; OutcomeWait
// bounds it.
func AwaitDeadline(ctx context.Context) {
	if d, ok := ctx.Deadline(); !ok || time.Now().Before(d) || ctx.Err() != nil {
		return
	}
	t := time.NewTimer(OutcomeWait)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// OutcomeWait bounds AwaitDeadline: only against a context that never
// reports its deadline. The timer that ends a context fires within
// microseconds, or as soon as the scheduler runs it on a loaded machine
// (under -race beside other work, later than 20ms).
const OutcomeWait = time.Second

// CleanupTimeout bounds a call a provider makes on a context that is not
// the caller's, to clean up: the revoke or unlock of a lease lost, expired
// at its TTL or held at Close, of a waiter that gave up, and a Release
// whose ctx has no deadline.
const CleanupTimeout = 5 * time.Second

// HeldKey is the context key under which the context a tenace Lock step
// gives its inner steps answers with a Holder: what the execution holds
// through the Lock steps around it.
type HeldKey struct{}

// Holder is what the context of a Lock step's inner steps knows of the
// locks its execution holds.
type Holder interface {
	// HeldLeases returns the leases that the Lock steps enclosing the
	// context hold from provider (the same provider value), innermost
	// first. A Lock that has begun to release holds nothing.
	HeldLeases(provider any) []any
}

// HeldLeases returns the leases the execution of ctx holds from provider
// through enclosing Lock steps, innermost first; nil outside any. A
// provider whose waits can share a session with what the execution holds
// (pglock) reads it in Acquire.
func HeldLeases(ctx context.Context, provider any) []any {
	if h, ok := ctx.Value(HeldKey{}).(Holder); ok {
		return h.HeldLeases(provider)
	}
	return nil
}

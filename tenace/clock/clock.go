// Package clock is the time source of tenace: the [Clock] interface that a
// policy, its steps and the lock providers read time from, the [System]
// clock, and [WithTimeoutCause], a context that ends on a Clock.
//
// It has no dependency beyond the standard library, so that a lock provider
// can take a Clock (tenace.LockAcquireOptions.Clock) and ask whether it is
// the system one without importing the pipeline engine (package policy).
// Packages tenace and policy re-export Clock as an alias: tenace.Clock,
// policy.Clock and clock.Clock are one type.
package clock

import (
	"context"
	"time"
)

// Clock is the time source of a pipeline, its steps and the lock providers,
// so that tests can drive time. [System] is the real one; under
// testing/synctest it is the bubble's fake time, which is often all a test
// needs.
type Clock interface {
	// Now returns the current time.
	Now() time.Time
	// AfterFunc calls f once d has passed, unless stop is called first;
	// stop reports whether it prevented the call (the contract of
	// time.Timer.Stop). The system clock calls f in its own goroutine; a
	// test clock may call it on the goroutine that moves its time (as
	// tenace's internal fake clock does), so f should not block.
	AfterFunc(d time.Duration, f func()) (stop func() bool)
}

type system struct{}

func (system) Now() time.Time { return time.Now() }
func (system) AfterFunc(d time.Duration, f func()) func() bool {
	return time.AfterFunc(d, f).Stop
}

// System returns the clock of package time. It is a value of size zero:
// calling System costs nothing, and every result is equal to every other.
func System() Clock { return system{} }

// IsSystem reports whether c is nil or [System](): then callers can use the
// time package and the context package's deadlines directly, which costs
// less than going through the interface, and which clients that set socket
// deadlines from a context honour. A Clock that wraps the system one (to
// count its reads, say) is not the system clock.
func IsSystem(c Clock) bool {
	_, ok := c.(system)
	return c == nil || ok
}

// WithTimeoutCause is context.WithTimeoutCause on clock: the returned
// context ends when ctx does or once d has passed on clock, with cause as
// its cause (context.Cause) in the second case. On the system clock (and a
// nil one) it is context.WithTimeoutCause itself. On another clock the
// context reports the clock's deadline from Deadline and
// context.DeadlineExceeded from Err once the clock fires; contexts derived
// from it report context.Canceled. That deadline is an instant on the
// clock: code that compares it with the real time mixes the two. As with
// context.WithTimeoutCause, a nil cause means context.DeadlineExceeded, and
// a d that is not positive has passed already. Always call cancel: it stops
// the clock's timer.
func WithTimeoutCause(ctx context.Context, clock Clock, d time.Duration, cause error) (context.Context, context.CancelFunc) {
	if IsSystem(clock) {
		return context.WithTimeoutCause(ctx, d, cause)
	}
	if cause == nil {
		// Err compares the cause with it: nil would match a context
		// that has not ended.
		cause = context.DeadlineExceeded
	}
	inner, cancel := context.WithCancelCause(ctx)
	if d <= 0 {
		cancel(cause)
		return &deadlineCtx{Context: inner, deadline: clock.Now().Add(d), cause: cause}, func() { cancel(context.Canceled) }
	}
	stop := clock.AfterFunc(d, func() { cancel(cause) })
	return &deadlineCtx{Context: inner, deadline: clock.Now().Add(d), cause: cause}, func() {
		stop()
		cancel(context.Canceled)
	}
}

// deadlineCtx is a cancel context ended by a Clock's timer; it reports the
// clock's deadline, and DeadlineExceeded once the timer fired.
type deadlineCtx struct {
	context.Context
	deadline time.Time
	cause    error
}

func (c *deadlineCtx) Deadline() (time.Time, bool) { return c.deadline, true }

func (c *deadlineCtx) Err() error {
	if context.Cause(c.Context) == c.cause {
		return context.DeadlineExceeded
	}
	return c.Context.Err()
}

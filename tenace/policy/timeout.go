package policy

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"tenace.dev/tenace/clock"
	"tenace.dev/tenace/internal/keyfmt"
)

// EventTimeout is the event a [Timeout] emits when its deadline fires. Its
// Err is the [*TimeoutError] the step returns; Context is the step's parent
// context.
const EventTimeout = "timeout"

// TimeoutError is returned by a [Timeout] step whose own deadline passed
// before the inner steps returned. errors.Is(err, context.DeadlineExceeded)
// holds, and so does errors.Is(err, x) for whatever the inner steps returned.
type TimeoutError struct {
	// Timeout is the step's duration.
	Timeout time.Duration
	// Key is the execution key, possibly empty. The message quotes it cut
	// after 256 bytes; Key is whole.
	Key string
	// Err is what the inner steps returned once they stopped (often ctx's
	// error), or nil if they finished anyway.
	Err error
	// BeforeFn reports that the inner steps returned without calling fn:
	// the deadline passed while a step inside the Timeout still held fn
	// back — typically the wait of a lock added before WithTimeout, which
	// then bounds the wait and the work together — and the work never ran.
	BeforeFn bool
}

// Error gives the duration and the key, and what to do about it.
func (e *TimeoutError) Error() string {
	key := ""
	if e.Key != "" {
		key = " (key " + keyfmt.Quote(e.Key) + ")"
	}
	if e.BeforeFn {
		return fmt.Sprintf("tenace: the work did not start within its %v timeout%s; add WithTimeout before the step that waited (a lock), or raise its duration", e.Timeout, key)
	}
	return fmt.Sprintf("tenace: the work did not finish within its %v timeout%s; raise WithTimeout's duration or make the work faster", e.Timeout, key)
}

// Unwrap returns context.DeadlineExceeded and, if set, Err.
func (e *TimeoutError) Unwrap() []error {
	if e.Err == nil {
		return []error{context.DeadlineExceeded}
	}
	return []error{context.DeadlineExceeded, e.Err}
}

// Timeout is the step that bounds the inner steps' time: they run with a
// context whose deadline is d from the start of the step.
//
// Go is cooperative, so the step cannot stop the work: when the deadline
// passes it ends the inner context, with a cause (context.Cause) that names
// the step and wraps context.DeadlineExceeded, and waits for the inner steps
// to return. It never returns before them, so a lock outside it is never
// released while fn still runs. Then:
//   - its own deadline fired first: it emits [EventTimeout] and returns a
//     [*TimeoutError];
//   - the parent context ended first (its cancel, or an earlier deadline of
//     its own): it returns the inner steps' error unchanged, not a
//     TimeoutError, because the timeout is not what stopped them.
//
// With a clock other than the system clock, the inner context reports the
// clock's deadline from Deadline and context.DeadlineExceeded from Err once
// the clock fires; contexts derived from it report context.Canceled, the
// context of a Timeout nested inside it included (whose Deadline is its own,
// even when this one's is earlier). That deadline is an instant on the
// clock, and code that compares it with the real time mixes the two: with a
// test clock behind the real time it has passed already, so a
// context.WithTimeout inside fn starts no timer of its own, and a client
// that sets a socket deadline from it times out at once. Under
// testing/synctest the system clock is fake, with none of this.
type Timeout struct {
	d time.Duration
}

// NewTimeout returns a Timeout step of duration d. A d that is not positive
// is reported by Run as an error wrapping [ErrInvalidOption].
func NewTimeout(d time.Duration) *Timeout { return &Timeout{d: d} }

// ownDeadline is the cause a Timeout gives its context, so that it can
// tell its own deadline from the parent's end. Each run makes its own, and
// compares by identity: a context inherits its parent's cause, so with one
// shared value an inner Timeout would take an outer one's deadline for its
// own. It wraps context.DeadlineExceeded, the cause a context.WithTimeout
// has, so that fn's checks of context.Cause(ctx) see a deadline.
//
// It also records whether fn was called (for TimeoutError.BeforeFn): an
// atomic, since a step inside may run fn on a goroutine of its own.
type ownDeadline struct {
	d     time.Duration
	ranFn atomic.Bool
}

func (e *ownDeadline) Error() string {
	return fmt.Sprintf("tenace: the WithTimeout(%v) deadline passed", e.d)
}

func (e *ownDeadline) Unwrap() error { return context.DeadlineExceeded }

// Run implements [Strategy].
func (t *Timeout) Run(ctx context.Context, x Execution, next Next) error {
	if t.d <= 0 {
		return fmt.Errorf("%w: WithTimeout(%v): the duration must be positive", ErrInvalidOption, t.d)
	}
	own := &ownDeadline{d: t.d}
	inner, cancel := clock.WithTimeoutCause(ctx, x.Clock(), t.d, own)
	defer cancel() // also when the inner steps panic: the timer goes
	fn := next.fn
	next.fn = func(ctx context.Context) error {
		own.ranFn.Store(true)
		return fn(ctx)
	}
	err := next.Run(inner)
	cancel() // from here the cause can no longer change
	if context.Cause(inner) != error(own) {
		return err
	}
	terr := &TimeoutError{Timeout: t.d, Key: x.Key(), Err: err, BeforeFn: !own.ranFn.Load()}
	if x.HasListeners() {
		x.Emit(Event{Name: EventTimeout, Key: x.Key(), Context: ctx, Err: terr})
	}
	return terr
}

// WithTimeoutCause is [clock.WithTimeoutCause]: a context that ends when
// ctx does or once d has passed on c, with cause as its cause.
//
// Deprecated: use clock.WithTimeoutCause, from tenace.dev/tenace/clock.
func WithTimeoutCause(ctx context.Context, c Clock, d time.Duration, cause error) (context.Context, context.CancelFunc) {
	return clock.WithTimeoutCause(ctx, c, d, cause)
}

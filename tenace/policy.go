package tenace

import (
	"context"
	"time"

	"tenace.dev/tenace/clock"
	"tenace.dev/tenace/policy"
)

// Event is something a step reports while a call runs; see OnEvent and the
// Event... names.
type Event = policy.Event

// Clock is the time source of a policy, its steps and the lock providers;
// see Policy.WithClock. It is clock.Clock (package
// tenace.dev/tenace/clock, which also has the system clock, clock.System),
// and policy.Clock.
type Clock = clock.Clock

// TimeoutError is returned, as *TimeoutError, by a WithTimeout step whose
// deadline passed before the work returned.
type TimeoutError = policy.TimeoutError

// Strategy is a step of a policy; see package policy to write one.
type Strategy = policy.Strategy

// The names of the events the built-in steps emit. Every event has Name,
// Key and Context; the other Event fields are set as each name says. Every
// event of a Lock step whose LockOptions.Shared is set has Shared, and
// Permits its LockOptions.Permits, so that a listener can count readers'
// or a bulkhead's waits and holds apart from writers'.
//
// A Lock emits EventLockAcquiring once it starts to wait, then exactly one
// of EventLockAcquired, EventLockRejected, EventLockDeadlock,
// EventLockCancelled or EventLockFailed, which end the wait and carry its
// length (Wait); after EventLockAcquired come EventLockLost (possibly) and
// EventLockReleased. So a listener can count the callers waiting now (+1 on
// acquiring, −1 on the five that end a wait) and time waits and holds
// without clocks of its own.
// A call the Lock refuses before it waits (no key, one of its options out
// of range, ctx already ended) emits nothing.
const (
	// EventLockAcquiring: the Lock asks its provider for the lock and may
	// wait. Key is the lock key.
	EventLockAcquiring = "lock.acquiring"
	// EventLockAcquired: the lock was acquired; the inner steps run next.
	// Wait: how long the acquire waited; Token: the fencing token, if any.
	EventLockAcquired = "lock.acquired"
	// EventLockRejected: the lock was not acquired within its Timeout (or at
	// once with NoWait). Wait; Err: the *LockNotAcquiredError returned,
	// which names the key's holder when the provider said who it was.
	EventLockRejected = "lock.rejected"
	// EventLockDeadlock: waiting would never end, so the Lock did not wait:
	// its execution already holds the key, or its wait closed a cycle of
	// waits between executions (see DeadlockError). A programming error,
	// not contention. Wait; Err: the *DeadlockError returned.
	EventLockDeadlock = "lock.deadlock"
	// EventLockCancelled: the context ended while the call waited (also when
	// the grant landed at that moment and was given back). Wait; Err: the
	// context's error, which the call returns.
	EventLockCancelled = "lock.cancelled"
	// EventLockFailed: the provider failed (a server unreachable, the
	// provider closed). Wait; Err: the provider's error, which the call
	// returns wrapped in an *UnexpectedError. Also emitted, with an Err
	// that says so, when a listener of EventLockAcquiring or the
	// provider's Acquire panics: the panic then goes on up.
	EventLockFailed = "lock.failed"
	// EventLockReleased: the inner steps returned and the lock was released.
	// Hold: how long it was held; Token; Err: what Release returned (nil when
	// it succeeded; the Lock ignores it otherwise).
	EventLockReleased = "lock.released"
	// EventLockLost: the lease was lost while the inner steps ran (see
	// LosableLease); their context has ended with the lease's error as its
	// cause. Hold: how long it was held until the loss; Token; Err: the
	// lease's error (errors.Is ErrLeaseLost). It is emitted from another
	// goroutine, the moment the Lock learns of the loss, while fn may still
	// run, and always before EventLockReleased.
	EventLockLost = "lock.lost"
	// EventTimeout: a WithTimeout deadline passed before the work returned.
	// Key is the execution key, possibly empty; Err: the *TimeoutError
	// returned.
	EventTimeout = policy.EventTimeout
)

// Policy is a pipeline of resilience steps that runs a function. It is an
// immutable value: each With... method returns a new Policy and never
// changes the one it was called on, so a policy can be built once, shared
// between goroutines, and extended in several directions safely. The zero
// Policy is valid and runs fn with no steps.
//
// A step wraps the steps added before it. In
//
//	tenace.NewPolicy().WithTimeout(time.Minute).With(lock)
//
// the lock is the outer step: it is acquired first, and held around the
// one-minute timeout, which bounds the work but not the wait for the lock
// (the lock's own Timeout bounds that). Written the other way round,
// NewPolicy().With(lock).WithTimeout(time.Minute), the minute bounds the
// wait and the work together.
type Policy struct {
	p policy.Pipeline
}

// NewPolicy returns an empty policy.
func NewPolicy() Policy { return Policy{} }

// WithTimeout adds a step that gives the steps before it, and fn, d to
// finish: they run with a context whose deadline is d away, and the call
// returns a *TimeoutError (errors.Is context.DeadlineExceeded) when it
// passes. The step waits for fn to return: a lock outside it is never
// released while fn runs, so fn should watch its context. A d that is not
// positive makes Execute return an error wrapping ErrInvalidOption once the
// call reaches the step: fn does not run, but steps outside it have.
func (p Policy) WithTimeout(d time.Duration) Policy { return p.With(policy.NewTimeout(d)) }

// WithLock adds a Lock step with opts; see Lock.
func (p Policy) WithLock(opts LockOptions) Policy { return p.With(NewLock(opts)) }

// With adds the step s, wrapping the steps added before it. It panics if s
// is nil, a nil *Lock or *policy.Timeout included. (A nil pointer of a
// step type of your own is accepted: its methods may work on a nil
// receiver.)
func (p Policy) With(s Strategy) Policy {
	if s == Strategy((*Lock)(nil)) { // nil and a nil *policy.Timeout: the pipeline's With
		panic("tenace: Policy.With: nil strategy")
	}
	return Policy{p: p.p.With(s)}
}

// OnEvent adds a listener. Listeners are policy-wide, not positional: each
// sees every event of every step of the policy, synchronously, in the order
// the listeners were added. A listener that panics: the listeners after it
// still see the event (so that those pairing events stay balanced), then
// the panic goes on up through Execute, and a lock held at that point is
// still released. It panics if fn is nil.
//
// Listeners run on the caller's goroutine, inside the call (EventLockLost
// excepted: it comes from a watching goroutine), and one policy runs many
// calls at once: a listener must be safe for concurrent use and quick.
// LogEvents is a ready-made one; tenace.dev/tenace/oteltenace records
// OpenTelemetry metrics and spans. A policy without listeners reads no clock
// for events and builds none.
func (p Policy) OnEvent(fn func(Event)) Policy {
	if fn == nil {
		panic("tenace: Policy.OnEvent: nil listener")
	}
	return Policy{p: p.p.OnEvent(fn)}
}

// WithClock sets the policy's time source, used by WithTimeout and passed
// to lock providers for their Timeout; nil means the system clock. Tests
// use it to drive time; under testing/synctest the system clock is already
// fake. A WithTimeout on another clock gives fn a deadline on that clock,
// which code that reads the real time misreads: see policy.Timeout.
func (p Policy) WithClock(c Clock) Policy { return Policy{p: p.p.WithClock(c)} }

// ExecuteOption is a per-call option of Execute and Get. It is a small
// value, not an interface, so that passing one costs no allocation.
type ExecuteOption struct {
	key    string
	hasKey bool
}

// WithKey sets the execution key: the lock key of every Lock in the policy
// whose LockOptions.Key is empty, and the Key of the timeout event.
func WithKey(key string) ExecuteOption { return ExecuteOption{key: key, hasKey: true} }

// Execute runs fn through the policy's steps and returns fn's error, or the
// error of the step that stopped the call:
//
//	fn returned err                      err, unchanged
//	ctx already ended on entry           ctx's error; nothing runs
//	a Lock without any key               ErrMissingKey; fn does not run
//	an option out of range               an error wrapping ErrInvalidOption
//	lock not acquired within Timeout     *LockNotAcquiredError; event lock.rejected
//	ctx ended while waiting for a lock   ctx's error; fn does not run
//	the lock provider failed             *UnexpectedError wrapping the cause
//	WithTimeout's deadline passed        *TimeoutError (errors.Is DeadlineExceeded)
//
// It panics if ctx or fn is nil.
func (p Policy) Execute(ctx context.Context, fn func(context.Context) error, opts ...ExecuteOption) error {
	var key string
	for _, o := range opts {
		if o.hasKey {
			key = o.key
		}
	}
	return p.p.Execute(ctx, key, fn)
}

// Get is Execute for a function that returns a value: it returns fn's value
// and error, or the zero T and the error of whatever stopped the call. It
// panics if fn is nil.
func Get[T any](ctx context.Context, p Policy, fn func(context.Context) (T, error), opts ...ExecuteOption) (T, error) {
	if fn == nil {
		panic("tenace: Get: nil fn")
	}
	var v T
	err := p.Execute(ctx, func(ctx context.Context) error {
		var err error
		v, err = fn(ctx)
		return err
	}, opts...)
	if err != nil {
		var zero T
		return zero, err
	}
	return v, nil
}

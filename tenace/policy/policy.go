// Package policy is the pipeline engine under tenace: the [Strategy] a step
// implements, the per-call [Execution] every step sees, the [Pipeline] that
// runs them in order, and the [Timeout] step.
//
// Most programs use package tenace, which re-exports what users touch; this
// package is for writing a strategy of your own.
//
// # How a pipeline runs
//
// A pipeline is an immutable list of steps. A step wraps the steps added
// before it: the first step added is the innermost, closest to fn, and the
// last is the outermost, the first to run.
//
//	NewPipeline().With(a).With(b).Execute(ctx, key, fn)
//
//	b.Run(ctx, x, next)          // next runs a
//	└── a.Run(ctx', x, next)     // next runs fn
//	    └── fn(ctx'')
//
// Each step gets the context to pass inward (it may derive a new one), the
// call's [Execution] (key, clock, events) and a [Next] that runs the inner
// steps and finally fn. A step calls next.Run at most once, and must not
// return before the call it made returns: steps such as a lock depend on the
// inner steps being finished when they clean up.
//
// # Writing a strategy
//
//	type logStep struct{ log *slog.Logger }
//
//	func (s logStep) Run(ctx context.Context, x policy.Execution, next policy.Next) error {
//		s.log.Info("start", "key", x.Key())
//		err := next.Run(ctx)
//		s.log.Info("end", "key", x.Key(), "err", err)
//		return err
//	}
//
// Add it with tenace's Policy.With. A strategy must be safe for concurrent
// use: one policy value runs many calls at once.
//
// A step that reports events builds them only for listeners, so that a
// policy without any pays nothing — no clock read, no allocation:
//
//	if x.HasListeners() {
//		x.Emit(policy.Event{Name: "cache.miss", Key: x.Key(), Context: ctx})
//	}
package policy

import (
	"context"
	"errors"
	"time"

	"tenace.dev/tenace/clock"
)

// ErrInvalidOption is wrapped by the errors that report an option out of its
// range (a negative timeout, say); the message names the option.
var ErrInvalidOption = errors.New("tenace: invalid option")

// Event is something a step reports while a call runs. Name and Key are
// always set; the other fields are set by the events that have them and are
// zero otherwise (tenace's Event... constants say which carries what).
//
// An Event is built only when the pipeline has listeners
// ([Execution.HasListeners]): a policy without listeners reads no clock and
// allocates nothing for its events.
type Event struct {
	// Name is one of the event names (tenace's Event... constants, or a
	// third-party step's own).
	Name string
	// Key is the key the event concerns: the lock key for lock events, the
	// execution key (possibly empty) for the others.
	Key string
	// Shared reports that the lock was asked for shared (tenace's
	// LockOptions.Shared: a reader of a read/write lock, a caller of a
	// keyed bulkhead): set on every event of such a Lock step, false on an
	// exclusive one's and on the other steps' events.
	Shared bool
	// Permits is the permit count the shared Lock step asked for
	// (LockOptions.Permits: 0 for any number of shared holders, N for at
	// most N), on the events that have Shared; 0 otherwise. The key's own
	// count is its first shared holder's (see LockOptions.Permits).
	Permits int
	// Context is the call's context as the emitting step received it — for
	// the Lock step, the context the lock was asked for with, also for events
	// emitted after it ended — so that a listener can find what the caller
	// put there: the current trace span, a request id for a log line. It is
	// nil only for events a third-party step emits without one. A listener
	// must not keep it after it returns.
	Context context.Context
	// Wait is how long the acquire waited, on the execution's clock: set by
	// the events that end a wait (lock.acquired, lock.rejected,
	// lock.deadlock, lock.cancelled, lock.failed).
	Wait time.Duration
	// Hold is how long the lock was held, from its grant, on the execution's
	// clock: set by lock.released (up to the moment the release returned)
	// and lock.lost (up to the moment the loss was learned).
	Hold time.Duration
	// Token is the lease's fencing token when the lease is a tenace
	// FencedLease (lock.acquired, lock.released, lock.lost), 0 otherwise;
	// the providers in this repository start their tokens at 1.
	Token uint64
	// Err is the error the event is about: the error the step returns
	// (lock.rejected, lock.deadlock, lock.cancelled, timeout), the
	// provider's error (lock.failed), why the lease was lost (lock.lost), or
	// what Release returned (lock.released; nil when it succeeded).
	Err error
}

// Strategy is one step of a pipeline.
//
// Run does the step's work around next.Run(ctx), which runs the inner steps
// and fn, and returns the call's error. A step that decides the call must
// not go on (a lock not acquired, say) returns its error without calling
// next.Run. Run must not return before a next.Run it called has returned.
type Strategy interface {
	Run(ctx context.Context, x Execution, next Next) error
}

// Execution is what every step of one call sees: the execution key, the
// clock and the event emitter. It is a small value, passed by value, the same
// for every step of the call; the context travels beside it, as the first
// argument of Run, so that each step can give the inner steps a derived one.
type Execution struct {
	key string
	env *env // the pipeline's clock and listeners; nil: the system clock, none
}

// env is what a Pipeline gives every call: built when the pipeline is, and
// never changed after (a builder method makes a new one), so an Execution
// carries it as one pointer — every step's Run receives the Execution and a
// Next by value, and three words copy faster than seven.
type env struct {
	clock     Clock
	listeners []func(Event)
}

// Key is the execution key (from tenace's WithKey), possibly empty.
func (x Execution) Key() string { return x.key }

// Clock is the call's time source; never nil.
func (x Execution) Clock() Clock {
	if x.env == nil || x.env.clock == nil {
		return clock.System()
	}
	return x.env.clock
}

// HasListeners reports whether the pipeline has listeners. A step checks it
// before it reads the clock or builds an [Event] only a listener would see,
// so that a pipeline without listeners pays nothing for its events.
func (x Execution) HasListeners() bool { return x.env != nil && len(x.env.listeners) > 0 }

// Emit reports e to the pipeline's listeners, synchronously, in the order
// they were added. A listener that panics does not keep e from the
// listeners after it: they all see it, so that listeners pairing events (a
// gauge of waiters, a span) stay balanced whatever another one does; then
// the panic goes on up through the step that emitted (if several panic, the
// last, as with any panic raised while another unwinds; a crash prints them
// all). Steps that hold resources release them in a defer.
func (x Execution) Emit(e Event) {
	if x.env == nil {
		return
	}
	emit(x.env.listeners, e)
}

// emit calls each of ls with e. The panic of one is not recovered — its
// stack stays whole for the crash or the caller's recover — but the
// deferred call passes e on to the listeners after it first.
func emit(ls []func(Event), e Event) {
	i := 0
	defer func() {
		if i < len(ls) { // ls[i] panicked, or ended its goroutine
			emit(ls[i+1:], e)
		}
	}()
	for ; i < len(ls); i++ {
		ls[i](e)
	}
}

// Next runs the rest of the pipeline: the steps inside the current one, then
// fn. The zero Next is not valid; steps receive theirs from the pipeline.
type Next struct {
	steps []Strategy // steps still to run, innermost first: the last runs next
	fn    func(context.Context) error
	x     Execution
}

// Run runs the inner steps and fn with ctx, and returns their error.
func (n Next) Run(ctx context.Context) error {
	last := len(n.steps) - 1
	if last < 0 {
		return n.fn(ctx)
	}
	return n.steps[last].Run(ctx, n.x, Next{steps: n.steps[:last], fn: n.fn, x: n.x})
}

// Pipeline is an immutable list of steps with the call's listeners and
// clock. The zero Pipeline is valid and runs fn alone. Every method that adds
// something returns a new Pipeline and leaves the receiver as it was, so a
// pipeline can be shared between goroutines and extended in two directions
// without one seeing the other's steps.
type Pipeline struct {
	steps []Strategy
	env   *env // nil: the system clock, no listeners
}

// withEnv returns a copy of p's env (empty if none) changed by f, so that
// pipelines built from p before keep theirs.
func (p Pipeline) withEnv(f func(*env)) Pipeline {
	e := new(env)
	if p.env != nil {
		*e = *p.env
	}
	f(e)
	p.env = e
	return p
}

// appendCopy returns a new slice of s followed by v; it never writes into
// s's backing array, which older pipelines may share.
func appendCopy[T any](s []T, v T) []T {
	out := make([]T, len(s), len(s)+1)
	copy(out, s)
	return append(out, v)
}

// With returns the pipeline with s added as the new outermost step. It
// panics if s is nil, a nil *Timeout included. (A nil pointer of a step
// type of your own is accepted: its methods may work on a nil receiver.)
func (p Pipeline) With(s Strategy) Pipeline {
	if s == nil || s == Strategy((*Timeout)(nil)) {
		panic("tenace: With: nil strategy")
	}
	p.steps = appendCopy(p.steps, s)
	return p
}

// OnEvent returns the pipeline with fn added to its listeners. Listeners are
// pipeline-wide: they see every event of every step, wherever they were
// added. It panics if fn is nil.
func (p Pipeline) OnEvent(fn func(Event)) Pipeline {
	if fn == nil {
		panic("tenace: OnEvent: nil listener")
	}
	return p.withEnv(func(e *env) { e.listeners = appendCopy(e.listeners, fn) })
}

// WithClock returns the pipeline with c as its time source (nil: the system
// clock).
func (p Pipeline) WithClock(c Clock) Pipeline {
	return p.withEnv(func(e *env) { e.clock = c })
}

// Len is the number of steps.
func (p Pipeline) Len() int { return len(p.steps) }

// Execute runs fn through the steps, with key as the execution key. If ctx
// has already ended it returns ctx's error and runs nothing. It panics if ctx
// or fn is nil.
func (p Pipeline) Execute(ctx context.Context, key string, fn func(context.Context) error) error {
	if ctx == nil {
		panic("tenace: Execute: nil context")
	}
	if fn == nil {
		panic("tenace: Execute: nil fn")
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	x := Execution{key: key, env: p.env}
	return Next{steps: p.steps, fn: fn, x: x}.Run(ctx)
}

// Clock is the time source of a pipeline and its steps, so that tests can
// drive time: [clock.Clock], declared in package clock so that a lock
// provider can take one without importing the pipeline engine.
type Clock = clock.Clock

// SystemClock returns the clock of package time: [clock.System]().
//
// Deprecated: use clock.System, from tenace.dev/tenace/clock, which a
// lock provider can import without the pipeline engine.
func SystemClock() Clock { return clock.System() }

// IsSystemClock reports whether c is nil or the system clock:
// [clock.IsSystem].
//
// Deprecated: use clock.IsSystem, from tenace.dev/tenace/clock, which a
// lock provider can import without the pipeline engine.
func IsSystemClock(c Clock) bool { return clock.IsSystem(c) }

package failsafelock

import (
	"context"
	"slices"

	"github.com/failsafe-go/failsafe-go"

	"tenace.dev/tenace"
)

// Lock is a failsafe-go policy that runs the policies composed inside it,
// and the function, while holding a tenace lock on a key, so that
// executions with the same key run one at a time — in this process with a
// tenace.MemoryLockProvider, across processes with a distributed provider
// (tenace.dev/tenace/redislock, pglock, ...). Make one with New or
// NewBuilder; see the package documentation for what each execution does.
//
// A Lock is safe for concurrent use: one Lock can serve any number of
// executions and executors, as failsafe-go's own policies do.
//
// It is not a failsafe.ResultAgnosticPolicy on purpose: failsafe-go runs a
// policy composed with ComposeAny or WithAny on the outer execution, not the
// one the policy passes in, which would drop the context that carries the
// lease. Give it the executor's result type: New[R].
type Lock[R any] interface {
	failsafe.Policy[R]
}

// Builder builds a Lock. Its methods change the builder and return it, as
// failsafe-go's builders do; Build copies the settings, so a builder can
// go on to build other Locks.
type Builder[R any] interface {
	// WithKeyFunc sets how an execution finds its lock key when
	// LockOptions.Key is empty: fn gets the execution's context
	// (failsafe.Execution.Context, which carries the values of the context
	// given to the executor with WithContext) and returns the key; "" means
	// none, and the execution fails with an error wrapping
	// tenace.ErrMissingKey. The default is KeyFrom: the key WithKey put in
	// the context. It panics if fn is nil.
	WithKeyFunc(fn func(ctx context.Context) string) Builder[R]

	// OnAcquired registers a listener called when an execution has been
	// granted the lock, before the policies inside the Lock run.
	OnAcquired(listener func(failsafe.ExecutionEvent[R])) Builder[R]

	// OnRejected registers a listener called when the lock was not granted
	// within LockOptions.Timeout (at once with tenace.NoWait); the event's
	// LastError is the *tenace.LockNotAcquiredError the execution returns.
	OnRejected(listener func(failsafe.ExecutionEvent[R])) Builder[R]

	// OnDeadlock registers a listener called when the execution did not
	// wait because waiting would never end: it already holds the key
	// (a Lock nested in another on the same key), or its wait closed a
	// cycle of waits between executions (see tenace.DeadlockError). The
	// event's LastError is the *tenace.DeadlockError the execution returns.
	// A programming error, not contention: OnRejected is not called.
	OnDeadlock(listener func(failsafe.ExecutionEvent[R])) Builder[R]

	// OnReleased registers a listener called once the policies inside the
	// Lock have returned and the lock was released.
	OnReleased(listener func(failsafe.ExecutionEvent[R])) Builder[R]

	// OnEvent adds a listener of tenace's own lock events (tenace.Event:
	// lock.acquiring, lock.acquired, lock.rejected, lock.deadlock,
	// lock.cancelled, lock.failed, lock.lost, lock.released, with the wait, the hold, the
	// fencing token and the error), as tenace.Policy.OnEvent does: for
	// tenace.LogEvents, or the Listen method of an oteltenace.Telemetry.
	// Listeners are called in the order added, synchronously, except
	// lock.lost, which comes from another goroutine while the work may
	// still run. It panics if listener is nil.
	OnEvent(listener func(tenace.Event)) Builder[R]

	// Build returns the Lock.
	Build() Lock[R]
}

// New returns a Lock with opts and no listeners:
//
//	lock := failsafelock.New[string](tenace.LockOptions{Provider: provider, Key: "reports"})
//	report, err := failsafe.With(retry, lock).Get(buildReport)
//
// opts mean what they mean to tenace.NewLock: Provider (nil:
// tenace.DefaultLockProvider()), Key ("": the execution's key, see
// Builder.WithKeyFunc), Timeout (0: wait as long as the execution's context
// allows; tenace.NoWait: try once) and TTL. Options out of range are
// reported by each execution, as an error wrapping tenace.ErrInvalidOption.
func New[R any](opts tenace.LockOptions) Lock[R] {
	return NewBuilder[R](opts).Build()
}

// NewBuilder returns a Builder of a Lock with opts (see New), for a key
// function or listeners.
func NewBuilder[R any](opts tenace.LockOptions) Builder[R] {
	return &config[R]{opts: opts}
}

// config is the Builder, and the settings a built Lock keeps a copy of.
type config[R any] struct {
	opts       tenace.LockOptions
	keyFunc    func(context.Context) string // nil: KeyFrom
	onAcquired func(failsafe.ExecutionEvent[R])
	onRejected func(failsafe.ExecutionEvent[R])
	onDeadlock func(failsafe.ExecutionEvent[R])
	onReleased func(failsafe.ExecutionEvent[R])
	onEvent    []func(tenace.Event)
}

var _ Builder[any] = (*config[any])(nil)

func (c *config[R]) WithKeyFunc(fn func(ctx context.Context) string) Builder[R] {
	if fn == nil {
		panic("tenace: failsafelock.Builder.WithKeyFunc: nil function")
	}
	c.keyFunc = fn
	return c
}

func (c *config[R]) OnAcquired(listener func(failsafe.ExecutionEvent[R])) Builder[R] {
	c.onAcquired = listener
	return c
}

func (c *config[R]) OnRejected(listener func(failsafe.ExecutionEvent[R])) Builder[R] {
	c.onRejected = listener
	return c
}

func (c *config[R]) OnDeadlock(listener func(failsafe.ExecutionEvent[R])) Builder[R] {
	c.onDeadlock = listener
	return c
}

func (c *config[R]) OnReleased(listener func(failsafe.ExecutionEvent[R])) Builder[R] {
	c.onReleased = listener
	return c
}

func (c *config[R]) OnEvent(listener func(tenace.Event)) Builder[R] {
	if listener == nil {
		panic("tenace: failsafelock.Builder.OnEvent: nil listener")
	}
	c.onEvent = append(c.onEvent, listener)
	return c
}

func (c *config[R]) Build() Lock[R] {
	l := &lock[R]{config: *c}
	l.config.onEvent = slices.Clone(c.onEvent) // the builder may append to its own
	if l.config.keyFunc == nil {
		l.config.keyFunc = keyFromContext
	}
	// The whole of tenace's Lock step — validation, the acquire, the
	// cancel-versus-grant race, the release in a defer, the lost-lease
	// watch, the events — runs as a one-step tenace pipeline: this package
	// adds only the failsafe-go side.
	l.pipeline = tenace.NewPolicy().WithLock(c.opts)
	for _, fn := range l.config.onEvent {
		l.pipeline = l.pipeline.OnEvent(fn)
	}
	l.execListeners = c.onAcquired != nil || c.onRejected != nil || c.onDeadlock != nil || c.onReleased != nil
	return l
}

// lock is a built Lock. Immutable once built: its settings are a named
// field, not an embedded config, so that the builder's methods are not
// promoted to it (a type assertion to Builder must not reach a built Lock).
type lock[R any] struct {
	config        config[R]
	pipeline      tenace.Policy // the Lock step and the OnEvent listeners
	execListeners bool          // OnAcquired, OnRejected, OnDeadlock or OnReleased is set
}

// ToExecutor implements failsafe.Policy.
func (l *lock[R]) ToExecutor(_ R) any {
	e := &executor[R]{lock: l}
	e.Executor = e
	return e
}

type keyCtxKey struct{}

// WithKey returns a copy of ctx that carries key as the lock key of the
// executions run with it, for a Lock whose LockOptions.Key is empty and
// that has no key function of its own:
//
//	ctx := failsafelock.WithKey(ctx, "order:"+id)
//	err := failsafe.With(retry, lock).WithContext(ctx).Run(ship)
//
// It is the failsafe-go counterpart of tenace.WithKey, which failsafe-go's
// executors have no way to pass.
func WithKey(ctx context.Context, key string) context.Context {
	return context.WithValue(ctx, keyCtxKey{}, key)
}

// KeyFrom returns the key WithKey put in ctx, and whether there is one.
func KeyFrom(ctx context.Context) (string, bool) {
	k, ok := ctx.Value(keyCtxKey{}).(string)
	return k, ok
}

func keyFromContext(ctx context.Context) string {
	k, _ := KeyFrom(ctx)
	return k
}

// errMissingKey is returned when an execution has no lock key. It says what
// to do in failsafe-go's terms (tenace.ErrMissingKey speaks of Execute's
// options) and matches tenace.ErrMissingKey for errors.Is.
var errMissingKey error = missingKeyError{}

type missingKeyError struct{}

func (missingKeyError) Error() string {
	return "tenace: failsafelock: no lock key; set LockOptions.Key, WithKeyFunc, or failsafelock.WithKey(ctx, key)"
}

func (missingKeyError) Is(target error) bool { return target == tenace.ErrMissingKey }

package tenace

import (
	"context"
	"errors"
	"sync/atomic"
	"time"

	"tenace.dev/tenace/policy"
)

// LockOptions configures a Lock. The zero value locks the execution key on
// the default provider and waits as long as the context allows.
type LockOptions struct {
	// Provider hands out the locks; nil means DefaultLockProvider(), shared
	// by every Lock without one.
	Provider LockProvider
	// Key is the lock key; "" means the execution key (WithKey). One of the
	// two is required, or Keys.
	Key string
	// Keys, when not empty, is a set of keys to hold together, granted all
	// or none (see AcquireAll), instead of Key, which must then be "": an
	// empty key is ErrMissingKey, a key named twice an error wrapping
	// ErrInvalidOption. Callers may name the keys in any order: they are
	// acquired in one global order, so two sets never deadlock. Timeout
	// bounds the wait for the whole set. Events and errors name the set by
	// its keys sorted and joined by commas ("a,b"); LeaseFrom returns a
	// *SetLease, with one fencing token per key.
	Keys []string
	// Timeout is the longest time to wait for the lock: 0 waits as long as
	// the context allows; NoWait tries once. Other negative values are
	// invalid.
	Timeout time.Duration
	// TTL is the longest time the lock is held, for providers whose locks
	// expire (distributed ones); 0 means the provider's default. Negative is
	// invalid.
	TTL time.Duration
	// Shared takes the key shared: one of its permits, with the other
	// shared holders, never beside an exclusive holder (Shared false, the
	// default, takes the whole key). Readers of a read/write lock set
	// Shared, its writers do not; the callers of a keyed bulkhead all set
	// Shared and Permits. The provider must implement SharedLockProvider
	// (MemoryLockProvider does): on another, the call returns an error
	// wrapping ErrInvalidOption that names the provider, before it asks for
	// anything. A set (Keys) cannot be shared: an option error.
	//
	// Grants are first come, first served: a writer waiting for the key is
	// not overtaken by readers that come after it, and a caller that
	// cannot be admitted yet (a writer while readers hold the key, a
	// shared caller while every permit is taken) keeps those behind it
	// waiting, as x/sync/semaphore does; letting them pass would let a
	// stream of readers starve a writer forever. A shared caller does not
	// take part in deadlock detection between executions (a shared wait
	// may or may not block, depending on who else waits), and a Lock nested
	// in one that holds the key still gets a *DeadlockError: a writer
	// queued between the two would make the inner one wait forever.
	Shared bool
	// Permits is the key's permit count for shared holders: 0 lets any
	// number hold the key at once (read/write), N > 0 at most N (a keyed
	// bulkhead: "at most 5 exports per customer"). The first shared holder
	// of a key not held shared sets the count; callers admitted beside it
	// share that count, whatever they asked for, so give every caller of a
	// key the same Permits. It needs Shared; negative is invalid.
	Permits int
	// Owner is this Lock's own label for its grants (a job id, a request
	// kind): a provider that records owners shows it after its own owner
	// label (see HolderInfo.Owner and Inspector). "" adds none.
	Owner string
}

// Lock is the step that runs the steps added before it, and fn, while
// holding a lock on a key, so that calls with the same key run one at a
// time. Create it with NewLock, or add it with Policy.WithLock.
//
//	lock := tenace.NewLock(tenace.LockOptions{Key: "reports", Timeout: 5 * time.Second})
//	p := tenace.NewPolicy().WithTimeout(time.Minute).With(lock)
//	err := p.Execute(ctx, buildReport)
//
// The key is LockOptions.Key, else the execution key; with neither, the call
// returns ErrMissingKey and nothing runs. Then the Lock emits
// EventLockAcquiring and asks the provider:
//   - granted: it emits EventLockAcquired, runs the inner steps with a
//     context from which LeaseFrom returns the lease, and releases the lock
//     when they return — normally, with an error, or by panic (the panic
//     goes on up) — then emits EventLockReleased. The release gets the
//     context's values but neither its cancellation nor its deadline, even
//     when the context ends during the release, so that a distributed
//     release still reaches its server (the provider bounds a release on
//     its own); a failure to release is ignored: a distributed lock expires
//     on its own, and the work is done.
//   - not granted within Timeout: it emits EventLockRejected and returns
//     *LockNotAcquiredError.
//   - the context ended while waiting: the call leaves the queue and returns
//     the context's error; fn does not run, even if the lock was granted at
//     that moment (the grant is released at once). It emits
//     EventLockCancelled.
//   - the provider failed: *UnexpectedError wrapping its error;
//     EventLockFailed. If its Acquire panics, the panic goes on up, after
//     EventLockFailed. An option the provider refuses (an error wrapping
//     ErrInvalidOption) is returned as it is, after EventLockFailed.
//
// The events carry the wait, the hold, the fencing token and the error (see
// the Event... names), and every one the Lock's mode: Event.Shared and
// Permits, its LockOptions.Shared and Permits. They are timed on the
// policy's clock, which is read only when the policy has listeners.
//
// A lease that can be lost while held (LosableLease: a distributed lock
// whose renewal failed, whose connection dropped, or that reached its TTL)
// ends the inner steps' context the moment the Lock learns of the loss, with
// the lease's error as the cause (errors.Is(context.Cause(ctx),
// ErrLeaseLost); ErrLeaseExpired for the TTL), and emits EventLockLost, so
// that work under a lost lock stops. Execute returns what fn returns: a fn
// that returns context.Cause(ctx) when its ctx ends lets the caller tell a
// loss (errors.Is(err, ErrLeaseLost)) from its own cancellation.
//
// Locks are not reentrant. A call that asks for a key its execution already
// holds through an enclosing Lock on the same provider — a nested policy
// locking the same execution key, a retry inside the lock — would wait for
// itself forever: it gets a *DeadlockError at once instead, without a round
// trip to the provider, after EventLockAcquiring, with EventLockRejected
// (whose Err is the *DeadlockError). Give nested locks distinct keys. On a
// MemoryLockProvider, a wait that would close a cycle between executions
// of the process gets a *DeadlockError naming the cycle the same way.
//
// A Lock is safe for concurrent use; one Lock can serve any number of calls
// and policies.
type Lock struct {
	opts LockOptions
}

var _ policy.Strategy = (*Lock)(nil)

// NewLock returns a Lock step. Options out of range are reported by each
// call, as an error wrapping ErrInvalidOption, rather than here.
func NewLock(opts LockOptions) *Lock { return &Lock{opts: opts} }

type leaseKey struct{}

// LeaseFrom returns, inside fn (or an inner step), the lease held by the
// nearest enclosing Lock: to watch it for a loss (LosableLease), to read the
// keys and leases of a set (*SetLease), or its fencing token (FencedLease;
// TokenFrom reads it in one call), which the resource checks on every
// access, reads and writes (see FencedLease). fn must not release the
// lease: the Lock does.
func LeaseFrom(ctx context.Context) (LockLease, bool) {
	l, ok := ctx.Value(leaseKey{}).(LockLease)
	return l, ok
}

// heldCtx is the context the inner steps run with while a Lock holds its
// lease: the parent context plus the lease, in one allocation, made once the
// lease is granted. With a MemoryLockProvider, whose leases cost no
// allocation of their own, a lock step costs that one allocation.
//
// It also tells a Lock nested inside it which keys its execution holds
// (see reentered): the provider and the key, or the *SetLease's keys.
//
// What it says ends with the Lock: released is set before the lease is
// released, and from then on neither the reentrance check nor the cycle
// detector counts its keys, though the context lives on (a goroutine
// started inside fn with context.WithoutCancel(ctx) keeps it).
type heldCtx struct {
	context.Context
	lease    LockLease
	provider LockProvider
	key      string
	released atomic.Bool
}

func (c *heldCtx) Value(key any) any {
	switch key.(type) {
	case leaseKey:
		return c.lease
	case heldKey:
		return c
	}
	return c.Context.Value(key)
}

func (l *Lock) validate() error {
	if l.opts.Timeout < 0 && l.opts.Timeout != NoWait {
		return invalidOption("LockOptions.Timeout", l.opts.Timeout, "use a positive duration, 0 to wait as long as the context allows, or NoWait")
	}
	if l.opts.TTL < 0 {
		return invalidOption("LockOptions.TTL", l.opts.TTL, "use a positive duration, or 0 for the provider's default")
	}
	if err := validatePermits("LockOptions", l.opts.Shared, l.opts.Permits); err != nil {
		return err
	}
	if len(l.opts.Keys) > 0 {
		if l.opts.Shared {
			return invalidOption("LockOptions.Shared", true, "a set of keys (Keys) is taken exclusive: take shared keys one Lock each, in one order")
		}
		if l.opts.Key != "" {
			return invalidOption("LockOptions.Key", l.opts.Key, "set Key or Keys, not both: put the key in Keys")
		}
		return ValidateKeys(l.opts.Keys)
	}
	return nil
}

// Run implements policy.Strategy.
func (l *Lock) Run(ctx context.Context, x policy.Execution, next policy.Next) error {
	key, keys := l.opts.Key, l.opts.Keys
	if len(keys) == 0 {
		keys = nil // an empty set is no set: Key, or the execution key
	}
	switch {
	case len(keys) > 0:
		if err := l.validate(); err != nil {
			return err
		}
		key = setName(keys)
	case key == "":
		key = x.Key()
	}
	if key == "" {
		return ErrMissingKey
	}
	if keys == nil {
		if err := l.validate(); err != nil {
			return err
		}
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	provider := l.opts.Provider
	if provider == nil {
		provider = DefaultLockProvider()
	}
	if l.opts.Shared {
		if err := refuseShared(provider); err != nil {
			return err
		}
	}
	opts := LockAcquireOptions{Timeout: l.opts.Timeout, TTL: l.opts.TTL, Clock: x.Clock(), Shared: l.opts.Shared, Permits: l.opts.Permits}

	// Events cost nothing without listeners: no clock read, no Event.
	observed := x.HasListeners()
	var start time.Time
	if observed {
		start = opts.Clock.Now()
		l.emitAcquiring(ctx, x, key, start)
	}
	// The keys the execution holds, from the enclosing Locks: none, and
	// this is the one ctx.Value a Lock makes before it acquires.
	outer, _ := ctx.Value(heldKey{}).(*heldCtx)
	actx, watch := ctx, cycleWatch{}
	if outer != nil {
		if d := outer.reentered(provider, key, keys); d != nil {
			if observed {
				l.emitWaitEnd(ctx, x, EventLockRejected, key, start, d)
			}
			return d
		}
		if !l.opts.Shared {
			actx, watch = watchCycles(ctx, outer, provider, key, keys)
		}
	}
	var held *heldCtx
	var lease LockLease
	var err error
	if observed {
		lease, err = l.acquireObserved(ctx, actx, x, provider, key, keys, opts, start)
	} else {
		lease, err = acquire(actx, provider, key, keys, opts)
	}
	if d := watch.leave(actx); d != nil && lease == nil && ctx.Err() == nil {
		// The detector ended this wait to break a cycle.
		if observed {
			l.emitWaitEnd(ctx, x, EventLockRejected, key, start, d)
		}
		return d
	}
	if lease != nil {
		held = &heldCtx{Context: ctx, lease: lease, provider: provider, key: key}
	}
	if err != nil {
		if lease != nil {
			// Against the contract (an error means nothing is held), but a
			// lease handed out is given back, not leaked.
			_ = lease.Release(context.WithoutCancel(ctx))
		}
		if ctxErr := ctx.Err(); ctxErr != nil && errors.Is(err, ctxErr) {
			if observed {
				l.emitWaitEnd(ctx, x, EventLockCancelled, key, start, err)
			}
			return err
		}
		if observed {
			l.emitWaitEnd(ctx, x, EventLockFailed, key, start, err)
		}
		if errors.Is(err, ErrInvalidOption) {
			// The provider refused an option it bounds more tightly than
			// validate does (redislock's TTL, say): the caller's mistake,
			// reported as the Lock's own option errors are, not as a
			// provider failure.
			return err
		}
		return &UnexpectedError{Err: err}
	}
	if held == nil || held.lease == nil {
		if ctxErr := ctx.Err(); ctxErr != nil {
			if observed {
				l.emitWaitEnd(ctx, x, EventLockCancelled, key, start, ctxErr)
			}
			return ctxErr // a provider may report a ctx that ended as "not granted"
		}
		rejected := &LockNotAcquiredError{Key: key, Timeout: l.opts.Timeout}
		if observed {
			l.emitWaitEnd(ctx, x, EventLockRejected, key, start, rejected)
		}
		return rejected
	}
	if err := ctx.Err(); err != nil {
		// The grant landed as the context ended: the call was still waiting
		// when it was cancelled, so fn must not run, and the grant goes back.
		_ = held.lease.Release(context.WithoutCancel(ctx))
		if observed {
			l.emitWaitEnd(ctx, x, EventLockCancelled, key, start, err)
		}
		return err
	}
	var granted time.Time
	if observed {
		granted = opts.Clock.Now()
	}
	// Released in a defer, so that a panic in fn, in an inner step or in a
	// listener of the acquired event does not leak the lock.
	defer l.release(ctx, x, key, held, granted)
	if observed {
		e := l.event(EventLockAcquired, key, ctx)
		e.Wait, e.Token = granted.Sub(start), tokenOf(held.lease)
		x.Emit(e)
	}
	if lost, ok := held.lease.(LosableLease); ok && lost.Lost() != nil {
		return l.runWatched(ctx, held, x, key, lost, granted, next)
	}
	return next.Run(held)
}

// runWatched runs the inner steps, with held as their parent context, while
// watching a lease that can be lost: the moment it is lost their context
// ends with the lease's error as its cause, and EventLockLost is emitted —
// from the watching goroutine, while fn may still run (listeners are already
// safe for concurrent use: a policy runs many calls at once). The watcher
// has exited when runWatched returns, so the lost event always comes before
// the released one, and a loss that came before the inner steps returned is
// always reported (one a moment after, before the release, may be too).
// ctx is the Lock's own context, for the event; granted is
// when the lease was granted (zero without listeners).
func (l *Lock) runWatched(ctx, held context.Context, x policy.Execution, key string, lease LosableLease, granted time.Time, next policy.Next) error {
	inner, cancel := context.WithCancelCause(held)
	defer cancel(nil)
	stop := make(chan struct{})
	done := make(chan struct{})
	// A listener of the lost event that panics must not crash the process
	// from the watcher goroutine: its panic is carried over and goes on up
	// through Execute from the caller's goroutine, like any listener's, once
	// the inner steps have returned (the lock is still released).
	var listenerPanic any
	go func() {
		defer close(done)
		defer func() { listenerPanic = recover() }()
		select {
		case <-lease.Lost():
			err := lease.Err()
			cancel(err)
			if x.HasListeners() {
				e := l.event(EventLockLost, key, ctx)
				e.Hold, e.Token, e.Err = x.Clock().Now().Sub(granted), tokenOf(lease), err
				x.Emit(e)
			}
		case <-stop:
		}
	}()
	defer func() {
		// A loss that came before the inner steps returned is reported,
		// however late the watcher runs: stop stays open, so Lost is the
		// only case it can take. With both ready, select would choose at
		// random and drop the loss.
		select {
		case <-lease.Lost():
		default:
			close(stop)
		}
		<-done
		if listenerPanic != nil {
			panic(listenerPanic)
		}
	}()
	return next.Run(inner)
}

// release releases lease and emits EventLockReleased; granted is when the
// lease was granted (zero without listeners).
func (l *Lock) release(ctx context.Context, x policy.Execution, key string, held *heldCtx, granted time.Time) {
	held.released.Store(true)
	lease := held.lease
	rctx := ctx
	if ctx.Done() != nil {
		// Not ctx: neither the caller's cancel nor its deadline may cut
		// the release short, when ctx has ended already and just as much
		// when it ends during the release (a distributed lock would stay
		// held until it expires). Without a deadline, a distributed
		// provider bounds the release on its own. The memory provider's
		// Release ignores its ctx: no context made for it.
		if _, ok := lease.(contextFreeRelease); !ok {
			rctx = context.WithoutCancel(ctx)
		}
	}
	err := lease.Release(rctx) // not returned: see Lock; listeners see it
	if x.HasListeners() {
		e := l.event(EventLockReleased, key, ctx)
		e.Hold, e.Token, e.Err = x.Clock().Now().Sub(granted), tokenOf(lease), err
		x.Emit(e)
	}
}

// contextFreeRelease is implemented by leases whose Release never uses its
// context (the memory provider's), so that the Lock step makes none for it.
type contextFreeRelease interface{ releaseIgnoresContext() }

// errAcquiringListener is the error of the EventLockFailed that ends a wait
// whose EventLockAcquiring a listener panicked on.
var errAcquiringListener = errors.New("tenace: a listener panicked on " + EventLockAcquiring + ": the lock was not acquired")

// emitAcquiring emits EventLockAcquiring. If a listener panics on it, the
// acquire is never made, and the wait every listener has seen begin ends
// with EventLockFailed (errAcquiringListener) as the panic goes on up.
func (l *Lock) emitAcquiring(ctx context.Context, x policy.Execution, key string, start time.Time) {
	emitted := false
	defer func() {
		if !emitted {
			l.emitWaitEnd(ctx, x, EventLockFailed, key, start, errAcquiringListener)
		}
	}()
	x.Emit(l.event(EventLockAcquiring, key, ctx))
	emitted = true
}

// errProviderPanicked is the error of the EventLockFailed that ends a wait
// whose provider's Acquire panicked.
var errProviderPanicked = errors.New("tenace: the lock provider's Acquire panicked: the lock was not acquired")

// acquireObserved is provider.Acquire for a call with listeners. If Acquire
// panics, the wait every listener has seen begin ends with EventLockFailed
// (errProviderPanicked) as the panic goes on up, so that a listener pairing
// the events (a gauge of waiters) stays balanced.
// actx is the context to acquire with (ctx, or one the cycle detector can
// end).
func (l *Lock) acquireObserved(ctx, actx context.Context, x policy.Execution, provider LockProvider, key string, keys []string, opts LockAcquireOptions, start time.Time) (LockLease, error) {
	returned := false
	defer func() {
		if !returned {
			l.emitWaitEnd(ctx, x, EventLockFailed, key, start, errProviderPanicked)
		}
	}()
	lease, err := acquire(actx, provider, key, keys, opts)
	returned = true
	return lease, err
}

// acquire asks provider for key, or for the set keys when not nil.
func acquire(ctx context.Context, provider LockProvider, key string, keys []string, opts LockAcquireOptions) (LockLease, error) {
	if keys == nil {
		return provider.Acquire(ctx, key, opts)
	}
	set, err := AcquireAll(ctx, provider, keys, opts)
	if set == nil {
		return nil, err // not a nil *SetLease in a non-nil LockLease
	}
	return set, err
}

// emitWaitEnd emits name, an event that ends the wait begun at start.
func (l *Lock) emitWaitEnd(ctx context.Context, x policy.Execution, name, key string, start time.Time, err error) {
	e := l.event(name, key, ctx)
	e.Wait, e.Err = x.Clock().Now().Sub(start), err
	x.Emit(e)
}

// event is the Lock's event name about key, asked for with ctx: every
// lock event carries the Lock's mode (Event.Shared and Permits), so that a
// listener can tell a reader's or a bulkhead's wait from a writer's.
func (l *Lock) event(name, key string, ctx context.Context) Event {
	return Event{Name: name, Key: key, Context: ctx, Shared: l.opts.Shared, Permits: l.opts.Permits}
}

// tokenOf is the lease's fencing token, or 0 if it has none.
func tokenOf(l LockLease) uint64 {
	if f, ok := l.(FencedLease); ok {
		return f.Token()
	}
	return 0
}

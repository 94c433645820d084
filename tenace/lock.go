package tenace

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"tenace.dev/tenace/internal/provkit"
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
// returns ErrMissingKey and nothing runs, as with an option out of range
// (an error wrapping ErrInvalidOption; the rules are ValidateAcquire's and,
// for Keys, ValidateSet's). Then the Lock emits EventLockAcquiring and asks
// the provider:
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
//   - waiting would never end (see below): it emits EventLockDeadlock and
//     returns *DeadlockError.
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
// trip to the provider, after EventLockAcquiring, with EventLockDeadlock
// (whose Err is the *DeadlockError). Give nested locks distinct keys. On a
// provider with a DeadlockDetector (MemoryLockProvider; see
// DeadlockDetectingProvider), a wait that would close a cycle between
// executions of the process gets a *DeadlockError naming the cycle the same
// way.
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

// lockCtx is the context the inner steps run with while a Lock holds its
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
type lockCtx struct {
	context.Context
	lease    LockLease
	provider LockProvider
	key      string
	released atomic.Bool
}

func (c *lockCtx) Value(key any) any {
	switch key.(type) {
	case leaseKey:
		return c.lease
	case lockCtxKey, provkit.HeldKey:
		return c
	}
	return c.Context.Value(key)
}

// HeldLeases implements provkit.Holder: the leases c and the Locks around
// it hold from provider and have not begun to release, innermost first.
// It is how a provider reaches what the execution holds (see
// provkit.HeldLeases); it adds nothing to the package's API.
func (c *lockCtx) HeldLeases(provider any) []any {
	p, ok := provider.(LockProvider)
	if !ok {
		return nil
	}
	var held []any
	for h := c; h != nil; h, _ = h.Context.Value(lockCtxKey{}).(*lockCtx) {
		if !h.released.Load() && sameProvider(h.provider, p) {
			held = append(held, h.lease)
		}
	}
	return held
}

// target returns what the Lock locks — key, and keys for a set (nil for one
// key) — or why its options are refused. It is the Lock's one validation,
// with the precedence of ValidateAcquire and ValidateSet: what is locked
// (Key and Keys together, a missing or empty key, a key named twice, a
// shared set), then how (Timeout, TTL, Permits).
func (l *Lock) target(x policy.Execution) (key string, keys []string, err error) {
	o := &l.opts
	if len(o.Keys) > 0 {
		if o.Key != "" {
			return "", nil, invalidOption("LockOptions.Key", o.Key, "set Key or Keys, not both: put the key in Keys")
		}
		if err := checkAcquire("LockOptions", "", o.Keys, o.Timeout, o.TTL, o.Shared, o.Permits); err != nil {
			return "", nil, err
		}
		return setName(o.Keys), o.Keys, nil
	}
	key = o.Key
	if key == "" {
		key = x.Key()
	}
	return key, nil, checkAcquire("LockOptions", key, nil, o.Timeout, o.TTL, o.Shared, o.Permits)
}

// waitEnd is how a Lock's wait for its key ended.
type waitEnd uint8

const (
	_            waitEnd = iota // the zero value is invalid
	endGranted                  // the lease is held; the inner steps run
	endRejected                 // not granted within Timeout: *LockNotAcquiredError
	endDeadlock                 // waiting would never end: *DeadlockError
	endCancelled                // ctx ended first: its error
	endFailed                   // the provider failed (*UnexpectedError) or refused an option (as it is)
)

// waitEndEvent is the event that reports each end of a wait.
var waitEndEvent = [...]string{
	endGranted:   EventLockAcquired,
	endRejected:  EventLockRejected,
	endDeadlock:  EventLockDeadlock,
	endCancelled: EventLockCancelled,
	endFailed:    EventLockFailed,
}

// Run implements policy.Strategy.
func (l *Lock) Run(ctx context.Context, x policy.Execution, next policy.Next) error {
	key, keys, err := l.target(x)
	if err != nil {
		return err
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
	opts := LockAcquireOptions{Timeout: l.opts.Timeout, TTL: l.opts.TTL, Clock: x.Clock(), Shared: l.opts.Shared, Permits: l.opts.Permits, Owner: l.opts.Owner}

	// Events cost nothing without listeners: no clock read, no Event.
	observed := x.HasListeners()
	var start time.Time
	if observed {
		start = opts.Clock.Now()
		l.emitAcquiring(ctx, x, key, start)
	}
	lease, end, err := l.acquire(ctx, x, provider, key, keys, opts, observed, start)
	if end != endGranted {
		if observed {
			l.emitWaitEnd(ctx, x, waitEndEvent[end], key, start, err)
		}
		if end == endFailed && !errors.Is(err, ErrInvalidOption) {
			// The event carries the provider's error; the call returns it
			// wrapped. An option the provider refuses (redislock's TTL
			// bound, say) is the caller's mistake, returned as the Lock's
			// own option errors are.
			return &UnexpectedError{Err: err}
		}
		return err
	}
	var granted time.Time
	if observed {
		granted = opts.Clock.Now()
	}
	lctx := &lockCtx{Context: ctx, lease: lease, provider: provider, key: key}
	// Released in a defer, so that a panic in fn, in an inner step or in a
	// listener of the acquired event does not leak the lock.
	defer l.release(ctx, x, key, lctx, granted)
	if observed {
		e := l.event(EventLockAcquired, key, ctx)
		e.Wait, e.Token = granted.Sub(start), tokenOf(lease)
		x.Emit(e)
	}
	if lost, ok := lease.(LosableLease); ok && lost.Lost() != nil {
		return l.runWatched(ctx, lctx, x, key, lost, granted, next)
	}
	return next.Run(lctx)
}

// acquire asks provider for key (keys, for a set) and says how the wait
// ended: with a lease (endGranted), or with the error the Lock returns
// (for endFailed, the provider's own, which Run wraps).
// Whatever it returns without endGranted, nothing is left held.
func (l *Lock) acquire(ctx context.Context, x policy.Execution, provider LockProvider, key string, keys []string, opts LockAcquireOptions, observed bool, start time.Time) (LockLease, waitEnd, error) {
	// The keys the execution holds, from the enclosing Locks: none, and
	// this is the one ctx.Value a Lock makes before it acquires.
	outer, _ := ctx.Value(lockCtxKey{}).(*lockCtx)
	if outer != nil {
		if d := outer.reentered(provider, key, keys); d != nil {
			return nil, endDeadlock, d
		}
	}
	seen := watchHolder(&opts)
	var lease LockLease
	var err error
	if observed {
		lease, err = l.askObserved(ctx, x, outer, provider, key, keys, opts, start)
	} else {
		lease, err = l.ask(ctx, outer, provider, key, keys, opts)
	}
	holder := seen.take()
	if err != nil {
		if lease != nil {
			// Against the contract (an error means nothing is held), but a
			// lease handed out is given back, not leaked.
			_ = lease.Release(context.WithoutCancel(ctx))
		}
		var d *DeadlockError
		switch ctxErr := ctx.Err(); {
		case errors.As(err, &d):
			return nil, endDeadlock, err
		case ctxErr != nil && errors.Is(err, ctxErr):
			return nil, endCancelled, err
		}
		return nil, endFailed, err
	}
	if ctxErr := ctx.Err(); ctxErr != nil {
		if lease != nil {
			// The grant landed as the context ended: the call was still
			// waiting when it was cancelled, so fn must not run, and the
			// grant goes back.
			_ = lease.Release(context.WithoutCancel(ctx))
		}
		return nil, endCancelled, ctxErr // a provider may report a ctx that ended as "not granted"
	}
	if lease == nil {
		rejected := &LockNotAcquiredError{Key: key, Timeout: l.opts.Timeout, Holder: holder}
		if holder != nil && !holder.Since.IsZero() {
			rejected.HeldFor = max(time.Since(holder.Since), 0)
		}
		return nil, endRejected, rejected
	}
	return lease, endGranted, nil
}

// ask is the provider's answer: Acquire for one key, the set's acquire for
// keys, reporting the wait to the provider's DeadlockDetector when it has
// one and the wait holds something (see deadlock_cycle.go). A wait the
// detector ended returns its *DeadlockError.
func (l *Lock) ask(ctx context.Context, outer *lockCtx, provider LockProvider, key string, keys []string, opts LockAcquireOptions) (lease LockLease, err error) {
	if keys != nil {
		set, err := acquireSetWatched(ctx, outer, provider, keys, opts)
		if set == nil {
			return nil, err // not a nil *SetLease in a non-nil LockLease
		}
		return set, err
	}
	if outer == nil || l.opts.Shared || opts.Timeout == NoWait {
		// Holds nothing, waits shared (a shared wait may or may not block,
		// depending on who else waits), or never waits (a NoWait try,
		// whose answer is not granted, never a *DeadlockError): no cycle
		// to watch.
		return provider.Acquire(ctx, key, opts)
	}
	w := watchCycles(ctx, outer, provider, []string{key})
	// Deferred, so that an Acquire that panics leaves no node in the graph.
	defer func() {
		if d := w.leave(); d != nil && lease == nil && ctx.Err() == nil {
			err = d // the detector ended this wait to break a cycle
		}
	}()
	return provider.Acquire(w.before(0), key, opts)
}

// acquireSetWatched is ask for a set. Without a detector, or for a NoWait
// try, it is AcquireAll's acquire. With one, it first tries the whole set
// (a try never waits, so it closes no cycle, and an uncontended set costs
// what it costs without a detector); then it takes the keys one at a time
// in sorted order, so that the detector sees each grant.
func acquireSetWatched(ctx context.Context, outer *lockCtx, provider LockProvider, keys []string, opts LockAcquireOptions) (set *SetLease, err error) {
	if opts.Timeout == NoWait || detectorOf(provider) == nil {
		return acquireSet(ctx, provider, keys, opts)
	}
	try := opts
	try.Timeout = NoWait
	if set, err = acquireSet(ctx, provider, keys, try); set != nil || err != nil {
		return set, err
	}
	order := slices.Sorted(slices.Values(keys))
	w := watchCycles(ctx, outer, provider, order)
	// Deferred, so that an Acquire that panics leaves no node in the graph.
	defer func() {
		if d := w.leave(); d != nil && set == nil && ctx.Err() == nil {
			err = d // the detector ended this wait to break a cycle
		}
	}()
	return acquireInOrder(ctx, provider, order, opts, w.before)
}

// runWatched runs the inner steps, with lctx as their parent context, while
// watching a lease that can be lost: the moment it is lost their context
// ends with the lease's error as its cause, and EventLockLost is emitted —
// from the watching goroutine, while fn may still run (listeners are already
// safe for concurrent use: a policy runs many calls at once). The watcher
// has exited when runWatched returns, so the lost event always comes before
// the released one, and a loss that came before the inner steps returned is
// always reported (one a moment after, before the release, may be too).
// ctx is the Lock's own context, for the event; granted is
// when the lease was granted (zero without listeners).
func (l *Lock) runWatched(ctx, lctx context.Context, x policy.Execution, key string, lease LosableLease, granted time.Time, next policy.Next) error {
	inner, cancel := context.WithCancelCause(lctx)
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
func (l *Lock) release(ctx context.Context, x policy.Execution, key string, lctx *lockCtx, granted time.Time) {
	lctx.released.Store(true)
	lease := lctx.lease
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

// askObserved is ask for a call with listeners. If the provider's Acquire
// panics, the wait every listener has seen begin ends with EventLockFailed
// (errProviderPanicked) as the panic goes on up, so that a listener pairing
// the events (a gauge of waiters) stays balanced.
func (l *Lock) askObserved(ctx context.Context, x policy.Execution, outer *lockCtx, provider LockProvider, key string, keys []string, opts LockAcquireOptions, start time.Time) (LockLease, error) {
	returned := false
	defer func() {
		if !returned {
			l.emitWaitEnd(ctx, x, EventLockFailed, key, start, errProviderPanicked)
		}
	}()
	lease, err := l.ask(ctx, outer, provider, key, keys, opts)
	returned = true
	return lease, err
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

// holderWatch records the holder a provider reports through
// LockAcquireOptions.OnHeld. It is pooled, with its callback made once, so
// that a Lock with a Timeout costs no allocation for it.
type holderWatch struct {
	info HolderInfo
	ok   bool
	fn   func(HolderInfo) // h.see, bound once
}

var holderWatchPool = sync.Pool{New: func() any {
	h := new(holderWatch)
	h.fn = h.see
	return h
}}

func (h *holderWatch) see(info HolderInfo) { h.info, h.ok = info, true }

// watchHolder sets opts.OnHeld for an acquire that can be refused (one
// with a Timeout or NoWait), and returns what take reads it from; nil for
// one that cannot.
func watchHolder(opts *LockAcquireOptions) *holderWatch {
	if opts.Timeout == 0 {
		return nil
	}
	h := holderWatchPool.Get().(*holderWatch)
	opts.OnHeld = h.fn
	return h
}

// take returns the holder the provider reported, or nil, and pools h: the
// provider calls OnHeld before its Acquire returns, never after.
func (h *holderWatch) take() *HolderInfo {
	if h == nil {
		return nil
	}
	var info *HolderInfo
	if h.ok {
		info = new(HolderInfo)
		*info = h.info
	}
	h.info, h.ok = HolderInfo{}, false
	holderWatchPool.Put(h)
	return info
}

// tokenOf is the lease's fencing token, or 0 if it has none.
func tokenOf(l LockLease) uint64 {
	if f, ok := l.(FencedLease); ok {
		return f.Token()
	}
	return 0
}

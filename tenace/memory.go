package tenace

import (
	"context"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"tenace.dev/tenace/clock"
	"tenace.dev/tenace/shard"
)

// MemoryLockProvider is the in-process LockProvider: one holder per key,
// granted in arrival order, inside the process.
//
// Keys hash with xxhash to N shard goroutines (see package shard). Each shard
// goroutine alone owns its keys' holders and FIFO wait queues; acquire and
// cancel reach it as messages on its buffered mailbox, and grants come back
// on per-waiter reply channels. A release is one compare-and-swap on the
// key's state word when nobody waits for the key, and a message when
// someone does. No mutex, semaphore or spin lock guards the lock state: the
// shard goroutine alone grants and queues.
//
// Guarantees:
//   - Mutual exclusion: at most one lease per key is live at a time.
//   - Order: a Release happens before the Acquire it lets through returns,
//     in the sense of the Go memory model (as sync.Mutex's Unlock
//     synchronizes before the next Lock): what the holder wrote is visible to
//     the next holder.
//   - Fairness: waiters are granted in arrival order, the order in which the
//     shard receives the acquire messages. Exceptions: a NoWait acquire never
//     queues (it cannot overtake a waiter, it only fails); a waiter that gives
//     up leaves the queue; a grant that lands as its waiter gives up passes at
//     once to the next waiter.
//   - No leak: when Acquire returns no lease (timeout, ctx ended, closed),
//     the key is left as if it had never been asked for, even when the grant
//     raced the give-up ("abort during grant", see package shard).
//   - Tokens: leases are FencedLeases; a key's tokens strictly increase.
//   - Size is exact once the shards have applied every queued message, and 0
//     when idle. An idle key's entry goes at the shard's next sweep: with no
//     traffic a shard keeps fewer free entries than 64 or than the keys it
//     holds, whichever is more — fewer than 64 once nothing is held.
//
// Locks are not reentrant: an Acquire of a key the caller already holds
// waits for the caller itself, until its timeout, or forever without one
// (a Lock step sees it coming and returns a *DeadlockError instead). A
// Lock that waits while it holds something — keys of the provider through
// its execution, or the keys its set was granted so far — tells the
// provider's DeadlockDetector, one goroutine beside the shards, which fails
// the wait that would close a cycle with a *DeadlockError (see
// DeadlockError and DeadlockDetectingProvider).
//
// Sets of keys (AcquireSet, AcquireAll, LockOptions.Keys) are granted all
// or none, deadlock-free: each key is acquired from its shard in sorted
// order, under one timer for the whole set, and a give-up releases the keys
// granted so far before it returns.
//
// Who holds a key: every grant and wait records the provider's owner label
// (WithOwner), the Lock's own (LockOptions.Owner) and when it was made;
// Inspect and List report them (see Inspector), and a refused Lock names
// the holder it found. Recording them costs the shard one clock reading
// per batch of messages and a few stores per grant.
//
// A MemoryLockProvider is safe for concurrent use. Create it with
// NewMemoryLockProvider and Close it when done; or share the process-wide
// DefaultLockProvider(). Its zero value is not usable: its methods panic.
type MemoryLockProvider struct {
	group     *shard.Group
	owner     string            // the owner label of every grant (WithOwner)
	cycles    *DeadlockDetector // the wait-for graph of holding waiters (see deadlock_cycle.go)
	closed    atomic.Bool
	isDefault bool
	timers    sync.Pool // *time.Timer, stopped; per provider, like the shard's waiters
}

var (
	_ LockProvider       = (*MemoryLockProvider)(nil)
	_ MultiLockProvider  = (*MemoryLockProvider)(nil)
	_ SharedLockProvider = (*MemoryLockProvider)(nil)
	_ StatsProvider      = (*MemoryLockProvider)(nil)
	_ Inspector          = (*MemoryLockProvider)(nil)

	_ DeadlockDetectingProvider = (*MemoryLockProvider)(nil)
)

// MemoryOption configures NewMemoryLockProvider.
type MemoryOption interface {
	apply(*memoryConfig)
}

type memoryConfig struct {
	shards   int
	owner    string
	onQueued func(key string)
	spawn    func(loop func())
}

type memoryOptionFunc func(*memoryConfig)

func (f memoryOptionFunc) apply(c *memoryConfig) { f(c) }

// WithShards sets the number of shard goroutines. The default is
// runtime.GOMAXPROCS(0) at creation: a shard goroutine is the serial point of
// its keys, so one per P lets every P run one, and more than that only adds
// goroutines for the scheduler to juggle. Measured against one shard (which
// is also GOMAXPROCS/2 there) on 2 cores, across the bench matrix, the
// difference stayed within the noise (bench/README.md, "Shard count").
// More shards spread unrelated keys further; one shard gives a single FIFO
// order over all keys. It panics if n < 1.
func WithShards(n int) MemoryOption {
	if n < 1 {
		panic("tenace: WithShards: n must be at least 1")
	}
	return memoryOptionFunc(func(c *memoryConfig) { c.shards = n })
}

// WithOwner sets the provider's owner label, which Inspect and List show
// for every grant and wait (HolderInfo.Owner), and a Lock's refusal names
// (LockNotAcquiredError): a name for this process, such as a pod name or
// a job id. The default is DefaultOwner(): the host, the process id and a
// short random suffix. A Lock's own label (LockOptions.Owner) follows it,
// as "owner (label)". It panics if owner is empty.
func WithOwner(owner string) MemoryOption {
	if owner == "" {
		panic("tenace: WithOwner: empty owner label: leave the option out for DefaultOwner()")
	}
	return memoryOptionFunc(func(c *memoryConfig) { c.owner = owner })
}

// withQueuedHook is for tests: fn runs on the shard goroutine each time an
// acquire queues, after the shard published its size (see shard.Options).
func withQueuedHook(fn func(key string)) MemoryOption {
	return memoryOptionFunc(func(c *memoryConfig) { c.onQueued = fn })
}

// NewMemoryLockProvider starts a provider and its shard goroutines. Close it
// to stop them.
//
// Under testing/synctest, use a provider only on the side of the bubble
// where it was made: made inside a bubble, from that bubble's goroutines;
// made outside, from goroutines outside every bubble. Its shard goroutines
// and its callers exchange messages and replies on channels either side
// makes, and the runtime stops the program (a fatal error, not a panic)
// when a goroutine sends on a channel of a bubble it is not in.
func NewMemoryLockProvider(opts ...MemoryOption) *MemoryLockProvider {
	cfg := memoryConfig{shards: runtime.GOMAXPROCS(0)}
	for _, o := range opts {
		o.apply(&cfg)
	}
	if cfg.owner == "" {
		cfg.owner = DefaultOwner()
	}
	return &MemoryLockProvider{
		owner: cfg.owner,
		group: shard.NewGroup(shard.Options{
			Shards:   cfg.shards,
			OnQueued: cfg.onQueued,
			Go:       cfg.spawn,
		}),
		cycles: newDeadlockDetector(cfg.spawn),
	}
}

var defaultProvider = sync.OnceValue(func() *MemoryLockProvider {
	p := NewMemoryLockProvider(memoryOptionFunc(func(c *memoryConfig) {
		c.spawn = func(loop func()) { go defaultProviderLoop(loop) }
	}))
	p.isDefault = true
	return p
})

// defaultProviderLoop is the frame that names the default provider's shard
// goroutines on their stacks. Tests that use the default provider and
// goleak ignore them with
//
//	goleak.IgnoreAnyFunction("tenace.dev/tenace.defaultProviderLoop")
//
//go:noinline
func defaultProviderLoop(loop func()) { loop() }

// DefaultLockProvider returns the process-wide MemoryLockProvider, created on
// first use, that every Lock without a Provider shares: two policies that lock
// the same key without naming a provider exclude each other. It lives as long
// as the process; Close on it is refused. Do not use it inside a
// testing/synctest bubble (its goroutines belong to no bubble, see
// NewMemoryLockProvider): create a provider in the bubble instead.
func DefaultLockProvider() *MemoryLockProvider { return defaultProvider() }

// Acquire waits for key and returns its lease.
//
// It returns a lease when granted; (nil, nil) when not granted within
// opts.Timeout, or at once with NoWait when the key is held; (nil, ctx's
// error) when ctx ends first, or had ended on entry; ErrProviderClosed
// after Close, and to waiters queued when Close is called; an error wrapping
// ErrMissingKey for an empty key, or ErrInvalidOption for a negative
// Timeout other than NoWait or a negative TTL. Whenever it returns no lease,
// the provider's state is as if the call had never been made.
//
// A grant that lands at the moment ctx ends or the timeout passes goes to
// the next waiter, and Acquire reports the give-up: an error or nil lease
// always means nothing is held. opts.TTL is ignored: these locks never expire.
// opts.Owner labels the grant and the wait (Inspect shows it); opts.OnHeld,
// when set, is told the holder the shard found when it answers "not
// granted" (NoWait, Timeout).
//
// With opts.Shared, the lease is one of the key's permits (see
// LockAcquireOptions.Permits): readers of a read/write lock, or the
// callers of a keyed bulkhead, granted first come, first served with the
// exclusive callers of the key (see LockOptions.Shared). A shared lease is
// released by a message to the key's shard, never by the compare-and-swap
// an exclusive lease uses when nobody waits; its fencing token is its own
// grant's, and shared holders of one key have distinct tokens (a resource
// that fences writes should fence only exclusive holders' writes).
// Negative Permits, or Permits without Shared, is an error wrapping
// ErrInvalidOption.
// It panics if p is nil or not made by NewMemoryLockProvider, or if ctx is
// nil.
func (p *MemoryLockProvider) Acquire(ctx context.Context, key string, opts LockAcquireOptions) (LockLease, error) {
	// Every parked waiter keeps this frame and those below it on its stack:
	// the errors and the timer are in functions of their own, so that the
	// stack stays within the 2 KiB a goroutine starts with. The checks that
	// pass are comparisons here: a call less on every acquire.
	if key == "" || (opts.Timeout < 0 && opts.Timeout != NoWait) || opts.TTL < 0 || (opts.Permits != 0 && (uint(opts.Permits) > maxPermits || !opts.Shared)) || ctx == nil || p == nil || p.group == nil || p.closed.Load() {
		return nil, p.refuse(ctx, key, &opts)
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if opts.Timeout != 0 || opts.Owner != "" {
		return p.acquireWith(ctx, key, &opts)
	}
	// wait's body, written out: one frame fewer on a waiter's stack. The
	// shard's Acquire is inlined here, so an exclusive waiter's stack is
	// this frame and the shard's only: one frame more
	// (a helper choosing between the two) took every waiter of the bench
	// past the 2 KiB a goroutine starts with (bench/README.md, "Shared
	// locks: cost for exclusive callers").
	s := p.group.For(key)
	var out shard.Outcome
	var err error
	if opts.Shared {
		out, err = s.AcquireShared(ctx, key, opts.Permits, shard.Wait, nil)
	} else {
		out, err = s.Acquire(ctx, key, shard.Wait, nil)
	}
	if err != nil {
		if err == shard.ErrStopped { // the shard returns it unwrapped
			return nil, ErrProviderClosed
		}
		return nil, err
	}
	if !out.Granted {
		return nil, nil
	}
	// The lease is the shard's Grant itself: made for this grant alone and
	// never reused, so handing it out costs no allocation (see shard.Grant).
	return (*memoryLease)(out.Grant()), nil
}

// refuse returns why an acquire that failed Acquire's checks must not be
// sent: the input's error first, as ValidateAcquire words it, else closed.
// It panics if p is nil or was not made by NewMemoryLockProvider, or if ctx
// is nil: a programmer's mistake, not a caller's input.
//
//go:noinline
func (p *MemoryLockProvider) refuse(ctx context.Context, key string, opts *LockAcquireOptions) error {
	if p == nil {
		panic("tenace: MemoryLockProvider.Acquire on a nil *MemoryLockProvider: make one with NewMemoryLockProvider, or leave LockOptions.Provider nil for DefaultLockProvider()")
	}
	p.mustBeMade("Acquire")
	if ctx == nil {
		panic("tenace: MemoryLockProvider.Acquire: nil context: pass context.Background() or the caller's context")
	}
	if err := validateAcquire(key, *opts); err != nil {
		return err
	}
	return ErrProviderClosed
}

// acquireWith is Acquire with a timeout, NoWait or a label: off the
// common path, so that a plain waiter's frames stay small — every parked
// waiter keeps them on its stack (see bench/README.md, Waiters).
func (p *MemoryLockProvider) acquireWith(ctx context.Context, key string, opts *LockAcquireOptions) (LockLease, error) {
	switch {
	case opts.Timeout == NoWait:
		return p.wait(ctx, key, opts, shard.Try, nil)
	case opts.Timeout == 0:
		return p.wait(ctx, key, opts, shard.Wait, nil)
	case clock.IsSystem(opts.Clock):
		// The timer starts before the acquire is sent, so a test clock that
		// sees the waiter queued has already seen its timer.
		t := p.startTimer(opts.Timeout)
		defer p.stopTimer(t)
		return p.wait(ctx, key, opts, shard.Wait, t.C)
	}
	ch := make(chan time.Time, 1) // one fire, never blocks the clock
	stop := opts.Clock.AfterFunc(opts.Timeout, func() { ch <- time.Time{} })
	defer stop()
	return p.wait(ctx, key, opts, shard.Wait, ch)
}

// wait sends the acquire to key's shard and waits for the outcome, or for
// timeout. Refused, or not granted in time, it tells opts.OnHeld the
// holder the shard found, if any.
func (p *MemoryLockProvider) wait(ctx context.Context, key string, opts *LockAcquireOptions, mode shard.Mode, timeout <-chan time.Time) (LockLease, error) {
	r := shard.Request{Shared: opts.Shared, Permits: opts.Permits, Label: opts.Owner}
	out, err := p.group.For(key).AcquireWith(ctx, key, &r, mode, timeout)
	if err != nil {
		if err == shard.ErrStopped { // the shard returns it unwrapped
			return nil, ErrProviderClosed
		}
		return nil, err
	}
	if !out.Granted {
		if r.HolderSeen && opts.OnHeld != nil {
			opts.OnHeld(p.holder(r.Holder))
		}
		return nil, nil
	}
	return (*memoryLease)(out.Grant()), nil
}

// AcquireSet acquires every key of keys, all or none (MultiLockProvider;
// AcquireAll and a Lock with LockOptions.Keys call it): one key at a time,
// each from its shard as Acquire does, in sorted order (see
// shard.Group.AcquireAll), with one timer for the whole set. It returns
// what Acquire returns, for the set; whenever it returns no lease, none of
// the keys is held, and each is left as if the call had never been made.
// The lease's keys are in sorted order, each with its own fencing token.
func (p *MemoryLockProvider) AcquireSet(ctx context.Context, keys []string, opts LockAcquireOptions) (*SetLease, error) {
	if err := ValidateSet(keys, opts); err != nil {
		return nil, err
	}
	if ctx == nil || p == nil || p.group == nil || p.closed.Load() {
		return nil, p.refuse(ctx, keys[0], &opts)
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	mode := shard.Wait
	var timeout <-chan time.Time
	switch {
	case opts.Timeout == NoWait:
		mode = shard.Try
	case opts.Timeout > 0 && clock.IsSystem(opts.Clock):
		t := p.startTimer(opts.Timeout)
		defer p.stopTimer(t)
		timeout = t.C
	case opts.Timeout > 0:
		ch := make(chan time.Time, 1) // one fire, never blocks the clock
		defer opts.Clock.AfterFunc(opts.Timeout, func() { ch <- time.Time{} })()
		timeout = ch
	}
	r := shard.Request{Label: opts.Owner}
	order, grants, err := p.group.AcquireAll(ctx, keys, &r, mode, timeout)
	if err == shard.ErrStopped {
		return nil, ErrProviderClosed
	}
	if err != nil {
		return nil, err
	}
	if grants == nil {
		if r.HolderSeen && opts.OnHeld != nil {
			opts.OnHeld(p.holder(r.Holder))
		}
		return nil, nil
	}
	leases := make([]LockLease, len(grants))
	for i, g := range grants {
		leases[i] = (*memoryLease)(g)
	}
	return NewSetLease(order, leases), nil
}

// DeadlockDetector returns the provider's detector, which the Lock step
// reports holding waits to (see DeadlockDetectingProvider): one goroutine
// beside the shards, stopped by Close.
func (p *MemoryLockProvider) DeadlockDetector() *DeadlockDetector { return p.cycles }

// SupportsShared reports true: Acquire honours LockAcquireOptions.Shared
// and Permits (read/write locks and N permits per key; see
// SharedLockProvider). Sets (AcquireSet) are exclusive only.
func (p *MemoryLockProvider) SupportsShared() bool { return true }

// startTimer returns a running timer from the pool. Pooling is safe since
// Go 1.23's timers (go.mod says 1.25): after Stop, no stale tick is ever
// received from C (and stopTimer pools only timers whose Stop reported true).
func (p *MemoryLockProvider) startTimer(d time.Duration) *time.Timer {
	if t, ok := p.timers.Get().(*time.Timer); ok {
		t.Reset(d)
		return t
	}
	return time.NewTimer(d)
}

func (p *MemoryLockProvider) stopTimer(t *time.Timer) {
	// Only a timer whose Stop reports true goes back to the pool: one that
	// had not fired, or, with Go 1.23's timers, one whose tick nobody
	// received, which Stop discards. With GODEBUG=asynctimerchan=1 (the old
	// timers, which a program may still ask for; =2 behaves alike here),
	// Stop reports false once the timer fired, and its tick may land in C
	// later, even after a drain: pooled, the timer's next user would take
	// it for its own timeout. Timeouts that fire are the rare path.
	if t.Stop() {
		p.timers.Put(t)
	}
}

// Size is the number of keys held or waited for. It is exact once the
// shards have applied every message sent before the call: a Release of a
// key nobody waits for is uncounted when it returns, but a Release that
// hands the key to a waiter is a message, and right after one Size counts
// what the shard has applied so far. It is 0 when idle. It costs one atomic
// load per shard.
func (p *MemoryLockProvider) Size() int {
	p.mustBeMade("Size")
	return p.group.Size()
}

// mustBeMade panics, naming method, if p is the zero MemoryLockProvider
// (declared, not made by NewMemoryLockProvider): it has no shards.
func (p *MemoryLockProvider) mustBeMade(method string) {
	if p == nil {
		panic("tenace: MemoryLockProvider." + method + " on a nil *MemoryLockProvider: make one with NewMemoryLockProvider, or use DefaultLockProvider()")
	}
	if p.group == nil {
		panic("tenace: MemoryLockProvider." + method + " on a MemoryLockProvider that NewMemoryLockProvider did not make (its zero value has no shards): use NewMemoryLockProvider, or DefaultLockProvider()")
	}
}

// Stats reports the provider's locks from the counts the shards publish —
// atomic loads, no message: Held is Size (the keys held; a key waited for is
// held), Waiting the callers queued, LongestQueue the most queued for one
// key; and by mode, SharedKeys the keys held shared, SharedHolders their
// shared leases (the permits in use), SharedWaiting the callers queued for
// a shared lease. Like Size, it is exact once the shards have applied every
// message sent before the call — a shared lease's Release is a message, so
// right after one the shared counts may still include it — and all zero
// when idle; it is safe for concurrent use and never waits for a shard.
func (p *MemoryLockProvider) Stats() LockStats {
	p.mustBeMade("Stats")
	var st LockStats
	for i := range p.group.Shards() {
		s := p.group.Shard(i)
		held := s.Size()
		waiting, longest := s.Waiting()
		sharedKeys, sharedHolders, sharedWaiting := s.SharedStats()
		st.Held += held
		st.Waiting += waiting
		st.LongestQueue = max(st.LongestQueue, longest)
		// Size is the table's own count, the others the shard's last
		// batch's: a shared key freed in the batch running now is off
		// Size already. The parts never exceed their wholes.
		st.SharedKeys += min(sharedKeys, held)
		st.SharedHolders += sharedHolders
		st.SharedWaiting += min(sharedWaiting, waiting)
	}
	return st
}

// Close stops the provider: every waiter fails with ErrProviderClosed, later
// Acquires fail the same way, leases already granted become no-ops, and the
// shard goroutines have exited when Close returns — every Close, also one
// called while another is still stopping the shards. It is idempotent. On
// DefaultLockProvider() it returns an error and changes nothing.
func (p *MemoryLockProvider) Close() error {
	p.mustBeMade("Close")
	if p.isDefault {
		return errDefaultClose
	}
	p.closed.Store(true)
	p.group.Stop() // every call waits for the shards to exit, not only the first
	p.cycles.Close()
	return nil
}

// sync returns once every shard has applied every message sent before the
// call: after it, Size is exact. For tests.
func (p *MemoryLockProvider) sync(ctx context.Context) error { return p.group.Sync(ctx) }

// memoryLease is a MemoryLockProvider grant: the shard's Grant, under the
// methods of a lease.
type memoryLease shard.Grant

var (
	_ FencedLease        = (*memoryLease)(nil)
	_ contextFreeRelease = (*memoryLease)(nil)
)

// Release releases the grant. It never fails and never waits for the shard
// (ctx is not needed): when nobody waits for the key it is one
// compare-and-swap, and the key is free and uncounted by Size when Release
// returns; when someone waits it is a message on the shard's mailbox, which
// blocks only while that mailbox is full (see shard.Grant.Release). What the
// calling goroutine does next on the key is ordered after it. A second call
// changes nothing: the grant it names is no longer current (a release to
// waiters' cost).
func (l *memoryLease) Release(context.Context) error {
	(*shard.Grant)(l).Release()
	return nil
}

// releaseIgnoresContext marks the lease as a contextFreeRelease.
func (*memoryLease) releaseIgnoresContext() {}

// Token is the grant's fencing token.
func (l *memoryLease) Token() uint64 { return (*shard.Grant)(l).Token() }

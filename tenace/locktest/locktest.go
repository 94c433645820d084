// Package locktest checks a tenace.LockProvider against the provider
// contract, the way testing/fstest checks an fs.FS: a provider's own tests
// prove it in one call.
//
//	func TestConformance(t *testing.T) {
//		locktest.Run(t, func(t *testing.T) tenace.LockProvider {
//			p := myprovider.New(...)
//			t.Cleanup(func() { p.Close() })
//			return p
//		}, locktest.Capabilities{Fencing: true, Losable: true, TTL: true})
//	}
//
// Run checks every row of the contract of tenace.LockProvider (granted, not
// granted in time, NoWait, ctx ended on entry and while waiting, bad input),
// mutual exclusion under contention, that nothing is left held after
// timeouts and cancels, a cancel racing a grant, Release idempotent and
// retryable, a Policy's Lock step on the provider, sets of keys through
// tenace.AcquireAll (bad input, all or nothing, exclusion between sets named
// in opposite orders, which must never deadlock: through the provider's
// AcquireSet, or the generic path for a provider without one); and, where the
// Capabilities say the provider promises them, FIFO, exact statistics,
// fencing tokens, TTL, the lost-lease signal, Close, locks shared by
// provider values on one server, and shared locks: read/write and N permits
// per key. For a provider that implements tenace.Inspector, it checks
// Inspect and List: a held key shows its holder with the grant's owner
// label, a shared key each of its holders, a waiter appears (with
// InspectWaiters), a release empties the key, List pages under a prefix
// cover every held key exactly once, hostile keys (invalid UTF-8,
// "<script>") come back byte for byte, and after Close both are errors.
//
// Every provider takes a Timeout of any size: HugeTimeout passes 400 days
// and math.MaxInt64, longer than any server's own bound on a wait, which
// must grant a free key at once and wait on a held one.
//
// Every provider times a Timeout on LockAcquireOptions.Clock:
// TimeoutOnClock passes a manual clock set in the real past, which must
// neither keep a free key from being granted (a clock's deadline is not a
// server call's) nor let real time end a wait the clock has not ended.
//
// The suite runs against real time (a distributed provider's server has no
// fake clock), with short timeouts: its waits are bounded, and only where
// timing is the point (a Timeout that must pass) does it wait for time. Each
// subtest asks newProvider for a provider and uses keys of its own, so
// providers that share one server across subtests do not see each other's
// keys.
package locktest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"tenace.dev/tenace"
	"tenace.dev/tenace/internal/fakeclock"
)

// Capabilities is what a provider promises beyond the contract every
// provider keeps. Leave a field false when the provider does not promise it;
// the suite then does not check it.
type Capabilities struct {
	// FIFO: waiters of one provider value are granted in arrival order. The
	// provider must implement tenace.StatsProvider and count a waiter in
	// Waiting only once its place in the queue is fixed, so that the suite
	// can tell that a waiter has arrived before starting the next.
	FIFO bool
	// ExactStats: the provider implements tenace.StatsProvider, and its
	// Stats are exact once the provider has settled: Held and Waiting are 0
	// when nothing is held or waited for, Held is 1 while one key is held.
	ExactStats bool
	// Fencing: leases are tenace.FencedLease, and a key's tokens strictly
	// increase, grant after grant.
	Fencing bool
	// Losable: leases are tenace.LosableLease.
	Losable bool
	// TTL: LockAcquireOptions.TTL caps the hold: at most TTL after the grant
	// the lease is lost with tenace.ErrLeaseExpired, and the key can be
	// granted to someone else.
	TTL bool
	// MinTTL is the shortest TTL the suite may ask for (a provider whose
	// TTL has a coarse resolution sets it); 0 means 200ms.
	MinTTL time.Duration
	// Lose, if set, makes l be lost from outside the provider, as a fault
	// would (delete its server-side key, terminate its connection): the
	// suite then checks the lost signal, that fn's context ends through a
	// Lock, and that a stale Release never touches the next holder. It needs
	// Losable.
	Lose func(t *testing.T, l tenace.LockLease)
	// Close: the provider implements io.Closer. Close makes the callers
	// waiting in Acquire and every later Acquire fail with an error
	// wrapping tenace.ErrProviderClosed, loses the leases still held (with
	// Losable), and a second Close returns nil.
	Close bool
	// Shared: the providers newProvider returns within one subtest lock the
	// same keys, as processes sharing one server do: a key held through one
	// is held for all, a release through one grants a waiter of another,
	// and (with Fencing) a key's tokens keep increasing from one provider
	// value to the next, also once the first is closed and a new one made,
	// as after a restart.
	Shared bool
	// ReadWrite: the provider implements tenace.SharedLockProvider and
	// honours LockAcquireOptions.Shared with Permits 0: readers hold a key
	// together, a writer (Shared false) alone; with FIFO, a waiting writer
	// is not overtaken by a reader that arrives after it.
	ReadWrite bool
	// Permits: the provider implements tenace.SharedLockProvider and
	// honours Permits N > 0: never more than N shared holders of a key
	// (and, with ReadWrite, never a writer beside them), and the permit of
	// a waiter that timed out or was cancelled comes back.
	Permits bool
	// InspectWaiters: the provider implements tenace.Inspector and its
	// Inspect counts a caller of this provider value waiting for a key
	// (KeyInfo.Waiting), and forgets it once it gave up. Every provider that
	// implements tenace.Inspector is checked for its holders and List
	// without it.
	InspectWaiters bool
	// WaitBound is the longest the suite waits for something that must
	// happen (a grant after a release, a lost signal) before it fails; 0
	// means 10s.
	WaitBound time.Duration
}

// Run checks the provider that newProvider returns against the contract,
// each rule in a subtest of its own. newProvider is called once per subtest;
// it should register the provider's cleanup with t.Cleanup.
func Run(t *testing.T, newProvider func(t *testing.T) tenace.LockProvider, caps Capabilities) {
	t.Helper()
	if caps.WaitBound <= 0 {
		caps.WaitBound = 10 * time.Second
	}
	if caps.MinTTL <= 0 {
		caps.MinTTL = 200 * time.Millisecond
	}
	s := &suite{newProvider: newProvider, caps: caps}
	tests := []struct {
		name string
		run  func(t *testing.T)
		need bool
	}{
		{"Granted", s.granted, true},
		{"NotGrantedInTime", s.notGrantedInTime, true},
		{"TimeoutOnClock", s.timeoutOnClock, true},
		{"NoWait", s.noWait, true},
		{"ContextEndedOnEntry", s.ctxEndedOnEntry, true},
		{"ContextEndsWhileWaiting", s.ctxEndsWhileWaiting, true},
		{"BadInput", s.badInput, true},
		{"GrantAfterRelease", s.grantAfterRelease, true},
		{"HugeTimeout", s.hugeTimeout, true},
		{"ReleaseIdempotent", s.releaseIdempotent, true},
		{"ReleaseRetryable", s.releaseRetryable, true},
		{"MutualExclusion", s.mutualExclusion, true},
		{"NoLeakAfterTimeoutsAndCancels", s.noLeak, true},
		{"CancelRacingGrant", s.cancelRacingGrant, true},
		{"DistinctKeysIndependent", s.distinctKeys, true},
		{"Policy", s.policy, true},
		{"SetBadInput", s.setBadInput, true},
		{"SetAllOrNothing", s.setAllOrNothing, true},
		{"SetExclusion", s.setExclusion, true},
		{"SetPathsAgree", s.setPathsAgree, true},
		{"FIFO", s.fifo, caps.FIFO},
		{"ExactStats", s.exactStats, caps.ExactStats},
		{"FencingTokens", s.fencing, caps.Fencing},
		{"LosableLease", s.losable, caps.Losable},
		{"TTL", s.ttl, caps.TTL},
		{"LostSignal", s.lost, caps.Lose != nil},
		{"StaleReleaseAfterLoss", s.staleRelease, caps.Lose != nil || caps.TTL},
		{"Close", s.close, caps.Close},
		{"SharedBetweenProviders", s.shared, caps.Shared},
		{"SharedLockSupport", s.sharedSupport, caps.ReadWrite || caps.Permits},
		{"ReadWrite", s.readWrite, caps.ReadWrite},
		{"ReadWriteFIFO", s.writerNotOvertaken, caps.ReadWrite && caps.FIFO},
		{"Permits", s.permits, caps.Permits},
		{"PermitBackAfterGiveUp", s.permitBack, caps.Permits},
		{"PermitBackAfterLoss", s.permitBackAfterLoss, caps.Permits && caps.Lose != nil},
		{"ReaderLost", s.readerLost, caps.ReadWrite && caps.Lose != nil},
		{"SharedRefused", s.sharedRefused, !caps.ReadWrite && !caps.Permits},
		{"InspectHeld", s.inspectHeld, true},
		{"InspectWaiter", s.inspectWaiter, caps.InspectWaiters},
		{"InspectShared", s.inspectShared, caps.ReadWrite || caps.Permits},
		{"List", s.list, true},
		{"InspectAfterClose", s.inspectClosed, caps.Close},
	}
	for _, tc := range tests {
		if !tc.need {
			continue
		}
		t.Run(tc.name, tc.run)
	}
}

type suite struct {
	newProvider func(t *testing.T) tenace.LockProvider
	caps        Capabilities
	keys        atomic.Uint64
}

// key returns a key no other subtest of this process uses.
func (s *suite) key(t *testing.T) string {
	return fmt.Sprintf("locktest/%s/%d/%d", t.Name(), time.Now().UnixNano(), s.keys.Add(1))
}

// ctx is a context bounded by WaitBound, so that a provider that hangs
// fails the test instead of the whole run.
func (s *suite) ctx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 4*s.caps.WaitBound)
	t.Cleanup(cancel)
	return ctx
}

// mustAcquire acquires key with opts and fails the test if it is not granted.
func (s *suite) mustAcquire(t *testing.T, p tenace.LockProvider, key string, opts tenace.LockAcquireOptions) tenace.LockLease {
	t.Helper()
	l, err := p.Acquire(s.ctx(t), key, opts)
	if err != nil {
		t.Fatalf("Acquire(%q, %+v): unexpected error %v", key, opts, err)
	}
	if l == nil {
		t.Fatalf("Acquire(%q, %+v) = (nil, nil): not granted, want a lease", key, opts)
	}
	return l
}

// mustRelease releases l and fails the test on an error.
func mustRelease(t *testing.T, l tenace.LockLease) {
	t.Helper()
	if err := l.Release(context.Background()); err != nil {
		t.Fatalf("Release: %v", err)
	}
}

// assertFree checks that key can be taken at once, then gives it back.
func (s *suite) assertFree(t *testing.T, p tenace.LockProvider, key, why string) {
	t.Helper()
	l, err := p.Acquire(s.ctx(t), key, tenace.LockAcquireOptions{Timeout: tenace.NoWait})
	if err != nil {
		t.Fatalf("%s: NoWait Acquire: %v", why, err)
	}
	if l == nil {
		t.Fatalf("%s: the key is still held (a NoWait Acquire was not granted)", why)
	}
	mustRelease(t, l)
}

// assertHeld checks that key cannot be taken at once.
func (s *suite) assertHeld(t *testing.T, p tenace.LockProvider, key, why string) {
	t.Helper()
	l, err := p.Acquire(s.ctx(t), key, tenace.LockAcquireOptions{Timeout: tenace.NoWait})
	if err != nil {
		t.Fatalf("%s: NoWait Acquire: %v", why, err)
	}
	if l != nil {
		_ = l.Release(context.Background())
		t.Fatalf("%s: a NoWait Acquire was granted while the key should be held", why)
	}
}

type result struct {
	lease tenace.LockLease
	err   error
}

// acquireAsync starts an Acquire in a goroutine; the channel gets its result.
func acquireAsync(ctx context.Context, p tenace.LockProvider, key string, opts tenace.LockAcquireOptions) <-chan result {
	ch := make(chan result, 1) // one result, never blocks the goroutine
	go func() {
		l, err := p.Acquire(ctx, key, opts)
		ch <- result{l, err}
	}()
	return ch
}

// wait receives from ch within WaitBound.
func (s *suite) wait(t *testing.T, ch <-chan result, what string) result {
	t.Helper()
	select {
	case r := <-ch:
		return r
	case <-time.After(s.caps.WaitBound):
		t.Fatalf("%s: no answer within %v", what, s.caps.WaitBound)
		return result{}
	}
}

func (s *suite) granted(t *testing.T) {
	p := s.newProvider(t)
	key := s.key(t)
	for _, opts := range []tenace.LockAcquireOptions{
		{},
		{Timeout: tenace.NoWait},
		{Timeout: time.Minute},
		{TTL: time.Minute},
	} {
		l := s.mustAcquire(t, p, key, opts)
		mustRelease(t, l)
	}
}

func (s *suite) notGrantedInTime(t *testing.T) {
	p := s.newProvider(t)
	key := s.key(t)
	held := s.mustAcquire(t, p, key, tenace.LockAcquireOptions{})
	defer mustRelease(t, held)
	const timeout = 50 * time.Millisecond
	start := time.Now()
	// In a goroutine, so that a provider that ignores the Timeout fails
	// within WaitBound, not at the suite's ctx.
	r := s.wait(t, acquireAsync(s.ctx(t), p, key, tenace.LockAcquireOptions{Timeout: timeout}), "Acquire of a held key with a Timeout")
	d := time.Since(start)
	if r.err != nil || r.lease != nil {
		t.Fatalf("Acquire of a held key with Timeout %v = (%v, %v), want (nil, nil)", timeout, r.lease, r.err)
	}
	if d < timeout {
		t.Fatalf("Acquire with Timeout %v gave up after %v, before its timeout", timeout, d)
	}
	// Ended by its own Timeout, not by the key becoming free: still held.
	s.assertHeld(t, p, key, "after a waiter's Timeout passed")
}

// timeoutOnClock: a Timeout is timed on opts.Clock, and only the Timeout.
// The manual clock stands in the real past (2026-01-01), so a provider that
// passed the clock's deadline on to its server calls (as a socket deadline)
// would fail the free key's Acquire at once.
func (s *suite) timeoutOnClock(t *testing.T) {
	p := s.newProvider(t)
	key := s.key(t)
	c := fakeclock.New()
	held := s.mustAcquire(t, p, key, tenace.LockAcquireOptions{Timeout: time.Hour, Clock: c})
	defer mustRelease(t, held)

	const timeout = 20 * time.Millisecond
	before := c.Pending()
	ch := acquireAsync(s.ctx(t), p, key, tenace.LockAcquireOptions{Timeout: timeout, Clock: c})
	s.eventually(t, "the waiter's Timeout registered on its clock (Clock.AfterFunc)", func() bool { return c.Pending() > before })
	// Real time passes and the clock does not: the waiter waits. (A
	// bounded real wait: that real time does not end it is the point.)
	wait := time.NewTimer(5 * timeout)
	select {
	case r := <-ch:
		wait.Stop()
		t.Fatalf("a waiter whose Timeout (%v) runs on a clock that did not move returned (%v, %v) in real time: a Timeout must be timed on LockAcquireOptions.Clock", timeout, r.lease, r.err)
	case <-wait.C:
	}
	c.Advance(timeout)
	r := s.wait(t, ch, "waiter once its clock passed its Timeout")
	if r.err != nil || r.lease != nil {
		t.Fatalf("Acquire of a held key once its clock passed its Timeout = (%v, %v), want (nil, nil)", r.lease, r.err)
	}
	s.assertHeld(t, p, key, "after a waiter's Timeout passed on its clock")
}

func (s *suite) noWait(t *testing.T) {
	p := s.newProvider(t)
	key := s.key(t)
	held := s.mustAcquire(t, p, key, tenace.LockAcquireOptions{Timeout: tenace.NoWait})
	// A NoWait try on a held key fails at once; no Timeout or ctx deadline
	// bounds it here, so a provider that waited would fail the suite's
	// WaitBound.
	ch := acquireAsync(s.ctx(t), p, key, tenace.LockAcquireOptions{Timeout: tenace.NoWait})
	if r := s.wait(t, ch, "NoWait Acquire of a held key"); r.err != nil || r.lease != nil {
		t.Fatalf("NoWait Acquire of a held key = (%v, %v), want (nil, nil)", r.lease, r.err)
	}
	mustRelease(t, held)
	s.assertFree(t, p, key, "after the holder released")
}

func (s *suite) ctxEndedOnEntry(t *testing.T) {
	p := s.newProvider(t)
	key := s.key(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	for _, opts := range []tenace.LockAcquireOptions{{}, {Timeout: tenace.NoWait}, {Timeout: time.Second}} {
		l, err := p.Acquire(ctx, key, opts)
		if l != nil {
			t.Fatalf("Acquire with an ended ctx (%+v) granted a lease", opts)
		}
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("Acquire with an ended ctx (%+v) = %v, want context.Canceled", opts, err)
		}
	}
	s.assertFree(t, p, key, "after Acquires with an ended ctx")
}

func (s *suite) ctxEndsWhileWaiting(t *testing.T) {
	p := s.newProvider(t)
	key := s.key(t)
	held := s.mustAcquire(t, p, key, tenace.LockAcquireOptions{})

	// Deadline: the outcome is the same whether the deadline passes before
	// or after the waiter queued, so no handshake is needed. With a Timeout
	// too, one that has not passed: ctx's deadline is not the Timeout, and
	// its end is ctx's error, not (nil, nil).
	for _, timeout := range []time.Duration{0, time.Hour} {
		dctx, dcancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		r := s.wait(t, acquireAsync(dctx, p, key, tenace.LockAcquireOptions{Timeout: timeout}), "Acquire with a deadline")
		dcancel()
		if r.lease != nil || !errors.Is(r.err, context.DeadlineExceeded) {
			t.Fatalf("Acquire (Timeout %v) whose ctx deadline passed while waiting = (%v, %v), want context.DeadlineExceeded", timeout, r.lease, r.err)
		}
	}
	// Cancel, with a Timeout that has not passed: ctx's error, not (nil, nil).
	cctx, ccancel := context.WithCancel(context.Background())
	ch := acquireAsync(cctx, p, key, tenace.LockAcquireOptions{Timeout: time.Hour})
	ccancel()
	r := s.wait(t, ch, "cancelled Acquire")
	if r.lease != nil || !errors.Is(r.err, context.Canceled) {
		t.Fatalf("Acquire cancelled while waiting = (%v, %v), want context.Canceled", r.lease, r.err)
	}
	mustRelease(t, held)
	s.assertFree(t, p, key, "after the waiters gave up and the holder released")
}

func (s *suite) badInput(t *testing.T) {
	p := s.newProvider(t)
	ctx := s.ctx(t)
	check := func(what string, l tenace.LockLease, err, want error) {
		t.Helper()
		if l != nil {
			t.Fatalf("%s: granted a lease", what)
		}
		if !errors.Is(err, want) {
			t.Fatalf("%s: error %v, want one wrapping %v", what, err, want)
		}
	}
	l, err := p.Acquire(ctx, "", tenace.LockAcquireOptions{})
	check("empty key", l, err, tenace.ErrMissingKey)
	key := s.key(t)
	l, err = p.Acquire(ctx, key, tenace.LockAcquireOptions{Timeout: -2 * time.Second})
	check("negative Timeout", l, err, tenace.ErrInvalidOption)
	l, err = p.Acquire(ctx, key, tenace.LockAcquireOptions{TTL: -time.Second})
	check("negative TTL", l, err, tenace.ErrInvalidOption)
	s.assertFree(t, p, key, "after refused Acquires")
}

// grantAfterRelease: a waiter is granted the key once its holder releases
// it, within WaitBound — also a waiter with a Timeout, which must wait for
// the release, not only try again when its Timeout ends (an hour here, and
// the huge Timeouts of hugeTimeouts).
// With ExactStats the release waits until the waiter counts as waiting, so
// that it meets a waiter, not one still on its way to a first try.
func (s *suite) grantAfterRelease(t *testing.T) {
	p := s.newProvider(t)
	key := s.key(t)
	sp := s.statsIfExact(t, p)
	for _, timeout := range append([]time.Duration{0, time.Hour}, hugeTimeouts...) {
		held := s.mustAcquire(t, p, key, tenace.LockAcquireOptions{})
		ch := acquireAsync(s.ctx(t), p, key, tenace.LockAcquireOptions{Timeout: timeout})
		s.waiterCounted(t, sp)
		select {
		case r := <-ch:
			t.Fatalf("a waiter (Timeout %v) returned (%v, %v) while the key was held", timeout, r.lease, r.err)
		default:
		}
		mustRelease(t, held)
		r := s.wait(t, ch, fmt.Sprintf("waiter (Timeout %v) after the release", timeout))
		if r.err != nil || r.lease == nil {
			t.Fatalf("waiter (Timeout %v) after the release = (%v, %v), want a lease", timeout, r.lease, r.err)
		}
		mustRelease(t, r.lease)
	}
}

// hugeTimeouts are Timeouts longer than any server's own bound on a wait
// (PostgreSQL's lock_timeout ends at about 24.8 days, for one): each is
// valid, and waits as long as it says or until the key is granted.
var hugeTimeouts = []time.Duration{400 * 24 * time.Hour, math.MaxInt64}

// hugeTimeout: a Timeout of any size is a Timeout — math.MaxInt64 too. On
// a free key it grants at once (exclusive, shared, with permits, a set);
// on a held key it waits until its ctx ends (and until the release grants
// it: grantAfterRelease). A provider that passes the Timeout to its server
// as is may see it refused there, or overflow it into the past: neither
// may show.
func (s *suite) hugeTimeout(t *testing.T) {
	p := s.newProvider(t)
	key := s.key(t)
	sp := s.statsIfExact(t, p)
	for _, timeout := range hugeTimeouts {
		free := []tenace.LockAcquireOptions{{Timeout: timeout}, {Timeout: timeout, TTL: time.Minute}}
		if s.caps.ReadWrite {
			free = append(free, tenace.LockAcquireOptions{Timeout: timeout, Shared: true})
		}
		if s.caps.Permits {
			free = append(free, tenace.LockAcquireOptions{Timeout: timeout, Shared: true, Permits: 2})
		}
		for _, opts := range free {
			mustRelease(t, s.mustAcquire(t, p, key, opts))
		}
		keys := s.keySet(t, 2)
		set, err := tenace.AcquireAll(s.ctx(t), p, keys, tenace.LockAcquireOptions{Timeout: timeout})
		if err != nil || set == nil {
			t.Fatalf("AcquireAll of free keys with Timeout %v = (%v, %v), want a lease", timeout, set, err)
		}
		if err := set.Release(s.ctx(t)); err != nil {
			t.Fatalf("Release of a set: %v", err)
		}

		held := s.mustAcquire(t, p, key, tenace.LockAcquireOptions{})
		cctx, cancel := context.WithCancel(context.Background())
		ch := acquireAsync(cctx, p, key, tenace.LockAcquireOptions{Timeout: timeout})
		s.waiterCounted(t, sp)
		cancel()
		if c := s.wait(t, ch, "cancelled waiter with a huge Timeout"); c.lease != nil || !errors.Is(c.err, context.Canceled) {
			t.Fatalf("waiter (Timeout %v) whose ctx was cancelled = (%v, %v), want context.Canceled", timeout, c.lease, c.err)
		}
		mustRelease(t, held)
		s.assertFree(t, p, key, fmt.Sprintf("after the waiters with Timeout %v", timeout))
	}
}

func (s *suite) releaseIdempotent(t *testing.T) {
	p := s.newProvider(t)
	key := s.key(t)
	l := s.mustAcquire(t, p, key, tenace.LockAcquireOptions{})
	mustRelease(t, l)
	next := s.mustAcquire(t, p, key, tenace.LockAcquireOptions{Timeout: tenace.NoWait})
	if err := l.Release(context.Background()); err != nil {
		t.Fatalf("second Release of a released lease = %v, want nil", err)
	}
	s.assertHeld(t, p, key, "a second Release of an old lease must not release the next holder")
	mustRelease(t, next)
	s.assertFree(t, p, key, "after the next holder released")
}

// releaseRetryable releases with a context that has already ended: the
// provider may release anyway (nil), or fail — and then a second Release
// with a live context must succeed. Either way the key is granted to the
// next caller: a failed Release can be retried, and leaves nothing held.
func (s *suite) releaseRetryable(t *testing.T) {
	p := s.newProvider(t)
	key := s.key(t)
	l := s.mustAcquire(t, p, key, tenace.LockAcquireOptions{})
	ended, cancel := context.WithCancel(context.Background())
	cancel()
	if err := l.Release(ended); err != nil {
		if err := l.Release(context.Background()); err != nil {
			t.Fatalf("Release with an ended ctx failed, and the retry with a live ctx = %v, want nil", err)
		}
	}
	next := s.mustAcquire(t, p, key, tenace.LockAcquireOptions{Timeout: s.caps.WaitBound})
	if err := l.Release(context.Background()); err != nil {
		t.Fatalf("Release of the old lease once the next holder has the key = %v, want nil", err)
	}
	s.assertHeld(t, p, key, "a late Release of an old lease must not release the next holder")
	mustRelease(t, next)
}

// intrusionWindow is how long mutualExclusion's first holder keeps the key
// once every worker has asked for it: a provider that lets a second holder
// in does so within microseconds; a correct one makes the test wait this
// long, once.
const intrusionWindow = 20 * time.Millisecond

func (s *suite) mutualExclusion(t *testing.T) {
	p := s.newProvider(t)
	key := s.key(t)
	const workers, rounds = 8, 25
	var inside, counter, asking atomic.Int64
	var first atomic.Bool
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	ctx := s.ctx(t)
	// With Shared, half the workers go through a second provider value:
	// exclusion holds between them too.
	providers := []tenace.LockProvider{p}
	if s.caps.Shared {
		providers = append(providers, s.newProvider(t))
	}
	for w := range workers {
		p := providers[w%len(providers)]
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range rounds {
				asking.Add(1)
				l, err := p.Acquire(ctx, key, tenace.LockAcquireOptions{})
				if err != nil || l == nil {
					errs <- fmt.Errorf("acquire = (%v, %v)", l, err)
					return
				}
				if n := inside.Add(1); n != 1 {
					errs <- fmt.Errorf("%d holders at once", n)
					_ = l.Release(context.Background())
					return // one error per worker: errs never fills
				}
				if first.CompareAndSwap(false, true) {
					// The first holder keeps the key while every other
					// worker asks for it, so that a second holder, if the
					// provider lets one in, is inside at the same time
					// whatever the scheduler does (the rounds below only
					// make an overlap likely). Polled: the only sign of a
					// correct provider here is that nothing happens.
					for deadline := time.Now().Add(s.caps.WaitBound); asking.Load() < workers && time.Now().Before(deadline); {
						time.Sleep(100 * time.Microsecond)
					}
					for deadline := time.Now().Add(intrusionWindow); inside.Load() == 1 && time.Now().Before(deadline); {
						time.Sleep(100 * time.Microsecond)
					}
				}
				// A read-modify-write with a yield inside: without
				// exclusion, updates are lost. (Atomics, so that the race
				// detector has nothing to say about providers whose
				// happens-before edge is a server, not Go.)
				v := counter.Load()
				runtime.Gosched()
				counter.Store(v + 1)
				inside.Add(-1)
				if err := l.Release(context.Background()); err != nil {
					errs <- fmt.Errorf("release: %v", err)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if n := counter.Load(); n != workers*rounds {
		t.Fatalf("counter %d after %d locked increments: updates were lost, so holders overlapped", n, workers*rounds)
	}
	s.assertFree(t, p, key, "after every worker released")
}

func (s *suite) noLeak(t *testing.T) {
	p := s.newProvider(t)
	key := s.key(t)
	held := s.mustAcquire(t, p, key, tenace.LockAcquireOptions{})
	var chans []<-chan result
	for i := range 10 {
		switch i % 3 {
		case 0:
			chans = append(chans, acquireAsync(s.ctx(t), p, key, tenace.LockAcquireOptions{Timeout: 20 * time.Millisecond}))
		case 1:
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
			t.Cleanup(cancel)
			chans = append(chans, acquireAsync(ctx, p, key, tenace.LockAcquireOptions{}))
		case 2:
			ctx, cancel := context.WithCancel(context.Background())
			chans = append(chans, acquireAsync(ctx, p, key, tenace.LockAcquireOptions{}))
			cancel()
		}
	}
	for i, ch := range chans {
		r := s.wait(t, ch, "a waiter that gives up")
		if r.lease != nil {
			t.Fatalf("waiter %d was granted while the key was held", i)
		}
		if i%3 == 0 && r.err != nil {
			t.Fatalf("waiter %d with a Timeout: error %v, want (nil, nil)", i, r.err)
		}
		if i%3 != 0 && r.err == nil {
			t.Fatalf("waiter %d whose ctx ended: no error, want ctx's error", i)
		}
	}
	mustRelease(t, held)
	// Free within WaitBound, not at once: a distributed provider may leave
	// a server call behind when it answers at the Timeout (a server slow to
	// reply), whose grant it gives back when the reply comes. A key kept
	// held is a leak.
	s.eventually(t, "the key free after the holder released, with every waiter gone", func() bool {
		return s.tryNow(t, p, key, tenace.LockAcquireOptions{})
	})
	if sp, ok := p.(tenace.StatsProvider); ok && s.caps.ExactStats {
		s.eventually(t, "Stats().Waiting == 0 after the waiters left", func() bool { return sp.Stats().Waiting == 0 })
	}
}

// cancelRacingGrant cancels a waiter at the moment the holder releases, many
// times: whoever wins, the key must be left free (or held by the waiter,
// which then releases it) — never held by nobody. With ExactStats the
// release and the cancel start only once the waiter counts as waiting, so
// that the cancel meets a waiter about to be granted rather than one still
// on its way in. The cancel comes in turn at once, once the Release has
// returned, and (with ExactStats) once the waiter no longer counts as
// waiting: the provider has granted it, and its Acquire may not have
// returned yet. The last makes the grant land first however the machine's
// load delays the goroutines, so that a provider that drops a grant whose
// ctx ended as it came back is caught on a busy machine too, where the
// cancel would otherwise win every time.
func (s *suite) cancelRacingGrant(t *testing.T) {
	p := s.newProvider(t)
	key := s.key(t)
	sp := s.statsIfExact(t, p)
	granted, gaveUp := 0, 0
	for i := range 50 {
		held := s.mustAcquire(t, p, key, tenace.LockAcquireOptions{})
		ctx, cancel := context.WithCancel(context.Background())
		ch := acquireAsync(ctx, p, key, tenace.LockAcquireOptions{})
		s.waiterCounted(t, sp)
		start, released := make(chan struct{}), make(chan struct{})
		go func() {
			<-start
			_ = held.Release(context.Background())
			close(released)
		}()
		close(start)
		if i%3 != 0 {
			// The cancel follows the Release's return: the release is then
			// on its way to the waiter (on a server's round trip, a grant
			// already made) when the cancel comes.
			<-released
		}
		if i%3 == 2 && sp != nil {
			// The cancel follows the grant: the waiter no longer counts as
			// waiting, and may not have seen its grant yet.
			s.eventually(t, "the waiter granted after the release (Stats().Waiting == 0)", func() bool { return sp.Stats().Waiting == 0 })
		}
		cancel()
		r := s.wait(t, ch, "a waiter cancelled as the lock is released")
		<-released
		switch {
		case r.lease != nil:
			granted++
			mustRelease(t, r.lease)
		case errors.Is(r.err, context.Canceled):
			gaveUp++
		default:
			t.Fatalf("waiter cancelled as the lock was released = (%v, %v), want a lease or context.Canceled", r.lease, r.err)
		}
		// Free within WaitBound, as in NoLeak: a distributed provider may
		// delete a cancelled waiter's server-side entry a moment after its
		// Acquire returned (etcdlock, when the cancel meets a request in
		// flight). A grant dropped on the floor stays held.
		s.eventually(t, "the key free after a cancel raced a grant", func() bool {
			return s.tryNow(t, p, key, tenace.LockAcquireOptions{})
		})
	}
	t.Logf("cancel racing a grant: granted %d, gave up %d", granted, gaveUp)
}

func (s *suite) distinctKeys(t *testing.T) {
	p := s.newProvider(t)
	a, b := s.key(t), s.key(t)
	la := s.mustAcquire(t, p, a, tenace.LockAcquireOptions{})
	lb := s.mustAcquire(t, p, b, tenace.LockAcquireOptions{Timeout: tenace.NoWait})
	mustRelease(t, la)
	mustRelease(t, lb)
}

func (s *suite) policy(t *testing.T) {
	p := s.newProvider(t)
	key := s.key(t)
	var events []string
	var mu sync.Mutex
	pol := tenace.NewPolicy().WithLock(tenace.LockOptions{Provider: p, Timeout: s.caps.WaitBound}).OnEvent(func(e tenace.Event) {
		if e.Name == tenace.EventLockAcquiring {
			return // the wait's start: what the provider did is acquired, then released
		}
		mu.Lock()
		events = append(events, e.Name)
		mu.Unlock()
	})
	ran := false
	err := pol.Execute(s.ctx(t), func(ctx context.Context) error {
		ran = true
		l, ok := tenace.LeaseFrom(ctx)
		if !ok || l == nil {
			return errors.New("LeaseFrom found no lease inside fn")
		}
		s.assertHeld(t, p, key, "inside fn")
		return nil
	}, tenace.WithKey(key))
	if err != nil || !ran {
		t.Fatalf("Execute = %v (ran %v), want nil and fn run", err, ran)
	}
	mu.Lock()
	got := fmt.Sprint(events)
	mu.Unlock()
	if want := fmt.Sprint([]string{tenace.EventLockAcquired, tenace.EventLockReleased}); got != want {
		t.Fatalf("events %s, want %s", got, want)
	}
	s.assertFree(t, p, key, "after Execute returned")

	held := s.mustAcquire(t, p, key, tenace.LockAcquireOptions{})
	defer mustRelease(t, held)
	err = tenace.NewPolicy().WithLock(tenace.LockOptions{Provider: p, Timeout: tenace.NoWait}).
		Execute(s.ctx(t), func(context.Context) error { t.Error("fn ran while the key was held"); return nil }, tenace.WithKey(key))
	var nae *tenace.LockNotAcquiredError
	if !errors.As(err, &nae) {
		t.Fatalf("Execute with NoWait on a held key = %v, want *LockNotAcquiredError", err)
	}
}

func (s *suite) stats(t *testing.T, p tenace.LockProvider) tenace.StatsProvider {
	t.Helper()
	sp, ok := p.(tenace.StatsProvider)
	if !ok {
		t.Fatalf("%T does not implement tenace.StatsProvider", p)
	}
	return sp
}

// statsIfExact is p as a StatsProvider when the provider promises exact
// statistics (ExactStats), else nil: what waiterCounted takes.
func (s *suite) statsIfExact(t *testing.T, p tenace.LockProvider) tenace.StatsProvider {
	t.Helper()
	if !s.caps.ExactStats {
		return nil
	}
	return s.stats(t, p)
}

// eventually waits, within WaitBound, for cond: for a state the provider
// reaches on its own once it settles (a shard applying its queued messages).
func (s *suite) eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(s.caps.WaitBound)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v", what, s.caps.WaitBound)
		}
		time.Sleep(time.Millisecond)
	}
}

// waiterCounted waits until sp counts a waiter (Stats().Waiting >= 1), so
// that what follows meets a queued waiter rather than one on its way in;
// with a nil sp (no ExactStats) it returns at once.
func (s *suite) waiterCounted(t *testing.T, sp tenace.StatsProvider) {
	t.Helper()
	if sp != nil {
		s.eventually(t, "the waiter counted in Stats().Waiting", func() bool { return sp.Stats().Waiting >= 1 })
	}
}

func (s *suite) fifo(t *testing.T) {
	p := s.newProvider(t)
	sp := s.stats(t, p)
	key := s.key(t)
	held := s.mustAcquire(t, p, key, tenace.LockAcquireOptions{})
	const n = 5
	base := sp.Stats().Waiting
	order := make(chan int, n)
	var wg sync.WaitGroup
	ctx := s.ctx(t)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			l, err := p.Acquire(ctx, key, tenace.LockAcquireOptions{})
			if err != nil || l == nil {
				t.Errorf("waiter %d: (%v, %v)", i, l, err)
				order <- -1
				return
			}
			order <- i
			_ = l.Release(context.Background())
		}()
		// The next waiter starts only once this one is in the queue.
		s.eventually(t, fmt.Sprintf("waiter %d queued", i), func() bool { return sp.Stats().Waiting >= base+i+1 })
	}
	mustRelease(t, held)
	wg.Wait()
	close(order)
	want := 0
	for got := range order {
		if got != want {
			t.Fatalf("waiter %d was granted in place %d: not arrival order", got, want)
		}
		want++
	}
}

func (s *suite) exactStats(t *testing.T) {
	p := s.newProvider(t)
	sp := s.stats(t, p)
	idle := func() bool { st := sp.Stats(); return st.Held == 0 && st.Waiting == 0 && st.LongestQueue == 0 }
	s.eventually(t, "Stats zero on a new provider", idle)
	key := s.key(t)
	held := s.mustAcquire(t, p, key, tenace.LockAcquireOptions{})
	s.eventually(t, "Stats().Held == 1 while one key is held", func() bool { return sp.Stats().Held == 1 })
	ctx, cancel := context.WithCancel(context.Background())
	ch1 := acquireAsync(ctx, p, key, tenace.LockAcquireOptions{})
	ch2 := acquireAsync(ctx, p, key, tenace.LockAcquireOptions{})
	s.eventually(t, "Stats {Held 1, Waiting 2, LongestQueue 2} with two waiters", func() bool {
		st := sp.Stats()
		return st.Held == 1 && st.Waiting == 2 && st.LongestQueue == 2
	})
	cancel()
	s.wait(t, ch1, "cancelled waiter")
	s.wait(t, ch2, "cancelled waiter")
	mustRelease(t, held)
	s.eventually(t, "Stats zero once idle", idle)
}

func (s *suite) fencing(t *testing.T) {
	p := s.newProvider(t)
	key := s.key(t)
	var last uint64
	next := func(l tenace.LockLease) {
		t.Helper()
		f, ok := l.(tenace.FencedLease)
		if !ok {
			t.Fatalf("lease %T is not a tenace.FencedLease", l)
		}
		if tok := f.Token(); tok <= last {
			t.Fatalf("token %d after %d: not strictly increasing", tok, last)
		} else {
			last = tok
		}
	}
	for range 5 {
		l := s.mustAcquire(t, p, key, tenace.LockAcquireOptions{})
		next(l)
		mustRelease(t, l)
	}
	// Under contention: grants in the order they happen, tokens in the same
	// order. Each holder records its token before releasing.
	var mu sync.Mutex
	var tokens []uint64
	var wg sync.WaitGroup
	ctx := s.ctx(t)
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 5 {
				l, err := p.Acquire(ctx, key, tenace.LockAcquireOptions{})
				if err != nil || l == nil {
					t.Errorf("Acquire = (%v, %v)", l, err)
					return
				}
				mu.Lock()
				tokens = append(tokens, l.(tenace.FencedLease).Token())
				mu.Unlock()
				_ = l.Release(context.Background())
			}
		}()
	}
	wg.Wait()
	for i, tok := range tokens {
		if tok <= last {
			t.Fatalf("grant %d under contention has token %d after %d: not strictly increasing", i, tok, last)
		}
		last = tok
	}
}

func (s *suite) losable(t *testing.T) {
	p := s.newProvider(t)
	l := s.mustAcquire(t, p, s.key(t), tenace.LockAcquireOptions{})
	ll, ok := l.(tenace.LosableLease)
	if !ok {
		t.Fatalf("lease %T is not a tenace.LosableLease", l)
	}
	if first, again := ll.Lost(), ll.Lost(); first != again {
		t.Fatal("Lost returns a different channel on each call")
	}
	select {
	case <-ll.Lost():
		t.Fatalf("a fresh lease is already lost: %v", ll.Err())
	default:
	}
	if err := ll.Err(); err != nil {
		t.Fatalf("a fresh lease's Err = %v, want nil", err)
	}
	mustRelease(t, l)
	if err := ll.Err(); err != nil {
		t.Fatalf("Err after a normal Release = %v, want nil", err)
	}
}

// waitLost waits, within WaitBound, for l to be lost, and checks its Err.
func (s *suite) waitLost(t *testing.T, l tenace.LockLease, want error) {
	t.Helper()
	ll, ok := l.(tenace.LosableLease)
	if !ok {
		t.Fatalf("lease %T is not a tenace.LosableLease", l)
	}
	select {
	case <-ll.Lost():
	case <-time.After(s.caps.WaitBound):
		t.Fatalf("the lease was not reported lost within %v", s.caps.WaitBound)
	}
	if err := ll.Err(); !errors.Is(err, want) {
		t.Fatalf("lost lease's Err = %v, want one wrapping %v", err, want)
	}
}

func (s *suite) ttl(t *testing.T) {
	p := s.newProvider(t)
	key := s.key(t)
	// Not lost long before the TTL: the TTL is how long the holder may work.
	// A provider may report the loss a little early, at the expiry it told
	// its server, measured from before its request; half the TTL from
	// before the request is far more than that. Whether the loss came before
	// that point is read on the clock and against a control timer, not from
	// how late the test saw it (see lostBefore); a run that cannot tell (a
	// busy machine), or whose Acquire took more than a tenth of the TTL,
	// runs the check again with twice the TTL.
	const attempts = 6
	var l tenace.LockLease
	for attempt, ttl := 1, s.caps.MinTTL; ; attempt, ttl = attempt+1, 2*ttl {
		start := time.Now()
		l = s.mustAcquire(t, p, key, tenace.LockAcquireOptions{TTL: ttl})
		v := cannotTell // an Acquire that took long leaves an early loss too little time before the point
		if time.Since(start) <= ttl/10 {
			v = lostBefore(t, l, start, ttl)
		}
		s.waitLost(t, l, tenace.ErrLeaseExpired)
		if d := time.Since(start); d > ttl+s.caps.WaitBound {
			t.Fatalf("lost after %v, TTL %v", d, ttl)
		}
		if v == lostEarly {
			t.Fatalf("lost with ErrLeaseExpired less than %v after the Acquire began, long before its TTL %v", ttl/2, ttl)
		}
		if v == heldThen {
			break
		}
		if attempt == attempts {
			t.Fatalf("could not tell in %d attempts (TTL %v to %v) whether the lease was lost before half its TTL: the test goroutine never ran between the loss and that point", attempts, s.caps.MinTTL, ttl)
		}
		t.Logf("TTL %v: could not tell (a slow Acquire, or the loss and half the TTL both passed before the test looked); again with twice the TTL", ttl)
		if err := l.Release(context.Background()); !errors.Is(err, tenace.ErrLeaseLost) && err != nil {
			t.Fatalf("Release of an expired lease = %v, want nil or an error wrapping ErrLeaseLost", err)
		}
	}
	// Someone else gets the key once the TTL has run out on the server too.
	next := s.mustAcquire(t, p, key, tenace.LockAcquireOptions{Timeout: s.caps.WaitBound})
	if err := l.Release(context.Background()); !errors.Is(err, tenace.ErrLeaseLost) && err != nil {
		t.Fatalf("Release of an expired lease = %v, want nil or an error wrapping ErrLeaseLost", err)
	}
	s.assertHeld(t, p, key, "the expired lease's Release must not touch the next holder")
	mustRelease(t, next)

	// Through a Lock: fn's context ends with ErrLeaseExpired.
	ttl := s.caps.MinTTL
	err := tenace.NewPolicy().WithLock(tenace.LockOptions{Provider: p, TTL: ttl}).Execute(s.ctx(t), func(ctx context.Context) error {
		select {
		case <-ctx.Done():
			return context.Cause(ctx)
		case <-time.After(s.caps.WaitBound + ttl):
			return errors.New("fn's context did not end at the lease's TTL")
		}
	}, tenace.WithKey(key))
	if !errors.Is(err, tenace.ErrLeaseExpired) {
		t.Fatalf("fn under a lease that reached its TTL returned %v, want its ctx's cause ErrLeaseExpired", err)
	}
}

// The verdicts of lostBefore.
const (
	heldThen   = iota // still held at the point
	lostEarly         // lost before it
	cannotTell        // this run cannot tell
)

// lostBefore tells whether l, whose Acquire began at start with ttl, was
// lost before start+ttl/2, from clock readings and a control timer: a loss
// seen while the clock still reads before the point came before it. A lease
// seen held at the point was held then only if timers were being served: a
// provider reports a loss from a timer's goroutine, which on a busy machine
// may run long after its time. So a control timer, due at start+2*ttl/5
// (after an early loss's timer, before the point), must have run first;
// otherwise, as when the test looks only after both the loss and the point,
// it cannot tell.
func lostBefore(t *testing.T, l tenace.LockLease, start time.Time, ttl time.Duration) int {
	t.Helper()
	ll, ok := l.(tenace.LosableLease)
	if !ok {
		t.Fatalf("lease %T is not a tenace.LosableLease", l)
	}
	at := start.Add(ttl / 2)
	control := make(chan struct{})
	ct := time.AfterFunc(time.Until(start.Add(2*ttl/5)), func() { close(control) })
	defer ct.Stop()
	timer := time.NewTimer(time.Until(at))
	defer timer.Stop()
	select {
	case <-ll.Lost():
		if time.Now().Before(at) {
			return lostEarly
		}
		return cannotTell
	case <-timer.C:
	}
	for time.Now().Before(at) { // a timer fires at its time or later; this is a guard
		runtime.Gosched()
	}
	select {
	case <-control: // first: a loss due before the control was reported by now
	default:
		return cannotTell
	}
	select {
	case <-ll.Lost():
		return cannotTell
	default:
		return heldThen
	}
}

func (s *suite) lost(t *testing.T) {
	p := s.newProvider(t)
	key := s.key(t)
	l := s.mustAcquire(t, p, key, tenace.LockAcquireOptions{})
	s.caps.Lose(t, l)
	s.waitLost(t, l, tenace.ErrLeaseLost)
	if err := l.Release(context.Background()); err != nil && !errors.Is(err, tenace.ErrLeaseLost) {
		t.Fatalf("Release after a loss = %v, want nil or an error wrapping ErrLeaseLost", err)
	}
	s.eventually(t, "key free after the loss", func() bool {
		l, err := p.Acquire(s.ctx(t), key, tenace.LockAcquireOptions{Timeout: tenace.NoWait})
		if l != nil {
			_ = l.Release(context.Background())
		}
		return err == nil && l != nil
	})

	// Through a Lock: fn's context ends with the lease's error as cause, and
	// lock.lost is emitted.
	var lostEvents atomic.Int32
	started := make(chan tenace.LockLease, 1)
	done := make(chan error, 1)
	pol := tenace.NewPolicy().WithLock(tenace.LockOptions{Provider: p}).OnEvent(func(e tenace.Event) {
		if e.Name == tenace.EventLockLost {
			lostEvents.Add(1)
		}
	})
	go func() {
		done <- pol.Execute(s.ctx(t), func(ctx context.Context) error {
			l, _ := tenace.LeaseFrom(ctx)
			started <- l
			<-ctx.Done()
			return context.Cause(ctx)
		}, tenace.WithKey(key))
	}()
	var inner tenace.LockLease
	select {
	case inner = <-started:
	case err := <-done:
		t.Fatalf("Execute returned %v before fn ran", err)
	case <-time.After(s.caps.WaitBound):
		t.Fatal("fn did not start")
	}
	s.caps.Lose(t, inner)
	select {
	case err := <-done:
		if !errors.Is(err, tenace.ErrLeaseLost) {
			t.Fatalf("fn under a lost lease returned %v, want its ctx's cause wrapping ErrLeaseLost", err)
		}
	case <-time.After(s.caps.WaitBound):
		t.Fatalf("fn's context did not end within %v of the loss", s.caps.WaitBound)
	}
	if n := lostEvents.Load(); n != 1 {
		t.Fatalf("%d lock.lost events, want 1", n)
	}
}

func (s *suite) staleRelease(t *testing.T) {
	p := s.newProvider(t)
	key := s.key(t)
	var old tenace.LockLease
	if s.caps.Lose != nil {
		old = s.mustAcquire(t, p, key, tenace.LockAcquireOptions{})
		s.caps.Lose(t, old)
		s.waitLost(t, old, tenace.ErrLeaseLost)
	} else {
		old = s.mustAcquire(t, p, key, tenace.LockAcquireOptions{TTL: s.caps.MinTTL})
		s.waitLost(t, old, tenace.ErrLeaseExpired)
	}
	next := s.mustAcquire(t, p, key, tenace.LockAcquireOptions{Timeout: s.caps.WaitBound})
	for range 2 {
		if err := old.Release(context.Background()); err != nil && !errors.Is(err, tenace.ErrLeaseLost) {
			t.Fatalf("stale Release = %v, want nil or an error wrapping ErrLeaseLost", err)
		}
	}
	s.assertHeld(t, p, key, "a stale Release after a takeover must not touch the new holder")
	mustRelease(t, next)
	s.assertFree(t, p, key, "after the new holder released")
}

// close: Close fails a waiting caller and every later Acquire with an error
// wrapping ErrProviderClosed, loses (with Losable) the leases still held, and
// a second Close returns nil.
func (s *suite) close(t *testing.T) {
	p := s.newProvider(t)
	c, ok := p.(io.Closer)
	if !ok {
		t.Fatalf("%T does not implement io.Closer", p)
	}
	key := s.key(t)
	held := s.mustAcquire(t, p, key, tenace.LockAcquireOptions{})
	// The waiter's outcome is the same whether Close meets it queued or it
	// arrives after Close; with ExactStats, Close waits until it is counted,
	// so that the queued case is the one checked.
	ch := acquireAsync(s.ctx(t), p, key, tenace.LockAcquireOptions{})
	s.waiterCounted(t, s.statsIfExact(t, p))
	closed := make(chan error, 1) // one result, never blocks the goroutine
	go func() { closed <- c.Close() }()
	r := s.wait(t, ch, "a caller waiting when Close was called")
	if r.lease != nil {
		_ = r.lease.Release(context.Background())
		t.Fatal("a caller waiting when Close was called was granted the key")
	}
	if !errors.Is(r.err, tenace.ErrProviderClosed) {
		t.Fatalf("a caller waiting when Close was called got %v, want an error wrapping ErrProviderClosed", r.err)
	}
	select {
	case err := <-closed:
		if err != nil {
			t.Fatalf("Close = %v, want nil", err)
		}
	case <-time.After(s.caps.WaitBound):
		t.Fatalf("Close did not return within %v", s.caps.WaitBound)
	}
	if s.caps.Losable {
		s.waitLost(t, held, tenace.ErrLeaseLost)
	}
	released := make(chan struct{})
	go func() {
		_ = held.Release(context.Background()) // nil or an error: the provider is closed
		close(released)
	}()
	select {
	case <-released:
	case <-time.After(s.caps.WaitBound):
		t.Fatalf("Release of a lease held at Close did not return within %v", s.caps.WaitBound)
	}
	for _, opts := range []tenace.LockAcquireOptions{{}, {Timeout: tenace.NoWait}, {Timeout: time.Second}} {
		l, err := p.Acquire(s.ctx(t), s.key(t), opts)
		if l != nil {
			t.Fatalf("Acquire (%+v) after Close granted a lease", opts)
		}
		if !errors.Is(err, tenace.ErrProviderClosed) {
			t.Fatalf("Acquire (%+v) after Close = %v, want an error wrapping ErrProviderClosed", opts, err)
		}
	}
	if err := c.Close(); err != nil {
		t.Fatalf("a second Close = %v, want nil", err)
	}
}

// shared: two provider values lock the same keys, a release through one
// grants the other's waiter, and (with Fencing) tokens increase from one
// value to the next, also across a restart: the first closed (with Close),
// a new one made.
func (s *suite) shared(t *testing.T) {
	p1, p2 := s.newProvider(t), s.newProvider(t)
	key := s.key(t)
	var last uint64
	token := func(l tenace.LockLease, what string) {
		t.Helper()
		if !s.caps.Fencing {
			return
		}
		tok := l.(tenace.FencedLease).Token()
		if tok <= last {
			t.Fatalf("%s: token %d after %d: not strictly increasing across provider values", what, tok, last)
		}
		last = tok
	}
	l1 := s.mustAcquire(t, p1, key, tenace.LockAcquireOptions{})
	token(l1, "the first provider's grant")
	s.assertHeld(t, p2, key, "a key held through one provider value must be held for another")
	ch := acquireAsync(s.ctx(t), p2, key, tenace.LockAcquireOptions{})
	mustRelease(t, l1)
	r := s.wait(t, ch, "the second provider's waiter after the first released")
	if r.err != nil || r.lease == nil {
		t.Fatalf("the second provider's waiter after the first released = (%v, %v), want a lease", r.lease, r.err)
	}
	token(r.lease, "the second provider's grant")
	mustRelease(t, r.lease)
	s.assertFree(t, p1, key, "released through the second provider value")

	// A restart: the old provider value goes, a new one comes.
	if s.caps.Close {
		for _, p := range []tenace.LockProvider{p1, p2} {
			if err := p.(io.Closer).Close(); err != nil {
				t.Fatalf("Close = %v", err)
			}
		}
	}
	p3 := s.newProvider(t)
	l3 := s.mustAcquire(t, p3, key, tenace.LockAcquireOptions{})
	token(l3, "a new provider value's grant, after a restart")
	mustRelease(t, l3)
}

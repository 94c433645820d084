package proptest

import (
	"context"
	"errors"
	"slices"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"

	"tenace.dev/tenace"
)

// PolicyProperty draws one pipeline shape and one execution, runs it on the
// fake clock of a testing/synctest bubble (it must run inside one), and
// checks the result against an independent reckoning of SPEC.md's "What
// Execute returns" table: the error, whether fn ran, and the events.
//
// Times are whole seconds drawn in separate lanes (each kind of event has
// its own last digit), so no two events ever fall on the same instant and
// the expected outcome is unambiguous.
func PolicyProperty(rt *rapid.T) {
	c := drawPolicyCase(rt)
	want := c.want()

	// The run. Its timers are stopped and its context cancelled last, after
	// the comparison, and the provider closed after them.
	p := tenace.NewMemoryLockProvider()
	defer p.Close()
	other, stopRelease := c.holdKey(rt, p)
	defer stopRelease()
	var events []string
	pol := c.policy(p).OnEvent(func(e tenace.Event) { events = append(events, e.Name) })
	ctx, cancel, stopCancel := c.context()
	defer stopCancel()
	defer cancel()
	ran, errFn, err := c.execute(ctx, pol)

	require.Equal(rt, want.ran, ran, "fn ran")
	checkPolicyError(rt, want, err, errFn, c.key)
	checkPolicyEvents(rt, want, events)

	// Nothing is left held once the other holder has let go.
	if other != nil {
		require.NoError(rt, other.Release(context.Background()))
	}
	synctest.Wait()
	require.Zero(rt, p.Size(), "the call left a lock behind")
}

// never is an instant that does not come: a step not in the pipeline, a
// holder that does not let go, a context that does not end.
const never = time.Duration(-1)

// policyCase is one draw of PolicyProperty: the pipeline's shape (an outer
// Timeout, a Lock, an inner Timeout, perhaps a nested Lock), the key's other
// holder, the caller's context and what fn does.
type policyCase struct {
	lockKey, execKey string
	key              string // the key locked: lockKey, else execKey
	lockTimeout, ttl time.Duration
	outerD, innerD   time.Duration // the outer and inner Timeouts; never: no such step
	nested           bool          // a second Lock inside the inner Timeout
	held             bool          // another holder has the key when Execute starts
	releaseAt        time.Duration // when that holder lets go
	ctxMode          string        // background, pre-cancelled, cancel, deadline
	ctxEnd           time.Duration // when cancel or deadline ends the context
	fnMode           string        // nil, error, work, wait-ctx
	work             time.Duration // how long fn works, for work
}

// drawPolicyCase draws a policyCase, then settles the draws that could not
// happen together.
func drawPolicyCase(rt *rapid.T) policyCase {
	s := time.Second
	lane := func(label string, digit int) time.Duration {
		return time.Duration(10*rapid.IntRange(0, 4).Draw(rt, label)+digit) * s
	}
	c := policyCase{
		lockKey:     rapid.SampledFrom([]string{"", "k"}).Draw(rt, "lock key"),
		execKey:     rapid.SampledFrom([]string{"", "k", "j"}).Draw(rt, "execution key"),
		lockTimeout: rapid.SampledFrom([]time.Duration{0, tenace.NoWait, lane("lock timeout", 6), -5 * s}).Draw(rt, "lock timeout"),
		ttl:         rapid.SampledFrom([]time.Duration{0, 30 * s, -s}).Draw(rt, "ttl"),
		outerD:      rapid.SampledFrom([]time.Duration{never, lane("outer timeout", 7), 0}).Draw(rt, "outer timeout"),
		innerD:      rapid.SampledFrom([]time.Duration{never, lane("inner timeout", 8), 0}).Draw(rt, "inner timeout"),
		nested:      rapid.Bool().Draw(rt, "nested lock"),
		held:        rapid.Bool().Draw(rt, "key held by another"),
		releaseAt:   rapid.SampledFrom([]time.Duration{never, lane("release", 1)}).Draw(rt, "holder releases at"),
		ctxMode:     rapid.SampledFrom([]string{"background", "pre-cancelled", "cancel", "deadline"}).Draw(rt, "ctx"),
		ctxEnd:      lane("ctx ends", 3),
		fnMode:      rapid.SampledFrom([]string{"nil", "error", "work", "wait-ctx"}).Draw(rt, "fn"),
		work:        lane("work", 4),
	}
	c.settle(func() time.Duration { return lane("release instead", 1) })
	return c
}

// settle makes the draws consistent; release draws a release instant for
// a call that would otherwise wait for the lock forever.
func (c *policyCase) settle(release func() time.Duration) {
	c.key = c.lockKey
	if c.key == "" {
		c.key = c.execKey
	}
	if c.ctxMode == "background" || c.ctxMode == "pre-cancelled" {
		c.ctxEnd = never
	}
	if c.fnMode == "wait-ctx" && c.outerD <= 0 && c.innerD <= 0 && c.ctxEnd == never {
		c.fnMode = "nil" // nothing would ever end fn's context
	}
	if c.key == "" {
		c.held = false // nothing to hold: the call fails on the missing key
	}
	if !c.held {
		c.releaseAt = 0
	}
	if c.waitsForever() {
		c.releaseAt = release()
	}
}

// waitsForever reports whether the call would wait for the held key with
// nothing to end the wait.
func (c *policyCase) waitsForever() bool {
	return c.held && c.releaseAt == never && c.lockTimeout == 0 && c.ctxEnd == never && c.outerD == never &&
		c.key != "" && c.ttl >= 0 && c.ctxMode != "pre-cancelled"
}

// ---- the reckoning ----

// policyOutcome is what Execute should return.
type policyOutcome struct {
	err     string        // "nil", "fn", "missing", "invalid", "not-acquired", "canceled", "deadline", "timeout"
	timeout time.Duration // which Timeout step, for "timeout"
	ran     bool
}

// first is the earliest instant of ds that comes, and its index (never and
// -1 if none does).
func first(ds ...time.Duration) (time.Duration, int) {
	best, at := never, -1
	for i, d := range ds {
		if d != never && (best == never || d < best) {
			best, at = d, i
		}
	}
	return best, at
}

// ctxErr is the outcome of the caller's context ending.
func (c policyCase) ctxErr() string {
	return map[string]string{"cancel": "canceled", "deadline": "deadline"}[c.ctxMode]
}

// want reckons the outcome: the option errors in the order the steps meet
// them, then the wait for the lock, then fn and the Timeouts around it.
func (c policyCase) want() policyOutcome {
	if c.ctxMode == "pre-cancelled" {
		return policyOutcome{err: "canceled"}
	}
	if c.outerD == 0 {
		return policyOutcome{err: "invalid"}
	}
	if c.key == "" {
		return policyOutcome{err: "missing"}
	}
	if (c.lockTimeout < 0 && c.lockTimeout != tenace.NoWait) || c.ttl < 0 {
		return policyOutcome{err: "invalid"}
	}
	acquiredAt := time.Duration(0)
	if c.held {
		at, failed := c.wantWait()
		if failed != nil {
			return *failed
		}
		acquiredAt = at
	}
	if c.innerD == 0 {
		return policyOutcome{err: "invalid"}
	}
	return c.wantFn(acquiredAt)
}

// wantWait reckons the wait for the held key: the instant it is acquired,
// or the outcome of a wait that fails.
func (c policyCase) wantWait() (time.Duration, *policyOutcome) {
	if c.lockTimeout == tenace.NoWait {
		return 0, &policyOutcome{err: "not-acquired"}
	}
	lt := never
	if c.lockTimeout > 0 {
		lt = c.lockTimeout
	}
	t1 := c.outerD // absolute: the outer step starts at 0
	at, which := first(c.releaseAt, lt, c.ctxEnd, t1)
	switch which {
	case 0:
		return at, nil
	case 1:
		return 0, &policyOutcome{err: "not-acquired"}
	case 2:
		return 0, &policyOutcome{err: c.ctxErr()}
	case 3:
		return 0, &policyOutcome{err: "timeout", timeout: c.outerD}
	default:
		panic("unreachable: the draw never waits forever")
	}
}

// wantFn reckons fn's run, from acquiredAt, and the Timeouts around it.
func (c policyCase) wantFn(acquiredAt time.Duration) policyOutcome {
	t1 := c.outerD // absolute: the outer step starts at 0
	t2 := never
	if c.innerD != never {
		t2 = acquiredAt + c.innerD
	}
	var fnEnd time.Duration
	fnErr := "nil"
	switch c.fnMode {
	case "nil":
		fnEnd = acquiredAt
	case "error":
		fnEnd, fnErr = acquiredAt, "fn"
	case "work":
		fnEnd = acquiredAt + c.work
	case "wait-ctx":
		at, which := first(t1, t2, c.ctxEnd)
		fnEnd = at
		fnErr = [...]string{"deadline", "deadline", c.ctxErr()}[which]
	}
	// Inner timeout: its own deadline fired before fn returned and
	// before its parent (the outer deadline or ctx) ended.
	res := policyOutcome{err: fnErr, ran: true}
	if t2 != never && t2 <= fnEnd { // <=: in wait-ctx, the deadline is what ends fn
		if p, _ := first(t1, c.ctxEnd); p == never || t2 < p {
			res = policyOutcome{err: "timeout", timeout: c.innerD, ran: true}
		}
	}
	if t1 != never && t1 <= fnEnd && (c.ctxEnd == never || t1 < c.ctxEnd) {
		res = policyOutcome{err: "timeout", timeout: c.outerD, ran: true}
	}
	return res
}

// ---- the run ----

// holdKey has another holder take the key, when the case says so, and
// release it at releaseAt. It returns that holder's lease and how to stop
// the release's timer.
func (c policyCase) holdKey(rt *rapid.T, p *tenace.MemoryLockProvider) (tenace.LockLease, func()) {
	if !c.held {
		return nil, func() {}
	}
	l, err := p.Acquire(context.Background(), c.key, tenace.LockAcquireOptions{})
	require.NoError(rt, err)
	if c.releaseAt == never {
		return l, func() {}
	}
	t := time.AfterFunc(c.releaseAt, func() { _ = l.Release(context.Background()) })
	return l, func() { t.Stop() }
}

// policy is the case's pipeline on p, outermost step first: the outer
// Timeout, the Lock, the inner Timeout, the nested Lock.
func (c policyCase) policy(p *tenace.MemoryLockProvider) tenace.Policy {
	pol := tenace.NewPolicy()
	if c.nested {
		pol = pol.WithLock(tenace.LockOptions{Provider: p, Key: "nested"})
	}
	if c.innerD != never {
		pol = pol.WithTimeout(c.innerD)
	}
	pol = pol.WithLock(tenace.LockOptions{Provider: p, Key: c.lockKey, Timeout: c.lockTimeout, TTL: c.ttl})
	if c.outerD != never {
		pol = pol.WithTimeout(c.outerD)
	}
	return pol
}

// context is the caller's context, its cancel, and how to stop the timer
// that cancels it.
func (c policyCase) context() (context.Context, context.CancelFunc, func()) {
	ctx, cancel := context.Background(), context.CancelFunc(func() {})
	switch c.ctxMode {
	case "pre-cancelled":
		ctx, cancel = context.WithCancel(ctx)
		cancel()
	case "cancel":
		ctx, cancel = context.WithCancel(ctx)
		t := time.AfterFunc(c.ctxEnd, cancel)
		return ctx, cancel, func() { t.Stop() }
	case "deadline":
		ctx, cancel = context.WithTimeout(ctx, c.ctxEnd)
	}
	return ctx, cancel, func() {}
}

// execute runs fn through pol and returns whether fn ran, the error fn
// returns in error mode, and Execute's error.
func (c policyCase) execute(ctx context.Context, pol tenace.Policy) (ran bool, errFn, err error) {
	var opts []tenace.ExecuteOption
	if c.execKey != "" {
		opts = append(opts, tenace.WithKey(c.execKey))
	}
	errFn = errors.New("fn failed")
	err = pol.Execute(ctx, func(ctx context.Context) error {
		ran = true
		switch c.fnMode {
		case "error":
			return errFn
		case "work":
			time.Sleep(c.work)
		case "wait-ctx":
			<-ctx.Done()
			return ctx.Err()
		}
		return nil
	}, opts...)
	return ran, errFn, err
}

// ---- the comparison ----

// checkPolicyError checks Execute's error against the reckoning.
func checkPolicyError(rt *rapid.T, want policyOutcome, err, errFn error, key string) {
	var te *tenace.TimeoutError
	var nae *tenace.LockNotAcquiredError
	switch want.err {
	case "nil":
		require.NoError(rt, err)
	case "fn":
		require.Same(rt, errFn, err)
	case "missing":
		require.ErrorIs(rt, err, tenace.ErrMissingKey)
	case "invalid":
		require.ErrorIs(rt, err, tenace.ErrInvalidOption)
	case "not-acquired":
		require.ErrorAs(rt, err, &nae)
		require.Equal(rt, key, nae.Key)
	case "canceled":
		require.ErrorIs(rt, err, context.Canceled)
		require.False(rt, errors.As(err, &te))
	case "deadline":
		require.ErrorIs(rt, err, context.DeadlineExceeded)
		require.False(rt, errors.As(err, &te), "not a TimeoutError: %v", err)
	case "timeout":
		require.ErrorAs(rt, err, &te)
		require.Equal(rt, want.timeout, te.Timeout, "which WithTimeout fired")
		require.ErrorIs(rt, err, context.DeadlineExceeded)
	}
}

// checkPolicyEvents checks the events against the reckoning: the rejection,
// the timeout, each acquired lock released, each wait ended once, and a
// cancelled wait.
func checkPolicyEvents(rt *rapid.T, want policyOutcome, events []string) {
	require.Equal(rt, want.err == "not-acquired", slices.Contains(events, tenace.EventLockRejected), "lock.rejected iff not acquired: %v", events)
	require.Equal(rt, want.err == "timeout", slices.Contains(events, tenace.EventTimeout), "timeout event iff a timeout: %v", events)
	require.Equal(rt, count(events, tenace.EventLockAcquired), count(events, tenace.EventLockReleased), "every acquired lock released: %v", events)
	waitEnds := count(events, tenace.EventLockAcquired) + count(events, tenace.EventLockRejected) +
		count(events, tenace.EventLockCancelled) + count(events, tenace.EventLockFailed)
	require.Equal(rt, count(events, tenace.EventLockAcquiring), waitEnds, "every wait ends with one event: %v", events)
	ctxEndedWaiting := (want.err == "canceled" || want.err == "deadline" || want.err == "timeout") && !want.ran && slices.Contains(events, tenace.EventLockAcquiring)
	require.Equal(rt, ctxEndedWaiting, slices.Contains(events, tenace.EventLockCancelled), "lock.cancelled iff the ctx ended while waiting: %v", events)
}

func count(s []string, v string) int {
	n := 0
	for _, x := range s {
		if x == v {
			n++
		}
	}
	return n
}

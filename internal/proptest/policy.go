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
	const never = time.Duration(-1)
	s := time.Second
	lane := func(label string, digit int) time.Duration {
		return time.Duration(10*rapid.IntRange(0, 4).Draw(rt, label)+digit) * s
	}
	var (
		lockKey     = rapid.SampledFrom([]string{"", "k"}).Draw(rt, "lock key")
		execKey     = rapid.SampledFrom([]string{"", "k", "j"}).Draw(rt, "execution key")
		lockTimeout = rapid.SampledFrom([]time.Duration{0, tenace.NoWait, lane("lock timeout", 6), -5 * s}).Draw(rt, "lock timeout")
		ttl         = rapid.SampledFrom([]time.Duration{0, 30 * s, -s}).Draw(rt, "ttl")
		outerD      = rapid.SampledFrom([]time.Duration{never, lane("outer timeout", 7), 0}).Draw(rt, "outer timeout")
		innerD      = rapid.SampledFrom([]time.Duration{never, lane("inner timeout", 8), 0}).Draw(rt, "inner timeout")
		nested      = rapid.Bool().Draw(rt, "nested lock")
		held        = rapid.Bool().Draw(rt, "key held by another")
		releaseAt   = rapid.SampledFrom([]time.Duration{never, lane("release", 1)}).Draw(rt, "holder releases at")
		ctxMode     = rapid.SampledFrom([]string{"background", "pre-cancelled", "cancel", "deadline"}).Draw(rt, "ctx")
		ctxEnd      = lane("ctx ends", 3)
		fnMode      = rapid.SampledFrom([]string{"nil", "error", "work", "wait-ctx"}).Draw(rt, "fn")
		work        = lane("work", 4)
	)
	key := lockKey
	if key == "" {
		key = execKey
	}
	if ctxMode == "background" || ctxMode == "pre-cancelled" {
		ctxEnd = never
	}
	if fnMode == "wait-ctx" && outerD <= 0 && innerD <= 0 && ctxEnd == never {
		fnMode = "nil" // nothing would ever end fn's context
	}
	if key == "" {
		held = false // nothing to hold: the call fails on the missing key
	}
	if !held {
		releaseAt = 0
	}
	if held && releaseAt == never && lockTimeout == 0 && ctxEnd == never && outerD == never &&
		key != "" && ttl >= 0 && ctxMode != "pre-cancelled" {
		releaseAt = lane("release instead", 1) // else the call would wait for the lock forever
	}

	// ---- the reckoning ----
	type outcome struct {
		err     string        // "nil", "fn", "missing", "invalid", "not-acquired", "canceled", "deadline", "timeout"
		timeout time.Duration // which Timeout step, for "timeout"
		ran     bool
	}
	first := func(ds ...time.Duration) (time.Duration, int) { // earliest set instant and its index
		best, at := never, -1
		for i, d := range ds {
			if d != never && (best == never || d < best) {
				best, at = d, i
			}
		}
		return best, at
	}
	ctxErr := map[string]string{"cancel": "canceled", "deadline": "deadline"}[ctxMode]
	want := func() outcome {
		if ctxMode == "pre-cancelled" {
			return outcome{err: "canceled"}
		}
		if outerD == 0 {
			return outcome{err: "invalid"}
		}
		if key == "" {
			return outcome{err: "missing"}
		}
		if (lockTimeout < 0 && lockTimeout != tenace.NoWait) || ttl < 0 {
			return outcome{err: "invalid"}
		}
		t1 := outerD // absolute: the outer step starts at 0
		acquiredAt := time.Duration(0)
		if held {
			if lockTimeout == tenace.NoWait {
				return outcome{err: "not-acquired"}
			}
			lt := never
			if lockTimeout > 0 {
				lt = lockTimeout
			}
			at, which := first(releaseAt, lt, ctxEnd, t1)
			switch which {
			case 0:
				acquiredAt = at
			case 1:
				return outcome{err: "not-acquired"}
			case 2:
				return outcome{err: ctxErr}
			case 3:
				return outcome{err: "timeout", timeout: outerD}
			default:
				panic("unreachable: the draw never waits forever")
			}
		}
		if innerD == 0 {
			return outcome{err: "invalid"}
		}
		t2 := never
		if innerD != never {
			t2 = acquiredAt + innerD
		}
		var fnEnd time.Duration
		fnErr := "nil"
		switch fnMode {
		case "nil":
			fnEnd = acquiredAt
		case "error":
			fnEnd, fnErr = acquiredAt, "fn"
		case "work":
			fnEnd = acquiredAt + work
		case "wait-ctx":
			at, which := first(t1, t2, ctxEnd)
			fnEnd = at
			fnErr = [...]string{"deadline", "deadline", ctxErr}[which]
		}
		// Inner timeout: its own deadline fired before fn returned and
		// before its parent (the outer deadline or ctx) ended.
		res := outcome{err: fnErr, ran: true}
		if t2 != never && t2 <= fnEnd { // <=: in wait-ctx, the deadline is what ends fn
			if p, _ := first(t1, ctxEnd); p == never || t2 < p {
				res = outcome{err: "timeout", timeout: innerD, ran: true}
			}
		}
		if t1 != never && t1 <= fnEnd && (ctxEnd == never || t1 < ctxEnd) {
			res = outcome{err: "timeout", timeout: outerD, ran: true}
		}
		return res
	}()

	// ---- the run ----
	p := tenace.NewMemoryLockProvider()
	defer p.Close()
	var other tenace.LockLease
	if held {
		l, err := p.Acquire(context.Background(), key, tenace.LockAcquireOptions{})
		require.NoError(rt, err)
		other = l
		if releaseAt != never {
			t := time.AfterFunc(releaseAt, func() { _ = l.Release(context.Background()) })
			defer t.Stop()
		}
	}
	pol := tenace.NewPolicy()
	if nested {
		pol = pol.WithLock(tenace.LockOptions{Provider: p, Key: "nested"})
	}
	if innerD != never {
		pol = pol.WithTimeout(innerD)
	}
	pol = pol.WithLock(tenace.LockOptions{Provider: p, Key: lockKey, Timeout: lockTimeout, TTL: ttl})
	if outerD != never {
		pol = pol.WithTimeout(outerD)
	}
	var events []string
	pol = pol.OnEvent(func(e tenace.Event) { events = append(events, e.Name) })

	ctx, cancel := context.Background(), context.CancelFunc(func() {})
	switch ctxMode {
	case "pre-cancelled":
		ctx, cancel = context.WithCancel(ctx)
		cancel()
	case "cancel":
		ctx, cancel = context.WithCancel(ctx)
		t := time.AfterFunc(ctxEnd, cancel)
		defer t.Stop()
	case "deadline":
		ctx, cancel = context.WithTimeout(ctx, ctxEnd)
	}
	defer cancel()
	var opts []tenace.ExecuteOption
	if execKey != "" {
		opts = append(opts, tenace.WithKey(execKey))
	}
	errFn := errors.New("fn failed")
	ran := false
	err := pol.Execute(ctx, func(ctx context.Context) error {
		ran = true
		switch fnMode {
		case "error":
			return errFn
		case "work":
			time.Sleep(work)
		case "wait-ctx":
			<-ctx.Done()
			return ctx.Err()
		}
		return nil
	}, opts...)

	// ---- the comparison ----
	require.Equal(rt, want.ran, ran, "fn ran")
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
	require.Equal(rt, want.err == "not-acquired", slices.Contains(events, tenace.EventLockRejected), "lock.rejected iff not acquired: %v", events)
	require.Equal(rt, want.err == "timeout", slices.Contains(events, tenace.EventTimeout), "timeout event iff a timeout: %v", events)
	require.Equal(rt, count(events, tenace.EventLockAcquired), count(events, tenace.EventLockReleased), "every acquired lock released: %v", events)
	waitEnds := count(events, tenace.EventLockAcquired) + count(events, tenace.EventLockRejected) +
		count(events, tenace.EventLockCancelled) + count(events, tenace.EventLockFailed)
	require.Equal(rt, count(events, tenace.EventLockAcquiring), waitEnds, "every wait ends with one event: %v", events)
	ctxEndedWaiting := (want.err == "canceled" || want.err == "deadline" || want.err == "timeout") && !want.ran && slices.Contains(events, tenace.EventLockAcquiring)
	require.Equal(rt, ctxEndedWaiting, slices.Contains(events, tenace.EventLockCancelled), "lock.cancelled iff the ctx ended while waiting: %v", events)

	// Nothing is left held once the other holder has let go.
	if other != nil {
		require.NoError(rt, other.Release(context.Background()))
	}
	synctest.Wait()
	require.Zero(rt, p.Size(), "the call left a lock behind")
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

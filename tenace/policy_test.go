package tenace_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"

	"tenace.dev/internal/proptest"
	"tenace.dev/tenace"
	"tenace.dev/tenace/internal/fakeclock"
	"tenace.dev/tenace/policy"
)

func noop(context.Context) error { return nil }

// ---- What Execute returns: one test per row of SPEC.md's table ----

func TestExecuteReturnsFnErrorUnchanged(t *testing.T) {
	p, _ := newProvider(t)
	pol := tenace.NewPolicy().WithTimeout(time.Minute).WithLock(tenace.LockOptions{Provider: p, Key: "k"})
	err := pol.Execute(bg, func(context.Context) error { return errBoom })
	require.Same(t, errBoom, err)
	require.NoError(t, pol.Execute(bg, noop))
	requireIdle(t, p, "k")
}

func TestExecuteWithEndedCtxRunsNothing(t *testing.T) {
	fp := &fakeProvider{}
	ctx, cancel := context.WithCancel(bg)
	cancel()
	ran := false
	err := tenace.NewPolicy().WithLock(tenace.LockOptions{Provider: fp, Key: "k"}).
		Execute(ctx, func(context.Context) error { ran = true; return nil })
	require.ErrorIs(t, err, context.Canceled)
	require.False(t, ran)
	require.Empty(t, fp.calls, "the provider was not asked")
	// Even with no step at all.
	require.ErrorIs(t, tenace.NewPolicy().Execute(ctx, func(context.Context) error { ran = true; return nil }), context.Canceled)
	require.False(t, ran)
}

func TestExecuteWithoutAnyKeyReturnsErrMissingKey(t *testing.T) {
	fp := &fakeProvider{}
	ran := false
	err := tenace.NewPolicy().WithLock(tenace.LockOptions{Provider: fp}).
		Execute(bg, func(context.Context) error { ran = true; return nil })
	require.ErrorIs(t, err, tenace.ErrMissingKey)
	require.ErrorContains(t, err, "WithKey")
	require.False(t, ran)
	require.Empty(t, fp.calls)
}

func TestExecuteRejectsOptionsOutOfRange(t *testing.T) {
	fp := &fakeProvider{}
	for name, tc := range map[string]struct {
		pol  tenace.Policy
		text string
	}{
		"negative Timeout":     {tenace.NewPolicy().WithLock(tenace.LockOptions{Provider: fp, Key: "k", Timeout: -time.Second}), "LockOptions.Timeout is -1s"},
		"negative TTL":         {tenace.NewPolicy().WithLock(tenace.LockOptions{Provider: fp, Key: "k", TTL: -time.Second}), "LockOptions.TTL is -1s"},
		"zero WithTimeout":     {tenace.NewPolicy().WithTimeout(0), "WithTimeout(0s)"},
		"negative WithTimeout": {tenace.NewPolicy().WithTimeout(-time.Second), "WithTimeout(-1s)"},
	} {
		t.Run(name, func(t *testing.T) {
			ran := false
			err := tc.pol.Execute(bg, func(context.Context) error { ran = true; return nil })
			require.ErrorIs(t, err, tenace.ErrInvalidOption)
			require.ErrorContains(t, err, tc.text)
			require.False(t, ran)
		})
	}
	require.Empty(t, fp.calls)
}

// An option out of range is found when the call reaches its step: steps
// outside it have run by then, as ErrInvalidOption's doc says. fn does not.
func TestAnOptionOutOfRangeStopsTheCallAtItsStep(t *testing.T) {
	fp := &fakeProvider{}
	var rec recorder
	ran := false
	err := tenace.NewPolicy().WithTimeout(0).WithLock(tenace.LockOptions{Provider: fp, Key: "k"}).OnEvent(rec.on).
		Execute(bg, func(context.Context) error { ran = true; return nil })
	require.ErrorIs(t, err, tenace.ErrInvalidOption)
	require.False(t, ran)
	require.Equal(t, []string{"lock.acquiring:k", "lock.acquired:k", "lock.released:k"}, rec.names(), "the outer Lock ran")
	require.Equal(t, 1, fp.releaseCount())
}

func TestLockNotAcquiredWithinTimeoutReturnsLockNotAcquiredError(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := tenace.NewMemoryLockProvider()
		defer p.Close()
		blocker := mustAcquire(t, p, "reports")
		var rec recorder
		ran := false
		start := time.Now()
		err := tenace.NewPolicy().WithLock(tenace.LockOptions{Provider: p, Key: "reports", Timeout: 5 * time.Second}).
			OnEvent(rec.on).Execute(bg, func(context.Context) error { ran = true; return nil })
		var nae *tenace.LockNotAcquiredError
		require.ErrorAs(t, err, &nae)
		require.Equal(t, "reports", nae.Key)
		require.Equal(t, 5*time.Second, nae.Timeout)
		require.Contains(t, nae.Error(), "within its 5s timeout")
		require.Equal(t, 5*time.Second, time.Since(start))
		require.False(t, ran)
		require.Equal(t, []string{"lock.acquiring:reports", "lock.rejected:reports"}, rec.names())
		require.NoError(t, blocker.Release(bg))
		requireIdle(t, p, "reports")
	})
}

func TestNoWaitOnAHeldKeyReturnsLockNotAcquiredErrorAtOnce(t *testing.T) {
	p, _ := newProvider(t)
	blocker := mustAcquire(t, p, "k")
	err := tenace.NewPolicy().WithLock(tenace.LockOptions{Provider: p, Timeout: tenace.NoWait}).
		Execute(bg, noop, tenace.WithKey("k"))
	var nae *tenace.LockNotAcquiredError
	require.ErrorAs(t, err, &nae)
	require.Equal(t, "k", nae.Key)
	require.Equal(t, tenace.NoWait, nae.Timeout)
	require.Contains(t, nae.Error(), "not acquired at once (NoWait)", "it did not wait: no timeout to speak of")
	require.NotContains(t, nae.Error(), "timeout:")
	require.NoError(t, blocker.Release(bg))
	requireIdle(t, p, "k")
}

func TestCtxEndingWhileWaitingReturnsCtxErrorAndFnDoesNotRun(t *testing.T) {
	p, queued := newProvider(t)
	blocker := mustAcquire(t, p, "k")
	var rec recorder
	ctx, cancel := context.WithCancel(bg)
	ran := make(chan struct{}, 1)
	result := make(chan error, 1)
	go func() {
		result <- tenace.NewPolicy().WithLock(tenace.LockOptions{Provider: p, Key: "k", Timeout: time.Hour}).OnEvent(rec.on).
			Execute(ctx, func(context.Context) error { ran <- struct{}{}; return nil })
	}()
	<-queued
	cancel()
	err := <-result
	require.ErrorIs(t, err, context.Canceled)
	var nae *tenace.LockNotAcquiredError
	require.False(t, errors.As(err, &nae), "ctx's end is not the lock's timeout")
	require.Equal(t, []string{"lock.acquiring:k", "lock.cancelled:k"}, rec.names(), "lock.cancelled, not lock.rejected, when ctx ends")
	require.Len(t, ran, 0)
	require.NoError(t, blocker.Release(bg))
	requireIdle(t, p, "k")
}

func TestCtxDeadlineWhileWaitingIsDeadlineExceeded(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := tenace.NewMemoryLockProvider()
		defer p.Close()
		blocker := mustAcquire(t, p, "k")
		ctx, cancel := context.WithTimeout(bg, time.Second)
		defer cancel()
		err := tenace.NewPolicy().WithLock(tenace.LockOptions{Provider: p, Key: "k"}).Execute(ctx, noop)
		require.ErrorIs(t, err, context.DeadlineExceeded)
		require.NoError(t, blocker.Release(bg))
	})
}

// TestGrantLandingAsCtxEndsDoesNotRunFn is the source document's "does not
// run even if the lock is acquired at that moment": the provider grants just
// as the context ends.
func TestGrantLandingAsCtxEndsDoesNotRunFn(t *testing.T) {
	ctx, cancel := context.WithCancel(bg)
	fp := &fakeProvider{}
	fp.acquire = func(context.Context, string) (tenace.LockLease, error) {
		cancel() // the context ends as the grant lands
		return &fakeLease{p: fp}, nil
	}
	ran := false
	err := tenace.NewPolicy().WithLock(tenace.LockOptions{Provider: fp, Key: "k"}).
		Execute(ctx, func(context.Context) error { ran = true; return nil })
	require.ErrorIs(t, err, context.Canceled)
	require.False(t, ran)
	require.Equal(t, 1, fp.releaseCount(), "the grant is released at once")
	require.NoError(t, fp.released[0].releaseCtx, "with a context that is not cancelled")
}

// TestLockReleaseIsNotCutShortByTheCallersContext: the caller's context
// ends while the Lock releases (a client that hangs up as fn returns); the
// release must still get a context that is not cancelled and has no
// deadline of the caller's, as when the context had ended before it.
func TestLockReleaseIsNotCutShortByTheCallersContext(t *testing.T) {
	for name, mk := range map[string]func() (context.Context, context.CancelFunc){
		"cancel":   func() (context.Context, context.CancelFunc) { return context.WithCancel(bg) },
		"deadline": func() (context.Context, context.CancelFunc) { return context.WithTimeout(bg, time.Hour) },
	} {
		t.Run(name, func(t *testing.T) {
			ctx, cancel := mk()
			defer cancel()
			fp := &fakeProvider{}
			fp.acquire = func(context.Context, string) (tenace.LockLease, error) {
				return &fakeLease{p: fp, onRelease: cancel}, nil
			}
			pol := tenace.NewPolicy().WithLock(tenace.LockOptions{Provider: fp, Key: "k"})
			require.NoError(t, pol.Execute(ctx, noop))
			require.Equal(t, 1, fp.releaseCount())
			require.NoError(t, fp.released[0].releaseCtx, "the caller's context ended during the release, and the release saw it")
			require.False(t, fp.released[0].releaseDl, "the release has the caller's deadline: the provider cannot bound it on its own")
		})
	}
}

// And on the real provider, racing the release against the cancel many
// times: the call either ran (its grant came first) or returned ctx's error,
// and after each race nothing is held.
func TestGrantRacingCtxCancelOnTheMemoryProvider(t *testing.T) {
	p, queued := newProvider(t, tenace.WithShards(1))
	pol := tenace.NewPolicy().WithLock(tenace.LockOptions{Provider: p, Key: "k"})
	ranAfterCancel := 0
	for range 500 {
		blocker := mustAcquire(t, p, "k")
		ctx, cancel := context.WithCancel(bg)
		result := make(chan error, 1)
		go func() {
			result <- pol.Execute(ctx, func(ctx context.Context) error {
				return nil
			})
		}()
		<-queued
		go cancel()
		require.NoError(t, blocker.Release(bg))
		err := <-result
		if err == nil {
			ranAfterCancel++ // granted before the cancel: fn ran, correctly
		} else {
			require.ErrorIs(t, err, context.Canceled)
		}
		require.NoError(t, tenace.SyncProvider(p))
		require.Zero(t, p.Size())
	}
	t.Logf("fn ran %d of 500 times (granted before the cancel)", ranAfterCancel)
	requireIdle(t, p, "k")
}

func TestProviderFailureIsUnexpectedError(t *testing.T) {
	fp := &fakeProvider{acquire: func(context.Context, string) (tenace.LockLease, error) { return nil, errBoom }}
	ran := false
	err := tenace.NewPolicy().WithLock(tenace.LockOptions{Provider: fp, Key: "k"}).
		Execute(bg, func(context.Context) error { ran = true; return nil })
	var ue *tenace.UnexpectedError
	require.ErrorAs(t, err, &ue)
	require.ErrorIs(t, err, errBoom, "errors.Is reaches the cause")
	require.ErrorContains(t, err, "boom")
	require.False(t, ran)
}

// An option the provider bounds itself (redislock's TTL) is the caller's
// mistake: Execute returns the provider's error as it is, as it does the
// Lock's own option errors, not as a provider failure; the wait still ends
// with lock.failed, so that every lock.acquiring has its end.
func TestAnOptionTheProviderRefusesIsNotAProviderFailure(t *testing.T) {
	refused := fmt.Errorf("fakeprovider: %w: LockAcquireOptions.TTL 500µs is below 1ms", tenace.ErrInvalidOption)
	fp := &fakeProvider{acquire: func(context.Context, string) (tenace.LockLease, error) { return nil, refused }}
	var rec recorder
	ran := false
	err := tenace.NewPolicy().WithLock(tenace.LockOptions{Provider: fp, Key: "k", TTL: 500 * time.Microsecond}).OnEvent(rec.on).
		Execute(bg, func(context.Context) error { ran = true; return nil })
	require.Same(t, refused, err)
	var ue *tenace.UnexpectedError
	require.False(t, errors.As(err, &ue), "not reported as a provider failure")
	require.ErrorIs(t, err, tenace.ErrInvalidOption)
	require.False(t, ran)
	require.Equal(t, []string{"lock.acquiring:k", "lock.failed:k"}, rec.names())
}

// A provider that breaks its contract by returning a lease with an error
// (or a lease as ctx ends) still gets that lease back: the Lock releases
// whatever lease it is handed and does not run fn.
func TestALeaseReturnedWithAnErrorIsReleased(t *testing.T) {
	var fp *fakeProvider
	fp = &fakeProvider{acquire: func(context.Context, string) (tenace.LockLease, error) { return &fakeLease{p: fp}, errBoom }}
	ran := false
	err := tenace.NewPolicy().WithLock(tenace.LockOptions{Provider: fp, Key: "k"}).
		Execute(bg, func(context.Context) error { ran = true; return nil })
	require.ErrorIs(t, err, errBoom)
	require.False(t, ran)
	require.Equal(t, 1, fp.releaseCount(), "the lease handed back with the error is released")

	ctx, cancel := context.WithCancel(bg)
	fp.acquire = func(context.Context, string) (tenace.LockLease, error) {
		cancel()
		return &fakeLease{p: fp}, context.Canceled
	}
	err = tenace.NewPolicy().WithLock(tenace.LockOptions{Provider: fp, Key: "k"}).Execute(ctx, noop)
	require.ErrorIs(t, err, context.Canceled)
	require.Equal(t, 2, fp.releaseCount(), "also when the error is ctx's")
}

func TestClosedProviderIsUnexpectedErrorWrappingErrProviderClosed(t *testing.T) {
	p := tenace.NewMemoryLockProvider()
	require.NoError(t, p.Close())
	err := tenace.NewPolicy().WithLock(tenace.LockOptions{Provider: p, Key: "k"}).Execute(bg, noop)
	var ue *tenace.UnexpectedError
	require.ErrorAs(t, err, &ue)
	require.ErrorIs(t, err, tenace.ErrProviderClosed)
}

func TestWithTimeoutFiringReturnsTimeoutError(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var rec recorder
		fnCtxEnded := false
		start := time.Now()
		err := tenace.NewPolicy().WithTimeout(time.Minute).OnEvent(rec.on).Execute(bg, func(ctx context.Context) error {
			<-ctx.Done()
			fnCtxEnded = true
			return ctx.Err()
		}, tenace.WithKey("job-7"))
		var te *tenace.TimeoutError
		require.ErrorAs(t, err, &te)
		require.Equal(t, time.Minute, te.Timeout)
		require.ErrorIs(t, err, context.DeadlineExceeded)
		require.True(t, fnCtxEnded)
		require.False(t, te.BeforeFn, "fn ran")
		require.Equal(t, time.Minute, time.Since(start))
		require.Equal(t, []string{"timeout:job-7"}, rec.names(), "the timeout event carries the execution key")
		require.ErrorContains(t, err, "1m0s")
	})
}

// A Timeout added after a lock bounds the lock's wait too; when the wait
// takes all of it, fn never runs and the error says so, instead of telling
// the caller to make the work faster. Its advice is the order that bounds
// the work alone: WithTimeout added before the lock (a step wraps the steps
// added before it), not after, which is the order that failed here.
func TestATimeoutThatEndsTheLockWaitSaysTheWorkDidNotStart(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := tenace.NewMemoryLockProvider()
		defer p.Close()
		other, err := p.Acquire(bg, "job-7", tenace.LockAcquireOptions{})
		require.NoError(t, err)
		ran := false
		err = tenace.NewPolicy().WithLock(tenace.LockOptions{Provider: p}).WithTimeout(time.Minute).
			Execute(bg, func(context.Context) error { ran = true; return nil }, tenace.WithKey("job-7"))
		var te *tenace.TimeoutError
		require.ErrorAs(t, err, &te)
		require.False(t, ran)
		require.True(t, te.BeforeFn)
		require.ErrorIs(t, err, context.DeadlineExceeded)
		require.EqualError(t, err, `tenace: the work did not start within its 1m0s timeout (key "job-7"); add WithTimeout before the step that waited (a lock), or raise its duration`)
		require.NoError(t, other.Release(bg))
		require.Equal(t, 0, p.Size(), "the abandoned wait left nothing behind")
	})
}

func TestTimeoutEventKeyIsEmptyWithoutExecutionKey(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var rec recorder
		_ = tenace.NewPolicy().WithTimeout(time.Second).OnEvent(rec.on).Execute(bg, func(ctx context.Context) error {
			<-ctx.Done()
			return nil
		})
		require.Equal(t, []string{"timeout:"}, rec.names())
	})
}

func TestWithTimeoutGivesARealDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		_ = tenace.NewPolicy().WithTimeout(time.Minute).Execute(bg, func(ctx context.Context) error {
			d, ok := ctx.Deadline()
			require.True(t, ok)
			require.Equal(t, time.Now().Add(time.Minute), d)
			return nil
		})
	})
}

func TestWithTimeoutOnAFakeClock(t *testing.T) {
	clk := fakeclock.New()
	entered := make(chan struct{})
	result := make(chan error, 1)
	go func() {
		result <- tenace.NewPolicy().WithTimeout(time.Minute).WithClock(clk).Execute(bg, func(ctx context.Context) error {
			d, ok := ctx.Deadline()
			if !ok || !d.Equal(clk.Now().Add(time.Minute)) {
				return errors.New("wrong deadline")
			}
			close(entered)
			<-ctx.Done()
			return ctx.Err()
		})
	}()
	<-entered
	clk.Advance(time.Minute)
	err := <-result
	var te *tenace.TimeoutError
	require.ErrorAs(t, err, &te)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.Zero(t, clk.Pending())
}

// Inside fn, the cause of a context that WithTimeout's deadline ended is
// errors.Is context.DeadlineExceeded, as a context.WithTimeout's is, on the
// system clock and on a test clock; it names the step. (A cause that
// matched nothing would make fn code that checks context.Cause(ctx) for a
// deadline take the timeout for something else.)
func TestTheCauseOfATimeoutIsDeadlineExceeded(t *testing.T) {
	requireCause := func(t *testing.T, err error) {
		t.Helper()
		var te *tenace.TimeoutError
		require.ErrorAs(t, err, &te)
		require.ErrorIs(t, te.Err, context.DeadlineExceeded, "fn returned context.Cause(ctx): %v", te.Err)
		require.ErrorContains(t, te.Err, "WithTimeout(1m0s)")
	}
	synctest.Test(t, func(t *testing.T) {
		requireCause(t, tenace.NewPolicy().WithTimeout(time.Minute).Execute(bg, func(ctx context.Context) error {
			<-ctx.Done()
			return context.Cause(ctx)
		}))
	})
	clk := fakeclock.New()
	entered := make(chan struct{})
	result := make(chan error, 1)
	go func() {
		result <- tenace.NewPolicy().WithTimeout(time.Minute).WithClock(clk).Execute(bg, func(ctx context.Context) error {
			close(entered)
			<-ctx.Done()
			return context.Cause(ctx)
		})
	}()
	<-entered
	clk.Advance(time.Minute)
	requireCause(t, <-result)
}

func TestWithTimeoutReturnsTheParentsErrorWhenTheParentEndsFirst(t *testing.T) {
	ctx, cancel := context.WithCancel(bg)
	var rec recorder
	err := tenace.NewPolicy().WithTimeout(time.Hour).OnEvent(rec.on).Execute(ctx, func(ctx context.Context) error {
		cancel()
		<-ctx.Done()
		return ctx.Err()
	})
	require.ErrorIs(t, err, context.Canceled)
	var te *tenace.TimeoutError
	require.False(t, errors.As(err, &te), "the timeout did not fire")
	require.Empty(t, rec.names())
}

func TestWithTimeoutWithAParentDeadlineEarlierThanItsOwn(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx, cancel := context.WithTimeout(bg, time.Second)
		defer cancel()
		err := tenace.NewPolicy().WithTimeout(time.Hour).Execute(ctx, func(ctx context.Context) error {
			<-ctx.Done()
			return ctx.Err()
		})
		var te *tenace.TimeoutError
		require.False(t, errors.As(err, &te), "the parent's deadline is not the step's")
		require.ErrorIs(t, err, context.DeadlineExceeded)
	})
}

// The step never returns before fn returns: an outer lock stays held while
// fn, ignoring its context, runs past the deadline.
func TestWithTimeoutWaitsForFnAndTheOuterLockStaysHeld(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := tenace.NewMemoryLockProvider()
		defer p.Close()
		var fnDone time.Time
		err := tenace.NewPolicy().WithTimeout(time.Second).WithLock(tenace.LockOptions{Provider: p, Key: "k"}).
			Execute(bg, func(ctx context.Context) error {
				time.Sleep(5 * time.Second) // fake time: fn ignores its context
				l, _ := p.Acquire(bg, "k", tenace.LockAcquireOptions{Timeout: tenace.NoWait})
				require.Nil(t, l, "the lock is still held after the deadline")
				fnDone = time.Now()
				return nil
			})
		require.True(t, time.Now().Equal(fnDone), "returned only when fn returned")
		var te *tenace.TimeoutError
		require.ErrorAs(t, err, &te)
		require.Nil(t, te.Err, "fn finished anyway")
		requireIdle(t, p, "k")
	})
}

func TestGetReturnsTheValueOrTheZeroValue(t *testing.T) {
	p, _ := newProvider(t)
	pol := tenace.NewPolicy().WithLock(tenace.LockOptions{Provider: p, Key: "k"})
	v, err := tenace.Get(bg, pol, func(context.Context) (int, error) { return 42, nil })
	require.NoError(t, err)
	require.Equal(t, 42, v)
	v, err = tenace.Get(bg, pol, func(context.Context) (int, error) { return 7, errBoom })
	require.Same(t, errBoom, err)
	require.Zero(t, v, "the zero T with any error")
	v, err = tenace.Get(bg, tenace.NewPolicy().WithLock(tenace.LockOptions{Provider: p}), func(context.Context) (int, error) { return 7, nil })
	require.ErrorIs(t, err, tenace.ErrMissingKey)
	require.Zero(t, v)
	requireIdle(t, p, "k")
}

func TestMisusePanicsWithTenacePrefix(t *testing.T) {
	pol := tenace.NewPolicy()
	for name, f := range map[string]func(){
		"nil fn":       func() { _ = pol.Execute(bg, nil) },
		"nil strategy": func() { pol.With(nil) },
		// A nil *Lock or *Timeout is a nil strategy too (a variable never
		// set): unchecked, it would crash the first Execute with a bare nil
		// dereference.
		"nil *Lock":    func() { pol.With((*tenace.Lock)(nil)) },
		"nil *Timeout": func() { pol.With((*policy.Timeout)(nil)) },
		"nil *Timeout in a pipeline": func() {
			_ = policy.Pipeline{}.With((*policy.Timeout)(nil))
		},
		"nil listener": func() { pol.OnEvent(nil) },
		"nil Get fn":   func() { _, _ = tenace.Get[int](bg, pol, nil) },
		//lint:ignore SA1012 the misuse under test
		"nil ctx":     func() { _ = pol.Execute(nil, noop) },
		"zero shards": func() { tenace.WithShards(0) },
		"nil memory provider": func() {
			_ = pol.WithLock(tenace.LockOptions{Provider: (*tenace.MemoryLockProvider)(nil), Key: "k"}).Execute(bg, noop)
		},
		"nil memory provider, Acquire": func() {
			_, _ = (*tenace.MemoryLockProvider)(nil).Acquire(bg, "k", tenace.LockAcquireOptions{})
		},
		// These three crashed with a bare nil dereference.
		"nil ctx, memory provider's Acquire": func() {
			//lint:ignore SA1012 the misuse under test
			_, _ = tenace.DefaultLockProvider().Acquire(nil, "k", tenace.LockAcquireOptions{})
		},
		"zero memory provider, Acquire": func() {
			_, _ = new(tenace.MemoryLockProvider).Acquire(bg, "k", tenace.LockAcquireOptions{})
		},
		"zero memory provider, Stats": func() { _ = new(tenace.MemoryLockProvider).Stats() },
		"zero memory provider, Size":  func() { _ = new(tenace.MemoryLockProvider).Size() },
		"zero memory provider, Close": func() { _ = new(tenace.MemoryLockProvider).Close() },
		"nil memory provider, Stats":  func() { _ = (*tenace.MemoryLockProvider)(nil).Stats() },
		"nil memory provider, Size":   func() { _ = (*tenace.MemoryLockProvider)(nil).Size() },
		"nil memory provider, Close":  func() { _ = (*tenace.MemoryLockProvider)(nil).Close() },
	} {
		t.Run(name, func(t *testing.T) {
			defer func() {
				r := recover()
				require.NotNil(t, r)
				require.Contains(t, r, "tenace: ")
			}()
			f()
		})
	}
}

// ---- Policies ----

func TestStepsWrapTheStepsAddedBeforeThem(t *testing.T) {
	var log []string
	pol := tenace.NewPolicy().With(step{"a", &log}).With(step{"b", &log}).With(step{"c", &log})
	require.NoError(t, pol.Execute(bg, func(context.Context) error { log = append(log, "fn"); return nil }))
	require.Equal(t, []string{"enter c", "enter b", "enter a", "fn", "leave a", "leave b", "leave c"}, log)
}

func TestAddingAStepNeverChangesAnEarlierPolicy(t *testing.T) {
	var log []string
	base := tenace.NewPolicy().With(step{"base", &log}).With(step{"base2", &log})
	left := base.With(step{"left", &log})
	right := base.With(step{"right", &log}) // would overwrite left's step with a shared backing array
	run := func(p tenace.Policy) []string {
		log = nil
		require.NoError(t, p.Execute(bg, noop))
		return log
	}
	require.Equal(t, []string{"enter base2", "enter base", "leave base", "leave base2"}, run(base))
	require.Equal(t, []string{"enter left", "enter base2", "enter base", "leave base", "leave base2", "leave left"}, run(left))
	require.Equal(t, []string{"enter right", "enter base2", "enter base", "leave base", "leave base2", "leave right"}, run(right))
	// Listeners too.
	var a, b recorder
	l1 := base.OnEvent(a.on)
	l2 := base.OnEvent(b.on)
	require.NoError(t, l1.WithLock(tenace.LockOptions{Provider: &fakeProvider{}, Key: "k"}).Execute(bg, noop))
	require.NotEmpty(t, a.names())
	require.Empty(t, b.names(), "l2's listener is not l1's")
	_ = l2
}

func TestTimeoutInsideLockBoundsTheWorkNotTheWait(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := tenace.NewMemoryLockProvider()
		defer p.Close()
		blocker := mustAcquire(t, p, "k")
		go func() { time.Sleep(2 * time.Minute); _ = blocker.Release(bg) }()
		start := time.Now()
		pol := tenace.NewPolicy().WithTimeout(time.Minute).WithLock(tenace.LockOptions{Provider: p, Key: "k"})
		err := pol.Execute(bg, func(ctx context.Context) error {
			require.Equal(t, 2*time.Minute, time.Since(start), "waited past the minute for the lock")
			d, _ := ctx.Deadline()
			require.Equal(t, time.Minute, time.Until(d), "and still got the whole minute for the work")
			return nil
		})
		require.NoError(t, err)
	})
}

func TestTimeoutOutsideLockBoundsTheWaitToo(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := tenace.NewMemoryLockProvider()
		defer p.Close()
		blocker := mustAcquire(t, p, "k")
		ran := false
		start := time.Now()
		err := tenace.NewPolicy().WithLock(tenace.LockOptions{Provider: p, Key: "k"}).WithTimeout(time.Minute).
			Execute(bg, func(context.Context) error { ran = true; return nil })
		var te *tenace.TimeoutError
		require.ErrorAs(t, err, &te)
		require.Equal(t, time.Minute, time.Since(start))
		require.False(t, ran)
		require.NoError(t, blocker.Release(bg))
		requireIdle(t, p, "k")
	})
}

func TestListenersArePolicyWideAndRunInOrder(t *testing.T) {
	var order []string
	fp := &fakeProvider{}
	pol := tenace.NewPolicy().
		OnEvent(func(e tenace.Event) { order = append(order, "first "+e.Name) }).
		WithLock(tenace.LockOptions{Provider: fp, Key: "inner"}).
		WithLock(tenace.LockOptions{Provider: fp, Key: "outer"}).
		OnEvent(func(e tenace.Event) { order = append(order, "second "+e.Name+":"+e.Key) })
	require.NoError(t, pol.Execute(bg, noop))
	require.Equal(t, []string{
		"first lock.acquiring", "second lock.acquiring:outer",
		"first lock.acquired", "second lock.acquired:outer",
		"first lock.acquiring", "second lock.acquiring:inner",
		"first lock.acquired", "second lock.acquired:inner",
		"first lock.released", "second lock.released:inner",
		"first lock.released", "second lock.released:outer",
	}, order, "both listeners see the events of both steps, in the order added")
}

func TestAPanickingListenerPanicsOnUpAndTheLockIsReleased(t *testing.T) {
	p, _ := newProvider(t)
	pol := tenace.NewPolicy().WithLock(tenace.LockOptions{Provider: p, Key: "k"}).OnEvent(func(e tenace.Event) {
		if e.Name == tenace.EventLockAcquired {
			panic("listener")
		}
	})
	require.PanicsWithValue(t, "listener", func() { _ = pol.Execute(bg, noop) })
	requireIdle(t, p, "k")
}

// A listener that panics does not keep the event from the listeners added
// after it: each sees every event, so that a listener pairing events (a
// gauge of waiters: +1 on acquiring, -1 when the wait ends) stays balanced
// however another listener fails. Whichever event the panic comes from, it
// goes on up through Execute (of two, the last: the one raised while the
// first unwound) and the lock is released.
func TestAPanickingListenerKeepsTheOthersEventsPaired(t *testing.T) {
	for _, on := range []string{tenace.EventLockAcquiring, tenace.EventLockAcquired, tenace.EventLockReleased} {
		t.Run(on, func(t *testing.T) {
			p, _ := newProvider(t)
			var seen []string
			pol := tenace.NewPolicy().WithLock(tenace.LockOptions{Provider: p, Key: "k"}).
				OnEvent(func(e tenace.Event) {
					if e.Name == on {
						panic("first")
					}
				}).
				OnEvent(func(e tenace.Event) {
					if e.Name == on {
						panic("second")
					}
				}).
				OnEvent(func(e tenace.Event) { seen = append(seen, e.Name) })
			require.PanicsWithValue(t, "second", func() { _ = pol.Execute(bg, noop) })
			requireIdle(t, p, "k")
			want := map[string][]string{
				// The acquire was never made: the wait ends as failed.
				tenace.EventLockAcquiring: {tenace.EventLockAcquiring, tenace.EventLockFailed},
				tenace.EventLockAcquired:  {tenace.EventLockAcquiring, tenace.EventLockAcquired, tenace.EventLockReleased},
				tenace.EventLockReleased:  {tenace.EventLockAcquiring, tenace.EventLockAcquired, tenace.EventLockReleased},
			}[on]
			require.Equal(t, want, seen)
		})
	}
}

// A provider whose Acquire panics ends the wait every listener has seen
// begin: lock.failed follows lock.acquiring (a waiting gauge returns to 0)
// as the panic goes on up through Execute.
func TestAPanickingProviderEndsTheWaitWithFailed(t *testing.T) {
	fp := &fakeProvider{acquire: func(context.Context, string) (tenace.LockLease, error) { panic("provider") }}
	var rec recorder
	pol := tenace.NewPolicy().WithLock(tenace.LockOptions{Provider: fp, Key: "k"}).OnEvent(rec.on)
	require.PanicsWithValue(t, "provider", func() { _ = pol.Execute(bg, noop) })
	require.Equal(t, []string{"lock.acquiring:k", "lock.failed:k"}, rec.names())
	require.Error(t, rec.events[1].Err)
}

func TestAPolicyIsSafeToShareBetweenGoroutines(t *testing.T) {
	p, _ := newProvider(t)
	pol := tenace.NewPolicy().WithTimeout(time.Minute).WithLock(tenace.LockOptions{Provider: p})
	counters := map[string]*int{"a": new(int), "b": new(int)}
	var wg sync.WaitGroup
	for i := range 8 {
		key := []string{"a", "b"}[i%2]
		wg.Go(func() {
			for range 200 {
				require.NoError(t, pol.Execute(bg, func(context.Context) error { *counters[key]++; return nil }, tenace.WithKey(key)))
			}
		})
	}
	wg.Wait()
	require.Equal(t, 800, *counters["a"])
	require.Equal(t, 800, *counters["b"])
	requireIdle(t, p, "a", "b")
}

// ---- Lock ----

func TestTheLockIsReleasedWhenFnReturnsErrorsOrPanics(t *testing.T) {
	p, _ := newProvider(t)
	pol := tenace.NewPolicy().WithLock(tenace.LockOptions{Provider: p, Key: "k"})
	require.NoError(t, pol.Execute(bg, noop))
	requireIdle(t, p, "k")
	require.Error(t, pol.Execute(bg, func(context.Context) error { return errBoom }))
	requireIdle(t, p, "k")
	require.PanicsWithValue(t, "fn", func() { _ = pol.Execute(bg, func(context.Context) error { panic("fn") }) })
	requireIdle(t, p, "k")
}

func TestTheLockIsReleasedWithAContextThatIsNotCancelled(t *testing.T) {
	fp := &fakeProvider{}
	ctx, cancel := context.WithCancel(bg)
	err := tenace.NewPolicy().WithLock(tenace.LockOptions{Provider: fp, Key: "k"}).Execute(ctx, func(context.Context) error {
		cancel()
		return nil
	})
	require.NoError(t, err)
	require.Equal(t, 1, fp.releaseCount())
	require.NoError(t, fp.released[0].releaseCtx, "the release reaches its server")
}

func TestAFailureToReleaseIsIgnored(t *testing.T) {
	fp := &fakeProvider{}
	fp.acquire = func(context.Context, string) (tenace.LockLease, error) {
		return &fakeLease{p: fp, releaseErr: errBoom}, nil
	}
	var rec recorder
	err := tenace.NewPolicy().WithLock(tenace.LockOptions{Provider: fp, Key: "k"}).OnEvent(rec.on).Execute(bg, noop)
	require.NoError(t, err, "the work is done; a distributed lock expires on its own")
	require.Equal(t, []string{"lock.acquiring:k", "lock.acquired:k", "lock.released:k"}, rec.names())
	require.Same(t, errBoom, rec.events[2].Err, "listeners see the failed release")
}

func TestTwoPoliciesWithoutProviderExcludeEachOther(t *testing.T) {
	key := "reports-" + t.Name()
	p1 := tenace.NewPolicy().WithLock(tenace.LockOptions{Key: key})
	p2 := tenace.NewPolicy().WithTimeout(time.Minute).WithLock(tenace.LockOptions{Key: key, Timeout: tenace.NoWait})
	err := p1.Execute(bg, func(context.Context) error {
		require.Positive(t, tenace.DefaultLockProvider().Size(), "the shared default provider holds it")
		return p2.Execute(bg, noop)
	})
	var nae *tenace.LockNotAcquiredError
	require.ErrorAs(t, err, &nae, "p2 found the key held by p1")
	require.NoError(t, p2.Execute(bg, noop), "free again afterwards")
}

func TestLocksAreNotReentrant(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := tenace.NewMemoryLockProvider()
		defer p.Close()
		inner := tenace.NewPolicy().WithLock(tenace.LockOptions{Provider: p, Timeout: time.Second})
		outer := tenace.NewPolicy().WithLock(tenace.LockOptions{Provider: p})
		start := time.Now()
		err := outer.Execute(bg, func(ctx context.Context) error {
			return inner.Execute(ctx, noop, tenace.WithKey("k")) // same key: would wait for itself
		}, tenace.WithKey("k"))
		var d *tenace.DeadlockError
		require.ErrorAs(t, err, &d)
		require.Equal(t, "k", d.Key)
		require.Zero(t, time.Since(start), "answered at once, not at the inner Timeout")
		// Distinct keys nest fine.
		require.NoError(t, outer.Execute(bg, func(ctx context.Context) error {
			return inner.Execute(ctx, noop, tenace.WithKey("k2"))
		}, tenace.WithKey("k")))
		requireIdle(t, p, "k", "k2")
	})
}

func TestTheKeyComesFromTheLockElseTheExecution(t *testing.T) {
	fp := &fakeProvider{}
	require.NoError(t, tenace.NewPolicy().WithLock(tenace.LockOptions{Provider: fp, Key: "lock-key"}).Execute(bg, noop, tenace.WithKey("exec-key")))
	require.Equal(t, "lock-key", fp.lastCall().key)
	require.NoError(t, tenace.NewPolicy().WithLock(tenace.LockOptions{Provider: fp}).Execute(bg, noop, tenace.WithKey("exec-key")))
	require.Equal(t, "exec-key", fp.lastCall().key)
}

func TestTimeoutTTLAndClockArePassedToTheProvider(t *testing.T) {
	fp := &fakeProvider{}
	clk := fakeclock.New()
	require.NoError(t, tenace.NewPolicy().WithClock(clk).
		WithLock(tenace.LockOptions{Provider: fp, Key: "k", Timeout: 3 * time.Second, TTL: 30 * time.Second}).Execute(bg, noop))
	got := fp.lastCall().opts
	require.Equal(t, 3*time.Second, got.Timeout)
	require.Equal(t, 30*time.Second, got.TTL)
	require.Same(t, clk, got.Clock)
}

func TestLeaseFromReturnsTheNearestLocksLease(t *testing.T) {
	p, _ := newProvider(t)
	var outerTok, innerTok uint64
	pol := tenace.NewPolicy().
		With(tenace.NewLock(tenace.LockOptions{Provider: p, Key: "inner"})).
		With(tenace.NewLock(tenace.LockOptions{Provider: p, Key: "outer"}))
	_, ok := tenace.LeaseFrom(bg)
	require.False(t, ok, "no lease outside a Lock")
	require.NoError(t, pol.Execute(bg, func(ctx context.Context) error {
		l, ok := tenace.LeaseFrom(ctx)
		require.True(t, ok)
		innerTok = l.(tenace.FencedLease).Token()
		return nil
	}))
	require.NoError(t, tenace.NewPolicy().WithLock(tenace.LockOptions{Provider: p, Key: "outer"}).Execute(bg, func(ctx context.Context) error {
		l, _ := tenace.LeaseFrom(ctx)
		outerTok = l.(tenace.FencedLease).Token()
		return nil
	}))
	require.NotZero(t, innerTok)
	require.NotEqual(t, innerTok, outerTok)
	// A fake provider's lease comes back as it is.
	fp := &fakeProvider{}
	require.NoError(t, tenace.NewPolicy().WithLock(tenace.LockOptions{Provider: fp, Key: "k"}).Execute(bgWithValue, func(ctx context.Context) error {
		l, ok := tenace.LeaseFrom(ctx)
		require.True(t, ok)
		require.IsType(t, &fakeLease{}, l)
		require.Equal(t, "v", ctx.Value(ctxKey{}), "other values still reach fn")
		return nil
	}, tenace.WithKey("k")))
}

// The context fn runs with must behave as the parent plus the lease —
// values, deadline, cancellation and its cause, propagation to children —
// and stay so after Execute returns, for a goroutine that kept it.
func TestTheHoldingContextIsTheParentPlusTheLease(t *testing.T) {
	p, _ := newProvider(t)
	pol := tenace.NewPolicy().WithLock(tenace.LockOptions{Provider: p, Key: "k"})
	deadline := time.Now().Add(time.Hour)
	parent, stop := context.WithDeadline(bgWithValue, deadline)
	defer stop()
	parent, cancel := context.WithCancelCause(parent)
	cause := errors.New("the caller is done")
	var kept []context.Context
	var tokens []uint64
	for range 2 {
		require.NoError(t, pol.Execute(parent, func(ctx context.Context) error {
			l, ok := tenace.LeaseFrom(ctx)
			require.True(t, ok)
			tokens = append(tokens, l.(tenace.FencedLease).Token())
			require.Equal(t, "v", ctx.Value(ctxKey{}))
			got, ok := ctx.Deadline()
			require.True(t, ok)
			require.Equal(t, deadline, got)
			require.NoError(t, ctx.Err())
			kept = append(kept, ctx)
			return nil
		}))
	}
	require.NotSame(t, kept[0], kept[1], "each grant is its own context")
	require.Less(t, tokens[0], tokens[1])
	child, stopChild := context.WithCancel(kept[0])
	defer stopChild()
	cancel(cause)
	for i, ctx := range kept {
		<-ctx.Done()
		require.ErrorIs(t, ctx.Err(), context.Canceled)
		require.Same(t, cause, context.Cause(ctx))
		l, ok := tenace.LeaseFrom(ctx)
		require.True(t, ok, "a kept context still carries its lease")
		require.Equal(t, tokens[i], l.(tenace.FencedLease).Token())
		require.NoError(t, l.Release(bg), "a second Release changes nothing")
	}
	<-child.Done()
	require.Same(t, cause, context.Cause(child), "cancellation reaches a child of the holding context")
	requireIdle(t, p, "k")
}

type ctxKey struct{}

func init() { bgWithValue = context.WithValue(context.Background(), ctxKey{}, "v") }

var bgWithValue context.Context

// ---- The source document's Behavior, Error channel and Events ----

func TestDefaultProviderGrantsInArrivalOrderThroughPolicies(t *testing.T) {
	p, queued := newProvider(t, tenace.WithShards(1))
	pol := tenace.NewPolicy().WithLock(tenace.LockOptions{Provider: p, Key: "k"})
	blocker := mustAcquire(t, p, "k")
	var order []int
	results := make([]chan error, 5)
	for i := range results {
		results[i] = make(chan error, 1)
		go func() {
			results[i] <- pol.Execute(bg, func(context.Context) error { order = append(order, i); return nil })
		}()
		<-queued
	}
	require.NoError(t, blocker.Release(bg))
	for _, r := range results {
		require.NoError(t, <-r)
	}
	require.Equal(t, []int{0, 1, 2, 3, 4}, order)
	requireIdle(t, p, "k")
}

func TestSizeCountsKeysHeldOrWaitedForThroughAPolicy(t *testing.T) {
	p, _ := newProvider(t)
	pol := tenace.NewPolicy().WithLock(tenace.LockOptions{Provider: p})
	require.NoError(t, pol.Execute(bg, func(ctx context.Context) error {
		return pol.Execute(ctx, func(context.Context) error {
			require.Equal(t, 2, p.Size())
			return nil
		}, tenace.WithKey("b"))
	}, tenace.WithKey("a")))
	requireIdle(t, p, "a", "b")
}

func TestEventsAcquiredAndReleasedCarryTheLockKey(t *testing.T) {
	p, _ := newProvider(t)
	var rec recorder
	require.NoError(t, tenace.NewPolicy().WithLock(tenace.LockOptions{Provider: p}).OnEvent(rec.on).Execute(bg, noop, tenace.WithKey("k")))
	require.Equal(t, []string{"lock.acquiring:k", "lock.acquired:k", "lock.released:k"}, rec.names())
}

func TestErrorMessagesSayWhatHappenedAndWhatToDo(t *testing.T) {
	for timeout, want := range map[time.Duration]string{
		5 * time.Second: `tenace: lock "reports" not acquired within its 5s timeout: another call holds it; retry later or raise LockOptions.Timeout`,
		tenace.NoWait:   `tenace: lock "reports" not acquired at once (NoWait): another call holds it; retry later, or wait with a LockOptions.Timeout`,
		0:               `tenace: lock "reports" not acquired: another call holds it; retry later`,
	} {
		require.Equal(t, want, (&tenace.LockNotAcquiredError{Key: "reports", Timeout: timeout}).Error())
	}
	require.Equal(t, "tenace: the lock provider failed, so the work did not run: boom", (&tenace.UnexpectedError{Err: errBoom}).Error())
	require.Equal(t, "tenace: the lock provider failed, so the work did not run", (&tenace.UnexpectedError{}).Error(), "a value built by hand without Err")
	require.Contains(t, tenace.ErrMissingKey.Error(), "LockOptions.Key")
	require.Contains(t, tenace.ErrProviderClosed.Error(), "closed")
	require.Contains(t, (&tenace.TimeoutError{Timeout: time.Second, Key: "k"}).Error(), `(key "k")`)
}

// A key can come from a request (WithKey("customer:"+id)): a 10 MiB one made
// a 10 MiB error message, which LogEvents logged in every rejected event's
// err. The messages quote 256 bytes of it; the errors' Key fields keep it
// (and so does LogEvents' key attribute, which its doc says to rewrite in
// the handler).
func TestErrorMessagesCutALongKey(t *testing.T) {
	long := strings.Repeat("k", 10<<20)
	want := `"` + strings.Repeat("k", 256) + `"… (10485760 bytes)`
	p, _ := newProvider(t)
	blocker := mustAcquire(t, p, long)
	err := tenace.NewPolicy().WithLock(tenace.LockOptions{Provider: p, Timeout: tenace.NoWait}).Execute(bg, noop, tenace.WithKey(long))
	var busy *tenace.LockNotAcquiredError
	require.ErrorAs(t, err, &busy)
	require.Equal(t, long, busy.Key)
	require.NotNil(t, busy.Holder, "the memory provider names the holder")
	require.Less(t, len(err.Error())-len(busy.Holder.Owner), 400, "the key cut, beside the holder's name")
	require.Contains(t, err.Error(), want)
	require.NoError(t, blocker.Release(bg))

	te := &tenace.TimeoutError{Timeout: time.Second, Key: long}
	require.Less(t, len(te.Error()), 400)
	require.Contains(t, te.Error(), "(key "+want+")")
	te.BeforeFn = true
	require.Contains(t, te.Error(), "(key "+want+")")
}

// TestPolicyMatchesTheTable draws pipeline shapes and executions and checks
// each against an independent reckoning of the "What Execute returns" table
// (see proptest.PolicyProperty), on the fake clock of a synctest bubble.
func TestPolicyMatchesTheTable(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rapid.Check(proptest.BubbleTB{T: t}, proptest.PolicyProperty)
	})
}

// expiringLease is a fake lease that is lost at a given instant, as a
// provider's TTL would lose it.
type expiringLease struct {
	fakeLease
	tenace.LeaseSignal
}

func newExpiringLease(fp *fakeProvider, at time.Time) *expiringLease {
	l := &expiringLease{fakeLease: fakeLease{p: fp}}
	time.AfterFunc(time.Until(at), func() { l.Lose(tenace.ErrLeaseExpired) })
	return l
}

func TestFnsContextEndsWhenItsLeaseExpires(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		fp := &fakeProvider{}
		fp.acquire = func(context.Context, string) (tenace.LockLease, error) {
			return newExpiringLease(fp, time.Now().Add(3*time.Second)), nil
		}
		start := time.Now()
		err := tenace.NewPolicy().WithLock(tenace.LockOptions{Provider: fp, Key: "k"}).Execute(bg, func(ctx context.Context) error {
			<-ctx.Done()
			require.Equal(t, 3*time.Second, time.Since(start))
			require.ErrorIs(t, context.Cause(ctx), tenace.ErrLeaseExpired, "the cause says the lease expired")
			return context.Cause(ctx)
		})
		require.ErrorIs(t, err, tenace.ErrLeaseExpired)
		require.Equal(t, 1, fp.releaseCount(), "and it is still released")
	})
}

// Nested Timeout steps: when the outer deadline fires, only the outer step
// reports a TimeoutError and a timeout event; the inner one, whose own
// deadline is an hour away, returns its inner steps' error unchanged.
// (A context inherits its parent's cause: were the cause the same for every
// Timeout, the inner step would take the outer deadline for its own, a
// TimeoutError of 1h inside one of 10ms, and two events.)
func TestNestedTimeoutsReportOnlyTheDeadlineThatFired(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var rec recorder
		pol := tenace.NewPolicy().WithTimeout(time.Hour).WithTimeout(10 * time.Millisecond).OnEvent(rec.on)
		err := pol.Execute(bg, func(ctx context.Context) error {
			<-ctx.Done()
			return ctx.Err()
		})
		var te *tenace.TimeoutError
		require.ErrorAs(t, err, &te)
		require.Equal(t, 10*time.Millisecond, te.Timeout, "the outer step's deadline fired")
		var inner *tenace.TimeoutError
		require.False(t, errors.As(te.Err, &inner), "the 1h step reported a deadline that was not its own: %v", te.Err)
		require.Equal(t, []string{tenace.EventTimeout + ":"}, rec.names(), "one deadline, one event")
	})
}

// A Timeout step whose inner steps panic stops its timer on the way out,
// as the Lock step releases its lock: nothing stays registered on the
// clock (nor, with a real clock and a parent context that is not the
// standard library's, a goroutine until the deadline).
func TestATimeoutStepStopsItsTimerWhenFnPanics(t *testing.T) {
	clock := fakeclock.New()
	pol := tenace.NewPolicy().WithTimeout(time.Hour).WithClock(clock)
	require.PanicsWithValue(t, "boom", func() {
		_ = pol.Execute(bg, func(context.Context) error { panic("boom") })
	})
	require.Zero(t, clock.Pending(), "the step's timer is still on the clock")
}

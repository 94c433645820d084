package failsafelock_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/failsafe-go/failsafe-go"
	"github.com/failsafe-go/failsafe-go/bulkhead"
	"github.com/failsafe-go/failsafe-go/circuitbreaker"
	"github.com/failsafe-go/failsafe-go/fallback"
	"github.com/failsafe-go/failsafe-go/hedgepolicy"
	"github.com/failsafe-go/failsafe-go/retrypolicy"
	"github.com/failsafe-go/failsafe-go/timeout"
	"github.com/stretchr/testify/require"

	"tenace.dev/tenace"
	"tenace.dev/tenace/failsafelock"
)

// A rejection is retried with failsafe-go's backoff, the listeners see each
// rejection and the grant, and fn, once it runs, sees the execution it
// belongs to: its attempt and retry counts and the last error.
func TestRetryBacksOffOnRejection(t *testing.T) {
	p := newMemory(t)
	holder := hold(t, p, "k")

	var delays []time.Duration
	retry := retrypolicy.NewBuilder[string]().
		HandleErrorTypes(&tenace.LockNotAcquiredError{}).
		WithBackoff(time.Millisecond, 100*time.Millisecond).
		WithMaxRetries(5).
		OnRetryScheduled(func(e failsafe.ExecutionScheduledEvent[string]) {
			delays = append(delays, e.Delay)
			if e.Attempts() == 2 { // the second rejection: the key comes free
				require.NoError(t, holder.Release(bg))
			}
		}).
		Build()
	var rejected, acquired, released int
	lock := failsafelock.NewBuilder[string](tenace.LockOptions{Provider: p, Key: "k", Timeout: tenace.NoWait}).
		OnRejected(func(e failsafe.ExecutionEvent[string]) {
			rejected++
			var nae *tenace.LockNotAcquiredError
			require.ErrorAs(t, e.LastError(), &nae)
			require.Equal(t, "k", nae.Key)
		}).
		OnAcquired(func(failsafe.ExecutionEvent[string]) { acquired++ }).
		OnReleased(func(failsafe.ExecutionEvent[string]) { released++ }).
		Build()

	runs := 0
	got, err := failsafe.With(retry, lock).GetWithExecution(func(exec failsafe.Execution[string]) (string, error) {
		runs++
		require.Equal(t, 3, exec.Attempts())
		require.Equal(t, 2, exec.Retries())
		require.True(t, exec.IsRetry())
		var nae *tenace.LockNotAcquiredError
		require.ErrorAs(t, exec.LastError(), &nae, "fn sees the last attempt's error")
		return "done", nil
	})
	require.NoError(t, err)
	require.Equal(t, "done", got)
	require.Equal(t, 1, runs)
	require.Equal(t, []time.Duration{time.Millisecond, 2 * time.Millisecond}, delays, "failsafe-go's backoff")
	require.Equal(t, [3]int{2, 1, 1}, [3]int{rejected, acquired, released})
	requireFree(t, p, "k")
}

// Retries exhausted on a held key: the last rejection comes out, and a
// Fallback outside can turn it into a value.
func TestFallbackAfterRejections(t *testing.T) {
	p := newMemory(t)
	holder := hold(t, p, "k")
	lock := failsafelock.New[string](tenace.LockOptions{Provider: p, Key: "k", Timeout: tenace.NoWait})
	retry := retrypolicy.NewBuilder[string]().WithMaxRetries(2).ReturnLastFailure().Build()
	ran := false
	fn := func() (string, error) { ran = true; return "fresh", nil }

	_, err := failsafe.With(retry, lock).Get(fn)
	var nae *tenace.LockNotAcquiredError
	require.ErrorAs(t, err, &nae)

	got, err := failsafe.With(fallback.NewWithResult("stale"), retry, lock).Get(fn)
	require.NoError(t, err)
	require.Equal(t, "stale", got)
	require.False(t, ran)

	require.NoError(t, holder.Release(bg))
	got, err = failsafe.With(fallback.NewWithResult("stale"), retry, lock).Get(fn)
	require.NoError(t, err)
	require.Equal(t, "fresh", got)
	requireFree(t, p, "k")
}

// A breaker that handles *tenace.UnexpectedError opens on provider failures
// and then keeps executions from the provider; contention does not open it.
func TestCircuitBreakerSeesProviderFailures(t *testing.T) {
	open := newMemory(t)
	holder := hold(t, open, "k")
	defer func() { _ = holder.Release(bg) }()
	closed := tenace.NewMemoryLockProvider()
	require.NoError(t, closed.Close())
	failing := &countingProvider{LockProvider: closed}

	newBreaker := func() circuitbreaker.CircuitBreaker[string] {
		return circuitbreaker.NewBuilder[string]().
			HandleErrorTypes(&tenace.UnexpectedError{}).
			WithFailureThreshold(2).
			WithDelay(time.Hour).
			Build()
	}
	fn := func() (string, error) { return "ran", nil }

	// Contention: three rejections, the breaker stays closed.
	cb := newBreaker()
	contended := failsafelock.New[string](tenace.LockOptions{Provider: open, Key: "k", Timeout: tenace.NoWait})
	for range 3 {
		_, err := failsafe.With(cb, contended).Get(fn)
		var nae *tenace.LockNotAcquiredError
		require.ErrorAs(t, err, &nae)
	}
	require.True(t, cb.IsClosed())

	// Provider failures: two, then the breaker is open and the provider is
	// not asked again.
	cb = newBreaker()
	lock := failsafelock.New[string](tenace.LockOptions{Provider: failing, Key: "k"})
	for range 2 {
		_, err := failsafe.With(cb, lock).Get(fn)
		var ue *tenace.UnexpectedError
		require.ErrorAs(t, err, &ue)
		require.ErrorIs(t, err, tenace.ErrProviderClosed)
	}
	require.True(t, cb.IsOpen())
	_, err := failsafe.With(cb, lock).Get(fn)
	require.ErrorIs(t, err, circuitbreaker.ErrOpen)
	require.Equal(t, int64(2), failing.acquires.Load())
}

// A failsafe-go Timeout outside the Lock ends the wait: the execution
// returns timeout.ErrExceeded, fn does not run, and the waiter has left the
// queue.
func TestTimeoutEndsTheWait(t *testing.T) {
	// In a synctest bubble the Timeout's 20ms pass only once every goroutine
	// of the bubble is blocked: the execution then waits in the provider's
	// queue, however slowly the machine runs, so the Timeout ends a wait and
	// never an execution that had not yet asked for the lock.
	synctest.Test(t, func(t *testing.T) {
		p := newMemory(t) // made inside the bubble
		holder := hold(t, p, "k")
		var events []string
		// The lock's own Timeout bounds a wait the execution's context would
		// not reach: such a wait ends rejected, not cancelled, and the test
		// fails instead of hanging.
		lock := failsafelock.NewBuilder[string](tenace.LockOptions{Provider: p, Key: "k", Timeout: 10 * time.Second}).
			OnEvent(func(e tenace.Event) { events = append(events, e.Name) }).
			Build()
		ran := false
		start := time.Now()
		_, err := failsafe.With(timeout.New[string](20*time.Millisecond), lock).Get(func() (string, error) {
			ran = true
			return "", nil
		})
		require.ErrorIs(t, err, timeout.ErrExceeded)
		require.Equal(t, 20*time.Millisecond, time.Since(start), "fake time: exactly the Timeout")
		require.False(t, ran)
		require.Equal(t, []string{tenace.EventLockAcquiring, tenace.EventLockCancelled}, events)
		require.Zero(t, p.Stats().Waiting)
		require.NoError(t, holder.Release(bg))
		requireFree(t, p, "k")
	})
}

// A failsafe-go Timeout outside the Lock reaches the work through
// exec.Context(); the lock is held until fn returns, then released.
func TestTimeoutEndsTheWork(t *testing.T) {
	p := newMemory(t)
	lock := failsafelock.New[string](tenace.LockOptions{Provider: p, Key: "k"})
	_, err := failsafe.With(timeout.New[string](20*time.Millisecond), lock).GetWithExecution(func(exec failsafe.Execution[string]) (string, error) {
		awaitDone(t, exec.Context())
		l, err := p.Acquire(bg, "k", tenace.LockAcquireOptions{Timeout: tenace.NoWait})
		require.NoError(t, err)
		require.Nil(t, l, "the lock is held while fn runs, even after the timeout")
		return "", exec.Context().Err()
	})
	require.ErrorIs(t, err, timeout.ErrExceeded)
	requireFree(t, p, "k")
}

// Cancelling the executor's context ends the wait with the context's error.
func TestCancelEndsTheWait(t *testing.T) {
	p := newMemory(t)
	holder := hold(t, p, "k")
	lock := failsafelock.New[string](tenace.LockOptions{Provider: p, Key: "k", Timeout: 10 * time.Second}) // bounded: see TestTimeoutEndsTheWait
	ctx, cancel := context.WithCancel(bg)
	done := make(chan error, 1)
	go func() {
		_, err := failsafe.With(retrypolicy.NewWithDefaults[string](), lock).WithContext(ctx).Get(func() (string, error) { return "", nil })
		done <- err
	}()
	waiting(t, p, 1)
	cancel()
	require.ErrorIs(t, <-done, context.Canceled)
	require.NoError(t, holder.Release(bg))
	requireFree(t, p, "k")
}

// Cancellation racing the grant, many rounds: whichever wins, fn either ran
// under the lock or did not run and the execution returns the context's
// error, and the key is free afterwards.
func TestCancelRacingTheGrant(t *testing.T) {
	p := newMemory(t)
	lock := failsafelock.New[string](tenace.LockOptions{Provider: p, Key: "k"})
	retry := retrypolicy.NewWithDefaults[string]()
	var ran, cancelled int
	for range 300 {
		holder := hold(t, p, "k")
		ctx, cancel := context.WithCancel(bg)
		done := make(chan error, 1)
		fnRan := false
		go func() {
			_, err := failsafe.With(retry, lock).WithContext(ctx).Get(func() (string, error) {
				fnRan = true
				return "ok", nil
			})
			done <- err
		}()
		waiting(t, p, 1)
		start := make(chan struct{})
		var wg sync.WaitGroup
		wg.Go(func() { <-start; cancel() })
		wg.Go(func() { <-start; _ = holder.Release(bg) })
		close(start)
		wg.Wait()
		err := <-done
		if fnRan {
			// The Lock returns fn's result; the Retry outside, seeing the
			// execution cancelled when fn returns, may report that instead
			// (failsafe-go's Retry checks for cancellation after each
			// attempt).
			if err != nil {
				require.ErrorIs(t, err, context.Canceled)
			}
			ran++
		} else {
			require.ErrorIs(t, err, context.Canceled)
			cancelled++
		}
		requireFree(t, p, "k")
	}
	t.Logf("fn ran %d times, cancelled %d times", ran, cancelled)
}

// A panic in fn goes on up, and the lock is released.
func TestPanicReleases(t *testing.T) {
	p := newMemory(t)
	// A bounded wait: after a leak, the next subtest is rejected (and
	// fails) instead of waiting forever.
	lock := failsafelock.New[string](tenace.LockOptions{Provider: p, Key: "k", Timeout: time.Second})
	pipelines := map[string]failsafe.Executor[string]{
		"lock":                 failsafe.With(lock),
		"retry, timeout, lock": failsafe.With(retrypolicy.NewWithDefaults[string](), timeout.New[string](time.Hour), lock),
		"lock, timeout":        failsafe.With(lock, timeout.New[string](time.Hour)),
	}
	for name, ex := range pipelines {
		t.Run(name, func(t *testing.T) {
			require.PanicsWithValue(t, "boom", func() {
				_, _ = ex.Get(func() (string, error) { panic("boom") })
			})
			requireFree(t, p, "k")
		})
	}
}

// A Bulkhead outside the Lock bounds the executions that hold or wait for
// it: with two permits, one holds, one waits, a third is refused at once.
func TestBulkheadBoundsTheWaiters(t *testing.T) {
	p := newMemory(t)
	bh := bulkhead.New[string](2)
	lock := failsafelock.New[string](tenace.LockOptions{Provider: p, Key: "k"})
	entered := make(chan struct{})
	leave := make(chan struct{})
	results := make(chan error, 2)
	for range 2 {
		go func() {
			_, err := failsafe.With(bh, lock).Get(func() (string, error) {
				entered <- struct{}{}
				<-leave
				return "", nil
			})
			results <- err
		}()
	}
	<-entered
	waiting(t, p, 1) // the second holds a permit and waits for the lock
	_, err := failsafe.With(bh, lock).Get(func() (string, error) { return "", nil })
	require.ErrorIs(t, err, bulkhead.ErrFull)
	close(leave)
	<-entered
	require.NoError(t, <-results)
	require.NoError(t, <-results)
	requireFree(t, p, "k")
}

// Executions with the same key run one at a time.
func TestExclusion(t *testing.T) {
	testExclusion(t, []tenace.LockProvider{newMemory(t)}, 8, 50)
}

// testExclusion runs, for each of providers, workers goroutines of rounds
// executions through Retry and a Lock on one key, and checks that no two
// overlapped, whichever provider they went through.
func testExclusion(t *testing.T, providers []tenace.LockProvider, workers, rounds int) {
	t.Helper()
	var inside atomic.Int32
	counter := 0 // guarded by the lock alone: -race reports a broken one
	var wg sync.WaitGroup
	for _, p := range providers {
		lock := failsafelock.New[int](tenace.LockOptions{Provider: p, Key: "counter"})
		retry := retrypolicy.NewWithDefaults[int]()
		for range workers {
			wg.Go(func() {
				for range rounds {
					_, err := failsafe.With(retry, lock).Get(func() (int, error) {
						if n := inside.Add(1); n != 1 {
							t.Errorf("%d executions inside the lock at once", n)
						}
						counter++
						inside.Add(-1)
						return counter, nil
					})
					if err != nil {
						t.Error(err)
					}
				}
			})
		}
	}
	wg.Wait()
	require.Equal(t, len(providers)*workers*rounds, counter)
	for _, p := range providers {
		requireFree(t, p, "counter")
	}
}

// fn finds the lease and its fencing token in exec.Context(), also under a
// Timeout inside the Lock; tokens grow grant after grant.
func TestLeaseReachesFn(t *testing.T) {
	p := newMemory(t)
	lock := failsafelock.New[uint64](tenace.LockOptions{Provider: p, Key: "k"})
	token := func(exec failsafe.Execution[uint64]) (uint64, error) {
		l, ok := tenace.LeaseFrom(exec.Context())
		require.True(t, ok, "tenace.LeaseFrom(exec.Context()) finds the lease")
		return l.(tenace.FencedLease).Token(), nil
	}
	var last uint64
	for _, ex := range []failsafe.Executor[uint64]{
		failsafe.With(lock),
		failsafe.With(retrypolicy.NewWithDefaults[uint64](), lock),
		failsafe.With(lock, timeout.New[uint64](time.Hour)),
	} {
		tok, err := ex.GetWithExecution(token)
		require.NoError(t, err)
		require.Greater(t, tok, last)
		last = tok
	}
	requireFree(t, p, "k")
}

// A lease lost while fn runs ends exec.Context() with a cause wrapping
// tenace.ErrLeaseLost, and OnEvent sees lock.lost before lock.released.
func TestLostLeaseEndsTheWork(t *testing.T) {
	p := &losableProvider{MemoryLockProvider: newMemory(t)}
	var events []string
	var mu sync.Mutex // lock.lost comes from another goroutine
	lock := failsafelock.NewBuilder[string](tenace.LockOptions{Provider: p, Key: "k"}).
		OnEvent(func(e tenace.Event) { mu.Lock(); events = append(events, e.Name); mu.Unlock() }).
		Build()
	_, err := failsafe.With(lock).GetWithExecution(func(exec failsafe.Execution[string]) (string, error) {
		p.last.Load().Lose(nil)
		awaitDone(t, exec.Context())
		return "", context.Cause(exec.Context())
	})
	require.ErrorIs(t, err, tenace.ErrLeaseLost)
	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, []string{tenace.EventLockAcquiring, tenace.EventLockAcquired, tenace.EventLockLost, tenace.EventLockReleased}, events)
	requireFree(t, p.MemoryLockProvider, "k")
}

// The key: LockOptions.Key, else the key function, by default the key
// WithKey put in the executor's context; with none, an error wrapping
// tenace.ErrMissingKey, and fn does not run.
func TestKeys(t *testing.T) {
	p := newMemory(t)
	keyOf := func(exec failsafe.Execution[string]) (string, error) {
		// Which key is held: the one that cannot be had now.
		for _, k := range []string{"fixed", "from-ctx", "from-func"} {
			l, err := p.Acquire(bg, k, tenace.LockAcquireOptions{Timeout: tenace.NoWait})
			if err != nil {
				return "", err
			}
			if l == nil {
				return k, nil
			}
			_ = l.Release(bg)
		}
		return "none", nil
	}
	ctx := failsafelock.WithKey(bg, "from-ctx")
	k, ok := failsafelock.KeyFrom(ctx)
	require.True(t, ok)
	require.Equal(t, "from-ctx", k)

	fixed := failsafelock.New[string](tenace.LockOptions{Provider: p, Key: "fixed"})
	got, err := failsafe.With(fixed).WithContext(ctx).GetWithExecution(keyOf)
	require.NoError(t, err)
	require.Equal(t, "fixed", got, "LockOptions.Key wins")

	perCall := failsafelock.New[string](tenace.LockOptions{Provider: p})
	got, err = failsafe.With(timeout.New[string](time.Hour), perCall).WithContext(ctx).GetWithExecution(keyOf)
	require.NoError(t, err)
	require.Equal(t, "from-ctx", got)

	type tenantKey struct{}
	byFunc := failsafelock.NewBuilder[string](tenace.LockOptions{Provider: p}).
		WithKeyFunc(func(ctx context.Context) string {
			s, _ := ctx.Value(tenantKey{}).(string)
			return s
		}).Build()
	got, err = failsafe.With(byFunc).WithContext(context.WithValue(bg, tenantKey{}, "from-func")).GetWithExecution(keyOf)
	require.NoError(t, err)
	require.Equal(t, "from-func", got)

	ran := false
	_, err = failsafe.With(perCall).Get(func() (string, error) { ran = true; return "", nil })
	require.ErrorIs(t, err, tenace.ErrMissingKey)
	require.Contains(t, err.Error(), "failsafelock.WithKey")
	require.False(t, ran)
	require.Zero(t, p.Size())
}

// An option out of range comes from each execution, wrapping
// tenace.ErrInvalidOption, as from tenace's own Lock.
func TestInvalidOption(t *testing.T) {
	p := newMemory(t)
	lock := failsafelock.New[string](tenace.LockOptions{Provider: p, Key: "k", TTL: -time.Second})
	_, err := failsafe.With(lock).Get(func() (string, error) { return "", nil })
	require.ErrorIs(t, err, tenace.ErrInvalidOption)
	require.Zero(t, p.Size())
}

// fn's error comes out unchanged, and the lock is released.
func TestFnErrorUnchanged(t *testing.T) {
	p := newMemory(t)
	errBoom := errors.New("boom")
	lock := failsafelock.New[string](tenace.LockOptions{Provider: p, Key: "k"})
	got, err := failsafe.With(lock).Get(func() (string, error) { return "partial", errBoom })
	require.Same(t, errBoom, err)
	require.Equal(t, "partial", got)
	requireFree(t, p, "k")
}

// A hedge sees itself as one: IsHedge, and the hedge and attempt counts of
// the execution it belongs to. (The provider grants every acquire, so that
// the hedge does not wait for the first attempt's lock.)
func TestHedgeSeesItself(t *testing.T) {
	lock := failsafelock.New[string](tenace.LockOptions{Provider: grantAll{}, Key: "k"})
	hedge := hedgepolicy.NewBuilderWithDelay[string](time.Millisecond).WithMaxHedges(1).Build()
	got, err := failsafe.With(hedge, lock).GetWithExecution(func(exec failsafe.Execution[string]) (string, error) {
		if !exec.IsHedge() {
			awaitDone(t, exec.Context()) // the hedge's result cancels the first attempt
			return "first", nil
		}
		require.Equal(t, 1, exec.Hedges())
		require.Equal(t, 2, exec.Attempts())
		return "hedge", nil
	})
	require.NoError(t, err)
	require.Equal(t, "hedge", got)
}

// Build copies the builder's settings: a builder changed after Build does
// not change the Lock it built, and a Lock is not a Builder.
func TestBuildCopies(t *testing.T) {
	p := newMemory(t)
	var first, second int
	b := failsafelock.NewBuilder[string](tenace.LockOptions{Provider: p, Key: "k"}).
		OnAcquired(func(failsafe.ExecutionEvent[string]) { first++ }).
		OnEvent(func(tenace.Event) {})
	lock := b.Build()
	b.OnAcquired(func(failsafe.ExecutionEvent[string]) { second++ }).OnEvent(func(tenace.Event) { second++ })
	_, err := failsafe.With(lock).Get(func() (string, error) { return "", nil })
	require.NoError(t, err)
	require.Equal(t, [2]int{1, 0}, [2]int{first, second})
	_, isBuilder := any(lock).(failsafelock.Builder[string])
	require.False(t, isBuilder)
}

// A Lock nested in another on the same key gets a *tenace.DeadlockError at
// once (it would wait for itself): OnDeadlock sees it, OnRejected does
// not, and the inner fn does not run.
func TestNestedLockOnTheSameKeyIsADeadlock(t *testing.T) {
	p := newMemory(t)
	var deadlocks, rejected int
	events := []string{}
	inner := failsafelock.NewBuilder[string](tenace.LockOptions{Provider: p, Key: "k"}).
		OnDeadlock(func(e failsafe.ExecutionEvent[string]) {
			deadlocks++
			var d *tenace.DeadlockError
			require.ErrorAs(t, e.LastError(), &d)
			require.Equal(t, "k", d.Key)
		}).
		OnRejected(func(failsafe.ExecutionEvent[string]) { rejected++ }).
		OnEvent(func(e tenace.Event) { events = append(events, e.Name) }).
		Build()
	outer := failsafelock.New[string](tenace.LockOptions{Provider: p, Key: "k"})
	ran := false
	_, err := failsafe.With(outer).GetWithExecution(func(exec failsafe.Execution[string]) (string, error) {
		return failsafe.With(inner).WithContext(exec.Context()).Get(func() (string, error) {
			ran = true
			return "", nil
		})
	})
	var d *tenace.DeadlockError
	require.ErrorAs(t, err, &d)
	require.False(t, ran)
	require.Equal(t, [2]int{1, 0}, [2]int{deadlocks, rejected})
	require.Equal(t, []string{tenace.EventLockAcquiring, tenace.EventLockDeadlock}, events)
	requireFree(t, p, "k")
}

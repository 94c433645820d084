package tenace_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"

	"tenace.dev/tenace"
	"tenace.dev/tenace/internal/fakeclock"
	"tenace.dev/tenace/locktest"
)

// TestMemoryProviderConformance runs the exported conformance suite against
// the in-process provider.
func TestMemoryProviderConformance(t *testing.T) {
	locktest.Run(t, func(t *testing.T) tenace.LockProvider {
		p := tenace.NewMemoryLockProvider()
		t.Cleanup(func() { _ = p.Close() })
		return p
	}, locktest.Capabilities{FIFO: true, ExactStats: true, Fencing: true, Close: true, ReadWrite: true, Permits: true, InspectWaiters: true})
}

func TestLeaseSignal(t *testing.T) {
	var s tenace.LeaseSignal
	require.NoError(t, s.Err(), "the zero value is not lost")
	lost := s.Lost()
	require.Equal(t, lost, s.Lost(), "the same channel every time")
	select {
	case <-lost:
		t.Fatal("the zero value's Lost is closed")
	default:
	}

	cause := errors.New("renewal found another holder")
	require.True(t, s.Lose(cause), "the first Lose counts")
	require.False(t, s.Lose(tenace.ErrLeaseExpired), "a second does not")
	<-lost // closed
	require.ErrorIs(t, s.Err(), tenace.ErrLeaseLost, "a cause that does not wrap ErrLeaseLost is wrapped")
	require.ErrorIs(t, s.Err(), cause)
	require.NotErrorIs(t, s.Err(), tenace.ErrLeaseExpired, "the second Lose changed nothing")

	var e tenace.LeaseSignal
	e.Lose(tenace.ErrLeaseExpired)
	require.Equal(t, tenace.ErrLeaseExpired, e.Err(), "a cause that wraps ErrLeaseLost is kept as it is")
	require.ErrorIs(t, e.Err(), tenace.ErrLeaseLost, "expired is a kind of lost")

	var n tenace.LeaseSignal
	n.Lose(nil)
	require.Equal(t, tenace.ErrLeaseLost, n.Err())
}

// TestLeaseSignalConcurrent: under -race, concurrent Lost, Lose and Err
// agree on one channel and one winner.
func TestLeaseSignalConcurrent(t *testing.T) {
	for range 100 {
		var s tenace.LeaseSignal
		var wg sync.WaitGroup
		wins := make(chan bool, 8)
		chans := make(chan (<-chan struct{}), 8)
		for range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				chans <- s.Lost()
				wins <- s.Lose(nil)
				_ = s.Err()
			}()
		}
		wg.Wait()
		close(wins)
		close(chans)
		n := 0
		for w := range wins {
			if w {
				n++
			}
		}
		require.Equal(t, 1, n, "exactly one Lose wins")
		for c := range chans {
			require.Equal(t, s.Lost(), c)
		}
	}
}

// losableLease is a fake lease that the test loses at will.
type losableLease struct {
	fakeLease
	tenace.LeaseSignal
}

func TestFnsContextEndsWhenItsLeaseIsLost(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		fp := &fakeProvider{}
		lease := &losableLease{fakeLease: fakeLease{p: fp}}
		fp.acquire = func(context.Context, string) (tenace.LockLease, error) { return lease, nil }
		var rec recorder
		cause := errors.New("the connection dropped")
		start := time.Now()
		err := tenace.NewPolicy().WithLock(tenace.LockOptions{Provider: fp, Key: "k"}).OnEvent(rec.on).
			Execute(bg, func(ctx context.Context) error {
				time.AfterFunc(2*time.Second, func() { lease.Lose(cause) })
				<-ctx.Done()
				require.Equal(t, 2*time.Second, time.Since(start), "at the moment of the loss")
				return context.Cause(ctx)
			})
		require.ErrorIs(t, err, tenace.ErrLeaseLost)
		require.ErrorIs(t, err, cause)
		require.Equal(t, 1, fp.releaseCount(), "a lost lease is still released")
		require.Equal(t, []string{"lock.acquiring:k", "lock.acquired:k", "lock.lost:k", "lock.released:k"}, rec.names())
	})
}

func TestALeaseNotLostEmitsNoLostEvent(t *testing.T) {
	fp := &fakeProvider{}
	lease := &losableLease{fakeLease: fakeLease{p: fp}}
	fp.acquire = func(context.Context, string) (tenace.LockLease, error) { return lease, nil }
	var rec recorder
	err := tenace.NewPolicy().WithLock(tenace.LockOptions{Provider: fp, Key: "k"}).OnEvent(rec.on).
		Execute(bg, func(ctx context.Context) error { return ctx.Err() })
	require.NoError(t, err)
	// Lost after the work: nobody is told, nothing leaks (goleak).
	lease.Lose(nil)
	require.Equal(t, []string{"lock.acquiring:k", "lock.acquired:k", "lock.released:k"}, rec.names())
}

// A lease lost while fn runs is reported even when fn returns at once,
// before the Lock's watcher has run: the watcher, told to stop, finds the
// loss already there and must report it (EventLockLost, before
// EventLockReleased), not pick at random between the two ready cases.
func TestALossJustBeforeFnReturnsIsStillReported(t *testing.T) {
	for range 200 {
		fp := &fakeProvider{}
		lease := &losableLease{fakeLease: fakeLease{p: fp}}
		fp.acquire = func(context.Context, string) (tenace.LockLease, error) { return lease, nil }
		var rec recorder
		err := tenace.NewPolicy().WithLock(tenace.LockOptions{Provider: fp, Key: "k"}).OnEvent(rec.on).
			Execute(bg, func(ctx context.Context) error {
				lease.Lose(nil)
				return nil
			})
		require.NoError(t, err)
		require.Equal(t, []string{"lock.acquiring:k", "lock.acquired:k", "lock.lost:k", "lock.released:k"}, rec.names())
	}
}

func TestValidateAcquire(t *testing.T) {
	require.NoError(t, tenace.ValidateAcquire("k", tenace.LockAcquireOptions{}))
	require.NoError(t, tenace.ValidateAcquire("k", tenace.LockAcquireOptions{Timeout: tenace.NoWait, TTL: time.Second}))
	require.ErrorIs(t, tenace.ValidateAcquire("", tenace.LockAcquireOptions{}), tenace.ErrMissingKey)
	err := tenace.ValidateAcquire("k", tenace.LockAcquireOptions{Timeout: -2})
	require.ErrorIs(t, err, tenace.ErrInvalidOption)
	require.Contains(t, err.Error(), "LockAcquireOptions.Timeout")
	err = tenace.ValidateAcquire("k", tenace.LockAcquireOptions{TTL: -1})
	require.ErrorIs(t, err, tenace.ErrInvalidOption)
	require.Contains(t, err.Error(), "LockAcquireOptions.TTL")
}

func TestAcquireContext(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		actx, cancel := tenace.AcquireContext(bg, tenace.LockAcquireOptions{Timeout: time.Second})
		defer cancel()
		deadline, ok := actx.Deadline()
		require.True(t, ok)
		require.Equal(t, time.Now().Add(time.Second), deadline)
		<-actx.Done()
		require.ErrorIs(t, actx.Err(), context.DeadlineExceeded)
		require.Equal(t, tenace.ErrAcquireContextTimeout, context.Cause(actx))
		require.True(t, tenace.TimedOut(bg, actx))
	})
	synctest.Test(t, func(t *testing.T) {
		parent, pcancel := context.WithTimeout(bg, time.Second)
		defer pcancel()
		actx, cancel := tenace.AcquireContext(parent, tenace.LockAcquireOptions{Timeout: time.Minute})
		defer cancel()
		<-actx.Done()
		require.False(t, tenace.TimedOut(parent, actx), "the parent ended first: not a timeout")
		require.ErrorIs(t, actx.Err(), context.DeadlineExceeded)
	})
	for _, d := range []time.Duration{0, tenace.NoWait} {
		actx, cancel := tenace.AcquireContext(bg, tenace.LockAcquireOptions{Timeout: d})
		_, ok := actx.Deadline()
		require.False(t, ok, "Timeout %v sets no deadline", d)
		cancel()
		require.False(t, tenace.TimedOut(bg, actx))
	}
}

func TestAcquireContextOnAFakeClock(t *testing.T) {
	clock := fakeclock.New()
	actx, cancel := tenace.AcquireContext(bg, tenace.LockAcquireOptions{Timeout: time.Second, Clock: clock})
	defer cancel()
	deadline, ok := actx.Deadline()
	require.True(t, ok)
	require.Equal(t, clock.Now().Add(time.Second), deadline)
	clock.Advance(999 * time.Millisecond)
	require.NoError(t, actx.Err())
	clock.Advance(time.Millisecond)
	<-actx.Done()
	require.ErrorIs(t, actx.Err(), context.DeadlineExceeded)
	require.True(t, tenace.TimedOut(bg, actx))

	actx, cancel = tenace.AcquireContext(bg, tenace.LockAcquireOptions{Timeout: time.Second, Clock: clock})
	cancel()
	require.ErrorIs(t, actx.Err(), context.Canceled)
	require.False(t, tenace.TimedOut(bg, actx))
	clock.Advance(time.Hour) // the stopped timer does not fire
}

func TestUnexpectedErrorSaysItsPrefixOnce(t *testing.T) {
	err := &tenace.UnexpectedError{Err: tenace.ErrProviderClosed}
	require.Equal(t, "tenace: the lock provider failed, so the work did not run: the lock provider is closed; acquire from an open provider", err.Error())
	require.ErrorIs(t, err, tenace.ErrProviderClosed)
}

// A lost-event listener that panics: the panic goes on up through Execute on
// the caller's goroutine, as any listener's, and the lock is still released.
func TestAPanickingLostListenerPanicsThroughExecute(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		fp := &fakeProvider{}
		lease := &losableLease{fakeLease: fakeLease{p: fp}}
		fp.acquire = func(context.Context, string) (tenace.LockLease, error) { return lease, nil }
		p := tenace.NewPolicy().WithLock(tenace.LockOptions{Provider: fp, Key: "k"}).OnEvent(func(e tenace.Event) {
			if e.Name == tenace.EventLockLost {
				panic("listener")
			}
		})
		require.PanicsWithValue(t, "listener", func() {
			_ = p.Execute(bg, func(ctx context.Context) error {
				lease.Lose(nil)
				<-ctx.Done()
				return nil
			})
		})
		require.Equal(t, 1, fp.releaseCount(), "the lock is still released")
	})
}

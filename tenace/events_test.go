package tenace_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"

	"tenace.dev/tenace"
	"tenace.dev/tenace/clock"
)

type ctxMark struct{}

// markedCtx is a context a listener can recognise: Event.Context must be
// the caller's.
func markedCtx() context.Context { return context.WithValue(bg, ctxMark{}, "caller") }

func requireCallersCtx(t *testing.T, e tenace.Event) {
	t.Helper()
	require.NotNil(t, e.Context, "%s has no Context", e.Name)
	require.Equal(t, "caller", e.Context.Value(ctxMark{}), "%s: Context is not the caller's", e.Name)
}

func TestAcquiredAndReleasedCarryWaitHoldAndToken(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := tenace.NewMemoryLockProvider()
		defer p.Close()
		blocker := mustAcquire(t, p, "k")
		time.AfterFunc(3*time.Second, func() { _ = blocker.Release(bg) })
		var rec recorder
		var token uint64
		err := tenace.NewPolicy().WithLock(tenace.LockOptions{Provider: p, Key: "k"}).OnEvent(rec.on).
			Execute(markedCtx(), func(ctx context.Context) error {
				l, _ := tenace.LeaseFrom(ctx)
				token = l.(tenace.FencedLease).Token()
				time.Sleep(5 * time.Second) // fake time: the hold
				return nil
			})
		require.NoError(t, err)
		require.Equal(t, []string{"lock.acquiring:k", "lock.acquired:k", "lock.released:k"}, rec.names())
		acquiring, acquired, released := rec.events[0], rec.events[1], rec.events[2]
		for _, e := range rec.events {
			requireCallersCtx(t, e)
		}
		require.Zero(t, acquiring.Wait)
		require.Equal(t, 3*time.Second, acquired.Wait)
		require.Equal(t, token, acquired.Token)
		require.Positive(t, token)
		require.NoError(t, acquired.Err)
		require.Equal(t, 5*time.Second, released.Hold)
		require.Equal(t, token, released.Token)
		require.NoError(t, released.Err)
		require.Zero(t, released.Wait)
	})
}

func TestRejectedCarriesItsWaitAndError(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := tenace.NewMemoryLockProvider()
		defer p.Close()
		blocker := mustAcquire(t, p, "k")
		defer func() { _ = blocker.Release(bg) }()
		var rec recorder
		err := tenace.NewPolicy().WithLock(tenace.LockOptions{Provider: p, Key: "k", Timeout: 2 * time.Second}).OnEvent(rec.on).
			Execute(markedCtx(), noop)
		require.Equal(t, []string{"lock.acquiring:k", "lock.rejected:k"}, rec.names())
		rejected := rec.events[1]
		requireCallersCtx(t, rejected)
		require.Equal(t, 2*time.Second, rejected.Wait)
		require.Same(t, err, rejected.Err, "the error the call returns")
	})
}

func TestCancelledCarriesTheContextsError(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := tenace.NewMemoryLockProvider()
		defer p.Close()
		blocker := mustAcquire(t, p, "k")
		defer func() { _ = blocker.Release(bg) }()
		var rec recorder
		ctx, cancel := context.WithTimeout(markedCtx(), 4*time.Second)
		defer cancel()
		err := tenace.NewPolicy().WithLock(tenace.LockOptions{Provider: p, Key: "k"}).OnEvent(rec.on).Execute(ctx, noop)
		require.ErrorIs(t, err, context.DeadlineExceeded)
		require.Equal(t, []string{"lock.acquiring:k", "lock.cancelled:k"}, rec.names())
		cancelled := rec.events[1]
		requireCallersCtx(t, cancelled)
		require.Equal(t, 4*time.Second, cancelled.Wait)
		require.ErrorIs(t, cancelled.Err, context.DeadlineExceeded)
	})
}

func TestAGrantLandingAsTheContextEndsIsCancelled(t *testing.T) {
	fp := &fakeProvider{}
	ctx, cancel := context.WithCancel(bg)
	fp.acquire = func(context.Context, string) (tenace.LockLease, error) {
		cancel() // the context ends as the grant arrives
		return &fakeLease{p: fp}, nil
	}
	var rec recorder
	err := tenace.NewPolicy().WithLock(tenace.LockOptions{Provider: fp, Key: "k"}).OnEvent(rec.on).Execute(ctx, noop)
	require.ErrorIs(t, err, context.Canceled)
	require.Equal(t, []string{"lock.acquiring:k", "lock.cancelled:k"}, rec.names())
	require.Equal(t, 1, fp.releaseCount(), "the grant went back")
}

func TestFailedCarriesTheProvidersError(t *testing.T) {
	fp := &fakeProvider{}
	fp.acquire = func(context.Context, string) (tenace.LockLease, error) { return nil, errBoom }
	var rec recorder
	err := tenace.NewPolicy().WithLock(tenace.LockOptions{Provider: fp, Key: "k"}).OnEvent(rec.on).Execute(markedCtx(), noop)
	var ue *tenace.UnexpectedError
	require.ErrorAs(t, err, &ue)
	require.Equal(t, []string{"lock.acquiring:k", "lock.failed:k"}, rec.names())
	requireCallersCtx(t, rec.events[1])
	require.Same(t, errBoom, rec.events[1].Err)
}

func TestARefusedCallEmitsNothing(t *testing.T) {
	var rec recorder
	pol := tenace.NewPolicy().WithLock(tenace.LockOptions{Provider: &fakeProvider{}}).OnEvent(rec.on)
	require.ErrorIs(t, pol.Execute(bg, noop), tenace.ErrMissingKey)
	require.ErrorIs(t, tenace.NewPolicy().WithLock(tenace.LockOptions{Key: "k", TTL: -1}).OnEvent(rec.on).Execute(bg, noop), tenace.ErrInvalidOption)
	require.Empty(t, rec.names(), "no wait began")
}

func TestLostCarriesHoldTokenAndCause(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		fp := &fakeProvider{}
		lease := &fencedLosableLease{losableLease: losableLease{fakeLease: fakeLease{p: fp}}, token: 7}
		fp.acquire = func(context.Context, string) (tenace.LockLease, error) { return lease, nil }
		var rec recorder
		cause := errors.New("the connection dropped")
		err := tenace.NewPolicy().WithLock(tenace.LockOptions{Provider: fp, Key: "k"}).OnEvent(rec.on).
			Execute(markedCtx(), func(ctx context.Context) error {
				time.AfterFunc(2*time.Second, func() { lease.Lose(cause) })
				<-ctx.Done()
				time.Sleep(time.Second) // fn takes a second to stop
				return context.Cause(ctx)
			})
		require.ErrorIs(t, err, tenace.ErrLeaseLost)
		require.Equal(t, []string{"lock.acquiring:k", "lock.acquired:k", "lock.lost:k", "lock.released:k"}, rec.names())
		lost, released := rec.events[2], rec.events[3]
		requireCallersCtx(t, lost)
		require.Equal(t, 2*time.Second, lost.Hold, "held until the loss")
		require.Equal(t, uint64(7), lost.Token)
		require.ErrorIs(t, lost.Err, tenace.ErrLeaseLost)
		require.ErrorIs(t, lost.Err, cause)
		require.Equal(t, 3*time.Second, released.Hold, "until fn returned and the release was done")
	})
}

type fencedLosableLease struct {
	losableLease
	token uint64
}

func (l *fencedLosableLease) Token() uint64 { return l.token }

func TestTimeoutEventCarriesTheTimeoutError(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var rec recorder
		err := tenace.NewPolicy().WithTimeout(time.Second).OnEvent(rec.on).Execute(markedCtx(), func(ctx context.Context) error {
			<-ctx.Done()
			return ctx.Err()
		}, tenace.WithKey("job"))
		require.Equal(t, []string{"timeout:job"}, rec.names())
		requireCallersCtx(t, rec.events[0])
		require.Same(t, err, rec.events[0].Err)
	})
}

// countingClock is the system clock, counting its reads.
type countingClock struct {
	tenace.Clock
	reads atomic.Int64
}

func (c *countingClock) Now() time.Time {
	c.reads.Add(1)
	return c.Clock.Now()
}

func TestAPolicyWithoutListenersReadsNoClockForEvents(t *testing.T) {
	p, _ := newProvider(t)
	clk := &countingClock{Clock: clock.System()}
	pol := tenace.NewPolicy().WithLock(tenace.LockOptions{Provider: p, Key: "k"}).WithClock(clk)
	require.NoError(t, pol.Execute(bg, noop))
	require.Zero(t, clk.reads.Load(), "no listener: no clock read")

	require.NoError(t, pol.OnEvent(func(tenace.Event) {}).Execute(bg, noop))
	require.Positive(t, clk.reads.Load(), "with a listener the wait and hold are timed")
}

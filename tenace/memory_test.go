package tenace_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"tenace.dev/tenace"
	"tenace.dev/tenace/internal/fakeclock"
)

// The default provider's shard goroutines live as long as the process; they
// are the only goroutines allowed to outlive a test, and only by name.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreAnyFunction("tenace.dev/tenace.defaultProviderLoop"))
}

var bg = context.Background()

// newProvider returns a provider whose queued hook feeds the returned
// channel, closed at the end of the test. The hook never blocks the shard:
// tests that do not read the channel just let it fill up.
func newProvider(t testing.TB, opts ...tenace.MemoryOption) (*tenace.MemoryLockProvider, <-chan string) {
	queued := make(chan string, 1024)
	hook := func(k string) {
		select {
		case queued <- k:
		default:
		}
	}
	p := tenace.NewMemoryLockProvider(append(opts, tenace.WithQueuedHook(hook))...)
	t.Cleanup(func() { require.NoError(t, p.Close()) })
	return p, queued
}

type acquired struct {
	lease tenace.LockLease
	err   error
}

func acquireAsync(ctx context.Context, p tenace.LockProvider, key string, opts tenace.LockAcquireOptions) <-chan acquired {
	r := make(chan acquired, 1)
	go func() {
		l, err := p.Acquire(ctx, key, opts)
		r <- acquired{l, err}
	}()
	return r
}

func mustAcquire(t testing.TB, p tenace.LockProvider, key string) tenace.LockLease {
	t.Helper()
	l, err := p.Acquire(bg, key, tenace.LockAcquireOptions{})
	require.NoError(t, err)
	require.NotNil(t, l)
	return l
}

// requireIdle checks that nothing is held or waited for, and that key can be
// taken at once: no lock leaked.
func requireIdle(t testing.TB, p *tenace.MemoryLockProvider, keys ...string) {
	t.Helper()
	require.NoError(t, tenace.SyncProvider(p))
	require.Zero(t, p.Size(), "keys held or waited for")
	for _, k := range keys {
		l, err := p.Acquire(bg, k, tenace.LockAcquireOptions{Timeout: tenace.NoWait})
		require.NoError(t, err)
		require.NotNil(t, l, "key %q can be taken at once", k)
		require.NoError(t, l.Release(bg))
	}
	require.NoError(t, tenace.SyncProvider(p))
	require.Zero(t, p.Size())
}

func TestAcquireGrantsOneHolderPerKey(t *testing.T) {
	p, queued := newProvider(t)
	a := mustAcquire(t, p, "k")
	other := mustAcquire(t, p, "other") // unrelated keys do not wait for each other
	r := acquireAsync(bg, p, "k", tenace.LockAcquireOptions{})
	<-queued
	select {
	case <-r:
		t.Fatal("a second holder was granted while the first holds")
	default:
	}
	require.NoError(t, a.Release(bg))
	b := <-r
	require.NoError(t, b.err)
	require.NoError(t, b.lease.Release(bg))
	require.NoError(t, other.Release(bg))
	requireIdle(t, p, "k", "other")
}

func TestAcquireGrantsInArrivalOrder(t *testing.T) {
	p, queued := newProvider(t, tenace.WithShards(1))
	holder := mustAcquire(t, p, "k")
	var waiters []<-chan acquired
	for range 8 {
		waiters = append(waiters, acquireAsync(bg, p, "k", tenace.LockAcquireOptions{}))
		<-queued // arrival order is now known: this waiter is behind the previous one
	}
	require.NoError(t, holder.Release(bg))
	for _, w := range waiters {
		got := <-w // each in turn; a grant out of order would block this loop
		require.NoError(t, got.err)
		require.NoError(t, got.lease.Release(bg))
	}
	requireIdle(t, p, "k")
}

func TestNoWaitReturnsNilNilWhenHeld(t *testing.T) {
	p, _ := newProvider(t)
	a := mustAcquire(t, p, "k")
	l, err := p.Acquire(bg, "k", tenace.LockAcquireOptions{Timeout: tenace.NoWait})
	require.NoError(t, err)
	require.Nil(t, l)
	require.NoError(t, a.Release(bg))
	requireIdle(t, p, "k")
}

func TestTimeoutReturnsNilNilAfterExactlyTheTimeout(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := tenace.NewMemoryLockProvider() // made inside the bubble
		defer p.Close()
		a := mustAcquire(t, p, "k")
		start := time.Now()
		l, err := p.Acquire(bg, "k", tenace.LockAcquireOptions{Timeout: 5 * time.Second})
		require.NoError(t, err)
		require.Nil(t, l)
		require.Equal(t, 5*time.Second, time.Since(start), "fake time: exactly the timeout")
		require.NoError(t, a.Release(bg))
		requireIdle(t, p, "k")
	})
}

func TestTimeoutDoesNotFireWhenGrantedInTime(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := tenace.NewMemoryLockProvider()
		defer p.Close()
		a := mustAcquire(t, p, "k")
		go func() {
			time.Sleep(time.Second) // fake time inside the bubble: the holder works for 1s
			_ = a.Release(bg)
		}()
		l, err := p.Acquire(bg, "k", tenace.LockAcquireOptions{Timeout: 5 * time.Second})
		require.NoError(t, err)
		require.NotNil(t, l)
		require.NoError(t, l.Release(bg))
		requireIdle(t, p, "k")
	})
}

func TestFakeClockAloneTriggersTheTimeout(t *testing.T) {
	p, queued := newProvider(t)
	clk := fakeclock.New()
	a := mustAcquire(t, p, "k")
	r := acquireAsync(bg, p, "k", tenace.LockAcquireOptions{Timeout: time.Minute, Clock: clk})
	<-queued
	clk.Advance(time.Minute - time.Nanosecond)
	require.Equal(t, 1, clk.Pending(), "not yet due")
	clk.Advance(time.Nanosecond)
	got := <-r
	require.NoError(t, got.err)
	require.Nil(t, got.lease, "timed out on the fake clock, with no real time passing")
	require.NoError(t, a.Release(bg))
	requireIdle(t, p, "k")
}

func TestCtxCancelWhileWaitingReturnsCtxError(t *testing.T) {
	p, queued := newProvider(t)
	a := mustAcquire(t, p, "k")
	ctx, cancel := context.WithCancel(bg)
	r := acquireAsync(ctx, p, "k", tenace.LockAcquireOptions{})
	<-queued
	cancel()
	got := <-r
	require.ErrorIs(t, got.err, context.Canceled)
	require.Nil(t, got.lease)
	require.NoError(t, a.Release(bg))
	requireIdle(t, p, "k")
}

func TestCtxDeadlineWhileWaitingReturnsDeadlineExceeded(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := tenace.NewMemoryLockProvider()
		defer p.Close()
		a := mustAcquire(t, p, "k")
		ctx, cancel := context.WithTimeout(bg, time.Second)
		defer cancel()
		l, err := p.Acquire(ctx, "k", tenace.LockAcquireOptions{Timeout: time.Hour})
		require.ErrorIs(t, err, context.DeadlineExceeded)
		require.Nil(t, l)
		require.NoError(t, a.Release(bg))
		requireIdle(t, p, "k")
	})
}

func TestCtxAlreadyEndedReturnsCtxErrorAndTouchesNothing(t *testing.T) {
	p, _ := newProvider(t)
	ctx, cancel := context.WithCancel(bg)
	cancel()
	l, err := p.Acquire(ctx, "k", tenace.LockAcquireOptions{})
	require.ErrorIs(t, err, context.Canceled)
	require.Nil(t, l)
	requireIdle(t, p, "k")
}

func TestBadInputGetsAClearErrorAndChangesNothing(t *testing.T) {
	p, _ := newProvider(t)
	held := mustAcquire(t, p, "held")
	for name, tc := range map[string]struct {
		key  string
		opts tenace.LockAcquireOptions
		want error
		text string
	}{
		"empty key":        {"", tenace.LockAcquireOptions{}, tenace.ErrMissingKey, "no lock key"},
		"negative timeout": {"k", tenace.LockAcquireOptions{Timeout: -2 * time.Second}, tenace.ErrInvalidOption, "LockAcquireOptions.Timeout is -2s"},
		"negative ttl":     {"k", tenace.LockAcquireOptions{TTL: -time.Second}, tenace.ErrInvalidOption, "LockAcquireOptions.TTL is -1s"},
	} {
		t.Run(name, func(t *testing.T) {
			l, err := p.Acquire(bg, tc.key, tc.opts)
			require.ErrorIs(t, err, tc.want)
			require.ErrorContains(t, err, tc.text)
			require.Nil(t, l)
			require.NoError(t, tenace.SyncProvider(p))
			require.Equal(t, 1, p.Size(), "the table is as it was")
		})
	}
	require.NoError(t, held.Release(bg))
	requireIdle(t, p, "k", "held")
}

func TestReleaseTwiceDoesNothing(t *testing.T) {
	p, _ := newProvider(t)
	a := mustAcquire(t, p, "k")
	require.NoError(t, a.Release(bg))
	b := mustAcquire(t, p, "k")
	require.NoError(t, a.Release(bg), "a second release returns nil…")
	l, err := p.Acquire(bg, "k", tenace.LockAcquireOptions{Timeout: tenace.NoWait})
	require.NoError(t, err)
	require.Nil(t, l, "…and does not free the new holder")
	require.NoError(t, b.Release(bg))
	requireIdle(t, p, "k")
}

// TestLeasesAreNeverReused: a lease is the shard's Grant, cut from a slab,
// and never handed out again — across several slabs, every lease is a new
// one, and releasing all the old ones again frees nothing.
func TestLeasesAreNeverReused(t *testing.T) {
	p, _ := newProvider(t)
	seen := map[tenace.LockLease]bool{}
	var old []tenace.LockLease
	for range 3*32 + 1 {
		l := mustAcquire(t, p, "k")
		require.False(t, seen[l], "a lease handed out twice")
		seen[l] = true
		old = append(old, l)
		require.NoError(t, l.Release(bg))
	}
	b := mustAcquire(t, p, "k")
	require.False(t, seen[b])
	for _, l := range old {
		require.NoError(t, l.Release(bg))
	}
	l, err := p.Acquire(bg, "k", tenace.LockAcquireOptions{Timeout: tenace.NoWait})
	require.NoError(t, err)
	require.Nil(t, l, "no old lease freed the new holder")
	require.NoError(t, b.Release(bg))
	requireIdle(t, p, "k")
}

func TestTokensStrictlyIncreaseGrantAfterGrant(t *testing.T) {
	p, queued := newProvider(t)
	var last uint64
	for range 50 {
		l := mustAcquire(t, p, "k")
		tok := l.(tenace.FencedLease).Token()
		require.Greater(t, tok, last)
		last = tok
		require.NoError(t, l.Release(bg))
	}
	// And through a queue: the waiter's token is above the holder's.
	a := mustAcquire(t, p, "k")
	r := acquireAsync(bg, p, "k", tenace.LockAcquireOptions{})
	<-queued
	require.NoError(t, a.Release(bg))
	b := <-r
	require.Greater(t, b.lease.(tenace.FencedLease).Token(), a.(tenace.FencedLease).Token())
	require.NoError(t, b.lease.Release(bg))
	requireIdle(t, p, "k")
}

// TestReleaseHappensBeforeTheNextAcquire has holders write a plain variable:
// the race detector reports it unless each Release synchronizes with the
// Acquire it lets through.
func TestReleaseHappensBeforeTheNextAcquire(t *testing.T) {
	p, _ := newProvider(t)
	counter := 0
	var wg sync.WaitGroup
	for range 16 {
		wg.Go(func() {
			for range 100 {
				l := mustAcquire(t, p, "k")
				counter++
				_ = l.Release(bg)
			}
		})
	}
	wg.Wait()
	require.Equal(t, 1600, counter, "no lost update")
	requireIdle(t, p, "k")
}

func TestSizeIsZeroWhenIdle(t *testing.T) {
	p, _ := newProvider(t, tenace.WithShards(4))
	var leases []tenace.LockLease
	for _, k := range []string{"a", "b", "c", "d", "e"} {
		leases = append(leases, mustAcquire(t, p, k))
	}
	require.Equal(t, 5, p.Size(), "exact as soon as the grants are in hand")
	for _, l := range leases {
		require.NoError(t, l.Release(bg))
	}
	requireIdle(t, p)
}

func TestCloseFailsWaitersAndLaterAcquires(t *testing.T) {
	q, hook := newProviderWithHook(make(chan string, 1))
	a := mustAcquire(t, q, "k")
	r := acquireAsync(bg, q, "k", tenace.LockAcquireOptions{})
	<-hook
	require.NoError(t, q.Close())
	got := <-r
	require.ErrorIs(t, got.err, tenace.ErrProviderClosed)
	require.Nil(t, got.lease)
	l, err := q.Acquire(bg, "k", tenace.LockAcquireOptions{})
	require.ErrorIs(t, err, tenace.ErrProviderClosed)
	require.Nil(t, l)
	require.NoError(t, a.Release(bg), "a lease of a closed provider releases as a no-op")
	require.NoError(t, q.Close(), "Close is idempotent")
	require.Zero(t, q.Size())
}

func newProviderWithHook(ch chan string) (*tenace.MemoryLockProvider, <-chan string) {
	return tenace.NewMemoryLockProvider(tenace.WithQueuedHook(func(k string) { ch <- k })), ch
}

func TestDefaultProviderIsSharedAndCannotBeClosed(t *testing.T) {
	d := tenace.DefaultLockProvider()
	require.Same(t, d, tenace.DefaultLockProvider())
	err := d.Close()
	require.ErrorContains(t, err, "cannot be closed")
	l := mustAcquire(t, d, "default-provider-test")
	require.NoError(t, l.Release(bg), "still works after the refused Close")
}

func TestWithShardsPanicsBelowOne(t *testing.T) {
	require.PanicsWithValue(t, "tenace: WithShards: n must be at least 1", func() { tenace.WithShards(0) })
}

// TestAbortDuringGrantStress races a release against a waiter's cancel many
// times; after each the key must be free or held by the waiter, never leaked.
func TestAbortDuringGrantStress(t *testing.T) {
	p, queued := newProvider(t, tenace.WithShards(1))
	kept, gaveUp := 0, 0
	for i := range 2000 {
		a := mustAcquire(t, p, "k")
		ctx, cancel := context.WithCancel(bg)
		r := acquireAsync(ctx, p, "k", tenace.LockAcquireOptions{})
		<-queued
		go cancel()
		require.NoError(t, a.Release(bg))
		got := <-r
		if got.lease != nil {
			kept++
			require.NoError(t, got.err)
			require.NoError(t, got.lease.Release(bg))
		} else {
			gaveUp++
			require.ErrorIs(t, got.err, context.Canceled)
		}
		require.NoError(t, tenace.SyncProvider(p))
		require.Zero(t, p.Size(), "iteration %d leaked the key", i)
	}
	t.Logf("waiter kept the grant %d times, gave up %d times", kept, gaveUp)
	requireIdle(t, p, "k")
}

func TestAcquireOnAClosedProviderIsErrProviderClosed(t *testing.T) {
	p := tenace.NewMemoryLockProvider()
	require.NoError(t, p.Close())
	_, err := p.Acquire(bg, "k", tenace.LockAcquireOptions{})
	require.True(t, errors.Is(err, tenace.ErrProviderClosed))
}

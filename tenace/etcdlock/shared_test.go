package etcdlock_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"tenace.dev/tenace"
	"tenace.dev/tenace/etcdlock"
)

// TestSharedStress mixes, for a few seconds, readers and writers of one key
// and the callers of a 3-permit bulkhead on another, from 48 goroutines
// over two provider values (a client each, as two processes), with
// timeouts and cancels among them: never a writer beside anyone, never
// more than 3 bulkhead holders, writers' tokens increasing, and both
// queues empty at the end.
func TestSharedStress(t *testing.T) {
	c := cluster(t)
	providers := []*etcdlock.Provider{
		newProvider(t, newClient(t, c.Endpoints()...), etcdlock.WithWindow(busyWindow)),
		newProvider(t, newClient(t, c.Endpoints()...), etcdlock.WithWindow(busyWindow)),
	}
	rw, bulk := keyOf(t, "rw"), keyOf(t, "bulk")
	const workers, permits = 48, 3
	var (
		readers, writers, holders atomic.Int64
		lastToken                 atomic.Uint64 // the last writer's, set while it holds the key alone
		grants, notGranted        atomic.Int64
		peakReaders, peakHolders  atomic.Int64
	)
	end := time.Now().Add(3 * time.Second)
	errs := make(chan error, workers)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p := providers[w%2]
			rnd := rand.New(rand.NewPCG(uint64(w), 28))
			for time.Now().Before(end) {
				key, opts := bulk, tenace.LockAcquireOptions{Shared: true, Permits: permits}
				writer := false
				if w%3 != 0 { // two thirds on the read/write key, a fifth of them writers
					key, opts = rw, tenace.LockAcquireOptions{Shared: true}
					if writer = rnd.IntN(5) == 0; writer {
						opts = tenace.LockAcquireOptions{}
					}
				}
				ctx, cancel := context.WithCancel(bg)
				switch rnd.IntN(6) {
				case 0:
					opts.Timeout = time.Duration(5+rnd.IntN(30)) * time.Millisecond
				case 1:
					opts.Timeout = tenace.NoWait
				case 2:
					time.AfterFunc(time.Duration(rnd.IntN(30))*time.Millisecond, cancel)
				}
				l, err := p.Acquire(ctx, key, opts)
				switch {
				case err != nil && !errors.Is(err, context.Canceled) && !errors.Is(err, tenace.ErrNoReply):
					cancel()
					errs <- fmt.Errorf("Acquire(%s, %+v): %w", key, opts, err)
					return
				case l == nil:
					cancel()
					notGranted.Add(1)
					continue
				}
				grants.Add(1)
				var bad error
				switch {
				case writer:
					if n := writers.Add(1); n != 1 || readers.Load() != 0 {
						bad = fmt.Errorf("a writer beside %d writers and %d readers", n-1, readers.Load())
					}
					if tok := l.(tenace.FencedLease).Token(); tok <= lastToken.Load() {
						bad = fmt.Errorf("a writer's token %d is not above the last writer's, %d", tok, lastToken.Load())
					} else {
						lastToken.Store(tok)
					}
					time.Sleep(200 * time.Microsecond) // widens the window: an overlap is caught
					writers.Add(-1)
				case key == rw:
					n := readers.Add(1)
					if writers.Load() != 0 {
						bad = errors.New("a reader beside a writer")
					}
					peakOf(&peakReaders, n)
					time.Sleep(200 * time.Microsecond)
					readers.Add(-1)
				default:
					n := holders.Add(1)
					if n > permits {
						bad = fmt.Errorf("%d holders of a %d-permit bulkhead", n, permits)
					}
					peakOf(&peakHolders, n)
					time.Sleep(200 * time.Microsecond)
					holders.Add(-1)
				}
				if err := l.Release(bg); err != nil && bad == nil {
					bad = fmt.Errorf("Release: %w", err)
				}
				cancel()
				if bad != nil {
					errs <- bad
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	t.Logf("%d grants, %d not granted (timeouts, NoWait, cancels); at most %d readers and %d of %d bulkhead holders at once",
		grants.Load(), notGranted.Load(), peakReaders.Load(), peakHolders.Load(), permits)
	require.Positive(t, peakHolders.Load())
	admin := newClient(t, c.Endpoints()...)
	for _, key := range []string{rw, bulk} {
		// A give-up past its revoke wait leaves its entry to a background
		// revoke, within provkit.CleanupTimeout (5s); one that fails lets the
		// entry lapse within the window.
		eventually(t, busyWindow+5*time.Second, "the queue of "+key+" empty", func() bool { return queued(t, admin, providers[0], key) == 0 })
	}
	for _, p := range providers {
		require.Equal(t, tenace.LockStats{}, p.Stats())
	}
}

// TestPermitWakesOnAnyRelease: a caller waiting for one of 3 permits is
// granted when any holder releases, the head or a later one, not only the
// one it would wait for in a queue of one.
func TestPermitWakesOnAnyRelease(t *testing.T) {
	c := cluster(t)
	p := newProvider(t, newClient(t, c.Endpoints()...))
	watching := make(chan int64, 16)
	p.SetBeforeWatch(func(rev int64) { watching <- rev })
	bulk := tenace.LockAcquireOptions{Shared: true, Permits: 3}
	for i := range 3 {
		key := keyOf(t, fmt.Sprint(i))
		held := []tenace.LockLease{mustAcquire(t, p, key, bulk), mustAcquire(t, p, key, bulk), mustAcquire(t, p, key, bulk)}
		r := acquireAsync(bg, p, key, bulk)
		select {
		case <-watching: // the waiter read the queue and watches it
		case <-time.After(10 * time.Second):
			t.Fatal("the waiter did not start watching")
		}
		require.NoError(t, held[i].Release(bg))
		got := waitFor(t, r, 5*time.Second, fmt.Sprintf("the waiter, after holder %d released", i))
		require.NoError(t, got.err)
		require.NotNil(t, got.lease, "the waiter, after holder %d released", i)
		for j, l := range held {
			if j != i {
				require.NoError(t, l.Release(bg))
			}
		}
		require.NoError(t, got.lease.Release(bg))
	}
}

// TestPermitsFirstHolderWins: callers admitted beside a shared holder
// share the head's permit count, whatever they asked for.
func TestPermitsFirstHolderWins(t *testing.T) {
	c := cluster(t)
	p := newProvider(t, newClient(t, c.Endpoints()...))
	key := keyOf(t, "k")
	one := mustAcquire(t, p, key, tenace.LockAcquireOptions{Shared: true, Permits: 1})
	l, err := p.Acquire(bg, key, tenace.LockAcquireOptions{Shared: true, Permits: 5, Timeout: tenace.NoWait})
	require.NoError(t, err)
	require.Nil(t, l, "a caller asking for 5 permits was admitted beside the holder of a 1-permit key")
	require.NoError(t, one.Release(bg))

	five := mustAcquire(t, p, key, tenace.LockAcquireOptions{Shared: true, Permits: 5})
	l, err = p.Acquire(bg, key, tenace.LockAcquireOptions{Shared: true, Permits: 1, Timeout: tenace.NoWait})
	require.NoError(t, err)
	require.NotNil(t, l, "a caller asking for 1 permit was refused beside the one holder of a 5-permit key")
	require.NoError(t, l.Release(bg))
	require.NoError(t, five.Release(bg))
}

// mode is how the fault tests take their keys: exclusive, or shared with
// one permit (so that a second shared caller waits, behind a permit).
type mode struct {
	name    string
	shared  bool
	permits int
}

var modes = []mode{{"exclusive", false, 0}, {"shared-1-permit", true, 1}}

// with is opts in mode m.
func (m mode) with(opts tenace.LockAcquireOptions) tenace.LockAcquireOptions {
	opts.Shared, opts.Permits = m.shared, m.permits
	return opts
}

// forModes runs test in each mode, as subtests.
func forModes(t *testing.T, test func(*testing.T, mode)) {
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) { test(t, m) })
	}
}

// TestNoWaitBulkheadNeverOverAdmits: NoWait callers of a one-permit
// bulkhead, from 8 goroutines over two provider values: never two holders
// at once (a try counts the entries before its own in the transaction
// that puts it, and one that is not admitted deletes its entry).
func TestNoWaitBulkheadNeverOverAdmits(t *testing.T) {
	c := cluster(t)
	ps := []*etcdlock.Provider{newProvider(t, newClient(t, c.Endpoints()...)), newProvider(t, newClient(t, c.Endpoints()...))}
	key := keyOf(t, "k")
	opts := tenace.LockAcquireOptions{Shared: true, Permits: 1, Timeout: tenace.NoWait}
	var in, most, grants atomic.Int64
	end := time.Now().Add(2 * time.Second)
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for time.Now().Before(end) {
				l, err := ps[g%2].Acquire(bg, key, opts)
				if err != nil {
					t.Error(err)
					return
				}
				if l == nil {
					continue
				}
				grants.Add(1)
				peakOf(&most, in.Add(1))
				time.Sleep(time.Millisecond) // hold it a moment: an overlap is caught
				in.Add(-1)
				if err := l.Release(bg); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	t.Logf("%d grants, at most %d holders at once", grants.Load(), most.Load())
	require.Positive(t, grants.Load())
	require.LessOrEqual(t, most.Load(), int64(1), "more holders than permits")
}

// peakOf raises p to v if v is higher.
func peakOf(p *atomic.Int64, v int64) {
	for old := p.Load(); v > old && !p.CompareAndSwap(old, v); old = p.Load() {
	}
}

// TestSharedBehindAWriterTimesOutQuietly: a shared caller that etcd said
// waits — behind a writer that holds the key, or behind the holder of a
// full bulkhead — returns (nil, nil) at its Timeout, short or not, never
// an error wrapping ErrNoReply: etcd answered.
func TestSharedBehindAWriterTimesOutQuietly(t *testing.T) {
	c := cluster(t)
	p := newProvider(t, newClient(t, c.Endpoints()...))
	bulk := tenace.LockAcquireOptions{Shared: true, Permits: 1}
	for _, holder := range []tenace.LockAcquireOptions{{}, bulk} {
		key := keyOf(t, fmt.Sprint(holder.Shared))
		held := mustAcquire(t, p, key, holder)
		for _, timeout := range []time.Duration{100 * time.Millisecond, 300 * time.Millisecond} {
			for _, opts := range []tenace.LockAcquireOptions{bulk, {Shared: true}} {
				opts.Timeout = timeout
				l, err := p.Acquire(bg, key, opts)
				require.NoError(t, err, "holder %+v, caller %+v", holder, opts)
				require.Nil(t, l, "holder %+v, caller %+v", holder, opts)
			}
		}
		require.NoError(t, held.Release(bg))
	}
}

// TestReaderWokenWhenTheWriterAheadGivesUp: a reader queued behind a
// waiting writer (itself behind a reader that holds the key) is granted
// once the writer's Timeout ends, beside the reader that still holds.
func TestReaderWokenWhenTheWriterAheadGivesUp(t *testing.T) {
	c := cluster(t)
	p := newProvider(t, newClient(t, c.Endpoints()...))
	key := keyOf(t, "k")
	reader := mustAcquire(t, p, key, tenace.LockAcquireOptions{Shared: true})
	w := acquireAsync(bg, p, key, tenace.LockAcquireOptions{Timeout: 500 * time.Millisecond})
	eventually(t, 10*time.Second, "the writer queued", func() bool { return p.Stats().Waiting == 1 })
	r := acquireAsync(bg, p, key, tenace.LockAcquireOptions{Shared: true})
	eventually(t, 10*time.Second, "the second reader queued", func() bool { return p.Stats().Waiting == 2 })
	got := waitFor(t, w, 10*time.Second, "the writer")
	require.NoError(t, got.err)
	require.Nil(t, got.lease, "the writer was granted beside a reader")
	got = waitFor(t, r, 5*time.Second, "the second reader, once the writer ahead gave up")
	require.NoError(t, got.err)
	require.NotNil(t, got.lease)
	require.NoError(t, got.lease.Release(bg))
	require.NoError(t, reader.Release(bg))
}

// TestStatsByMode: a shared lease counts in Held and in SharedKeys and
// SharedHolders; a shared caller queued in Waiting and SharedWaiting;
// exclusive ones in Held and Waiting only. All back to 0 once released.
func TestStatsByMode(t *testing.T) {
	c := cluster(t)
	p := newProvider(t, newClient(t, c.Endpoints()...))
	key := func(name string) string { return keyOf(t, name) }
	reader := tenace.LockAcquireOptions{Shared: true}
	w := mustAcquire(t, p, key("w"), tenace.LockAcquireOptions{})
	r := mustAcquire(t, p, key("r"), reader)
	b := mustAcquire(t, p, key("b"), tenace.LockAcquireOptions{Shared: true, Permits: 2})
	require.Equal(t, tenace.LockStats{Held: 3, SharedKeys: 2, SharedHolders: 2}, p.Stats())

	ctx, cancel := context.WithCancel(bg)
	sharedWaiter := acquireAsync(ctx, p, key("w"), reader)
	eventually(t, 10*time.Second, "the shared waiter queued", func() bool { return p.Stats().SharedWaiting == 1 })
	writerWaiter := acquireAsync(ctx, p, key("r"), tenace.LockAcquireOptions{})
	eventually(t, 10*time.Second, "the writer queued", func() bool { return p.Stats().Waiting == 2 })
	require.Equal(t, 1, p.Stats().SharedWaiting, "the writer is not a shared waiter")
	cancel()
	for _, ch := range []<-chan result{sharedWaiter, writerWaiter} {
		got := <-ch
		require.Nil(t, got.lease)
		require.ErrorIs(t, got.err, context.Canceled)
	}
	eventually(t, 10*time.Second, "the waiters gone", func() bool { return p.Stats().Waiting == 0 })
	require.Zero(t, p.Stats().SharedWaiting)
	for _, l := range []tenace.LockLease{w, r, b} {
		require.NoError(t, l.Release(bg))
	}
	require.Equal(t, tenace.LockStats{}, p.Stats())
}

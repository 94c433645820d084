package locktest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"tenace.dev/tenace"
)

// The shared-lock cases: LockAcquireOptions.Shared and Permits, run when
// Capabilities.ReadWrite or Capabilities.Permits says the provider
// supports them.

var (
	optReader = tenace.LockAcquireOptions{Shared: true}
	optTryR   = tenace.LockAcquireOptions{Shared: true, Timeout: tenace.NoWait}
	optTryW   = tenace.LockAcquireOptions{Timeout: tenace.NoWait}
)

// tryNow reports whether a NoWait Acquire with opts is granted now,
// and gives the grant back.
func (s *suite) tryNow(t *testing.T, p tenace.LockProvider, key string, opts tenace.LockAcquireOptions) bool {
	t.Helper()
	opts.Timeout = tenace.NoWait
	l, err := p.Acquire(s.ctx(t), key, opts)
	if err != nil {
		t.Fatalf("NoWait Acquire(%q, %+v): %v", key, opts, err)
	}
	if l != nil {
		mustRelease(t, l)
	}
	return l != nil
}

// sharedSupport: the provider says it supports shared locks, and refuses
// negative Permits, and Permits without Shared, as option errors.
func (s *suite) sharedSupport(t *testing.T) {
	p := s.newProvider(t)
	if sp, ok := p.(tenace.SharedLockProvider); !ok || !sp.SupportsShared() {
		t.Fatalf("%T does not implement tenace.SharedLockProvider with SupportsShared true", p)
	}
	key := s.key(t)
	for _, opts := range []tenace.LockAcquireOptions{{Shared: true, Permits: -1}, {Permits: 2}} {
		l, err := p.Acquire(s.ctx(t), key, opts)
		if l != nil {
			_ = l.Release(context.Background())
		}
		if !errors.Is(err, tenace.ErrInvalidOption) {
			t.Errorf("Acquire with %+v = (%v, %v), want an error wrapping ErrInvalidOption", opts, l, err)
		}
	}
	s.assertFree(t, p, key, "after refused options")
}

// readWrite: readers hold a key together; a writer is never beside them,
// nor a reader beside a writer.
func (s *suite) readWrite(t *testing.T) {
	p := s.newProvider(t)
	key := s.key(t)
	r1 := s.mustAcquire(t, p, key, optReader)
	r2 := s.mustAcquire(t, p, key, optTryR)
	if s.tryNow(t, p, key, optTryW) {
		t.Fatal("a writer was granted beside two readers")
	}
	mustRelease(t, r1)
	if s.tryNow(t, p, key, optTryW) {
		t.Fatal("a writer was granted beside a reader")
	}
	mustRelease(t, r2)
	w := s.mustAcquire(t, p, key, optTryW)
	if s.tryNow(t, p, key, optTryR) {
		t.Fatal("a reader was granted beside a writer")
	}
	mustRelease(t, w)
	s.assertFree(t, p, key, "after the readers and the writer released")
}

// writerNotOvertaken (with FIFO): a writer waiting for a reader is not
// overtaken by a reader that arrives after it.
func (s *suite) writerNotOvertaken(t *testing.T) {
	p := s.newProvider(t)
	sp := s.stats(t, p)
	key := s.key(t)
	r1 := s.mustAcquire(t, p, key, optReader)
	base := sp.Stats().Waiting
	w := acquireAsync(s.ctx(t), p, key, tenace.LockAcquireOptions{})
	s.eventually(t, "the writer queued", func() bool { return sp.Stats().Waiting >= base+1 })
	if s.tryNow(t, p, key, optTryR) {
		t.Fatal("a reader arriving after a waiting writer was granted before it")
	}
	r2 := acquireAsync(s.ctx(t), p, key, optReader)
	s.eventually(t, "the later reader queued", func() bool { return sp.Stats().Waiting >= base+2 })
	mustRelease(t, r1)
	got := s.wait(t, w, "the writer, after the reader released")
	if got.err != nil || got.lease == nil {
		t.Fatalf("writer: (%v, %v)", got.lease, got.err)
	}
	select {
	case r := <-r2:
		t.Fatalf("the later reader got (%v, %v) beside the writer", r.lease, r.err)
	default:
	}
	mustRelease(t, got.lease)
	got = s.wait(t, r2, "the later reader, after the writer released")
	if got.err != nil || got.lease == nil {
		t.Fatalf("later reader: (%v, %v)", got.lease, got.err)
	}
	mustRelease(t, got.lease)
}

// permits: a key of N permits never has more than N shared holders, and
// never a writer beside any, under contention; every permit comes back.
func (s *suite) permits(t *testing.T) {
	p := s.newProvider(t)
	key := s.key(t)
	const n, workers, rounds = 3, 9, 20
	bulk := tenace.LockAcquireOptions{Shared: true, Permits: n}
	held := make([]tenace.LockLease, 0, n)
	for range n {
		held = append(held, s.mustAcquire(t, p, key, bulk))
	}
	if s.tryNow(t, p, key, bulk) {
		t.Fatalf("a shared caller was granted beside %d holders of %d permits", n, n)
	}
	for _, l := range held {
		mustRelease(t, l)
	}
	var readers, writers, peak atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	ctx := s.ctx(t)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range rounds {
				exclusive := s.caps.ReadWrite && (w+i)%5 == 0
				opts := bulk
				if exclusive {
					opts = tenace.LockAcquireOptions{}
				}
				l, err := p.Acquire(ctx, key, opts)
				if err != nil || l == nil {
					errs <- fmt.Errorf("acquire = (%v, %v)", l, err)
					return
				}
				var bad error
				if exclusive {
					if wr := writers.Add(1); wr != 1 || readers.Load() != 0 {
						bad = fmt.Errorf("a writer beside %d writers and %d shared holders", wr-1, readers.Load())
					}
					time.Sleep(50 * time.Microsecond) // widen the window: a real overlap is caught
					writers.Add(-1)
				} else {
					r := readers.Add(1)
					if r > n || writers.Load() != 0 {
						bad = fmt.Errorf("%d shared holders of %d permits, %d writers", r, n, writers.Load())
					}
					for pk := peak.Load(); r > pk && !peak.CompareAndSwap(pk, r); pk = peak.Load() {
					}
					time.Sleep(50 * time.Microsecond)
					readers.Add(-1)
				}
				_ = l.Release(context.Background())
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
	t.Logf("at most %d shared holders at once, of %d permits", peak.Load(), n)
	s.assertFree(t, p, key, "after every holder released: no permit leaked")
}

// permitBack: a shared waiter that times out, or whose ctx ends, leaves no
// permit taken.
func (s *suite) permitBack(t *testing.T) {
	p := s.newProvider(t)
	key := s.key(t)
	one := tenace.LockAcquireOptions{Shared: true, Permits: 1}
	h := s.mustAcquire(t, p, key, one)
	timed := one
	timed.Timeout = 20 * time.Millisecond
	if l, err := p.Acquire(s.ctx(t), key, timed); l != nil || err != nil {
		t.Fatalf("a waiter for the one permit: (%v, %v), want not granted in time", l, err)
	}
	mustRelease(t, h)
	// Cancels racing grants (abort during grant): each waiter is queued
	// (when the provider's Stats tell), then cancelled, and the permit
	// released at once, so that the grant and the give-up meet.
	sp, _ := p.(tenace.StatsProvider)
	for range 20 {
		h := s.mustAcquire(t, p, key, one)
		ctx, cancel := context.WithCancel(s.ctx(t))
		var base int
		if sp != nil {
			base = sp.Stats().Waiting
		}
		r := acquireAsync(ctx, p, key, one)
		if sp != nil {
			s.eventually(t, "the waiter queued", func() bool { return sp.Stats().Waiting >= base+1 })
		}
		cancel()
		mustRelease(t, h)
		if got := s.wait(t, r, "the cancelled waiter"); got.lease != nil {
			mustRelease(t, got.lease)
		}
	}
	if !s.eventuallyGranted(t, p, key, one) {
		t.Fatal("the key's permit did not come back after a timeout and a cancel")
	}
}

// eventuallyGranted retries a NoWait shared acquire within WaitBound (a
// provider may apply a release a moment after it returns).
func (s *suite) eventuallyGranted(t *testing.T, p tenace.LockProvider, key string, opts tenace.LockAcquireOptions) bool {
	t.Helper()
	for deadline := time.Now().Add(s.caps.WaitBound); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		if s.tryNow(t, p, key, opts) {
			return true
		}
	}
	return false
}

// permitBackAfterLoss (with Lose): the permit of a holder lost from
// outside (its server-side entry deleted, its session ended, as when its
// process is killed) comes back: a caller waiting for it is granted within
// WaitBound, and the lost holder learns of the loss.
func (s *suite) permitBackAfterLoss(t *testing.T) {
	p := s.newProvider(t)
	key := s.key(t)
	const n = 2
	bulk := tenace.LockAcquireOptions{Shared: true, Permits: n}
	kept := s.mustAcquire(t, p, key, bulk)
	lost := s.mustAcquire(t, p, key, bulk)
	if s.tryNow(t, p, key, bulk) {
		t.Fatalf("a shared caller was granted beside %d holders of %d permits", n, n)
	}
	waiting := bulk
	waiting.Timeout = s.caps.WaitBound
	r := acquireAsync(s.ctx(t), p, key, waiting)
	s.caps.Lose(t, lost)
	s.waitLost(t, lost, tenace.ErrLeaseLost)
	got := s.wait(t, r, "the waiter for the lost holder's permit")
	if got.err != nil || got.lease == nil {
		t.Fatalf("the waiter for the lost holder's permit: (%v, %v), want a lease", got.lease, got.err)
	}
	if s.tryNow(t, p, key, bulk) {
		t.Fatalf("a shared caller was granted beside %d holders of %d permits, after a loss", n, n)
	}
	mustRelease(t, got.lease)
	mustRelease(t, kept)
	if err := lost.Release(context.Background()); err != nil && !errors.Is(err, tenace.ErrLeaseLost) {
		t.Fatalf("Release of the lost holder = %v, want nil or an error wrapping ErrLeaseLost", err)
	}
	s.assertFree(t, p, key, "after every holder released or was lost")
}

// readerLost (with Lose): a writer waiting for a reader that is lost from
// outside is granted within WaitBound, and a stale Release of the lost
// reader does not free the writer's key.
func (s *suite) readerLost(t *testing.T) {
	p := s.newProvider(t)
	key := s.key(t)
	reader := s.mustAcquire(t, p, key, optReader)
	w := acquireAsync(s.ctx(t), p, key, tenace.LockAcquireOptions{Timeout: s.caps.WaitBound})
	s.caps.Lose(t, reader)
	s.waitLost(t, reader, tenace.ErrLeaseLost)
	got := s.wait(t, w, "the writer, after the reader was lost")
	if got.err != nil || got.lease == nil {
		t.Fatalf("the writer waiting for a lost reader: (%v, %v), want a lease", got.lease, got.err)
	}
	if err := reader.Release(context.Background()); err != nil && !errors.Is(err, tenace.ErrLeaseLost) {
		t.Fatalf("stale Release of the lost reader = %v, want nil or an error wrapping ErrLeaseLost", err)
	}
	if s.tryNow(t, p, key, optTryR) {
		t.Fatal("a reader was granted beside the writer after the lost reader's stale Release")
	}
	mustRelease(t, got.lease)
	s.assertFree(t, p, key, "after the writer released")
}

// sharedRefused (a provider that declares neither ReadWrite nor Permits,
// and does not report SupportsShared): Acquire with Shared is refused with an error wrapping ErrInvalidOption,
// never taken exclusive in silence, and the key is left as it was.
func (s *suite) sharedRefused(t *testing.T) {
	p := s.newProvider(t)
	if sp, ok := p.(tenace.SharedLockProvider); ok && sp.SupportsShared() {
		t.Skipf("%T reports SupportsShared: set Capabilities.ReadWrite or Permits to check its shared locks", p)
	}
	key := s.key(t)
	for _, opts := range []tenace.LockAcquireOptions{{Shared: true}, {Shared: true, Permits: 3, Timeout: tenace.NoWait}} {
		l, err := p.Acquire(s.ctx(t), key, opts)
		if l != nil {
			_ = l.Release(context.Background())
		}
		if l != nil || !errors.Is(err, tenace.ErrInvalidOption) {
			t.Errorf("Acquire with %+v = (%v, %v), want (nil, an error wrapping ErrInvalidOption)", opts, l, err)
		}
	}
	s.assertFree(t, p, key, "after refused shared acquires")
}

package redislock_test

// Shared locks and N permits per key (issue 28), on a real redis-server.

import (
	"context"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"tenace.dev/internal/redistest"
	"tenace.dev/tenace"
	"tenace.dev/tenace/redislock"
)

var (
	reader = tenace.LockAcquireOptions{Shared: true}
	writer = tenace.LockAcquireOptions{}
)

// bulk is the options of a keyed bulkhead of n permits.
func bulk(n int) tenace.LockAcquireOptions {
	return tenace.LockAcquireOptions{Shared: true, Permits: n}
}

// tryNow reports whether a NoWait Acquire with opts is granted now, and
// gives the grant back.
func tryNow(t *testing.T, p tenace.LockProvider, key string, opts tenace.LockAcquireOptions) bool {
	t.Helper()
	opts.Timeout = tenace.NoWait
	l, err := p.Acquire(bg, key, opts)
	require.NoError(t, err)
	if l != nil {
		require.NoError(t, l.Release(bg))
	}
	return l != nil
}

// warmShared is warm for the shared scripts: on a stalled server they are
// sent, not refused with NOSCRIPT and resent.
func warmShared(t *testing.T, c *redis.Client, p *redislock.Provider) {
	t.Helper()
	warm(t, c, p)
	l := mustAcquire(t, p, "warm", reader)
	require.NoError(t, l.Release(bg))
}

// keyGuard counts the holders of one key in the stress test: shared ones,
// and exclusive ones.
type keyGuard struct {
	name    string
	permits int // 0: read/write
	shared  atomic.Int64
	writers atomic.Int64
	peak    atomic.Int64
}

// hold checks the key's invariants as a holder comes in, lets a little
// time pass, and leaves: never more than permits shared holders, never a
// writer beside anyone.
func (g *keyGuard) hold(exclusive bool) error {
	var bad error
	if exclusive {
		if w := g.writers.Add(1); w != 1 || g.shared.Load() != 0 {
			bad = fmt.Errorf("%s: a writer beside %d writers and %d shared holders", g.name, w-1, g.shared.Load())
		}
		time.Sleep(100 * time.Microsecond) // widen the window: a real overlap is caught
		g.writers.Add(-1)
		return bad
	}
	r := g.shared.Add(1)
	if (g.permits > 0 && r > int64(g.permits)) || g.writers.Load() != 0 {
		bad = fmt.Errorf("%s: %d shared holders of %d permits beside %d writers", g.name, r, g.permits, g.writers.Load())
	}
	for pk := g.peak.Load(); r > pk && !g.peak.CompareAndSwap(pk, r); pk = g.peak.Load() {
	}
	time.Sleep(100 * time.Microsecond)
	g.shared.Add(-1)
	return bad
}

// 64 goroutines on two providers (two "processes", each its own client)
// mix readers and writers of a read/write key with the callers of a keyed
// bulkhead of 3 permits (and a writer now and then), with NoWait, short
// Timeouts, long waits and cancels: never more than 3 permits of the
// bulkhead in use, never a writer beside anyone, and every permit comes
// back (both keys free at the end).
//
// Timing is not the subject: the clients dial with a generous timeout and
// have a connection per worker (a try never queues for one), the long
// waits have a generous Timeout, and the workers run for the budget and
// then until the keys have been granted more than once per worker, so a
// loaded machine makes the test slower, not red.
func TestSharedStress(t *testing.T) {
	srv := redistest.Start(t)
	const workers = 64
	var ps [2]*redislock.Provider
	for i := range ps {
		c := redis.NewClient(&redis.Options{Addr: srv.Addr, ContextTimeoutEnabled: true, DialTimeout: time.Minute, PoolSize: workers})
		t.Cleanup(func() { _ = c.Close() })
		ps[i] = newProvider(t, c, redislock.WithRetryInterval(50*time.Millisecond))
	}
	guards := []*keyGuard{{name: "stress/rw"}, {name: "stress/bulk", permits: 3}}
	budget := 3 * time.Second
	if testing.Short() {
		budget = time.Second
	}
	end := time.Now().Add(budget)
	var granted, notGranted, cancelled, noReply atomic.Int64
	running := func() bool {
		return time.Now().Before(end) || granted.Load() <= workers && time.Since(end) < time.Minute
	}
	errs := make(chan error, workers)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			p := ps[w%2]
			rng := mrand.New(mrand.NewPCG(uint64(w), 28))
			for running() {
				g := guards[rng.IntN(2)]
				exclusive := rng.IntN(6) == 0
				opts := tenace.LockAcquireOptions{Shared: !exclusive}
				if !exclusive {
					opts.Permits = g.permits
				}
				switch rng.IntN(4) {
				case 0:
					opts.Timeout = tenace.NoWait
				case 1:
					opts.Timeout = time.Duration(1+rng.IntN(20)) * time.Millisecond
				case 2:
					opts.Timeout = time.Minute
				}
				ctx, cancel := context.WithCancel(bg)
				if rng.IntN(5) == 0 {
					time.AfterFunc(time.Duration(rng.IntN(10))*time.Millisecond, cancel)
				}
				l, err := p.Acquire(ctx, g.name, opts)
				cancel()
				switch {
				case errors.Is(err, context.Canceled):
					cancelled.Add(1)
					continue
				case errors.Is(err, redislock.ErrNoReply) && opts.Timeout > 0 && opts.Timeout < time.Second:
					// A first try left unanswered past a short Timeout by
					// a loaded machine: an outage by the rule, undone.
					noReply.Add(1)
					continue
				case err != nil:
					errs <- fmt.Errorf("Acquire(%s, %+v): %w", g.name, opts, err)
					return
				case l == nil:
					notGranted.Add(1)
					continue
				}
				granted.Add(1)
				bad := g.hold(exclusive)
				if err := l.Release(bg); err != nil {
					errs <- fmt.Errorf("Release(%s): %w", g.name, err)
					return
				}
				if bad != nil {
					errs <- bad
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	t.Logf("%d grants, %d not granted in time, %d cancelled, %d unanswered in a short Timeout; at most %d readers at once, %d of 3 bulkhead permits",
		granted.Load(), notGranted.Load(), cancelled.Load(), noReply.Load(), guards[0].peak.Load(), guards[1].peak.Load())
	require.Greater(t, granted.Load(), int64(workers), "the callers got the keys")
	for _, g := range guards {
		// A cancel's void may free a permit a moment after Acquire returned.
		eventually(t, g.name+" free: no permit leaked", func() bool { return tryNow(t, ps[0], g.name, writer) })
	}
}

// The readers of a read/write key, on two providers, take their next lease
// before they give back the one they hold, so that without the writers'
// mark the key would never be free of them: a writer waiting with them is
// still granted, well within its Timeout, and once it waits no reader
// arriving after it is granted (until it is).
func TestAWriterIsNotStarvedByReaders(t *testing.T) {
	srv := redistest.Start(t)
	// The writer's mark lasts three retry intervals past its last try: 200ms
	// makes that 600ms, so that a try delayed on a loaded machine does not
	// let the mark lapse (fairness, the subject, is what a lapse loses).
	var ps [2]*redislock.Provider
	for i := range ps {
		ps[i] = newProvider(t, deadlineClient(t, srv.Addr), redislock.WithRetryInterval(200*time.Millisecond))
	}
	const key = "starve"
	var stop atomic.Bool
	var readers, writers atomic.Int64
	overlap := make(chan error, 1)
	var wg sync.WaitGroup
	for i := range 6 {
		wg.Go(func() {
			p := ps[i%2]
			var held tenace.LockLease
			for !stop.Load() {
				// The next lease first, while this one is held: readers
				// overlap, and the key is never free of them unless new
				// readers are held back.
				opts := reader
				if held != nil {
					opts.Timeout = 20 * time.Millisecond
				}
				next, err := p.Acquire(bg, key, opts)
				if err != nil {
					select {
					case overlap <- err:
					default:
					}
					return
				}
				if next != nil {
					readers.Add(1)
					if writers.Load() != 0 {
						select {
						case overlap <- errors.New("a reader granted beside the writer"):
						default:
						}
					}
				}
				if held != nil {
					readers.Add(-1)
					_ = held.Release(bg)
				}
				held = next
				time.Sleep(2 * time.Millisecond)
			}
			if held != nil {
				readers.Add(-1)
				_ = held.Release(bg)
			}
		})
	}
	defer func() { stop.Store(true); wg.Wait() }()
	eventually(t, "readers hold the key", func() bool { return readers.Load() >= 3 })

	start := time.Now()
	l, err := ps[0].Acquire(bg, key, tenace.LockAcquireOptions{Timeout: 5 * time.Second})
	took := time.Since(start)
	require.NoError(t, err)
	require.NotNil(t, l, "the writer starved: not granted in 5s while readers came and went")
	writers.Add(1)
	time.Sleep(5 * time.Millisecond) // readers trying now must not get in
	require.Zero(t, readers.Load(), "no reader beside the writer")
	writers.Add(-1)
	require.NoError(t, l.Release(bg))
	t.Logf("the writer was granted after %v", took.Round(time.Millisecond))
	eventually(t, "readers back after the writer", func() bool { return readers.Load() >= 1 })
	select {
	case err := <-overlap:
		t.Fatal(err)
	default:
	}
}

// holderSharedEnv makes holderProcess hold one of two permits of
// "killedshared" instead.
const holderSharedEnv = "TENACE_REDISLOCK_HOLDER_SHARED"

// A process holding a permit of a keyed bulkhead is killed (SIGKILL): its
// permit comes back within one window (300 ms in the holder), though its
// TTL is an hour; a caller waiting for it on another provider is granted
// then, not before the holder's renewals stop.
func TestAKilledHoldersPermitComesBackWithinItsWindow(t *testing.T) {
	srv, c := setup(t)
	cmd := startHolder(t, srv.Addr, holderSharedEnv+"=1")

	p := newProvider(t, c, redislock.WithRetryInterval(50*time.Millisecond))
	kept := mustAcquire(t, p, "killedshared", bulk(2))
	defer func() { require.NoError(t, kept.Release(bg)) }()
	// The holder has renewed past its first window (startHolder): its
	// permit outlives it only through renewals.
	require.False(t, tryNow(t, p, "killedshared", bulk(2)), "both permits held: the holder's renewed past its first window")

	r := acquireAsync(bg, p, "killedshared", tenace.LockAcquireOptions{Shared: true, Permits: 2, Timeout: 5 * time.Second})
	killed := time.Now()
	require.NoError(t, cmd.Process.Signal(syscall.SIGKILL))
	_ = cmd.Wait()
	got := <-r
	freed := time.Since(killed)
	require.NoError(t, got.err)
	require.NotNil(t, got.lease, "the killed holder's permit came back")
	require.NoError(t, got.lease.Release(bg))
	t.Logf("the permit came back %v after SIGKILL (window 300ms)", freed.Round(time.Millisecond))
	require.Less(t, freed, 300*time.Millisecond+time.Second, "within one window, and the waiter's retry")
}

// A writer marks the key while it waits, and takes its mark off when it
// gives up: a reader is held back while the writer waits, and granted at
// once after its Timeout, not a mark's life later.
func TestAWriterThatGivesUpTakesItsMarkOff(t *testing.T) {
	_, c := setup(t)
	p := newProvider(t, c, redislock.WithRetryInterval(time.Second))
	require.Greater(t, redislock.MarkLife(p), 2*time.Second)
	r1 := mustAcquire(t, p, "mark", reader)
	require.True(t, tryNow(t, p, "mark", reader), "readers share the key")
	w := acquireAsync(bg, p, "mark", tenace.LockAcquireOptions{Timeout: time.Second})
	eventually(t, "the writer's mark", func() bool { return c.Exists(bg, "tenace:lock:{mark}:writers").Val() == 1 })
	require.False(t, tryNow(t, p, "mark", reader), "a reader arriving after a waiting writer")
	got := <-w
	require.NoError(t, got.err)
	require.Nil(t, got.lease, "the writer waits for the reader")
	within(t, time.Second, "a reader granted after the writer gave up", func() bool { return tryNow(t, p, "mark", reader) })
	require.NoError(t, r1.Release(bg))
	require.True(t, tryNow(t, p, "mark", writer))
	require.Zero(t, c.Exists(bg, "tenace:lock:{mark}", "tenace:lock:{mark}:holders", "tenace:lock:{mark}:writers").Val(), "nothing left of the key but its counter and markers")
}

// zremCounter counts the ZREM commands a client sends: a writer's unmark.
type zremCounter struct{ n atomic.Int64 }

func (h *zremCounter) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *zremCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if cmd.Name() == "zrem" {
			h.n.Add(1)
		}
		return next(ctx, cmd)
	}
}
func (h *zremCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// A NoWait writer does not mark (nor unmark: it had nothing to take
// off): readers are not held back by a writer that is not waiting.
func TestANoWaitWriterDoesNotMark(t *testing.T) {
	_, c := setup(t)
	zrem := &zremCounter{}
	c.AddHook(zrem)
	p, pw := newProvider(t, c), newProvider(t, c)
	r1 := mustAcquire(t, p, "nomark", reader)
	require.False(t, tryNow(t, pw, "nomark", writer))
	require.NoError(t, pw.Close()) // waits for an unmark in flight
	require.Zero(t, zrem.n.Load(), "no unmark: no mark")
	require.Zero(t, c.Exists(bg, "tenace:lock:{nomark}:writers").Val())
	require.True(t, tryNow(t, p, "nomark", reader))
	require.NoError(t, r1.Release(bg))
}

// Shared grants get fencing tokens from the key's counter, strictly
// increasing across modes; a copy of a shared acquire that reaches the
// server again (a go-redis retry) gets its own grant's token back, not a
// later one; a holder's lease is one in Stats' Held.
func TestSharedFencingTokensAndRetriedAcquires(t *testing.T) {
	_, c := setup(t)
	p := newProvider(t, c)
	var last uint64
	next := func(l tenace.LockLease) uint64 {
		tok := l.(tenace.FencedLease).Token()
		require.Greater(t, tok, last)
		last = tok
		return tok
	}
	w := mustAcquire(t, p, "fence", writer)
	next(w)
	require.NoError(t, w.Release(bg))
	r1 := mustAcquire(t, p, "fence", reader)
	t1 := next(r1)
	r2 := mustAcquire(t, p, "fence", reader)
	next(r2)
	require.Equal(t, 2, p.Stats().Held, "each shared lease counts one")
	reply, err := redislock.RunAcquireScriptReply(bg, r1)
	require.NoError(t, err)
	require.Equal(t, [3]int64{1, int64(t1), 0}, reply, "a retried acquire finds its own grant and token")
	require.Equal(t, int64(2), c.ZCard(bg, "tenace:lock:{fence}:holders").Val(), "and takes no second permit")
	require.NoError(t, r1.Release(bg))
	n, err := redislock.RunAcquireScript(bg, r1)
	require.NoError(t, err)
	require.Equal(t, int64(-1), n, "a late copy after the release takes nothing")
	require.NoError(t, r2.Release(bg))
	w = mustAcquire(t, p, "fence", writer)
	next(w)
	require.NoError(t, w.Release(bg))
	require.Zero(t, p.Stats().Held)
}

// oldAcquireScript is the acquire script of the versions before shared
// locks, as a process still running one sends it.
var oldAcquireScript = redis.NewScript(`
redis.replicate_commands()
local holder = redis.call('GET', KEYS[1])
if holder == ARGV[1] then
	return {1, tonumber(redis.call('GET', KEYS[2]) or '0')}
end
if holder then
	return {0, redis.call('PTTL', KEYS[1])}
end
if redis.call('EXISTS', KEYS[3]) == 1 then
	return {-1, 0}
end
local t = redis.call('TIME')
local fence = tonumber(t[1]) * 1000000 + tonumber(t[2])
local last = tonumber(redis.call('GET', KEYS[2]) or '0')
if last >= fence then
	fence = last + 1
end
redis.call('SET', KEYS[2], string.format('%.0f', fence))
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return {1, fence}
`)

// A process running a version before shared locks sees a key held shared
// as held (the lock name holds "shared:N"), and a set does too; once the
// last shared holder leaves, the key is free for all of them. And an
// exclusive holder of the old version holds back new shared callers.
func TestOldVersionsAndSetsSeeASharedKeyHeld(t *testing.T) {
	_, c := setup(t)
	p := newProvider(t, c)
	oldTry := func(token string) int64 {
		res, err := oldAcquireScript.Run(bg, c, []string{"tenace:lock:{old}", "tenace:lock:{old}:fence", "tenace:lock:{old}:void:" + token}, token, 10000).Int64Slice()
		require.NoError(t, err)
		return res[0]
	}
	r := mustAcquire(t, p, "old", bulk(3))
	require.Equal(t, "shared:3", c.Get(bg, "tenace:lock:{old}").Val())
	require.Zero(t, oldTry("0123456789abcdef0123456789abcdef"), "an old version's acquire sees the key held")
	set, err := p.AcquireSet(bg, []string{"old", "old2"}, tenace.LockAcquireOptions{Timeout: tenace.NoWait})
	require.NoError(t, err)
	require.Nil(t, set, "a set sees the key held")
	require.NoError(t, r.Release(bg))
	require.Equal(t, int64(1), oldTry("0123456789abcdef0123456789abcdef"), "free for the old version after the last shared holder")
	require.False(t, tryNow(t, p, "old", reader), "the old version's holder holds back readers")
	require.NoError(t, c.Del(bg, "tenace:lock:{old}").Err())

	_, err = p.AcquireSet(bg, []string{"a", "b"}, reader)
	require.ErrorIs(t, err, tenace.ErrInvalidOption, "a set is taken exclusive")
}

// The first shared holder's count wins while any holds the key: a caller
// passing another Permits gets the key's.
func TestTheFirstHoldersCountWins(t *testing.T) {
	_, c := setup(t)
	p := newProvider(t, c)
	a := mustAcquire(t, p, "count", bulk(1))
	require.False(t, tryNow(t, p, "count", bulk(5)), "the key's count is 1")
	require.NoError(t, a.Release(bg))
	a = mustAcquire(t, p, "count", bulk(2))
	require.True(t, tryNow(t, p, "count", bulk(1)), "the key's count is 2 now")
	require.NoError(t, a.Release(bg))
	require.Zero(t, c.Exists(bg, "tenace:lock:{count}", "tenace:lock:{count}:holders").Val())
}

// On a stalled server (SIGSTOP) a shared caller's first try is an error
// wrapping ErrNoReply within its Timeout, and a shared waiter whose retry
// the server leaves unanswered too; what they sent is undone once the
// server answers again: only the holder's permit is left.
func TestSharedWaitersOnAStalledServer(t *testing.T) {
	srv := redistest.Start(t)
	c := deadlineClient(t, srv.Addr)
	p := newProvider(t, c, redislock.WithRetryInterval(50*time.Millisecond))
	warmShared(t, c, p)
	held := mustAcquire(t, p, "stalled", bulk(1))
	waiter := acquireAsync(bg, p, "stalled", tenace.LockAcquireOptions{Shared: true, Permits: 1, Timeout: time.Second})
	waitSubscribed(t, c, "stalled", 1)
	srv.Pause()
	resumed := false
	defer func() {
		if !resumed {
			srv.Resume()
		}
	}()
	start := time.Now()
	l, err := p.Acquire(bg, "stalled2", tenace.LockAcquireOptions{Shared: true, Timeout: 100 * time.Millisecond})
	require.Nil(t, l)
	require.ErrorIs(t, err, redislock.ErrNoReply)
	require.ErrorIs(t, err, tenace.ErrNoReply)
	t.Logf("a first shared try: %v after %v", err, time.Since(start).Round(time.Millisecond))
	got := <-waiter
	require.Nil(t, got.lease)
	require.ErrorIs(t, got.err, redislock.ErrNoReply, "the shared waiter's retry went unanswered")
	srv.Resume()
	resumed = true
	within(t, 2*time.Second, "the stalled acquires undone", func() bool {
		return c.ZCard(bg, "tenace:lock:{stalled}:holders").Val() == 1 && c.Exists(bg, "tenace:lock:{stalled2}", "tenace:lock:{stalled2}:holders").Val() == 0
	})
	require.NoError(t, held.Release(bg))
}

// A killed server (connections refused) fails a shared waiter's next try
// at once with the cause, as an exclusive one's.
func TestSharedWaiterOnAKilledServer(t *testing.T) {
	srv := redistest.Start(t)
	c := deadlineClient(t, srv.Addr)
	p := newProvider(t, c, redislock.WithRetryInterval(50*time.Millisecond))
	warmShared(t, c, p)
	held := mustAcquire(t, p, "killed", bulk(1))
	waiter := acquireAsync(bg, p, "killed", tenace.LockAcquireOptions{Shared: true, Permits: 1, Timeout: 10 * time.Second})
	waitSubscribed(t, c, "killed", 1)
	srv.Kill()
	start := time.Now()
	got := <-waiter
	require.Nil(t, got.lease)
	require.ErrorIs(t, got.err, syscall.ECONNREFUSED)
	require.Less(t, time.Since(start), 5*time.Second, "at its next try, not at the Timeout")
	require.Error(t, held.Release(bg), "the release cannot reach the server")
}

// Shared locks through a Cluster client: the holders and the writers
// waiting share the key's hash tag, so the scripts run on its slot; a
// writer waiting for the readers is woken by the last one's release.
func TestSharedOnAClusterClient(t *testing.T) {
	srv := redistest.StartCluster(t)
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{srv.Addr}, ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = c.Close() })
	p := newProvider(t, c, redislock.WithRetryInterval(time.Hour))
	r1 := mustAcquire(t, p, "orders/7", reader)
	r2 := mustAcquire(t, p, "orders/7", tenace.LockAcquireOptions{Shared: true, Timeout: tenace.NoWait})
	w := acquireAsync(bg, p, "orders/7", writer)
	waitSubscribed(t, c, "orders/7", 1)
	require.False(t, tryNow(t, p, "orders/7", reader), "a reader after the waiting writer")
	require.NoError(t, r1.Release(bg))
	require.NoError(t, r2.Release(bg))
	got := <-w
	require.NoError(t, got.err)
	require.NotNil(t, got.lease, "woken by the last reader's release")
	require.Greater(t, got.lease.(tenace.FencedLease).Token(), r2.(tenace.FencedLease).Token())
	require.NoError(t, got.lease.Release(bg))
	require.True(t, tryNow(t, p, "orders/7", bulk(2)))
}

// A shared waiter woken by a release and refused because a writer waits
// wakes the writer of its process: with the fallback retry an hour away,
// the writer, queued behind that shared waiter, is granted on the release
// of the one permit they both wait for.
func TestARefusedSharedWaiterWakesTheWriter(t *testing.T) {
	_, c := setup(t)
	tries := &countingHook{}
	c.AddHook(tries)
	p := newProvider(t, c, redislock.WithRetryInterval(time.Hour))
	held := mustAcquire(t, p, "wake", bulk(1)) // loads the script (a NOSCRIPT refusal is not counted)
	tries.acquires.Store(0)
	// Each waiter tries once, subscribes, and tries again once the
	// subscription is confirmed: after its second try it waits for a wake.
	second := acquireAsync(bg, p, "wake", bulk(1))
	eventually(t, "the shared waiter's try after its subscription", func() bool { return tries.acquires.Load() == 2 })
	w := acquireAsync(bg, p, "wake", tenace.LockAcquireOptions{Timeout: 5 * time.Second})
	eventually(t, "the writer's try after its subscription", func() bool { return tries.acquires.Load() == 4 })
	require.Equal(t, 2, p.Stats().Waiting)
	require.Equal(t, int64(1), c.Exists(bg, "tenace:lock:{wake}:writers").Val(), "the writer marked the key")
	require.NoError(t, held.Release(bg)) // wakes the oldest waiter: the shared one
	got := <-w
	require.NoError(t, got.err)
	require.NotNil(t, got.lease, "the writer, woken by the refused shared waiter")
	select {
	case r := <-second:
		t.Fatalf("the shared waiter got (%v, %v) beside the writer", r.lease, r.err)
	default:
	}
	require.NoError(t, got.lease.Release(bg))
	r := <-second
	require.NoError(t, r.err)
	require.NotNil(t, r.lease, "the shared waiter, after the writer")
	require.NoError(t, r.lease.Release(bg))
}

// A writer's release admits every reader waiting in the process, not only
// the one its message woke: a reader granted hands the wake-up on. The
// fallback retry is an hour away, and the writer's key had a window to go.
func TestAReleaseAdmitsEveryWaitingReader(t *testing.T) {
	_, c := setup(t)
	tries := &countingHook{}
	c.AddHook(tries)
	p := newProvider(t, c, redislock.WithRetryInterval(time.Hour))
	held := mustAcquire(t, p, "admit", writer) // loads the script
	tries.acquires.Store(0)
	var readers []<-chan result
	for i := range 3 {
		readers = append(readers, acquireAsync(bg, p, "admit", tenace.LockAcquireOptions{Shared: true, Timeout: 5 * time.Second}))
		// its first try, and its try after the subscription: it waits
		eventually(t, "the reader waits", func() bool { return tries.acquires.Load() == int64(2*(i+1)) })
	}
	require.NoError(t, held.Release(bg))
	var leases []tenace.LockLease
	for _, r := range readers {
		got := <-r
		require.NoError(t, got.err)
		require.NotNil(t, got.lease, "every waiting reader admitted by one release")
		leases = append(leases, got.lease)
	}
	for _, l := range leases {
		require.NoError(t, l.Release(bg))
	}
}

// Stats by mode: a shared lease counts in Held and in SharedKeys and
// SharedHolders; a shared waiter in Waiting and SharedWaiting; exclusive
// ones in Held and Waiting only. All back to 0 once released.
func TestStatsByMode(t *testing.T) {
	_, c := setup(t)
	p := newProvider(t, c)
	reader := tenace.LockAcquireOptions{Shared: true}
	w := mustAcquire(t, p, "stats/w", tenace.LockAcquireOptions{})
	r1 := mustAcquire(t, p, "stats/r", reader)
	r2 := mustAcquire(t, p, "stats/r", reader)
	require.Equal(t, tenace.LockStats{Held: 3, SharedKeys: 2, SharedHolders: 2}, p.Stats())

	ctx, cancel := context.WithCancel(bg)
	sharedWaiter := acquireAsync(ctx, p, "stats/w", reader)
	eventually(t, "a shared waiter", func() bool { return p.Stats().SharedWaiting == 1 })
	writerWaiter := acquireAsync(ctx, p, "stats/r", tenace.LockAcquireOptions{})
	eventually(t, "a writer waiting too", func() bool { return p.Stats().Waiting == 2 })
	s := p.Stats()
	require.Equal(t, 1, s.SharedWaiting, "the writer is not a shared waiter")
	require.LessOrEqual(t, s.SharedKeys, s.Held)
	cancel()
	for _, r := range []<-chan result{sharedWaiter, writerWaiter} {
		got := <-r
		require.Nil(t, got.lease)
		require.ErrorIs(t, got.err, context.Canceled)
	}
	eventually(t, "the waiters gone", func() bool { return p.Stats().Waiting == 0 })
	require.Zero(t, p.Stats().SharedWaiting)
	for _, l := range []tenace.LockLease{w, r1, r2} {
		require.NoError(t, l.Release(bg))
	}
	require.Equal(t, tenace.LockStats{}, p.Stats())
}

package pglock_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"tenace.dev/internal/pgtest"
	"tenace.dev/tenace"
	"tenace.dev/tenace/pglock"
)

var (
	reader = tenace.LockAcquireOptions{Shared: true}
	writer = tenace.LockAcquireOptions{}
)

func bulkhead(n int) tenace.LockAcquireOptions {
	return tenace.LockAcquireOptions{Shared: true, Permits: n}
}

// held returns the advisory locks the server holds or queues for key,
// its gate's included, as "mode:granted" lines; "" when none.
func held(t *testing.T, srv *pgtest.Server, key string) string {
	t.Helper()
	return srv.MustExec(t, fmt.Sprintf(`SELECT coalesce(string_agg(CASE WHEN l.objid = k.id::oid THEN '' ELSE 'gate ' END || l.mode || ':' || l.granted, ' ' ORDER BY l.pid), '')
FROM pg_locks l JOIN tenace_lock_keys k ON l.objid IN (k.id::oid, (-k.id)::oid)
WHERE l.locktype = 'advisory' AND l.objsubid = 2 AND l.classid = 'tenace_lock_keys'::regclass::oid AND k.key = convert_to(%s, 'UTF8')`, quote(key)))
}

// waitFree waits, within 10 s, until the server holds nothing for key: a
// session discarded by a give-up ends a moment after the call returned.
func waitFree(t *testing.T, srv *pgtest.Server, key string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for h := held(t, srv, key); h != ""; h = held(t, srv, key) {
		if time.Now().After(deadline) {
			t.Fatalf("the server still holds for %q after 10s: %s; its sessions: %s", key, h, srv.MustExec(t, fmt.Sprintf(`SELECT string_agg(a.pid || ' ' || a.state || ' ' || left(a.query, 60) || ' ' || coalesce(a.wait_event, '-'), '; ')
FROM pg_stat_activity a WHERE a.pid IN (SELECT l.pid FROM pg_locks l JOIN tenace_lock_keys k ON l.objid IN (k.id::oid, (-k.id)::oid)
WHERE l.locktype = 'advisory' AND l.objsubid = 2 AND k.key = convert_to(%s, 'UTF8'))`, quote(key))))
		}
		time.Sleep(5 * time.Millisecond) // polling interval, not synchronisation
	}
}

// TestWriterNotOvertakenByLaterReaders: a writer waiting for a reader is
// not overtaken by a reader, or a bulkhead caller, that arrives after it —
// neither a NoWait one nor one that waits: PostgreSQL queues a shared
// request behind a waiting exclusive one. pg_locks shows who waits (the
// provider's Stats cannot: a caller counts as waiting from the moment it
// enters Acquire, before its statement reaches the server), and that the
// later one still waits once the writer is granted.
func TestWriterNotOvertakenByLaterReaders(t *testing.T) {
	srv := server(t)
	for _, tc := range []struct {
		name string
		opts tenace.LockAcquireOptions
	}{{"reader", reader}, {"bulkhead", bulkhead(3)}} {
		t.Run(tc.name, func(t *testing.T) {
			p := newProvider(t, srv)
			key := keyOf(t, "k")
			first := mustAcquire(t, p, key, tc.opts)
			w := acquireAsync(bg, p, key, writer)
			waitForWaiters(t, srv, key, 1)
			try := tc.opts
			try.Timeout = tenace.NoWait
			l, err := p.Acquire(bg, key, try)
			require.NoError(t, err)
			require.Nil(t, l, "a NoWait %s arriving after a waiting writer was granted", tc.name)
			later := acquireAsync(bg, p, key, tc.opts)
			waitForWaiters(t, srv, key, 2)
			require.NoError(t, first.Release(bg))
			got := <-w
			require.NoError(t, got.err)
			require.NotNil(t, got.lease)
			require.Equal(t, 1, waiters(t, srv, key), "the later %s waits while the writer holds the key: %s", tc.name, held(t, srv, key))
			select {
			case r := <-later:
				t.Fatalf("the later %s got (%v, %v) beside the writer", tc.name, r.lease, r.err)
			default:
			}
			require.NoError(t, got.lease.Release(bg))
			got = <-later
			require.NoError(t, got.err)
			require.NotNil(t, got.lease)
			require.NoError(t, got.lease.Release(bg))
			waitFree(t, srv, key)
		})
	}
}

// TestBulkheadWaitersInArrivalOrder: bulkhead callers that wait for a
// permit are admitted in the order they reached the gate's queue on the
// server, and a NoWait caller does not jump it.
func TestBulkheadWaitersInArrivalOrder(t *testing.T) {
	srv := server(t)
	p := newProvider(t, srv)
	key := keyOf(t, "k")
	one := bulkhead(1)
	h := mustAcquire(t, p, key, one)
	const n = 3
	var rs []<-chan result
	for i := range n {
		rs = append(rs, acquireAsync(bg, p, key, one))
		// The first holds the gate and waits for the permit; the others
		// wait for the gate.
		waitForGate(t, srv, key, i+1)
	}
	l, err := p.Acquire(bg, key, tenace.LockAcquireOptions{Shared: true, Permits: 1, Timeout: tenace.NoWait})
	require.NoError(t, err)
	require.Nil(t, l, "a NoWait caller jumped the queue of waiting bulkhead callers")
	prev := h
	for i, r := range rs {
		require.NoError(t, prev.Release(bg))
		got := <-r
		require.NoError(t, got.err, "waiter %d", i)
		require.NotNil(t, got.lease, "waiter %d", i)
		for _, later := range rs[i+1:] {
			select {
			case r := <-later:
				t.Fatalf("a later waiter got (%v, %v) before waiter %d released", r.lease, r.err, i)
			default:
			}
		}
		prev = got.lease
	}
	require.NoError(t, prev.Release(bg))
	waitFree(t, srv, key)
}

// waitForGate waits until n sessions hold or wait for key's gate.
func waitForGate(t *testing.T, srv *pgtest.Server, key string, n int) {
	t.Helper()
	q := fmt.Sprintf(`SELECT count(*) FROM pg_locks l JOIN tenace_lock_keys k ON l.objid = (-k.id)::oid
WHERE l.locktype = 'advisory' AND l.objsubid = 2 AND l.classid = 'tenace_lock_keys'::regclass::oid AND k.key = convert_to(%s, 'UTF8')`, quote(key))
	deadline := time.Now().Add(20 * time.Second)
	for srv.MustExec(t, q) != strconv.Itoa(n) {
		if time.Now().After(deadline) {
			t.Fatalf("%d sessions did not come to the gate of %q within 20s: %s", n, key, held(t, srv, key))
		}
		time.Sleep(5 * time.Millisecond) // polling interval, not synchronisation
	}
}

// TestSharedLeases: shared grants each get a fencing token from the key's
// counter, strictly increasing with exclusive ones; Stats counts a shared
// lease as one lease in Held; a shared lease is lost with its connection;
// Release gives back the share alone.
func TestSharedLeases(t *testing.T) {
	srv := server(t)
	p := newProvider(t, srv)
	key := keyOf(t, "k")
	w := mustAcquire(t, p, key, writer)
	require.NoError(t, w.Release(bg))
	r1 := mustAcquire(t, p, key, reader)
	r2 := mustAcquire(t, p, key, reader)
	r3 := mustAcquire(t, p, key, reader)
	tokens := []uint64{w.(tenace.FencedLease).Token()}
	for _, l := range []tenace.LockLease{r1, r2, r3} {
		tok := l.(tenace.FencedLease).Token()
		require.Greater(t, tok, tokens[len(tokens)-1], "a shared grant's token is above the grant before it")
		tokens = append(tokens, tok)
	}
	require.Equal(t, 3, p.Stats().Held, "a shared lease counts as one lease")
	require.Equal(t, "ShareLock:true ShareLock:true ShareLock:true", held(t, srv, key))
	srv.Terminate(t, pglock.BackendPID(r2))
	select {
	case <-r2.(tenace.LosableLease).Lost():
	case <-time.After(10 * time.Second):
		t.Fatal("a shared lease whose backend was terminated was not lost")
	}
	require.ErrorIs(t, r2.Release(bg), tenace.ErrLeaseLost)
	require.NoError(t, r1.Release(bg))
	require.Equal(t, "ShareLock:true", held(t, srv, key), "a reader's Release gives back its share alone")
	l, err := p.Acquire(bg, key, tenace.LockAcquireOptions{Timeout: tenace.NoWait})
	require.NoError(t, err)
	require.Nil(t, l, "a writer beside a reader")
	require.NoError(t, r3.Release(bg))
	next := mustAcquire(t, p, key, writer)
	require.Greater(t, next.(tenace.FencedLease).Token(), tokens[len(tokens)-1])
	require.NoError(t, next.Release(bg))
	require.Equal(t, 0, p.Stats().Held)

	// A set is taken exclusive: shared is refused.
	_, err = p.AcquireSet(bg, []string{key, key + "2"}, reader)
	require.ErrorIs(t, err, tenace.ErrInvalidOption)
}

// TestKilledPermitHolderGivesItsPermitBack: the one permit of a key is
// held by another process, which is killed (SIGKILL): its session ends
// without a NOTIFY, and the bulkhead caller waiting here — holding the
// gate, between statements — is admitted at its next count, within the re-poll
// interval (100 ms) and room for a loaded machine.
func TestKilledPermitHolderGivesItsPermitBack(t *testing.T) {
	srv := server(t)
	p := newProvider(t, srv)
	key := keyOf(t, "k")
	kill := startHolder(t, srv, "holdpermit", key)
	r := acquireAsync(bg, p, key, tenace.LockAcquireOptions{Shared: true, Permits: 1, Timeout: 10 * time.Second})
	waitForPermitWait(t, srv, key)
	start := time.Now()
	kill()
	res := <-r
	delay := time.Since(start)
	require.NoError(t, res.err)
	require.NotNil(t, res.lease, "admitted within 10s of the kill")
	t.Logf("admitted %v after the permit's holder process was killed", delay)
	require.Less(t, delay, 100*time.Millisecond+time.Second, "the permit came back later than the re-poll interval allows")
	require.NoError(t, res.lease.Release(bg))
	waitFree(t, srv, key)
}

// waitForPermitWait waits until the session that holds key's gate is
// idle between statements — waiting for a permit — within 20 s.
func waitForPermitWait(t *testing.T, srv *pgtest.Server, key string) {
	t.Helper()
	q := fmt.Sprintf(`SELECT count(*) FROM pg_stat_activity a JOIN pg_locks l ON l.pid = a.pid JOIN tenace_lock_keys k ON l.objid = (-k.id)::oid
WHERE l.locktype = 'advisory' AND l.objsubid = 2 AND l.granted AND a.state = 'idle' AND k.key = convert_to(%s, 'UTF8')`, quote(key))
	deadline := time.Now().Add(20 * time.Second)
	for srv.MustExec(t, q) == "0" {
		if time.Now().After(deadline) {
			t.Fatalf("no session came to wait for a permit of %q within 20s: %s", key, held(t, srv, key))
		}
		time.Sleep(5 * time.Millisecond) // polling interval, not synchronisation
	}
}

// TestSharedWaitersOnAStalledServer: a reader waiting for a writer, and a
// bulkhead caller waiting for a permit, on a cluster stopped by SIGSTOP,
// return an error wrapping ErrNoReply within their Timeout + 50 ms (beyond
// a bare timer's lateness) — not (nil, nil), which only the server says;
// once the cluster continues, and the holders release, the server holds
// nothing for the key.
func TestSharedWaitersOnAStalledServer(t *testing.T) {
	srv := pgtest.Start(t)
	// Generous: the cluster must stop before the waiter's last count (a
	// third of a second before the Timeout), which the server would
	// answer "held", rightly, on a machine slow to stop it.
	const timeout = 3 * time.Second
	for _, tc := range []struct {
		name         string
		holder, opts tenace.LockAcquireOptions
		waitOn       func(t *testing.T, key string)
	}{
		{"reader", writer, reader, func(t *testing.T, key string) { waitForWaiters(t, srv, key, 1) }},
		{"bulkhead", bulkhead(1), bulkhead(1), func(t *testing.T, key string) { waitForPermitWait(t, srv, key) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, other := newProvider(t, srv), newProvider(t, srv)
			key := keyOf(t, "k")
			h := mustAcquire(t, other, key, tc.holder)
			opts := tc.opts
			opts.Timeout = timeout
			// Waits on the server first (the gate and the LISTEN for the
			// bulkhead), then the cluster stops.
			start, late := time.Now(), control(timeout)
			r := acquireAsync(bg, p, key, opts)
			tc.waitOn(t, key)
			srv.Stall(t)
			defer srv.Continue()
			res := <-r
			took := time.Since(start)
			t.Logf("a %s waiting on a stalled cluster: (%v, %v) after %v", tc.name, res.lease, res.err, took.Round(time.Millisecond))
			require.Nil(t, res.lease)
			require.ErrorIs(t, res.err, pglock.ErrNoReply, "an outage, not contention")
			require.Less(t, took, timeout+overrun+late())
			srv.Continue()
			require.NoError(t, h.Release(bg))
			waitFree(t, srv, key)
		})
	}
}

// TestSharedStress: 64 goroutines, half through a second provider, mix
// readers and writers of one key, and bulkhead callers (3 permits) and
// writers of another, each call waiting, timing out, trying once or
// cancelled at a random moment: never more than 3 permits in use, never a
// writer beside anyone, every grant a fencing token of its own; at the
// end the server holds nothing for either key.
func TestSharedStress(t *testing.T) {
	srv := server(t)
	const goroutines, permits = 64, 3
	run := 3 * time.Second
	if testing.Short() {
		run = time.Second
	}
	ps := []*pglock.Provider{newProvider(t, srv, pglock.WithMaxConns(goroutines)), newProvider(t, srv, pglock.WithMaxConns(goroutines))}
	type keyState struct {
		name             string
		shared           tenace.LockAcquireOptions
		limit            int64 // most shared holders at once; 0 for any
		holders, writers atomic.Int64
		peak             atomic.Int64
		mu               sync.Mutex
		tokens           map[uint64]bool
	}
	keys := []*keyState{
		{name: keyOf(t, "rw"), shared: reader},
		{name: keyOf(t, "bulk"), shared: bulkhead(permits), limit: permits},
	}
	for _, k := range keys {
		k.tokens = map[uint64]bool{}
	}
	var grants, refusals, cuts, noReplies [2]atomic.Int64 // [shared, writer]
	var exhausted atomic.Int64
	// The run lasts run, and on a loaded machine (where most calls may end
	// cut short or without a reply) goes on until both kinds of caller
	// have been granted, within a generous bound: what is checked is what
	// the grants show, not how many fit in a time.
	end, limit := time.Now().Add(run), time.Now().Add(60*time.Second)
	going := func() bool {
		now := time.Now()
		return now.Before(end) || now.Before(limit) && (grants[0].Load() == 0 || grants[1].Load() == 0)
	}
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Go(func() {
			p := ps[g%2]
			rng := rand.New(rand.NewPCG(uint64(g), 1))
			for going() {
				k := keys[rng.IntN(2)]
				w := rng.IntN(8) == 0
				opts := k.shared
				if w {
					opts = writer
				}
				ctx, cancel := context.WithCancel(bg)
				switch rng.IntN(5) {
				case 0:
					opts.Timeout = tenace.NoWait
				case 1, 2:
					opts.Timeout = time.Duration(5+rng.IntN(100)) * time.Millisecond
				case 3:
					ctx, cancel = context.WithTimeout(bg, time.Duration(1+rng.IntN(50))*time.Millisecond)
				default:
					opts.Timeout = 5 * time.Second
				}
				l, err := p.Acquire(ctx, k.name, opts)
				cancel()
				i := 0
				if w {
					i = 1
				}
				switch {
				case errors.Is(err, context.DeadlineExceeded):
					cuts[i].Add(1)
					continue
				case errors.Is(err, pglock.ErrNoReply):
					// A loaded machine: the server's "held" came late.
					noReplies[i].Add(1)
					continue
				case errors.Is(err, pglock.ErrPoolExhausted):
					// The calls Acquire left behind (ErrNoReply) hold
					// connections until the server answers them.
					exhausted.Add(1)
					continue
				case err != nil:
					var pgErr *pgconn.PgError
					if errors.As(err, &pgErr) {
						err = fmt.Errorf("%w (%s)", err, pgErr.Detail)
					}
					t.Errorf("Acquire(%q, %+v): %v", k.name, opts, err)
					return
				case l == nil:
					refusals[i].Add(1)
					continue
				}
				grants[i].Add(1)
				tok := l.(tenace.FencedLease).Token()
				k.mu.Lock()
				dup := k.tokens[tok]
				k.tokens[tok] = true
				k.mu.Unlock()
				if dup {
					t.Errorf("token %d of %q granted twice", tok, k.name)
				}
				var bad string
				if w {
					if n := k.writers.Add(1); n != 1 || k.holders.Load() != 0 {
						bad = fmt.Sprintf("a writer beside %d writers and %d shared holders", n-1, k.holders.Load())
					}
				} else {
					n := k.holders.Add(1)
					if k.writers.Load() != 0 || (k.limit > 0 && n > k.limit) {
						bad = fmt.Sprintf("%d shared holders (limit %d) and %d writers", n, k.limit, k.writers.Load())
					}
					for pk := k.peak.Load(); n > pk && !k.peak.CompareAndSwap(pk, n); pk = k.peak.Load() {
					}
				}
				time.Sleep(time.Duration(rng.IntN(2000)) * time.Microsecond) // the hold: a real overlap is caught
				if w {
					k.writers.Add(-1)
				} else {
					k.holders.Add(-1)
				}
				if err := l.Release(bg); err != nil {
					t.Errorf("Release(%q): %v", k.name, err)
				}
				if bad != "" {
					t.Errorf("%q: %s", k.name, bad)
					return
				}
			}
		})
	}
	wg.Wait()
	t.Logf("%d calls found no free connection", exhausted.Load())
	t.Logf("shared: %d grants, %d not granted, %d cut short, %d no reply; writers: %d, %d, %d, %d; most shared holders at once: %d (rw), %d (bulkhead of %d)",
		grants[0].Load(), refusals[0].Load(), cuts[0].Load(), noReplies[0].Load(),
		grants[1].Load(), refusals[1].Load(), cuts[1].Load(), noReplies[1].Load(),
		keys[0].peak.Load(), keys[1].peak.Load(), permits)
	require.Positive(t, grants[0].Load())
	require.Positive(t, grants[1].Load())
	require.GreaterOrEqual(t, keys[1].peak.Load(), int64(2), "the bulkhead's holders were never together")
	for _, k := range keys {
		waitFree(t, srv, k.name)
		l := mustAcquire(t, ps[0], k.name, tenace.LockAcquireOptions{Timeout: tenace.NoWait})
		require.NoError(t, l.Release(bg))
	}
}

// Stats by mode: a shared lease counts in Held and in SharedKeys and
// SharedHolders; a shared caller inside Acquire in Waiting and
// SharedWaiting; exclusive ones in Held and Waiting only. All back to 0
// once released.
func TestStatsByMode(t *testing.T) {
	srv := server(t)
	p := newProvider(t, srv)
	key := func(name string) string { return keyOf(t, name) }
	reader := tenace.LockAcquireOptions{Shared: true}
	bulk := tenace.LockAcquireOptions{Shared: true, Permits: 2}
	w := mustAcquire(t, p, key("w"), tenace.LockAcquireOptions{})
	r := mustAcquire(t, p, key("r"), reader)
	b := mustAcquire(t, p, key("b"), bulk)
	require.Equal(t, tenace.LockStats{Held: 3, SharedKeys: 2, SharedHolders: 2}, p.Stats())

	ctx, cancel := context.WithCancel(bg)
	sharedWaiter := acquireAsync(ctx, p, key("w"), reader)
	writerWaiter := acquireAsync(ctx, p, key("r"), tenace.LockAcquireOptions{})
	require.Eventually(t, func() bool { return p.Stats().Waiting == 2 }, 10*time.Second, time.Millisecond, "two callers inside Acquire")
	s := p.Stats()
	require.Equal(t, 1, s.SharedWaiting, "the writer is not a shared waiter")
	require.Equal(t, 2, s.SharedHolders)
	cancel()
	for _, ch := range []<-chan result{sharedWaiter, writerWaiter} {
		got := <-ch
		require.Nil(t, got.lease)
		require.ErrorIs(t, got.err, context.Canceled)
	}
	require.Zero(t, p.Stats().SharedWaiting)
	for _, l := range []tenace.LockLease{w, r, b} {
		require.NoError(t, l.Release(bg))
	}
	require.Equal(t, tenace.LockStats{}, p.Stats())
}

package redislock_test

// The outside review's findings: keys that start with "}" (their names'
// hash tag), a void that keeps failing (the janitor's queue), a Timeout on
// a server that does not answer (an outage, not contention), and misuse
// that must panic with a clear message.

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"tenace.dev/internal/redistest"
	"tenace.dev/tenace"
	"tenace.dev/tenace/internal/fakeclock"
	"tenace.dev/tenace/redislock"
)

// ---- keys that start with "}" ----

// A key that starts with "}" is locked, excludes a second caller, wakes a
// waiter on its release and is released, on a Redis Cluster (where its
// names used to land in different slots: CROSSSLOT on every call, and a
// void retried until Close) and on a standalone server; its names are
// prefix + "}{" + its hash + "}" + key + "}" and the rest, and no other key
// shares its lock: not "=}x", "\}x" (an escape), "x" (the key without its
// brace), "}}x" or "}". Ordinary keys keep their names.
func TestKeysStartingWithABrace(t *testing.T) {
	cluster := redistest.StartCluster(t)
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{cluster.Addr}, ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = cc.Close() })
	standalone := redistest.Start(t)
	for _, tc := range []struct {
		name   string
		client redis.UniversalClient
	}{{"cluster", cc}, {"standalone", deadlineClient(t, standalone.Addr)}} {
		t.Run(tc.name, func(t *testing.T) {
			c := tc.client
			p := newProvider(t, c, redislock.WithRetryInterval(time.Hour))
			keys := []string{"}x", "=}x", `\}x`, "x", "}}x", "}"}
			leases := map[string]tenace.LockLease{}
			for _, k := range keys { // all held at once: no two share a lock
				leases[k] = mustAcquire(t, p, k, tenace.LockAcquireOptions{Timeout: tenace.NoWait, TTL: time.Hour})
			}
			for _, k := range keys {
				l, err := p.Acquire(bg, k, tenace.LockAcquireOptions{Timeout: tenace.NoWait})
				require.NoError(t, err, k)
				require.Nil(t, l, "%q is held: a second caller is excluded", k)
			}
			// The hex is each key's FNV-1a 64-bit hash: pinned here, since a
			// change of scheme would let two versions lock one key apart.
			names := map[string]string{
				"}x":  "tenace:lock:}{08e04207b57f61d0}}x}",
				"}}x": "tenace:lock:}{9482e91967817b75}}}x}",
				"}":   "tenace:lock:}{af63f04c86020e88}}}",
				"x":   "tenace:lock:{x}",
				"=}x": "tenace:lock:{=}x}",
			}
			for k, name := range names {
				require.Equal(t, int64(2), c.Exists(bg, name, name+":fence").Val(), "%q is named %s", k, name)
			}

			// A waiter of "}x" hears its release on "}x"'s channel.
			r := acquireAsync(bg, p, "}x", tenace.LockAcquireOptions{})
			waitSubscribedTo(t, c, "tenace:lock:}{08e04207b57f61d0}}x}:released", 1)
			require.NoError(t, leases["}x"].Release(bg))
			got := <-r
			require.NoError(t, got.err)
			require.NotNil(t, got.lease, "woken by the release message")
			require.Greater(t, got.lease.(tenace.FencedLease).Token(), leases["}x"].(tenace.FencedLease).Token())
			leases["}x"] = got.lease

			for _, k := range keys {
				require.NoError(t, leases[k].Release(bg), k)
			}
			for k, name := range names {
				require.Zero(t, c.Exists(bg, name).Val(), "%q released", k)
			}
			pending, running := redislock.PendingVoids(p)
			require.Zero(t, pending, "no void queued: no call failed")
			require.False(t, running)
		})
	}
}

// ---- the janitor ----

// poison makes key's lock a hash, so that every script on it fails with
// WRONGTYPE, and has p try to acquire it: the acquire fails, and its void,
// queued, keeps failing.
func poison(t *testing.T, c redis.UniversalClient, p *redislock.Provider, key string, ttl time.Duration) {
	t.Helper()
	require.NoError(t, c.HSet(bg, "tenace:lock:{"+key+"}", "a", "b").Err())
	_, err := p.Acquire(bg, key, tenace.LockAcquireOptions{TTL: ttl})
	require.ErrorContains(t, err, "WRONGTYPE")
	pending, _ := redislock.PendingVoids(p)
	require.Equal(t, 1, pending, "the failed acquire's void is queued")
}

// A void that keeps failing holds up no other: with a poisoned key's void
// pending, a key taken by an acquire that a stall cut short (the server ran
// it on SIGCONT, after the caller had given up) is freed soon after the
// server answers again, not at the end of its window. Before, the janitor
// retried its first entry until it succeeded, and the victim stayed held
// by nobody for its whole window (10 s here: long beside the bounds below,
// which leave a loaded machine room).
func TestAVoidThatKeepsFailingHoldsUpNoOther(t *testing.T) {
	srv := redistest.Start(t)
	c := deadlineClient(t, srv.Addr)
	p := newProvider(t, c, redislock.WithWindow(10*time.Second))
	warm(t, c, p)
	poison(t, c, p, "poison", 0)

	srv.Pause()
	resumed := false
	defer func() {
		if !resumed {
			srv.Resume()
		}
	}()
	// Sent, unanswered: the server runs it when resumed.
	l, _ := p.Acquire(bg, "victim", tenace.LockAcquireOptions{Timeout: 100 * time.Millisecond, TTL: time.Hour})
	require.Nil(t, l)
	srv.Resume()
	resumed = true
	from := time.Now()
	// The server's clock is the point: the victim's key, taken for 10 s,
	// must go well before.
	within(t, 5*time.Second, "the victim's key freed", func() bool {
		return c.Exists(bg, "tenace:lock:{victim}").Val() == 0 && c.Exists(bg, "tenace:lock:{victim}:fence").Val() == 1
	})
	t.Logf("victim freed %v after SIGCONT, with a void that keeps failing pending (window 10s)", time.Since(from).Round(time.Millisecond))
	// The janitor's goroutine drops the victim's entry once it has read
	// the void's reply, which may come after the test saw the key gone.
	within(t, 3*time.Second, "the poisoned key's void alone pending, retried still (its first expiry, 10 s, has not passed)", func() bool {
		pending, _ := redislock.PendingVoids(p)
		return pending == 1
	})
}

// A void that keeps failing with an error reply is dropped once the key
// its acquire could have taken would have expired (its first expiry after
// the server's first reply: the TTL, 1s, here), and the drop is logged;
// the janitor's goroutine then exits. Before, it was retried until Close,
// about ten failed calls a second.
func TestAVoidThatKeepsFailingIsDropped(t *testing.T) {
	srv := redistest.Start(t)
	c := deadlineClient(t, srv.Addr)
	voids := &voidCounter{}
	c.AddHook(voids.hook())
	log := &syncBuffer{}
	p := newProvider(t, c, redislock.WithLogger(newTextLogger(log)))
	poison(t, c, p, "poison", time.Second)
	eventually(t, "the void dropped and the janitor gone", func() bool {
		pending, running := redislock.PendingVoids(p)
		return pending == 0 && !running
	})
	n := voids.n.Load()
	t.Logf("dropped after %d failed voids", n)
	require.Greater(t, n, int64(1), "retried while the key could be held")
	require.Contains(t, log.String(), "gave up undoing an acquire")
	require.Contains(t, log.String(), "key=poison")
	require.Contains(t, log.String(), "WRONGTYPE")
}

// A void the server never answers (it is down) is dropped once the void
// marker's life has passed (shortened here), and logged. Before, it was
// retried until Close.
func TestAVoidNeverAnsweredIsDroppedAfterTheMarkersLife(t *testing.T) {
	srv := redistest.Start(t)
	c := deadlineClient(t, srv.Addr)
	log := &syncBuffer{}
	p := newProvider(t, c, redislock.WithLogger(newTextLogger(log)))
	redislock.SetVoidLife(p, 300*time.Millisecond)
	warm(t, c, p)
	srv.Kill()
	_, err := p.Acquire(bg, "gone", tenace.LockAcquireOptions{})
	require.ErrorContains(t, err, "connection refused")
	eventually(t, "the void dropped and the janitor gone", func() bool {
		pending, running := redislock.PendingVoids(p)
		return pending == 0 && !running
	})
	require.Contains(t, log.String(), "gave up undoing an acquire")
	require.Contains(t, log.String(), "serverAnswered=false")
}

// voidCounter counts the void scripts a client sends.
type voidCounter struct{ n atomic.Int64 }

func (v *voidCounter) hook() scriptHook {
	return func(name string) {
		if name == "void" {
			v.n.Add(1)
		}
	}
}

// syncBuffer is a strings.Builder safe for the janitor's goroutine to log
// to while the test reads it.
type syncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// ---- a Timeout on a server that does not answer ----

// A Timeout that passes before the server answered is an error that says
// so, not (nil, nil): through a Lock, a failure (lock.failed, an
// UnexpectedError), not contention (lock.rejected, LockNotAcquiredError).
// Before, a stalled server returned (nil, nil), reported as "another call
// holds it". (A killed server, connections refused, is an error at once:
// TestARefusedConnectionIsAnErrorAtOnce.)
func TestATimeoutWithoutAnAnswerIsAFailureNotContention(t *testing.T) {
	srv := redistest.Start(t)
	c := deadlineClient(t, srv.Addr)
	p := newProvider(t, c)
	warm(t, c, p)
	srv.Pause()
	const timeout = 700 * time.Millisecond
	start := time.Now()
	l, err := p.Acquire(bg, "k", tenace.LockAcquireOptions{Timeout: timeout})
	took := time.Since(start)
	require.Nil(t, l)
	require.ErrorIs(t, err, redislock.ErrNoReply)
	require.ErrorIs(t, err, tenace.ErrNoReply)
	require.ErrorContains(t, err, `redislock: acquiring "k": no reply from Redis within the 700ms Timeout (`)
	require.False(t, errors.Is(err, context.DeadlineExceeded), "DeadlineExceeded is the caller's ctx's, which did not end: %v", err)
	require.Less(t, took, timeout+250*time.Millisecond, "bounded by the Timeout")

	var events []string
	var mu sync.Mutex
	pol := tenace.NewPolicy().WithLock(tenace.LockOptions{Provider: p, Key: "k", Timeout: timeout}).
		OnEvent(func(e tenace.Event) { mu.Lock(); events = append(events, e.Name); mu.Unlock() })
	err = pol.Execute(bg, func(context.Context) error { return nil })
	var ue *tenace.UnexpectedError
	require.ErrorAs(t, err, &ue, "a provider failure")
	require.ErrorIs(t, err, redislock.ErrNoReply)
	require.False(t, errors.Is(err, context.DeadlineExceeded), "not the caller's deadline: %v", err)
	var nae *tenace.LockNotAcquiredError
	require.False(t, errors.As(err, &nae), "not contention: %v", err)
	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, []string{"lock.acquiring", "lock.failed"}, events)
}

// A waiter that saw the key held and whose retry (a fallback retry, the
// release message lost) the stalled server leaves unanswered until the
// Timeout reports the outage too.
func TestARetryLeftUnansweredUntilTheTimeoutIsAFailure(t *testing.T) {
	srv := redistest.Start(t)
	c := deadlineClient(t, srv.Addr)
	holder := newProvider(t, c)
	held := mustAcquire(t, holder, "k", tenace.LockAcquireOptions{TTL: time.Hour})
	wc := deadlineClient(t, srv.Addr)
	tries := &countingHook{}
	wc.AddHook(tries)
	p := newProvider(t, wc, redislock.WithRetryInterval(100*time.Millisecond))
	warm(t, wc, p)
	const timeout = 1500 * time.Millisecond
	before := tries.acquires.Load()
	r := acquireAsync(bg, p, "k", tenace.LockAcquireOptions{Timeout: timeout})
	// Two tries: the first, and the one after subscribing, both answered
	// "held"; then the server stalls and the next retry gets no answer.
	eventually(t, "the waiter answered twice", func() bool { return tries.acquires.Load()-before >= 2 })
	srv.Pause()
	got := <-r
	srv.Resume()
	require.Nil(t, got.lease)
	require.ErrorIs(t, got.err, redislock.ErrNoReply)
	require.ErrorContains(t, got.err, `no reply from Redis within the 1.5s Timeout`)
	require.NoError(t, held.Release(bg))
}

// blockRetries is a hook that, once armed, holds the next acquire script
// without sending it until its call's context ends (a retry in flight on a
// server slow to answer), and reports on inFlight when it starts to.
type blockRetries struct {
	armed    atomic.Bool
	inFlight chan struct{}
}

func (h *blockRetries) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *blockRetries) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if redislock.ScriptName(cmd) == "acquire" && h.armed.CompareAndSwap(true, false) {
			close(h.inFlight)
			<-ctx.Done()
			cmd.SetErr(ctx.Err())
			return ctx.Err()
		}
		return next(ctx, cmd)
	}
}
func (h *blockRetries) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// A waiter's Timeout that lands on a retry in flight (the server answered
// "held" before) is still a Timeout that passed while waiting for a
// release, (nil, nil), when the retry was sent moments before (a healthy
// server answers in well under a millisecond); and an outage, the error,
// once the retry has gone unanswered for retrySilence (200ms). The
// Timeout runs on a manual clock, so that the test chooses when it ends,
// and the retry is woken by a release message published by hand (the key
// stays held).
func TestATimeoutDuringARetry(t *testing.T) {
	for _, tc := range []struct {
		name       string
		unanswered time.Duration // how long the retry waits before the Timeout (a bounded real wait: the point)
		want       string        // the error; "" for (nil, nil)
	}{
		{"sent moments before", 0, ""},
		{"unanswered for 400ms", 400 * time.Millisecond, "no reply from Redis within the 1h0m0s Timeout"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, c := setup(t)
			holder := newProvider(t, c)
			held := mustAcquire(t, holder, "k", tenace.LockAcquireOptions{TTL: time.Hour})
			wc := deadlineClient(t, c.Options().Addr)
			block := &blockRetries{inFlight: make(chan struct{})}
			wc.AddHook(block)
			p := newProvider(t, wc, redislock.WithRetryInterval(time.Hour))
			clock := fakeclock.New()
			r := acquireAsync(bg, p, "k", tenace.LockAcquireOptions{Timeout: time.Hour, Clock: clock})
			waitSubscribed(t, c, "k", 1)
			block.armed.Store(true)
			// The try that follows the subscription's confirmation, or else
			// one woken by a release message: publish until a retry is in
			// flight.
			publish := func() { require.NoError(t, c.Publish(bg, "tenace:lock:{k}:released", "1").Err()) }
			publish()
			again := time.NewTicker(50 * time.Millisecond)
			defer again.Stop()
			giveUp := time.NewTimer(10 * time.Second)
			defer giveUp.Stop()
		wake:
			for {
				select {
				case <-block.inFlight:
					break wake
				case <-again.C:
					publish()
				case <-giveUp.C:
					t.Fatal("no retry in flight after 10s of release messages")
				}
			}
			if tc.unanswered > 0 {
				time.Sleep(tc.unanswered) // the retry goes unanswered that long: the time is the point
			}
			clock.Advance(time.Hour)
			got := <-r
			require.Nil(t, got.lease)
			if tc.want == "" {
				require.NoError(t, got.err)
			} else {
				require.ErrorContains(t, got.err, tc.want)
			}
			require.NoError(t, held.Release(bg))
		})
	}
}

// ---- misuse ----

// New with a nil client, also a typed nil pointer, and Acquire with a nil
// ctx panic with a message that says so. Before, a typed nil client and a
// nil ctx panicked with a bare nil dereference, deeper in.
func TestMisusePanicsWithAMessage(t *testing.T) {
	require.PanicsWithValue(t, "tenace: redislock.New: nil client", func() { redislock.New(nil) })
	require.PanicsWithValue(t, "tenace: redislock.New: nil client", func() { redislock.New((*redis.Client)(nil)) })
	require.PanicsWithValue(t, "tenace: redislock.New: nil client", func() { redislock.New((*redis.ClusterClient)(nil)) })
	require.PanicsWithValue(t, "tenace: redislock.New: nil client", func() { redislock.New((*redis.Ring)(nil)) })
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}) // never dialled
	t.Cleanup(func() { _ = c.Close() })
	p := newProvider(t, c)
	require.PanicsWithValue(t, "tenace: redislock.Provider.Acquire: nil context: pass context.Background() or the caller's context", func() {
		//lint:ignore SA1012 the misuse under test
		_, _ = p.Acquire(nil, "k", tenace.LockAcquireOptions{})
	})
}

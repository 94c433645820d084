package redislock_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"tenace.dev/internal/redistest"
	"tenace.dev/tenace"
	"tenace.dev/tenace/redislock"
)

func TestMain(m *testing.M) {
	if addr := os.Getenv(helperEnv); addr != "" {
		os.Exit(helperProcess(addr))
	}
	if addr := os.Getenv(holderEnv); addr != "" {
		os.Exit(holderProcess(addr))
	}
	// go-redis (v9.17) dials a new pool connection on a goroutine of its own
	// that Client.Close does not stop: against a killed server it goes on
	// through its dial retries (5 × 100ms) after the test's client is closed,
	// then ends by itself. It is go-redis's, never this package's.
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction("github.com/redis/go-redis/v9/internal/pool.(*ConnPool).dialConn"))
}

var bg = context.Background()

// setup starts a server and returns a client on it, closed at the end.
func setup(t *testing.T) (*redistest.Server, *redis.Client) {
	t.Helper()
	srv := redistest.Start(t)
	return srv, newClient(t, srv.Addr)
}

func newClient(t *testing.T, addr string) *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, DialTimeout: time.Second})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func mustAcquire(t *testing.T, p tenace.LockProvider, key string, opts tenace.LockAcquireOptions) tenace.LockLease {
	t.Helper()
	l, err := p.Acquire(bg, key, opts)
	require.NoError(t, err)
	require.NotNil(t, l)
	return l
}

type result struct {
	lease tenace.LockLease
	err   error
}

func acquireAsync(ctx context.Context, p tenace.LockProvider, key string, opts tenace.LockAcquireOptions) <-chan result {
	r := make(chan result, 1)
	go func() {
		l, err := p.Acquire(ctx, key, opts)
		r <- result{l, err}
	}()
	return r
}

// countingHook counts the tries of Acquire that go through a client: the
// acquire scripts' runs (EVALSHA, or EVAL when the script is not cached
// yet: a NOSCRIPT refusal is not a run), each counted once its reply came
// (or failed), except a first try's answer that sends the same try on to
// the full script ({-2, 0}, see acquireFirstScript): that try is counted
// by the full script's run.
type countingHook struct{ acquires atomic.Int64 }

func (h *countingHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *countingHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if redislock.ScriptName(cmd) == "acquire" && !redis.HasErrorPrefix(err, "NOSCRIPT") && !passedOn(cmd) {
			h.acquires.Add(1)
		}
		return err
	}
}

// passedOn reports whether cmd, an acquire script's run, answered {-2, 0}:
// the try goes on with the full script.
func passedOn(cmd redis.Cmder) bool {
	c, ok := cmd.(*redis.Cmd)
	if !ok {
		return false
	}
	res, err := c.Slice()
	return err == nil && len(res) > 0 && res[0] == int64(-2)
}
func (h *countingHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// waitSubscribed returns once n clients are subscribed to key's release
// channel: the waiters are waiting. It polls the server's own subscriber
// count: the one signal a separate process gives that a waiter has
// subscribed.
func waitSubscribed(t *testing.T, c redis.UniversalClient, key string, n int64) {
	t.Helper()
	waitSubscribedTo(t, c, "tenace:lock:{"+key+"}:released", n)
}

// waitSubscribedTo is waitSubscribed by the channel's name.
func waitSubscribedTo(t *testing.T, c redis.UniversalClient, ch string, n int64) {
	t.Helper()
	eventually(t, fmt.Sprintf("%d subscribers to %s", n, ch), func() bool {
		m, err := c.PubSubNumSub(bg, ch).Result()
		require.NoError(t, err)
		return m[ch] >= n
	})
}

// eventually polls cond every millisecond until it holds, failing the test
// after 10 s: for a state another goroutine, process or the server reaches
// and signals no other way.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	within(t, 10*time.Second, what, cond)
}

// within is eventually with a bound of its own, where the bound is the
// point (the server's clock).
func within(t *testing.T, bound time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(bound)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v", what, bound)
		}
		time.Sleep(time.Millisecond)
	}
}

func TestMutualExclusionAmongGoroutines(t *testing.T) {
	_, c := setup(t)
	p := newProvider(t, c, redislock.WithRetryInterval(50*time.Millisecond))
	counter := 0 // a plain variable: -race and the total catch a second holder
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 25 {
				l := mustAcquire(t, p, "k", tenace.LockAcquireOptions{})
				counter++
				require.NoError(t, l.Release(bg))
			}
		})
	}
	wg.Wait()
	require.Equal(t, 200, counter)
}

func TestMutualExclusionAmongIndependentClients(t *testing.T) {
	srv, _ := setup(t)
	var inside, maxInside atomic.Int32
	var wg sync.WaitGroup
	for range 4 {
		p := newProvider(t, newClient(t, srv.Addr), redislock.WithRetryInterval(50*time.Millisecond))
		wg.Go(func() {
			for range 20 {
				l := mustAcquire(t, p, "k", tenace.LockAcquireOptions{})
				n := inside.Add(1)
				for m := maxInside.Load(); n > m && !maxInside.CompareAndSwap(m, n); m = maxInside.Load() {
				}
				inside.Add(-1)
				require.NoError(t, l.Release(bg))
			}
		})
	}
	wg.Wait()
	require.Equal(t, int32(1), maxInside.Load())
}

// ---- three OS processes ----

const (
	helperEnv    = "TENACE_REDISLOCK_HELPER"
	helperRounds = 40
)

// helperProcess is the test binary re-run as a helper: helperRounds
// read-modify-writes of a shared Redis counter, each under the lock. Without
// mutual exclusion, updates get lost.
func helperProcess(addr string) int {
	c := redis.NewClient(&redis.Options{Addr: addr})
	defer c.Close()
	p := redislock.New(c, redislock.WithRetryInterval(20*time.Millisecond))
	for range helperRounds {
		l, err := p.Acquire(bg, "counter-lock", tenace.LockAcquireOptions{})
		if err != nil || l == nil {
			fmt.Fprintln(os.Stderr, "acquire:", l, err)
			return 1
		}
		v, err := c.Get(bg, "counter").Int()
		if err != nil && !errors.Is(err, redis.Nil) {
			fmt.Fprintln(os.Stderr, "get:", err)
			return 1
		}
		if err := c.Set(bg, "counter", v+1, 0).Err(); err != nil {
			fmt.Fprintln(os.Stderr, "set:", err)
			return 1
		}
		if err := l.Release(bg); err != nil {
			fmt.Fprintln(os.Stderr, "release:", err)
			return 1
		}
	}
	return 0
}

func TestMutualExclusionAcrossThreeProcesses(t *testing.T) {
	srv, c := setup(t)
	const procs = 3
	var cmds []*exec.Cmd
	for range procs {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), helperEnv+"="+srv.Addr)
		cmd.Stderr = os.Stderr
		require.NoError(t, cmd.Start())
		cmds = append(cmds, cmd)
	}
	for _, cmd := range cmds {
		require.NoError(t, cmd.Wait())
	}
	v, err := c.Get(bg, "counter").Int()
	require.NoError(t, err)
	require.Equal(t, procs*helperRounds, v, "no lost update")
}

// ---- timeouts, NoWait, cancel ----

func TestTimeoutReturnsNilNil(t *testing.T) {
	_, c := setup(t)
	p := newProvider(t, c)
	held := mustAcquire(t, p, "k", tenace.LockAcquireOptions{})
	start := time.Now()
	l, err := p.Acquire(bg, "k", tenace.LockAcquireOptions{Timeout: 100 * time.Millisecond})
	require.NoError(t, err)
	require.Nil(t, l)
	require.GreaterOrEqual(t, time.Since(start), 100*time.Millisecond, "waited for its timeout")
	require.NoError(t, held.Release(bg))
}

func TestNoWaitTriesOnce(t *testing.T) {
	_, c := setup(t)
	h := &countingHook{}
	c.AddHook(h)
	p := newProvider(t, c)
	held := mustAcquire(t, p, "k", tenace.LockAcquireOptions{})
	before := h.acquires.Load()
	l, err := p.Acquire(bg, "k", tenace.LockAcquireOptions{Timeout: tenace.NoWait})
	require.NoError(t, err)
	require.Nil(t, l)
	require.Equal(t, int64(1), h.acquires.Load()-before, "exactly one try")
	require.NoError(t, held.Release(bg))
}

func TestCtxCancelWhileWaiting(t *testing.T) {
	_, c := setup(t)
	p := newProvider(t, c, redislock.WithRetryInterval(time.Hour))
	held := mustAcquire(t, p, "k", tenace.LockAcquireOptions{})
	ctx, cancel := context.WithCancel(bg)
	r := acquireAsync(ctx, p, "k", tenace.LockAcquireOptions{})
	waitSubscribed(t, c, "k", 1)
	cancel()
	got := <-r
	require.ErrorIs(t, got.err, context.Canceled)
	require.Nil(t, got.lease)
	require.NoError(t, held.Release(bg))
}

// ---- waking, polling ----

// With the fallback retry an hour away, only the release message can wake
// the waiter.
func TestWaiterWakesOnTheReleaseMessage(t *testing.T) {
	_, c := setup(t)
	p := newProvider(t, c, redislock.WithRetryInterval(time.Hour))
	held := mustAcquire(t, p, "k", tenace.LockAcquireOptions{TTL: time.Hour})
	r := acquireAsync(bg, p, "k", tenace.LockAcquireOptions{})
	waitSubscribed(t, c, "k", 1)
	require.NoError(t, held.Release(bg))
	got := <-r
	require.NoError(t, got.err)
	require.NotNil(t, got.lease, "woken by the release, not by a retry")
	require.NoError(t, got.lease.Release(bg))
}

func TestNoPollingStormWhileTheHolderHolds(t *testing.T) {
	_, c := setup(t)
	hc := newClient(t, c.Options().Addr)
	h := &countingHook{}
	hc.AddHook(h)
	holder := newProvider(t, c)
	waiter := newProvider(t, hc, redislock.WithRetryInterval(200*time.Millisecond))
	held := mustAcquire(t, holder, "k", tenace.LockAcquireOptions{TTL: time.Hour})
	r := acquireAsync(bg, waiter, "k", tenace.LockAcquireOptions{})
	waitSubscribed(t, c, "k", 1)
	const hold = time.Second
	time.Sleep(hold) // the holder's work: the waiter must not hammer Redis meanwhile
	require.NoError(t, held.Release(bg))
	got := <-r
	require.NotNil(t, got.lease)
	require.NoError(t, got.lease.Release(bg))
	// One first try, one after subscribing, at most one per fallback
	// interval (at least 100ms each), one after the release.
	n := h.acquires.Load()
	require.LessOrEqual(t, n, int64(2+int(hold/(100*time.Millisecond))+1), "acquire attempts during a %v hold", hold)
	t.Logf("%d acquire attempts during a %v hold with a 200ms fallback interval", n, hold)
}

// ---- TTL, stale leases, fencing ----

func TestTTLExpiryLetsTheNextAcquirerIn(t *testing.T) {
	_, c := setup(t)
	p := newProvider(t, c, redislock.WithRetryInterval(time.Hour))
	_ = mustAcquire(t, p, "k", tenace.LockAcquireOptions{TTL: 200 * time.Millisecond}) // never released
	// The waiter hears no release; it retries when the holder's TTL runs out.
	l := mustAcquire(t, p, "k", tenace.LockAcquireOptions{Timeout: 10 * time.Second})
	require.NoError(t, l.Release(bg))
}

func TestAStaleLeasesReleaseDoesNotFreeTheNewHolder(t *testing.T) {
	_, c := setup(t)
	p := newProvider(t, c, redislock.WithRetryInterval(time.Hour))
	stale := mustAcquire(t, p, "k", tenace.LockAcquireOptions{TTL: 100 * time.Millisecond})
	fresh := mustAcquire(t, p, "k", tenace.LockAcquireOptions{Timeout: 10 * time.Second})
	require.ErrorIs(t, stale.Release(bg), redislock.ErrLeaseLost)
	l, err := p.Acquire(bg, "k", tenace.LockAcquireOptions{Timeout: tenace.NoWait})
	require.NoError(t, err)
	require.Nil(t, l, "the new holder still holds")
	require.NoError(t, fresh.Release(bg))
	require.NoError(t, fresh.Release(bg), "a second release does nothing")
	// Expired with nobody else: still ErrLeaseLost, and nothing touched.
	lone := mustAcquire(t, p, "k2", tenace.LockAcquireOptions{TTL: 50 * time.Millisecond})
	require.Eventually(t, func() bool { return c.Exists(bg, "tenace:lock:{k2}").Val() == 0 }, 5*time.Second, 10*time.Millisecond)
	require.ErrorIs(t, lone.Release(bg), redislock.ErrLeaseLost)
}

func TestFencingTokensStrictlyIncreaseAcrossClients(t *testing.T) {
	srv, _ := setup(t)
	a := newProvider(t, newClient(t, srv.Addr))
	b := newProvider(t, newClient(t, srv.Addr))
	var last uint64
	for i := range 20 {
		p := a
		if i%2 == 1 {
			p = b
		}
		l := mustAcquire(t, p, "k", tenace.LockAcquireOptions{})
		tok := l.(tenace.FencedLease).Token()
		require.Greater(t, tok, last)
		last = tok
		require.NoError(t, l.Release(bg))
	}
}

func TestFnsContextEndsWhenTheLeaseExpires(t *testing.T) {
	_, c := setup(t)
	p := newProvider(t, c)
	start := time.Now()
	err := tenace.NewPolicy().WithLock(tenace.LockOptions{Provider: p, Key: "k", TTL: 200 * time.Millisecond}).
		Execute(bg, func(ctx context.Context) error {
			<-ctx.Done() // work that outlives its TTL
			return context.Cause(ctx)
		})
	require.ErrorIs(t, err, tenace.ErrLeaseExpired)
	require.Less(t, time.Since(start), 5*time.Second)
}

// ---- failures ----

func TestRedisKilledWhileALeaseIsHeldAndAWaiterWaits(t *testing.T) {
	srv, c := setup(t)
	p := newProvider(t, c, redislock.WithRetryInterval(50*time.Millisecond))
	held := mustAcquire(t, p, "k", tenace.LockAcquireOptions{})
	r := acquireAsync(bg, p, "k", tenace.LockAcquireOptions{})
	waitSubscribed(t, c, "k", 1)
	srv.Kill()
	got := <-r // the waiter's next try fails: an error, no hang
	require.Error(t, got.err)
	require.Nil(t, got.lease)
	require.Error(t, held.Release(bg), "the release cannot reach the server")
	_, err := p.Acquire(bg, "other", tenace.LockAcquireOptions{})
	require.Error(t, err)
}

func TestRedisRestartedTheProviderWorksAgain(t *testing.T) {
	srv, c := setup(t)
	p := newProvider(t, c)
	l := mustAcquire(t, p, "k", tenace.LockAcquireOptions{})
	require.NoError(t, l.Release(bg))
	srv.Restart()
	l = mustAcquire(t, p, "k", tenace.LockAcquireOptions{}) // same provider, same client
	require.NoError(t, l.Release(bg))
}

func TestPolicyEndToEnd(t *testing.T) {
	srv, c := setup(t)
	p := newProvider(t, c)
	pol := tenace.NewPolicy().WithLock(tenace.LockOptions{Provider: p, Key: "reports", Timeout: tenace.NoWait})
	var rec []string
	pol = pol.OnEvent(func(e tenace.Event) { rec = append(rec, e.Name) })
	err := pol.Execute(bg, func(ctx context.Context) error {
		l, ok := tenace.LeaseFrom(ctx)
		require.True(t, ok)
		require.Positive(t, l.(tenace.FencedLease).Token())
		// While held, the same policy is rejected for another caller (bg:
		// this execution's own ctx would be a *DeadlockError, at once).
		var nae *tenace.LockNotAcquiredError
		require.ErrorAs(t, pol.Execute(bg, func(context.Context) error { return nil }), &nae)
		var dl *tenace.DeadlockError
		require.ErrorAs(t, pol.Execute(ctx, func(context.Context) error { return nil }), &dl)
		return nil
	})
	require.NoError(t, err)
	require.Equal(t, []string{"lock.acquiring", "lock.acquired", "lock.acquiring", "lock.rejected", "lock.acquiring", "lock.deadlock", "lock.released"}, rec)

	srv.Kill()
	err = pol.Execute(bg, func(context.Context) error { return nil })
	var ue *tenace.UnexpectedError
	require.ErrorAs(t, err, &ue, "an unreachable Redis is an UnexpectedError")
}

func TestBadInput(t *testing.T) {
	_, c := setup(t)
	p := newProvider(t, c)
	_, err := p.Acquire(bg, "", tenace.LockAcquireOptions{})
	require.ErrorIs(t, err, tenace.ErrMissingKey)
	_, err = p.Acquire(bg, "k", tenace.LockAcquireOptions{Timeout: -2})
	require.ErrorIs(t, err, tenace.ErrInvalidOption)
	_, err = p.Acquire(bg, "k", tenace.LockAcquireOptions{TTL: -1})
	require.ErrorIs(t, err, tenace.ErrInvalidOption)
	require.Zero(t, c.DBSize(bg).Val(), "nothing written")
	require.Panics(t, func() { redislock.WithPrefix("a{b") })
	require.Panics(t, func() { redislock.New(nil) })
}

// TestOnAClusterClient runs the provider through a redis.ClusterClient on a
// one-node Redis Cluster: the lock key and its fencing counter share a hash
// tag, so the scripts run in one slot, and waiters still wake on the release
// message.
func TestOnAClusterClient(t *testing.T) {
	srv := redistest.StartCluster(t)
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{srv.Addr}})
	t.Cleanup(func() { _ = c.Close() })
	p := newProvider(t, c, redislock.WithRetryInterval(time.Hour))
	held := mustAcquire(t, p, "orders/42", tenace.LockAcquireOptions{})
	r := acquireAsync(bg, p, "orders/42", tenace.LockAcquireOptions{})
	waitSubscribed(t, c, "orders/42", 1)
	require.NoError(t, held.Release(bg))
	got := <-r
	require.NoError(t, got.err)
	require.NotNil(t, got.lease, "woken by the release message through the cluster client")
	require.Greater(t, got.lease.(tenace.FencedLease).Token(), held.(tenace.FencedLease).Token())
	require.NoError(t, got.lease.Release(bg))
}

// TestOnAFailoverClient runs the provider through a redis.FailoverClient
// that finds its primary through a real Redis Sentinel, and through the
// UniversalClient that redis.NewUniversalClient builds for the same setup.
func TestOnAFailoverClient(t *testing.T) {
	primary := redistest.Start(t)
	sentinel := redistest.StartSentinel(t, primary)
	f := redis.NewFailoverClient(&redis.FailoverOptions{MasterName: redistest.MasterName, SentinelAddrs: []string{sentinel.Addr}})
	t.Cleanup(func() { _ = f.Close() })
	u := redis.NewUniversalClient(&redis.UniversalOptions{MasterName: redistest.MasterName, Addrs: []string{sentinel.Addr}})
	t.Cleanup(func() { _ = u.Close() })
	for _, c := range []redis.UniversalClient{f, u} {
		p := newProvider(t, c, redislock.WithRetryInterval(time.Hour))
		held := mustAcquire(t, p, "k", tenace.LockAcquireOptions{})
		r := acquireAsync(bg, p, "k", tenace.LockAcquireOptions{})
		waitSubscribed(t, newClient(t, primary.Addr), "k", 1)
		require.NoError(t, held.Release(bg))
		got := <-r
		require.NoError(t, got.err)
		require.NotNil(t, got.lease, "woken by the release message through the failover client")
		require.NoError(t, got.lease.Release(bg))
	}
}

// TestAReleaseWakesOneWaiterInArrivalOrder: with five waiters of one
// provider queued one after the other, each release wakes only the oldest,
// so the lock goes round in arrival order with exactly one try per hand-off
// (waking them all would cost 5+4+3+2+1 tries).
func TestAReleaseWakesOneWaiterInArrivalOrder(t *testing.T) {
	_, c := setup(t)
	wc := newClient(t, c.Options().Addr)
	h := &countingHook{}
	wc.AddHook(h)
	holder := newProvider(t, c)
	p := newProvider(t, wc, redislock.WithRetryInterval(time.Hour))
	held := mustAcquire(t, holder, "k", tenace.LockAcquireOptions{})
	const waiters = 5
	order := make(chan int, waiters)
	var wg sync.WaitGroup
	for i := range waiters {
		wg.Go(func() {
			l, err := p.Acquire(bg, "k", tenace.LockAcquireOptions{})
			if err != nil || l == nil {
				t.Errorf("waiter %d: %v, %v", i, l, err)
				return
			}
			order <- i
			_ = l.Release(bg)
		})
		// Each waiter tries once, subscribes, tries again, then waits: two
		// tries mean it is queued behind the ones before it.
		eventually(t, fmt.Sprintf("waiter %d queued", i), func() bool { return h.acquires.Load() >= int64(2*(i+1)) })
	}
	before := h.acquires.Load()
	require.NoError(t, held.Release(bg))
	wg.Wait()
	close(order)
	var got []int
	for i := range order {
		got = append(got, i)
	}
	require.Equal(t, []int{0, 1, 2, 3, 4}, got, "arrival order within the process")
	require.Equal(t, int64(waiters), h.acquires.Load()-before, "one try per hand-off")
}

// newProvider returns a provider on c, closed when the test ends (before
// the client: cleanups run last-registered first).
func newProvider(t *testing.T, c redis.UniversalClient, opts ...redislock.Option) *redislock.Provider {
	t.Helper()
	p := redislock.New(c, opts...)
	t.Cleanup(func() { _ = p.Close() })
	return p
}

func newTextLogger(w io.Writer) *slog.Logger { return slog.New(slog.NewTextHandler(w, nil)) }

// A Release whose call reached the server twice — go-redis retries a call
// whose reply timed out, after the first run had deleted the key — reports
// the release done, not a loss: the token's release marker tells the
// second run that this token's release deleted the key.
func TestAReleaseRunTwiceIsNotReportedAsALoss(t *testing.T) {
	srv := redistest.Start(t)
	c := newClient(t, srv.Addr)
	p := newProvider(t, c)
	l := mustAcquire(t, p, "twice", tenace.LockAcquireOptions{})
	n, err := redislock.RunReleaseScript(bg, l) // the first run, its reply lost
	require.NoError(t, err)
	require.Equal(t, 1, n)
	require.NoError(t, l.Release(bg), "the retried run finds the key gone by this token's own release")
	_, err = c.Get(bg, "tenace:lock:{twice}").Result()
	require.ErrorIs(t, err, redis.Nil)
}

// A copy of a granted acquire's script that reaches the server after the
// lease's release (queued on another connection, or retried by go-redis)
// takes nothing: the release voided its token.
func TestALateCopyOfAnAcquireTakesNothingAfterTheRelease(t *testing.T) {
	srv := redistest.Start(t)
	c := newClient(t, srv.Addr)
	p := newProvider(t, c)
	l := mustAcquire(t, p, "late", tenace.LockAcquireOptions{})
	require.NoError(t, l.Release(bg))
	got, err := redislock.RunAcquireScript(bg, l)
	require.NoError(t, err)
	require.Equal(t, int64(-1), got, "the late copy was refused as void")
	_, err = c.Get(bg, "tenace:lock:{late}").Result()
	require.ErrorIs(t, err, redis.Nil, "nobody holds the key")
}

// A copy of a granted acquire's script that reaches the server after the
// lease lapsed and was released (the key expired on the server first)
// takes nothing either: the release, finding the key no longer the
// grant's, voids its token all the same.
func TestALateCopyOfAnAcquireTakesNothingAfterALapsedLease(t *testing.T) {
	srv := redistest.Start(t)
	c := newClient(t, srv.Addr)
	p := newProvider(t, c)
	l := mustAcquire(t, p, "lapsed", tenace.LockAcquireOptions{TTL: 50 * time.Millisecond})
	<-l.(tenace.LosableLease).Lost()
	// The server's clock is the point: the key lapses on it.
	within(t, 5*time.Second, "the key's expiry", func() bool { return c.Exists(bg, "tenace:lock:{lapsed}").Val() == 0 })
	require.ErrorIs(t, l.Release(bg), tenace.ErrLeaseLost)
	got, err := redislock.RunAcquireScript(bg, l)
	require.NoError(t, err)
	require.Equal(t, int64(-1), got, "the late copy was refused as void")
	require.Empty(t, heldLocks(t, c, "lapsed"))
	n, err := redislock.RunReleaseScript(bg, l)
	require.NoError(t, err)
	require.Equal(t, 0, n, "a second run of the release still says the key was not deleted by it")
}

// A copy of a granted acquire's first try (go-redis sent it again after a
// lost reply) that reaches the server while the lease holds the key is
// answered with the lease's own fencing token, and takes nothing more; a
// copy of a try that went on to the full script (shared holders refused
// the first) is idempotent too.
func TestACopyOfTheGrantingTryGetsTheSameToken(t *testing.T) {
	srv := redistest.Start(t)
	c := newClient(t, srv.Addr)
	p := newProvider(t, c)
	l := mustAcquire(t, p, "copy", tenace.LockAcquireOptions{})
	got, err := redislock.RunAcquireScriptReply(bg, l)
	require.NoError(t, err)
	require.Equal(t, [3]int64{1, int64(l.(tenace.FencedLease).Token()), 0}, got)
	require.NoError(t, l.Release(bg))
	n, err := redislock.RunAcquireScript(bg, l)
	require.NoError(t, err)
	require.Equal(t, int64(-1), n, "after the release, the copy was refused as void")

	r := mustAcquire(t, p, "copy", tenace.LockAcquireOptions{Shared: true})
	w := acquireAsync(bg, p, "copy", tenace.LockAcquireOptions{Timeout: 5 * time.Second})
	waitSubscribed(t, c, "copy", 1)
	require.NoError(t, r.Release(bg))
	wr := <-w
	require.NoError(t, wr.err)
	require.NotNil(t, wr.lease)
	got, err = redislock.RunAcquireScriptReply(bg, wr.lease)
	require.NoError(t, err)
	require.Equal(t, [3]int64{1, int64(wr.lease.(tenace.FencedLease).Token()), 0}, got)
	require.NoError(t, wr.lease.Release(bg))
}

// The void markers outlive a TTL far below the window: a release's marker
// still tells a retry of that release, past the TTL, that the release was
// done, and still refuses a late copy of the grant's acquire; a void's
// marker (an acquire whose reply was lost) still refuses its copies. The
// markers live a window, and at least 15s; before, they lived the first
// expiry, min(window, TTL): 20ms here, far less than go-redis waits
// (its read timeout, 3s by default) before it retries a call.
func TestVoidMarkersOutliveAShortTTL(t *testing.T) {
	srv := redistest.Start(t)
	c := newClient(t, srv.Addr)
	lose := &lostAcquireReply{voided: make(chan struct{})}
	c.AddHook(lose)
	p := newProvider(t, c)
	const ttl = 20 * time.Millisecond
	// The release's marker is set only by a Release that deleted the key,
	// and on a loaded machine a 20ms lease can expire before its Release
	// runs: the grant is then taken again, a fresh token, until a Release
	// comes in time (ten tries), since what is proved starts only there.
	var l tenace.LockLease
	for try := 1; ; try++ {
		l = mustAcquire(t, p, "released", tenace.LockAcquireOptions{TTL: ttl})
		err := l.Release(bg)
		if err == nil {
			break
		}
		require.ErrorIs(t, err, tenace.ErrLeaseLost, "a Release that failed other than by the lease's expiry")
		require.Less(t, try, 10, "ten %v leases expired before their Release: %v", ttl, err)
		t.Logf("try %d: the %v lease expired before its Release (%v); taking it again", try, ttl, err)
	}
	lose.next.Store(true)
	_, err := p.Acquire(bg, "voided", tenace.LockAcquireOptions{TTL: ttl})
	require.ErrorContains(t, err, "reply lost")
	<-lose.voided // the janitor voided the lost acquire's token
	voided := func() []string {
		keys, err := c.Keys(bg, "tenace:lock:{voided}:void:*").Result()
		require.NoError(t, err)
		return keys
	}

	// The server's clock is the point: once a key set now for the TTL has
	// expired on it, a marker set earlier for the TTL would have too.
	require.NoError(t, c.Set(bg, "probe", "1", ttl).Err())
	within(t, 5*time.Second, "the probe's expiry", func() bool { return c.Exists(bg, "probe").Val() == 0 })

	n, err := redislock.RunReleaseScript(bg, l)
	require.NoError(t, err)
	require.Equal(t, 1, n, "a retry of the release, past the TTL, reports the release, not a loss")
	got, err := redislock.RunAcquireScript(bg, l)
	require.NoError(t, err)
	require.Equal(t, int64(-1), got, "a late copy of the released grant's acquire, past the TTL, takes nothing")
	require.Len(t, voided(), 1, "the void's marker, past the TTL, still refuses the lost acquire's copies")
	pttl, err := c.PTTL(bg, voided()[0]).Result()
	require.NoError(t, err)
	require.Greater(t, pttl, 10*time.Second)
	require.Empty(t, heldLocks(t, c, "released"))
	require.Empty(t, heldLocks(t, c, "voided"))
}

// lostAcquireReply is a hook that, once armed (next), lets the next
// acquire script run and then reports its reply lost; it closes voided
// once the next two-key script after it (the janitor's void) has run.
type lostAcquireReply struct {
	next, lost atomic.Bool
	voided     chan struct{}
}

func (h *lostAcquireReply) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *lostAcquireReply) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if err == nil {
			switch redislock.ScriptName(cmd) {
			case "acquire":
				if h.next.CompareAndSwap(true, false) {
					h.lost.Store(true)
					return errors.New("the acquire script ran and its reply lost (test hook)")
				}
			case "void":
				if h.lost.CompareAndSwap(true, false) {
					close(h.voided)
				}
			}
		}
		return err
	}
}
func (h *lostAcquireReply) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// A void marker outlives every copy of a call that go-redis may send: with
// the default options the 15-s floor covers them (4 sends, 3-s reads), and
// with longer reads or more retries the marker lives as long as they may
// go on. A client whose reads never time out bounds nothing: the floor.
// No server is needed: a client connects on first use.
func TestVoidMarkersOutliveTheClientsRetries(t *testing.T) {
	cases := []struct {
		name   string
		client redis.UniversalClient
		window time.Duration
		want   time.Duration
	}{
		{"defaults", redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}), 0, 15 * time.Second},
		{"a short window", redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}), time.Second, 15 * time.Second},
		{"a long window", redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}), time.Minute, time.Minute},
		// 6 sends × 10 s + 5 backoffs of 512 ms.
		{"long reads, more retries", redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", ReadTimeout: 10 * time.Second, MaxRetries: 5}), 0, 62560 * time.Millisecond},
		{"reads that never time out", redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", ReadTimeout: -1}), 0, 15 * time.Second},
		// 4 redirects × 1 send (a cluster's nodes do not retry) × 10 s + 3 backoffs.
		{"cluster, long reads", redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{"127.0.0.1:1"}, ReadTimeout: 10 * time.Second}), 0, 41536 * time.Millisecond},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Cleanup(func() { _ = c.client.Close() })
			var opts []redislock.Option
			if c.window > 0 {
				opts = append(opts, redislock.WithWindow(c.window))
			}
			p := newProvider(t, c.client, opts...)
			require.Equal(t, c.want, redislock.VoidLife(p))
		})
	}
}

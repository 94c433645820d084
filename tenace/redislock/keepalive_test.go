package redislock_test

// Keepalive and the lost-lease signal (issue 10), on a real redis-server.
// Windows are short (100–300 ms) so that "ten windows" takes a second or
// two; the waits here are bounded real waits where the server's clock is
// the point.

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"tenace.dev/internal/redistest"
	"tenace.dev/tenace"
	"tenace.dev/tenace/locktest"
	"tenace.dev/tenace/redislock"
)

// scriptHook calls its function with the name of every script of the
// provider the client sends (redislock.ScriptName: "acquire", "renew",
// "release", "void", ...).
type scriptHook func(name string)

func (f scriptHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (f scriptHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if name := redislock.ScriptName(cmd); name != "" {
			f(name)
		}
		return next(ctx, cmd)
	}
}
func (f scriptHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// keptWindow and keptInterval are the window and renewal interval of the
// leases a test needs renewed, not lost. A lease is lost once no renewal
// has got through within a window of the last one's send, so a renewal may
// come keptWindow-keptInterval (450ms) late before it is. On a loaded
// 2-core machine (-race, two CPU burners beside) a renewal timer ran up to
// 93ms late, and a renewal's send to the next one's reply took up to
// 160ms: windows of 100-300ms with the default interval (a third) left
// 67-200ms, and such leases were lost.
const (
	keptWindow   = 500 * time.Millisecond
	keptInterval = 50 * time.Millisecond
)

// kept is the options of a provider whose leases a test needs kept: see
// keptWindow.
func kept() []redislock.Option {
	return []redislock.Option{redislock.WithWindow(keptWindow), redislock.WithRenewInterval(keptInterval)}
}

// renewalHook counts the renewal scripts a client sends.
type renewalHook struct{ n atomic.Int64 }

func (h *renewalHook) hook() scriptHook {
	return func(name string) {
		if name == "renew" {
			h.n.Add(1)
		}
	}
}

func TestConformance(t *testing.T) {
	srv := redistest.Start(t)
	c := deadlineClient(t, srv.Addr)
	locktest.Run(t, func(t *testing.T) tenace.LockProvider {
		// A window shorter than MinTTL, so that the TTL checks see a lease
		// renewed up to its cap; long enough that the leases the suite
		// holds are not lost on a loaded machine (keptWindow).
		return newProvider(t, c, append(kept(), redislock.WithRetryInterval(50*time.Millisecond))...)
	}, locktest.Capabilities{
		Fencing:    true,
		Losable:    true,
		TTL:        true,
		ExactStats: true,
		Close:      true,
		Shared:     true,
		ReadWrite:  true,
		Permits:    true,
		// A waiter subscribes to the key's release channel.
		InspectWaiters: true,
		MinTTL:         keptWindow + 100*time.Millisecond,
		WaitBound:      5 * time.Second,
		Lose: func(t *testing.T, l tenace.LockLease) {
			if holders, member, ok := redislock.SharedMember(l); ok {
				// A shared holder: its member of the key's holders, as a
				// holder that stopped renewing loses it.
				require.Equal(t, int64(1), c.ZRem(bg, holders, member).Val(), "the shared lease's member")
				return
			}
			// Delete every lock key this lease could hold: the suite's keys
			// are its own.
			keys, err := c.Keys(bg, "tenace:lock:{*}").Result()
			require.NoError(t, err)
			tok := l.(tenace.FencedLease).Token()
			for _, k := range keys {
				if fk := k + ":fence"; c.Get(bg, fk).Val() == fmt.Sprint(tok) {
					require.NoError(t, c.Del(bg, k).Err())
					return
				}
			}
			t.Fatalf("no lock key holds token %d", tok)
		},
	})
}

// Work that runs four windows keeps its lock: renewals keep the key, nobody
// else gets it, and fn's context does not end.
func TestWorkLongerThanTheWindowKeepsTheLock(t *testing.T) {
	srv := redistest.Start(t)
	c := deadlineClient(t, srv.Addr)
	h := &renewalHook{}
	c.AddHook(h.hook())
	p := newProvider(t, c, kept()...)
	other := newProvider(t, deadlineClient(t, srv.Addr))
	pol := tenace.NewPolicy().WithLock(tenace.LockOptions{Provider: p, Key: "long"})
	var hold time.Duration
	err := pol.Execute(bg, func(ctx context.Context) error {
		start := time.Now()
		// Meanwhile another provider waits four windows for the key, in vain.
		l, err := other.Acquire(ctx, "long", tenace.LockAcquireOptions{Timeout: 4 * keptWindow})
		require.NoError(t, err, "fn's context ended: %v", context.Cause(ctx))
		require.Nil(t, l, "nobody else gets the lock while its holder renews it")
		require.NoError(t, context.Cause(ctx), "fn's context is still live")
		hold = time.Since(start)
		return nil
	})
	require.NoError(t, err)
	renewals := h.n.Load()
	perMin := float64(renewals) / hold.Minutes()
	t.Logf("held %v with a %v window (renewal every %v): %d renewals, %.0f/min per lease (defaults, window %v: %.0f/min)",
		hold.Round(time.Millisecond), keptWindow, keptInterval, renewals, perMin, redislock.DefaultWindow, time.Minute.Seconds()/(redislock.DefaultWindow/3).Seconds())
	require.GreaterOrEqual(t, renewals, int64(4), "renewed at least once a window (about ten times, unloaded)")
}

const holderEnv = "TENACE_REDISLOCK_HOLDER"

// holderWindow is the window of holderProcess's lease.
const holderWindow = 300 * time.Millisecond

// holderProcess is the test binary re-run as a lock holder: it takes
// "killed" (with holderSharedEnv, one of two permits of "killedshared")
// with a one-hour TTL and a holderWindow window, says "held" on stdout,
// then "renewed" once a renewal sent more than a window after the grant
// has found the key still its own (the key outlived its first window
// only through renewals), or "lost" if the lease was lost before that
// (the machine starved the process past its window), and holds it until
// it is killed.
func holderProcess(addr string) int {
	c := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true})
	var (
		once    sync.Once
		granted atomic.Int64 // the grant's time, in UnixNano; 0 before it
	)
	say := func(what string) { once.Do(func() { fmt.Println(what) }) }
	c.AddHook(replyHook(func(cmd redis.Cmder) {
		name := redislock.ScriptName(cmd)
		if name != "renew" && name != "sharedRenew" {
			return
		}
		at := granted.Load()
		if n, err := cmd.(*redis.Cmd).Int(); err == nil && n == 1 && at != 0 && time.Since(time.Unix(0, at)) > holderWindow {
			say("renewed")
		}
	}))
	p := redislock.New(c, redislock.WithWindow(holderWindow))
	key, opts := "killed", tenace.LockAcquireOptions{TTL: time.Hour}
	if os.Getenv(holderSharedEnv) != "" {
		key, opts.Shared, opts.Permits = "killedshared", true, 2
	}
	start := time.Now() // the grant's expiry counts from before the acquire was sent
	l, err := p.Acquire(bg, key, opts)
	if err != nil || l == nil {
		fmt.Fprintln(os.Stderr, "acquire:", l, err)
		return 1
	}
	granted.Store(start.UnixNano())
	fmt.Println("held")
	go func() {
		<-l.(interface{ Lost() <-chan struct{} }).Lost()
		say("lost")
	}()
	_, _ = io.Copy(io.Discard, os.Stdin) // until SIGKILL (or the test's end closes stdin)
	return 0
}

// replyHook calls its function with every command the client sent that
// the server answered without an error, after the reply.
type replyHook func(cmd redis.Cmder)

func (f replyHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (f replyHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if err == nil {
			f(cmd)
		}
		return err
	}
}
func (f replyHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// startHolder starts holderProcess on the server at addr, with env, and
// returns it once it has said it renewed its lease past the first window.
// A holder that lost its lease before that (its renewals starved past the
// window by the machine's load: not what the tests that use it check) is
// killed and another started, up to five in all.
func startHolder(t *testing.T, addr string, env ...string) *exec.Cmd {
	t.Helper()
	for try := 1; ; try++ {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(append(os.Environ(), holderEnv+"="+addr), env...)
		cmd.Stderr = os.Stderr
		stdin, err := cmd.StdinPipe() // closed when the test ends: the holder then exits, if still alive
		require.NoError(t, err)
		out, err := cmd.StdoutPipe()
		require.NoError(t, err)
		require.NoError(t, cmd.Start())
		t.Cleanup(func() { _ = stdin.Close(); _ = cmd.Process.Kill() })
		r := bufio.NewReader(out)
		line, err := r.ReadString('\n')
		require.NoError(t, err)
		require.Equal(t, "held\n", line)
		line, err = r.ReadString('\n')
		require.NoError(t, err)
		if line == "renewed\n" {
			return cmd
		}
		require.Equal(t, "lost\n", line)
		require.Less(t, try, 5, "the holder lost its lease before it renewed past its first window, five times")
		t.Logf("holder %d lost its lease before it renewed past its first window (its renewals late past the window, as under load, or refused); starting another", try)
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	}
}

// A holder killed with SIGKILL frees the key within one window, though its
// TTL is an hour: on the server's clock, the key has at most a window left
// once the holder is dead; and another provider waiting for it is granted
// it within the window and its own retry, plus what the machine's load
// added to a bare timer armed for the window at the kill (twice: the
// waiter's wake-up, then its try).
func TestAKilledHolderFreesTheKeyWithinOneWindow(t *testing.T) {
	srv, c := setup(t)
	cmd := startHolder(t, srv.Addr)
	require.Equal(t, int64(1), c.Exists(bg, "tenace:lock:{killed}").Val(), "renewed past its first window")

	p := newProvider(t, c)
	late := timerLateness(holderWindow)
	killed := time.Now()
	require.NoError(t, cmd.Process.Signal(syscall.SIGKILL))
	_ = cmd.Wait()
	left, err := c.PTTL(bg, "tenace:lock:{killed}").Result()
	require.NoError(t, err)
	require.NotEqual(t, time.Duration(-1), left, "the key has an expiry")
	require.LessOrEqual(t, left, holderWindow, "once its holder is dead, the key has at most one window left on the server's clock")
	l, err := p.Acquire(bg, "killed", tenace.LockAcquireOptions{Timeout: 5 * time.Second})
	freed := time.Since(killed)
	require.NoError(t, err)
	require.NotNil(t, l)
	require.NoError(t, l.Release(bg))
	allowance, control := timerAllowance(late())
	t.Logf("a holder killed with SIGKILL (TTL 1h, window %v): %v left on its key once it was dead; granted to another %v after the kill (%s: allowed %v)",
		holderWindow, left, freed.Round(time.Millisecond), control, allowance.Round(100*time.Microsecond))
	require.Less(t, freed, holderWindow+300*time.Millisecond+allowance, "within one window (and the waiter's retry, and scheduling latency)")
}

// A renewal that finds the key gone, or taken by another, ends fn's
// context with the lost cause and emits lock.lost.
func TestARenewalThatFindsTheKeyGoneEndsFnsContext(t *testing.T) {
	_, c := setup(t)
	const window = 300 * time.Millisecond
	p := newProvider(t, c, redislock.WithWindow(window))
	for _, how := range []string{"deleted", "re-taken"} {
		t.Run(how, func(t *testing.T) {
			var lost atomic.Int32
			pol := tenace.NewPolicy().WithLock(tenace.LockOptions{Provider: p, Key: how}).OnEvent(func(e tenace.Event) {
				if e.Name == tenace.EventLockLost {
					lost.Add(1)
				}
			})
			var late time.Duration
			err := pol.Execute(bg, func(ctx context.Context) error {
				key := "tenace:lock:{" + how + "}"
				if how == "deleted" {
					require.NoError(t, c.Del(bg, key).Err())
				} else {
					require.NoError(t, c.Set(bg, key, "someone-else", time.Hour).Err())
				}
				at := time.Now()
				<-ctx.Done()
				late = time.Since(at)
				return context.Cause(ctx)
			})
			require.ErrorIs(t, err, tenace.ErrLeaseLost)
			require.NotErrorIs(t, err, tenace.ErrLeaseExpired)
			require.Equal(t, int32(1), lost.Load(), "one lock.lost event")
			t.Logf("key %s: fn's context ended %v after the loss (renewal interval %v)", how, late.Round(time.Millisecond), window/3)
			require.Less(t, late, window, "by the next renewal")
			if how == "re-taken" {
				require.Equal(t, "someone-else", c.Get(bg, "tenace:lock:{re-taken}").Val(), "the Lock's release left the new holder alone")
			}
		})
	}
}

// A server stalled past the window ends fn's context no later than the
// window after the last renewal sent.
func TestAStalledServerEndsFnsContextWithinTheWindow(t *testing.T) {
	srv := redistest.Start(t)
	c := deadlineClient(t, srv.Addr)
	const window = 300 * time.Millisecond
	p := newProvider(t, c, redislock.WithWindow(window))
	var afterStall time.Duration
	err := tenace.NewPolicy().WithLock(tenace.LockOptions{Provider: p, Key: "stalled"}).Execute(bg, func(ctx context.Context) error {
		l, _ := tenace.LeaseFrom(ctx)
		told := l.(interface{ Expiry() time.Time }).Expiry()
		srv.Pause()
		paused := time.Now()
		<-ctx.Done()
		afterStall = time.Since(paused)
		// The context ended no later than the last expiry told to the
		// server (which only moves on while the server answers).
		require.LessOrEqual(t, l.(interface{ Expiry() time.Time }).Expiry().Sub(told), window)
		return context.Cause(ctx)
	})
	require.ErrorIs(t, err, tenace.ErrLeaseLost)
	srv.Resume()
	t.Logf("server stalled: fn's context ended %v after the stall began (window %v)", afterStall.Round(time.Millisecond), window)
	require.Less(t, afterStall, window+150*time.Millisecond, "no later than one window (timer and scheduling latency aside)")
}

// Release stops the renewals.
func TestReleaseStopsRenewal(t *testing.T) {
	srv := redistest.Start(t)
	c := deadlineClient(t, srv.Addr)
	h := &renewalHook{}
	c.AddHook(h.hook())
	p := newProvider(t, c, kept()...)
	l := mustAcquire(t, p, "r", tenace.LockAcquireOptions{})
	eventually(t, "two renewals", func() bool { return h.n.Load() >= 2 })
	require.NoError(t, l.Release(bg))
	n := h.n.Load()
	require.Equal(t, tenace.LockStats{}, p.Stats())
	time.Sleep(5 * keptInterval) // several renewal intervals: none may come
	require.Equal(t, n, h.n.Load(), "no renewal after Release")
	require.Zero(t, c.Exists(bg, "tenace:lock:{r}").Val())
	select {
	case <-l.(tenace.LosableLease).Lost():
		t.Fatal("a released lease is not lost")
	default:
	}
}

// A TTL caps a renewed lease: it is lost with ErrLeaseExpired at the TTL
// (less the loss margin) and the key is free then.
func TestTheTTLCapsARenewedLease(t *testing.T) {
	_, c := setup(t)
	p := newProvider(t, c, kept()...)
	const ttl = keptWindow + 300*time.Millisecond // past the first expiry: renewed up to it
	start := time.Now()
	l := mustAcquire(t, p, "capped", tenace.LockAcquireOptions{TTL: ttl})
	ll := l.(tenace.LosableLease)
	<-ll.Lost()
	at := time.Since(start)
	require.ErrorIs(t, ll.Err(), tenace.ErrLeaseExpired)
	require.GreaterOrEqual(t, at, ttl-redislock.LossMargin(keptWindow)-time.Millisecond, "renewed up to its TTL, lost a margin before it")
	// The server drops the key by its own clock a margin later: a waiter
	// gets it right away.
	l2, err := p.Acquire(bg, "capped", tenace.LockAcquireOptions{Timeout: time.Second})
	require.NoError(t, err)
	require.NotNil(t, l2)
	require.NoError(t, l2.Release(bg))
	require.ErrorIs(t, l.Release(bg), tenace.ErrLeaseLost)
}

// Closing the provider loses its leases and stops their renewals; Release
// still frees the key.
func TestCloseLosesHeldLeases(t *testing.T) {
	_, c := setup(t)
	p := redislock.New(c, redislock.WithWindow(time.Second))
	l := mustAcquire(t, p, "closed", tenace.LockAcquireOptions{})
	require.Equal(t, 1, p.Stats().Held)
	require.NoError(t, p.Close())
	ll := l.(tenace.LosableLease)
	<-ll.Lost()
	require.ErrorIs(t, ll.Err(), tenace.ErrLeaseLost)
	require.ErrorIs(t, l.Release(bg), tenace.ErrLeaseLost)
	require.Zero(t, c.Exists(bg, "tenace:lock:{closed}").Val(), "Release deleted the key")
	_, err := p.Acquire(bg, "closed", tenace.LockAcquireOptions{})
	require.ErrorIs(t, err, tenace.ErrProviderClosed)
	require.ErrorContains(t, err, "(redislock.Provider.Close was called)")
	require.NotContains(t, err.Error(), "redislock: tenace:", "one prefix")
	require.NoError(t, p.Close(), "idempotent")
}

// Close fails the callers waiting in Acquire with ErrProviderClosed.
func TestCloseFailsTheWaiters(t *testing.T) {
	_, c := setup(t)
	holder := newProvider(t, c)
	held := mustAcquire(t, holder, "w", tenace.LockAcquireOptions{})
	p := redislock.New(c, redislock.WithRetryInterval(time.Hour))
	r := acquireAsync(bg, p, "w", tenace.LockAcquireOptions{})
	eventually(t, "a waiter", func() bool { return p.Stats().Waiting >= 1 })
	require.NoError(t, p.Close())
	got := <-r
	require.ErrorIs(t, got.err, tenace.ErrProviderClosed)
	require.Nil(t, got.lease)
	require.NoError(t, held.Release(bg))
}

// Keepalive and the lost signal through a ClusterClient (one-node Redis
// Cluster) and a FailoverClient (a real Sentinel): renewals keep the key
// past several windows, and deleting it ends the lease within a renewal
// interval or so.
func TestKeepaliveAndLossThroughClusterAndFailoverClients(t *testing.T) {
	cluster := redistest.StartCluster(t)
	primary := redistest.Start(t)
	sentinel := redistest.StartSentinel(t, primary)
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{cluster.Addr}, ContextTimeoutEnabled: true})
	fc := redis.NewFailoverClient(&redis.FailoverOptions{MasterName: redistest.MasterName, SentinelAddrs: []string{sentinel.Addr}, ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = cc.Close(); _ = fc.Close() })
	for _, tc := range []struct {
		name   string
		client redis.UniversalClient
	}{{"cluster", cc}, {"failover", fc}} {
		t.Run(tc.name, func(t *testing.T) {
			p := newProvider(t, tc.client, kept()...)
			other := newProvider(t, tc.client)
			l := mustAcquire(t, p, "kept", tenace.LockAcquireOptions{})
			// Two windows: without renewals the key would lapse in one.
			got, err := other.Acquire(bg, "kept", tenace.LockAcquireOptions{Timeout: 2 * keptWindow})
			require.NoError(t, err)
			require.Nil(t, got, "renewed through the client: nobody else gets the key")
			ll := l.(tenace.LosableLease)
			require.NoError(t, ll.Err())
			deleted := time.Now()
			require.NoError(t, tc.client.Del(bg, "tenace:lock:{kept}").Err())
			select {
			case <-ll.Lost():
			case <-time.After(5 * keptWindow):
				t.Fatal("the deleted key was not reported lost")
			}
			t.Logf("%s: lost %v after the key was deleted (renewal interval %v)", tc.name, time.Since(deleted).Round(time.Millisecond), keptInterval)
			require.ErrorIs(t, ll.Err(), tenace.ErrLeaseLost)
			require.ErrorIs(t, l.Release(bg), tenace.ErrLeaseLost)
		})
	}
}

// A grant whose reply was slow — the server stalled while the acquire was
// on the wire — is renewed before the expiry it was given (counted from
// before the send), so it is not reported lost while the server answers
// and holds the key for it. Before, the first renewal was armed one
// interval after the reply: here 2.7s after a reply 1.2s into a 3-s
// window, 900ms after the expiry; now it is armed halfway to the expiry,
// 900ms before it. (The margins, 900ms either way, are for a loaded
// machine: at load 20-30 on 2 cores under -race, 300ms either way, with a
// 1-s window, was once not enough for the renewal to get through.)
func TestASlowGrantIsRenewedBeforeItsExpiry(t *testing.T) {
	srv := redistest.Start(t)
	c := deadlineClient(t, srv.Addr)
	const window, interval, stall = 3 * time.Second, 2700 * time.Millisecond, 1200 * time.Millisecond
	p := newProvider(t, c, redislock.WithWindow(window), redislock.WithRenewInterval(interval))
	warm(t, c, p)
	var once sync.Once
	sent := make(chan struct{})
	c.AddHook(scriptHook(func(name string) {
		if name == "acquire" {
			once.Do(func() { close(sent) })
		}
	}))
	srv.Pause()
	r := acquireAsync(bg, p, "slow", tenace.LockAcquireOptions{})
	<-sent            // the acquire is on its way to the stalled server
	time.Sleep(stall) // the stall itself, not a wait for an event
	srv.Resume()
	got := <-r
	require.NoError(t, got.err)
	require.NotNil(t, got.lease)
	ll := got.lease.(tenace.LosableLease)
	select {
	case <-ll.Lost():
		t.Fatalf("a lease granted after a slow reply was reported lost while the server answered (PTTL of the key now %v): %v",
			c.PTTL(bg, "tenace:lock:{slow}").Val(), ll.Err())
	case <-time.After(2 * window): // two windows of renewals, none missed
	}
	require.NoError(t, got.lease.Release(bg))
}

// stallOnRenewal stalls the server just before the client sends its first
// renewal script once armed (so that renewal is on the wire of a stalled
// server), and then reports when it sends a release script.
type stallOnRenewal struct {
	srv         *redistest.Server
	armed       atomic.Bool
	paused      atomic.Bool
	stalled     chan struct{}
	releaseOnce sync.Once
	releaseSent chan struct{}
}

func (h *stallOnRenewal) hook() scriptHook {
	return func(name string) {
		switch name {
		case "release":
			if h.paused.Load() { // not the warm-up's release
				h.releaseOnce.Do(func() { close(h.releaseSent) })
			}
		case "renew":
			if h.armed.CompareAndSwap(true, false) {
				h.srv.Pause()
				h.paused.Store(true)
				close(h.stalled)
			}
		}
	}
}

// Close returns once the renewal in flight has ended, also while a Release
// of the same lease waits on the stalled server. Before, Release held the
// lease's mutex across its call, the renewal's callback waited for that
// mutex, and Close for the callback: as long as the Release's call lasts.
// (go-redis ends a call at its deadline, not when its context is
// cancelled: the renewal Close cuts short ends at the lease's expiry.)
func TestCloseDoesNotWaitForAReleaseInFlight(t *testing.T) {
	srv := redistest.Start(t)
	// No ReadTimeout: each call ends at its context's deadline alone.
	c := redis.NewClient(&redis.Options{Addr: srv.Addr, ContextTimeoutEnabled: true, DialTimeout: time.Second, ReadTimeout: -1})
	t.Cleanup(func() { _ = c.Close() })
	h := &stallOnRenewal{srv: srv, stalled: make(chan struct{}), releaseSent: make(chan struct{})}
	c.AddHook(h.hook())
	const window = time.Second
	p := redislock.New(c, redislock.WithWindow(window), redislock.WithRenewInterval(10*time.Millisecond))
	warm(t, c, p)
	l := mustAcquire(t, p, "closing", tenace.LockAcquireOptions{})
	h.armed.Store(true)
	<-h.stalled // the next renewal is on its way to a stalled server
	released := make(chan error, 1)
	rctx, cancel := context.WithTimeout(bg, time.Minute) // longer than the test
	defer cancel()
	go func() { released <- l.Release(rctx) }()
	<-h.releaseSent
	closed := make(chan time.Duration, 1)
	go func() {
		start := time.Now()
		_ = p.Close()
		closed <- time.Since(start)
	}()
	select {
	case took := <-closed:
		t.Logf("Close returned after %v (the renewal's deadline: at most a window, %v)", took.Round(time.Millisecond), window)
	case <-time.After(3 * window):
		srv.Resume()
		t.Fatalf("Close still waits %v after it began, with the Release's call on the stalled server", 3*window)
	}
	srv.Resume()
	// The release deletes the key once the server answers, unless the key
	// expired first: the stall lasted about a window, with no renewal.
	if err := <-released; err != nil {
		require.ErrorIs(t, err, tenace.ErrLeaseLost, "the release, once the server answers")
	}
	_, err := c.Get(bg, "tenace:lock:{closing}").Result()
	require.ErrorIs(t, err, redis.Nil, "the key is gone")
}

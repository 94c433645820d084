package etcdlock_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/connectivity"

	"tenace.dev/internal/etcdtest"
	"tenace.dev/tenace"
	"tenace.dev/tenace/etcdlock"
)

// referee is the counter every holder of a test's key shares, in whatever
// provider or client it holds it: it checks that a new holder comes only
// once the previous one has left or has been told of its loss (Lost closed:
// the signal comes first), and that tokens never go back.
type referee struct {
	mu     sync.Mutex
	cur    tenace.LosableLease // the holder inside, if any
	last   uint64
	grants atomic.Int64
	errs   []string
}

func (r *referee) enter(l tenace.LockLease) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cur != nil && !isClosed(r.cur.Lost()) {
		r.errs = append(r.errs, "two holders at once: the previous one was neither gone nor told of its loss")
	}
	if tok := l.(tenace.FencedLease).Token(); tok <= r.last {
		r.errs = append(r.errs, fmt.Sprintf("token %d after %d: it went back", tok, r.last))
	} else {
		r.last = tok
	}
	r.cur = l.(tenace.LosableLease)
	r.grants.Add(1)
}

func (r *referee) leave(l tenace.LockLease) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cur == l.(tenace.LosableLease) {
		r.cur = nil
	}
}

func (r *referee) check(t *testing.T) {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	require.Empty(t, r.errs)
}

// hold is a holder's work: it enters, works for d or until its lease is
// lost, leaves, and releases.
func (r *referee) hold(l tenace.LockLease, d time.Duration) (lost bool) {
	r.enter(l)
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-l.(tenace.LosableLease).Lost():
		lost = true
	case <-t.C:
	}
	r.leave(l)
	err := l.Release(bg)
	return lost || errors.Is(err, tenace.ErrLeaseLost)
}

// churn runs workers that take key in turn through providers of their own
// (a client each) and hold it a little, until stop is closed; it returns
// once they have all stopped, with the count of failed acquires and of
// leases lost.
func churn(t *testing.T, endpoints []string, key string, workers int, r *referee, stop <-chan struct{}) (failed, lost int64) {
	var wg sync.WaitGroup
	var nf, nl atomic.Int64
	for range workers {
		p := newProvider(t, newClient(t, endpoints...))
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				ctx, cancel := context.WithTimeout(bg, 10*time.Second)
				l, err := p.Acquire(ctx, key, tenace.LockAcquireOptions{Timeout: 3 * time.Second})
				cancel()
				switch {
				case err != nil:
					nf.Add(1)
					time.Sleep(20 * time.Millisecond) // back off while the cluster recovers
				case l != nil:
					if r.hold(l, 5*time.Millisecond) {
						nl.Add(1)
					}
				}
			}
		})
	}
	wg.Wait()
	return nf.Load(), nl.Load()
}

// assertFreeWithin checks that key can be taken within d (an orphan would
// keep it), and that the token is above every earlier one.
func assertFreeWithin(t *testing.T, endpoints []string, key string, d time.Duration, r *referee) {
	t.Helper()
	p := newProvider(t, newClient(t, endpoints...))
	ctx, cancel := context.WithTimeout(bg, d+5*time.Second)
	defer cancel()
	start := time.Now()
	l, err := p.Acquire(ctx, key, tenace.LockAcquireOptions{Timeout: d})
	require.NoError(t, err)
	require.NotNil(t, l, "the key was still held %v after every holder had gone", d)
	t.Logf("key free %v after the last holder", time.Since(start).Round(time.Millisecond))
	r.hold(l, 0)
}

// TestKillTheLeader: holders churn through three providers on a
// three-member cluster while its leader is killed: exclusion holds, tokens
// never go back, the lock keeps changing hands once a new leader is
// elected, and the key is free at the end.
func TestKillTheLeader(t *testing.T) {
	c := etcdtest.StartN(t, 3)
	key := keyOf(t, "k")
	var r referee
	stop := make(chan struct{})
	done := make(chan [2]int64, 1)
	go func() { f, l := churn(t, c.Endpoints(), key, 3, &r, stop); done <- [2]int64{f, l} }()
	eventually(t, 20*time.Second, "grants before the kill", func() bool { return r.grants.Load() >= 20 })
	c.Leader().Kill()
	before := r.grants.Load()
	eventually(t, 30*time.Second, "grants after the kill", func() bool { return r.grants.Load() >= before+20 })
	close(stop)
	n := <-done
	t.Logf("%d grants, %d failed acquires, %d leases lost", r.grants.Load(), n[0], n[1])
	r.check(t)
	assertFreeWithin(t, c.Endpoints(), key, testWindow, &r)
	r.check(t)
}

// TestPausedMemberPastTheWindow: the holder's client talks to one member
// only, a follower; it is stopped with SIGSTOP for longer than the window.
// The holder's keepalives go unanswered, so its lease is reported lost a
// margin before its expiry; the leader expires the lease, and the waiter
// (on the other members) is granted — after the holder was told. Once the
// member runs again, the old lease's Release touches nothing.
//
// The member is a follower: a leader paused past a lease's TTL revokes, on
// resuming, leases that the new leader kept alive (etcd issue 15247, fixed
// by etcd PR 16822; Debian's 3.4.23 has the bug), which frees a live
// holder's key without its keepalives having failed — see the package doc.
func TestPausedMemberPastTheWindow(t *testing.T) {
	c := etcdtest.StartN(t, 3)
	leader := c.Leader()
	var paused *etcdtest.Member
	var others []string
	for _, m := range c.Members {
		if m != leader && paused == nil {
			paused = m
		} else {
			others = append(others, m.ClientURL)
		}
	}
	leader = paused // the member the holder talks to, and the one paused
	key := keyOf(t, "k")
	holderP := newProvider(t, newClient(t, leader.ClientURL))
	waiterP := newProvider(t, newClient(t, others...))
	var r referee
	held := mustAcquire(t, holderP, key, tenace.LockAcquireOptions{})
	r.enter(held)
	ch := acquireAsync(bg, waiterP, key, tenace.LockAcquireOptions{})
	eventually(t, 10*time.Second, "waiter queued", func() bool { return waiterP.Stats().Waiting == 1 })

	leader.Pause()
	pausedAt := time.Now()
	t.Cleanup(leader.Resume)
	res := waitFor(t, ch, 5*testWindow, "the waiter once the paused leader's lease expired")
	require.NoError(t, res.err)
	require.NotNil(t, res.lease)
	lostAt := time.Now()
	select {
	case <-held.(tenace.LosableLease).Lost():
	default:
		t.Fatal("the waiter was granted while the holder had not been told of its loss")
	}
	r.enter(res.lease) // checks that the holder's Lost is closed, and the token
	t.Logf("waiter granted %v after the pause (window %v)", res.at.Sub(pausedAt).Round(time.Millisecond), testWindow)
	_ = lostAt
	require.ErrorIs(t, held.(tenace.LosableLease).Err(), tenace.ErrLeaseLost)

	leader.Resume()
	err := held.Release(bg)
	require.ErrorIs(t, err, tenace.ErrLeaseLost)
	l, err := holderP.Acquire(bg, key, tenace.LockAcquireOptions{Timeout: tenace.NoWait})
	require.NoError(t, err)
	require.Nil(t, l, "the old holder's Release must not free the new holder's key")
	r.leave(res.lease)
	require.NoError(t, res.lease.Release(bg))
	r.check(t)
	assertFreeWithin(t, c.Endpoints(), key, testWindow, &r)
	r.check(t)
}

// TestRestartTheWholeCluster: a holder and a waiter while every member is
// stopped and started again from its data directory. Whatever the holder
// and the waiter go through (a loss, an error), exclusion holds, the key is
// free within a window once the cluster is back and the holders are gone,
// and tokens after the restart are above every token before it: revisions
// survive a restart.
func TestRestartTheWholeCluster(t *testing.T) {
	c := etcdtest.StartN(t, 3)
	key := keyOf(t, "k")
	var r referee
	p1 := newProvider(t, newClient(t, c.Endpoints()...))
	p2 := newProvider(t, newClient(t, c.Endpoints()...))
	held := mustAcquire(t, p1, key, tenace.LockAcquireOptions{})
	r.enter(held)
	ctx, cancel := context.WithTimeout(bg, 30*time.Second)
	defer cancel()
	ch := acquireAsync(ctx, p2, key, tenace.LockAcquireOptions{})
	eventually(t, 10*time.Second, "waiter queued", func() bool { return p2.Stats().Waiting == 1 })

	start := time.Now()
	c.Restart()
	t.Logf("cluster restarted in %v", time.Since(start).Round(time.Millisecond))
	// The holder kept its lease if the cluster came back before its loss
	// time (etcd restores leases with a full TTL), or was told of its loss.
	// Either way it now lets go: Release, or nothing once lost.
	if isClosed(held.(tenace.LosableLease).Lost()) {
		t.Logf("holder: %v", held.(tenace.LosableLease).Err())
	} else {
		r.leave(held)
		t.Logf("holder kept its lease; Release: %v", held.Release(bg))
	}
	res := waitFor(t, ch, 30*time.Second, "the waiter after the restart")
	if res.lease != nil {
		r.enter(res.lease) // the holder must have left, or been told first
		t.Log("waiter granted after the restart")
		r.leave(res.lease)
		_ = res.lease.Release(bg)
	} else {
		t.Logf("waiter: %v", res.err)
		require.Error(t, res.err, "(nil, nil) without a Timeout")
	}
	_ = held.Release(bg)
	r.check(t)
	assertFreeWithin(t, c.Endpoints(), key, 2*testWindow, &r)
	r.check(t)
}

// TestClusterDownPastTheWindow: every member is stopped for longer than
// the window, then started again from its data directory. The holder is
// told of its loss while the cluster is down (no keepalive gets through);
// the waiter's lease is lost too, and its Acquire fails rather than wait
// on a place it no longer has. Once the cluster is back the key is free
// within a window (etcd restores a lease with a full TTL, unless the
// holder's revoke got through), and tokens go on above the old ones.
func TestClusterDownPastTheWindow(t *testing.T) {
	c := etcdtest.StartN(t, 3)
	key := keyOf(t, "k")
	var r referee
	p1 := newProvider(t, newClient(t, c.Endpoints()...))
	p2 := newProvider(t, newClient(t, c.Endpoints()...))
	held := mustAcquire(t, p1, key, tenace.LockAcquireOptions{})
	r.enter(held)
	ch := acquireAsync(bg, p2, key, tenace.LockAcquireOptions{})
	eventually(t, 10*time.Second, "waiter queued", func() bool { return p2.Stats().Waiting == 1 })

	for _, m := range c.Members {
		m.Terminate()
	}
	down := time.Now()
	select {
	case <-held.(tenace.LosableLease).Lost():
		t.Logf("holder told %v after the cluster went down: %v", time.Since(down).Round(time.Millisecond), held.(tenace.LosableLease).Err())
	case <-time.After(2 * testWindow):
		t.Fatal("the holder was not told of its loss while the cluster was down")
	}
	res := waitFor(t, ch, 2*testWindow, "the waiter while the cluster is down")
	require.Nil(t, res.lease)
	require.ErrorIs(t, res.err, tenace.ErrLeaseLost, "the waiter's place went with its lease")
	c.Members[0].Start() // every member, from its data directory
	require.ErrorIs(t, held.Release(bg), tenace.ErrLeaseLost)
	r.check(t)
	assertFreeWithin(t, c.Endpoints(), key, 2*testWindow, &r)
	r.check(t)
}

// TestCompactionWhileWaiting: the revision history is compacted while
// waiters wait — past the revision each waiter's watch is about to start
// from (a test hook compacts between the read of its predecessor and its
// watch), and again while they watch. The waiters look again instead of
// failing, and are granted in their order.
func TestCompactionWhileWaiting(t *testing.T) { forModes(t, testCompactionWhileWaiting) }

func testCompactionWhileWaiting(t *testing.T, m mode) {
	c := cluster(t)
	admin := newClient(t, c.Endpoints()...)
	p := newProvider(t, newClient(t, c.Endpoints()...))
	key := keyOf(t, "k")
	const n = 3
	var compactions atomic.Int32
	compact := func() {
		resp, err := admin.Put(bg, keyOf(t, "churn"), "x") // a revision past the watch's start
		if err == nil {
			if _, err = admin.Compact(bg, resp.Header.Revision); err == nil {
				compactions.Add(1)
			}
		}
	}
	// The first n watches start from a revision compacted away just
	// before; each such waiter must look again (one more hook call).
	var calls atomic.Int32
	p.SetBeforeWatch(func(rev int64) {
		if calls.Add(1) > n {
			return
		}
		_, _ = admin.Put(bg, keyOf(t, "churn"), "x")
		resp, err := admin.Put(bg, keyOf(t, "churn"), "y")
		if err == nil && resp.Header.Revision > rev {
			// Two waiters' hooks may run at once: a compaction to a later
			// revision by the other one refuses this one with ErrCompacted,
			// and the history is compacted past rev all the same.
			if _, err = admin.Compact(bg, resp.Header.Revision); err == nil || errors.Is(err, rpctypes.ErrCompacted) {
				compactions.Add(1)
			}
		}
	})
	var r referee
	held := mustAcquire(t, p, key, m.with(tenace.LockAcquireOptions{}))
	r.enter(held)
	order := make(chan int, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			l, err := p.Acquire(bg, key, m.with(tenace.LockAcquireOptions{}))
			if err != nil || l == nil {
				t.Errorf("waiter %d: (%v, %v)", i, l, err)
				order <- -1
				return
			}
			order <- i
			r.hold(l, time.Millisecond)
		})
		eventually(t, 10*time.Second, fmt.Sprintf("waiter %d queued", i), func() bool { return p.Stats().Waiting == i+1 })
	}
	eventually(t, 10*time.Second, "each compacted waiter looked again", func() bool { return calls.Load() >= 2*n })
	require.GreaterOrEqual(t, compactions.Load(), int32(n), "the hook compacted before the first watches")
	compact() // and once more while they all watch
	r.leave(held)
	require.NoError(t, held.Release(bg))
	wg.Wait()
	close(order)
	want := 0
	for got := range order {
		require.Equal(t, want, got, "granted out of order")
		want++
	}
	r.check(t)
}

// TestStalledMemberTimeoutBound: a member stopped with SIGSTOP answers
// nothing: an Acquire with a Timeout returns an error wrapping
// tenace.ErrNoReply by its Timeout + 50ms, not (nil, nil); a waiter already
// watching its predecessor (etcd answered it: the key is held, and it has
// no request unanswered) returns (nil, nil) by its Timeout + 50ms.
func TestStalledMemberTimeoutBound(t *testing.T) { forModes(t, testStalledMemberTimeoutBound) }

func testStalledMemberTimeoutBound(t *testing.T, m mode) {
	c := cluster(t)
	p := newProvider(t, newClient(t, c.Endpoints()...))
	watching := make(chan struct{}, 1)
	p.SetBeforeWatch(func(int64) { watching <- struct{}{} })
	key := keyOf(t, "k")
	held := mustAcquire(t, p, key, m.with(tenace.LockAcquireOptions{}))
	const timeout = 800 * time.Millisecond
	start, waiterLate := time.Now(), timerLateness(timeout)
	ch := acquireAsync(bg, p, key, m.with(tenace.LockAcquireOptions{Timeout: timeout}))
	// The waiter has read its predecessor (etcd answered: the key is held)
	// and watches it: no request of it is left unanswered.
	<-watching
	c.Members[0].Pause()
	t.Cleanup(c.Members[0].Resume)
	stalled, late := time.Now(), timerLateness(timeout)
	l, err := p.Acquire(bg, keyOf(t, "other"), m.with(tenace.LockAcquireOptions{Timeout: timeout}))
	d := time.Since(stalled)
	require.Nil(t, l)
	require.ErrorIs(t, err, tenace.ErrNoReply)
	require.False(t, errors.Is(err, context.DeadlineExceeded), "DeadlineExceeded is the caller's ctx's, which did not end: %v", err)
	t.Logf("stalled: %v after %v", err, d.Round(time.Millisecond))
	require.Less(t, d, timeout+timeoutBound+late(), "the Timeout is a bound")

	res := waitFor(t, ch, 2*timeout, "the queued waiter")
	require.NoError(t, res.err)
	require.Nil(t, res.lease)
	require.Less(t, res.at.Sub(start), timeout+timeoutBound+waiterLate(), "the Timeout is a bound")

	c.Members[0].Resume()
	require.NoError(t, held.Release(bg))
	l = mustAcquire(t, p, key, m.with(tenace.LockAcquireOptions{Timeout: 10 * time.Second}))
	require.NoError(t, l.Release(bg))
}

// TestUnreachableClusterIsAnErrorAtOnce: with every member down, an Acquire
// without a Timeout fails at once (it does not wait for ctx), and one with
// a Timeout fails too, within it, however short: never (nil, nil).
func TestUnreachableClusterIsAnErrorAtOnce(t *testing.T) {
	forModes(t, testUnreachableClusterIsAnErrorAtOnce)
}

func testUnreachableClusterIsAnErrorAtOnce(t *testing.T, m mode) {
	c := cluster(t)
	cl := newClient(t, c.Endpoints()...)
	p := newProvider(t, cl)
	key := keyOf(t, "k")
	l := mustAcquire(t, p, key, m.with(tenace.LockAcquireOptions{}))
	require.NoError(t, l.Release(bg))
	c.Stop()
	// A request sent before the client has seen its connection close
	// waits (gRPC's WaitForReady) for the Timeout or ctx: see the package
	// doc. Once it has, Acquire fails at once.
	eventually(t, 10*time.Second, "the client saw the connection close", func() bool {
		return cl.ActiveConnection().GetState() != connectivity.Ready
	})
	for _, opts := range []tenace.LockAcquireOptions{{}, {Timeout: 2 * time.Second}, {Timeout: tenace.NoWait}, {Timeout: 100 * time.Millisecond}, {Timeout: 240 * time.Millisecond}} {
		opts = m.with(opts)
		ctx, cancel := context.WithTimeout(bg, 20*time.Second)
		start, late := time.Now(), timerLateness(0)
		l, err := p.Acquire(ctx, key, opts)
		cancel()
		d := time.Since(start)
		require.Nil(t, l)
		require.Error(t, err, "%+v: (nil, nil) from an unreachable cluster", opts)
		require.False(t, errors.Is(err, context.DeadlineExceeded), "%+v: waited for ctx: %v", opts, err)
		lateness := late()
		t.Logf("%+v: %v after %v (a bare timer ran %v late)", opts, err, d.Round(time.Millisecond), lateness.Round(time.Millisecond))
		require.Less(t, d, 3*time.Second)
		require.ErrorIs(t, err, syscall.ECONNREFUSED, "%+v: the cause", opts)
		require.Less(t, d, 250*time.Millisecond+lateness, "%+v: at once, not after a redial wait", opts)
		if opts.Timeout > 0 {
			require.Less(t, d, opts.Timeout+timeoutBound+lateness, "%+v: the Timeout is a bound", opts)
		}
	}
}

// TestIsOwnerGuardsTheResource: a write guarded by IsOwner goes through
// while the lease holds the lock, and not once it was lost and the key
// granted to another.
func TestIsOwnerGuardsTheResource(t *testing.T) {
	c := cluster(t)
	admin := newClient(t, c.Endpoints()...)
	p := newProvider(t, newClient(t, c.Endpoints()...))
	key := keyOf(t, "k")
	write := func(l tenace.LockLease, v string) bool {
		t.Helper()
		cmp, ok := etcdlock.IsOwner(l)
		require.True(t, ok)
		resp, err := admin.Txn(bg).If(cmp).Then(clientv3.OpPut(keyOf(t, "resource"), v)).Commit()
		require.NoError(t, err)
		return resp.Succeeded
	}
	old := mustAcquire(t, p, key, tenace.LockAcquireOptions{})
	require.True(t, write(old, "old"))
	_, err := admin.Revoke(bg, etcdlock.LeaseID(old)) // lost, from outside
	require.NoError(t, err)
	next := mustAcquire(t, p, key, tenace.LockAcquireOptions{Timeout: 10 * time.Second})
	require.False(t, write(old, "late"), "a lost lease's guarded write went through")
	require.True(t, write(next, "next"))
	require.NoError(t, next.Release(bg))
	_, ok := etcdlock.IsOwner(nil)
	require.False(t, ok)
}

func TestAcquireNilContextPanics(t *testing.T) {
	p := etcdlock.New(&clientv3.Client{})
	defer p.Close()
	defer func() {
		v := recover()
		require.True(t, strings.HasPrefix(fmt.Sprint(v), "tenace: "), "panic %v", v)
	}()
	//lint:ignore SA1012 the nil ctx is the point
	_, _ = p.Acquire(nil, "k", tenace.LockAcquireOptions{}) //nolint:staticcheck
}

// TestKeysDoNotNest: a key that is another's with a "/" and more has a
// queue of its own, not one inside the other's: holding "a" does not hold
// "a/b" nor "a%2Fb", and holding "a/b" does not hold "a".
func TestKeysDoNotNest(t *testing.T) {
	c := cluster(t)
	p := newProvider(t, newClient(t, c.Endpoints()...))
	base := keyOf(t, "a")
	held := mustAcquire(t, p, base, tenace.LockAcquireOptions{})
	for _, k := range []string{base + "/b", base + "%2Fb", base + "/"} {
		l := mustAcquire(t, p, k, tenace.LockAcquireOptions{Timeout: tenace.NoWait})
		require.NoError(t, l.Release(bg))
	}
	require.NoError(t, held.Release(bg))
	// And the other way: "a/b" held, "a" and "a%2Fb" are free.
	other := mustAcquire(t, p, base+"/b", tenace.LockAcquireOptions{})
	for _, k := range []string{base, base + "%2Fb"} {
		l, err := p.Acquire(bg, k, tenace.LockAcquireOptions{Timeout: tenace.NoWait})
		require.NoError(t, err)
		require.NotNil(t, l, "%q is held while only %q is", k, base+"/b")
		require.NoError(t, l.Release(bg))
	}
	require.NoError(t, other.Release(bg))
}

// TestStalledMemberShortTimeoutIsNoReply: with the member stopped by
// SIGSTOP, an Acquire with a Timeout shorter than noreply.Grace never had
// etcd say that the key is held: it returns an error wrapping
// tenace.ErrNoReply within its Timeout + 50ms, never (nil, nil).
func TestStalledMemberShortTimeoutIsNoReply(t *testing.T) {
	forModes(t, testStalledMemberShortTimeoutIsNoReply)
}

func testStalledMemberShortTimeoutIsNoReply(t *testing.T, m mode) {
	c := cluster(t)
	p := newProvider(t, newClient(t, c.Endpoints()...))
	l := mustAcquire(t, p, keyOf(t, "warm"), m.with(tenace.LockAcquireOptions{}))
	require.NoError(t, l.Release(bg))
	c.Members[0].Pause()
	t.Cleanup(c.Members[0].Resume)
	for _, timeout := range []time.Duration{100 * time.Millisecond, 240 * time.Millisecond} {
		start, late := time.Now(), timerLateness(timeout)
		l, err := p.Acquire(bg, keyOf(t, "free"), m.with(tenace.LockAcquireOptions{Timeout: timeout}))
		d := time.Since(start)
		require.Nil(t, l)
		require.ErrorIs(t, err, tenace.ErrNoReply, "Timeout %v: (nil, nil) from a stalled member", timeout)
		lateness := late()
		t.Logf("%v: %v after %v (a bare timer of the Timeout ran %v late)", timeout, err, d.Round(time.Millisecond), lateness.Round(time.Millisecond))
		require.Less(t, d, timeout+timeoutBound+lateness, "the Timeout is a bound")
	}
}

// TestAHeldKeyIsStillHeldUnderLoad: a key held by another, asked for
// with short Timeouts on a loaded machine (two CPU burners beside the
// test), is (nil, nil) whenever etcd answered anything within the Timeout
// and 20ms: the queueing, or the peek beside the lease grant. An error is
// allowed only as the rule says: ErrNoReply when etcd answered nothing (a
// member starved of CPU past the Timeout), never another error (a bare
// deadline, as a request cut short before the Timeout's timer ran once
// gave), never a lease.
func TestAHeldKeyIsStillHeldUnderLoad(t *testing.T) { forModes(t, testAHeldKeyIsStillHeldUnderLoad) }

func testAHeldKeyIsStillHeldUnderLoad(t *testing.T, m mode) {
	c := cluster(t)
	// The held lease must outlive the test's load: the verdicts are the
	// subject, not its keepalives.
	p := newProvider(t, newClient(t, c.Endpoints()...), etcdlock.WithWindow(busyWindow))
	key := keyOf(t, "k")
	held := mustAcquire(t, p, key, m.with(tenace.LockAcquireOptions{}))
	defer func() { require.NoError(t, held.Release(bg)) }()
	var stop atomic.Bool
	var burners sync.WaitGroup
	for range 2 {
		burners.Go(func() {
			x := 0
			for !stop.Load() {
				x++ // burn CPU
			}
			_ = x
		})
	}
	defer burners.Wait()
	defer stop.Store(true)
	const n = 40
	noReply := 0
	for i := range n {
		timeout := []time.Duration{50 * time.Millisecond, 100 * time.Millisecond}[i%2]
		l, err := p.Acquire(bg, key, m.with(tenace.LockAcquireOptions{Timeout: timeout}))
		require.Nil(t, l)
		if err != nil {
			require.ErrorIs(t, err, tenace.ErrNoReply)
			require.ErrorContains(t, err, "etcd did not say whether", "ErrNoReply only when etcd answered nothing")
			noReply++
		}
	}
	t.Logf("%d acquires of a held key beside two CPU burners: %d ErrNoReply (etcd answered nothing in time), the rest (nil, nil)", n, noReply)
	require.Less(t, noReply, n, "no acquire heard that the key is held")
}

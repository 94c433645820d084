package redislock_test

// The shared Pub/Sub connection: its goroutines at Close, and its pace
// after it broke.

import (
	"context"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"tenace.dev/internal/redistest"
	"tenace.dev/tenace"
	"tenace.dev/tenace/redislock"
)

// subscriberGoroutines returns the stacks of the goroutines alive now
// that a provider's subscriber started: each Pub/Sub connection's sender
// and receiver. No test runs in parallel, so they are the test's own.
func subscriberGoroutines() []string {
	buf := make([]byte, 1<<16)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	var found []string
	for _, g := range strings.Split(string(buf), "\n\n") {
		if strings.Contains(g, "created by tenace.dev/tenace/redislock.(*subscriber)") {
			found = append(found, g)
		}
	}
	return found
}

// noSubscriberGoroutines fails unless the subscriber's goroutines are
// gone. A goroutine that has done its last work (the wait group's Done,
// deferred) can still be listed, runnable, for a moment before it exits:
// those are given that moment; one that is blocked — on a channel, a
// timer, the network, a mutex — is waiting to do more, and fails the test
// at once.
func noSubscriberGoroutines(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(time.Second)
	for {
		found := subscriberGoroutines()
		if len(found) == 0 {
			return
		}
		for _, g := range found {
			if !strings.Contains(g, " [runnable]:") && !strings.Contains(g, " [running]:") {
				t.Fatalf("a goroutine of the Pub/Sub connection outlived Close, blocked:\n%s", g)
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("goroutines of the Pub/Sub connection still run 1s after Close:\n%s", strings.Join(found, "\n\n"))
		}
		runtime.Gosched()
	}
}

// Close leaves none of the Pub/Sub connection's goroutines behind, whatever
// that connection was doing: serving a waiter, being closed after its last
// waiter left, or pausing between reconnects to a server it cannot reach.
// The check is made the moment Close returns (goleak, at the end of the
// run, waits for stragglers): only a goroutine past its last work may
// still be listed.
func TestCloseLeavesNoPubSubGoroutine(t *testing.T) {
	srv := redistest.Start(t)
	c := deadlineClient(t, srv.Addr)
	holder := newProvider(t, c)
	held := mustAcquire(t, holder, "k", tenace.LockAcquireOptions{TTL: time.Hour})
	closed := func(t *testing.T, p *redislock.Provider) time.Duration {
		t.Helper()
		start := time.Now()
		require.NoError(t, p.Close())
		took := time.Since(start)
		noSubscriberGoroutines(t)
		t.Logf("Close returned after %v", took.Round(time.Microsecond))
		return took
	}

	t.Run("a waiter waits", func(t *testing.T) {
		_, p := trackedProvider(t, srv.Addr, time.Second)
		r := acquireAsync(bg, p, "k", tenace.LockAcquireOptions{})
		waitSubscribed(t, c, "k", 1)
		require.NotEmpty(t, subscriberGoroutines())
		closed(t, p)
		require.ErrorIs(t, (<-r).err, tenace.ErrProviderClosed)
	})

	t.Run("the last waiter just left", func(t *testing.T) {
		_, p := trackedProvider(t, srv.Addr, time.Second)
		ctx, cancel := context.WithCancel(bg)
		r := acquireAsync(ctx, p, "k", tenace.LockAcquireOptions{})
		waitSubscribed(t, c, "k", 1)
		cancel()
		require.ErrorIs(t, (<-r).err, context.Canceled) // its connection's close is queued, maybe not yet sent
		closed(t, p)
	})

	t.Run("the connection pauses between reconnects", func(t *testing.T) {
		tracker, p := trackedProvider(t, srv.Addr, time.Second)
		paused := make(chan time.Duration, 64) // more than the test waits for: the loop never blocks on it
		redislock.OnPubSubBackoff(p, func(d time.Duration) { paused <- d })
		r := acquireAsync(bg, p, "k", tenace.LockAcquireOptions{})
		waitSubscribed(t, c, "k", 1)
		tracker.refuse(true)
		defer tracker.refuse(false)
		require.NoError(t, c.ClientKillByFilter(bg, "TYPE", "pubsub").Err())
		// The reconnects fail; the loop is about to pause for d. A pause of
		// 400ms or more (the fourth: 50, 100, 200, 400ms; at most the
		// sixth), so that Close returning before it would have ended is far
		// from chance, and from a loaded machine's ~100ms scheduling delays.
		var d time.Duration
		for i := 0; i < 6 && d < 400*time.Millisecond; i++ {
			d = <-paused
		}
		t.Logf("the receive loop pauses %v", d)
		require.Less(t, closed(t, p), d, "Close waited for the receive loop's pause; its godoc says at once, unless go-redis is re-opening the connection")
		require.ErrorIs(t, (<-r).err, tenace.ErrProviderClosed)
	})

	require.NoError(t, held.Release(bg))
}

// A waiter hears a release that comes right after the shared Pub/Sub
// connection broke and go-redis re-opened it: the receive loop reads the
// message at once. go-redis re-opens the connection, and resubscribes,
// inside the read that found it broken; before, the loop then paused 50ms
// anyway, with the message waiting in the socket, and the hand-off came
// that much late.
func TestAReleaseRightAfterAPubSubReconnectIsHeardAtOnce(t *testing.T) {
	srv := redistest.Start(t)
	c := deadlineClient(t, srv.Addr)
	holder := newProvider(t, c)
	held := mustAcquire(t, holder, "k", tenace.LockAcquireOptions{TTL: time.Hour})
	_, p := trackedProvider(t, srv.Addr, time.Second) // fallback retries an hour apart
	paused := make(chan time.Duration, 64)            // more than a test makes: the loop never blocks on it
	redislock.OnPubSubBackoff(p, func(d time.Duration) { paused <- d })

	r := acquireAsync(bg, p, "k", tenace.LockAcquireOptions{})
	waitSubscribed(t, c, "k", 1)
	before := subscriberAddr(t, c)
	require.NoError(t, c.ClientKillByFilter(bg, "TYPE", "pubsub").Err())
	waitResubscribed(t, c, before)

	start := time.Now()
	require.NoError(t, held.Release(bg))
	got := <-r
	handoff := time.Since(start)
	require.NoError(t, got.err)
	require.NotNil(t, got.lease)
	t.Logf("hand-off after a Pub/Sub reconnect: %v from Release to the waiter's lease", handoff.Round(time.Microsecond))
	// The pause, had there been one, was announced before the read that
	// brought the release message: it is in the channel by now.
	select {
	case d := <-paused:
		t.Fatalf("the receive loop paused %v after a reconnect that had succeeded, and the waiter heard the release that much late", d)
	default:
	}
	require.NoError(t, got.lease.Release(bg))
}

// On a server the Pub/Sub connection cannot reach, the receive loop does
// not spin: from the second failed read in a row it pauses 50ms, doubling
// to 1s, so that reconnects stay a few a second; a read that succeeds
// starts it over.
func TestPubSubReconnectsBackOffOnlyAfterAFailedOne(t *testing.T) {
	srv := redistest.Start(t)
	c := deadlineClient(t, srv.Addr)
	holder := newProvider(t, c)
	held := mustAcquire(t, holder, "k", tenace.LockAcquireOptions{TTL: time.Hour})
	tracker, p := trackedProvider(t, srv.Addr, time.Second)
	paused := make(chan time.Duration, 64) // more than a test makes: the loop never blocks on it
	redislock.OnPubSubBackoff(p, func(d time.Duration) { paused <- d })
	pauses := func(n int) []time.Duration {
		var got []time.Duration
		for range n {
			got = append(got, <-paused)
		}
		return got
	}

	r := acquireAsync(bg, p, "k", tenace.LockAcquireOptions{})
	waitSubscribed(t, c, "k", 1)
	before := subscriberAddr(t, c)
	tracker.refuse(true) // the server is down, as far as the Pub/Sub connection can tell
	require.NoError(t, c.ClientKillByFilter(bg, "TYPE", "pubsub").Err())
	ms := time.Millisecond
	require.Equal(t, []time.Duration{50 * ms, 100 * ms, 200 * ms, 400 * ms}, pauses(4),
		"the read that found the connection broken is followed by one at once; each that fails after it, by a pause twice the last")
	tracker.refuse(false) // the read after the 400ms pause re-opens the connection
	waitResubscribed(t, c, before)

	// A success starts the pauses over: a second break with the server
	// down pauses 50ms first, not 800ms.
	before = subscriberAddr(t, c)
	tracker.refuse(true)
	require.NoError(t, c.ClientKillByFilter(bg, "TYPE", "pubsub").Err())
	require.Equal(t, []time.Duration{50 * ms}, pauses(1))
	tracker.refuse(false)
	waitResubscribed(t, c, before)

	require.NoError(t, held.Release(bg))
	got := <-r
	require.NoError(t, got.err)
	require.NotNil(t, got.lease)
	require.NoError(t, got.lease.Release(bg))
}

// A release published while the shared Pub/Sub connection is down reaches
// no one; the waiters try again once the connection is back, rather than
// at their fallback retry (an hour here): the first read that succeeds
// after failed ones wakes every waiter. Before, only the failures woke
// them, all before the release, and the waiter here waited for its
// fallback retry.
func TestAReleaseWhileThePubSubConnectionIsDownIsNotMissed(t *testing.T) {
	srv := redistest.Start(t)
	c := deadlineClient(t, srv.Addr)
	holder := newProvider(t, c)
	held := mustAcquire(t, holder, "k", tenace.LockAcquireOptions{TTL: time.Hour})
	tracker, p := trackedProvider(t, srv.Addr, time.Second) // fallback retries an hour apart
	paused := make(chan time.Duration, 64)                  // more than a test makes: the loop never blocks on it
	gate := make(chan struct{})                             // holds the loop in its first pause until the release is out
	var pauses atomic.Int64
	redislock.OnPubSubBackoff(p, func(d time.Duration) {
		paused <- d
		if pauses.Add(1) == 1 {
			<-gate
		}
	})
	opened := false
	defer func() {
		if !opened {
			close(gate)
		}
	}()

	r := acquireAsync(bg, p, "k", tenace.LockAcquireOptions{})
	waitSubscribed(t, c, "k", 1)
	tracker.refuse(true)
	require.NoError(t, c.ClientKillByFilter(bg, "TYPE", "pubsub").Err())
	<-paused // a reconnect failed, and the loop is held in its pause: no more wake-ups
	// The failures woke the waiter; once it has tried and waits again (parked
	// in its select with nothing ready), it has no wake-up left.
	eventually(t, "the waiter parked again", waiterParked)
	require.NoError(t, held.Release(bg))
	n, err := c.PubSubNumSub(bg, "tenace:lock:{k}:released").Result()
	require.NoError(t, err)
	require.Zero(t, n["tenace:lock:{k}:released"], "the release message reached no one")
	tracker.refuse(false)
	close(gate)
	opened = true

	select {
	case got := <-r:
		require.NoError(t, got.err)
		require.NotNil(t, got.lease)
		require.NoError(t, got.lease.Release(bg))
	case <-time.After(10 * time.Second): // the failure's bound: the reconnect comes after one pause of 50ms
		t.Fatal("the waiter did not try again once the Pub/Sub connection was back: it waits for its fallback retry, an hour")
	}
}

// waiterParked reports whether a caller of Acquire is parked in its wait:
// blocked in the select of its wait (selector.wait, its top frame), so no
// wake-up is pending for it.
func waiterParked() bool {
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	for _, g := range strings.Split(string(buf), "\n\n") {
		header, frames, _ := strings.Cut(g, "\n")
		if strings.HasSuffix(header, " [select]:") && strings.HasPrefix(frames, "tenace.dev/tenace/redislock.(*selector).wait(") {
			return true
		}
	}
	return false
}

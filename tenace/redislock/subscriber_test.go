package redislock_test

// The shared Pub/Sub connection: its goroutines at Close, and its pace
// after it broke.

import (
	"context"
	"runtime"
	"strings"
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
		// 100ms or more (or the fourth), so that Close returning before it
		// would have ended is far from chance.
		var d time.Duration
		for i := 0; i < 4 && d < 100*time.Millisecond; i++ {
			d = <-paused
		}
		t.Logf("the receive loop pauses %v", d)
		require.Less(t, closed(t, p), d, "Close waited for the receive loop's pause; its godoc says at once, unless go-redis is re-opening the connection")
		require.ErrorIs(t, (<-r).err, tenace.ErrProviderClosed)
	})

	require.NoError(t, held.Release(bg))
}

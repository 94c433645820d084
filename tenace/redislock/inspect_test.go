package redislock_test

import (
	"context"
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"tenace.dev/internal/redistest"
	"tenace.dev/internal/serverproc"
	"tenace.dev/tenace"
	"tenace.dev/tenace/redislock"
)

// Inspect names an exclusive holder (the provider's owner and the caller's
// label, its fencing token, since and expiry), and the shared holders of a
// bulkhead; a free key has none; and Inspect changes nothing.
func TestInspect(t *testing.T) {
	srv, c := setup(t)
	_ = srv
	p := newProvider(t, c, redislock.WithOwner("api-7f9c"))
	require.Equal(t, "api-7f9c", p.Owner())

	info, err := p.Inspect(bg, "free")
	require.NoError(t, err)
	require.Equal(t, tenace.KeyInfo{Key: "free"}, info)

	before := time.Now()
	l := mustAcquire(t, p, "k", tenace.LockAcquireOptions{Owner: "job 12"})
	info, err = p.Inspect(bg, "k")
	require.NoError(t, err)
	require.Len(t, info.Holders, 1)
	h := info.Holders[0]
	require.Equal(t, "api-7f9c (job 12)", h.Owner)
	require.False(t, h.Shared)
	require.Equal(t, l.(tenace.FencedLease).Token(), h.Token)
	require.WithinDuration(t, before, h.Since, 2*time.Second) // the server's clock: the same host
	require.WithinDuration(t, time.Now().Add(redislock.DefaultWindow), h.Expires, 2*time.Second)
	require.Zero(t, info.Waiting)

	// Read-only: the holder keeps the key, a second caller is refused.
	l2, err := p.Acquire(bg, "k", tenace.LockAcquireOptions{Timeout: tenace.NoWait})
	require.NoError(t, err)
	require.Nil(t, l2)
	require.NoError(t, l.Release(bg))
	info, err = p.Inspect(bg, "k")
	require.NoError(t, err)
	require.Empty(t, info.Holders, "a released key has no holder (its owner record is not shown)")

	s1 := mustAcquire(t, p, "b", tenace.LockAcquireOptions{Shared: true, Permits: 3, Owner: "r1"})
	s2 := mustAcquire(t, p, "b", tenace.LockAcquireOptions{Shared: true, Permits: 3})
	info, err = p.Inspect(bg, "b")
	require.NoError(t, err)
	require.Len(t, info.Holders, 2)
	owners := map[string]uint64{}
	for _, h := range info.Holders {
		require.True(t, h.Shared)
		require.Equal(t, 3, h.Permits)
		owners[h.Owner] = h.Token
	}
	require.Equal(t, map[string]uint64{
		"api-7f9c (r1)": s1.(tenace.FencedLease).Token(),
		"api-7f9c":      s2.(tenace.FencedLease).Token(),
	}, owners)
	require.NoError(t, s1.Release(bg))
	require.NoError(t, s2.Release(bg))
}

// Waiters are the processes subscribed to the key's release channel.
func TestInspectWaiting(t *testing.T) {
	_, c := setup(t)
	p := newProvider(t, c)
	l := mustAcquire(t, p, "w", tenace.LockAcquireOptions{})
	ctx, cancel := context.WithCancel(bg)
	r := acquireAsync(ctx, p, "w", tenace.LockAcquireOptions{Timeout: time.Minute})
	waitSubscribed(t, c, "w", 1)
	info, err := p.Inspect(bg, "w")
	require.NoError(t, err)
	require.Equal(t, 1, info.Waiting)
	cancel()
	require.ErrorIs(t, (<-r).err, context.Canceled)
	require.NoError(t, l.Release(bg))
}

// A refusal names the holder it saw (OnHeld), from the refusal's own reply.
func TestOnHeld(t *testing.T) {
	_, c := setup(t)
	p := newProvider(t, c, redislock.WithOwner("holder-1"))
	q := newProvider(t, c, redislock.WithOwner("other"))
	l := mustAcquire(t, p, "k", tenace.LockAcquireOptions{Owner: "nightly"})
	var got []tenace.HolderInfo
	onHeld := func(h tenace.HolderInfo) { got = append(got, h) }
	for _, timeout := range []time.Duration{tenace.NoWait, 20 * time.Millisecond} {
		got = nil
		l2, err := q.Acquire(bg, "k", tenace.LockAcquireOptions{Timeout: timeout, OnHeld: onHeld})
		require.NoError(t, err)
		require.Nil(t, l2)
		require.Len(t, got, 1, "once")
		require.Equal(t, "holder-1 (nightly)", got[0].Owner)
		require.Equal(t, l.(tenace.FencedLease).Token(), got[0].Token)
		require.False(t, got[0].Since.IsZero())
		require.True(t, got[0].Expires.After(time.Now()))
	}
	require.NoError(t, l.Release(bg))

	// Shared holders refuse a writer: the first of them is named.
	r := mustAcquire(t, p, "rw", tenace.LockAcquireOptions{Shared: true, Owner: "reader"})
	got = nil
	l2, err := q.Acquire(bg, "rw", tenace.LockAcquireOptions{Timeout: tenace.NoWait, OnHeld: onHeld})
	require.NoError(t, err)
	require.Nil(t, l2)
	require.Len(t, got, 1)
	require.Equal(t, "holder-1 (reader)", got[0].Owner)
	require.True(t, got[0].Shared)
	require.NoError(t, r.Release(bg))

	// Granted: never called.
	got = nil
	l3 := mustAcquire(t, q, "k", tenace.LockAcquireOptions{OnHeld: onHeld})
	require.Empty(t, got)
	require.NoError(t, l3.Release(bg))
}

// List pages through the held keys under a prefix, with hostile keys
// (glob characters, a "}" first, invalid UTF-8), Limit at a time; every key
// held throughout is listed, and nothing else.
func TestList(t *testing.T) {
	_, c := setup(t)
	p := newProvider(t, c)
	want := map[string]bool{}
	for i := range 25 {
		want[fmt.Sprintf("jobs/%02d", i)] = true
	}
	for _, k := range []string{"jobs/a*b", "jobs/[x]", "jobs/\xff\xfe", "jobs/}"} {
		want[k] = true
	}
	var leases []tenace.LockLease
	for k := range want {
		leases = append(leases, mustAcquire(t, p, k, tenace.LockAcquireOptions{}))
	}
	leases = append(leases, mustAcquire(t, p, "other/1", tenace.LockAcquireOptions{}))
	leases = append(leases, mustAcquire(t, p, "}jobs", tenace.LockAcquireOptions{}))
	released := mustAcquire(t, p, "jobs/released", tenace.LockAcquireOptions{})
	require.NoError(t, released.Release(bg))
	defer func() {
		for _, l := range leases {
			require.NoError(t, l.Release(bg))
		}
	}()

	for _, limit := range []int{1, 7, 0} {
		got := map[string]int{}
		opts := tenace.ListOptions{Prefix: "jobs/", Limit: limit}
		for pages := 0; ; pages++ {
			require.Less(t, pages, 1000)
			page, err := p.List(bg, opts)
			require.NoError(t, err)
			if limit > 0 {
				require.LessOrEqual(t, len(page.Keys), limit)
			}
			for _, k := range page.Keys {
				require.Len(t, k.Holders, 1)
				require.Equal(t, p.Owner(), k.Holders[0].Owner)
				got[k.Key]++
			}
			if page.Next == "" {
				break
			}
			opts.Cursor = page.Next
		}
		require.Len(t, got, len(want), "limit %d", limit)
		for k := range want {
			require.Contains(t, got, k)
		}
	}

	page, err := p.List(bg, tenace.ListOptions{Prefix: "}"})
	require.NoError(t, err)
	var keys []string
	for {
		for _, k := range page.Keys {
			keys = append(keys, k.Key)
		}
		if page.Next == "" {
			break
		}
		page, err = p.List(bg, tenace.ListOptions{Prefix: "}", Cursor: page.Next})
		require.NoError(t, err)
	}
	require.Equal(t, []string{"}jobs"}, keys)

	_, err = p.List(bg, tenace.ListOptions{Cursor: "nonsense"})
	require.ErrorIs(t, err, tenace.ErrInvalidOption)
}

// An outage is an error: a refused connection names the cause at once, a
// stalled server wraps ErrNoReply when ctx ends.
func TestInspectOutage(t *testing.T) {
	port, err := serverproc.FreePort()
	require.NoError(t, err)
	p := newProvider(t, deadlineClient(t, fmt.Sprintf("127.0.0.1:%d", port))) // nothing listens
	start := time.Now()
	_, err = p.Inspect(bg, "k")
	require.ErrorIs(t, err, syscall.ECONNREFUSED)
	_, err = p.List(bg, tenace.ListOptions{})
	require.ErrorIs(t, err, syscall.ECONNREFUSED)
	require.Less(t, time.Since(start), 5*time.Second, "at once, not after go-redis's dial retries")

	srv := redistest.Start(t)
	c := deadlineClient(t, srv.Addr)
	p = newProvider(t, c)
	warm(t, c, p)
	srv.Pause()
	defer srv.Resume()
	// SIGSTOP takes effect when the kernel next schedules the server: wait
	// until a command of another client goes unanswered.
	probe := deadlineClient(t, srv.Addr)
	eventually(t, "the server stopped answering", func() bool {
		ctx, cancel := context.WithTimeout(bg, 100*time.Millisecond)
		defer cancel()
		return probe.Ping(ctx).Err() != nil
	})
	for _, call := range []func(ctx context.Context) error{
		func(ctx context.Context) error { _, err := p.Inspect(ctx, "k"); return err },
		func(ctx context.Context) error { _, err := p.List(ctx, tenace.ListOptions{}); return err },
	} {
		ctx, cancel := context.WithTimeout(bg, 200*time.Millisecond)
		err := call(ctx)
		cancel()
		require.ErrorIs(t, err, tenace.ErrNoReply)
		require.ErrorIs(t, err, redislock.ErrNoReply)
	}
}

// A set's grants record their owner too.
func TestInspectSet(t *testing.T) {
	_, c := setup(t)
	p := newProvider(t, c, redislock.WithOwner("batch"))
	s, err := p.AcquireSet(bg, []string{"s1", "s2"}, tenace.LockAcquireOptions{Owner: "move"})
	require.NoError(t, err)
	for i, k := range []string{"s1", "s2"} {
		info, err := p.Inspect(bg, k)
		require.NoError(t, err)
		require.Len(t, info.Holders, 1)
		require.Equal(t, "batch (move)", info.Holders[0].Owner)
		require.Equal(t, s.Leases()[i].(tenace.FencedLease).Token(), info.Holders[0].Token)
		require.False(t, info.Holders[0].Since.IsZero())
	}
	require.NoError(t, s.Release(bg))
}

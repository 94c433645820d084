package etcdlock_test

import (
	"context"
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/connectivity"

	"tenace.dev/internal/etcdtest"
	"tenace.dev/tenace"
	"tenace.dev/tenace/etcdlock"
)

// Inspect names the holder (owner and label, token, since, expiry) and the
// waiters in queue order with their owners; shared holders of a bulkhead;
// a free key has none; and Inspect changes nothing.
func TestInspect(t *testing.T) {
	c := etcdtest.Start(t)
	cl := newClient(t, c.Endpoints()...)
	p := newProvider(t, cl, etcdlock.WithOwner("api-7f9c"))
	q := newProvider(t, cl, etcdlock.WithOwner("worker-2"))
	require.Equal(t, "api-7f9c", p.Owner())
	key := keyOf(t, "k")

	info, err := p.Inspect(bg, key)
	require.NoError(t, err)
	require.Equal(t, tenace.KeyInfo{Key: key}, info)

	before := time.Now()
	l := mustAcquire(t, p, key, tenace.LockAcquireOptions{Owner: "job 12"})
	info, err = p.Inspect(bg, key)
	require.NoError(t, err)
	require.Len(t, info.Holders, 1)
	h := info.Holders[0]
	require.Equal(t, "api-7f9c (job 12)", h.Owner)
	require.False(t, h.Shared)
	require.Equal(t, l.(tenace.FencedLease).Token(), h.Token)
	require.WithinDuration(t, before, h.Since, time.Second)
	requireExpires(t, h, before, testWindow)

	ctx, cancel := context.WithCancel(bg)
	r := acquireAsync(ctx, q, key, tenace.LockAcquireOptions{Timeout: time.Minute, Owner: "w"})
	eventually(t, 10*time.Second, "the waiter queued", func() bool {
		info, err = p.Inspect(bg, key)
		require.NoError(t, err)
		return info.Waiting == 1
	})
	require.Len(t, info.Holders, 1, "read-only: the holder keeps the key")
	require.Equal(t, []tenace.WaiterInfo{{Owner: "worker-2 (w)", Since: info.Waiters[0].Since}}, info.Waiters)
	require.False(t, info.Waiters[0].Since.IsZero())
	require.Greater(t, info.LongestWait, time.Duration(-1))
	cancel()
	require.ErrorIs(t, (<-r).err, context.Canceled)
	require.NoError(t, l.Release(bg))

	b := keyOf(t, "bulkhead")
	s1 := mustAcquire(t, p, b, tenace.LockAcquireOptions{Shared: true, Permits: 2, Owner: "r1"})
	s2 := mustAcquire(t, q, b, tenace.LockAcquireOptions{Shared: true, Permits: 2})
	info, err = p.Inspect(bg, b)
	require.NoError(t, err)
	require.Equal(t, []string{"api-7f9c (r1)", "worker-2"}, []string{info.Holders[0].Owner, info.Holders[1].Owner})
	for _, h := range info.Holders {
		require.True(t, h.Shared)
		require.Equal(t, 2, h.Permits)
	}
	require.NoError(t, s1.Release(bg))
	require.NoError(t, s2.Release(bg))
}

// A refusal names the holder at the head of the queue, from the queueing
// request's own reply.
func TestOnHeld(t *testing.T) {
	c := etcdtest.Start(t)
	cl := newClient(t, c.Endpoints()...)
	p := newProvider(t, cl, etcdlock.WithOwner("holder-1"))
	q := newProvider(t, cl, etcdlock.WithOwner("other"))
	key := keyOf(t, "k")
	l := mustAcquire(t, p, key, tenace.LockAcquireOptions{Owner: "nightly"})
	for _, timeout := range []time.Duration{tenace.NoWait, 300 * time.Millisecond} {
		var got []tenace.HolderInfo
		l2, err := q.Acquire(bg, key, tenace.LockAcquireOptions{Timeout: timeout, OnHeld: func(h tenace.HolderInfo) { got = append(got, h) }})
		require.NoError(t, err)
		require.Nil(t, l2)
		require.Len(t, got, 1)
		require.Equal(t, "holder-1 (nightly)", got[0].Owner)
		require.Equal(t, l.(tenace.FencedLease).Token(), got[0].Token)
		require.False(t, got[0].Since.IsZero())
	}
	require.NoError(t, l.Release(bg))
}

// A queue entry written before owners (its value the permit count alone)
// is read as before: its count still rules a shared queue, and Inspect
// shows it with no owner.
func TestInspectOldEntries(t *testing.T) {
	c := etcdtest.Start(t)
	cl := newClient(t, c.Endpoints()...)
	p := newProvider(t, cl)
	key := keyOf(t, "old")
	g, err := cl.Grant(bg, 10)
	require.NoError(t, err)
	_, err = cl.Put(bg, fmt.Sprintf("%s%s/s%016x", etcdlock.DefaultPrefix, escape(key), int64(g.ID)), "1", clientv3.WithLease(g.ID))
	require.NoError(t, err)
	l, err := p.Acquire(bg, key, tenace.LockAcquireOptions{Shared: true, Permits: 5, Timeout: tenace.NoWait})
	require.NoError(t, err)
	require.Nil(t, l, "the old head's count, 1, rules")
	info, err := p.Inspect(bg, key)
	require.NoError(t, err)
	require.Len(t, info.Holders, 1)
	require.Equal(t, "", info.Holders[0].Owner)
	require.True(t, info.Holders[0].Since.IsZero())
	require.Equal(t, 1, info.Holders[0].Permits)
	_, err = cl.Revoke(bg, g.ID)
	require.NoError(t, err)
}

// escape is the provider's escape of a key in its etcd names.
func escape(key string) string {
	out := ""
	for _, r := range key {
		switch r {
		case '%':
			out += "%25"
		case '/':
			out += "%2F"
		default:
			out += string(r)
		}
	}
	return out
}

// List pages through the keys held under a prefix, with hostile keys
// ("/" and "%" escaped, invalid UTF-8) and a waiter queued; every key held
// is listed once, nothing else.
func TestList(t *testing.T) {
	c := etcdtest.Start(t)
	cl := newClient(t, c.Endpoints()...)
	p := newProvider(t, cl)
	prefix := "jobs/"
	want := map[string]bool{}
	for i := range 12 {
		want[fmt.Sprintf("%s%02d", prefix, i)] = true
	}
	for _, k := range []string{"a/b", "%2F", "\xff\xfe", "<script>alert(1)</script>"} {
		want[prefix+k] = true
	}
	var leases []tenace.LockLease
	for k := range want {
		leases = append(leases, mustAcquire(t, p, k, tenace.LockAcquireOptions{}))
	}
	leases = append(leases, mustAcquire(t, p, "jobsx", tenace.LockAcquireOptions{}))
	released := mustAcquire(t, p, prefix+"released", tenace.LockAcquireOptions{})
	require.NoError(t, released.Release(bg))
	ctx, cancel := context.WithCancel(bg)
	r := acquireAsync(ctx, p, prefix+"00", tenace.LockAcquireOptions{Timeout: time.Minute})
	eventually(t, 10*time.Second, "the waiter queued", func() bool {
		info, err := p.Inspect(bg, prefix+"00")
		require.NoError(t, err)
		return info.Waiting == 1
	})
	defer func() {
		cancel()
		<-r
		for _, l := range leases {
			require.NoError(t, l.Release(bg))
		}
	}()
	for _, limit := range []int{1, 5, 0} {
		got := map[string]int{}
		opts := tenace.ListOptions{Prefix: prefix, Limit: limit}
		for pages := 0; ; pages++ {
			require.Less(t, pages, 100)
			before := time.Now()
			page, err := p.List(bg, opts)
			require.NoError(t, err)
			if limit > 0 {
				require.LessOrEqual(t, len(page.Keys), limit)
			}
			for _, k := range page.Keys {
				require.Len(t, k.Holders, 1)
				require.Equal(t, p.Owner(), k.Holders[0].Owner)
				requireExpires(t, k.Holders[0], before, testWindow)
				got[k.Key]++
				if k.Key == prefix+"00" {
					require.Equal(t, 1, k.Waiting)
				}
			}
			if page.Next == "" {
				break
			}
			opts.Cursor = page.Next
		}
		require.Len(t, got, len(want), "limit %d: %v", limit, got)
		for k, n := range got {
			require.True(t, want[k], k)
			require.Equal(t, 1, n, k)
		}
	}
	_, err := p.List(bg, tenace.ListOptions{Prefix: prefix, Cursor: "elsewhere"})
	require.ErrorIs(t, err, tenace.ErrInvalidOption)
}

// requireExpires checks h's Expires, read after before: the end of its etcd
// lease's TTL, at most window from now (etcd rounds the time left down to
// whole seconds: it may be now).
func requireExpires(t *testing.T, h tenace.HolderInfo, before time.Time, window time.Duration) {
	t.Helper()
	require.False(t, h.Expires.Before(before), "the etcd lease's TTL: %v, read after %v", h.Expires, before)
	require.False(t, h.Expires.After(time.Now().Add(window)), "the etcd lease's TTL: %v", h.Expires)
}

// A page of List looks up at most 100 leases: a key whose holders would
// take it past that begins the next page, but the page's first key, whose
// holders are all looked up; every holder listed has its Expires.
func TestListBoundsLeaseLookups(t *testing.T) {
	c := etcdtest.Start(t)
	cl := newClient(t, c.Endpoints()...)
	const window = 30 * time.Second // 221 grants held throughout, on a machine that may be loaded
	p := newProvider(t, cl, etcdlock.WithWindow(window))
	prefix := keyOf(t, "bulk/")
	readers := map[string]int{prefix + "0big": 101}
	for i := range 60 {
		readers[fmt.Sprintf("%sk%02d", prefix, i)] = 2
	}
	var leases []tenace.LockLease
	defer func() {
		for _, l := range leases {
			require.NoError(t, l.Release(bg))
		}
	}()
	for k, n := range readers {
		for range n {
			leases = append(leases, mustAcquire(t, p, k, tenace.LockAcquireOptions{Shared: true}))
		}
	}
	var sizes []int
	seen := map[string]bool{}
	opts := tenace.ListOptions{Prefix: prefix}
	for {
		require.Less(t, len(sizes), 10)
		before := time.Now()
		page, err := p.List(bg, opts)
		require.NoError(t, err)
		sizes = append(sizes, len(page.Keys))
		for _, k := range page.Keys {
			require.Len(t, k.Holders, readers[k.Key], k.Key)
			require.False(t, seen[k.Key], k.Key)
			seen[k.Key] = true
			for _, h := range k.Holders {
				requireExpires(t, h, before, window)
			}
		}
		if page.Next == "" {
			break
		}
		opts.Cursor = page.Next
	}
	require.Equal(t, []int{1, 50, 10}, sizes, "101 lookups alone, then 100, then the rest")
	require.Len(t, seen, len(readers))
}

// An outage is an error: a stalled member, ErrNoReply once ctx ends; a
// stopped cluster, ErrUnreachable with the cause.
func TestInspectOutage(t *testing.T) {
	c := etcdtest.Start(t)
	cl := newClient(t, c.Endpoints()...)
	p := newProvider(t, cl)
	key := keyOf(t, "k")
	_, err := p.Inspect(bg, key)
	require.NoError(t, err)

	c.Members[0].Pause()
	// SIGSTOP takes effect when the kernel next schedules the member's
	// threads: wait until a request of another client goes unanswered.
	probe := newClient(t, c.Endpoints()...)
	eventually(t, 10*time.Second, "the member stopped answering", func() bool {
		ctx, cancel := context.WithTimeout(bg, 100*time.Millisecond)
		defer cancel()
		_, err := probe.Get(ctx, "probe")
		return err != nil
	})
	for _, call := range []func(ctx context.Context) error{
		func(ctx context.Context) error { _, err := p.Inspect(ctx, key); return err },
		func(ctx context.Context) error { _, err := p.List(ctx, tenace.ListOptions{}); return err },
	} {
		ctx, cancel := context.WithTimeout(bg, 300*time.Millisecond)
		err := call(ctx)
		cancel()
		require.ErrorIs(t, err, tenace.ErrNoReply)
	}
	c.Members[0].Resume()

	c.Stop()
	eventually(t, 10*time.Second, "the client saw the connection close", func() bool {
		return cl.ActiveConnection().GetState() != connectivity.Ready
	})
	start := time.Now()
	_, err = p.Inspect(bg, key)
	require.ErrorIs(t, err, etcdlock.ErrUnreachable)
	require.ErrorIs(t, err, syscall.ECONNREFUSED)
	_, err = p.List(bg, tenace.ListOptions{})
	require.ErrorIs(t, err, syscall.ECONNREFUSED)
	require.Less(t, time.Since(start), 3*time.Second)
}

// A holder whose lease ends between Inspect's read of the queue and its
// lease lookup (etcd answers TTL -1) is shown as ended — Expires the time
// of the look — never as a grant that does not expire (a zero Expires).
func TestInspectExpiresOfALeaseThatEnded(t *testing.T) {
	c := etcdtest.Start(t)
	cl := newClient(t, c.Endpoints()...)
	other := newClient(t, c.Endpoints()...)
	hooked := &revokeFirst{Lease: cl.Lease, other: other}
	cl.Lease = hooked
	p := newProvider(t, cl)
	key := keyOf(t, "k")
	mustAcquire(t, p, key, tenace.LockAcquireOptions{})
	before := time.Now()
	info, err := p.Inspect(bg, key)
	require.NoError(t, err)
	require.Equal(t, int64(-1), hooked.ttl, "etcd answered the lookup of the revoked lease with TTL -1")
	require.Len(t, info.Holders, 1)
	exp := info.Holders[0].Expires
	require.False(t, exp.IsZero(), "an ended grant is not one that never expires")
	require.False(t, exp.Before(before), "Expires is the time of the look")
	require.False(t, exp.After(time.Now()), "Expires is the time of the look")
}

// revokeFirst is a Lease whose TimeToLive revokes the lease (through
// another client) before it asks etcd, and records the TTL it answered.
type revokeFirst struct {
	clientv3.Lease
	other *clientv3.Client
	ttl   int64
}

func (r *revokeFirst) TimeToLive(ctx context.Context, id clientv3.LeaseID, opts ...clientv3.LeaseOption) (*clientv3.LeaseTimeToLiveResponse, error) {
	if _, err := r.other.Revoke(ctx, id); err != nil {
		return nil, err
	}
	resp, err := r.Lease.TimeToLive(ctx, id, opts...)
	if err == nil {
		r.ttl = resp.TTL
	}
	return resp, err
}

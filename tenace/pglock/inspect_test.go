package pglock_test

import (
	"context"
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"tenace.dev/internal/pgtest"
	"tenace.dev/tenace"
	"tenace.dev/tenace/pglock"
)

// Inspect names an exclusive holder (owner and the caller's label, token,
// since), its waiters with the longest wait; shared holders; a free or
// never-locked key has none; and Inspect changes nothing.
func TestInspect(t *testing.T) {
	srv := server(t)
	p := newProvider(t, srv, pglock.WithOwner("api-7f9c"))
	require.Equal(t, "api-7f9c", p.Owner())
	key := keyOf(t, "k")

	info, err := p.Inspect(bg, keyOf(t, "never"))
	require.NoError(t, err)
	require.Equal(t, tenace.KeyInfo{Key: keyOf(t, "never")}, info)

	before := time.Now()
	l := mustAcquire(t, p, key, tenace.LockAcquireOptions{Owner: "job 12"})
	info, err = p.Inspect(bg, key)
	require.NoError(t, err)
	require.Len(t, info.Holders, 1)
	h := info.Holders[0]
	require.Equal(t, "api-7f9c (job 12)", h.Owner)
	require.False(t, h.Shared)
	require.Equal(t, l.(tenace.FencedLease).Token(), h.Token)
	require.WithinDuration(t, before, h.Since, 2*time.Second) // the server's clock: the same host
	require.True(t, h.Expires.IsZero())
	require.Zero(t, info.Waiting)

	ctx, cancel := context.WithCancel(bg)
	r := acquireAsync(ctx, p, key, tenace.LockAcquireOptions{Timeout: time.Minute})
	waitForWaiters(t, srv, key, 1)
	info, err = p.Inspect(bg, key)
	require.NoError(t, err)
	require.Equal(t, 1, info.Waiting)
	require.Len(t, info.Waiters, 1)
	require.False(t, info.Waiters[0].Since.IsZero(), "PostgreSQL 14+ says when it began to wait")
	require.Greater(t, info.LongestWait, time.Duration(0))
	require.Len(t, info.Holders, 1, "read-only: the holder keeps the key")
	cancel()
	require.ErrorIs(t, (<-r).err, context.Canceled)

	require.NoError(t, l.Release(bg))
	info, err = p.Inspect(bg, key)
	require.NoError(t, err)
	require.Empty(t, info.Holders, "a released key has no holder (its row's owner is not shown)")

	s1 := mustAcquire(t, p, key, tenace.LockAcquireOptions{Shared: true, Owner: "r1"})
	s2 := mustAcquire(t, p, key, tenace.LockAcquireOptions{Shared: true, Owner: "r2"})
	info, err = p.Inspect(bg, key)
	require.NoError(t, err)
	require.Len(t, info.Holders, 2)
	tokens := map[string]uint64{}
	for _, h := range info.Holders {
		require.True(t, h.Shared)
		tokens[h.Owner] = h.Token
	}
	require.Equal(t, map[string]uint64{"api-7f9c (r1)": s1.(tenace.FencedLease).Token(), "api-7f9c (r2)": s2.(tenace.FencedLease).Token()}, tokens, "each holder named")
	require.NoError(t, s1.Release(bg))
	require.NoError(t, s2.Release(bg))
}

// A NoWait refusal names the holder, from the refusal's own statement.
func TestOnHeld(t *testing.T) {
	srv := server(t)
	p := newProvider(t, srv, pglock.WithOwner("holder-1"))
	q := newProvider(t, srv, pglock.WithOwner("other"))
	key := keyOf(t, "k")
	l := mustAcquire(t, p, key, tenace.LockAcquireOptions{Owner: "nightly"})
	var got []tenace.HolderInfo
	l2, err := q.Acquire(bg, key, tenace.LockAcquireOptions{Timeout: tenace.NoWait, OnHeld: func(h tenace.HolderInfo) { got = append(got, h) }})
	require.NoError(t, err)
	require.Nil(t, l2)
	require.Len(t, got, 1)
	require.Equal(t, "holder-1 (nightly)", got[0].Owner)
	require.Equal(t, l.(tenace.FencedLease).Token(), got[0].Token)
	require.False(t, got[0].Since.IsZero())
	require.NoError(t, l.Release(bg))

	got = nil
	l3 := mustAcquire(t, q, key, tenace.LockAcquireOptions{Timeout: tenace.NoWait, OnHeld: func(h tenace.HolderInfo) { got = append(got, h) }})
	require.Empty(t, got, "granted: not called")
	require.NoError(t, l3.Release(bg))
}

// A NoWait refusal by readers names the oldest live one: each reader's
// record is its own session's, read for the pids pg_locks shows holding
// the key, so a reader that has let go is never named.
func TestOnHeldByReaders(t *testing.T) {
	srv := server(t)
	p := newProvider(t, srv, pglock.WithOwner("svc"))
	key := keyOf(t, "k")
	r1 := mustAcquire(t, p, key, tenace.LockAcquireOptions{Shared: true, Owner: "reader-1"})
	r2 := mustAcquire(t, p, key, tenace.LockAcquireOptions{Shared: true, Owner: "reader-2"})
	refusal := func() tenace.HolderInfo {
		t.Helper()
		var got []tenace.HolderInfo
		w, err := p.Acquire(bg, key, tenace.LockAcquireOptions{Timeout: tenace.NoWait, OnHeld: func(h tenace.HolderInfo) { got = append(got, h) }})
		require.NoError(t, err)
		require.Nil(t, w)
		require.Len(t, got, 1, "OnHeld once")
		return got[0]
	}
	h := refusal()
	require.Equal(t, "svc (reader-1)", h.Owner, "the oldest reader")
	require.True(t, h.Shared)
	require.Equal(t, r1.(tenace.FencedLease).Token(), h.Token)
	require.False(t, h.Since.IsZero())

	require.NoError(t, r1.Release(bg))
	h = refusal()
	require.Equal(t, "svc (reader-2)", h.Owner, "reader-1 has let go: not named")
	require.Equal(t, r2.(tenace.FencedLease).Token(), h.Token)
	require.NoError(t, r2.Release(bg))
}

// List pages through the keys held under a prefix, in key order, with
// hostile keys; keys outside the prefix, and released ones, are left out.
func TestList(t *testing.T) {
	srv := server(t)
	p := newProvider(t, srv, pglock.WithMaxConns(40))
	prefix := keyOf(t, "jobs/")
	want := map[string]bool{}
	for i := range 12 {
		want[fmt.Sprintf("%s%02d", prefix, i)] = true
	}
	for _, k := range []string{"%", "_x", "\xff\xfe", "<script>alert(1)</script>"} {
		want[prefix+k] = true
	}
	var leases []tenace.LockLease
	for k := range want {
		leases = append(leases, mustAcquire(t, p, k, tenace.LockAcquireOptions{}))
	}
	leases = append(leases, mustAcquire(t, p, keyOf(t, "other"), tenace.LockAcquireOptions{}))
	released := mustAcquire(t, p, prefix+"released", tenace.LockAcquireOptions{})
	require.NoError(t, released.Release(bg))
	defer func() {
		for _, l := range leases {
			require.NoError(t, l.Release(bg))
		}
	}()
	for _, limit := range []int{1, 5, 0} {
		var got []string
		opts := tenace.ListOptions{Prefix: prefix, Limit: limit}
		for {
			page, err := p.List(bg, opts)
			require.NoError(t, err)
			if limit > 0 {
				require.LessOrEqual(t, len(page.Keys), limit)
			}
			for _, k := range page.Keys {
				require.Len(t, k.Holders, 1)
				require.Equal(t, p.Owner(), k.Holders[0].Owner)
				got = append(got, k.Key)
			}
			if page.Next == "" {
				break
			}
			opts.Cursor = page.Next
		}
		require.Len(t, got, len(want), "limit %d: %q", limit, got)
		require.IsIncreasing(t, got)
		for _, k := range got {
			require.True(t, want[k], k)
		}
	}
	_, err := p.List(bg, tenace.ListOptions{Cursor: "not hex"})
	require.ErrorIs(t, err, tenace.ErrInvalidOption)
}

// An outage is an error: a refused connection wraps the cause; a stalled
// server, ErrNoReply once ctx ends.
func TestInspectOutage(t *testing.T) {
	srv := pgtest.Start(t)
	p := newProvider(t, srv)
	key := keyOf(t, "k")
	l := mustAcquire(t, p, key, tenace.LockAcquireOptions{})
	require.NoError(t, l.Release(bg))

	srv.Stall(t)
	for _, call := range []func(ctx context.Context) error{
		func(ctx context.Context) error { _, err := p.Inspect(ctx, key); return err },
		func(ctx context.Context) error { _, err := p.List(ctx, tenace.ListOptions{}); return err },
	} {
		ctx, cancel := context.WithTimeout(bg, 200*time.Millisecond)
		err := call(ctx)
		cancel()
		require.ErrorIs(t, err, tenace.ErrNoReply)
		require.ErrorIs(t, err, pglock.ErrNoReply)
	}
	srv.Continue()

	srv.Stop()
	start := time.Now()
	_, err := p.Inspect(bg, key)
	require.ErrorIs(t, err, syscall.ECONNREFUSED)
	_, err = p.List(bg, tenace.ListOptions{})
	require.ErrorIs(t, err, syscall.ECONNREFUSED)
	require.Less(t, time.Since(start), 5*time.Second)
}

// The first Inspect after the server went away, on a connection that sat
// idle in the pool, is the outage's error (a refused dial), not the
// backend's farewell (FATAL 57P01) read off that connection; once the
// server is back, Inspect answers again.
func TestInspectAfterTheServerWentAway(t *testing.T) {
	srv := pgtest.Start(t)
	p := newProvider(t, srv)
	key := keyOf(t, "k")
	l := mustAcquire(t, p, key, tenace.LockAcquireOptions{})
	require.NoError(t, l.Release(bg))
	for _, stop := range []func(){srv.Stop, srv.Kill} {
		_, err := p.Inspect(bg, key) // a connection idle in the pool
		require.NoError(t, err)
		stop()
		_, err = p.Inspect(bg, key)
		require.ErrorIs(t, err, syscall.ECONNREFUSED)
		require.NotContains(t, err.Error(), "57P01")
		srv.Restart(t)
		info, err := p.Inspect(bg, key)
		require.NoError(t, err)
		require.Equal(t, key, info.Key)
	}
}

// Any Go string is an owner label, as any Go string is a key: a label with
// a NUL and bytes that are not UTF-8 is recorded and named byte for byte,
// by Inspect and by a refusal.
func TestOwnerLabelsAreBytes(t *testing.T) {
	srv := server(t)
	owner := "pod\x00\xff-7"
	p := newProvider(t, srv, pglock.WithOwner(owner))
	key := keyOf(t, "k")
	l := mustAcquire(t, p, key, tenace.LockAcquireOptions{Owner: "job\xfe\x00"})
	want := owner + " (job\xfe\x00)"
	info, err := p.Inspect(bg, key)
	require.NoError(t, err)
	require.Len(t, info.Holders, 1)
	require.Equal(t, want, info.Holders[0].Owner)
	var got []tenace.HolderInfo
	w, err := p.Acquire(bg, key, tenace.LockAcquireOptions{Timeout: tenace.NoWait, OnHeld: func(h tenace.HolderInfo) { got = append(got, h) }})
	require.NoError(t, err)
	require.Nil(t, w)
	require.Len(t, got, 1)
	require.Equal(t, want, got[0].Owner)
	require.Equal(t, l.(tenace.FencedLease).Token(), got[0].Token)
	require.NoError(t, l.Release(bg))
}

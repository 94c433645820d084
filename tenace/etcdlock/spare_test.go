package etcdlock_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"

	"tenace.dev/tenace"
	"tenace.dev/tenace/etcdlock"
)

// TestALeaseIsReusedOnlyAfterACleanRelease: the etcd lease of a released
// grant serves the next Acquire (no lease grant on its path), carrying
// only the new entry — the released key is free, the token above the old
// one; a lease lost is never reused; a spare too old to be kept alive in
// time is not used either (it lapses).
func TestALeaseIsReusedOnlyAfterACleanRelease(t *testing.T) {
	c := cluster(t)
	admin := newClient(t, c.Endpoints()...)
	// A 3s window: a spare is fit for 0.75s after its grant or last
	// keepalive (a renewal interval, 1s, and 0.5s before its loss time,
	// 2.25s), time enough for the reuses below on a loaded machine.
	p := newProvider(t, newClient(t, c.Endpoints()...), etcdlock.WithWindow(3*time.Second))
	a, b := keyOf(t, "a"), keyOf(t, "b")
	// The provider's first Acquire grants a lease on its path and starts
	// the grant of a spare beside it; its release gives one back.
	warm := mustAcquire(t, p, keyOf(t, "warm"), tenace.LockAcquireOptions{})
	require.NoError(t, warm.Release(bg))

	first := mustAcquire(t, p, a, tenace.LockAcquireOptions{})
	require.NoError(t, first.Release(bg))
	next := mustAcquire(t, p, b, tenace.LockAcquireOptions{})
	require.Equal(t, etcdlock.LeaseID(first), etcdlock.LeaseID(next), "the released grant's lease was not reused")
	require.Zero(t, queued(t, admin, p, a), "the reused lease kept the released key")
	require.Greater(t, next.(tenace.FencedLease).Token(), first.(tenace.FencedLease).Token())
	resp, err := admin.TimeToLive(bg, etcdlock.LeaseID(next), clientv3.WithAttachedKeys())
	require.NoError(t, err)
	require.Len(t, resp.Keys, 1, "a lease carries one entry at most")
	require.Equal(t, etcdlock.EtcdKey(next), string(resp.Keys[0]))

	// Lost: revoked from outside. Its lease is not the next one's.
	_, err = admin.Revoke(bg, etcdlock.LeaseID(next))
	require.NoError(t, err)
	require.ErrorIs(t, next.Release(bg), tenace.ErrLeaseLost)
	after := mustAcquire(t, p, a, tenace.LockAcquireOptions{})
	require.NotEqual(t, etcdlock.LeaseID(next), etcdlock.LeaseID(after), "a lost lease was reused")

	// Too old: a spare with less than a renewal interval and 0.5s left
	// before its loss time is left to lapse.
	require.NoError(t, after.Release(bg))
	time.Sleep(time.Second) // the spare's age is the point
	late := mustAcquire(t, p, b, tenace.LockAcquireOptions{})
	require.NotEqual(t, etcdlock.LeaseID(after), etcdlock.LeaseID(late), "a spare too old to keep alive in time was used")
	require.NoError(t, late.Release(bg))
}

// TestASpareGoneIsReplaced: a spare lease that etcd no longer has (it
// expired while this process was starved of CPU, or was revoked) when an
// Acquire puts its entry on it is replaced by a fresh lease, and the
// Acquire is granted on it: etcd refused the queueing, so nothing was
// written, and the call is not failed for the spare's loss.
func TestASpareGoneIsReplaced(t *testing.T) {
	c := cluster(t)
	admin := newClient(t, c.Endpoints()...)
	// A 3s window: a spare is fit for 0.75s after its last keepalive
	// (see TestALeaseIsReusedOnlyAfterACleanRelease).
	p := newProvider(t, newClient(t, c.Endpoints()...), etcdlock.WithWindow(3*time.Second))
	for _, m := range modes {
		first := mustAcquire(t, p, keyOf(t, "first"), m.with(tenace.LockAcquireOptions{}))
		require.NoError(t, first.Release(bg))
		spare := p.Spare() // the released grant's lease, or one granted ahead of need
		require.NotZero(t, spare, "no spare after a clean release")
		_, err := admin.Revoke(bg, spare) // behind the provider's back
		require.NoError(t, err)

		l, err := p.Acquire(bg, keyOf(t, "next"), m.with(tenace.LockAcquireOptions{Timeout: 5 * time.Second}))
		require.NoError(t, err, "an Acquire failed for its spare's loss")
		require.NotNil(t, l)
		require.NotEqual(t, spare, etcdlock.LeaseID(l), "granted on the lost spare")
		resp, err := admin.TimeToLive(bg, etcdlock.LeaseID(l), clientv3.WithAttachedKeys())
		require.NoError(t, err)
		require.Len(t, resp.Keys, 1)
		require.Equal(t, etcdlock.EtcdKey(l), string(resp.Keys[0]))
		require.NoError(t, l.Release(bg))
	}
}

// TestALeaseWithALateTryIsNeverASpare: a grant whose queueing or release
// took more than one try (the first unanswered past hedgeAfter, as a
// member that does not answer leaves it) may have that try land later —
// its entry put back on the lease after the release, or a later grant's
// entry of the same name deleted — so its lease is revoked at the
// release, never the next Acquire's.
func TestALeaseWithALateTryIsNeverASpare(t *testing.T) {
	c := cluster(t)
	admin := newClient(t, c.Endpoints()...)
	for _, req := range []string{"queue", "release"} {
		t.Run(req, func(t *testing.T) {
			// A 6s window: a spare stays fit for 2.5s (see the test
			// above), time enough on a loaded machine.
			p := newProvider(t, newClient(t, c.Endpoints()...), etcdlock.WithWindow(6*time.Second))
			var stall atomic.Bool
			p.SetBeforeTry(func(ctx context.Context, r string, try int32) {
				if r == req && try == 1 && stall.Load() {
					<-ctx.Done() // unanswered, until another try's answer ends it
				}
			})
			key := keyOf(t, "k")
			// The first Acquire grants a lease and a spare beside it; the
			// second takes the spare, and its release gives it back.
			var warm tenace.LockLease
			for range 2 {
				warm = mustAcquire(t, p, key, tenace.LockAcquireOptions{})
				require.NoError(t, warm.Release(bg))
			}
			require.Equal(t, etcdlock.LeaseID(warm), p.Spare(), "a clean release gives its lease back")

			stall.Store(true)
			l := mustAcquire(t, p, key, tenace.LockAcquireOptions{})
			require.NoError(t, l.Release(bg))
			stall.Store(false)
			require.NotEqual(t, etcdlock.LeaseID(l), p.Spare(), "a lease with a try that may land later is the spare")
			eventually(t, 10*time.Second, "the lease revoked", func() bool {
				resp, err := admin.TimeToLive(bg, etcdlock.LeaseID(l))
				return err == nil && resp.TTL == -1
			})
			next := mustAcquire(t, p, key, tenace.LockAcquireOptions{})
			require.NotEqual(t, etcdlock.LeaseID(l), etcdlock.LeaseID(next))
			require.NoError(t, next.Release(bg))
		})
	}
}

package redislock_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"tenace.dev/internal/redistest"
	"tenace.dev/tenace"
	"tenace.dev/tenace/redislock"
)

// lostReplyKey marks a ctx whose acquire script runs on the server and
// whose reply is then reported lost: an outcome the caller cannot know.
type lostReplyKey struct{}

type lostReplyHook struct{}

func (lostReplyHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (lostReplyHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if ctx.Value(lostReplyKey{}) != nil && err == nil {
			if redislock.ScriptName(cmd) == "acquire" {
				return errors.New("test: the reply was lost")
			}
		}
		return err
	}
}
func (lostReplyHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// Every path of Acquire and of a lease brings Stats up and back down once,
// and Stats are zero once everything is released or closed: on a server,
// a Redis Cluster and a Sentinel's primary.
func TestStatsOnEveryPath(t *testing.T) {
	srv := redistest.Start(t)
	cluster := redistest.StartCluster(t)
	primary := redistest.Start(t)
	sentinel := redistest.StartSentinel(t, primary)
	sc := deadlineClient(t, srv.Addr)
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{cluster.Addr}, ContextTimeoutEnabled: true})
	fc := redis.NewFailoverClient(&redis.FailoverOptions{MasterName: redistest.MasterName, SentinelAddrs: []string{sentinel.Addr}, ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = cc.Close(); _ = fc.Close() })
	for _, tc := range []struct {
		name   string
		client redis.UniversalClient
	}{{"standalone", sc}, {"cluster", cc}, {"failover", fc}} {
		t.Run(tc.name, func(t *testing.T) {
			c := tc.client
			c.AddHook(lostReplyHook{})
			p := redislock.New(c, append(kept(), redislock.WithRetryInterval(time.Hour))...)
			defer p.Close()
			zero := tenace.LockStats{}
			a, b := "stats-a-"+tc.name, "stats-b-"+tc.name

			la := mustAcquire(t, p, a, tenace.LockAcquireOptions{})
			require.Equal(t, tenace.LockStats{Held: 1}, p.Stats())
			l, err := p.Acquire(bg, a, tenace.LockAcquireOptions{Timeout: tenace.NoWait})
			require.NoError(t, err)
			require.Nil(t, l)
			require.Equal(t, tenace.LockStats{Held: 1}, p.Stats())
			l, err = p.Acquire(bg, a, tenace.LockAcquireOptions{Timeout: 50 * time.Millisecond})
			require.NoError(t, err)
			require.Nil(t, l)
			require.Equal(t, tenace.LockStats{Held: 1}, p.Stats())
			lb := mustAcquire(t, p, b, tenace.LockAcquireOptions{})
			ctx, cancel := context.WithCancel(bg)
			r1 := acquireAsync(ctx, p, a, tenace.LockAcquireOptions{})
			r2 := acquireAsync(ctx, p, a, tenace.LockAcquireOptions{})
			r3 := acquireAsync(ctx, p, b, tenace.LockAcquireOptions{})
			eventually(t, "three waiters", func() bool {
				return p.Stats() == tenace.LockStats{Held: 2, Waiting: 3, LongestQueue: 2}
			})
			// Held for several windows meanwhile: renewed, not lost.
			time.Sleep(2 * keptWindow) // the server's clock is the point: past two windows
			require.NoError(t, la.(tenace.LosableLease).Err())
			cancel()
			for _, r := range []<-chan result{r1, r2, r3} {
				require.ErrorIs(t, (<-r).err, context.Canceled)
			}
			require.Equal(t, tenace.LockStats{Held: 2}, p.Stats())
			require.NoError(t, la.Release(bg))
			require.NoError(t, lb.Release(bg))
			require.Equal(t, zero, p.Stats())

			// An outcome unknown: voided, never counted.
			l, err = p.Acquire(context.WithValue(bg, lostReplyKey{}, true), a, tenace.LockAcquireOptions{})
			require.Error(t, err)
			require.Nil(t, l)
			require.Equal(t, zero, p.Stats())
			eventually(t, "the void frees the key", func() bool { return c.Exists(bg, "tenace:lock:{"+a+"}").Val() == 0 })

			// Loss by TTL (a cap after renewals), then the Release.
			start := time.Now()
			const ttl = keptWindow + 100*time.Millisecond
			l = mustAcquire(t, p, a, tenace.LockAcquireOptions{TTL: ttl})
			<-l.(tenace.LosableLease).Lost()
			require.GreaterOrEqual(t, time.Since(start), ttl-redislock.LossMargin(keptWindow)-time.Millisecond)
			require.ErrorIs(t, l.(tenace.LosableLease).Err(), tenace.ErrLeaseExpired)
			require.Equal(t, zero, p.Stats())
			next := mustAcquire(t, p, a, tenace.LockAcquireOptions{Timeout: time.Second})
			require.ErrorIs(t, l.Release(bg), tenace.ErrLeaseLost)
			require.Equal(t, tenace.LockStats{Held: 1}, p.Stats())
			require.Equal(t, int64(1), c.Exists(bg, "tenace:lock:{"+a+"}").Val(), "the stale Release left the next holder's key")
			require.NoError(t, next.Release(bg))

			// Loss by a renewal that finds the key gone.
			l = mustAcquire(t, p, a, tenace.LockAcquireOptions{})
			require.NoError(t, c.Del(bg, "tenace:lock:{"+a+"}").Err())
			<-l.(tenace.LosableLease).Lost()
			require.Equal(t, zero, p.Stats())
			require.ErrorIs(t, l.Release(bg), tenace.ErrLeaseLost)

			// Churn, then Close with leases held and a waiter.
			var wg sync.WaitGroup
			for range 8 {
				wg.Go(func() {
					for _, k := range []string{a, b} {
						if l, err := p.Acquire(bg, k, tenace.LockAcquireOptions{Timeout: time.Second}); err == nil && l != nil {
							_ = l.Release(bg)
						}
					}
				})
			}
			wg.Wait()
			require.Equal(t, zero, p.Stats())
			la = mustAcquire(t, p, a, tenace.LockAcquireOptions{})
			r1 = acquireAsync(bg, p, a, tenace.LockAcquireOptions{})
			eventually(t, "a waiter", func() bool { return p.Stats().Waiting == 1 })
			require.NoError(t, p.Close())
			require.Equal(t, 0, p.Stats().Held)
			require.ErrorIs(t, (<-r1).err, tenace.ErrProviderClosed)
			require.Equal(t, zero, p.Stats())
			require.ErrorIs(t, la.Release(bg), tenace.ErrLeaseLost)
			require.Equal(t, zero, p.Stats())
		})
	}
}

// An acquire whose script is on its way as the provider is closed gets its
// lease, lost already and never counted in Stats, as Close's doc says; its
// Release still frees the key.
func TestAGrantAsCloseRunsIsLostAtOnce(t *testing.T) {
	_, c := setup(t)
	var p *redislock.Provider
	var once sync.Once
	c.AddHook(scriptHook(func(name string) {
		if name == "acquire" { // before it is sent
			once.Do(func() { require.NoError(t, p.Close()) })
		}
	}))
	p = redislock.New(c)
	l, err := p.Acquire(bg, "closing", tenace.LockAcquireOptions{})
	require.NoError(t, err)
	require.NotNil(t, l)
	require.ErrorIs(t, l.(tenace.LosableLease).Err(), tenace.ErrLeaseLost)
	require.Equal(t, tenace.LockStats{}, p.Stats())
	require.ErrorIs(t, l.Release(bg), tenace.ErrLeaseLost)
	require.Zero(t, c.Exists(bg, "tenace:lock:{closing}").Val(), "Release deleted the key")
}

// A Release of a lost lease whose call fails says so and can be called
// again: after Close the keys stay held until Release deletes them, so a
// failed deletion must not pass for one done.
func TestAFailedReleaseOfALostLeaseCanBeRetried(t *testing.T) {
	_, c := setup(t)
	p := redislock.New(c)
	l := mustAcquire(t, p, "lost-retry", tenace.LockAcquireOptions{})
	require.NoError(t, p.Close())
	ctx, cancel := context.WithCancel(bg)
	cancel()
	err := l.Release(ctx)
	require.ErrorIs(t, err, tenace.ErrLeaseLost)
	require.ErrorIs(t, err, context.Canceled, "the failed call is reported")
	require.Equal(t, int64(1), c.Exists(bg, "tenace:lock:{lost-retry}").Val())
	require.ErrorIs(t, l.Release(bg), tenace.ErrLeaseLost)
	require.Zero(t, c.Exists(bg, "tenace:lock:{lost-retry}").Val(), "the retry deleted the key")
	require.NoError(t, l.Release(bg), "done: nothing more")
}

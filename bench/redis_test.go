package main

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"tenace.dev/internal/redistest"
)

// cmdCounter counts the commands a client sends: round trips, since none of
// the peers pipeline.
type cmdCounter struct{ n atomic.Int64 }

func (h *cmdCounter) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *cmdCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.n.Add(1)
		return next(ctx, cmd)
	}
}
func (h *cmdCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.n.Add(int64(len(cmds)))
		return next(ctx, cmds)
	}
}

// BenchmarkRedis measures the distributed locks on one throwaway
// redis-server, in the same run:
//
//	uncontended  one goroutine, acquire+release of its own key; also the
//	             commands (round trips) per op
//	handoff      8 goroutines on one key, each pausing 200µs between its
//	             operations so that others are always waiting; handoff-µs is
//	             the mean time from a release to the acquire of a different
//	             goroutine: the release-message wake-up against polling
func BenchmarkRedis(b *testing.B) {
	srv := redistest.Start(b)
	for _, impl := range redisImpls {
		b.Run("uncontended/"+impl.name, func(b *testing.B) {
			c := redis.NewClient(&redis.Options{Addr: srv.Addr})
			defer c.Close()
			h := &cmdCounter{}
			c.AddHook(h)
			l := impl.make(c)
			ctx := context.Background()
			_ = l.Do(ctx, "u-"+impl.name, noop) // load the scripts
			h.n.Store(0)
			b.ReportAllocs()
			for b.Loop() {
				if err := l.Do(ctx, "u-"+impl.name, noop); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(h.n.Load())/float64(b.N), "cmds/op")
		})
	}
	for _, impl := range redisImpls {
		b.Run("handoff/"+impl.name, func(b *testing.B) {
			c := redis.NewClient(&redis.Options{Addr: srv.Addr, PoolSize: 64})
			defer c.Close()
			l := impl.make(c)
			const contenders = 8
			key := "h-" + impl.name
			var (
				mu          sync.Mutex // guards the hand-off record, written inside the lock
				lastHolder  = -1
				lastRelease time.Time
				handoffs    int
				handoffSum  time.Duration
				left        atomic.Int64
				wg          sync.WaitGroup
			)
			left.Store(int64(b.N))
			b.ResetTimer()
			for g := range contenders {
				wg.Go(func() {
					ctx := context.Background()
					fn := func(context.Context) error {
						mu.Lock()
						if lastHolder != g && lastHolder >= 0 {
							handoffs++
							handoffSum += time.Since(lastRelease)
						}
						mu.Unlock()
						return nil
					}
					for left.Add(-1) >= 0 {
						_ = l.Do(ctx, key, func(ctx context.Context) error {
							_ = fn(ctx)
							mu.Lock()
							lastHolder, lastRelease = g, time.Now()
							mu.Unlock()
							return nil
						})
						time.Sleep(200 * time.Microsecond) // think time: let the others in
					}
				})
			}
			wg.Wait()
			b.StopTimer()
			if handoffs > 0 {
				b.ReportMetric(float64(handoffSum.Microseconds())/float64(handoffs), "handoff-µs")
				b.ReportMetric(float64(handoffs)/float64(b.N), "handoffs/op")
			}
		})
	}
}

// Every Redis peer releases a lock it holds even when the operation's
// context ends while it holds it (as tenace's Lock step releases, with
// context.WithoutCancel): with the context's end cutting the release short,
// the key stayed held until its TTL (10s), and the next operation on it
// waited for that.
func TestRedisPeersReleaseWhenTheContextEndsWhileHolding(t *testing.T) {
	srv := redistest.Start(t)
	for _, impl := range redisImpls {
		c := redis.NewClient(&redis.Options{Addr: srv.Addr})
		l := impl.make(c)
		key := "ctx-ends-" + impl.name
		ctx, cancel := context.WithCancel(context.Background())
		_ = l.Do(ctx, key, func(context.Context) error { cancel(); return nil })
		next, stop := context.WithTimeout(context.Background(), 2*time.Second)
		ran := false
		err := l.Do(next, key, func(context.Context) error { ran = true; return nil })
		stop()
		require.NoError(t, err, impl.name)
		require.True(t, ran, impl.name)
		l.Close()
		require.NoError(t, c.Close())
	}
}

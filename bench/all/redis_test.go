package main

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"tenace.dev/bench/internal/load"
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
			_ = l.Do(ctx, "u-"+impl.name, load.Noop) // load the scripts
			h.n.Store(0)
			b.ReportAllocs()
			for b.Loop() {
				if err := l.Do(ctx, "u-"+impl.name, load.Noop); err != nil {
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
			defer l.Close()
			handoff(b, l, "h-"+impl.name)
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

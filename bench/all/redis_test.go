package main

import (
	"context"
	"strconv"
	"strings"
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
//	             commands (round trips) per op, and the CPU each op costs:
//	             the server's (server-µs/op, from INFO cpu; scripts-µs/op,
//	             the time it spent in EVALSHA, from INFO commandstats) and
//	             this process's (client-µs/op, from getrusage: steadier on
//	             a loaded machine than ns/op, which is mostly waiting)
//	uncontended/ratio  tenace-redis and bsm, one op of each in turn per
//	             iteration (the order alternates): each one's median
//	             (<impl>-µs) and tenace-redis's ratio to bsm's
//	             (tenace-redis/bsm), as BenchmarkPostgres's
//	             uncontended/ratio: ops timed side by side compare on a
//	             machine whose load swings within seconds
//	handoff      8 goroutines on one key, each pausing 200µs between its
//	             operations so that others are always waiting; handoff-µs is
//	             the mean time from a release to the acquire of a different
//	             goroutine: the release-message wake-up against polling
func BenchmarkRedis(b *testing.B) {
	srv := redistest.Start(b)
	warmRedis(b, srv.Addr)
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
			admin := redis.NewClient(&redis.Options{Addr: srv.Addr})
			defer admin.Close()
			require.NoError(b, admin.ConfigResetStat(ctx).Err())
			server, client := serverCPU(b, admin), processCPU()
			b.ReportAllocs()
			for b.Loop() {
				if err := l.Do(ctx, "u-"+impl.name, load.Noop); err != nil {
					b.Fatal(err)
				}
			}
			n := float64(b.N)
			b.ReportMetric(float64(h.n.Load())/n, "cmds/op")
			b.ReportMetric((serverCPU(b, admin)-server).Seconds()*1e6/n, "server-µs/op")
			b.ReportMetric(scriptTime(b, admin).Seconds()*1e6/n, "scripts-µs/op")
			if client >= 0 {
				b.ReportMetric((processCPU()-client).Seconds()*1e6/n, "client-µs/op")
			}
		})
	}
	b.Run("uncontended/ratio", func(b *testing.B) { redisRatio(b, srv.Addr) })
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

// redisRatio is BenchmarkRedis's uncontended/ratio.
func redisRatio(b *testing.B, addr string) {
	ctx := context.Background()
	var lockers []load.Locker
	var names []string
	for _, impl := range redisImpls {
		if impl.name != "tenace-redis" && impl.name != "bsm" {
			continue
		}
		c := redis.NewClient(&redis.Options{Addr: addr})
		defer c.Close()
		l := impl.make(c)
		defer l.Close()
		require.NoError(b, l.Do(ctx, "r-"+impl.name, load.Noop))
		lockers, names = append(lockers, l), append(names, impl.name)
	}
	keys := make([]string, len(names))
	for i, name := range names {
		keys[i] = "r-" + name
	}
	medians := sideBySide(ctx, b, lockers, keys)
	for i := range medians {
		b.ReportMetric(float64(medians[i].Nanoseconds())/1e3, names[i]+"-µs")
	}
	b.ReportMetric(float64(medians[0])/float64(medians[1]), names[0]+"/"+names[1])
}

// warmRedis runs redisWarmup acquire+release of each implementation on the
// fresh server before any is measured, as warmEtcd does: the first moments
// of a new server and of this process (heaps growing, scripts loaded,
// connections dialled) would otherwise fall on whichever implementation
// runs first, tenace-redis.
func warmRedis(b *testing.B, addr string) {
	for _, impl := range redisImpls {
		c := redis.NewClient(&redis.Options{Addr: addr})
		l := impl.make(c)
		for range redisWarmup {
			require.NoError(b, l.Do(context.Background(), "warm-"+impl.name, load.Noop))
		}
		l.Close()
		require.NoError(b, c.Close())
	}
}

// redisWarmup is warmRedis's count per implementation (a tenth of a second
// of each on this host).
const redisWarmup = 500

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

// serverCPU is the CPU time the Redis server has used (INFO cpu: system and
// user, its main thread and the others).
func serverCPU(tb testing.TB, c *redis.Client) time.Duration {
	info, err := c.Info(context.Background(), "cpu").Result()
	require.NoError(tb, err)
	return infoSeconds(info, "used_cpu_sys:") + infoSeconds(info, "used_cpu_user:")
}

// scriptTime is the time the server spent running EVALSHA since its stats
// were reset (INFO commandstats).
func scriptTime(tb testing.TB, c *redis.Client) time.Duration {
	info, err := c.Info(context.Background(), "commandstats").Result()
	require.NoError(tb, err)
	for _, line := range strings.Split(info, "\r\n") {
		if rest, ok := strings.CutPrefix(line, "cmdstat_evalsha:"); ok {
			for _, f := range strings.Split(rest, ",") {
				if us, ok := strings.CutPrefix(f, "usec="); ok {
					n, err := strconv.ParseInt(us, 10, 64)
					require.NoError(tb, err)
					return time.Duration(n) * time.Microsecond
				}
			}
		}
	}
	return 0
}

// infoSeconds reads the field that starts with name in an INFO reply, in
// seconds.
func infoSeconds(info, name string) time.Duration {
	for _, line := range strings.Split(info, "\r\n") {
		if v, ok := strings.CutPrefix(line, name); ok {
			f, _ := strconv.ParseFloat(v, 64)
			return time.Duration(f * float64(time.Second))
		}
	}
	return 0
}

package main

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"tenace.dev/internal/pgtest"
	"tenace.dev/internal/redistest"
)

// BenchmarkPostgres measures tenace/pglock on one throwaway PostgreSQL
// (fsync off: the fence's commit costs no disk flush here), in the same
// run as its floor and peers:
//
//	uncontended/floor      two bare round trips on a held connection, as pglock's
//	                       statements are sent (extended protocol, cached statements):
//	                       SELECT pg_advisory_lock($1, $2); SELECT pg_advisory_unlock($1, $2)
//	uncontended/<impl>     one goroutine, acquire+release of its own key
//	handoff/<impl>         8 goroutines on one key, 200µs think time; handoff-µs
//	                       is the mean time from the end of one holder's work
//	                       to the start of a different holder's (its release,
//	                       the grant, the wake-up); tenace-redis runs on a
//	                       redis-server beside it, for comparison
func BenchmarkPostgres(b *testing.B) {
	pg := pgtest.Start(b)
	ctx := context.Background()
	b.Run("uncontended/floor", func(b *testing.B) {
		c, err := pgx.Connect(ctx, pg.ConnString())
		require.NoError(b, err)
		defer c.Close(ctx)
		b.ReportAllocs()
		for b.Loop() {
			if _, err := c.Exec(ctx, "SELECT pg_advisory_lock($1::int4, $2::int4)", 1, 1); err != nil {
				b.Fatal(err)
			}
			if _, err := c.Exec(ctx, "SELECT pg_advisory_unlock($1::int4, $2::int4)", 1, 1); err != nil {
				b.Fatal(err)
			}
		}
	})
	for _, impl := range postgresImpls {
		b.Run("uncontended/"+impl.name, func(b *testing.B) {
			l, err := impl.make(ctx, pg.ConnString(), 4)
			require.NoError(b, err)
			defer l.Close()
			_ = l.Do(ctx, "u-"+impl.name, noop) // register the key, warm the pool
			b.ReportAllocs()
			for b.Loop() {
				if err := l.Do(ctx, "u-"+impl.name, noop); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
	for _, impl := range postgresImpls {
		b.Run("handoff/"+impl.name, func(b *testing.B) {
			l, err := impl.make(ctx, pg.ConnString(), 16)
			require.NoError(b, err)
			defer l.Close()
			handoff(b, l, "h-"+impl.name)
		})
	}
	b.Run("handoff/tenace-redis", func(b *testing.B) {
		srv := redistest.Start(b)
		c := redis.NewClient(&redis.Options{Addr: srv.Addr, PoolSize: 64})
		defer c.Close()
		l := redisImpls[0].make(c)
		defer l.Close()
		handoff(b, l, "h-tenace-redis")
	})
}

// handoff runs 8 contenders on key, each pausing 200µs between its
// operations so that others are always waiting, and reports the mean
// hand-off time and the hand-offs per operation (as BenchmarkRedis does).
func handoff(b *testing.B, l Locker, key string) {
	const contenders = 8
	var (
		mu          sync.Mutex // guards the hand-off record, written inside the lock
		lastHolder  = -1
		lastRelease time.Time
		handoffs    int
		handoffSum  time.Duration
		left        atomic.Int64
		wg          sync.WaitGroup
	)
	_ = l.Do(context.Background(), key, noop) // register the key, warm the pool
	left.Store(int64(b.N))
	b.ReportAllocs()
	b.ResetTimer()
	for g := range contenders {
		wg.Go(func() {
			ctx := context.Background()
			for left.Add(-1) >= 0 {
				err := l.Do(ctx, key, func(context.Context) error {
					mu.Lock()
					if lastHolder != g && lastHolder >= 0 {
						handoffs++
						handoffSum += time.Since(lastRelease)
					}
					mu.Unlock()
					// ... the work ...
					mu.Lock()
					lastHolder, lastRelease = g, time.Now()
					mu.Unlock()
					return nil
				})
				if err != nil {
					b.Error(err)
					return
				}
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
}

// TestPostgresCellsRun: the load tool's PostgreSQL cells run, count
// operations, and never let two holders into one key.
func TestPostgresCellsRun(t *testing.T) {
	pg := pgtest.Start(t)
	for _, impl := range postgresImpls {
		for _, sc := range []string{"distinct", "hot"} {
			r, err := runCell(cell{Impl: impl.name, Scenario: sc, Goroutines: 4, Hold: time.Microsecond, Duration: 100 * time.Millisecond, Postgres: pg.ConnString()}, nil, "")
			require.NoError(t, err)
			require.Positive(t, r.Ops, "%s %s", impl.name, sc)
			require.Equal(t, int32(1), r.MaxInside, "%s %s: holders inside one key", impl.name, sc)
		}
	}
	out, errOut := runCapture(t, []string{"-provider", "postgres"})
	require.Equal(t, 2, out.code)
	require.Contains(t, errOut, "-provider postgres needs -postgres")
	out, _ = runCapture(t, []string{"-provider", "postgres", "-postgres", pg.ConnString(), "-goroutines", "2", "-scenario", "hot", "-duration", "50ms", "-quiet"})
	require.Equal(t, 0, out.code)
	require.Contains(t, out.stdout, "tenace-pg")
	require.Contains(t, out.stdout, "pg-hand")
}

package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"tenace.dev/bench/internal/load"
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
//	uncontended/ratio      the same for every impl, one op of each in turn per
//	                       iteration: each one's median (<impl>-µs) and its
//	                       ratio to pg-hand's (<impl>/pg-hand); with
//	                       TENACE_BENCH_FSYNC set, ratio-fsync too, the same
//	                       with fsync on (a commit that waits for the disk)
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
			_ = l.Do(ctx, "u-"+impl.name, load.Noop) // register the key, warm the pool
			b.ReportAllocs()
			for b.Loop() {
				if err := l.Do(ctx, "u-"+impl.name, load.Noop); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
	b.Run("uncontended/ratio", func(b *testing.B) { uncontendedRatios(b, pg.ConnString()) })
	if os.Getenv("TENACE_BENCH_FSYNC") != "" {
		// The same with fsync on, as a production server runs: a commit
		// that waits for its WAL waits for the disk.
		pg.MustExec(b, "ALTER SYSTEM SET fsync = on")
		pg.MustExec(b, "SELECT pg_reload_conf()")
		b.Run("uncontended/ratio-fsync", func(b *testing.B) { uncontendedRatios(b, pg.ConnString()) })
		pg.MustExec(b, "ALTER SYSTEM RESET fsync")
		pg.MustExec(b, "SELECT pg_reload_conf()")
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

// uncontendedRatios times every PostgreSQL peer side by side (see
// sideBySide) and reports each one's median and its ratio to pg-hand's.
func uncontendedRatios(b *testing.B, conn string) {
	ctx := context.Background()
	lockers := make([]load.Locker, len(postgresImpls))
	hand := -1
	for i, impl := range postgresImpls {
		l, err := impl.make(ctx, conn, 4)
		require.NoError(b, err)
		defer l.Close()
		_ = l.Do(ctx, "r-"+impl.name, load.Noop) // register the key, warm the pool
		lockers[i] = l
		if impl.name == "pg-hand" {
			hand = i
		}
	}
	require.GreaterOrEqual(b, hand, 0)
	keys := make([]string, len(postgresImpls))
	for i, impl := range postgresImpls {
		keys[i] = "r-" + impl.name
	}
	medians := sideBySide(ctx, b, lockers, keys)
	for i, impl := range postgresImpls {
		b.ReportMetric(float64(medians[i].Microseconds()), impl.name+"-µs")
		if i != hand {
			b.ReportMetric(float64(medians[i])/float64(medians[hand]), impl.name+"/pg-hand")
		}
	}
}

// handoff runs 8 contenders on key, each pausing 200µs between its
// operations so that others are always waiting, and reports the mean
// hand-off time and the hand-offs per operation (as BenchmarkRedis does).
func handoff(b *testing.B, l load.Locker, key string) {
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
	_ = l.Do(context.Background(), key, load.Noop) // register the key, warm the pool
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

// The load tool's PostgreSQL cells run on a server given by address, and
// never let two holders into one key (the tool exits 1 if one did).
func TestPostgresCellsRunOnAGivenServer(t *testing.T) {
	pg := pgtest.Start(t)
	out, _ := runCapture(t, []string{"-providers", "postgres", "-postgres", pg.ConnString(), "-goroutines", "2,4", "-duration", "50ms", "-quiet"})
	require.Equal(t, 0, out.code)
	for _, impl := range postgresImpls {
		require.Regexp(t, `(?m)^`+impl.name+`\s+hot\s+4\s+[1-9]`, out.stdout)
		require.Regexp(t, `(?m)^`+impl.name+`\s+distinct\s+2\s+[1-9]`, out.stdout)
	}
}

// With no address, one invocation runs the Redis, PostgreSQL and etcd
// families on throwaway servers it starts, compares each row with its own
// family's tenace, charts them, and stops the servers (TestMain's goleak
// would find the watchers left running).
func TestOneInvocationStartsTheServersItNeeds(t *testing.T) {
	for _, bin := range []string{"redis-server", "etcd"} {
		if _, err := exec.LookPath(bin); err != nil && os.Getenv("CI") == "" {
			t.Skip(bin + " is not installed")
		}
	}
	dir := t.TempDir()
	out, errOut := runCapture(t, []string{"-providers", "redis,postgres,etcd", "-scenario", "hot", "-goroutines", "2", "-duration", "100ms", "-out", dir})
	if strings.Contains(errOut, "not installed") && os.Getenv("CI") == "" {
		t.Skip(errOut)
	}
	require.Equal(t, 0, out.code, errOut)
	require.Contains(t, errOut, "starting a throwaway redis server")
	require.Contains(t, errOut, "starting a throwaway postgres server")
	require.Contains(t, errOut, "starting a throwaway etcd server")
	for _, impl := range []string{"tenace-redis", "redsync", "bsm", "tenace-pg", "tenace-pg-nofence", "pg-hand", "tenace-etcd", "etcd-mutex"} {
		require.Regexp(t, `(?m)^`+impl+`\s+hot\s+2\s`, out.stdout)
	}
	require.Regexp(t, `(?m)^tenace-redis\s+hot\s+2\s+\d+\s+1\.00 `, out.stdout, "the base of its family")
	require.Regexp(t, `(?m)^tenace-pg\s+hot\s+2\s+\d+\s+1\.00 `, out.stdout, "the base of its family")
	require.Regexp(t, `(?m)^tenace-etcd\s+hot\s+2\s+\d+\s+1\.00 `, out.stdout, "the base of its family")
	svg, err := os.ReadFile(filepath.Join(dir, "chart.svg"))
	require.NoError(t, err)
	require.Contains(t, string(svg), "bsm")
	require.Contains(t, string(svg), "pg-hand")
	require.Contains(t, string(svg), "etcd-mutex")
}

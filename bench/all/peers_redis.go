package main

import (
	"context"
	"math"
	"time"

	bsm "github.com/bsm/redislock"
	"github.com/go-redsync/redsync/v4"
	"github.com/go-redsync/redsync/v4/redis/goredis/v9"
	"github.com/redis/go-redis/v9"

	"tenace.dev/bench/internal/load"
	"tenace.dev/tenace"
	"tenace.dev/tenace/redislock"
)

// The distributed peers, on one Redis server. Each waits the way its
// library does by default, with retries added where the default gives up
// at once (the benchmarks measure waiting, not giving up):
//
//	tenace-redis  tenace/redislock: waits on the release message (fallback retry 1s)
//	redsync       go-redsync/redsync: polls, 50–250ms apart (its default delay), tries unlimited
//	bsm           bsm/redislock: polls every 10ms (LinearBackoff is a constant
//	              interval; it has no default retry); with no deadline on
//	              ctx, Obtain gives up after the TTL (10s) with
//	              context.DeadlineExceeded, which no cell's wait reaches
var redisImpls = []struct {
	name string
	desc string
	make func(c *redis.Client) load.Locker
}{
	{"tenace-redis", "tenace/redislock: wakes on the release message", func(c *redis.Client) load.Locker {
		return &providerLocker{p: redislock.New(c), opts: tenace.LockAcquireOptions{TTL: redisTTL}}
	}},
	{"redsync", "go-redsync/redsync v4: polls 50–250ms apart", func(c *redis.Client) load.Locker {
		return &redsyncLocker{rs: redsync.New(goredis.NewPool(c))}
	}},
	{"bsm", "bsm/redislock: polls with a 10ms linear backoff", func(c *redis.Client) load.Locker {
		return &bsmLocker{l: bsm.New(c)}
	}},
}

// redisFamily is the Redis implementations on one server: -redis host:port,
// or a throwaway redis-server.
func redisFamily() *load.Family {
	f := &load.Family{Name: "redis", Base: "tenace-redis", Scenarios: "distinct,hot", Goroutines: "1,8",
		AddrFlag: "redis", AddrUsage: "Redis server address (host:port) for -providers redis (default: a throwaway redis-server)",
		Start: startRedis}
	for _, i := range redisImpls {
		f.Impls = append(f.Impls, load.Impl{Name: i.name, Desc: i.desc, Make: func(addr string, _, _ int) (load.Locker, error) {
			c := redis.NewClient(&redis.Options{Addr: addr, PoolSize: 512})
			return &closingLocker{Locker: i.make(c), close: c.Close}, nil
		}})
	}
	return f
}

const redisTTL = 10 * time.Second

type redsyncLocker struct{ rs *redsync.Redsync }

func (r *redsyncLocker) Do(ctx context.Context, key string, fn func(context.Context) error) error {
	m := r.rs.NewMutex(key, redsync.WithExpiry(redisTTL), redsync.WithTries(math.MaxInt32))
	if err := m.LockContext(ctx); err != nil {
		return err
	}
	_ = fn(ctx)
	_, err := m.UnlockContext(context.WithoutCancel(ctx)) // released as providerLocker releases
	return err
}
func (r *redsyncLocker) TakesContext() bool { return true }
func (r *redsyncLocker) Close()             {}

type bsmLocker struct{ l *bsm.Client }

func (b *bsmLocker) Do(ctx context.Context, key string, fn func(context.Context) error) error {
	lock, err := b.l.Obtain(ctx, key, redisTTL, &bsm.Options{RetryStrategy: bsm.LinearBackoff(10 * time.Millisecond)})
	if err != nil {
		return err
	}
	_ = fn(ctx)
	return lock.Release(context.WithoutCancel(ctx)) // released as providerLocker releases
}
func (b *bsmLocker) TakesContext() bool { return true }
func (b *bsmLocker) Close()             {}

// closingLocker closes the client it made (close) with the Locker.
type closingLocker struct {
	load.Locker
	close func() error
}

func (c *closingLocker) Close() { c.Locker.Close(); _ = c.close() }

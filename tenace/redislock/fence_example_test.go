package redislock_test

import (
	"context"
	"errors"
	"strconv"

	"github.com/redis/go-redis/v9"

	"tenace.dev/tenace"
	"tenace.dev/tenace/redislock"
)

// A counter in Redis, incremented under a lock, with the lease's fencing
// token checked on the read (FencedGet) and on the write (FencedSet): a
// holder whose lock has passed to another (it paused past its window, say)
// can no longer write once the new holder has read. The counter is a hash
// the two functions keep; read and write it only through them. (Not run:
// it needs a Redis server on localhost:6379.)
func ExampleFencedGet() {
	client := redis.NewClient(&redis.Options{Addr: "localhost:6379", ContextTimeoutEnabled: true})
	defer client.Close()
	locks := redislock.New(client)
	defer locks.Close()

	p := tenace.NewPolicy().WithLock(tenace.LockOptions{Provider: locks, Key: "visits"})
	_ = p.Execute(context.Background(), func(ctx context.Context) error {
		token, _ := tenace.TokenFrom(ctx)
		s, err := redislock.FencedGet(ctx, client, "counters:visits", token)
		if err != nil && !errors.Is(err, redis.Nil) { // redis.Nil: not set yet, 0
			return err // wraps redislock.ErrStaleToken if a newer holder has been here
		}
		n, _ := strconv.Atoi(s)
		return redislock.FencedSet(ctx, client, "counters:visits", strconv.Itoa(n+1), token)
	})
}

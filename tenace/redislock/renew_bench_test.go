package redislock

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"tenace.dev/internal/redistest"
	"tenace.dev/tenace"
)

// BenchmarkRenewal is one renewal of a held lease, as its timer runs it:
// the script call, the loss timer moved on, the next renewal armed.
// allocs/op is the figure: what a held lease costs per renewal.
func BenchmarkRenewal(b *testing.B) {
	srv := redistest.Start(b)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr, ContextTimeoutEnabled: true})
	defer c.Close()
	p := New(c, WithWindow(2*time.Hour), WithRenewInterval(time.Hour)) // its own timers never fire here
	defer p.Close()
	ll, err := p.Acquire(context.Background(), "bench", tenace.LockAcquireOptions{})
	if err != nil || ll == nil {
		b.Fatal(ll, err)
	}
	l := ll.(*lease)
	defer l.Release(context.Background())
	disarm := func() {
		l.mu.Lock()
		l.disarm(l.renewT) // as if it had fired
		l.mu.Unlock()
	}
	disarm()
	l.renew() // loads the script
	b.ReportAllocs()
	for b.Loop() {
		disarm()
		l.renew()
	}
	b.StopTimer()
	if l.Err() != nil {
		b.Fatal(l.Err())
	}
}

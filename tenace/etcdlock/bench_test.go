package etcdlock_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	"tenace.dev/internal/etcdtest"
	"tenace.dev/tenace"
	"tenace.dev/tenace/etcdlock"
)

// The benchmarks compare the provider with etcd's own concurrency.Mutex on
// the same one-member cluster, in the same run: an uncontended
// acquire+release, and the hand-off (from the holder's release to the
// grant of the waiter, which watches the holder's key).
//
//	go test -run '^$' -bench . -benchtime 200x ./tenace/etcdlock/

// benchCluster starts a one-member cluster and returns two clients on it.
func benchCluster(b *testing.B) (*clientv3.Client, *clientv3.Client) {
	c := etcdtest.Start(b)
	return newClient(b, c.Endpoints()...), newClient(b, c.Endpoints()...)
}

func BenchmarkUncontended(b *testing.B) {
	c1, _ := benchCluster(b)
	b.Run("etcdlock", func(b *testing.B) {
		p := newProvider(b, c1)
		for b.Loop() {
			l, err := p.Acquire(bg, "bench", tenace.LockAcquireOptions{})
			if err != nil || l == nil {
				b.Fatal(l, err)
			}
			if err := l.Release(bg); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("concurrency.Mutex", func(b *testing.B) {
		s, err := concurrency.NewSession(c1, concurrency.WithTTL(int(testWindow/time.Second)))
		if err != nil {
			b.Fatal(err)
		}
		defer s.Close()
		m := concurrency.NewMutex(s, "bench-mutex")
		for b.Loop() {
			if err := m.Lock(bg); err != nil {
				b.Fatal(err)
			}
			if err := m.Unlock(bg); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// handoff measures, b.N times, the time from the start of the holder's
// release to the return of the waiter's acquire, the waiter having queued
// first (queued reports it), and reports it as ns/handoff.
func handoff(b *testing.B, hold func() (release func()), wait func() (release func()), queued func() bool) {
	var total time.Duration
	for b.Loop() {
		release := hold()
		got := make(chan func(), 1) // one result, never blocks the waiter
		go func() { got <- wait() }()
		for !queued() {
			time.Sleep(time.Millisecond) // polling etcd: no event says a waiter queued
		}
		start := time.Now()
		release()
		next := <-got
		total += time.Since(start)
		next()
	}
	b.ReportMetric(float64(total.Nanoseconds())/float64(b.N), "ns/handoff")
}

func BenchmarkHandoff(b *testing.B) {
	c1, c2 := benchCluster(b)
	count := func(prefix string) func() bool {
		return func() bool {
			resp, err := c1.Get(bg, prefix, clientv3.WithPrefix(), clientv3.WithCountOnly())
			return err == nil && resp.Count == 2
		}
	}
	b.Run("etcdlock", func(b *testing.B) {
		p1, p2 := newProvider(b, c1), newProvider(b, c2)
		acquire := func(p *etcdlock.Provider) func() {
			l, err := p.Acquire(bg, "handoff", tenace.LockAcquireOptions{})
			if err != nil || l == nil {
				panic(fmt.Sprint(l, err))
			}
			return func() { _ = l.Release(bg) }
		}
		handoff(b, func() func() { return acquire(p1) }, func() func() { return acquire(p2) }, count(p1.Dir("handoff")))
	})
	b.Run("concurrency.Mutex", func(b *testing.B) {
		var sessions []*concurrency.Session
		for _, c := range []*clientv3.Client{c1, c2} {
			s, err := concurrency.NewSession(c, concurrency.WithTTL(int(testWindow/time.Second)))
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close()
			sessions = append(sessions, s)
		}
		lock := func(s *concurrency.Session) func() {
			m := concurrency.NewMutex(s, "handoff-mutex")
			if err := m.Lock(context.Background()); err != nil {
				panic(err)
			}
			return func() { _ = m.Unlock(bg) }
		}
		handoff(b, func() func() { return lock(sessions[0]) }, func() func() { return lock(sessions[1]) }, count("handoff-mutex/"))
	})
}

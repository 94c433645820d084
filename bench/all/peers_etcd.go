package main

import (
	"context"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	"go.uber.org/zap"
	"google.golang.org/grpc"

	"tenace.dev/bench/internal/load"
	"tenace.dev/tenace/etcdlock"
)

// The etcd peers, on one cluster:
//
//	tenace-etcd  tenace/etcdlock: one queue entry per etcd lease at a time
//	             (a spare lease granted ahead, or reused after a clean
//	             release), FIFO by create revision, each waiter watching
//	             its predecessor from the revision after its read; fencing
//	             token, loss signal
//	etcd-mutex   etcd's own concurrency.Mutex (client v3.7): the same queue,
//	             on one session (lease) per concurrent caller — a session
//	             holds at most one key of a mutex at a time, so goroutines
//	             cannot share one — kept for the whole run
//
// Both use a lease TTL of etcdWindow.
var etcdImpls = []struct {
	name string
	desc string
	make func(c *clientv3.Client, goroutines int) (load.Locker, error)
}{
	{"tenace-etcd", "tenace/etcdlock: one entry per lease at a time (a spare ahead), waiters watch their predecessor", func(c *clientv3.Client, _ int) (load.Locker, error) {
		return &providerLocker{p: etcdlock.New(c, etcdlock.WithWindow(etcdWindow))}, nil
	}},
	{"etcd-mutex", "etcd's concurrency.Mutex, one session per goroutine", newMutexLocker},
}

// etcdWindow is the lease TTL of both peers (etcdlock.DefaultWindow).
const etcdWindow = etcdlock.DefaultWindow

// etcdFamily is the etcd implementations on one cluster: -etcd with its
// client URLs, or a throwaway one-member etcd.
func etcdFamily() *load.Family {
	f := &load.Family{Name: "etcd", Base: "tenace-etcd", Scenarios: "distinct,hot", Goroutines: "1,8",
		AddrFlag: "etcd", AddrUsage: "etcd client URLs, comma-separated (http://127.0.0.1:2379), for -providers etcd (default: a throwaway one-member etcd)",
		Start: startEtcd}
	for _, i := range etcdImpls {
		f.Impls = append(f.Impls, load.Impl{Name: i.name, Desc: i.desc, Make: func(endpoints string, goroutines, _ int) (load.Locker, error) {
			c, err := newEtcdClient(endpoints)
			if err != nil {
				return nil, err
			}
			l, err := i.make(c, goroutines)
			if err != nil {
				_ = c.Close()
				return nil, err
			}
			return &closingLocker{Locker: l, close: c.Close}, nil
		}})
	}
	return f
}

// newEtcdClient is a client on the comma-separated endpoints, quiet (no
// zap log), with opts added to its gRPC dial.
func newEtcdClient(endpoints string, opts ...grpc.DialOption) (*clientv3.Client, error) {
	return clientv3.New(clientv3.Config{Endpoints: strings.Split(endpoints, ","), DialTimeout: 5 * time.Second,
		DialOptions: opts, Logger: zap.NewNop()})
}

// mutexLocker is concurrency.Mutex behind load.Locker: Do takes a session
// from the pool (one per goroutine of the cell), locks the key's mutex on
// it, runs fn, unlocks, and gives the session back.
type mutexLocker struct{ sessions chan *concurrency.Session }

func newMutexLocker(c *clientv3.Client, goroutines int) (load.Locker, error) {
	m := &mutexLocker{sessions: make(chan *concurrency.Session, max(goroutines, 1))}
	for range cap(m.sessions) {
		s, err := concurrency.NewSession(c, concurrency.WithTTL(int(etcdWindow/time.Second)))
		if err != nil {
			m.Close()
			return nil, err
		}
		m.sessions <- s
	}
	return m, nil
}

func (m *mutexLocker) Do(ctx context.Context, key string, fn func(context.Context) error) error {
	s := <-m.sessions
	defer func() { m.sessions <- s }()
	mu := concurrency.NewMutex(s, "bench/etcd-mutex/"+key)
	if err := mu.Lock(ctx); err != nil {
		return err
	}
	_ = fn(ctx)
	return mu.Unlock(context.WithoutCancel(ctx)) // released as providerLocker releases
}
func (m *mutexLocker) TakesContext() bool { return true }

// Close ends the sessions (revoking their leases).
func (m *mutexLocker) Close() {
	for {
		select {
		case s := <-m.sessions:
			_ = s.Close()
		default:
			return
		}
	}
}

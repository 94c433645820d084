package main

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"

	"tenace.dev/bench/internal/load"
	"tenace.dev/internal/etcdtest"
)

// BenchmarkEtcd measures tenace/etcdlock beside etcd's own
// concurrency.Mutex on one throwaway one-member etcd, in the same run:
//
//	uncontended/<impl>  one goroutine, acquire+release of its own key; also
//	                    the unary requests (round trips) per op — keepalives
//	                    are a stream, not counted
//	handoff/<impl>      8 goroutines on one key, 200µs think time; handoff-µs
//	                    is the mean time from the end of one holder's work to
//	                    the start of a different holder's
//
//	go test ./bench/all -run '^$' -bench Etcd -benchtime 2s
func BenchmarkEtcd(b *testing.B) {
	endpoints := strings.Join(etcdtest.Start(b).Endpoints(), ",")
	for _, impl := range etcdImpls {
		b.Run("uncontended/"+impl.name, func(b *testing.B) {
			var reqs atomic.Int64
			count := grpc.WithChainUnaryInterceptor(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
				reqs.Add(1)
				return invoker(ctx, method, req, reply, cc, opts...)
			})
			c, err := newEtcdClient(endpoints, count)
			require.NoError(b, err)
			defer c.Close()
			l, err := impl.make(c, 1)
			require.NoError(b, err)
			defer l.Close()
			ctx := context.Background()
			require.NoError(b, l.Do(ctx, "u-"+impl.name, load.Noop)) // warm the connection
			reqs.Store(0)
			b.ReportAllocs()
			for b.Loop() {
				if err := l.Do(ctx, "u-"+impl.name, load.Noop); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(reqs.Load())/float64(b.N), "reqs/op")
		})
	}
	for _, impl := range etcdFamily().Impls {
		b.Run("handoff/"+impl.Name, func(b *testing.B) {
			l, err := impl.Make(endpoints, 8, 0)
			require.NoError(b, err)
			defer l.Close()
			handoff(b, l, "h-"+impl.Name)
		})
	}
}

// etcdEndpoints starts a one-member etcd for t: skipped when etcd is not
// installed, failed instead when CI is set (etcdtest.Require).
func etcdEndpoints(t *testing.T) string {
	return strings.Join(etcdtest.Start(t).Endpoints(), ",")
}

// Both etcd peers release a lock they hold even when the operation's
// context ends while they hold it, as the Redis peers do (with the
// context's end cutting the release short, the key stayed held until its
// lease expired, 15s, and the next operation on it waited for that).
func TestEtcdPeersReleaseWhenTheContextEndsWhileHolding(t *testing.T) {
	endpoints := etcdEndpoints(t)
	for _, impl := range etcdFamily().Impls {
		l, err := impl.Make(endpoints, 1, 0)
		require.NoError(t, err, impl.Name)
		key := "ctx-ends-" + impl.Name
		ctx, cancel := context.WithCancel(context.Background())
		require.NoError(t, l.Do(ctx, key, func(context.Context) error { cancel(); return nil }), impl.Name)
		next, stop := context.WithTimeout(context.Background(), 5*time.Second)
		ran := false
		err = l.Do(next, key, func(context.Context) error { ran = true; return nil })
		stop()
		require.NoError(t, err, impl.Name)
		require.True(t, ran, impl.Name)
		l.Close()
	}
}

// The load tool's etcd cells run on a cluster given by address, with
// concurrency.Mutex's sessions shared by no two goroutines at once, and
// never let two holders into one key (the tool exits 1 if one did).
func TestEtcdCellsRunOnAGivenServer(t *testing.T) {
	endpoints := etcdEndpoints(t)
	out, errOut := runCapture(t, []string{"-providers", "etcd", "-etcd", endpoints, "-goroutines", "4", "-duration", "100ms", "-quiet"})
	require.Equal(t, 0, out.code, errOut)
	for _, impl := range etcdImpls {
		require.Regexp(t, `(?m)^`+impl.name+`\s+hot\s+4\s+[1-9]`, out.stdout)
		require.Regexp(t, `(?m)^`+impl.name+`\s+distinct\s+4\s+[1-9]`, out.stdout)
	}
	require.Regexp(t, `(?m)^tenace-etcd\s+hot\s+4\s+\d+\s+1\.00 `, out.stdout, "the base of its family")
}

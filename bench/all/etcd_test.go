package main

import (
	"bufio"
	"context"
	"net/http"
	"strconv"
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
//	                    are a stream, not counted —, the Raft proposals etcd
//	                    committed per op (raft/op), and the CPU per op of
//	                    this process (client-µs/op: the client, the one
//	                    running, as the other's is closed) and of etcd
//	                    (server-µs/op, from its /metrics), steadier than
//	                    the wall clock on a loaded machine
//	uncontended/ratio   tenace-etcd and etcd-mutex, one op of each in turn
//	                    per iteration (the order alternates; see
//	                    sideBySide): each one's median (<impl>-µs) and
//	                    tenace-etcd's ratio to etcd-mutex's
//	                    (tenace-etcd/etcd-mutex) — an op of two Raft
//	                    writes, each with a disk sync, swings from run to
//	                    run by more than the gap the ratio measures, and
//	                    ops timed side by side drift together
//	handoff/<impl>      8 goroutines on one key, 200µs think time; handoff-µs
//	                    is the mean time from the end of one holder's work to
//	                    the start of a different holder's
//
//	go test ./bench/all -run '^$' -bench Etcd -benchtime 2s
func BenchmarkEtcd(b *testing.B) {
	cluster := etcdtest.Start(b)
	endpoints := strings.Join(cluster.Endpoints(), ",")
	warmEtcd(b, endpoints)
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
			server0 := etcdMetrics(b, cluster.Members[0].ClientURL)
			client0 := processCPU()
			b.ReportAllocs()
			for b.Loop() {
				if err := l.Do(ctx, "u-"+impl.name, load.Noop); err != nil {
					b.Fatal(err)
				}
			}
			client1 := processCPU()
			server := etcdMetrics(b, cluster.Members[0].ClientURL)
			n := float64(b.N)
			b.ReportMetric(float64(reqs.Load())/n, "reqs/op")
			b.ReportMetric((server.proposals-server0.proposals)/n, "raft/op")
			if client0 >= 0 && client1 >= 0 {
				b.ReportMetric((client1-client0).Seconds()*1e6/n, "client-µs/op")
			}
			b.ReportMetric((server.cpu-server0.cpu)*1e6/n, "server-µs/op")
		})
	}
	b.Run("uncontended/ratio", func(b *testing.B) { etcdRatio(b, endpoints) })
	for _, impl := range etcdFamily().Impls {
		b.Run("handoff/"+impl.Name, func(b *testing.B) {
			l, err := impl.Make(endpoints, 8, 0)
			require.NoError(b, err)
			defer l.Close()
			handoff(b, l, "h-"+impl.Name)
		})
	}
}

// etcdRatio is BenchmarkEtcd's uncontended/ratio: every etcd peer on a
// client of its own, timed side by side.
func etcdRatio(b *testing.B, endpoints string) {
	ctx := context.Background()
	lockers := make([]load.Locker, len(etcdImpls))
	keys := make([]string, len(etcdImpls))
	for i, impl := range etcdImpls {
		c, err := newEtcdClient(endpoints)
		require.NoError(b, err)
		defer c.Close()
		l, err := impl.make(c, 1)
		require.NoError(b, err)
		defer l.Close()
		keys[i] = "r-" + impl.name
		require.NoError(b, l.Do(ctx, keys[i], load.Noop)) // warm the connection
		lockers[i] = l
	}
	medians := sideBySide(ctx, b, lockers, keys)
	for i, impl := range etcdImpls {
		b.ReportMetric(float64(medians[i].Nanoseconds())/1e3, impl.name+"-µs")
	}
	b.ReportMetric(float64(medians[0])/float64(medians[1]), etcdImpls[0].name+"/"+etcdImpls[1].name)
}

// warmEtcd runs etcdWarmup acquire+release of each implementation on the
// fresh cluster before any is measured: the first second of a new etcd
// and of this process (heaps growing, the first backend commits) would
// otherwise fall on whichever implementation runs first.
func warmEtcd(b *testing.B, endpoints string) {
	for _, impl := range etcdImpls {
		c, err := newEtcdClient(endpoints)
		require.NoError(b, err)
		l, err := impl.make(c, 1)
		require.NoError(b, err)
		for range etcdWarmup {
			require.NoError(b, l.Do(context.Background(), "warm-"+impl.name, load.Noop))
		}
		l.Close()
		require.NoError(b, c.Close())
	}
}

// etcdWarmup is warmEtcd's count per implementation (about a second of
// each on this host).
const etcdWarmup = 500

// serverCounters are counters of an etcd member, read from its /metrics.
type serverCounters struct {
	cpu       float64 // process_cpu_seconds_total
	proposals float64 // etcd_server_proposals_committed_total
}

// etcdMetrics reads the counters of the member at url.
func etcdMetrics(b *testing.B, url string) serverCounters {
	resp, err := http.Get(url + "/metrics")
	require.NoError(b, err)
	defer resp.Body.Close()
	var c serverCounters
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		name, value, ok := strings.Cut(sc.Text(), " ")
		if !ok {
			continue
		}
		switch name {
		case "process_cpu_seconds_total":
			c.cpu, err = strconv.ParseFloat(value, 64)
		case "etcd_server_proposals_committed_total":
			c.proposals, err = strconv.ParseFloat(value, 64)
		}
		require.NoError(b, err)
	}
	require.NoError(b, sc.Err())
	return c
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

package oteltenace_test

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"tenace.dev/tenace"
	"tenace.dev/tenace/oteltenace"
)

var shared = oteltenace.ModeKey.String("shared")

// TestTheLockMetricsSayTheMode: readers and a writer of one key, each
// measurement in the series of its mode — the writer waiting beside two
// readers is one exclusive waiter, the readers' waits and holds are
// shared ones.
func TestTheLockMetricsSayTheMode(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newSDK(t)
		p := tenace.NewMemoryLockProvider()
		defer p.Close()
		tel := s.telemetry()
		read := tenace.NewPolicy().WithLock(tenace.LockOptions{Provider: p, Key: "cfg", Shared: true}).OnEvent(tel.Listen)
		write := tenace.NewPolicy().WithLock(tenace.LockOptions{Provider: p, Key: "cfg"}).OnEvent(tel.Listen)

		// Two readers hold cfg for 2 s; a writer waits for them.
		readers, writer := make(chan error, 2), make(chan error, 1)
		for range 2 {
			go func() {
				readers <- read.Execute(bg, func(context.Context) error { time.Sleep(2 * time.Second); return nil })
			}()
		}
		synctest.Wait()
		go func() {
			writer <- write.Execute(bg, func(context.Context) error { time.Sleep(time.Second); return nil })
		}()
		synctest.Wait()
		// A failed check below must not leave the bubble's goroutines
		// blocked: the defer lets them finish (fake time runs on).
		finished := false
		defer func() {
			if !finished {
				<-readers
				<-readers
				<-writer
			}
		}()
		m := s.collect(t)
		require.Equal(t, int64(1), sum(t, m["tenace.lock.waiting"], exclusive), "the writer waits")
		require.Equal(t, int64(0), sum(t, m["tenace.lock.waiting"], attribute.NewSet(shared)), "no reader waits")
		require.Equal(t, int64(2), sum(t, m["tenace.lock.acquisitions"], attribute.NewSet(shared, oteltenace.OutcomeKey.String("acquired"))))
		r1, r2, w := <-readers, <-readers, <-writer
		finished = true
		require.NoError(t, r1)
		require.NoError(t, r2)
		require.NoError(t, w)

		m = s.collect(t)
		wait := m["tenace.lock.wait.duration"]
		require.Equal(t, 2.0, histogram(t, wait, outcome("acquired")).Sum, "the writer waited for the readers")
		require.Equal(t, uint64(2), histogram(t, wait, attribute.NewSet(shared, oteltenace.OutcomeKey.String("acquired"))).Count)
		hold := m["tenace.lock.hold.duration"]
		sh := histogram(t, hold, attribute.NewSet(shared))
		require.Equal(t, [2]float64{2, 4}, [2]float64{float64(sh.Count), sh.Sum}, "two readers held 2 s each")
		require.Equal(t, 1.0, histogram(t, hold, exclusive).Sum, "the writer held 1 s")
		require.Equal(t, int64(1), sum(t, m["tenace.lock.acquisitions"], outcome("acquired")))
		require.Equal(t, int64(0), sum(t, m["tenace.lock.waiting"], exclusive))
	})
}

// TestTheModeWithTheLockKeyAndName: with WithLockKey and WithName the
// mode is still on every lock measurement, beside the key and the name.
func TestTheModeWithTheLockKeyAndName(t *testing.T) {
	s := newSDK(t)
	p := tenace.NewMemoryLockProvider()
	defer p.Close()
	tel := s.telemetry(oteltenace.WithLockKey(), oteltenace.WithName("exports"))
	pol := tenace.NewPolicy().WithLock(tenace.LockOptions{Provider: p, Key: "c42", Shared: true, Permits: 5}).OnEvent(tel.Listen)
	require.NoError(t, pol.Execute(bg, noop))
	m := s.collect(t)
	set := attribute.NewSet(shared, oteltenace.NameKey.String("exports"), oteltenace.LockKeyKey.String("c42"))
	require.Equal(t, uint64(1), histogram(t, m["tenace.lock.hold.duration"], set).Count)
	require.Equal(t, int64(0), sum(t, m["tenace.lock.waiting"], set))
	acquired := attribute.NewSet(shared, oteltenace.NameKey.String("exports"), oteltenace.LockKeyKey.String("c42"), oteltenace.OutcomeKey.String("acquired"))
	require.Equal(t, int64(1), sum(t, m["tenace.lock.acquisitions"], acquired))
}

// TestSpanEventsSayTheModeAndPermits: a bulkhead's span events carry
// mode shared and its permit count; a reader's the mode without a
// count; a writer's mode exclusive; the timeout event neither.
func TestSpanEventsSayTheModeAndPermits(t *testing.T) {
	s := newSDK(t)
	tel := s.telemetry()
	p := tenace.NewMemoryLockProvider()
	defer p.Close()
	for _, o := range []tenace.LockOptions{
		{Provider: p, Key: "bulk", Shared: true, Permits: 5},
		{Provider: p, Key: "rw", Shared: true},
		{Provider: p, Key: "rw"},
	} {
		require.NoError(t, tel.Instrument(tenace.NewPolicy().WithLock(o)).Execute(bg, noop))
	}
	require.Error(t, tel.Instrument(tenace.NewPolicy().WithTimeout(time.Nanosecond)).Execute(bg, func(ctx context.Context) error {
		<-ctx.Done()
		return ctx.Err()
	}))
	spans := s.spans.Ended()
	require.Len(t, spans, 4)
	for i, want := range []struct {
		mode    string
		permits int64
	}{{"shared", 5}, {"shared", 0}, {"exclusive", 0}} {
		require.Equal(t, []string{"lock.acquiring", "lock.acquired", "lock.released"}, eventNames(spans[i]))
		for _, e := range spans[i].Events() {
			mode, ok := attrOf(e.Attributes, oteltenace.ModeKey)
			require.True(t, ok, "span %d, %s: a mode", i, e.Name)
			require.Equal(t, want.mode, mode.AsString(), "span %d, %s", i, e.Name)
			permits, ok := attrOf(e.Attributes, oteltenace.PermitsKey)
			require.Equal(t, want.permits != 0, ok, "span %d, %s: permits iff a count", i, e.Name)
			require.Equal(t, want.permits, permits.AsInt64(), "span %d, %s", i, e.Name)
		}
	}
	require.Equal(t, []string{"timeout"}, eventNames(spans[3]))
	_, ok := attrOf(spans[3].Events()[0].Attributes, oteltenace.ModeKey)
	require.False(t, ok, "a timeout has no lock, and no mode")
}

func TestObserveStatsReportsThePermitsInUse(t *testing.T) {
	s := newSDK(t)
	p := tenace.NewMemoryLockProvider()
	defer p.Close()
	reg, err := oteltenace.ObserveStats(s.meters, p)
	require.NoError(t, err)
	defer func() { require.NoError(t, reg.Unregister()) }()
	gauges := func() map[string]int64 {
		out := map[string]int64{}
		for name, m := range s.collect(t) {
			g, ok := m.Data.(metricdata.Gauge[int64])
			require.True(t, ok, "%s is a %T", name, m.Data)
			require.Len(t, g.DataPoints, 1)
			out[name] = g.DataPoints[0].Value
		}
		return out
	}
	bulk := tenace.LockAcquireOptions{Shared: true, Permits: 3}
	var leases []tenace.LockLease
	for range 3 {
		l, err := p.Acquire(bg, "bulk", bulk)
		require.NoError(t, err)
		leases = append(leases, l)
	}
	w, err := p.Acquire(bg, "w", tenace.LockAcquireOptions{})
	require.NoError(t, err)
	require.Equal(t, map[string]int64{
		"tenace.provider.held":           2,
		"tenace.provider.waiting":        0,
		"tenace.provider.longest_queue":  0,
		"tenace.provider.shared.keys":    1,
		"tenace.provider.shared.holders": 3,
		"tenace.provider.shared.waiting": 0,
	}, gauges())
	for _, l := range append(leases, w) {
		require.NoError(t, l.Release(bg))
	}
	require.NoError(t, tenace.NewPolicy().WithLock(tenace.LockOptions{Provider: p, Key: "bulk"}).Execute(bg, noop),
		"a writer gets the key: every permit came back")
	require.Equal(t, map[string]int64{
		"tenace.provider.held":           0,
		"tenace.provider.waiting":        0,
		"tenace.provider.longest_queue":  0,
		"tenace.provider.shared.keys":    0,
		"tenace.provider.shared.holders": 0,
		"tenace.provider.shared.waiting": 0,
	}, gauges())
}

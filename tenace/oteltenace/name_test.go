package oteltenace_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"tenace.dev/tenace"
	"tenace.dev/tenace/oteltenace"
)

func named(name string, kvs ...attribute.KeyValue) attribute.Set {
	return attribute.NewSet(append(kvs, oteltenace.NameKey.String(name))...)
}

// dataPoints returns the attribute sets of every data point of m.
func dataPoints(t *testing.T, m metricdata.Metrics) []attribute.Set {
	t.Helper()
	var out []attribute.Set
	switch d := m.Data.(type) {
	case metricdata.Histogram[float64]:
		for _, dp := range d.DataPoints {
			out = append(out, dp.Attributes)
		}
	case metricdata.Sum[int64]:
		for _, dp := range d.DataPoints {
			out = append(out, dp.Attributes)
		}
	default:
		t.Fatalf("%s is a %T", m.Name, m.Data)
	}
	return out
}

// Two policies of one service, each with a Telemetry of its own name on the
// same providers: every measurement, span and span event says whose it is.
func TestANameLabelsEveryMeasurementAndTheSpan(t *testing.T) {
	s := newSDK(t)
	p := tenace.NewMemoryLockProvider()
	defer p.Close()
	reports := s.telemetry(oteltenace.WithName("reports")).Instrument(tenace.NewPolicy().
		WithLock(tenace.LockOptions{Provider: p, Key: "reports", Timeout: tenace.NoWait}))
	lease := &losableLease{}
	fp := &fakeProvider{acquire: func() (tenace.LockLease, error) { return lease, nil }}
	migrations := s.telemetry(oteltenace.WithName("migrations")).Instrument(tenace.NewPolicy().
		WithTimeout(time.Hour).WithLock(tenace.LockOptions{Provider: fp, Key: "migrations"}))

	require.NoError(t, reports.Execute(bg, func(ctx context.Context) error {
		var nae *tenace.LockNotAcquiredError
		require.ErrorAs(t, reports.Execute(bg, noop), &nae) // held, for another caller: rejected
		return nil
	}))
	require.ErrorIs(t, migrations.Execute(bg, func(ctx context.Context) error {
		lease.Lose(errors.New("renewal found another holder"))
		<-ctx.Done()
		return context.Cause(ctx)
	}), tenace.ErrLeaseLost)
	require.Error(t, s.telemetry(oteltenace.WithName("migrations")).Instrument(tenace.NewPolicy().WithTimeout(time.Nanosecond)).
		Execute(bg, func(ctx context.Context) error { <-ctx.Done(); return ctx.Err() }))

	m := s.collect(t)
	wait := m["tenace.lock.wait.duration"]
	require.Equal(t, uint64(1), histogram(t, wait, named("reports", excl, oteltenace.OutcomeKey.String("acquired"))).Count)
	require.Equal(t, uint64(1), histogram(t, wait, named("reports", excl, oteltenace.OutcomeKey.String("rejected"))).Count)
	require.Equal(t, uint64(1), histogram(t, wait, named("migrations", excl, oteltenace.OutcomeKey.String("acquired"))).Count)
	require.Equal(t, uint64(1), histogram(t, m["tenace.lock.hold.duration"], named("reports", excl)).Count)
	require.Equal(t, uint64(1), histogram(t, m["tenace.lock.hold.duration"], named("migrations", excl)).Count)
	require.Equal(t, int64(1), sum(t, m["tenace.lock.acquisitions"], named("reports", excl, oteltenace.OutcomeKey.String("rejected"))))
	require.Equal(t, int64(1), sum(t, m["tenace.lock.lost"], named("migrations", excl)))
	require.Equal(t, int64(0), sum(t, m["tenace.lock.waiting"], named("reports", excl)))
	require.Equal(t, int64(1), sum(t, m["tenace.timeouts"], named("migrations")))
	for name, metric := range m {
		for _, set := range dataPoints(t, metric) {
			v, ok := set.Value(oteltenace.NameKey)
			require.True(t, ok, "%s: a data point without the name", name)
			require.Contains(t, []string{"reports", "migrations"}, v.AsString(), name)
			_, keyed := set.Value(oteltenace.LockKeyKey)
			require.False(t, keyed, "%s: the key only with WithLockKey", name)
		}
	}

	spans := s.spans.Ended()
	require.Len(t, spans, 4)
	var names []string
	for _, sp := range spans {
		names = append(names, sp.Name())
		v, ok := attrOf(sp.Attributes(), oteltenace.NameKey)
		require.True(t, ok, sp.Name())
		require.Equal(t, sp.Name(), "tenace.execute "+v.AsString())
		for _, e := range sp.Events() {
			ev, ok := attrOf(e.Attributes, oteltenace.NameKey)
			require.True(t, ok, "span event %s", e.Name)
			require.Equal(t, v, ev)
		}
	}
	require.ElementsMatch(t, []string{"tenace.execute reports", "tenace.execute reports", "tenace.execute migrations", "tenace.execute migrations"}, names)
}

// With the lock key too, a measurement carries both, and the Execute span
// both attributes.
func TestANameWithTheLockKey(t *testing.T) {
	s := newSDK(t)
	p := tenace.NewMemoryLockProvider()
	defer p.Close()
	pol := s.telemetry(oteltenace.WithName("reports"), oteltenace.WithLockKey()).
		Instrument(tenace.NewPolicy().WithLock(tenace.LockOptions{Provider: p}))
	require.NoError(t, pol.Execute(bg, noop, tenace.WithKey("nightly")))
	require.NoError(t, pol.Execute(bg, noop, tenace.WithKey("weekly")))

	m := s.collect(t)
	key := oteltenace.LockKeyKey.String
	acquired := oteltenace.OutcomeKey.String("acquired")
	require.Equal(t, uint64(1), histogram(t, m["tenace.lock.wait.duration"], named("reports", excl, key("nightly"), acquired)).Count)
	require.Equal(t, uint64(1), histogram(t, m["tenace.lock.hold.duration"], named("reports", excl, key("weekly"))).Count)
	require.Equal(t, int64(0), sum(t, m["tenace.lock.waiting"], named("reports", excl, key("nightly"))))
	spans := s.spans.Ended()
	require.Len(t, spans, 2)
	require.Equal(t, "tenace.execute reports", spans[0].Name())
	k, _ := attrOf(spans[0].Attributes(), "tenace.key")
	require.Equal(t, "nightly", k.AsString())
	k, _ = attrOf(spans[1].Attributes(), "tenace.key")
	require.Equal(t, "weekly", k.AsString(), "each span its own key")
	n, _ := attrOf(spans[1].Attributes(), oteltenace.NameKey)
	require.Equal(t, "reports", n.AsString())
}

// An empty name is no name.
func TestAnEmptyNameIsNone(t *testing.T) {
	s := newSDK(t)
	p := tenace.NewMemoryLockProvider()
	defer p.Close()
	require.NoError(t, s.telemetry(oteltenace.WithName("")).Instrument(tenace.NewPolicy().
		WithLock(tenace.LockOptions{Provider: p, Key: "k"})).Execute(bg, noop))
	m := s.collect(t)
	require.Equal(t, uint64(1), histogram(t, m["tenace.lock.hold.duration"], exclusive).Count)
	spans := s.spans.Ended()
	require.Len(t, spans, 1)
	require.Equal(t, "tenace.execute", spans[0].Name())
	_, ok := attrOf(spans[0].Attributes(), oteltenace.NameKey)
	require.False(t, ok)
}

package oteltenace_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.uber.org/goleak"

	"tenace.dev/tenace"
	"tenace.dev/tenace/oteltenace"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var bg = context.Background()

func noop(context.Context) error { return nil }

// sdk is the real OpenTelemetry SDK with its in-memory readers.
type sdk struct {
	reader *sdkmetric.ManualReader
	meters *sdkmetric.MeterProvider
	spans  *tracetest.SpanRecorder
	traces *sdktrace.TracerProvider
}

func newSDK(t *testing.T) *sdk {
	s := &sdk{reader: sdkmetric.NewManualReader(), spans: tracetest.NewSpanRecorder()}
	s.meters = sdkmetric.NewMeterProvider(sdkmetric.WithReader(s.reader))
	s.traces = sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(s.spans))
	t.Cleanup(func() {
		require.NoError(t, s.meters.Shutdown(bg))
		require.NoError(t, s.traces.Shutdown(bg))
	})
	return s
}

func (s *sdk) telemetry(opts ...oteltenace.Option) *oteltenace.Telemetry {
	return oteltenace.New(append([]oteltenace.Option{oteltenace.WithMeterProvider(s.meters), oteltenace.WithTracerProvider(s.traces)}, opts...)...)
}

// collect reads every metric of the tenace scope, by name.
func (s *sdk) collect(t *testing.T) map[string]metricdata.Metrics {
	t.Helper()
	var rm metricdata.ResourceMetrics
	require.NoError(t, s.reader.Collect(bg, &rm))
	out := map[string]metricdata.Metrics{}
	for _, sm := range rm.ScopeMetrics {
		require.Equal(t, oteltenace.ScopeName, sm.Scope.Name)
		for _, m := range sm.Metrics {
			out[m.Name] = m
		}
	}
	return out
}

// excl is the mode of an exclusive Lock's measurements, exclusive their
// attributes without a name or key.
var (
	excl      = oteltenace.ModeKey.String("exclusive")
	exclusive = attribute.NewSet(excl)
)

// outcome is the attribute set of an exclusive Lock's wait that ended with o.
func outcome(o string) attribute.Set {
	return attribute.NewSet(excl, oteltenace.OutcomeKey.String(o))
}

// histogram returns the data point of a float histogram with the attributes.
func histogram(t *testing.T, m metricdata.Metrics, attrs attribute.Set) metricdata.HistogramDataPoint[float64] {
	t.Helper()
	h, ok := m.Data.(metricdata.Histogram[float64])
	require.True(t, ok, "%s is a %T", m.Name, m.Data)
	for _, dp := range h.DataPoints {
		if dp.Attributes.Equals(&attrs) {
			return dp
		}
	}
	t.Fatalf("%s has no data point with %v", m.Name, attrs.Encoded(attribute.DefaultEncoder()))
	return metricdata.HistogramDataPoint[float64]{}
}

// sum returns the value of an int sum's data point with the attributes.
func sum(t *testing.T, m metricdata.Metrics, attrs attribute.Set) int64 {
	t.Helper()
	s, ok := m.Data.(metricdata.Sum[int64])
	require.True(t, ok, "%s is a %T", m.Name, m.Data)
	for _, dp := range s.DataPoints {
		if dp.Attributes.Equals(&attrs) {
			return dp.Value
		}
	}
	t.Fatalf("%s has no data point with %v", m.Name, attrs.Encoded(attribute.DefaultEncoder()))
	return 0
}

// fakeProvider is a LockProvider whose answers the test programs, for the
// outcomes the memory provider cannot produce on demand (a failure, a
// lost lease).
type fakeProvider struct {
	acquire func() (tenace.LockLease, error)
}

func (p *fakeProvider) Acquire(context.Context, string, tenace.LockAcquireOptions) (tenace.LockLease, error) {
	return p.acquire()
}

// losableLease is a lease the test loses at will, with fencing token 9.
type losableLease struct{ tenace.LeaseSignal }

func (*losableLease) Release(context.Context) error { return nil }
func (*losableLease) Token() uint64                 { return 9 }

// fixedStats is a StatsProvider reporting what the test sets.
type fixedStats struct{ s tenace.LockStats }

func (f *fixedStats) Stats() tenace.LockStats { return f.s }

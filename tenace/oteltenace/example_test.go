package oteltenace_test

import (
	"context"
	"fmt"
	"log"
	"slices"

	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"tenace.dev/tenace"
	"tenace.dev/tenace/oteltenace"
)

// Instrument a policy, run a call that holds a lock and a nested one that
// is rejected, and read what a dashboard would show. A ManualReader stands
// in for the exporter an application configures (OTLP, Prometheus).
func Example() {
	ctx := context.Background()
	reader := sdkmetric.NewManualReader()
	meters := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer func() { _ = meters.Shutdown(ctx) }()

	tel := oteltenace.New(oteltenace.WithMeterProvider(meters))
	provider := tenace.NewMemoryLockProvider()
	defer provider.Close()
	p := tel.Instrument(tenace.NewPolicy().
		WithLock(tenace.LockOptions{Provider: provider, Key: "reports", Timeout: tenace.NoWait}))

	_ = p.Execute(ctx, func(context.Context) error {
		// Another caller (not this execution: that would be a deadlock)
		// while "reports" is held: rejected.
		return p.Execute(ctx, func(context.Context) error { return nil })
	})

	var rm metricdata.ResourceMetrics
	if err := reader.Collect(ctx, &rm); err != nil {
		log.Fatal(err)
	}
	for _, m := range rm.ScopeMetrics[0].Metrics {
		var lines []string
		switch d := m.Data.(type) {
		case metricdata.Histogram[float64]:
			for _, dp := range d.DataPoints {
				lines = append(lines, fmt.Sprintf("%s (%s)%s count=%d", m.Name, m.Unit, attrs(dp.Attributes), dp.Count))
			}
		case metricdata.Sum[int64]:
			for _, dp := range d.DataPoints {
				lines = append(lines, fmt.Sprintf("%s (%s)%s %d", m.Name, m.Unit, attrs(dp.Attributes), dp.Value))
			}
		}
		slices.Sort(lines)
		for _, l := range lines {
			fmt.Println(l)
		}
	}
	// Output:
	// tenace.lock.wait.duration (s) mode=exclusive outcome=acquired count=1
	// tenace.lock.wait.duration (s) mode=exclusive outcome=rejected count=1
	// tenace.lock.hold.duration (s) mode=exclusive count=1
	// tenace.lock.acquisitions ({acquisition}) mode=exclusive outcome=acquired 1
	// tenace.lock.acquisitions ({acquisition}) mode=exclusive outcome=rejected 1
	// tenace.lock.waiting ({caller}) mode=exclusive 0
}

func attrs(s attribute.Set) string {
	var out string
	if v, ok := s.Value(oteltenace.ModeKey); ok {
		out += " mode=" + v.AsString()
	}
	if v, ok := s.Value(oteltenace.OutcomeKey); ok {
		out += " outcome=" + v.AsString()
	}
	return out
}

// The listener alone records the metrics, and adds the lock's events to the
// span the caller's context carries (an HTTP server span, say), with no span
// of its own. New without options uses the global providers, which an
// application sets with otel.SetMeterProvider and otel.SetTracerProvider.
func ExampleTelemetry_Listen() {
	tel := oteltenace.New()
	p := tenace.NewPolicy().WithLock(tenace.LockOptions{Key: "nightly-report"}).OnEvent(tel.Listen)
	_ = p.Execute(context.Background(), func(context.Context) error { return nil })
}

// ObserveStats turns a provider's statistics into gauges, for a provider
// that reports them (tenace.StatsProvider).
func ExampleObserveStats() {
	provider := tenace.NewMemoryLockProvider()
	defer provider.Close()
	if sp, ok := any(provider).(tenace.StatsProvider); ok {
		reg, err := oteltenace.ObserveStats(nil, sp, attribute.String("tenace.provider", "jobs"))
		if err != nil {
			log.Fatal(err)
		}
		defer func() { _ = reg.Unregister() }()
	}
}

// Two locks of one service, told apart by name: each policy gets a
// Telemetry of its own name, which labels its metrics (tenace.policy.name)
// and names its spans. The names are constants of the program, so the
// number of series stays bounded whatever keys the locks take.
func ExampleWithName() {
	ctx := context.Background()
	reader := sdkmetric.NewManualReader()
	meters := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer func() { _ = meters.Shutdown(ctx) }()
	spans := tracetest.NewSpanRecorder()
	tracers := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	defer func() { _ = tracers.Shutdown(ctx) }()

	provider := tenace.NewMemoryLockProvider()
	defer provider.Close()
	instrument := func(name string, p tenace.Policy) tenace.Policy {
		tel := oteltenace.New(oteltenace.WithName(name),
			oteltenace.WithMeterProvider(meters), oteltenace.WithTracerProvider(tracers))
		return tel.Instrument(p)
	}
	reports := instrument("reports", tenace.NewPolicy().WithLock(tenace.LockOptions{Provider: provider}))
	migrations := instrument("migrations", tenace.NewPolicy().WithLock(tenace.LockOptions{Provider: provider, Key: "schema"}))

	for _, customer := range []string{"customer-1", "customer-2"} {
		_ = reports.Execute(ctx, func(context.Context) error { return nil }, tenace.WithKey(customer))
	}
	_ = migrations.Execute(ctx, func(context.Context) error { return nil })

	for _, s := range spans.Ended() {
		fmt.Println("span:", s.Name())
	}
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(ctx, &rm); err != nil {
		log.Fatal(err)
	}
	var lines []string
	for _, m := range rm.ScopeMetrics[0].Metrics {
		if h, ok := m.Data.(metricdata.Histogram[float64]); ok && m.Name == "tenace.lock.hold.duration" {
			for _, dp := range h.DataPoints {
				name, _ := dp.Attributes.Value(oteltenace.NameKey)
				lines = append(lines, fmt.Sprintf("%s name=%s count=%d", m.Name, name.AsString(), dp.Count))
			}
		}
	}
	slices.Sort(lines)
	for _, l := range lines {
		fmt.Println(l)
	}
	// Output:
	// span: tenace.execute reports
	// span: tenace.execute reports
	// span: tenace.execute migrations
	// tenace.lock.hold.duration name=migrations count=1
	// tenace.lock.hold.duration name=reports count=2
}

// A keyed bulkhead, "at most 5 exports per customer": ObserveStats reports
// its permits in use (tenace.provider.shared.holders), and the lock
// metrics of its Lock carry mode=shared, apart from the writers' and other
// exclusive locks' series.
func ExampleObserveStats_permits() {
	ctx := context.Background()
	reader := sdkmetric.NewManualReader()
	meters := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer func() { _ = meters.Shutdown(ctx) }()
	provider := tenace.NewMemoryLockProvider()
	defer provider.Close()
	reg, err := oteltenace.ObserveStats(meters, provider)
	if err != nil {
		log.Fatal(err)
	}
	defer func() { _ = reg.Unregister() }()

	export := tenace.LockOptions{Provider: provider, Key: "exports:customer-42", Shared: true, Permits: 5}
	for range 2 { // two exports already running
		l, _ := provider.Acquire(ctx, export.Key, tenace.LockAcquireOptions{Shared: true, Permits: 5})
		defer func() { _ = l.Release(ctx) }()
	}
	p := oteltenace.New(oteltenace.WithMeterProvider(meters)).Instrument(tenace.NewPolicy().WithLock(export))
	show := func(prefix string) {
		var rm metricdata.ResourceMetrics
		if err := reader.Collect(ctx, &rm); err != nil {
			log.Fatal(err)
		}
		var lines []string
		for _, m := range rm.ScopeMetrics[0].Metrics {
			switch d := m.Data.(type) {
			case metricdata.Gauge[int64]:
				for _, dp := range d.DataPoints {
					lines = append(lines, fmt.Sprintf("%s%s %d", prefix, m.Name, dp.Value))
				}
			case metricdata.Sum[int64]:
				for _, dp := range d.DataPoints {
					lines = append(lines, fmt.Sprintf("%s%s%s %d", prefix, m.Name, attrs(dp.Attributes), dp.Value))
				}
			}
		}
		slices.Sort(lines)
		for _, l := range lines {
			fmt.Println(l)
		}
	}
	_ = p.Execute(ctx, func(context.Context) error {
		show("during the third export: ")
		return nil
	})
	// Output:
	// during the third export: tenace.lock.acquisitions mode=shared outcome=acquired 1
	// during the third export: tenace.lock.waiting mode=shared 0
	// during the third export: tenace.provider.held 1
	// during the third export: tenace.provider.longest_queue 0
	// during the third export: tenace.provider.shared.holders 3
	// during the third export: tenace.provider.shared.keys 1
	// during the third export: tenace.provider.shared.waiting 0
	// during the third export: tenace.provider.waiting 0
}

package oteltenace_test

import (
	"context"
	"testing"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"tenace.dev/tenace"
	"tenace.dev/tenace/oteltenace"
)

// BenchmarkExecute is tenace's BenchmarkExecute/lock (uncontended, memory
// provider) without a listener, then with the OpenTelemetry listener on the
// real SDK (a ManualReader, as an exporter's reader would be), with the
// lock key, and with a span per Execute as well (recorded, not exported);
// then the listener and the span with a name (WithName).
func BenchmarkExecute(b *testing.B) {
	p := tenace.NewMemoryLockProvider()
	defer p.Close()
	meters := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
	defer func() { _ = meters.Shutdown(context.Background()) }()
	traces := sdktrace.NewTracerProvider()
	defer func() { _ = traces.Shutdown(context.Background()) }()
	lock := tenace.NewPolicy().WithLock(tenace.LockOptions{Provider: p, Key: "k"})
	tel := oteltenace.New(oteltenace.WithMeterProvider(meters), oteltenace.WithTracerProvider(traces))
	keyed := oteltenace.New(oteltenace.WithMeterProvider(meters), oteltenace.WithTracerProvider(traces), oteltenace.WithLockKey())
	named := oteltenace.New(oteltenace.WithMeterProvider(meters), oteltenace.WithTracerProvider(traces), oteltenace.WithName("reports"))
	for _, bc := range []struct {
		name string
		pol  tenace.Policy
	}{
		{"lock", lock},
		{"lock+otel", lock.OnEvent(tel.Listen)},
		{"lock+otel+key", lock.OnEvent(keyed.Listen)},
		{"lock+otel+span", tel.Instrument(lock)},
		{"lock+otel+name", lock.OnEvent(named.Listen)},
		{"lock+otel+name+span", named.Instrument(lock)},
	} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				_ = bc.pol.Execute(context.Background(), noop)
			}
		})
	}
}

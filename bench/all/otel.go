package main

import (
	"context"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"tenace.dev/bench/internal/load"
	"tenace.dev/tenace"
	"tenace.dev/tenace/oteltenace"
)

// otelImpl is the pipeline implementation with oteltenace's listener
// recording into the real OpenTelemetry SDK: beside "pipeline" in a table it
// shows what the listener costs under load, and the metrics it recorded show
// what a dashboard would. -otel runs both.
const otelImpl = "pipeline+otel"

type otelLocker struct {
	load.PipelineLocker
	reader *sdkmetric.ManualReader
	meters *sdkmetric.MeterProvider
}

func newOtelLocker(_ string, _, shards int) (load.Locker, error) {
	p := load.NewMemoryProvider(shards)
	reader := sdkmetric.NewManualReader()
	meters := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	tel := oteltenace.New(oteltenace.WithMeterProvider(meters))
	pol := tenace.NewPolicy().WithLock(tenace.LockOptions{Provider: p}).OnEvent(tel.Listen)
	return &otelLocker{PipelineLocker: load.PipelineLocker{P: p, Policy: pol}, reader: reader, meters: meters}, nil
}

// Close shuts the meters down, then closes.
func (o *otelLocker) Close() {
	_ = o.meters.Shutdown(context.Background())
	o.PipelineLocker.Close()
}

// Summary collects what the cell recorded and writes it as a dashboard
// would summarise it: counters and up-down counters by attribute,
// histograms as count, mean, max and quantiles read from the buckets (the
// bucket's upper bound: all an exporter's histogram tells).
func (o *otelLocker) Summary(cell string) string {
	var rm metricdata.ResourceMetrics
	if err := o.reader.Collect(context.Background(), &rm); err != nil {
		return fmt.Sprintf("OpenTelemetry metrics of %s: collecting them failed: %v\n", cell, err)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "OpenTelemetry metrics recorded by %s (cumulative over the cell):\n", cell)
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			for _, line := range metricLines(m) {
				fmt.Fprintf(&b, "  %-28s %-15s %s\n", m.Name, "("+m.Unit+")", line)
			}
		}
	}
	return b.String()
}

func metricLines(m metricdata.Metrics) []string {
	var lines []string
	switch d := m.Data.(type) {
	case metricdata.Sum[int64]:
		for _, dp := range d.DataPoints {
			lines = append(lines, fmt.Sprintf("%-10s %d", attrsOf(dp.Attributes), dp.Value))
		}
	case metricdata.Histogram[float64]:
		for _, dp := range d.DataPoints {
			line := fmt.Sprintf("%-10s count %d", attrsOf(dp.Attributes), dp.Count)
			if dp.Count > 0 {
				line += fmt.Sprintf("  mean %s  p50 ≤ %s  p99 ≤ %s  p99.9 ≤ %s", seconds(dp.Sum/float64(dp.Count)),
					bucketQuantile(dp, 0.5), bucketQuantile(dp, 0.99), bucketQuantile(dp, 0.999))
				if max, ok := dp.Max.Value(); ok {
					line += "  max " + seconds(max)
				}
			}
			lines = append(lines, line)
		}
	}
	slices.Sort(lines)
	return lines
}

func attrsOf(s attribute.Set) string {
	var parts []string
	for _, kv := range s.ToSlice() {
		parts = append(parts, strings.TrimPrefix(string(kv.Key), "tenace.lock.")+"="+kv.Value.String())
	}
	if len(parts) == 0 {
		return "-"
	}
	return strings.Join(parts, ",")
}

// bucketQuantile is the upper bound of the bucket that holds quantile q.
func bucketQuantile(dp metricdata.HistogramDataPoint[float64], q float64) string {
	rank := uint64(math.Ceil(q * float64(dp.Count)))
	var seen uint64
	for i, n := range dp.BucketCounts {
		seen += n
		if seen >= rank {
			if i < len(dp.Bounds) {
				return seconds(dp.Bounds[i])
			}
			return "+Inf"
		}
	}
	return "+Inf"
}

func seconds(s float64) string { return load.Dur(time.Duration(s * float64(time.Second))) }

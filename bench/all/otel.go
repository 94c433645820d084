package main

import (
	"context"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"tenace.dev/tenace"
	"tenace.dev/tenace/oteltenace"
)

// otelImpl is the pipeline implementation with oteltenace's listener
// recording into the real OpenTelemetry SDK: beside "pipeline" in a table it
// shows what the listener costs under load, and the metrics it recorded show
// what a dashboard would. -otel runs both.
const otelImpl = "pipeline+otel"

func init() {
	impls = append(impls, struct {
		name string
		desc string
		make func(shards int) Locker
	}{otelImpl, "pipeline with the oteltenace listener on the OpenTelemetry SDK (ManualReader)", newOtelLocker})
}

// lastOtel holds the metrics the last pipeline+otel locker collected when it
// was closed; run takes them after each such cell. (runCell owns the
// locker's life, so the metrics come back this way.)
var lastOtel atomic.Pointer[metricdata.ResourceMetrics]

type otelLocker struct {
	pipelineLocker
	reader *sdkmetric.ManualReader
	meters *sdkmetric.MeterProvider
}

func newOtelLocker(shards int) Locker {
	var opts []tenace.MemoryOption
	if shards > 0 {
		opts = append(opts, tenace.WithShards(shards))
	}
	p := tenace.NewMemoryLockProvider(opts...)
	reader := sdkmetric.NewManualReader()
	meters := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	tel := oteltenace.New(oteltenace.WithMeterProvider(meters))
	pol := tenace.NewPolicy().WithLock(tenace.LockOptions{Provider: p}).OnEvent(tel.Listen)
	return &otelLocker{pipelineLocker: pipelineLocker{p: p, pol: pol}, reader: reader, meters: meters}
}

// Close collects what the run recorded, then closes.
func (o *otelLocker) Close() {
	var rm metricdata.ResourceMetrics
	if err := o.reader.Collect(context.Background(), &rm); err == nil {
		lastOtel.Store(&rm)
	}
	_ = o.meters.Shutdown(context.Background())
	o.pipelineLocker.Close()
}

// otelReport is the metrics of one pipeline+otel cell.
type otelReport struct {
	label string
	rm    *metricdata.ResourceMetrics
}

// printOtel writes each report as a dashboard would summarise it: counters
// and up-down counters by attribute, histograms as count, mean, max and
// quantiles read from the buckets (the bucket's upper bound: all an
// exporter's histogram tells).
func printOtel(w io.Writer, reports []otelReport) {
	for _, r := range reports {
		fmt.Fprintf(w, "\nOpenTelemetry metrics recorded by %s (cumulative over the cell):\n", r.label)
		for _, sm := range r.rm.ScopeMetrics {
			for _, m := range sm.Metrics {
				for _, line := range metricLines(m) {
					fmt.Fprintf(w, "  %-28s %-15s %s\n", m.Name, "("+m.Unit+")", line)
				}
			}
		}
	}
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

func seconds(s float64) string { return dur(time.Duration(s * float64(time.Second))) }

// writeOtel writes the reports to dir/otel.txt.
func writeOtel(dir string, reports []otelReport) error {
	f, err := os.Create(filepath.Join(dir, "otel.txt"))
	if err != nil {
		return err
	}
	printOtel(f, reports)
	return f.Close()
}

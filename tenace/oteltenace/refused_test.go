package oteltenace_test

import (
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/metric"
	metricnoop "go.opentelemetry.io/otel/metric/noop"

	"tenace.dev/tenace"
	"tenace.dev/tenace/oteltenace"
)

// refusingMeters is a MeterProvider whose meter refuses every synchronous
// instrument, returning a nil one with its error (the API allows it: the
// SDK happens to return a usable one).
type refusingMeters struct{ metricnoop.MeterProvider }

func (refusingMeters) Meter(string, ...metric.MeterOption) metric.Meter { return refusingMeter{} }

type refusingMeter struct{ metricnoop.Meter }

var errRefused = errors.New("refused")

func (refusingMeter) Int64Counter(string, ...metric.Int64CounterOption) (metric.Int64Counter, error) {
	return nil, errRefused
}

func (refusingMeter) Int64UpDownCounter(string, ...metric.Int64UpDownCounterOption) (metric.Int64UpDownCounter, error) {
	return nil, errRefused
}

func (refusingMeter) Float64Histogram(string, ...metric.Float64HistogramOption) (metric.Float64Histogram, error) {
	return nil, errRefused
}

// An instrument the meter refuses is left out, as New's doc says: the
// listener records nothing with it, and does not panic.
func TestRefusedInstrumentsAreLeftOut(t *testing.T) {
	var handled []error
	old := otel.GetErrorHandler()
	otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) { handled = append(handled, err) }))
	t.Cleanup(func() { otel.SetErrorHandler(old) })
	tel := oteltenace.New(oteltenace.WithMeterProvider(refusingMeters{}))
	require.Len(t, handled, 1, "reported to otel.Handle")
	p := tenace.NewMemoryLockProvider()
	defer p.Close()
	pol := tel.Instrument(tenace.NewPolicy().WithTimeout(time.Hour).WithLock(tenace.LockOptions{Provider: p, Key: "k"}))
	require.NoError(t, pol.Execute(bg, noop))
}

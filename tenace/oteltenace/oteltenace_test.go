package oteltenace_test

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"tenace.dev/tenace"
	"tenace.dev/tenace/oteltenace"
)

var noAttrs = attribute.NewSet()

func TestMetricsOfAContendedLock(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newSDK(t)
		p := tenace.NewMemoryLockProvider()
		defer p.Close()
		tel := s.telemetry()
		pol := tenace.NewPolicy().WithLock(tenace.LockOptions{Provider: p, Key: "k"}).OnEvent(tel.Listen)

		// Someone holds k for 3 s; our call waits that long, then holds it 2 s.
		held, err := p.Acquire(bg, "k", tenace.LockAcquireOptions{})
		require.NoError(t, err)
		done := make(chan error)
		go func() {
			done <- pol.Execute(bg, func(context.Context) error { time.Sleep(2 * time.Second); return nil })
		}()
		synctest.Wait()
		m := s.collect(t)
		require.Equal(t, int64(1), sum(t, m["tenace.lock.waiting"], exclusive), "one caller waiting now")

		time.Sleep(3 * time.Second)
		require.NoError(t, held.Release(bg))
		require.NoError(t, <-done)

		// A call that may wait 1 s is rejected; one whose ctx ends after 4 s is cancelled.
		held, err = p.Acquire(bg, "k", tenace.LockAcquireOptions{})
		require.NoError(t, err)
		rejected := tenace.NewPolicy().WithLock(tenace.LockOptions{Provider: p, Key: "k", Timeout: time.Second}).OnEvent(tel.Listen)
		var nae *tenace.LockNotAcquiredError
		require.ErrorAs(t, rejected.Execute(bg, noop), &nae)
		ctx, cancel := context.WithTimeout(bg, 4*time.Second)
		require.ErrorIs(t, pol.Execute(ctx, noop), context.DeadlineExceeded)
		cancel()
		require.NoError(t, held.Release(bg))

		m = s.collect(t)
		wait := m["tenace.lock.wait.duration"]
		require.Equal(t, "s", wait.Unit)
		acq := histogram(t, wait, outcome("acquired"))
		require.Equal(t, uint64(1), acq.Count)
		require.Equal(t, 3.0, acq.Sum)
		require.Equal(t, oteltenace.DurationBuckets, acq.Bounds, "the advised buckets")
		require.Equal(t, 1.0, histogram(t, wait, outcome("rejected")).Sum)
		require.Equal(t, 4.0, histogram(t, wait, outcome("cancelled")).Sum)
		require.Len(t, wait.Data.(metricdata.Histogram[float64]).DataPoints, 3, "no failed outcome: nothing failed")

		hold := m["tenace.lock.hold.duration"]
		require.Equal(t, "s", hold.Unit)
		hp := histogram(t, hold, exclusive)
		require.Equal(t, uint64(1), hp.Count)
		require.Equal(t, 2.0, hp.Sum)

		acquisitions := m["tenace.lock.acquisitions"]
		require.Equal(t, int64(1), sum(t, acquisitions, outcome("acquired")))
		require.Equal(t, int64(1), sum(t, acquisitions, outcome("rejected")))
		require.Equal(t, int64(1), sum(t, acquisitions, outcome("cancelled")))
		require.True(t, acquisitions.Data.(metricdata.Sum[int64]).IsMonotonic)
		require.Equal(t, int64(0), sum(t, m["tenace.lock.waiting"], exclusive), "nobody waits any more")
		require.False(t, m["tenace.lock.waiting"].Data.(metricdata.Sum[int64]).IsMonotonic)
		require.NotContains(t, m, "tenace.lock.lost")
	})
}

func TestFailuresLossesAndTimeoutsAreCounted(t *testing.T) {
	s := newSDK(t)
	tel := s.telemetry()
	lease := &losableLease{}
	fp := &fakeProvider{acquire: func() (tenace.LockLease, error) { return lease, nil }}
	pol := tenace.NewPolicy().WithTimeout(time.Hour).WithLock(tenace.LockOptions{Provider: fp, Key: "k"}).OnEvent(tel.Listen)
	err := pol.Execute(bg, func(ctx context.Context) error {
		lease.Lose(errors.New("renewal found another holder"))
		<-ctx.Done()
		return context.Cause(ctx)
	})
	require.ErrorIs(t, err, tenace.ErrLeaseLost)
	fp.acquire = func() (tenace.LockLease, error) { return nil, errors.New("connection refused") }
	var ue *tenace.UnexpectedError
	require.ErrorAs(t, pol.Execute(bg, noop), &ue)
	require.Error(t, tenace.NewPolicy().WithTimeout(time.Nanosecond).OnEvent(tel.Listen).Execute(bg, func(ctx context.Context) error {
		<-ctx.Done()
		return ctx.Err()
	}))

	m := s.collect(t)
	require.Equal(t, int64(1), sum(t, m["tenace.lock.lost"], exclusive))
	require.Equal(t, int64(1), sum(t, m["tenace.lock.acquisitions"], outcome("failed")))
	require.Equal(t, uint64(1), histogram(t, m["tenace.lock.wait.duration"], outcome("failed")).Count)
	require.Equal(t, int64(1), sum(t, m["tenace.timeouts"], noAttrs))
	require.Equal(t, int64(0), sum(t, m["tenace.lock.waiting"], exclusive))
}

func TestTheLockKeyIsRecordedOnlyOnOptIn(t *testing.T) {
	for _, optIn := range []bool{false, true} {
		s := newSDK(t)
		var opts []oteltenace.Option
		if optIn {
			opts = append(opts, oteltenace.WithLockKey())
		}
		tel := s.telemetry(opts...)
		p := tenace.NewMemoryLockProvider()
		require.NoError(t, tel.Instrument(tenace.NewPolicy().WithLock(tenace.LockOptions{Provider: p})).
			Execute(bg, noop, tenace.WithKey("customer-42")))
		require.NoError(t, p.Close())

		keyed := false
		for _, m := range s.collect(t) {
			switch d := m.Data.(type) {
			case metricdata.Histogram[float64]:
				for _, dp := range d.DataPoints {
					_, has := dp.Attributes.Value(oteltenace.LockKeyKey)
					keyed = keyed || has
					require.Equal(t, optIn, has, "%s: key present iff opted in", m.Name)
				}
			case metricdata.Sum[int64]:
				for _, dp := range d.DataPoints {
					_, has := dp.Attributes.Value(oteltenace.LockKeyKey)
					require.Equal(t, optIn, has, "%s: key present iff opted in", m.Name)
				}
			}
		}
		spans := s.spans.Ended()
		require.Len(t, spans, 1)
		for _, e := range spans[0].Events() {
			has := false
			for _, a := range e.Attributes {
				has = has || a.Key == oteltenace.LockKeyKey
			}
			require.Equal(t, optIn, has, "span event %s", e.Name)
		}
		_, hasExecKey := attrOf(spans[0].Attributes(), "tenace.key")
		require.Equal(t, optIn, hasExecKey)
		require.Equal(t, optIn, keyed)
	}
}

func attrOf(attrs []attribute.KeyValue, key attribute.Key) (attribute.Value, bool) {
	for _, a := range attrs {
		if a.Key == key {
			return a.Value, true
		}
	}
	return attribute.Value{}, false
}

func eventNames(s sdktrace.ReadOnlySpan) []string {
	var out []string
	for _, e := range s.Events() {
		out = append(out, e.Name)
	}
	return out
}

func TestASpanPerExecuteWithTheLocksEvents(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newSDK(t)
		tel := s.telemetry()
		p := tenace.NewMemoryLockProvider()
		defer p.Close()
		pol := tel.Instrument(tenace.NewPolicy().WithLock(tenace.LockOptions{Provider: p, Key: "k"}))

		ctx, parent := s.traces.Tracer("test").Start(bg, "request")
		var token uint64
		var inner string
		require.NoError(t, pol.Execute(ctx, func(ctx context.Context) error {
			l, _ := tenace.LeaseFrom(ctx)
			token = l.(tenace.FencedLease).Token()
			_, child := s.traces.Tracer("test").Start(ctx, "work")
			inner = child.SpanContext().SpanID().String()
			time.Sleep(time.Second)
			child.End()
			return nil
		}))
		parent.End()

		spans := s.spans.Ended()
		require.Len(t, spans, 3)
		work, exec := spans[0], spans[1]
		require.Equal(t, inner, work.SpanContext().SpanID().String())
		require.Equal(t, "tenace.execute", exec.Name())
		require.Equal(t, exec.SpanContext().SpanID(), work.Parent().SpanID(), "fn's spans are children of the Execute span")
		require.Equal(t, parent.SpanContext().SpanID(), exec.Parent().SpanID(), "the Execute span is a child of the caller's")
		require.Equal(t, codes.Unset, exec.Status().Code)
		require.Equal(t, []string{"lock.acquiring", "lock.acquired", "lock.released"}, eventNames(exec))
		acquired, released := exec.Events()[1], exec.Events()[2]
		w, ok := attrOf(acquired.Attributes, oteltenace.WaitKey)
		require.True(t, ok)
		require.Equal(t, 0.0, w.AsFloat64())
		tok, _ := attrOf(acquired.Attributes, oteltenace.TokenKey)
		require.Equal(t, int64(token), tok.AsInt64())
		h, _ := attrOf(released.Attributes, oteltenace.HoldKey)
		require.Equal(t, 1.0, h.AsFloat64())
	})
}

func TestTheSpanOfAFailedCallHasErrorStatusAndTheRejection(t *testing.T) {
	s := newSDK(t)
	tel := s.telemetry()
	p := tenace.NewMemoryLockProvider()
	defer p.Close()
	held, err := p.Acquire(bg, "k", tenace.LockAcquireOptions{})
	require.NoError(t, err)
	defer func() { _ = held.Release(bg) }()
	pol := tel.Instrument(tenace.NewPolicy().WithLock(tenace.LockOptions{Provider: p, Key: "k", Timeout: tenace.NoWait}))
	err = pol.Execute(bg, noop)
	require.Error(t, err)
	spans := s.spans.Ended()
	require.Len(t, spans, 1)
	require.Equal(t, codes.Error, spans[0].Status().Code)
	require.Equal(t, err.Error(), spans[0].Status().Description)
	require.Equal(t, []string{"lock.acquiring", "lock.rejected"}, eventNames(spans[0]))
	msg, ok := attrOf(spans[0].Events()[1].Attributes, oteltenace.ErrorKey)
	require.True(t, ok)
	require.Equal(t, err.Error(), msg.AsString())
}

func TestALostLeaseIsASpanEvent(t *testing.T) {
	s := newSDK(t)
	tel := s.telemetry()
	lease := &losableLease{}
	pol := tel.Instrument(tenace.NewPolicy().WithLock(tenace.LockOptions{
		Provider: &fakeProvider{acquire: func() (tenace.LockLease, error) { return lease, nil }}, Key: "k"}))
	err := pol.Execute(bg, func(ctx context.Context) error {
		lease.Lose(errors.New("the connection dropped"))
		<-ctx.Done()
		return context.Cause(ctx)
	})
	require.ErrorIs(t, err, tenace.ErrLeaseLost)
	spans := s.spans.Ended()
	require.Len(t, spans, 1)
	require.Equal(t, []string{"lock.acquiring", "lock.acquired", "lock.lost", "lock.released"}, eventNames(spans[0]))
	lost := spans[0].Events()[2]
	msg, _ := attrOf(lost.Attributes, oteltenace.ErrorKey)
	require.Contains(t, msg.AsString(), "the connection dropped")
	tok, _ := attrOf(lost.Attributes, oteltenace.TokenKey)
	require.Equal(t, int64(9), tok.AsInt64())
	require.Equal(t, codes.Error, spans[0].Status().Code)
}

// bigTokenLease is a lease whose fencing token does not fit an int64.
type bigTokenLease struct{}

func (bigTokenLease) Release(context.Context) error { return nil }
func (bigTokenLease) Token() uint64                 { return 1<<63 + 5 }

func TestATokenAboveMaxInt64IsRecordedAsItsDecimalString(t *testing.T) {
	s := newSDK(t)
	tel := s.telemetry()
	pol := tel.Instrument(tenace.NewPolicy().WithLock(tenace.LockOptions{
		Provider: &fakeProvider{acquire: func() (tenace.LockLease, error) { return bigTokenLease{}, nil }}, Key: "k"}))
	require.NoError(t, pol.Execute(bg, func(context.Context) error { return nil }))
	spans := s.spans.Ended()
	require.Len(t, spans, 1)
	require.Equal(t, []string{"lock.acquiring", "lock.acquired", "lock.released"}, eventNames(spans[0]))
	tok, ok := attrOf(spans[0].Events()[1].Attributes, oteltenace.TokenKey)
	require.True(t, ok)
	require.Equal(t, "9223372036854775813", tok.AsString(), "not a negative int64 that names another token")
}

func TestAPanicInFnStillEndsTheSpan(t *testing.T) {
	s := newSDK(t)
	tel := s.telemetry()
	p := tenace.NewMemoryLockProvider()
	defer p.Close()
	pol := tel.Instrument(tenace.NewPolicy().WithLock(tenace.LockOptions{Provider: p, Key: "k"}))
	require.PanicsWithValue(t, "fn", func() { _ = pol.Execute(bg, func(context.Context) error { panic("fn") }) })
	spans := s.spans.Ended()
	require.Len(t, spans, 1)
	require.Equal(t, int64(0), sum(t, s.collect(t)["tenace.lock.waiting"], exclusive))
	// The call failed: not a span that looks successful. The SDK records
	// the panic as an exception event.
	require.Equal(t, codes.Error, spans[0].Status().Code)
	require.Equal(t, []string{"lock.acquiring", "lock.acquired", "lock.released", "exception"}, eventNames(spans[0]))
}

func TestEventsOfOtherStepsAreIgnored(t *testing.T) {
	s := newSDK(t)
	tel := s.telemetry()
	tel.Listen(tenace.Event{Name: "retry.attempt", Key: "k"})
	tel.Listen(tenace.Event{Name: tenace.EventLockAcquiring}) // no Context: still recorded
	m := s.collect(t)
	require.Equal(t, int64(1), sum(t, m["tenace.lock.waiting"], exclusive))
	require.Len(t, m, 1)
}

func TestObserveStatsReadsTheProviderAtEachCollection(t *testing.T) {
	s := newSDK(t)
	sp := &fixedStats{s: tenace.LockStats{Held: 3, Waiting: 5, LongestQueue: 4}}
	reg, err := oteltenace.ObserveStats(s.meters, sp, attribute.String("tenace.provider", "orders"))
	require.NoError(t, err)
	gauge := func(m metricdata.Metrics) int64 {
		g, ok := m.Data.(metricdata.Gauge[int64])
		require.True(t, ok, "%s is a %T", m.Name, m.Data)
		require.Len(t, g.DataPoints, 1)
		v, _ := g.DataPoints[0].Attributes.Value("tenace.provider")
		require.Equal(t, "orders", v.AsString())
		return g.DataPoints[0].Value
	}
	m := s.collect(t)
	require.Equal(t, int64(3), gauge(m["tenace.provider.held"]))
	require.Equal(t, int64(5), gauge(m["tenace.provider.waiting"]))
	require.Equal(t, int64(4), gauge(m["tenace.provider.longest_queue"]))
	sp.s = tenace.LockStats{Held: 1}
	m = s.collect(t)
	require.Equal(t, int64(1), gauge(m["tenace.provider.held"]))
	require.Equal(t, int64(0), gauge(m["tenace.provider.waiting"]))
	require.NoError(t, reg.Unregister())
	m = s.collect(t)
	require.NotContains(t, m, "tenace.provider.held", "unregistered: no more readings")
}

// A deadlock is its own outcome, apart from contention (rejected): its
// wait is counted and timed under outcome deadlock, and the span has its
// event.
func TestDeadlockIsItsOwnOutcome(t *testing.T) {
	s := newSDK(t)
	tel := s.telemetry()
	p := tenace.NewMemoryLockProvider()
	defer p.Close()
	pol := tel.Instrument(tenace.NewPolicy().WithLock(tenace.LockOptions{Provider: p, Key: "k"}))
	var d *tenace.DeadlockError
	require.ErrorAs(t, pol.Execute(bg, func(ctx context.Context) error { return pol.Execute(ctx, noop) }), &d)

	m := s.collect(t)
	require.Equal(t, int64(1), sum(t, m["tenace.lock.acquisitions"], outcome("deadlock")))
	require.Equal(t, int64(1), sum(t, m["tenace.lock.acquisitions"], outcome("acquired")))
	require.Equal(t, uint64(1), histogram(t, m["tenace.lock.wait.duration"], outcome("deadlock")).Count)
	require.Len(t, m["tenace.lock.acquisitions"].Data.(metricdata.Sum[int64]).DataPoints, 2, "no rejected outcome")
	require.Equal(t, int64(0), sum(t, m["tenace.lock.waiting"], exclusive))
	spans := s.spans.Ended()
	require.Len(t, spans, 2)
	require.Equal(t, []string{"lock.acquiring", "lock.deadlock"}, eventNames(spans[0]), "the inner call's span")
}

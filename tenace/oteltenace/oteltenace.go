// Package oteltenace records what tenace's locks do as OpenTelemetry metrics
// and spans: how long callers wait for a lock and with what outcome, how long
// locks are held, how many callers wait right now, and which leases were
// lost.
//
//	tel := oteltenace.New() // the global MeterProvider and TracerProvider
//	p := tel.Instrument(tenace.NewPolicy().WithLock(tenace.LockOptions{Key: "reports"}))
//
// To tell two policies of one service apart, give each a name of its own
// ([WithName]): it labels their metrics (tenace.policy.name) and names their
// spans ("tenace.execute reports"): one series more per name, and the
// program chooses the names, never a request, so their number stays
// bounded.
//
// It is a module of its own (tenace.dev/tenace/oteltenace), so that the core
// module does not depend on OpenTelemetry; it uses only the OpenTelemetry
// API, and the application chooses and configures the SDK.
//
// # Metrics
//
// OpenTelemetry has no semantic convention for locks yet, so the names are
// tenace's own, under "tenace.lock.":
//
//	name                          instrument          unit           attributes
//	tenace.lock.wait.duration     histogram           s              tenace.lock.mode, tenace.lock.outcome
//	tenace.lock.hold.duration     histogram           s              tenace.lock.mode
//	tenace.lock.acquisitions      counter             {acquisition}  tenace.lock.mode, tenace.lock.outcome
//	tenace.lock.lost              counter             {lease}        tenace.lock.mode
//	tenace.lock.waiting           up-down counter     {caller}       tenace.lock.mode
//	tenace.timeouts               counter             {timeout}      —
//
// With [WithName], every measurement of every one of them also carries
// tenace.policy.name, the name: one series per name the program gives
// (and per outcome), however many keys its locks take.
//
// tenace.lock.mode is exclusive, or shared for a Lock with
// LockOptions.Shared (a reader of a read/write lock, a caller of a keyed
// bulkhead): so tenace.lock.waiting tells how many wait to read and how
// many to write, and the hold histogram how long each side holds. It is on
// every measurement of the tenace.lock. metrics, exclusive ones included,
// so that a series is never the sum of both modes by accident.
//
// tenace.lock.outcome is acquired, rejected (not granted within the Lock's
// Timeout), deadlock (waiting would never end: a *tenace.DeadlockError, a
// programming error rather than contention), cancelled (the caller's
// context ended first) or failed (the provider failed). Both histograms advise bucket boundaries from 1 µs to
// 5 minutes ([DurationBuckets]); a view can replace them. With
// [WithLockKey], every measurement of the tenace.lock. metrics also carries
// tenace.lock.key (tenace.timeouts never does: a timeout has no lock); it is
// off by default because keys often hold customer or order ids, which are
// both personal data and unbounded cardinality. Error messages are recorded
// whole, with or without it (the span status, [ErrorKey]), and some name the
// key: a rejection's (*tenace.LockNotAcquiredError) and a timeout's
// (*tenace.TimeoutError) do, and a provider's may.
//
// [ObserveStats] adds gauges read from a provider's tenace.LockStats,
// among them the permits in use (tenace.provider.shared.holders).
//
// # Spans
//
// [Telemetry.Step] starts one span per Execute, named "tenace.execute" (with
// [WithName], "tenace.execute " and the name, say "tenace.execute reports",
// and the attribute tenace.policy.name), and
// the listener adds the lock's events to the span it finds in the event's
// context, each with the lock's mode (tenace.lock.mode) and, for a
// bulkhead, its permit count (tenace.lock.permits). One span per Execute, rather than one per Lock step, because a
// listener cannot open a span around a step — it sees events, not the
// call — while a step can; placed outermost (as [Telemetry.Instrument]
// does), the step's span is what the caller waited for, wait and work
// together, and fn's own spans are its children. The wait shows as the time
// between the span events lock.acquiring and lock.acquired. Without the
// step the events land on whatever span the caller's context carries, such
// as an HTTP server span.
package oteltenace

import (
	"context"
	"math"
	"strconv"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"
	"go.opentelemetry.io/otel/trace"

	"tenace.dev/tenace"
	"tenace.dev/tenace/policy"
)

// ScopeName is the instrumentation scope of the meters and tracers this
// package creates.
const ScopeName = "tenace.dev/tenace/oteltenace"

// Attribute keys.
const (
	// OutcomeKey is how a wait for a lock ended: acquired, rejected,
	// deadlock, cancelled or failed.
	OutcomeKey = attribute.Key("tenace.lock.outcome")
	// ModeKey is the Lock's mode, exclusive or shared (LockOptions.Shared;
	// tenace.Event.Shared), on every measurement of the tenace.lock.
	// metrics and every lock span event.
	ModeKey = attribute.Key("tenace.lock.mode")
	// PermitsKey is a shared Lock's permit count (LockOptions.Permits;
	// tenace.Event.Permits), on its span events when it is not 0 (a keyed
	// bulkhead's N; 0, any number of readers, is not recorded). It is not
	// on the metrics: the mode is.
	PermitsKey = attribute.Key("tenace.lock.permits")
	// LockKeyKey is the lock key, recorded only with WithLockKey.
	LockKeyKey = attribute.Key("tenace.lock.key")
	// NameKey is the name given with WithName, recorded on every
	// measurement, on the Execute span and on every span event.
	NameKey = attribute.Key("tenace.policy.name")
	// TokenKey is the fencing token, on span events of leases that have one:
	// an int64 attribute, or, for a token above math.MaxInt64 (which
	// OpenTelemetry's integers cannot hold), its decimal string.
	TokenKey = attribute.Key("tenace.lock.token")
	// WaitKey is the wait in seconds, on span events that end a wait.
	WaitKey = attribute.Key("tenace.lock.wait")
	// HoldKey is the hold in seconds, on the released and lost span events.
	HoldKey = attribute.Key("tenace.lock.hold")
	// ErrorKey is Event.Err's message, on span events that have one. It is
	// recorded whole: a rejection's and a timeout's name the key, also
	// without WithLockKey.
	ErrorKey = attribute.Key("tenace.error")
)

// DurationBuckets are the bucket boundaries, in seconds, advised for both
// duration histograms: 1-2.5-5 steps from 1 µs to 10 s, then 30 s, 1 min
// and 5 min — an uncontended in-process lock takes about a microsecond, a
// distributed one a millisecond, and a wait behind a long job minutes.
var DurationBuckets = []float64{
	1e-6, 2.5e-6, 5e-6,
	1e-5, 2.5e-5, 5e-5,
	1e-4, 2.5e-4, 5e-4,
	1e-3, 2.5e-3, 5e-3,
	1e-2, 2.5e-2, 5e-2,
	0.1, 0.25, 0.5,
	1, 2.5, 5,
	10, 30, 60, 300,
}

// Option configures New.
type Option interface{ apply(*config) }

type config struct {
	meters  metric.MeterProvider
	tracers trace.TracerProvider
	lockKey bool
	name    string
}

type optionFunc func(*config)

func (f optionFunc) apply(c *config) { f(c) }

// WithMeterProvider sets where the metrics go; the default is
// otel.GetMeterProvider() at the time New is called.
func WithMeterProvider(mp metric.MeterProvider) Option {
	return optionFunc(func(c *config) { c.meters = mp })
}

// WithTracerProvider sets where the spans go; the default is
// otel.GetTracerProvider() at the time New is called.
func WithTracerProvider(tp trace.TracerProvider) Option {
	return optionFunc(func(c *config) { c.tracers = tp })
}

// WithLockKey records the lock key as the attribute tenace.lock.key on every
// measurement of the tenace.lock. metrics and on every span event (on the
// timeout event, the execution key: its Event.Key), and the execution key
// as tenace.key on the Execute span. Off by default: keys often hold
// customer ids, and every distinct key becomes a time series of its own.
// Turn it on for a bounded set of keys ("nightly-report", "migrations")
// only. Without it, a key can still reach a span inside an error message
// (see Metrics in the package doc).
func WithLockKey() Option {
	return optionFunc(func(c *config) { c.lockKey = true })
}

// WithName names what the Telemetry instruments — a policy, or the lock
// that is its purpose ("reports", "migrations") — so that two policies of
// one service can be told apart: every measurement carries it as the
// attribute tenace.policy.name, and the Execute span is named
// "tenace.execute " and the name, and carries the attribute too, as does
// every span event. "" means no name, as without the option.
//
// The name is a constant the program chooses, one per policy: never a lock
// key, nor anything taken from a request, since each distinct name is a
// time series of every metric (that is what WithLockKey is for, with its
// warning). Make one Telemetry per name, once, and use it for every policy
// of that name.
func WithName(name string) Option {
	return optionFunc(func(c *config) { c.name = name })
}

// Telemetry records a policy's events as metrics and span events, and its
// Executes as spans. Create it once (its instruments are created once) and
// use it for any number of policies; it is safe for concurrent use.
type Telemetry struct {
	tracer   trace.Tracer
	wait     metric.Float64Histogram
	hold     metric.Float64Histogram
	acquired metric.Int64Counter
	lost     metric.Int64Counter
	waiting  metric.Int64UpDownCounter
	timeouts metric.Int64Counter
	lockKey  bool
	name     string // WithName's; "" for none

	// The span's name and start options, made once.
	spanName  string
	spanStart []trace.SpanStartOption

	// The attribute sets of the measurements without the lock key, made
	// once, so that recording them allocates nothing: the name's alone (or
	// none) in named, for tenace.timeouts; with each mode in plain, and
	// with each mode and outcome in byOutcome. Each is a one-element slice
	// ready to pass as the variadic options: passing a lone option would
	// make a new slice, which escapes through the interface call, on every
	// record.
	named     measure
	plain     [numModes]measure
	byOutcome [numModes][numOutcomes]measure
}

// measure is the options of one measurement, for each kind of instrument.
type measure struct {
	rec []metric.RecordOption
	add []metric.AddOption
}

// outcome indexes Telemetry.byOutcome.
type outcome int

const (
	outcomeAcquired outcome = iota
	outcomeRejected
	outcomeDeadlock
	outcomeCancelled
	outcomeFailed
	numOutcomes
)

var outcomeNames = [numOutcomes]string{"acquired", "rejected", "deadlock", "cancelled", "failed"}

// mode indexes Telemetry.plain and byOutcome: a lock event's Shared.
type mode int

const (
	modeExclusive mode = iota
	modeShared
	numModes
)

var modeNames = [numModes]string{"exclusive", "shared"}

func modeOf(e tenace.Event) mode {
	if e.Shared {
		return modeShared
	}
	return modeExclusive
}

// New returns a Telemetry that records through the providers the options
// name (the global ones by default). An instrument the meter refuses is
// reported to otel.Handle (the first refusal) and records what the meter
// returned with its error, or nothing if it returned none; New itself never
// fails.
func New(opts ...Option) *Telemetry {
	c := config{}
	for _, o := range opts {
		o.apply(&c)
	}
	if c.meters == nil {
		c.meters = otel.GetMeterProvider()
	}
	if c.tracers == nil {
		c.tracers = otel.GetTracerProvider()
	}
	meter := c.meters.Meter(ScopeName)
	t := &Telemetry{tracer: c.tracers.Tracer(ScopeName), lockKey: c.lockKey, name: c.name}
	var err error
	handle := func(e error) {
		if e != nil && err == nil {
			err = e
		}
	}
	var e error
	t.wait, e = meter.Float64Histogram("tenace.lock.wait.duration",
		metric.WithUnit("s"), metric.WithDescription("How long callers waited for a lock, by outcome."),
		metric.WithExplicitBucketBoundaries(DurationBuckets...))
	handle(e)
	t.hold, e = meter.Float64Histogram("tenace.lock.hold.duration",
		metric.WithUnit("s"), metric.WithDescription("How long locks were held, from grant to release."),
		metric.WithExplicitBucketBoundaries(DurationBuckets...))
	handle(e)
	t.acquired, e = meter.Int64Counter("tenace.lock.acquisitions",
		metric.WithUnit("{acquisition}"), metric.WithDescription("Lock acquisitions, by outcome."))
	handle(e)
	t.lost, e = meter.Int64Counter("tenace.lock.lost",
		metric.WithUnit("{lease}"), metric.WithDescription("Leases lost while held: renewal failed, connection dropped, TTL reached."))
	handle(e)
	t.waiting, e = meter.Int64UpDownCounter("tenace.lock.waiting",
		metric.WithUnit("{caller}"), metric.WithDescription("Callers waiting for a lock now."))
	handle(e)
	t.timeouts, e = meter.Int64Counter("tenace.timeouts",
		metric.WithUnit("{timeout}"), metric.WithDescription("WithTimeout deadlines that passed before the work returned."))
	handle(e)
	if err != nil {
		otel.Handle(err)
	}
	// The API lets a meter return no instrument with its error (the SDK
	// returns one that works): one missing records nothing.
	t.wait = orNoop(t.wait, metric.Float64Histogram(noop.Float64Histogram{}))
	t.hold = orNoop(t.hold, metric.Float64Histogram(noop.Float64Histogram{}))
	t.acquired = orNoop(t.acquired, metric.Int64Counter(noop.Int64Counter{}))
	t.lost = orNoop(t.lost, metric.Int64Counter(noop.Int64Counter{}))
	t.waiting = orNoop(t.waiting, metric.Int64UpDownCounter(noop.Int64UpDownCounter{}))
	t.timeouts = orNoop(t.timeouts, metric.Int64Counter(noop.Int64Counter{}))
	t.spanName = "tenace.execute"
	t.spanStart = []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindInternal)}
	if t.name != "" {
		t.spanName += " " + t.name
		t.spanStart = append(t.spanStart, trace.WithAttributes(NameKey.String(t.name)))
	}
	t.named = measureOf(attribute.NewSet(t.nameAttrs()...))
	for m := range numModes {
		t.plain[m] = measureOf(attribute.NewSet(append(t.nameAttrs(), ModeKey.String(modeNames[m]))...))
		for o := range numOutcomes {
			t.byOutcome[m][o] = measureOf(attribute.NewSet(append(t.nameAttrs(), ModeKey.String(modeNames[m]), OutcomeKey.String(outcomeNames[o]))...))
		}
	}
	return t
}

// nameAttrs returns a new slice of the name's attribute, or an empty one
// without a name, with room for three more.
func (t *Telemetry) nameAttrs() []attribute.KeyValue {
	kvs := make([]attribute.KeyValue, 0, 4)
	if t.name != "" {
		kvs = append(kvs, NameKey.String(t.name))
	}
	return kvs
}

// orNoop returns inst, or none if inst is nil.
func orNoop[I any](inst, none I) I {
	if any(inst) == nil {
		return none
	}
	return inst
}

// Instrument returns p with the Telemetry's step outermost (a span per
// Execute) and its listener added. Call it last, once every other step is
// in: a step added afterwards would run outside the span.
func (t *Telemetry) Instrument(p tenace.Policy) tenace.Policy {
	return p.With(t.Step()).OnEvent(t.Listen)
}

// Listen is the listener: pass t.Listen to Policy.OnEvent to record metrics
// and span events without the step's span.
func (t *Telemetry) Listen(e tenace.Event) {
	ctx := e.Context
	if ctx == nil {
		ctx = context.Background()
	}
	switch e.Name {
	case tenace.EventLockAcquiring:
		t.waiting.Add(ctx, 1, t.keyed(e, nil).add...)
	case tenace.EventLockAcquired:
		t.waitEnded(ctx, e, outcomeAcquired)
	case tenace.EventLockRejected:
		t.waitEnded(ctx, e, outcomeRejected)
	case tenace.EventLockDeadlock:
		t.waitEnded(ctx, e, outcomeDeadlock)
	case tenace.EventLockCancelled:
		t.waitEnded(ctx, e, outcomeCancelled)
	case tenace.EventLockFailed:
		t.waitEnded(ctx, e, outcomeFailed)
	case tenace.EventLockReleased:
		t.hold.Record(ctx, e.Hold.Seconds(), t.keyed(e, nil).rec...)
	case tenace.EventLockLost:
		t.lost.Add(ctx, 1, t.keyed(e, nil).add...)
	case tenace.EventTimeout:
		t.timeouts.Add(ctx, 1, t.named.add...)
	default:
		return // a third-party step's event: not ours to record
	}
	t.spanEvent(ctx, e)
}

// waitEnded records the end of a wait.
func (t *Telemetry) waitEnded(ctx context.Context, e tenace.Event, o outcome) {
	t.waiting.Add(ctx, -1, t.keyed(e, nil).add...)
	m := t.keyed(e, &o)
	t.wait.Record(ctx, e.Wait.Seconds(), m.rec...)
	t.acquired.Add(ctx, 1, m.add...)
}

// keyed returns the measurement options for a lock event: the name (with
// WithName), its mode, its outcome (if o is not nil) and, with
// WithLockKey, its key. Without the key it allocates nothing.
func (t *Telemetry) keyed(e tenace.Event, o *outcome) measure {
	m := modeOf(e)
	if !t.lockKey {
		if o == nil {
			return t.plain[m]
		}
		return t.byOutcome[m][*o]
	}
	kvs := append(t.nameAttrs(), ModeKey.String(modeNames[m]), LockKeyKey.String(e.Key))
	if o != nil {
		kvs = append(kvs, OutcomeKey.String(outcomeNames[*o]))
	}
	return measureOf(attribute.NewSet(kvs...))
}

func measureOf(set attribute.Set) measure {
	opt := metric.WithAttributeSet(set)
	return measure{rec: []metric.RecordOption{opt}, add: []metric.AddOption{opt}}
}

// spanEvent adds e to the span in its context, if that span records.
func (t *Telemetry) spanEvent(ctx context.Context, e tenace.Event) {
	span := trace.SpanFromContext(ctx)
	if !span.IsRecording() {
		return
	}
	attrs := make([]attribute.KeyValue, 0, 8)
	if t.name != "" {
		attrs = append(attrs, NameKey.String(t.name))
	}
	if t.lockKey {
		attrs = append(attrs, LockKeyKey.String(e.Key))
	}
	if e.Name != tenace.EventTimeout {
		attrs = append(attrs, ModeKey.String(modeNames[modeOf(e)]))
		if e.Permits != 0 {
			attrs = append(attrs, PermitsKey.Int(e.Permits))
		}
	}
	switch e.Name {
	case tenace.EventLockAcquired, tenace.EventLockRejected, tenace.EventLockDeadlock, tenace.EventLockCancelled, tenace.EventLockFailed:
		attrs = append(attrs, WaitKey.Float64(e.Wait.Seconds()))
	case tenace.EventLockReleased, tenace.EventLockLost:
		attrs = append(attrs, HoldKey.Float64(e.Hold.Seconds()))
	}
	if e.Token != 0 {
		attrs = append(attrs, tokenAttr(e.Token))
	}
	if e.Err != nil {
		attrs = append(attrs, ErrorKey.String(e.Err.Error()))
	}
	span.AddEvent(e.Name, trace.WithAttributes(attrs...))
}

// tokenAttr is t as TokenKey: an int64 while it fits, its decimal string
// above (a negative number would name another token).
func tokenAttr(t uint64) attribute.KeyValue {
	if t > math.MaxInt64 {
		return TokenKey.String(strconv.FormatUint(t, 10))
	}
	return TokenKey.Int64(int64(t))
}

// Step returns the step that runs each Execute in a span of kind internal,
// a child of the span in the caller's context, named "tenace.execute" — or,
// with WithName, "tenace.execute " and the name, with the name in the
// attribute tenace.policy.name. The span's status is Error, with the error's message, when the
// call returns an error (fn's own included: the span is the call's), and
// Error, "panic", when it panics; the span still ends, the panic goes on up,
// and an SDK that records panics (the OpenTelemetry SDK does by default)
// adds it as an exception event. Add it outermost, or use Instrument.
func (t *Telemetry) Step() tenace.Strategy { return step{t} }

type step struct{ t *Telemetry }

// Run implements tenace.Strategy.
func (s step) Run(ctx context.Context, x policy.Execution, next policy.Next) (err error) {
	opts := s.t.spanStart
	if s.t.lockKey && x.Key() != "" {
		// A copy: spanStart is shared by every call.
		opts = append(opts[:len(opts):len(opts)], trace.WithAttributes(attribute.String("tenace.key", x.Key())))
	}
	ctx, span := s.t.tracer.Start(ctx, s.t.spanName, opts...)
	// End is deferred itself, not called from a deferred closure: only
	// then can the SDK's End recover a panic in fn to record it (as an
	// exception event) before it goes on up. The status is set first.
	defer span.End()
	returned := false
	defer func() {
		switch {
		case !returned:
			span.SetStatus(codes.Error, "panic")
		case err != nil:
			span.SetStatus(codes.Error, err.Error())
		}
	}()
	err = next.Run(ctx)
	returned = true
	return err
}

// ObserveStats registers gauges that read sp.Stats() at each collection:
//
//	name                            unit      what
//	tenace.provider.held            {key}     keys held (through this provider value)
//	tenace.provider.waiting         {caller}  callers waiting (in this process)
//	tenace.provider.longest_queue   {caller}  most callers waiting for one key (0: unknown)
//	tenace.provider.shared.keys     {key}     keys held shared (part of held)
//	tenace.provider.shared.holders  {lease}   shared leases held: the permits in use
//	tenace.provider.shared.waiting  {caller}  callers waiting for a shared lease (part of waiting)
//
// The shared gauges are LockStats' SharedKeys, SharedHolders and
// SharedWaiting: 0 for a provider that does not count by mode; for the
// distributed providers of this module, the shared leases and callers of
// this process; held − shared.keys keys (or leases) are held exclusive.
//
// attrs tell providers apart (attribute.String("tenace.provider", "orders"),
// say). mp nil means otel.GetMeterProvider(). Unregister the returned
// registration when the provider is closed.
func ObserveStats(mp metric.MeterProvider, sp tenace.StatsProvider, attrs ...attribute.KeyValue) (metric.Registration, error) {
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	meter := mp.Meter(ScopeName)
	held, err := meter.Int64ObservableGauge("tenace.provider.held",
		metric.WithUnit("{key}"), metric.WithDescription("Keys held through the provider."))
	if err != nil {
		return nil, err
	}
	waiting, err := meter.Int64ObservableGauge("tenace.provider.waiting",
		metric.WithUnit("{caller}"), metric.WithDescription("Callers waiting for a key of the provider, in this process."))
	if err != nil {
		return nil, err
	}
	longest, err := meter.Int64ObservableGauge("tenace.provider.longest_queue",
		metric.WithUnit("{caller}"), metric.WithDescription("Most callers waiting for one key of the provider (0: not known)."))
	if err != nil {
		return nil, err
	}
	sharedKeys, err := meter.Int64ObservableGauge("tenace.provider.shared.keys",
		metric.WithUnit("{key}"), metric.WithDescription("Keys held shared through the provider (0: not counted by mode)."))
	if err != nil {
		return nil, err
	}
	sharedHolders, err := meter.Int64ObservableGauge("tenace.provider.shared.holders",
		metric.WithUnit("{lease}"), metric.WithDescription("Shared leases held through the provider: the permits in use (0: not counted by mode)."))
	if err != nil {
		return nil, err
	}
	sharedWaiting, err := meter.Int64ObservableGauge("tenace.provider.shared.waiting",
		metric.WithUnit("{caller}"), metric.WithDescription("Callers waiting for a shared lease of the provider, in this process (0: not counted by mode)."))
	if err != nil {
		return nil, err
	}
	set := metric.WithAttributeSet(attribute.NewSet(attrs...))
	return meter.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		s := sp.Stats()
		o.ObserveInt64(held, int64(s.Held), set)
		o.ObserveInt64(waiting, int64(s.Waiting), set)
		o.ObserveInt64(longest, int64(s.LongestQueue), set)
		o.ObserveInt64(sharedKeys, int64(s.SharedKeys), set)
		o.ObserveInt64(sharedHolders, int64(s.SharedHolders), set)
		o.ObserveInt64(sharedWaiting, int64(s.SharedWaiting), set)
		return nil
	}, held, waiting, longest, sharedKeys, sharedHolders, sharedWaiting)
}

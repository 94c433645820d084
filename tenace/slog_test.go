package tenace_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"

	"tenace.dev/tenace"
)

// logLines decodes the JSON lines a slog.JSONHandler wrote, without the time.
func logLines(t *testing.T, buf *bytes.Buffer) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(buf.String()), "\n") {
		if line == "" {
			continue
		}
		var m map[string]any
		require.NoError(t, json.Unmarshal([]byte(line), &m), line)
		delete(m, "time")
		out = append(out, m)
	}
	return out
}

func TestLogEventsLogsEachEventWithItsFieldsAndLevel(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := tenace.NewMemoryLockProvider(tenace.WithOwner("api-7f9c"))
		defer p.Close()
		var buf bytes.Buffer
		logger := slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
		pol := tenace.NewPolicy().WithLock(tenace.LockOptions{Provider: p, Key: "k", Timeout: 2 * time.Second}).
			OnEvent(tenace.LogEvents(logger))
		var token uint64
		require.NoError(t, pol.Execute(bg, func(ctx context.Context) error {
			l, _ := tenace.LeaseFrom(ctx)
			token = l.(tenace.FencedLease).Token()
			// While held, a second call waits its 2 s and is rejected.
			var nae *tenace.LockNotAcquiredError
			require.ErrorAs(t, pol.Execute(bg, noop), &nae)
			return nil
		}))
		tok := float64(token)
		// The memory provider names the holder it found: the second call
		// waited 2 s behind the first, granted just before it.
		rejected := `tenace: lock "k" not acquired within its 2s timeout: held by api-7f9c for 2s; retry later or raise LockOptions.Timeout`
		require.Equal(t, []map[string]any{
			{"level": "DEBUG", "msg": "lock.acquiring", "key": "k"},
			{"level": "DEBUG", "msg": "lock.acquired", "key": "k", "wait": 0.0, "token": tok},
			{"level": "DEBUG", "msg": "lock.acquiring", "key": "k"},
			{"level": "WARN", "msg": "lock.rejected", "key": "k", "wait": float64(2 * time.Second), "holder": "api-7f9c", "held": float64(2 * time.Second), "err": rejected},
			{"level": "DEBUG", "msg": "lock.released", "key": "k", "hold": float64(2 * time.Second), "token": tok},
		}, logLines(t, &buf))
	})
}

func TestLogEventsLogsLossesFailuresAndFailedReleasesAtWarn(t *testing.T) {
	fp := &fakeProvider{}
	lease := &losableLease{fakeLease: fakeLease{p: fp, releaseErr: errBoom}}
	fp.acquire = func(context.Context, string) (tenace.LockLease, error) { return lease, nil }
	var buf bytes.Buffer
	logger := slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: slog.LevelWarn}))
	pol := tenace.NewPolicy().WithLock(tenace.LockOptions{Provider: fp, Key: "k"}).OnEvent(tenace.LogEvents(logger))
	err := pol.Execute(bg, func(ctx context.Context) error {
		lease.Lose(errors.New("renewal found another holder"))
		<-ctx.Done()
		return context.Cause(ctx)
	})
	require.ErrorIs(t, err, tenace.ErrLeaseLost)
	fp.acquire = func(context.Context, string) (tenace.LockLease, error) { return nil, errBoom }
	require.ErrorIs(t, pol.Execute(bg, noop), errBoom)
	var te *tenace.TimeoutError
	require.ErrorAs(t, tenace.NewPolicy().WithTimeout(time.Millisecond).OnEvent(tenace.LogEvents(logger)).
		Execute(bg, func(ctx context.Context) error { <-ctx.Done(); return ctx.Err() }, tenace.WithKey("k")), &te)

	lines := logLines(t, &buf)
	require.Len(t, lines, 4, "only the Warn events: %v", lines)
	require.Equal(t, "lock.lost", lines[0]["msg"])
	require.Contains(t, lines[0]["err"], "renewal found another holder")
	require.Contains(t, lines[0], "hold")
	require.Equal(t, "lock.released", lines[1]["msg"])
	require.Equal(t, "boom", lines[1]["err"])
	require.Equal(t, "lock.failed", lines[2]["msg"])
	require.Equal(t, "boom", lines[2]["err"])
	require.Equal(t, "timeout", lines[3]["msg"], "the work was cut short")
	require.Equal(t, "k", lines[3]["key"])
	for _, l := range lines {
		require.Equal(t, "WARN", l["level"])
	}
}

// A deadlock is logged at Error, apart from contention: the wait it ended
// and the *DeadlockError, which names the key.
func TestLogEventsLogsADeadlockAtError(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := tenace.NewMemoryLockProvider()
		defer p.Close()
		var buf bytes.Buffer
		logger := slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: slog.LevelError}))
		pol := tenace.NewPolicy().WithLock(tenace.LockOptions{Provider: p, Key: "k"}).OnEvent(tenace.LogEvents(logger))
		var d *tenace.DeadlockError
		require.ErrorAs(t, pol.Execute(bg, func(ctx context.Context) error { return pol.Execute(ctx, noop) }), &d)
		require.Equal(t, []map[string]any{
			{"level": "ERROR", "msg": "lock.deadlock", "key": "k", "wait": 0.0, "err": d.Error()},
		}, logLines(t, &buf))
	})
}

// ctxHandler is a real slog handler that adds what it finds in the record's
// context, as a handler adding trace ids does.
type ctxHandler struct{ slog.Handler }

func (h ctxHandler) Handle(ctx context.Context, r slog.Record) error {
	if v, ok := ctx.Value(ctxMark{}).(string); ok {
		r.AddAttrs(slog.String("from_ctx", v))
	}
	return h.Handler.Handle(ctx, r)
}

func TestLogEventsPassesTheCallersContextToTheHandler(t *testing.T) {
	p, _ := newProvider(t)
	var buf bytes.Buffer
	logger := slog.New(ctxHandler{slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug})})
	require.NoError(t, tenace.NewPolicy().WithLock(tenace.LockOptions{Provider: p, Key: "k"}).
		OnEvent(tenace.LogEvents(logger)).Execute(markedCtx(), noop))
	lines := logLines(t, &buf)
	require.Len(t, lines, 3)
	for _, l := range lines {
		require.Equal(t, "caller", l["from_ctx"], "%v", l)
	}
}

func TestLogEventsWithANilLoggerUsesTheDefault(t *testing.T) {
	var buf bytes.Buffer
	old := slog.Default()
	slog.SetDefault(slog.New(slog.NewJSONHandler(&buf, nil)))
	defer slog.SetDefault(old)
	listen := tenace.LogEvents(nil)
	listen(tenace.Event{Name: tenace.EventLockRejected, Key: "k"})
	listen(tenace.Event{Name: "third.party"}) // no Context: still logged (below Info: dropped)
	lines := logLines(t, &buf)
	require.Equal(t, []map[string]any{{"level": "WARN", "msg": "lock.rejected", "key": "k", "wait": 0.0}}, lines)
}

// LogEvents logs a policy's events through log/slog: rejections and lost
// leases at Warn, the rest at Debug.
func ExampleLogEvents() {
	logger := slog.New(slog.NewTextHandler(os.Stdout, &slog.HandlerOptions{
		Level: slog.LevelDebug,
		ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
			switch {
			case a.Key == slog.TimeKey:
				return slog.Attr{} // no time, for a stable example
			case a.Value.Kind() == slog.KindDuration:
				a.Value = slog.DurationValue(a.Value.Duration().Round(time.Second))
			case a.Key == "token":
				return slog.Attr{}
			}
			return a
		},
	}))
	provider := tenace.NewMemoryLockProvider(tenace.WithOwner("api-7f9c"))
	defer provider.Close()
	p := tenace.NewPolicy().
		WithLock(tenace.LockOptions{Provider: provider, Key: "reports", Timeout: tenace.NoWait}).
		OnEvent(tenace.LogEvents(logger))
	err := p.Execute(context.Background(), func(ctx context.Context) error {
		// Another call (a ctx of its own): "reports" is held, so it is rejected.
		return p.Execute(context.Background(), func(context.Context) error { return nil })
	})
	fmt.Println(err != nil)
	// Output:
	// level=DEBUG msg=lock.acquiring key=reports
	// level=DEBUG msg=lock.acquired key=reports wait=0s
	// level=DEBUG msg=lock.acquiring key=reports
	// level=WARN msg=lock.rejected key=reports wait=0s holder=api-7f9c held=0s err="tenace: lock \"reports\" not acquired at once (NoWait): held by api-7f9c for under 1s; retry later, or wait with a LockOptions.Timeout"
	// level=DEBUG msg=lock.released key=reports hold=0s
	// true
}

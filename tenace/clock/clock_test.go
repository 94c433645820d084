package clock_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"go.uber.org/goleak"

	"tenace.dev/tenace/clock"
	"tenace.dev/tenace/internal/fakeclock"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// WithTimeoutCause on a test clock ends its context as
// context.WithTimeoutCause does: with a nil cause the cause is
// context.DeadlineExceeded, and a d that is not positive has passed
// already. (What it rules out: with a nil cause, Err reporting
// context.DeadlineExceeded from the start with Done still open, and
// context.Canceled once the clock fires; a d that is not positive waiting
// for the clock's next Advance.)
func TestWithTimeoutCauseOnAClockIsTheStandardLibrarys(t *testing.T) {
	errMine := errors.New("mine")
	for _, c := range []struct {
		name      string
		d         time.Duration
		cause     error
		wantCause error
	}{
		{"a cause", time.Minute, errMine, errMine},
		{"nil cause", time.Minute, nil, context.DeadlineExceeded},
		{"zero d", 0, errMine, errMine},
		{"negative d, nil cause", -time.Second, nil, context.DeadlineExceeded},
	} {
		t.Run(c.name, func(t *testing.T) {
			clk := fakeclock.New()
			ctx, cancel := clock.WithTimeoutCause(context.Background(), clk, c.d, c.cause)
			defer cancel()
			if c.d > 0 {
				require.NoError(t, ctx.Err())
				clk.Advance(c.d)
			}
			select {
			case <-ctx.Done():
			default:
				t.Fatalf("not ended; Err: %v", ctx.Err())
			}
			require.Equal(t, context.DeadlineExceeded, ctx.Err())
			require.Equal(t, c.wantCause, context.Cause(ctx))
			d, ok := ctx.Deadline()
			require.True(t, ok)
			require.Equal(t, clk.Now().Add(min(c.d, 0)), d)
		})
	}
}

// wrapped is a Clock built on the system clock: not the system clock for
// IsSystem, since its Now may say something else.
type wrapped struct{ clock.Clock }

func TestIsSystem(t *testing.T) {
	require.True(t, clock.IsSystem(nil))
	require.True(t, clock.IsSystem(clock.System()))
	require.False(t, clock.IsSystem(fakeclock.New()))
	require.False(t, clock.IsSystem(wrapped{clock.System()}))
}

func TestTheSystemClocksAfterFuncStops(t *testing.T) {
	stop := clock.System().AfterFunc(time.Hour, func() { t.Error("called") })
	require.True(t, stop(), "stopped before it fired")
	require.False(t, stop(), "already stopped")

	fired := make(chan struct{})
	stop = clock.System().AfterFunc(0, func() { close(fired) })
	<-fired
	require.False(t, stop(), "fired already")
}

// On the system clock WithTimeoutCause is the standard library's: a real
// deadline, which clients that set socket deadlines from a context honour.
func TestWithTimeoutCauseOnTheSystemClockHasARealDeadline(t *testing.T) {
	errMine := errors.New("mine")
	before := time.Now()
	ctx, cancel := clock.WithTimeoutCause(context.Background(), nil, time.Hour, errMine)
	defer cancel()
	d, ok := ctx.Deadline()
	require.True(t, ok)
	require.WithinDuration(t, before.Add(time.Hour), d, time.Minute)

	ctx, cancel = clock.WithTimeoutCause(context.Background(), clock.System(), 0, errMine)
	defer cancel()
	<-ctx.Done()
	require.Equal(t, errMine, context.Cause(ctx))
}

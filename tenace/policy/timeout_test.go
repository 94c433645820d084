package policy_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"tenace.dev/tenace/internal/fakeclock"
	"tenace.dev/tenace/policy"
)

// WithTimeoutCause on a test clock ends its context as
// context.WithTimeoutCause does: with a nil cause the cause is
// context.DeadlineExceeded, and a d that is not positive has passed
// already. (With a nil cause, Err reported context.DeadlineExceeded from
// the start, Done still open, and context.Canceled once the clock fired; a
// d that was not positive waited for the clock's next Advance.)
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
			ctx, cancel := policy.WithTimeoutCause(context.Background(), clk, c.d, c.cause)
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

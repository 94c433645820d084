package etcdlock

import (
	"context"
	"errors"
	"runtime"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"google.golang.org/grpc/metadata"
)

// TestHedge: hedge's tries and answers, on synctest's clock, with requests
// that answer when told to (or when their context ends).
func TestHedge(t *testing.T) {
	boom := errors.New("boom")
	const every = 250 * time.Millisecond

	t.Run("answered in time: one try, on the caller's goroutine", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			var caller uint64
			resp, tries, err := hedge(t.Context(), every, time.Time{}, func(context.Context) (int, error) {
				caller = goid()
				return 7, nil
			})
			require.NoError(t, err)
			require.Equal(t, 7, resp)
			require.Equal(t, 1, tries)
			require.Equal(t, goid(), caller, "the first try ran on another goroutine")
		})
	})

	t.Run("unanswered: the next try wins, the first is cut short", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			var n atomic.Int32
			firstEnded := make(chan error, 1)
			resp, tries, err := hedge(t.Context(), every, time.Time{}, func(ctx context.Context) (int, error) {
				if n.Add(1) == 1 {
					<-ctx.Done() // a member that does not answer
					firstEnded <- ctx.Err()
					return 0, ctx.Err()
				}
				return 2, nil
			})
			require.NoError(t, err)
			require.Equal(t, 2, resp)
			require.Equal(t, 2, tries)
			require.ErrorIs(t, <-firstEnded, context.Canceled)
		})
	})

	t.Run("unanswered, then the first answers before the second", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			var n atomic.Int32
			start := time.Now()
			resp, tries, err := hedge(t.Context(), every, time.Time{}, func(ctx context.Context) (int, error) {
				i := n.Add(1)
				delay := 300 * time.Millisecond // the first: slow, still first
				if i > 1 {
					delay = time.Hour
				}
				select {
				case <-time.After(delay):
					return int(i), nil
				case <-ctx.Done():
					return 0, ctx.Err()
				}
			})
			require.NoError(t, err)
			require.Equal(t, 1, resp, "a try not cut short: the first still lands")
			require.Equal(t, 2, tries)
			require.Equal(t, 300*time.Millisecond, time.Since(start))
		})
	})

	t.Run("a transient failure is sent again after retryPause", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			var n atomic.Int32
			start := time.Now()
			resp, tries, err := hedge(t.Context(), every, time.Time{}, func(context.Context) (int, error) {
				if n.Add(1) == 1 {
					return 0, rpctypes.ErrGRPCNoLeader
				}
				return 2, nil
			})
			require.NoError(t, err)
			require.Equal(t, 2, resp)
			require.Equal(t, 2, tries)
			require.Equal(t, retryPause, time.Since(start))
		})
	})

	t.Run("another failure is returned at once", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			_, tries, err := hedge(t.Context(), every, time.Time{}, func(context.Context) (int, error) { return 0, boom })
			require.ErrorIs(t, err, boom)
			require.Equal(t, 1, tries)
		})
	})

	t.Run("past until, unanswered: errUnanswered", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			start := time.Now()
			_, tries, err := hedge(t.Context(), every, start.Add(600*time.Millisecond), func(ctx context.Context) (int, error) {
				<-ctx.Done()
				return 0, ctx.Err()
			})
			require.ErrorIs(t, err, errUnanswered)
			require.Equal(t, 3, tries, "tries at 0, 250ms and 500ms")
			require.Equal(t, 750*time.Millisecond, time.Since(start))
		})
	})

	t.Run("transient failures until ctx ends: the last one", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(t.Context(), time.Second)
			defer cancel()
			_, tries, err := hedge(ctx, every, time.Time{}, func(context.Context) (int, error) { return 0, rpctypes.ErrGRPCNoLeader })
			require.ErrorIs(t, err, rpctypes.ErrGRPCNoLeader)
			require.Greater(t, tries, 10)
		})
	})

	for _, tc := range []struct {
		name  string
		limit bool // hedgeWithin's limit, else a deadline of ctx
	}{{"past the limit, no deadline on the tries", true}, {"ctx ends while hedged", false}} {
		t.Run(tc.name+": DeadlineExceeded, every try ended", func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				ctx, limit := t.Context(), 900*time.Millisecond
				if !tc.limit {
					var cancel context.CancelFunc
					ctx, cancel = context.WithTimeout(ctx, limit)
					defer cancel()
					limit = 0
				}
				start := time.Now()
				var running atomic.Int32
				_, tries, err := hedgeWithin(ctx, limit, every, time.Time{}, func(ctx context.Context) (int, error) {
					if _, ok := ctx.Deadline(); ok && tc.limit {
						t.Error("a try with a deadline: the limit is hedge's own")
					}
					running.Add(1)
					defer running.Add(-1)
					<-ctx.Done()
					return 0, ctx.Err()
				})
				require.ErrorIs(t, err, context.DeadlineExceeded)
				require.Equal(t, 4, tries, "tries at 0, 250, 500 and 750ms")
				require.Equal(t, 900*time.Millisecond, time.Since(start))
				require.Zero(t, running.Load(), "hedge returned before its tries")
			})
		})
	}
}

// goid is the calling goroutine's id, from its stack trace's first line.
func goid() uint64 {
	buf := make([]byte, 64)
	buf = buf[:runtime.Stack(buf, false)]
	var id uint64
	for _, c := range buf[len("goroutine "):] {
		if c < '0' || c > '9' {
			break
		}
		id = id*10 + uint64(c-'0')
	}
	return id
}

// Every try of a hedged request asks for a leader (a member without one
// says so at once, and the next try goes to another), and keeps the
// caller's own metadata.
func TestHedgeRequiresALeader(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := metadata.AppendToOutgoingContext(t.Context(), "caller", "x")
		var got []metadata.MD
		_, tries, err := hedge(ctx, time.Hour, time.Time{}, func(ctx context.Context) (int, error) {
			md, _ := metadata.FromOutgoingContext(ctx)
			got = append(got, md)
			if len(got) == 1 {
				return 0, rpctypes.ErrGRPCNoLeader // transient: sent again
			}
			return 1, nil
		})
		require.NoError(t, err)
		require.Equal(t, 2, tries)
		for _, md := range got {
			require.Equal(t, []string{rpctypes.MetadataHasLeader}, md.Get(rpctypes.MetadataRequireLeaderKey))
			require.Equal(t, []string{"x"}, md.Get("caller"))
		}
	})
}

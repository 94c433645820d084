package load

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// fakeLocker runs fn for every operation whose context has no deadline (the
// cancel scenario's short-lived ones have one) and does what giveUp says
// with the others: a deadline-carrying operation gives up with its
// context's error once that context ends, or fails with err when err is set.
type fakeLocker struct {
	ran, gaveUp atomic.Int64
	err         error // returned by the deadline-carrying operations, instead of giving up
}

func (f *fakeLocker) Do(ctx context.Context, _ string, fn func(context.Context) error) error {
	if _, ok := ctx.Deadline(); ok {
		if f.err != nil {
			return f.err
		}
		<-ctx.Done()
		f.gaveUp.Add(1)
		return ctx.Err()
	}
	f.ran.Add(1)
	return fn(ctx)
}
func (f *fakeLocker) TakesContext() bool { return true }
func (f *fakeLocker) Close()             {}

// An op is one acquire + release (bench/README.md): an operation that gave
// up is counted in Gaveup and not in Ops, so it does not add to ops/s.
func TestGaveUpOperationsAreNotCountedAsOps(t *testing.T) {
	f := &fakeLocker{}
	r, err := measure(f, cell{Impl: "fake", Scenario: "cancel", Goroutines: 4, Duration: 30 * time.Millisecond}, nil, "")
	require.NoError(t, err)
	require.Positive(t, f.gaveUp.Load())
	require.Equal(t, f.ran.Load(), r.Ops, "ops: the operations that acquired and released")
	require.Equal(t, f.gaveUp.Load(), r.Gaveup)
	require.InDelta(t, float64(r.Ops)/r.Elapsed.Seconds(), r.OpsPerSec, 1e-6)
}

// An error that is not a give-up (the operation's context had not ended)
// is a failure of the implementation: the cell fails with it, rather than
// counting the failed operation as an op that gave up.
func TestAnOperationThatFailsFailsTheCell(t *testing.T) {
	boom := errors.New("boom")
	_, err := measure(&fakeLocker{err: boom}, cell{Impl: "fake", Scenario: "cancel", Goroutines: 4, Duration: time.Minute}, nil, "")
	require.ErrorIs(t, err, boom)
}

// A Locker that reports success without running fn measured nothing.
func TestAnOperationThatSucceedsWithoutRunningFnFailsTheCell(t *testing.T) {
	_, err := measure(lockerFunc(func(context.Context, string, func(context.Context) error) error { return nil }),
		cell{Impl: "fake", Scenario: "hot", Goroutines: 2, Duration: time.Minute}, nil, "")
	require.ErrorContains(t, err, "without running")
}

type lockerFunc func(ctx context.Context, key string, fn func(context.Context) error) error

func (f lockerFunc) Do(ctx context.Context, key string, fn func(context.Context) error) error {
	return f(ctx, key, fn)
}
func (lockerFunc) TakesContext() bool { return true }
func (lockerFunc) Close()             {}

// The holders-inside check counts per key: every Worker that locks a key
// shares its counter, and each position of a Worker's sequence has the
// counter of the key there.
func TestInsideCountersAreOnePerKey(t *testing.T) {
	ws := []*Worker{{keys: []string{"a", "b", "a"}}, {keys: []string{"b", "c"}}}
	inside := insideCounters(ws)
	require.Len(t, inside, 2)
	require.Same(t, inside[0][0], inside[0][2], "a")
	require.Same(t, inside[0][1], inside[1][0], "b")
	require.NotSame(t, inside[0][0], inside[0][1])
	require.NotSame(t, inside[1][1], inside[0][0])
	require.NotSame(t, inside[1][1], inside[0][1])
}

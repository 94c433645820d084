package policy_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"tenace.dev/tenace/clock"
	"tenace.dev/tenace/policy"
)

// emitter is a step that reports one event and what clock it was given.
type emitter struct{ clocks *[]policy.Clock }

func (e emitter) Run(ctx context.Context, x policy.Execution, next policy.Next) error {
	*e.clocks = append(*e.clocks, x.Clock())
	x.Emit(policy.Event{Name: "step", Key: x.Key(), Context: ctx})
	return next.Run(ctx)
}

type fixedClock struct{ policy.Clock }

func (fixedClock) Now() time.Time { return time.Unix(1, 0) }

// A pipeline is immutable: listeners and a clock added to one pipeline are
// not seen by the pipeline it was built from, nor by a sibling built from
// the same base.
func TestPipelinesBuiltFromOneBaseDoNotShareListenersOrClock(t *testing.T) {
	var clocks []policy.Clock
	var seen []string
	listen := func(name string) func(policy.Event) {
		return func(policy.Event) { seen = append(seen, name) }
	}
	base := policy.Pipeline{}.With(emitter{&clocks}).OnEvent(listen("base"))
	withB := base.OnEvent(listen("b"))
	withClock := base.WithClock(fixedClock{clock.System()})
	noop := func(context.Context) error { return nil }

	for _, c := range []struct {
		name  string
		p     policy.Pipeline
		seen  []string
		fixed bool
	}{
		{"base", base, []string{"base"}, false},
		{"withB", withB, []string{"base", "b"}, false},
		{"withClock", withClock, []string{"base"}, true},
		{"base again", base, []string{"base"}, false},
	} {
		seen, clocks = nil, nil
		require.NoError(t, c.p.Execute(context.Background(), "k", noop), c.name)
		require.Equal(t, c.seen, seen, c.name)
		require.Len(t, clocks, 1, c.name)
		_, fixed := clocks[0].(fixedClock)
		require.Equal(t, c.fixed, fixed, c.name)
	}
	// The zero pipeline: system clock, no listeners.
	var x policy.Execution
	require.False(t, x.HasListeners())
	require.True(t, clock.IsSystem(x.Clock()))
	x.Emit(policy.Event{Name: "nobody listens"})
}

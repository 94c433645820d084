//go:build !race

// Allocation budgets. The race detector makes sync.Pool drop items at random,
// so these run without -race (make test runs them in a second pass).

package tenace_test

import (
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"tenace.dev/tenace"
)

// TestUncontendedAcquireReleaseAllocatesOnlyTheLease pins the allocation
// budget: one allocation per Acquire+Release through the interface, the lease
// handle (which must not be pooled).
func TestUncontendedAcquireReleaseAllocatesOnlyTheLease(t *testing.T) {
	p, _ := newProvider(t)
	var lp tenace.LockProvider = p
	allocs := testing.AllocsPerRun(1000, func() {
		l, _ := lp.Acquire(bg, "k", tenace.LockAcquireOptions{})
		_ = l.Release(bg)
	})
	require.LessOrEqual(t, allocs, 1.0)
	allocs = testing.AllocsPerRun(1000, func() {
		l, _ := lp.Acquire(bg, "k", tenace.LockAcquireOptions{Timeout: time.Second})
		_ = l.Release(bg)
	})
	require.LessOrEqual(t, allocs, 1.0, "with a timeout too: timers are pooled")
}

// TestExecuteOfALockOnlyPolicyAllocatesOnce pins the pipeline's budget: one
// allocation per Execute of a lock-only policy on the memory provider (the
// context that carries the lease, with the lease inside it).
func TestExecuteOfALockOnlyPolicyAllocatesOnce(t *testing.T) {
	p, _ := newProvider(t)
	pol := tenace.NewPolicy().WithLock(tenace.LockOptions{Provider: p})
	allocs := testing.AllocsPerRun(1000, func() {
		_ = pol.Execute(bg, noop, tenace.WithKey("k"))
	})
	require.LessOrEqual(t, allocs, 1.0)
}

// TestEventsAllocateNothing pins the cost of events: a listener, even the
// slog one with a handler that writes, adds no allocation to Execute.
func TestEventsAllocateNothing(t *testing.T) {
	p, _ := newProvider(t)
	lock := tenace.NewPolicy().WithLock(tenace.LockOptions{Provider: p})
	for name, pol := range map[string]tenace.Policy{
		"listener":   lock.OnEvent(func(tenace.Event) {}),
		"slog":       lock.OnEvent(tenace.LogEvents(slog.New(slog.DiscardHandler))),
		"slog, text": lock.OnEvent(tenace.LogEvents(slog.New(slog.NewTextHandler(io.Discard, &slog.HandlerOptions{Level: slog.LevelDebug})))),
	} {
		allocs := testing.AllocsPerRun(1000, func() {
			_ = pol.Execute(bg, noop, tenace.WithKey("k"))
		})
		require.LessOrEqual(t, allocs, 1.0, name)
	}
}

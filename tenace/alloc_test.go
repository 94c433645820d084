//go:build !race

// Allocation budgets. The race detector makes sync.Pool drop items at random,
// so these run without -race (make test runs them in a second pass).

package tenace_test

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"tenace.dev/tenace"
)

// TestUncontendedAcquireReleaseAllocatesNoLease pins the allocation budget
// of an Acquire+Release through the interface: no allocation of its own. The
// lease is the shard's Grant, which must not be pooled (a second Release of
// it must still name the same grant), and the shard cuts Grants from slabs of
// 32: one allocation every 32 acquires, and nothing else.
func TestUncontendedAcquireReleaseAllocatesNoLease(t *testing.T) {
	const slab = 32 // shard.grantSlab
	p, _ := newProvider(t)
	var lp tenace.LockProvider = p
	allocs := testing.AllocsPerRun(200, func() {
		for range slab {
			l, _ := lp.Acquire(bg, "k", tenace.LockAcquireOptions{})
			_ = l.Release(bg)
		}
	})
	require.Equal(t, 1.0, allocs, "one slab per 32 acquires")
	allocs = testing.AllocsPerRun(200, func() {
		for range slab {
			l, _ := lp.Acquire(bg, "k", tenace.LockAcquireOptions{Timeout: time.Second})
			_ = l.Release(bg)
		}
	})
	require.Equal(t, 1.0, allocs, "with a timeout too: timers are pooled")
}

// TestExecuteOfALockOnlyPolicyAllocatesOnce pins the pipeline's budget: one
// allocation per Execute of a lock-only policy on the memory provider (the
// context that carries the lease; the lease itself is cut from a slab, see
// TestUncontendedAcquireReleaseAllocatesNoLease).
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
		// A shared lock's events carry its mode (and slog logs it).
		"shared, slog": tenace.NewPolicy().WithLock(tenace.LockOptions{Provider: p, Shared: true, Permits: 2}).
			OnEvent(tenace.LogEvents(slog.New(slog.NewTextHandler(io.Discard, &slog.HandlerOptions{Level: slog.LevelDebug})))),
	} {
		allocs := testing.AllocsPerRun(1000, func() {
			_ = pol.Execute(bg, noop, tenace.WithKey("k"))
		})
		require.LessOrEqual(t, allocs, 1.0, name)
	}
}

// TestTokenFromAllocatesNothing: reading the token inside fn adds nothing
// to a lock-only policy's one allocation.
func TestTokenFromAllocatesNothing(t *testing.T) {
	p, _ := newProvider(t)
	pol := tenace.NewPolicy().WithLock(tenace.LockOptions{Provider: p})
	fn := func(ctx context.Context) error {
		_, _ = tenace.TokenFrom(ctx)
		return nil
	}
	allocs := testing.AllocsPerRun(1000, func() {
		_ = pol.Execute(bg, fn, tenace.WithKey("k"))
	})
	require.LessOrEqual(t, allocs, 1.0)
}

// TestLockWithTimeoutAndOwnerAllocatesOnce: a Lock with a Timeout (which
// watches for the holder a refusal names, through a pooled recorder) and
// an Owner label stays at one allocation per Execute, like a plain one.
func TestLockWithTimeoutAndOwnerAllocatesOnce(t *testing.T) {
	p, _ := newProvider(t)
	for name, opts := range map[string]tenace.LockOptions{
		"timeout":           {Provider: p, Timeout: time.Second},
		"nowait":            {Provider: p, Timeout: tenace.NoWait},
		"timeout, owner":    {Provider: p, Timeout: time.Second, Owner: "nightly"},
		"owner, no timeout": {Provider: p, Owner: "nightly"},
	} {
		pol := tenace.NewPolicy().WithLock(opts)
		allocs := testing.AllocsPerRun(1000, func() {
			_ = pol.Execute(bg, noop, tenace.WithKey("k"))
		})
		require.LessOrEqual(t, allocs, 1.0, name)
	}
}

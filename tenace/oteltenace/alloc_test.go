//go:build !race

package oteltenace_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"tenace.dev/tenace"
)

// TestTheListenerAllocatesNothing pins the listener's cost: with the real
// SDK, and without the lock key, Execute keeps the budget of a lock-only
// policy: nothing of its own, one slab of the memory provider's Grants
// every 64 Executes.
func TestTheListenerAllocatesNothing(t *testing.T) {
	s := newSDK(t)
	tel := s.telemetry()
	p := tenace.NewMemoryLockProvider()
	defer p.Close()
	pol := tenace.NewPolicy().WithLock(tenace.LockOptions{Provider: p, Key: "k"}).OnEvent(tel.Listen)
	allocs := testing.AllocsPerRun(200, func() {
		for range 64 { // a slab of Grants
			_ = pol.Execute(bg, noop)
		}
	})
	require.Equal(t, 1.0, allocs)
}

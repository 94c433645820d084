//go:build !race

package oteltenace_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"tenace.dev/tenace"
)

// TestTheListenerAllocatesNothing pins the listener's cost: with the real
// SDK, and without the lock key, Execute keeps the one allocation of a
// lock-only policy.
func TestTheListenerAllocatesNothing(t *testing.T) {
	s := newSDK(t)
	tel := s.telemetry()
	p := tenace.NewMemoryLockProvider()
	defer p.Close()
	pol := tenace.NewPolicy().WithLock(tenace.LockOptions{Provider: p, Key: "k"}).OnEvent(tel.Listen)
	allocs := testing.AllocsPerRun(1000, func() { _ = pol.Execute(bg, noop) })
	require.LessOrEqual(t, allocs, 1.0)
}

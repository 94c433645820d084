//go:build !race

package oteltenace_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"tenace.dev/tenace"
	"tenace.dev/tenace/oteltenace"
)

// TestTheListenerAllocatesNothing pins the listener's cost: with the real
// SDK, and without the lock key, Execute keeps the one allocation of a
// lock-only policy, exclusive or shared (each mode's attribute sets are
// made once).
func TestTheListenerAllocatesNothing(t *testing.T) {
	s := newSDK(t)
	p := tenace.NewMemoryLockProvider()
	defer p.Close()
	for name, tel := range map[string]*oteltenace.Telemetry{
		"no name": s.telemetry(),
		"a name":  s.telemetry(oteltenace.WithName("reports")),
	} {
		for _, shared := range []bool{false, true} {
			pol := tenace.NewPolicy().WithLock(tenace.LockOptions{Provider: p, Key: "k", Shared: shared}).OnEvent(tel.Listen)
			allocs := testing.AllocsPerRun(1000, func() { _ = pol.Execute(bg, noop) })
			require.LessOrEqual(t, allocs, 1.0, "%s, shared %v", name, shared)
		}
	}
}

package load

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The conclusions are computed from the run: the floor's share, the
// fastest peer with its tail beside tenace's, and the faster rows grouped
// by the guarantees they lack; a scenario where tenace leads says so.
func TestConclusionsAreComputedFromTheRun(t *testing.T) {
	row := func(impl, sc string, g int, ops float64, p999, max time.Duration) result {
		return result{cell: cell{Impl: impl, Family: "memory", Scenario: sc, Goroutines: g}, OpsPerSec: ops, P999: p999, Max: max, Floor: time.Microsecond}
	}
	rs := []result{
		row("tenace", "hot", 16, 500_000, 20*time.Microsecond, time.Millisecond),
		row("semaphore", "hot", 16, 600_000, 30*time.Microsecond, 2*time.Millisecond),
		row("moby", "hot", 16, 2_000_000, 5*time.Microsecond, 3*time.Millisecond),
		row("keymutex", "hot", 16, 400_000, 5*time.Microsecond, 3*time.Millisecond),
		row("tenace", "distinct", 1, 800_000, 2*time.Microsecond, 50*time.Microsecond),
		row("semaphore", "distinct", 1, 400_000, 3*time.Microsecond, 60*time.Microsecond),
	}
	var b strings.Builder
	conclude(&b, rs)
	out := b.String()
	require.Contains(t, out, "hot (g=16): tenace runs at 0.50× the floor's rate")
	require.Contains(t, out, "the fastest peer, moby, does 4.00× tenace's ops/s at g=16, p999 5.0µs and max 3.00ms against tenace's 20.0µs and 1.00ms")
	require.Contains(t, out, "Faster: moby (without arrival order, timeouts and cancellation that never leak, fencing tokens); semaphore (without fencing tokens).")
	require.NotContains(t, out, "keymutex", "a slower row is not a faster one")
	require.Contains(t, out, "distinct (g=1): tenace runs at 0.80× the floor's rate")
	require.Contains(t, out, "tenace leads every peer; the closest, semaphore, does 0.50× tenace's ops/s")
	require.Contains(t, out, "No row is faster; tenace gives arrival order")
	require.Equal(t, 4, strings.Count(out, "\n"), "a blank line, a heading and one line per scenario:\n%s", out)
}

package etcdlock_test

import (
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"tenace.dev/tenace"
	"tenace.dev/tenace/clock"
)

// otherClock is the system clock behind a type the provider does not take
// for it: the path of a Timeout on a caller's clock.
type otherClock struct{ clock.Clock }

// TestAHugeTimeoutWaits: any Timeout, up to math.MaxInt64, is a wait: a
// free key is granted, and a held one is waited for until its holder
// releases it — on the system clock and on a caller's clock, in both
// modes — never an error nor an early (nil, nil).
func TestAHugeTimeoutWaits(t *testing.T) { forModes(t, testAHugeTimeoutWaits) }

func testAHugeTimeoutWaits(t *testing.T, m mode) {
	c := cluster(t)
	p := newProvider(t, newClient(t, c.Endpoints()...))
	key := keyOf(t, "k")
	for _, timeout := range []time.Duration{math.MaxInt64, math.MaxInt64 - 1, math.MaxInt64 / 2, 200 * 365 * 24 * time.Hour} {
		for _, clk := range []clock.Clock{nil, otherClock{clock.System()}} {
			opts := m.with(tenace.LockAcquireOptions{Timeout: timeout, Clock: clk})
			held, err := p.Acquire(bg, key, opts)
			require.NoError(t, err, "Timeout %v on a free key", timeout)
			require.NotNil(t, held, "Timeout %v on a free key", timeout)
			ch := acquireAsync(bg, p, key, opts)
			// Queued behind the holder, and still waiting when it
			// releases: a call that ended at once would have left.
			eventually(t, 10*time.Second, "the waiter queued", func() bool { return p.Stats().Waiting == 1 })
			require.NoError(t, held.Release(bg))
			res := waitFor(t, ch, 10*time.Second, "the waiter once the key was released")
			require.NoError(t, res.err, "Timeout %v", timeout)
			require.NotNil(t, res.lease, "Timeout %v: not granted", timeout)
			require.NoError(t, res.lease.Release(bg))
		}
	}
}

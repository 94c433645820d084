package redislock_test

import (
	"context"
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"tenace.dev/internal/redistest"
	"tenace.dev/tenace"
)

// Any non-negative Timeout is valid, however large: math.MaxInt64 (whose
// deadline is past any clock's range) and other large ones grant a free
// key, and on a held key wait for its release, exclusive, shared, for a set
// and through a Lock; never an error.
func TestALargeTimeoutWaits(t *testing.T) {
	srv := redistest.Start(t)
	holder := newProvider(t, deadlineClient(t, srv.Addr))
	p := newProvider(t, deadlineClient(t, srv.Addr))
	for _, timeout := range []time.Duration{math.MaxInt64, math.MaxInt64 - 1, 1 << 62, 200 * 365 * 24 * time.Hour} {
		t.Run(timeout.String(), func(t *testing.T) {
			for _, opts := range []tenace.LockAcquireOptions{{Timeout: timeout}, {Timeout: timeout, Shared: true}, {Timeout: timeout, Shared: true, Permits: 1}} {
				l := mustAcquire(t, p, "free", opts)
				require.NoError(t, l.Release(bg))

				held := mustAcquire(t, holder, "held", tenace.LockAcquireOptions{})
				got := make(chan error, 1)
				go func() {
					l, err := p.Acquire(bg, "held", opts)
					if err == nil && l == nil {
						err = context.DeadlineExceeded // not granted: reported below
					}
					if l != nil {
						err = l.Release(bg)
					}
					got <- err
				}()
				eventually(t, "the caller waits", func() bool { return p.Stats().Waiting == 1 })
				require.NoError(t, held.Release(bg))
				require.NoError(t, <-got, "%+v: granted on the release", opts)
			}

			set, err := p.AcquireSet(bg, []string{"a", "b"}, tenace.LockAcquireOptions{Timeout: timeout})
			require.NoError(t, err)
			require.NotNil(t, set)
			require.NoError(t, set.Release(bg))
			held := mustAcquire(t, holder, "b", tenace.LockAcquireOptions{})
			got := make(chan error, 1)
			go func() {
				s, err := p.AcquireSet(bg, []string{"a", "b"}, tenace.LockAcquireOptions{Timeout: timeout})
				if err == nil && s == nil {
					err = context.DeadlineExceeded
				}
				if s != nil {
					err = s.Release(bg)
				}
				got <- err
			}()
			eventually(t, "the set waits", func() bool { return p.Stats().Waiting == 2 })
			require.NoError(t, held.Release(bg))
			require.NoError(t, <-got, "the set is granted on the release")

			held = mustAcquire(t, holder, "held", tenace.LockAcquireOptions{})
			ran := make(chan error, 1)
			go func() {
				pol := tenace.NewPolicy().WithLock(tenace.LockOptions{Provider: p, Key: "held", Timeout: timeout})
				ran <- pol.Execute(bg, func(context.Context) error { return nil })
			}()
			eventually(t, "the Lock waits", func() bool { return p.Stats().Waiting == 1 })
			require.NoError(t, held.Release(bg))
			require.NoError(t, <-ran, "the Lock runs on the release")
		})
	}
}

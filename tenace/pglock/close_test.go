package pglock_test

import (
	"errors"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"tenace.dev/tenace"
	"tenace.dev/tenace/pglock"
)

// TestCloseRacingAcquire: an Acquire racing Close returns an error wrapping
// tenace.ErrProviderClosed, whichever step Close cuts short — not the
// pool's "closed pool", nor a cancelled dial or statement. Four callers
// acquire and release in a loop; Close comes after a varying number of
// their calls.
func TestCloseRacingAcquire(t *testing.T) {
	srv := server(t)
	var wrong []error
	for round := 0; round < 80 && len(wrong) == 0; round++ {
		p, err := pglock.New(bg, srv.ConnString())
		require.NoError(t, err)
		errs := make(chan error, 4)
		progress := make(chan struct{}, 64)
		for g := range 4 {
			go func() {
				for {
					l, err := p.Acquire(bg, keyOf(t, string(rune('a'+g))), tenace.LockAcquireOptions{Timeout: tenace.NoWait})
					if err != nil {
						errs <- err
						return
					}
					if l != nil {
						_ = l.Release(bg)
					}
					select {
					case progress <- struct{}{}:
					default:
					}
				}
			}()
		}
		for range round % 7 {
			<-progress
		}
		require.NoError(t, p.Close())
		for range 4 {
			if err := <-errs; !errors.Is(err, tenace.ErrProviderClosed) {
				wrong = append(wrong, err)
			}
		}
	}
	for _, err := range wrong {
		t.Logf("Acquire racing Close returned: %v", err)
	}
	require.Empty(t, wrong, "every Acquire racing Close must return an error wrapping ErrProviderClosed")
}

// TestCloseWithStalledBackends: Close loses every lease at once, then
// unlocks them in parallel: two stalled backends (SIGSTOP) delay neither
// the healthy leases' Lost signal nor each other's unlock. Each stalled
// unlock takes the end bound (200 ms here) and the cancel's grace (2 s),
// server and client clocks being the point: Close, which returns only once
// every unlock is done, takes that once, not twice. (Before, Close ended
// the leases one after another, in map order.)
func TestCloseWithStalledBackends(t *testing.T) {
	srv := server(t)
	defer pglock.SetEndTimeout(200 * time.Millisecond)()
	p, err := pglock.New(bg, srv.ConnString())
	require.NoError(t, err)
	var leases []tenace.LockLease
	for i := range 12 {
		leases = append(leases, mustAcquire(t, p, keyOf(t, string(rune('a'+i))), tenace.LockAcquireOptions{}))
	}
	var pids []int
	for _, l := range leases[:2] {
		pid := int(pglock.BackendPID(l))
		require.NoError(t, syscall.Kill(pid, syscall.SIGSTOP))
		pids = append(pids, pid)
	}
	stopped := true
	resume := func() {
		if stopped {
			stopped = false
			for _, pid := range pids {
				_ = syscall.Kill(pid, syscall.SIGCONT)
			}
		}
	}
	defer resume()
	start := time.Now()
	closed := make(chan time.Duration, 1)
	go func() { _ = p.Close(); closed <- time.Since(start) }()
	var worst time.Duration
	for _, l := range leases {
		<-l.(tenace.LosableLease).Lost()
		worst = max(worst, time.Since(start))
		require.ErrorIs(t, l.(tenace.LosableLease).Err(), tenace.ErrLeaseLost)
	}
	took := <-closed
	resume()
	t.Logf("every lease's Lost closed at most %v after Close began; Close took %v", worst.Round(time.Millisecond), took.Round(time.Millisecond))
	require.Less(t, worst, time.Second, "a lease's Lost waited for a stalled unlock")
	// One stalled unlock: 200 ms + 2 s; two in a row would be 4.4 s.
	require.Less(t, took, 3500*time.Millisecond, "the stalled unlocks ran one after the other")
	require.Equal(t, tenace.LockStats{}, p.Stats())
}

package pglock_test

import (
	"errors"
	"testing"

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

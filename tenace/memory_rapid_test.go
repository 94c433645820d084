package tenace_test

import (
	"testing"
	"testing/synctest"

	"pgregory.net/rapid"

	"tenace.dev/internal/proptest"
)

// TestProviderConcurrentProperty: goroutines drawn by rapid acquire, hold,
// release, time out and cancel on a few keys, and race releases against
// cancels; mutual exclusion, FIFO order, exact Size and no leaked lock (see
// proptest.ProviderProperty). One synctest bubble holds the whole run, so
// the property knows when every goroutine is blocked, and timeouts run on
// fake time.
func TestProviderConcurrentProperty(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rapid.Check(proptest.BubbleTB{T: t}, proptest.ProviderProperty)
	})
}

// TestSetProperty: sets of keys named in random orders, acquired, held,
// released, timed out and cancelled by goroutines drawn by rapid: mutual
// exclusion, all or nothing, no deadlock, nothing left held (see
// proptest.SetProperty), on fake time in one synctest bubble.
func TestSetProperty(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rapid.Check(proptest.BubbleTB{T: t}, proptest.SetProperty)
	})
}

package failsafelock_test

import (
	"testing"

	"github.com/failsafe-go/failsafe-go"
	"github.com/failsafe-go/failsafe-go/bulkhead"

	"tenace.dev/tenace"
	"tenace.dev/tenace/failsafelock"
)

// The cost of the Lock in an uncontended failsafe-go execution, beside
// failsafe-go's own Bulkhead (a channel semaphore) as the baseline.
func BenchmarkGet(b *testing.B) {
	fn := func() (int, error) { return 1, nil }
	run := func(b *testing.B, ex failsafe.Executor[int]) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := ex.Get(fn); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.Run("bulkhead", func(b *testing.B) { run(b, failsafe.With(bulkhead.New[int](1))) })
	b.Run("lock", func(b *testing.B) {
		p := tenace.NewMemoryLockProvider()
		defer p.Close()
		run(b, failsafe.With(failsafelock.New[int](tenace.LockOptions{Provider: p, Key: "k"})))
	})
}

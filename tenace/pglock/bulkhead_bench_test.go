package pglock_test

import (
	"testing"

	"tenace.dev/tenace"
	"tenace.dev/tenace/pglock"
)

// BenchmarkBulkheadUncontended: one caller's acquire and release of a
// bulkhead's permit (Permits 4) on a free key, waiting (the gate, a slot)
// and NoWait (a slot).
func BenchmarkBulkheadUncontended(b *testing.B) {
	if sharedErr != nil {
		b.Skip(sharedErr)
	}
	for _, tc := range []struct {
		name string
		opts tenace.LockAcquireOptions
	}{
		{"wait", tenace.LockAcquireOptions{Shared: true, Permits: 4}},
		{"NoWait", tenace.LockAcquireOptions{Shared: true, Permits: 4, Timeout: tenace.NoWait}},
	} {
		b.Run(tc.name, func(b *testing.B) {
			p, err := pglock.New(bg, shared.ConnString())
			if err != nil {
				b.Fatal(err)
			}
			defer p.Close()
			key := "BenchmarkBulkheadUncontended/" + tc.name
			b.ReportAllocs()
			for b.Loop() {
				l, err := p.Acquire(bg, key, tc.opts)
				if err != nil || l == nil {
					b.Fatal(l, err)
				}
				if err := l.Release(bg); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

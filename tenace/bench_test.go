package tenace_test

import (
	"testing"
	"time"

	"tenace.dev/tenace"
)

// BenchmarkAcquireRelease is one uncontended Acquire+Release through the
// LockProvider interface, from one goroutine.
func BenchmarkAcquireRelease(b *testing.B) {
	p := tenace.NewMemoryLockProvider()
	defer p.Close()
	var lp tenace.LockProvider = p
	b.ReportAllocs()
	for b.Loop() {
		l, _ := lp.Acquire(bg, "k", tenace.LockAcquireOptions{})
		_ = l.Release(bg)
	}
}

// BenchmarkExecute is the same lock through a policy: lock only, and with a
// timeout inside the lock.
func BenchmarkExecute(b *testing.B) {
	p := tenace.NewMemoryLockProvider()
	defer p.Close()
	for _, bc := range []struct {
		name string
		pol  tenace.Policy
	}{
		{"lock", tenace.NewPolicy().WithLock(tenace.LockOptions{Provider: p, Key: "k"})},
		{"timeout+lock", tenace.NewPolicy().WithTimeout(time.Minute).WithLock(tenace.LockOptions{Provider: p, Key: "k"})},
		{"empty", tenace.NewPolicy()},
	} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				_ = bc.pol.Execute(bg, noop)
			}
		})
	}
}

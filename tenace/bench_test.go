package tenace_test

import (
	"io"
	"log/slog"
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

// BenchmarkExecute is the same lock through a policy: lock only, with a
// timeout inside the lock, and with listeners.
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
		// The cost of events: a listener that does nothing, and the slog
		// listener on a handler that discards (the level check included).
		{"lock+listener", tenace.NewPolicy().WithLock(tenace.LockOptions{Provider: p, Key: "k"}).OnEvent(func(tenace.Event) {})},
		{"lock+slog", tenace.NewPolicy().WithLock(tenace.LockOptions{Provider: p, Key: "k"}).
			OnEvent(tenace.LogEvents(slog.New(slog.DiscardHandler)))},
		{"lock+slog-text", tenace.NewPolicy().WithLock(tenace.LockOptions{Provider: p, Key: "k"}).
			OnEvent(tenace.LogEvents(slog.New(slog.NewTextHandler(io.Discard, &slog.HandlerOptions{Level: slog.LevelDebug}))))},
	} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				_ = bc.pol.Execute(bg, noop)
			}
		})
	}
}

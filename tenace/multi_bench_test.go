package tenace_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"tenace.dev/tenace"
)

// BenchmarkAcquireSet compares the memory provider's AcquireSet (one timer
// for the set, straight to the shards) with AcquireAll's generic path (one
// Acquire per key through the LockProvider interface, each with what is
// left of the Timeout): uncontended from one goroutine, and contended,
// sets of 2 of 8 keys in random orders from 16 goroutines.
func BenchmarkAcquireSet(b *testing.B) {
	p := tenace.NewMemoryLockProvider()
	defer p.Close()
	keys := []string{"k0", "k1", "k2", "k3", "k4", "k5", "k6", "k7"}
	for _, path := range []struct {
		name string
		p    tenace.LockProvider
	}{{"memory", p}, {"generic", generic{p}}} {
		for _, n := range []int{2, 4} {
			for _, timeout := range []time.Duration{0, time.Minute} {
				b.Run(fmt.Sprintf("%s/n=%d/timeout=%v", path.name, n, timeout), func(b *testing.B) {
					opts := tenace.LockAcquireOptions{Timeout: timeout}
					b.ReportAllocs()
					for b.Loop() {
						l, _ := tenace.AcquireAll(bg, path.p, keys[:n], opts)
						_ = l.Release(bg)
					}
				})
			}
		}
		b.Run(path.name+"/contended/g=16", func(b *testing.B) {
			b.SetParallelism(8) // 16 goroutines on 2 Ps
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				rng := rand.New(rand.NewPCG(rand.Uint64(), 1))
				for pb.Next() {
					i, j := rng.IntN(8), rng.IntN(7)
					if j >= i {
						j++
					}
					l, err := tenace.AcquireAll(context.Background(), path.p, []string{keys[i], keys[j]}, tenace.LockAcquireOptions{})
					if err != nil {
						b.Fatal(err)
					}
					_ = l.Release(bg)
				}
			})
		})
	}
}

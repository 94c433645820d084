package main

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"testing"
	"time"

	"tenace.dev/bench/internal/load"
)

// BenchmarkFloor is what no lock can beat: a request/reply round trip to
// another goroutine over buffered channels (the floor of any actor design),
// and an uncontended sync.Mutex.
func BenchmarkFloor(b *testing.B) {
	b.Run("chan-rtt", func(b *testing.B) {
		req, rep := make(chan int, 1), make(chan int, 1)
		go func() {
			for r := range req {
				rep <- r
			}
		}()
		defer close(req)
		b.ReportAllocs()
		for b.Loop() {
			req <- 1
			<-rep
		}
	})
	// actor: the message pattern of one uncontended tenace op on a bare
	// actor — a one-way message (the release) then a request/reply (the next
	// acquire) — with none of the lock table's work: what the design costs
	// before any lock logic.
	b.Run("actor", func(b *testing.B) {
		type msg struct {
			key   string
			reply chan int
		}
		mb, reply := make(chan msg, 1024), make(chan int, 1)
		done := make(chan struct{})
		go func() {
			defer close(done)
			for m := range mb {
				if m.reply != nil {
					m.reply <- 1
				}
			}
		}()
		b.ReportAllocs()
		for b.Loop() {
			mb <- msg{key: "k"}
			mb <- msg{key: "k", reply: reply}
			<-reply
		}
		close(mb)
		<-done
	})
	b.Run("mutex", func(b *testing.B) {
		var mu sync.Mutex
		b.ReportAllocs()
		for b.Loop() {
			mu.Lock()
			//lint:ignore SA2001 the empty critical section is the point
			mu.Unlock()
		}
	})
}

var goroutineCounts = []int{1, 16, 256}

// BenchmarkLock is BenchmarkLock/<impl>/<scenario>/g=<N>: one op is one
// acquire + release with nothing done while holding; ns/op is wall time over
// all goroutines' ops. In cancel, an op is an attempt: the ones that gave up
// count in b.N too, and gaveup/op says what share of them did.
func BenchmarkLock(b *testing.B) {
	for _, name := range load.MemoryImpls() {
		b.Run(name, func(b *testing.B) {
			for _, sc := range load.Scenarios() {
				b.Run(sc, func(b *testing.B) {
					for _, g := range goroutineCounts {
						b.Run(fmt.Sprintf("g=%d", g), func(b *testing.B) {
							l := load.MakeLocker(name, 0)
							defer l.Close()
							if sc == "cancel" && !l.TakesContext() {
								b.Skip("takes no context")
							}
							ws := load.NewWorkers(sc, g, 0)
							b.ReportAllocs()
							b.ResetTimer()
							d, gaveUp := load.RunFixed(l, ws, b.N)
							b.StopTimer()
							b.ReportMetric(float64(d.Nanoseconds())/float64(b.N), "wall-ns/op")
							if sc == "cancel" {
								b.ReportMetric(float64(gaveUp)/float64(b.N), "gaveup/op")
							}
						})
					}
				})
			}
		})
	}
}

// BenchmarkBusy is BenchmarkBusy/<impl>/<scenario>/busy=<N>: 16 goroutines
// locking beside N goroutines that burn CPU (load.BurnCPU), which BenchmarkLock
// never has: there every goroutine blocks. It shows what the process's
// other work costs each lock (bench/README.md, "Beside CPU-bound work"),
// and it is where a lock manager that yields its P or spins would show a
// jump that the Lock cells do not (Experiments: a shard that yields
// before it parks goes from 628 to 5,402 ns/op beside 2 of them). ns/op is
// wall time over the lockers' ops.
func BenchmarkBusy(b *testing.B) {
	for _, name := range []string{"tenace", "semaphore"} {
		b.Run(name, func(b *testing.B) {
			for _, sc := range []string{"distinct", "zipf"} {
				b.Run(sc, func(b *testing.B) {
					for _, busy := range []int{0, 2, 8} {
						b.Run(fmt.Sprintf("busy=%d", busy), func(b *testing.B) {
							l := load.MakeLocker(name, 0)
							defer l.Close()
							ws := load.NewWorkers(sc, 16, 0)
							stop := load.BurnCPU(busy)
							defer stop()
							b.ReportAllocs()
							b.ResetTimer()
							_, _ = load.RunFixed(l, ws, b.N)
						})
					}
				})
			}
		})
	}
}

const waiters = 100_000

// BenchmarkWaiters measures the heap each goroutine waiting on a held key
// costs, beyond a goroutine blocked on a plain channel (whose runtime record
// and stack both sides pay): 100,000 waiters on one key.
func BenchmarkWaiters(b *testing.B) {
	for _, name := range []string{"tenace", "semaphore", "moby"} {
		b.Run(name, func(b *testing.B) {
			var heap, stack float64
			// Warm up: goroutine records are never freed, only reused, so
			// the first 100,000 goroutines of the process would count
			// records that later ones get for free.
			measureWaiters(func(block chan struct{}) (func(), func()) {
				return func() { <-block }, func() { close(block) }
			})
			for b.Loop() {
				baseHeap, baseStack := measureWaiters(func(block chan struct{}) (func(), func()) {
					return func() { <-block }, func() { close(block) }
				})
				l := load.MakeLocker(name, 1)
				holding, release := make(chan struct{}), make(chan struct{})
				go func() {
					_ = l.Do(context.Background(), "k", func(context.Context) error { close(holding); <-release; return nil })
				}()
				<-holding
				h, s := measureWaiters(func(chan struct{}) (func(), func()) {
					return func() { _ = l.Do(context.Background(), "k", load.Noop) }, func() { close(release) }
				})
				l.Close()
				heap, stack = (h-baseHeap)/waiters, (s-baseStack)/waiters
			}
			b.ReportMetric(heap, "heap-B/waiter")
			b.ReportMetric(stack, "stack-B/waiter")
		})
	}
}

// measureWaiters starts waiters goroutines that each run wait(), and returns
// the heap and stack growth once they have all settled; then it calls
// release and waits for them to end. "Settled" is judged by the heap: it
// stops growing once every goroutine is parked (a benchmark's estimate, not
// a synchronisation).
func measureWaiters(mk func(block chan struct{}) (wait, release func())) (heap, stack float64) {
	var ms runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&ms)
	h0, s0 := ms.HeapAlloc, ms.StackInuse
	wait, release := mk(make(chan struct{}))
	var started, done sync.WaitGroup
	for range waiters {
		started.Add(1)
		done.Add(1)
		go func() {
			defer done.Done()
			started.Done()
			wait()
		}()
	}
	started.Wait()
	var last uint64
	for stable := 0; stable < 3; {
		time.Sleep(20 * time.Millisecond)
		runtime.GC()
		runtime.ReadMemStats(&ms)
		if ms.HeapAlloc == last {
			stable++
		} else {
			stable, last = 0, ms.HeapAlloc
		}
	}
	heap, stack = float64(ms.HeapAlloc)-float64(h0), float64(ms.StackInuse)-float64(s0)
	release()
	done.Wait()
	return heap, stack
}

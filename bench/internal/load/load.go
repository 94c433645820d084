package load

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"
)

// cell is one run: an implementation, a scenario, a goroutine count.
type cell struct {
	Impl       string        `json:"impl"`
	Scenario   string        `json:"scenario"`
	Goroutines int           `json:"goroutines"`
	Keys       int           `json:"keys,omitempty"`
	Hold       time.Duration `json:"hold_ns"`
	Busy       int           `json:"busy,omitempty"` // goroutines burning CPU beside the lockers
	Shards     int           `json:"shards,omitempty"`
	Family     string        `json:"family"`         // memory, redis, postgres
	Addr       string        `json:"addr,omitempty"` // the family's server: address or connection string
	Duration   time.Duration `json:"duration_ns"`
}

// result is what a cell measured.
type result struct {
	cell
	Ops       int64         `json:"ops"`     // operations that acquired, ran fn and released: what ops/s counts
	Gaveup    int64         `json:"gave_up"` // operations whose context ended before they acquired (cancel scenario): not in Ops
	Elapsed   time.Duration `json:"elapsed_ns"`
	OpsPerSec float64       `json:"ops_per_sec"`
	P50       time.Duration `json:"p50_ns"`
	P99       time.Duration `json:"p99_ns"`
	P999      time.Duration `json:"p999_ns"`
	Max       time.Duration `json:"max_ns"`
	// MaxInside is the most goroutines ever seen inside one key's critical
	// section at once. Anything but 1 is a broken lock.
	MaxInside int32 `json:"max_inside"`
	// Floor is one channel round trip between two goroutines, measured at
	// the start of the run: the design's floor for one acquire.
	Floor time.Duration `json:"floor_ns"`
}

// holdFor spends d inside the critical section: a busy wait below 50µs,
// where a sleep's timer granularity would dominate, a sleep above.
func holdFor(d time.Duration) {
	if d <= 0 {
		return
	}
	if d >= 50*time.Microsecond {
		time.Sleep(d)
		return
	}
	for t0 := time.Now(); time.Since(t0) < d; {
	}
}

// BurnCPU starts n goroutines that spin on CPU, never blocking, until the
// returned function is called; it returns once they have all ended. They
// stand for the rest of a process's work: a lock manager that yields its P
// or spins is slowed, or starves, beside them where one that parks is not
// (bench/README.md, Experiments: the shard that yields before it parks).
func BurnCPU(n int) (stop func()) {
	var (
		quit atomic.Bool
		wg   sync.WaitGroup
	)
	for range n {
		wg.Go(func() {
			for !quit.Load() { // an atomic load per turn: the loop stays
			}
		})
	}
	return func() {
		quit.Store(true)
		wg.Wait()
	}
}

// runCell makes c's implementation, runs c for c.Duration and measures it
// (see measure). progress, if set, gets a line about every 250ms. note is
// what the implementation had to say after the cell (a Summarizer's
// Summary), or "".
func runCell(c cell, progress io.Writer, label string) (r result, note string, err error) {
	f := familyOf(c.Impl)
	if f == nil {
		return result{}, "", fmt.Errorf("unknown implementation %q", c.Impl)
	}
	l, err := f.impl(c.Impl).Make(c.Addr, c.Goroutines, c.Shards)
	if err != nil {
		return result{}, "", fmt.Errorf("%s: %w", c.Impl, err)
	}
	defer l.Close()
	if r, err = measure(l, c, progress, label); err != nil {
		return result{}, "", err
	}
	if s, ok := l.(Summarizer); ok {
		note = s.Summary(fmt.Sprintf("%s %s g=%d", c.Impl, c.Scenario, c.Goroutines))
	}
	return r, note, nil
}

// A Summarizer is a Locker with something to say after its cell (the
// OpenTelemetry metrics it recorded): the tool calls Summary once the cell
// has run, before Close, prints it after the table and writes it to
// notes.txt beside the results. cell names the cell.
type Summarizer interface {
	Summary(cell string) string
}

// measureFloor is the design's floor for one acquire: one round trip over
// buffered channels between two goroutines (BenchmarkFloor/chan-rtt). It
// is the fastest of ten 10ms samples: on a shared host a single sample
// reads whatever else ran then.
func measureFloor() time.Duration {
	req, rep := make(chan struct{}, 1), make(chan struct{}, 1)
	go func() {
		for range req {
			rep <- struct{}{}
		}
	}()
	defer close(req)
	best := time.Duration(math.MaxInt64)
	for range 10 {
		n, t0 := 0, time.Now()
		for ; time.Since(t0) < 10*time.Millisecond; n += 100 {
			for range 100 {
				req <- struct{}{}
				<-rep
			}
		}
		best = min(best, time.Since(t0)/time.Duration(n))
	}
	return best
}

// insideCounters returns one counter per key, aligned with each Worker's
// sequence (inside[i][j] counts the holders of ws[i]'s j-th key), for the
// holders-inside check: Workers that lock one key share its counter.
func insideCounters(ws []*Worker) [][]*atomic.Int32 {
	counters := map[string]*atomic.Int32{}
	inside := make([][]*atomic.Int32, len(ws))
	for i, w := range ws {
		inside[i] = make([]*atomic.Int32, len(w.keys))
		for j, k := range w.keys {
			if counters[k] == nil {
				counters[k] = new(atomic.Int32)
			}
			inside[i][j] = counters[k]
		}
	}
	return inside
}

// measure runs c's scenario on l for c.Duration and measures it.
func measure(l Locker, c cell, progress io.Writer, label string) (result, error) {
	ws := NewWorkers(c.Scenario, c.Goroutines, c.Keys)
	inside := insideCounters(ws)

	var (
		stop      atomic.Bool
		ops, gave atomic.Int64
		failOnce  sync.Once
		failed    error                 // the first operation that failed (set in failOnce): it fails the cell
		failedC   = make(chan struct{}) // closed with failed set: the cell stops at once
		maxInside atomic.Int32
		wg        sync.WaitGroup
		ready     sync.WaitGroup
		start     = make(chan struct{})
		hists     = make([]*hdrhistogram.Histogram, len(ws))
	)
	// Operations are timed as monotonic offsets from base: time.Since reads
	// only the monotonic clock, where time.Now reads the wall clock too
	// (about twice the cost, here 60-100 ns against 25-55), and the clock
	// reads are part of every operation the table counts.
	base := time.Now()
	for i, w := range ws {
		h := hdrhistogram.New(1, int64(time.Minute), 2)
		hists[i] = h
		var t0 time.Duration // when the operation began, since base
		var ctr *atomic.Int32
		var ran bool
		w.fn = func(context.Context) error {
			ran = true
			_ = h.RecordValue(int64(time.Since(base) - t0))
			n := ctr.Add(1)
			for m := maxInside.Load(); n > m && !maxInside.CompareAndSwap(m, n); m = maxInside.Load() {
			}
			holdFor(c.Hold)
			ctr.Add(-1)
			return nil
		}
		wg.Add(1)
		ready.Add(1)
		go func() {
			defer wg.Done()
			ready.Done()
			<-start
			ctx := context.Background()
			var n int64
			for j := 0; !stop.Load(); j++ {
				ctr = inside[i][(w.offset+j)%len(w.keys)]
				ran = false
				t0 = time.Since(base)
				ended, err := w.op(ctx, l, j)
				switch {
				case err == nil && ran:
					if n++; n == 64 {
						ops.Add(n)
						n = 0
					}
				case err != nil && ended && !ran:
					gave.Add(1) // gave up: never held the key
				default:
					if err == nil {
						err = errors.New("Do returned nil without running fn")
					}
					failOnce.Do(func() { failed = err; close(failedC) })
					stop.Store(true)
				}
			}
			ops.Add(n)
		}()
	}
	stopBusy := BurnCPU(c.Busy)
	defer stopBusy()
	ready.Wait()
	began := time.Now()
	close(start)
	tick := time.NewTicker(250 * time.Millisecond)
	deadline := time.NewTimer(c.Duration)
loop:
	for {
		select {
		case <-tick.C:
			if progress != nil {
				el := time.Since(began)
				fmt.Fprintf(progress, "\r%-40s %5.1fs  %12.0f ops/s ", label, el.Seconds(), float64(ops.Load())/el.Seconds())
			}
		case <-deadline.C:
			break loop
		case <-failedC:
			break loop
		}
	}
	tick.Stop()
	stop.Store(true)
	wg.Wait()
	elapsed := time.Since(began)
	if progress != nil {
		fmt.Fprintf(progress, "\r%-70s\r", "")
	}
	if failed != nil {
		return result{}, fmt.Errorf("%s %s g=%d: an operation failed: %w", c.Impl, c.Scenario, c.Goroutines, failed)
	}
	all := hdrhistogram.New(1, int64(time.Minute), 2)
	for _, h := range hists {
		all.Merge(h)
	}
	r := result{
		cell:      c,
		Ops:       ops.Load(),
		Gaveup:    gave.Load(),
		Elapsed:   elapsed,
		OpsPerSec: float64(ops.Load()) / elapsed.Seconds(),
		P50:       time.Duration(all.ValueAtQuantile(50)),
		P99:       time.Duration(all.ValueAtQuantile(99)),
		P999:      time.Duration(all.ValueAtQuantile(99.9)),
		Max:       time.Duration(all.Max()),
		MaxInside: maxInside.Load(),
	}
	return r, nil
}

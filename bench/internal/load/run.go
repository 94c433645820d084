package load

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// Worker is one goroutine's share of a run (NewWorkers): its key sequence
// and, for the cancel scenario, which operations carry a short-lived
// context.
type Worker struct {
	keys   []string
	offset int // where this Worker starts in a shared sequence
	cancel bool
	fn     func(context.Context) error // what runs under the lock; made once per Worker
}

// Noop is the critical section of the Go benchmarks: nothing.
func Noop(context.Context) error { return nil }

// key is the key of operation i.
func (w *Worker) key(i int) string { return w.keys[(w.offset+i)%len(w.keys)] }

// op runs operation i of w on l and returns Do's error; ended reports
// whether the operation's own context had ended by then (only the cancel
// scenario's short-lived ones end), which tells a give-up from a failure.
func (w *Worker) op(ctx context.Context, l Locker, i int) (ended bool, err error) {
	key := w.key(i)
	if w.cancel && i%10 == 9 {
		c, stop := context.WithTimeout(ctx, cancelWait*time.Nanosecond)
		err := l.Do(c, key, w.fn)
		ended = c.Err() != nil
		stop()
		return ended, err
	}
	err = l.Do(ctx, key, w.fn)
	return ctx.Err() != nil, err
}

// NewWorkers makes g workers for scenario (Scenarios) over keys keys (0:
// the scenario's default).
func NewWorkers(scenario string, g, keys int) []*Worker {
	ws := make([]*Worker, g)
	for i := range ws {
		ws[i] = &Worker{keys: keySeq(scenario, i, keys), offset: i * 7919, cancel: scenario == "cancel", fn: Noop}
	}
	return ws
}

// RunFixed runs n operations split over the workers, each on its own
// goroutine, all released at once; it returns the wall time from the release
// to the last goroutine's end, and how many of the n operations failed (in
// the cancel scenario, those that gave up: they count in n all the same).
func RunFixed(l Locker, ws []*Worker, n int) (time.Duration, int64) {
	var ready, done sync.WaitGroup
	var failed atomic.Int64
	start := make(chan struct{})
	ctx := context.Background()
	per, extra := n/len(ws), n%len(ws)
	for i, w := range ws {
		count := per
		if i < extra {
			count++
		}
		ready.Add(1)
		done.Add(1)
		go func() {
			defer done.Done()
			ready.Done()
			<-start
			for j := range count {
				if _, err := w.op(ctx, l, j); err != nil {
					failed.Add(1)
				}
			}
		}()
	}
	ready.Wait()
	t0 := time.Now()
	close(start)
	done.Wait()
	return time.Since(t0), failed.Load()
}

package shard

import (
	"sync/atomic"
	"time"
)

// tick is how stale the shards' clock may be while they are busy: the
// grant and wait times Inspect shows are exact to about tick.
const tick = 10 * time.Millisecond

// coarseClock is the shards' clock: monotonic nanoseconds since the group
// started, read once per batch. A reading of the system clock costs about
// as much as a tenth of an uncontended acquire and release, so while the
// shards are busy they read a value that a timer refreshes every tick,
// and read the system clock only on the first batch after an idle tick:
//
//   - idle: no timer runs; a batch reads the system clock, stores it, and
//     arms the timer (the one that swaps ticking from false to true);
//   - busy: a batch sets busy (a store only when it was not set) and reads
//     the stored value, at most about a tick old;
//   - each tick stores a fresh reading, and re-arms the timer if a batch
//     came since the last tick (busy), else stops (ticking false).
//
// The timer only stores atomics: it touches no shard's state. Concurrency:
// every field is an atomic, or set once by newCoarseClock; the timer is
// reset only by whoever set ticking to true (the arming batch, then the
// tick that keeps it), so never by two goroutines at once.
type coarseClock struct {
	start   time.Time
	now     atomic.Int64
	busy    atomic.Bool
	ticking atomic.Bool
	stopped atomic.Bool
	timer   *time.Timer
}

func newCoarseClock() *coarseClock {
	c := &coarseClock{start: time.Now()}
	c.timer = time.AfterFunc(time.Hour, c.tick)
	c.timer.Stop()
	return c
}

// read returns the clock for a batch.
func (c *coarseClock) read() int64 {
	if c.ticking.Load() {
		if !c.busy.Load() {
			c.busy.Store(true)
		}
		return c.now.Load()
	}
	n := int64(time.Since(c.start))
	c.now.Store(n)
	if !c.stopped.Load() && c.ticking.CompareAndSwap(false, true) {
		c.timer.Reset(tick)
	}
	return n
}

// tick refreshes the stored reading, and keeps ticking while batches come.
func (c *coarseClock) tick() {
	c.now.Store(int64(time.Since(c.start)))
	if c.busy.Swap(false) && !c.stopped.Load() {
		c.timer.Reset(tick)
		return
	}
	c.ticking.Store(false)
}

// stop stops the timer for good.
func (c *coarseClock) stop() {
	c.stopped.Store(true)
	c.timer.Stop()
}

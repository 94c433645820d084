package redislock

import (
	"context"
	"errors"
	"sync"
	"time"
)

// probed runs f with ctx, and dials the server itself (Provider.probe) if
// f has had no reply probeAfter after the send: a dial that fails ends f
// with an *unreachableError. Once a dial has failed, the next calls dial
// first and, if that fails, are still sent, but end on that failure
// probeAfter after the send unless answered by then, until one gets
// through: a dial can fail while the pool's connections still reach the
// server (a failover client whose sentinels are down, a process out of
// file descriptors), and a call that sent nothing could never learn it.
// Single tries (attempt.try), sets (setAttempt.try) and Inspect run
// through it.
func (p *Provider) probed(ctx context.Context, f func(context.Context) error) error {
	probe := p.probe
	if probe == nil {
		return f(ctx)
	}
	var failed error // the dial that failed just now, if the last call ended on one
	if p.unreachable.Load() {
		if err := probe(ctx); err != nil && !isTimeout(err) && ctx.Err() == nil {
			failed = err
		}
	}
	tctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	w := &watched{due: time.Now().Add(probeAfter), ctx: tctx, cancel: cancel, failed: failed}
	p.dog.add(w)
	err := f(tctx)
	p.dog.remove(w)
	var down *unreachableError
	switch {
	case err != nil && errors.As(context.Cause(tctx), &down):
		p.unreachable.Store(true)
		return down
	case err == nil && p.unreachable.Load():
		p.unreachable.Store(false)
	}
	return err
}

// watched is a call in flight that probed watches.
type watched struct {
	due    time.Time               // probeAfter after the send
	ctx    context.Context         // the call's: the dial ends with it
	cancel context.CancelCauseFunc // ends the call with an *unreachableError
	failed error                   // a dial that failed just before the send: the verdict, without another
}

// watchdog runs probe for the calls in flight (see probed) that have gone
// probeAfter without a reply. One timer serves every call of the provider:
// armed by a call when it is not, left armed when the call ends, and
// re-armed when it fires only while a call is in flight. Not a timer per
// call: one armed at each send would be the earliest of the process's
// timers, and arming it wakes the Go runtime's network poller each time
// (about a tenth of an uncontended acquire + release's client CPU).
type watchdog struct {
	probe func(context.Context) error

	mu    sync.Mutex
	calls map[*watched]struct{}
	t     *time.Timer
	armed bool
}

func (d *watchdog) add(w *watched) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.calls == nil {
		d.calls = map[*watched]struct{}{}
	}
	d.calls[w] = struct{}{}
	if d.armed {
		return
	}
	d.armed = true
	if d.t == nil {
		d.t = time.AfterFunc(probeAfter, d.fire)
	} else {
		d.t.Reset(probeAfter)
	}
}

func (d *watchdog) remove(w *watched) {
	d.mu.Lock()
	delete(d.calls, w)
	d.mu.Unlock()
}

// fire probes the calls due, each once, as a timer of its own would have:
// on a goroutine of its own, the last on the timer's.
func (d *watchdog) fire() {
	d.mu.Lock()
	now := time.Now()
	var due []*watched
	var next time.Time
	for w := range d.calls {
		switch {
		case !w.due.After(now):
			due = append(due, w)
			delete(d.calls, w)
		case next.IsZero() || w.due.Before(next):
			next = w.due
		}
	}
	d.armed = !next.IsZero()
	if d.armed {
		d.t.Reset(next.Sub(now))
	}
	d.mu.Unlock()
	for i, w := range due {
		if i < len(due)-1 {
			go d.check(w)
		} else {
			d.check(w)
		}
	}
}

// check dials for w (unless a dial has just failed) and ends w's call if
// the dial failed other than by its deadline.
func (d *watchdog) check(w *watched) {
	err := w.failed
	if err == nil {
		if err = d.probe(w.ctx); err != nil && isTimeout(err) {
			err = nil
		}
	}
	if err != nil && w.ctx.Err() == nil {
		w.cancel(&unreachableError{err: err})
	}
}

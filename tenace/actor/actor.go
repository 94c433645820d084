// Package actor runs a goroutine that alone owns some state and is fed typed
// messages through a buffered mailbox.
//
// An [Actor] is the smallest piece of the tenace lock manager: one goroutine,
// one mailbox, one handler. The handler is called with the messages in
// batches: the loop blocks for the first message, then takes whatever else is
// already queued (up to a limit) without blocking, so a burst from many
// senders costs the loop one wake-up instead of one per message, and the
// handler can do its per-batch work (publishing counters, delivering replies)
// once per batch.
//
// Concurrency: the state the handler touches is owned by the loop goroutine;
// nothing else may read or write it. Senders only ever touch the mailbox
// channel. There is no mutex anywhere in this package: the mailbox is the only
// point of synchronisation, and Stop is a handshake over two channels.
//
// Stopping: [Actor.Stop] asks the loop to exit and waits until it has; it is
// idempotent and safe from any goroutine but the loop itself. After Stop has
// been called, [Actor.Send] fails at once with [ErrStopped] instead of
// blocking. A Send that returned nil is handled before the loop stops, so a
// sender that waits for a reply to such a message can wait with a plain
// receive: the reply comes, from the handler or from OnStop.
package actor

import (
	"context"
	"errors"
	"sync/atomic"
	"time"
)

// ErrStopped is returned by [Actor.Send] once [Actor.Stop] has been called.
var ErrStopped = errors.New("actor: stopped")

// ErrFull is returned by [Actor.SendWithin] when its timeout fires while the
// mailbox is full: the message was not sent.
var ErrFull = errors.New("actor: the mailbox stayed full until the timeout")

// DefaultMailbox is the mailbox capacity used when [Options.Mailbox] is 0.
//
// Why 1024: a lock manager sees at most a couple of messages in flight per
// caller goroutine (an acquire and a release), so 1024 slots absorb bursts from
// hundreds of goroutines without parking a sender, while the buffer stays
// small (tens of KiB per actor for the message types used here) and still
// applies back-pressure when the loop really is behind.
const DefaultMailbox = 1024

// DefaultBatch is the most messages handed to the handler at once when
// [Options.Batch] is 0. A cap keeps one batch's reply latency bounded when
// senders keep the mailbox full.
const DefaultBatch = 256

// Options configures an [Actor]. The zero value gives the defaults.
type Options[M any] struct {
	// Mailbox is the mailbox capacity; 0 means DefaultMailbox.
	Mailbox int
	// Batch is the largest batch given to the handler; 0 means DefaultBatch.
	Batch int
	// OnStop, if set, runs on the loop goroutine after the last batch, just
	// before Done is closed: the place to fail whoever still waits on state
	// the loop owns.
	OnStop func()
	// Go starts the loop goroutine; nil means a plain go statement. It lets
	// a caller give its long-lived loops a recognisable frame on their stack
	// (goleak filters goroutines by function name).
	Go func(loop func())
}

// Actor is a goroutine that owns some state and handles typed messages from a
// buffered mailbox in batches. Create it with [Start].
type Actor[M any] struct {
	mailbox  chan envelope[M]
	stopping chan struct{} // closed by the first Stop, before it posts the stop envelope
	done     chan struct{} // closed when the loop has returned
	stopped  atomic.Bool   // set by the first Stop, before it closes stopping: close happens once, and Send reads it

	// Owned by the loop goroutine.
	handle func(batch []M)
	onStop func()
	batch  []M
}

// envelope is a mailbox slot: a message, or the stop request. Stopping by a
// message rather than a second channel lets the loop wait with a plain
// receive instead of a select, which is most of the cost of an idle loop's
// wake-up.
type envelope[M any] struct {
	m    M
	stop bool
}

// Start starts an actor whose loop calls handle with each batch of messages.
// handle runs on the loop goroutine only; the batch slice is reused after
// handle returns, so handle must not keep it.
func Start[M any](handle func(batch []M), opts Options[M]) *Actor[M] {
	if handle == nil {
		panic("tenace: actor.Start: nil handler")
	}
	if opts.Mailbox < 0 || opts.Batch < 0 {
		panic("tenace: actor.Start: negative Mailbox or Batch")
	}
	if opts.Mailbox == 0 {
		opts.Mailbox = DefaultMailbox
	}
	if opts.Batch == 0 {
		opts.Batch = DefaultBatch
	}
	a := &Actor[M]{
		mailbox:  make(chan envelope[M], opts.Mailbox),
		stopping: make(chan struct{}),
		done:     make(chan struct{}),
		handle:   handle,
		onStop:   opts.OnStop,
		batch:    make([]M, 0, opts.Batch),
	}
	if opts.Go != nil {
		opts.Go(a.loop)
	} else {
		go a.loop()
	}
	return a
}

func (a *Actor[M]) loop() {
	defer close(a.done)
	for {
		e := <-a.mailbox
		stop := e.stop
		if !stop {
			a.batch = append(a.batch[:0], e.m)
		drain:
			for len(a.batch) < cap(a.batch) {
				select {
				case e := <-a.mailbox:
					if e.stop {
						stop = true
						break drain
					}
					a.batch = append(a.batch, e.m)
				default:
					break drain
				}
			}
			a.handle(a.batch)
			clear(a.batch) // drop references so the GC can take them
		}
		if stop {
			if a.onStop != nil {
				a.onStop()
			}
			return
		}
	}
}

// Send enqueues m. It returns nil once m is in the mailbox ahead of any stop
// request, so the handler will see it; ctx's error when ctx ends while the
// mailbox is full (m was not sent); and [ErrStopped] when Stop was called
// before the send, or while it was being made — in that last case m is in
// the mailbox but the handler may or may not see it. It blocks only while
// the mailbox is full.
//
// Why nil means "will be handled": Stop sets the stopped flag (and closes
// stopping) first and only then posts its stop envelope. A sender that
// finds the flag still unset after its send completed knows the flag's
// store, and so the envelope, came after its message in the mailbox's FIFO
// order (atomics are sequentially consistent).
func (a *Actor[M]) Send(ctx context.Context, m M) error { return a.SendWithin(ctx, m, nil) }

// SendWithin is Send for a sender with a deadline of its own: while the
// mailbox is full it also gives up when timeout fires (or has fired),
// returning [ErrFull] with m not sent. A nil timeout never fires.
func (a *Actor[M]) SendWithin(ctx context.Context, m M, timeout <-chan time.Time) error {
	if a.isStopping() {
		return ErrStopped
	}
	e := envelope[M]{m: m} // one copy, shared by both sends below
	select {
	case a.mailbox <- e:
	default:
		if err := a.sendBlocking(ctx, e, timeout); err != nil {
			return err
		}
	}
	if a.isStopping() {
		return ErrStopped
	}
	return nil
}

// TrySend enqueues m if the mailbox has room and Stop was not called, and
// reports whether it did; it never blocks. A message that is enqueued as
// Stop is called may go unhandled: use it for hints (a wake-up) that can be
// lost, never for a message whose reply a caller waits for.
func (a *Actor[M]) TrySend(m M) bool {
	if a.isStopping() {
		return false
	}
	select {
	case a.mailbox <- envelope[M]{m: m}:
		return true
	default:
		return false
	}
}

// sendBlocking waits for room in the mailbox. It is its own function so
// that the common path's frame stays small: every waiting goroutine's stack
// holds that frame.
//
//go:noinline
func (a *Actor[M]) sendBlocking(ctx context.Context, e envelope[M], timeout <-chan time.Time) error {
	select {
	case a.mailbox <- e:
		return nil
	case <-a.stopping:
		return ErrStopped
	case <-ctx.Done():
		return ctx.Err()
	case <-timeout:
		return ErrFull
	}
}

// isStopping reports whether Stop was called. An atomic load rather than a
// receive on stopping: every Send asks twice, and a load is cheaper than a
// channel operation. Stop sets stopped before it closes stopping and posts
// its envelope, so the reasoning on Send holds for the flag as for the
// channel.
func (a *Actor[M]) isStopping() bool { return a.stopped.Load() }

// Done returns a channel that is closed once the loop has returned (after
// OnStop).
func (a *Actor[M]) Done() <-chan struct{} { return a.done }

// Stop asks the loop to exit and waits until it has: the loop handles every
// message that was ahead of the stop request, runs OnStop and returns. Stop
// is idempotent and may be called from any goroutine except the loop's own
// (from the handler it would wait for itself forever).
func (a *Actor[M]) Stop() {
	if a.stopped.CompareAndSwap(false, true) {
		close(a.stopping)
		a.mailbox <- envelope[M]{stop: true} // blocks only while the mailbox is full; the loop drains it
	}
	<-a.done
}

package redislock

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"time"

	"github.com/redis/go-redis/v9"

	"tenace.dev/tenace/internal/noreply"
	"tenace.dev/tenace/internal/provkit"
)

// An Acquire or an AcquireSet on one slot is decided, then done: step
// takes what the call knows (state) and what just happened (event) and
// returns one action; drive does the I/O it names (a try of the script, a
// subscription, a wait, a wake-up passed on, a void) and, when the action
// ends the call, applies the error precedence (verdict). step does no I/O
// and reads no clock, so every case of it is tested without a server
// (drive_test.go).

// claim is what one call asks the server for, every try with the same
// tokens: one key (attempt) or the keys of a set on one slot (setAttempt).
type claim interface {
	// try runs the claim's script once, with ctx.
	try(ctx context.Context) (reply, error)
	// queueVoid queues every token of the claim to be voided (see janitor):
	// a try whose outcome is unknown may have taken, or may yet take, keys.
	queueVoid()
	// describe names the claim in errors: `"k"`, or `the set "a,b"`.
	describe() string
	// channels are the release channels to wait on, one per key.
	channels() []string
	// exclusive is false for a single key's shared caller.
	exclusive() bool
}

// reply is what a try's script answered: a lease per key when granted;
// otherwise how long until a holder expires, which keys another token
// holds (a set; nil for one key), and whether a shared caller was refused
// because a writer waits.
type reply struct {
	leases      []*lease
	holderTTL   time.Duration
	held        []bool
	writerWaits bool
}

// state is what step knows of a call between events.
type state struct {
	noWait    bool // Timeout NoWait: the first answer decides
	rechecked bool // the first try was starved and asked once more
	waiting   bool // the server answered "held": the call subscribed and retries
}

// event is what just happened to a call: a try's outcome (tried), the
// subscription's failure (subErr), or the end of a wait (woken, or
// nothing: a confirmation or the fallback timer); and whether the
// acquire's context (the Timeout or ctx) has ended (waitCtx.ended: the
// Timeout's deadline has passed), and the provider closed.
type event struct {
	tried bool
	r     reply
	// err is the try's error. Before step sees it, drive has dialled the
	// server when no answer came (an *unreachableError replaces err when
	// the dial failed).
	err error
	// starved: a first try that failed was cut short by its own deadline more
	// than noreply.StarvedBy before this process saw it fail (see starved).
	starved bool
	// silence is how long a failed try had gone unanswered.
	silence time.Duration
	// subErr is the subscription's failure (errClosed when the provider
	// closed).
	subErr error
	// woken is the index (in channels()) of the channel whose wake-up
	// ended the wait before this try; -1 when none did.
	woken  int
	ended  bool
	closed bool
}

// action is what step decides.
type action int

const (
	actTry          action = iota // run the script (again)
	actRecheck                    // ask once more, briefly: a first try read too late to tell (starved)
	actSubscribe                  // subscribe to every channel, then wait (the confirmation prompts a try)
	actWait                       // wait for a wake-up, a confirmation, the fallback timer, the end or the close
	actPassOn                     // give back the wake-up this try could not use, to a younger waiter; then wait
	actPassToWriter               // give the wake-up to a writer of this process (a writer waits); then wait
	actGranted                    // return the leases
	actHeld                       // no lease: the server answered "held" (see verdict for the precedence)
	actFailed                     // the server's error reply or a failed dial: an error, whatever the Timeout
	actWaitFailed                 // a retry, or the subscription, failed: (nil, nil) if the Timeout ended it, else the error
	actNoReply                    // a first try unanswered: ErrNoReply if the Timeout ended it, else the error
	actClosed                     // the provider closed: errClosed
)

var actionNames = [...]string{"try", "recheck", "subscribe", "wait", "pass on", "pass to a writer", "granted", "held", "failed", "wait failed", "no reply", "closed"}

func (a action) String() string { return actionNames[a] }

// decision is step's answer: the action, and whether the claim's tokens
// must be voided first (a try whose outcome is unknown).
type decision struct {
	act  action
	void bool
}

// step decides what a call does next. The rules, in order:
//
//   - a provider closed is errClosed;
//   - a failed try is voided (its outcome is unknown); a first try read
//     too late to tell is asked once more; otherwise the server's error
//     reply or a failed dial fails the call, a retry unanswered for less
//     than retrySilence (or a failed subscription) is part of the wait,
//     and anything else is no reply;
//   - a grant is returned;
//   - a recheck that was not granted voids the first try, whose copy may
//     still run;
//   - "held" with NoWait, or once the acquire's context ended, is held;
//     after a first try, the call subscribes;
//   - a retry's "held" waits, after passing on the wake-up that prompted
//     it when another can use it: a shared caller refused because a
//     writer waits gives it to a writer; a set woken by a key no other
//     token holds gives it to a younger waiter of that key;
//   - the end of a wait tries again, unless the acquire's context ended.
func step(s state, e event) decision {
	switch {
	case e.closed || errors.Is(e.subErr, errClosed):
		return decision{act: actClosed}
	case e.subErr != nil:
		return decision{act: actWaitFailed}
	case !e.tried:
		if e.ended {
			return decision{act: actHeld}
		}
		return decision{act: actTry}
	case e.err != nil:
		switch {
		case !s.waiting && !s.rechecked && e.starved:
			return decision{act: actRecheck}
		case answered(e.err):
			return decision{act: actFailed, void: true}
		case s.waiting && e.silence < retrySilence:
			return decision{act: actWaitFailed, void: true}
		default:
			return decision{act: actNoReply, void: true}
		}
	case e.r.leases != nil:
		return decision{act: actGranted}
	}
	void := s.rechecked && !s.waiting
	switch {
	case s.noWait || e.ended:
		return decision{act: actHeld, void: void}
	case !s.waiting:
		return decision{act: actSubscribe, void: void}
	case e.woken >= 0 && e.r.writerWaits:
		return decision{act: actPassToWriter}
	case e.woken >= 0 && e.r.held != nil && !e.r.held[e.woken]:
		return decision{act: actPassOn}
	default:
		return decision{act: actWait}
	}
}

// answered reports whether a try's error is itself an answer: the
// server's error reply, or a failed dial (the proof that there is none).
func answered(err error) bool {
	var reply redis.Error
	return errors.As(err, &reply) || isDialFailure(err)
}

// drive runs a call to its end: the I/O step names, and the verdict.
func (p *Provider) drive(w waitCtx, c claim, noWait bool) ([]*lease, error) {
	s := state{noWait: noWait}
	e := p.tryOnce(w, c, s, w.try, -1)
	var waits []*wait
	acquired := false
	defer func() {
		for _, sw := range waits {
			// A waiter that leaves without the lock hands a wake-up on,
			// and so does a shared one granted: the release may have room
			// for the next too.
			p.subs.unsubscribe(sw, acquired && c.exclusive())
		}
	}()
	var retry *time.Timer
	defer func() {
		if retry != nil {
			retry.Stop()
		}
	}()
	var sel selector
	for {
		d := step(s, e)
		if d.void {
			c.queueVoid()
		}
		switch d.act {
		case actTry:
			e = p.tryOnce(w, c, s, w.try, e.woken)
			continue
		case actRecheck:
			// Read too late to tell: ask again, as the same claim (a grant
			// by the first try is found and returned), with half of
			// noreply.LateReply for the answer (a live server answers in well
			// under a millisecond).
			s.rechecked = true
			ctx, cancel := context.WithTimeout(w.caller, noreply.LateReply/2)
			e = p.tryOnce(w, c, s, ctx, -1)
			cancel()
			continue
		case actGranted:
			acquired = true
			return e.r.leases, nil
		case actSubscribe:
			// Subscribe first, then try again: a release between the first
			// try and the subscription would otherwise go unheard.
			s.waiting = true
			for _, ch := range c.channels() {
				sw, err := p.subs.subscribe(w.call, ch, c.exclusive())
				if err != nil {
					if !errors.Is(err, errClosed) {
						err = fmt.Errorf("redislock: subscribing to the release channel of %s: %w", c.describe(), err)
					}
					e = event{subErr: err}
					break
				}
				waits = append(waits, sw)
			}
			if e.subErr != nil {
				continue
			}
			retry = time.NewTimer(p.nextWait(e.r.holderTTL))
			sel = newSelector(waits, retry, w.acq.Done(), p.closing)
		case actPassToWriter:
			// The release that woke this shared waiter is a writer's to
			// take: a writer of this process, if one waits, tries now.
			p.subs.passOn(waits[e.woken], true)
			retry.Reset(p.nextWait(e.r.holderTTL))
		case actPassOn:
			// The release freed a key this set could not take for
			// another's sake: the wake-up goes on to that key's next
			// waiter, as a waiter that leaves passes it on.
			p.subs.passOn(waits[e.woken], false)
			retry.Reset(p.nextWait(e.r.holderTTL))
		case actWait:
			retry.Reset(p.nextWait(e.r.holderTTL))
		default:
			return nil, p.verdict(w, c, s, d.act, e)
		}
		// Until Redis confirms a subscription a release could go unheard,
		// so the confirmation itself means: try again. After it, a release
		// message (or a broken connection, which may have lost one) wakes
		// the waiter, and the fallback timer covers a message lost anyway.
		woken, ended, closed := sel.wait()
		e = event{woken: woken, ended: ended || w.ended(), closed: closed}
	}
}

// tryOnce runs one try with ctx and makes its event; woken is the wake-up
// that prompted it.
func (p *Provider) tryOnce(w waitCtx, c claim, s state, ctx context.Context, woken int) event {
	sent := time.Now()
	r, err := c.try(ctx)
	e := event{tried: true, r: r, err: err, woken: woken, ended: w.ended()}
	if err == nil {
		return e
	}
	e.silence = noreply.Unanswered(ctx, sent)
	e.starved = !s.waiting && !s.rechecked && starved(w, err)
	if !e.starved && !answered(err) && w.caller.Err() == nil {
		// No answer: before calling it silence, dial (a process starved
		// of CPU may not have run the try's own probe in time). A stalled
		// server's kernel accepts the connection; a dead one refuses it.
		if down := p.dialNow(); down != nil {
			e.err = down
		}
	}
	return e
}

// verdict is the error a call that ends without a lease returns, by one
// precedence (see precedence): ctx's error, then the Timeout's outcome,
// then the failure.
//
// The rule: (nil, nil) only when the server answered "held" (a retry cut
// short less than retrySilence after it was sent is part of that wait). A
// server's error reply, or a failed dial, is returned as itself, whatever the
// Timeout. A first try the Timeout (and noreply.LateReply after it) cut short
// is an error wrapping ErrNoReply, not (nil, nil), which says another call
// holds the key and which a Lock reports as contention (lock.rejected) rather
// than a failure.
func (p *Provider) verdict(w waitCtx, c claim, s state, act action, e event) error {
	var failure, timedOut error
	switch act {
	case actClosed:
		return errClosed
	case actHeld:
		if s.noWait && e.tried {
			return nil // the answer itself: at once, whatever else ended
		}
	case actWaitFailed:
		failure = e.subErr
		if failure == nil {
			failure = fmt.Errorf("redislock: acquiring %s: %w", c.describe(), e.err)
		}
	case actFailed:
		failure = fmt.Errorf("redislock: acquiring %s: %w", c.describe(), e.err)
		timedOut = failure
	case actNoReply:
		failure = fmt.Errorf("redislock: acquiring %s: %w", c.describe(), e.err)
		// e.err is most often the try's own deadline: quoted, not
		// wrapped, so that errors.Is(err, context.DeadlineExceeded) stays
		// the caller's ctx's (SPEC).
		timedOut = fmt.Errorf("redislock: acquiring %s: %w within the %v Timeout (%v)", c.describe(), ErrNoReply, w.timeout, e.err)
	}
	// A deadline and the i/o timeout go-redis sets from it fire on
	// different clocks (a timer, the network poller), so a call can fail
	// with an i/o timeout a moment before ctx reports its end. Once ctx's
	// deadline has passed ctx ends within moments: wait for it, so that the
	// caller sees ctx's error, not an i/o error. (The wait is bounded, and
	// the deadline is the call's own: real time.) The Timeout's deadline is
	// not waited for: it is read from the clock (waitCtx.timedOut), since
	// the timer that ends acq at it can run long after it.
	provkit.AwaitDeadline(w.caller)
	return precedence(w.caller.Err(), w.timedOut(), failure, timedOut)
}

// precedence is what a call that ends without a lease returns: ctx's
// error if ctx ended; timedOut if the Timeout did; else failure.
func precedence(ctxErr error, timedOut bool, failure, onTimeout error) error {
	switch {
	case ctxErr != nil:
		return ctxErr
	case timedOut:
		return onTimeout
	default:
		return failure
	}
}

// selector waits for the first of a call's wake-ups: each channel's
// confirmation, each one's wake-up, the retry timer, the acquire's end
// and the provider's close. One channel (every single key) selects
// statically; a set's several, through reflect.
type selector struct {
	one       *wait
	confirmed <-chan struct{} // one's, until it fired
	retry     *time.Timer
	done      <-chan struct{}
	closing   <-chan struct{}
	cases     []reflect.SelectCase // several: confirmations, then wake-ups, then retry, done, closing
}

func newSelector(waits []*wait, retry *time.Timer, done, closing <-chan struct{}) selector {
	s := selector{retry: retry, done: done, closing: closing}
	if len(waits) == 1 {
		s.one, s.confirmed = waits[0], waits[0].sub.confirmed
		return s
	}
	n := len(waits)
	s.cases = make([]reflect.SelectCase, 2*n+3)
	for i, sw := range waits {
		s.cases[i] = reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(sw.sub.confirmed)}
		s.cases[n+i] = reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(sw.wake)}
	}
	s.cases[2*n] = reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(retry.C)}
	s.cases[2*n+1] = reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(done)}
	s.cases[2*n+2] = reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(closing)}
	return s
}

// wait returns which channel's wake-up ended the wait (-1: none), or that
// the acquire ended, or the provider closed.
func (s *selector) wait() (woken int, ended, closed bool) {
	if s.one != nil {
		select {
		case <-s.confirmed:
			s.confirmed = nil // confirmed: ignored from now on
		case <-s.one.wake:
			return 0, false, false
		case <-s.retry.C:
		case <-s.done:
			return -1, true, false
		case <-s.closing:
			return -1, false, true
		}
		return -1, false, false
	}
	n := (len(s.cases) - 3) / 2
	chosen, _, _ := reflect.Select(s.cases)
	switch {
	case chosen < n:
		s.cases[chosen].Chan = reflect.Value{} // confirmed: ignored from now on
	case chosen < 2*n:
		return chosen - n, false, false
	case chosen == 2*n+1:
		return -1, true, false
	case chosen == 2*n+2:
		return -1, false, true
	}
	return -1, false, false
}

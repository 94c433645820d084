package redislock

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"tenace.dev/internal/redistest"
	"tenace.dev/tenace"
)

// replyError is an error reply of the server, as go-redis returns one.
type replyError string

func (e replyError) Error() string { return string(e) }
func (replyError) RedisError()     {}

var _ redis.Error = replyError("")

// step, case by case, with no server: what a call does after each thing
// that can happen to it.
func TestStep(t *testing.T) {
	granted := reply{leases: []*lease{{}}}
	held := reply{holderTTL: time.Second}
	writerWaits := reply{holderTTL: time.Second, writerWaits: true}
	setFreed := reply{holderTTL: time.Second, held: []bool{true, false}}     // key 1 free, key 0 held
	setStillHeld := reply{holderTTL: time.Second, held: []bool{false, true}} // key 1 held by another
	var serverErr error = replyError("ERR boom")
	refused := &unreachableError{err: &net.OpError{Op: "dial", Err: errors.New("connection refused")}}
	silent := context.DeadlineExceeded

	first := state{}
	noWait := state{noWait: true}
	rechecked := state{rechecked: true}
	waiting := state{waiting: true}
	waitingRechecked := state{waiting: true, rechecked: true}

	tried := func(r reply, err error) event { return event{tried: true, r: r, err: err, woken: -1} }
	with := func(e event, f func(*event)) event { f(&e); return e }

	for _, tc := range []struct {
		name string
		s    state
		e    event
		want decision
	}{
		// The first try.
		{"first try granted", first, tried(granted, nil), decision{act: actGranted}},
		{"first try held: subscribe", first, tried(held, nil), decision{act: actSubscribe}},
		{"first try held, NoWait", noWait, tried(held, nil), decision{act: actHeld}},
		{"first try granted, NoWait", noWait, tried(granted, nil), decision{act: actGranted}},
		{"first try held after the Timeout", first, with(tried(held, nil), func(e *event) { e.ended = true }), decision{act: actHeld}},
		{"first try granted after the Timeout", first, with(tried(granted, nil), func(e *event) { e.ended = true }), decision{act: actGranted}},
		{"first try: the server's error", first, tried(reply{}, serverErr), decision{act: actFailed, void: true}},
		{"first try: refused", first, tried(reply{}, refused), decision{act: actFailed, void: true}},
		{"first try: refused, NoWait", noWait, tried(reply{}, refused), decision{act: actFailed, void: true}},
		{"first try unanswered", first, tried(reply{}, silent), decision{act: actNoReply, void: true}},
		{"first try unanswered, briefly", first, with(tried(reply{}, silent), func(e *event) { e.silence = time.Millisecond }), decision{act: actNoReply, void: true}},
		{"first try read too late: recheck", first, with(tried(reply{}, silent), func(e *event) { e.starved = true }), decision{act: actRecheck}},

		// The recheck of a starved first try.
		{"recheck granted", rechecked, tried(granted, nil), decision{act: actGranted}},
		{"recheck held: the first try's copy is voided", rechecked, tried(held, nil), decision{act: actSubscribe, void: true}},
		{"recheck held after the Timeout", rechecked, with(tried(held, nil), func(e *event) { e.ended = true }), decision{act: actHeld, void: true}},
		{"recheck held, NoWait", state{noWait: true, rechecked: true}, tried(held, nil), decision{act: actHeld, void: true}},
		{"recheck unanswered: no second recheck", rechecked, with(tried(reply{}, silent), func(e *event) { e.starved = true }), decision{act: actNoReply, void: true}},
		{"recheck refused", rechecked, tried(reply{}, refused), decision{act: actFailed, void: true}},

		// Subscribing.
		{"subscription failed", waiting, event{subErr: errors.New("broken"), woken: -1}, decision{act: actWaitFailed}},
		{"subscription refused: closed", waiting, event{subErr: errClosed, woken: -1}, decision{act: actClosed}},

		// Waiting.
		{"a wake-up: try", waiting, event{woken: 0}, decision{act: actTry}},
		{"the timer or a confirmation: try", waiting, event{woken: -1}, decision{act: actTry}},
		{"the Timeout ended the wait", waiting, event{woken: -1, ended: true}, decision{act: actHeld}},
		{"a wake-up as the Timeout ended", waiting, event{woken: 0, ended: true}, decision{act: actHeld}},
		{"the provider closed", waiting, event{woken: -1, closed: true}, decision{act: actClosed}},
		{"closed as the Timeout ended", waiting, event{woken: -1, closed: true, ended: true}, decision{act: actClosed}},

		// A retry.
		{"retry granted", waiting, tried(granted, nil), decision{act: actGranted}},
		{"retry held: wait", waiting, tried(held, nil), decision{act: actWait}},
		{"retry held after a rechecked first try: no second void", waitingRechecked, tried(held, nil), decision{act: actWait}},
		{"retry held after the Timeout", waiting, with(tried(held, nil), func(e *event) { e.ended = true }), decision{act: actHeld}},
		{"woken, refused for a writer: pass to a writer", waiting, with(tried(writerWaits, nil), func(e *event) { e.woken = 0 }), decision{act: actPassToWriter}},
		{"refused for a writer on the timer: wait", waiting, tried(writerWaits, nil), decision{act: actWait}},
		{"a set woken by a key it could not take: pass on", waiting, with(tried(setFreed, nil), func(e *event) { e.woken = 1 }), decision{act: actPassOn}},
		{"a set woken by a key still held: wait", waiting, with(tried(setStillHeld, nil), func(e *event) { e.woken = 1 }), decision{act: actWait}},
		{"a set held on the timer: wait", waiting, tried(setFreed, nil), decision{act: actWait}},
		{"one key woken, held by another: wait", waiting, with(tried(held, nil), func(e *event) { e.woken = 0 }), decision{act: actWait}},
		{"retry: the server's error", waiting, tried(reply{}, serverErr), decision{act: actFailed, void: true}},
		{"retry refused", waiting, tried(reply{}, refused), decision{act: actFailed, void: true}},
		{"retry cut short soon after its send: part of the wait", waiting, with(tried(reply{}, silent), func(e *event) { e.silence = retrySilence - time.Millisecond }), decision{act: actWaitFailed, void: true}},
		{"retry unanswered retrySilence: no reply", waiting, with(tried(reply{}, silent), func(e *event) { e.silence = retrySilence }), decision{act: actNoReply, void: true}},
		{"retry starved: no recheck", waiting, with(tried(reply{}, silent), func(e *event) { e.starved = true; e.silence = time.Second }), decision{act: actNoReply, void: true}},
		{"closed during a try", waiting, with(tried(granted, nil), func(e *event) { e.closed = true }), decision{act: actClosed}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := step(tc.s, tc.e); got != tc.want {
				t.Errorf("step(%+v, %+v) = {%v void=%v}, want {%v void=%v}", tc.s, tc.e, got.act, got.void, tc.want.act, tc.want.void)
			}
		})
	}
}

// The precedence of a call that ends without a lease: ctx's error, then
// the Timeout's outcome, then the failure.
func TestPrecedence(t *testing.T) {
	failure, onTimeout := errors.New("failure"), errors.New("on timeout")
	for _, tc := range []struct {
		name     string
		ctxErr   error
		timedOut bool
		want     error
	}{
		{"ctx ended", context.Canceled, false, context.Canceled},
		{"ctx ended and the Timeout", context.DeadlineExceeded, true, context.DeadlineExceeded},
		{"the Timeout", nil, true, onTimeout},
		{"neither", nil, false, failure},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := precedence(tc.ctxErr, tc.timedOut, failure, onTimeout); !errors.Is(got, tc.want) {
				t.Errorf("precedence = %v, want %v", got, tc.want)
			}
		})
	}
	if got := precedence(nil, true, failure, nil); got != nil {
		t.Errorf("held at the Timeout: %v, want nil", got)
	}
}

// lateTimer is an acquire's context on a loaded machine: its deadline has
// passed, and the timer that would end it has not run.
type lateTimer struct {
	context.Context
	deadline time.Time
}

func (c lateTimer) Deadline() (time.Time, bool) { return c.deadline, true }

// heldClaim is a claim whose first try the server answers "held", and
// whose later tries fail as one sent past the Timeout does: its context's
// deadline has passed.
type heldClaim struct{ tries int }

func (c *heldClaim) try(context.Context) (reply, error) {
	c.tries++
	if c.tries == 1 {
		return reply{holderTTL: time.Second}, nil
	}
	return reply{}, context.DeadlineExceeded
}
func (*heldClaim) queueVoid()         {}
func (*heldClaim) describe() string   { return `"k"` }
func (*heldClaim) channels() []string { return []string{"k"} }
func (*heldClaim) exclusive() bool    { return true }

// A Timeout whose deadline has passed has ended, though the timer that
// ends the acquire's context has not run (beside CPU burners, on 2 cores,
// that context was seen running 290ms past its deadline): a "held"
// answered then is (nil, nil) at once, with no retry, and a retry cut
// short then is part of the wait. Before, the call read the context
// alone: it waited on and tried again, with a try context already past its
// deadline, and, the context still running when verdict had waited
// provkit.OutcomeWait for it, returned that try's failure (`redislock:
// acquiring "busy": i/o timeout`, 2 runs in 40 of
// TestAHeldKeyIsStillNotGrantedInTimeUnderLoad beside three more burners).
func TestATimeoutPastItsDeadlineHasEndedBeforeItsTimerRuns(t *testing.T) {
	srv := redistest.Start(t)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr, ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = c.Close() })
	p := New(c)
	t.Cleanup(func() { _ = p.Close() })

	// waitCtx as Acquire builds it, its acq replaced by one whose timer
	// has not run.
	late := func(t *testing.T) waitCtx {
		w, done := p.waitContexts(context.Background(), tenace.LockAcquireOptions{Timeout: time.Nanosecond})
		t.Cleanup(done)
		d, _ := w.acq.Deadline()
		for time.Now().Before(d) { // a nanosecond
		}
		w.acq = lateTimer{Context: context.Background(), deadline: d}
		w.call = w.acq
		return w
	}

	t.Run("held", func(t *testing.T) {
		claim := &heldClaim{}
		ls, err := p.drive(late(t), claim, false)
		if ls != nil || err != nil {
			t.Fatalf("drive = (%v, %v), want (nil, nil): the server answered \"held\" and the Timeout has passed", ls, err)
		}
		if claim.tries != 1 {
			t.Errorf("%d tries, want 1: none after the Timeout", claim.tries)
		}
	})
	t.Run("a retry cut short", func(t *testing.T) {
		e := event{tried: true, err: context.DeadlineExceeded, silence: time.Millisecond, woken: -1}
		d := step(state{waiting: true}, e)
		if err := p.verdict(late(t), &heldClaim{}, state{waiting: true}, d.act, e); err != nil {
			t.Errorf("verdict(%v) = %v, want nil: a retry cut short by the Timeout is part of the wait", d.act, err)
		}
	})
}

package etcdlock

import (
	"errors"
	"fmt"

	"tenace.dev/tenace/internal/keyfmt"
)

// The acquire path is split in two: step decides, from the call's state
// and what etcd just said, what comes next; the driver (attempt.run) sends
// the requests, keeps the books and ends every call without a lease in
// one place (attempt.failed: the error precedence). step does no I/O and
// reads no clock, so that every branch is tested without a server
// (step_test.go).

// request is a request of the acquire path, whose answer step reads.
type request int

const (
	reqGrant request = iota // the lease grant (or a spare lease taken)
	reqQueue                // the transaction that puts the caller's entry and reads its view
	reqLook                 // a waiter's read of its entry and its view
	reqWatch                // a waiter's watch, ended (a change seen, or to look again)
)

// reply is what etcd said to the call's last request, and what the call's
// contexts and lease were once it returned.
type reply struct {
	req request
	err error
	// ended: the call's wait context (the Timeout, ctx, Close) had ended;
	// timedOut: by the Timeout, while the caller's ctx runs.
	ended, timedOut bool
	// lost: the caller's etcd lease is lost (its keeper stopped); lostErr
	// says why.
	lost    bool
	lostErr error
	// The view read by reqQueue and reqLook: gone when the caller's entry
	// was not there, admitted when nothing before it keeps it waiting.
	gone, admitted bool
	// spareGone: the queueing failed because etcd no longer has the
	// spare lease the call took (it lapsed, or was revoked): nothing was
	// written.
	spareGone bool
}

// call is what step knows of the call beyond the reply.
type call struct {
	key    string
	noWait bool // the Timeout is tenace.NoWait
}

// next is what the driver does after a step: a request to send, or the
// call's outcome.
type next int

const (
	// Requests: the call goes on.
	doQueue   next = iota // put the entry and read the view (the lease is the caller's)
	doLook                // read the view (again), a waiter
	doPause               // a look failed for now: pause, then look again
	doWatch               // not admitted: watch for the change that may admit it
	doGrant               // admitted: make the lease the holder
	doRegrant             // the spare lease is gone: drop it, grant a fresh one (never a spare)
	// Outcomes: the call ends without a lease.
	outHeld   // etcd said the key is held, and the caller does not wait (NoWait): (nil, nil)
	outFailed // the call ends: attempt.failed(err) says how (its precedence: ctx, Close, the Timeout)
)

// decision is step's answer: what follows, the failure for outFailed, and
// held when the reply is etcd's word that the key is held (the caller's
// entry is queued behind others).
type decision struct {
	next next
	err  error
	held bool
}

// step decides what follows the reply r in call c.
func step(c call, r reply) decision {
	switch r.req {
	case reqGrant:
		return stepGrant(c.key, r)
	case reqQueue:
		return stepQueue(c, r)
	case reqLook:
		return stepLook(c.key, r)
	case reqWatch:
		return stepWatch(c.key, r)
	}
	panic(fmt.Sprintf("tenace: etcdlock: step: unknown request %d", r.req))
}

// stepGrant follows the lease grant; key is the caller's (quoted only in an error: the uncontended path
// makes none).
func stepGrant(key string, r reply) decision {
	switch {
	case r.err != nil:
		return decision{next: outFailed, err: fmt.Errorf("etcdlock: granting an etcd lease for %s: %w", keyfmt.Quote(key), r.err)}
	case r.ended:
		// The grant came after the Timeout (or ctx ended): too late
		// to queue. The lease, with nothing attached, lapses.
		return decision{next: outFailed, err: errEnded}
	}
	return decision{next: doQueue}
}

// stepQueue follows the queueing transaction.
func stepQueue(c call, r reply) decision {
	key := c.key
	switch {
	case r.spareGone && !r.ended:
		// A spare lease can lapse before its first keepalive (this
		// process starved of CPU) or be revoked; etcd refused the put,
		// so the caller is not in the queue, and a lease of its own
		// puts it there.
		return decision{next: doRegrant}
	case r.err != nil:
		return decision{next: outFailed, err: fmt.Errorf("etcdlock: queueing for %s: %w", keyfmt.Quote(key), r.err)}
	case r.gone:
		return decision{next: outFailed, err: fmt.Errorf("etcdlock: queueing for %s: the caller's entry vanished (its etcd lease expired or was revoked)", keyfmt.Quote(key))}
	case r.admitted && r.ended && !r.timedOut:
		// A ctx that ended as the grant landed wins: the caller
		// gave up (see the package doc).
		return decision{next: outFailed, err: errEnded}
	case r.admitted:
		// A reply within noreply.LateReply past the Timeout still decides.
		return decision{next: doGrant}
	case c.noWait:
		return decision{next: outHeld, held: true}
	case r.ended:
		return decision{next: outFailed, err: errEnded, held: true}
	}
	return decision{next: doLook, held: true}
}

// stepLook follows a waiter's look at its queue.
func stepLook(key string, r reply) decision {
	switch {
	case r.err != nil && r.ended:
		return decision{next: outFailed, err: fmt.Errorf("etcdlock: waiting for %s: %w", keyfmt.Quote(key), r.err)}
	case r.err != nil && r.lost:
		return decision{next: outFailed, err: fmt.Errorf("etcdlock: waiting for %s: %w", keyfmt.Quote(key), r.lostErr)}
	case r.err != nil:
		// The read is read-only, and the caller's place is kept by
		// its lease: a waiter rides through a leader change or a
		// restart of the cluster as long as its lease lives.
		return decision{next: doPause}
	case r.gone:
		return decision{next: outFailed, err: fmt.Errorf("etcdlock: waiting for %s: the caller's place in the queue vanished (its etcd lease expired or was revoked)", keyfmt.Quote(key))}
	case r.admitted && r.ended:
		// A ctx that ended as the grant landed wins, and so does
		// the Timeout: the caller gave up (see the package doc).
		return decision{next: outFailed, err: errEnded}
	case r.admitted:
		return decision{next: doGrant}
	}
	return decision{next: doWatch}
}

// stepWatch follows a waiter's watch.
func stepWatch(key string, r reply) decision {
	switch {
	case r.lost:
		return decision{next: outFailed, err: fmt.Errorf("etcdlock: waiting for %s: %w", keyfmt.Quote(key), r.lostErr)}
	case r.ended:
		return decision{next: outFailed, err: errEnded}
	}
	return decision{next: doLook}
}

// errEnded stands for the end of the call's wait context in a decision:
// the driver passes that context's error to attempt.failed.
var errEnded = errors.New("etcdlock: the call's wait ended")

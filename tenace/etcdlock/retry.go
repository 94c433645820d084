package etcdlock

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// Requests that are safe to send again (the lease grant, the queueing
// transaction, a waiter's look at its queue, a keepalive, a revoke) are
// hedged: a request unanswered after a while is sent again beside the
// first, and the client's balancer (round robin) sends the new try to the
// next member; the first answer wins. A member that died or stalled leaves
// a request unanswered — its connection open (SIGSTOP, a partition), or a
// follower that has not yet seen its leader die forwarding a proposal to
// it, where it is lost — and etcd itself would hold it for its request
// timeout (5s and two election timeouts). A try is not cut short: on a
// cluster that is merely slow, the first try still lands.

// hedgeAfter is how long a Raft write or a linearizable read goes
// unanswered before it is sent again beside the first: a hundred times what
// one takes on a healthy cluster. A try that proves unneeded costs a lease
// that lapses on its own (the grant), or nothing (the others are
// idempotent).
const hedgeAfter = 250 * time.Millisecond

// retryFor bounds the retries of the lease grant and of the queueing
// transaction after etcd's transient errors (no leader, leader changed, a
// request timed out), when the call has no shorter Timeout: long enough for
// a new leader to be elected, short enough that a cluster without a quorum
// is an error, not a wait without end.
const retryFor = 5 * time.Second

// retryPause is how long a request that etcd failed for now (and that has
// no other try in flight) pauses before it is sent again.
const retryPause = 50 * time.Millisecond

// transient reports whether err is etcd's or gRPC's word that a request
// failed for now: codes.Unavailable (no leader, leader changed, a request
// timed out, the connection closing).
func transient(err error) bool {
	var ee rpctypes.EtcdError
	if errors.As(err, &ee) {
		return ee.Code() == codes.Unavailable
	}
	if s, ok := status.FromError(err); ok {
		return s.Code() == codes.Unavailable
	}
	return false
}

// hedge sends the request f, which must be safe to send again, and returns
// the first answer: a try is started at once, another each time every
// passes without an answer, and another retryPause after etcd failed the
// last in flight for now (transient), until ctx ends or, when until is
// not zero, past until. Each try runs on a context that ends when hedge
// returns, with etcd's require-leader mark (a member that knows it has no
// leader says so at once instead of holding the request); hedge waits for
// the tries it started. It returns the first success or other error
// than a transient one; else the last transient error, or ctx's, or
// errUnanswered past until. tries is how many were started: more than
// one, and an answer that the request found nothing to do (a key already
// deleted, a lease already revoked) may be another try's doing, and a try
// whose answer was not used may still be applied later.
//
// The first try runs on the caller's goroutine, and one answered within
// every (the common case) costs no goroutine and no channel: a timer hands
// the wait to a goroutine of its own, which starts the hedged tries, only
// when every passes first.
func hedge[T any](ctx context.Context, every time.Duration, until time.Time, f func(context.Context) (T, error)) (resp T, tries int, err error) {
	return hedgeWithin(ctx, 0, every, until, f)
}

// hedgeWithin is hedge bounded by limit, when it is not zero (and past
// every): the tries still unanswered at limit are cut short, and it
// returns the last transient error or context.DeadlineExceeded. The bound
// is hedge's own, not a deadline of ctx, so that gRPC sends the tries
// without one (no timer per request on either side).
func hedgeWithin[T any](ctx context.Context, limit, every time.Duration, until time.Time, f func(context.Context) (T, error)) (resp T, tries int, err error) {
	h := &hedging[T]{ctx: ctx, every: every, until: until, f: f, tries: 1}
	if limit > 0 {
		h.limit = time.Now().Add(limit)
	}
	defer h.wg.Wait() // after the cancel, which ends the tries
	h.hctx, h.cancel = context.WithCancel(requireLeader(ctx))
	defer h.cancel()
	t := time.AfterFunc(every, h.takeOver)
	resp, err = f(h.hctx)
	h.mu.Lock()
	if h.answers == nil {
		h.finished = true // the timer, if it fires now, does nothing
		h.mu.Unlock()
		t.Stop()
		if err == nil || !transient(err) || ctx.Err() != nil {
			return resp, 1, err
		}
		h.answers = make(chan answer[T], 1)
		resp, err = h.loop(0, err, retryPause)
		return resp, h.tries, err
	}
	h.mu.Unlock()
	// The timer's goroutine waits for the answers, this one's among them.
	select {
	case h.answers <- answer[T]{resp, err}:
	case <-h.hctx.Done():
	}
	<-h.done
	return h.resp, h.tries, h.err
}

// hedging is the state of one call of hedge past its first try.
type hedging[T any] struct {
	ctx, hctx context.Context // the caller's; the tries'
	cancel    context.CancelFunc
	every     time.Duration
	until     time.Time
	limit     time.Time // zero: none (see hedgeWithin)
	f         func(context.Context) (T, error)
	wg        sync.WaitGroup // the tries started on goroutines of their own
	tries     int

	mu       sync.Mutex
	finished bool           // the first try returned before the timer fired
	answers  chan answer[T] // set once hedging goes past the first try
	done     chan struct{}  // closed when takeOver has the outcome in resp, err
	resp     T
	err      error
}

type answer[T any] struct {
	resp T
	err  error
}

// takeOver runs when every passes before the first try's answer: it sends
// the second try at once and waits, from then on, for the first answer of
// any try (the first's is sent to it by hedge), as loop says.
func (h *hedging[T]) takeOver() {
	h.mu.Lock()
	if h.finished {
		h.mu.Unlock()
		return
	}
	h.answers, h.done = make(chan answer[T], 1), make(chan struct{})
	h.mu.Unlock()
	h.resp, h.err = h.loop(1, nil, 0)
	h.cancel() // the tries still in flight, the first among them, end
	close(h.done)
}

// loop waits for the answer hedge returns, with inFlight tries started and
// unanswered, last the last transient error, and the next try due after
// wait.
func (h *hedging[T]) loop(inFlight int, last error, wait time.Duration) (T, error) {
	var zero T
	next := time.NewTimer(wait)
	defer next.Stop()
	var limit <-chan time.Time
	if !h.limit.IsZero() {
		t := time.NewTimer(time.Until(h.limit))
		defer t.Stop()
		limit = t.C
	}
	for {
		select {
		case <-limit:
			if last == nil {
				last = context.DeadlineExceeded
			}
			return zero, last
		case a := <-h.answers:
			inFlight--
			if a.err == nil || !transient(a.err) || h.ctx.Err() != nil {
				return a.resp, a.err
			}
			last = a.err
			if inFlight == 0 {
				next.Reset(retryPause)
			}
		case <-next.C:
			if !h.until.IsZero() && !time.Now().Before(h.until) {
				if last == nil {
					last = errUnanswered
				}
				return zero, last
			}
			h.start()
			inFlight++
			next.Reset(h.every)
		case <-h.ctx.Done():
			select {
			case a := <-h.answers: // an answer that came with the end
				if a.err == nil || !transient(a.err) {
					return a.resp, a.err
				}
			default:
			}
			if last == nil {
				last = h.ctx.Err()
			}
			return zero, last
		}
	}
}

// start sends one more try, on a goroutine of its own.
func (h *hedging[T]) start() {
	h.tries++
	h.wg.Go(func() {
		r, err := h.f(h.hctx)
		select {
		case h.answers <- answer[T]{r, err}:
		case <-h.hctx.Done():
		}
	})
}

// errUnanswered is the error of a request that no member answered before
// its retries ended.
var errUnanswered = fmt.Errorf("no etcd member answered within %v; check that a quorum of the cluster runs", retryFor)

// retryUntil is when the lease grant and the queueing transaction of a
// call with wctx stop being sent again: retryFor from now, or wctx's
// deadline if sooner (its end stops them anyway).
func retryUntil(wctx context.Context) time.Time {
	until := time.Now().Add(retryFor)
	if d, ok := wctx.Deadline(); ok && d.Before(until) {
		return d
	}
	return until
}

// requireLeader is clientv3.WithRequireLeader's mark on ctx, added as a
// pair rather than in a metadata map of its own, which the client would
// copy on top of the two maps it builds per request anyway.
func requireLeader(ctx context.Context) context.Context {
	return metadata.AppendToOutgoingContext(ctx, rpctypes.MetadataRequireLeaderKey, rpctypes.MetadataHasLeader)
}

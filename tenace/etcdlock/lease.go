package etcdlock

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"tenace.dev/tenace"
	"tenace.dev/tenace/internal/keyfmt"
	"tenace.dev/tenace/internal/provkit"
)

// leaseState is where a lease is; the zero value is invalid.
type leaseState = int32

const (
	_              leaseState = iota
	stateWaiting              // its Acquire waits in the queue; the keeper keeps the etcd lease alive
	stateHeld                 // granted
	stateReleased             // Release ended it (its revoke may have failed: see unsure)
	stateLost                 // lost: the signal is given, and the keeper revokes the etcd lease
	stateAbandoned            // its Acquire gave up: the keeper revokes the etcd lease
)

// lease is one grant, or one caller's place in the queue before the grant:
// an etcd lease of its own (the window), the key name under the queue's
// prefix attached to it, and a keeper that keeps the etcd lease alive and
// reports its loss: a goroutine, started by a timer when the first
// keepalive is due (a lease held for less than a renewal interval, the
// common case, never starts one).
//
// Concurrency: the fields above state are set before the lease is shared
// and never change, but for rev and reusable, set by its Acquire before
// it returns the lease. state moves once out of stateWaiting and once out
// of stateHeld, by compare-and-swap: whoever moves it ends the lease, and
// stops the keeper (stop), saying whether it revokes the etcd lease. The
// keeper alone sends keepalives and, when told, the revoke of a lost or
// abandoned lease; Release deletes the key on its own, in its caller's
// goroutine.
type lease struct {
	tenace.LeaseSignal
	p      *Provider
	key    string
	name   string // the etcd key: the queue's prefix and the lease ID
	id     clientv3.LeaseID
	shared bool  // a shared caller's (LockAcquireOptions.Shared)
	rev    int64 // the etcd key's create revision: the fencing token
	window time.Duration
	// reusable: the entry was put by one try of the queueing, answered,
	// so that no other try can put it again later (see release)
	reusable bool

	state        atomic.Int32
	revokeOnStop atomic.Bool
	kctx         context.Context // ends when the keeper must stop
	kcancel      context.CancelFunc
	starter      *time.Timer   // starts the keeper's goroutine (keep)
	exited       chan struct{} // closed when the keeper has stopped (and revoked, if told)
	stopCap      atomic.Pointer[func() bool]
	expiry       atomic.Int64 // the last expiry etcd was told (Unix ns), as the keeper knows it
	reported     atomic.Bool  // a Release has returned the loss
	unsure       atomic.Bool  // a Release's revoke failed: a later one tries again
}

var (
	_ tenace.FencedLease  = (*lease)(nil)
	_ tenace.LosableLease = (*lease)(nil)
)

// newLease registers the etcd lease id, granted by a request sent at sent
// with a TTL of ttl, and sets the timer that starts its keeper when the
// first keepalive is due. It fails when the provider is closed (the etcd
// lease, with nothing attached yet, lapses on its own).
func (p *Provider) newLease(key, name string, shared bool, id clientv3.LeaseID, sent time.Time, ttl time.Duration) (*lease, error) {
	l := &lease{p: p, key: key, name: name, shared: shared, id: id, window: ttl, exited: make(chan struct{})}
	l.kctx, l.kcancel = context.WithCancel(context.Background())
	l.state.Store(stateWaiting)
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.isClosed {
		return nil, errClosed
	}
	p.bg.Add(1) // while not closed: Close's Wait comes after
	expiry := sent.Add(ttl)
	l.expiry.Store(expiry.UnixNano())
	l.starter = time.AfterFunc(l.nextRenewal(expiry, margin(ttl)), func() { l.keep(expiry) })
	return l, nil
}

// stop tells the keeper to stop, revoking the etcd lease if revoke is set.
// A keeper not started yet never starts: its duties at the stop (the
// revoke, on a goroutine of its own, and the close of exited) are done
// here instead.
func (l *lease) stop(revoke bool) {
	if revoke {
		l.revokeOnStop.Store(true)
	}
	l.kcancel()
	if !l.starter.Stop() {
		return // keep started (or a stop before this one stopped it): it sees kctx end
	}
	if !l.revokeOnStop.Load() {
		close(l.exited)
		l.p.bg.Done()
		return
	}
	go func() {
		defer l.p.bg.Done()
		defer close(l.exited)
		l.revokeNow()
	}()
}

// revokeNow revokes the etcd lease, bounded by provkit.CleanupTimeout: a
// lease etcd does not hear of lapses within its window.
func (l *lease) revokeNow() {
	ctx, cancel := context.WithTimeout(context.Background(), provkit.CleanupTimeout)
	defer cancel()
	_, _, _ = hedge(ctx, hedgeAfter, time.Time{}, func(ctx context.Context) (*clientv3.LeaseRevokeResponse, error) {
		return l.p.client.Revoke(ctx, l.id)
	})
}

// grant makes l, at the head of its queue, the holder.
func (p *Provider) grant(l *lease, opts tenace.LockAcquireOptions) (tenace.LockLease, error) {
	p.mu.Lock()
	if p.isClosed {
		p.mu.Unlock()
		return nil, errClosed // the caller abandons l
	}
	if !l.state.CompareAndSwap(stateWaiting, stateHeld) {
		p.mu.Unlock()
		return nil, fmt.Errorf("etcdlock: acquiring %s: %w", keyfmt.Quote(l.key), l.Err())
	}
	p.leases[l] = struct{}{}
	p.held.Add(1)
	if l.shared {
		p.sharedHeld.Add(1)
	}
	p.mu.Unlock()
	// A lose or Release before this Store finds no timer to stop; the timer
	// then finds the lease ended and does nothing.
	l.stopCap.Store(provkit.CapHold(opts.Clock, opts.TTL, p.ttl, func(ttl time.Duration) {
		l.lose(fmt.Errorf("%w (etcdlock: %s was held for its TTL, %v)", tenace.ErrLeaseExpired, keyfmt.Quote(l.key), ttl))
	}))
	return l, nil
}

// forget takes a held lease off the provider's books.
func (p *Provider) forget(l *lease) {
	p.mu.Lock()
	delete(p.leases, l)
	p.mu.Unlock()
	p.held.Add(-1)
	if l.shared {
		p.sharedHeld.Add(-1)
	}
}

// keep is the keeper, started when the first keepalive is due: it sends
// one at once, then one every renewal interval (sooner when less time is
// left, and retries failures while the expiry is ahead), and reports the
// loss a margin before the last expiry etcd was told (expiry, measured
// from before its request was sent), or at once when etcd says the lease
// is gone. When kctx ends it revokes the etcd lease if told to
// (revokeOnStop), and returns.
func (l *lease) keep(expiry time.Time) {
	p := l.p
	defer p.bg.Done()
	defer close(l.exited)
	m := margin(l.window)
	renew := time.NewTimer(0)
	defer renew.Stop()
	loss := time.NewTimer(time.Until(expiry.Add(-m)))
	defer loss.Stop()
	for {
		select {
		case <-l.kctx.Done():
			if l.revokeOnStop.Load() {
				l.revokeNow()
			}
			return
		case <-loss.C:
			if time.Now().Before(expiry.Add(-m)) {
				continue // moved on by a keepalive meanwhile
			}
			l.lose(fmt.Errorf("%w: etcdlock: no keepalive of the lease on %s reached etcd by %v before its expiry; etcd may free the key", tenace.ErrLeaseLost, keyfmt.Quote(l.key), m))
		case <-renew.C:
			sent := time.Now()
			// Hedged: a keepalive is no Raft write (a follower forwards
			// it to the leader), so the tries come closer together, at
			// least four before the loss time.
			ctx, cancel := context.WithDeadline(l.kctx, expiry.Add(-m))
			every := min(hedgeAfter, max(time.Until(expiry.Add(-m))/4, 10*time.Millisecond))
			resp, _, err := hedge(ctx, every, time.Time{}, func(ctx context.Context) (*clientv3.LeaseKeepAliveResponse, error) {
				return p.client.KeepAliveOnce(ctx, l.id)
			})
			cancel()
			switch {
			case l.kctx.Err() != nil:
			case err == nil && resp.TTL > 0:
				if e := sent.Add(time.Duration(resp.TTL) * time.Second); e.After(expiry) {
					expiry = e
					l.expiry.Store(e.UnixNano())
					loss.Reset(time.Until(expiry.Add(-m)))
				}
				renew.Reset(l.nextRenewal(expiry, m))
			case err == nil || errors.Is(err, rpctypes.ErrLeaseNotFound):
				l.lose(fmt.Errorf("%w: etcdlock: etcd no longer has the lease on %s (it expired or was revoked)", tenace.ErrLeaseLost, keyfmt.Quote(l.key)))
			default:
				renew.Reset(max(p.interval/4, 10*time.Millisecond))
			}
		}
	}
}

// nextRenewal is when to send the next keepalive: the renewal interval, but
// no later than halfway to the loss time, so that a slow reply leaves time
// for another try.
func (l *lease) nextRenewal(expiry time.Time, m time.Duration) time.Duration {
	return max(0, min(l.p.interval, time.Until(expiry.Add(-m))/2))
}

// lose ends a waiting or held lease as lost with err: the signal first, then
// the keeper revokes the etcd lease, so that the holder learns of the loss
// before etcd can grant the key to another. It reports whether it ended it.
func (l *lease) lose(err error) bool {
	held := l.state.CompareAndSwap(stateHeld, stateLost)
	if !held && !l.state.CompareAndSwap(stateWaiting, stateLost) {
		return false
	}
	l.stopCapTimer()
	if held {
		l.p.forget(l)
	}
	l.Lose(err)
	l.stop(true)
	return true
}

// abandon ends a lease whose Acquire gave up: the keeper revokes it, and
// abandon waits up to wait for that (etcd then has removed the caller from
// the queue); past it the revoke goes on in the background, bounded by
// provkit.CleanupTimeout, and the key lapses within one window if it fails.
func (l *lease) abandon(wait time.Duration) {
	if l.state.CompareAndSwap(stateWaiting, stateAbandoned) {
		l.stop(true)
	}
	if wait <= 0 {
		return
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-l.exited:
	case <-t.C:
	}
}

// drop ends a waiting lease whose etcd lease etcd no longer has, before
// any entry was put on it: its keeper stops, with no revoke and no loss
// reported (nothing held it).
func (l *lease) drop() {
	if l.state.CompareAndSwap(stateWaiting, stateAbandoned) {
		l.stop(false)
	}
}

func (l *lease) stopCapTimer() {
	if stop := l.stopCap.Load(); stop != nil {
		(*stop)()
	}
}

// Token is the fencing token: the create revision of the lease's key in
// etcd. Revisions are the cluster's, so tokens strictly increase for the
// life of the cluster, across keys, grants, leader changes and restarts.
func (l *lease) Token() uint64 { return uint64(l.rev) }

// Release deletes the lease's key (its etcd lease becomes the provider's
// spare, or is revoked: see release): the next waiter, watching that key,
// is granted. It returns nil
// when it released the lock. A Release that fails (ctx ended, etcd
// unreachable) returns the error and can be called again (that one
// revokes the etcd lease); keepalives have stopped, so the key lapses
// within one window if no retry gets through. A ctx without a deadline is
// bounded by 5s. After a loss it touches nothing and returns an error
// wrapping tenace.ErrLeaseLost (the first time; later calls return nil); so
// does a first Release that finds its key gone (its etcd lease expired, or
// was revoked from outside), which reports the loss on Lost too.
func (l *lease) Release(ctx context.Context) error {
	if l.state.CompareAndSwap(stateHeld, stateReleased) {
		l.stopCapTimer()
		l.p.forget(l)
		return l.release(ctx)
	}
	switch l.state.Load() {
	case stateReleased:
		if l.unsure.Load() {
			return l.revoke(ctx, false)
		}
	case stateLost:
		// lose moved the state and signals the loss next, with nothing in
		// between that waits on the server: wait for the signal, so that
		// Err says why.
		<-l.Lost()
		if l.reported.CompareAndSwap(false, true) {
			return fmt.Errorf("etcdlock: Release of %s touched nothing: %w", keyfmt.Quote(l.key), l.Err())
		}
	}
	return nil
}

// release is the first Release's request: it deletes the lease's entry,
// as concurrency.Mutex's Unlock does (one Raft write), then stops the
// keeper. When etcd says it deleted the entry, and no other try of the
// queueing or of this delete can land later (one try each, answered:
// reusable, and tries), the etcd lease, with nothing attached any more,
// becomes the provider's spare for the next Acquire (see takeSpare);
// otherwise it is revoked in the background, so that a late try finds
// nothing to delete or no lease to put an entry on. No one else puts an
// entry of this name (it is the queue and the lease ID, and the lease is
// this grant's until then), so the delete removes this grant's entry or
// nothing. An entry already gone is a loss, as a revoke that finds the
// lease gone; a delete that fails leaves the next Release to revoke the
// lease.
func (l *lease) release(ctx context.Context) error {
	var limit time.Duration // a ctx without a deadline: provkit.CleanupTimeout
	if _, ok := ctx.Deadline(); !ok {
		limit = provkit.CleanupTimeout
	}
	var try atomic.Int32
	resp, tries, err := hedgeWithin(ctx, limit, hedgeAfter, time.Time{}, func(ctx context.Context) (*clientv3.DeleteResponse, error) {
		if l.p.beforeTry != nil {
			l.p.beforeTry(ctx, "release", try.Add(1))
		}
		return l.p.client.Delete(ctx, l.name)
	})
	switch {
	case err != nil:
		l.unsure.Store(true)
		l.stop(false)
		return fmt.Errorf("etcdlock: releasing %s failed, so the lock may still be held (for at most one window, %v); call Release again: %w", keyfmt.Quote(l.key), l.window, err)
	case resp.Deleted > 0 && tries == 1 && l.reusable:
		l.stop(false)
		l.p.putSpare(l.id, time.Unix(0, l.expiry.Load()), l.window)
		return nil
	case resp.Deleted > 0 || tries > 1:
		// (With more than one try, nothing deleted may be another
		// try's doing.)
		l.stop(true)
		return nil
	default:
		l.stop(true)
		l.reported.Store(true)
		l.Lose(fmt.Errorf("%w: etcdlock: etcd no longer had the lock on %s when it was released (its etcd lease expired or was revoked)", tenace.ErrLeaseLost, keyfmt.Quote(l.key)))
		return fmt.Errorf("etcdlock: Release of %s: %w", keyfmt.Quote(l.key), l.Err())
	}
}

// revoke is a later Release's request, after a first that failed.
func (l *lease) revoke(ctx context.Context, first bool) error {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, provkit.CleanupTimeout)
		defer cancel()
	}
	_, tries, err := hedge(ctx, hedgeAfter, time.Time{}, func(ctx context.Context) (*clientv3.LeaseRevokeResponse, error) {
		return l.p.client.Revoke(ctx, l.id)
	})
	switch {
	case err == nil, tries > 1 && errors.Is(err, rpctypes.ErrLeaseNotFound):
		// (With more than one try, a lease not found may be another
		// try's doing.)
		l.unsure.Store(false)
		return nil
	case errors.Is(err, rpctypes.ErrLeaseNotFound):
		l.unsure.Store(false)
		if !first {
			return nil // the failed Release may have revoked it
		}
		l.reported.Store(true)
		l.Lose(fmt.Errorf("%w: etcdlock: etcd no longer had the lease on %s when it was released (it expired or was revoked)", tenace.ErrLeaseLost, keyfmt.Quote(l.key)))
		return fmt.Errorf("etcdlock: Release of %s: %w", keyfmt.Quote(l.key), l.Err())
	default:
		l.unsure.Store(true)
		return fmt.Errorf("etcdlock: releasing %s failed, so the lock may still be held (for at most one window, %v); call Release again: %w", keyfmt.Quote(l.key), l.window, err)
	}
}

// IsOwner returns the comparison that holds in an etcd transaction while
// l's lock is still held by l: its key exists with the create revision it
// was granted with. Put it in the If of a Txn that writes the resource, as
// with concurrency.Mutex.IsOwner, and the write happens only while the lock
// is l's — the guard on the resource side, checked by etcd itself. It
// reports false for a lease from another provider.
func IsOwner(l tenace.LockLease) (clientv3.Cmp, bool) {
	el, ok := l.(*lease)
	if !ok {
		return clientv3.Cmp{}, false
	}
	return clientv3.Compare(clientv3.CreateRevision(el.name), "=", el.rev), true
}

package pglock

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"tenace.dev/tenace"
	"tenace.dev/tenace/internal/provkit"
)

// lease is one grant on a session (see session): the server session
// that holds the advisory lock (a set's, every key's), shared with the
// other leases on it, and the TTL timer.
//
// Concurrency: exactly one of Release, the TTL timer, the session's end (a
// lost connection) and the provider's Close ends the lease: the one that
// moves state from held to released (Release) or lost (the others, which
// then signal the loss at once: see lose). Its ender then takes the
// session (see finish), unless the session's end claimed it.
type lease struct {
	tenace.LeaseSignal
	p       *Provider
	s       *session
	key     string
	id      int32
	token   uint64
	set     []setGrant // a set's keys, all locked by the session (set.go); nil for one key
	mode    lockMode   // modeExclusive, modeShared or modePermit (permits.go); a set's is exclusive
	permits int        // a permit lease's count (LockAcquireOptions.Permits); 0 otherwise
	pid     uint32     // the backend's process id, for tests and errors

	state    atomic.Int32                // leaseHeld, then leaseReleased or leaseLost
	reported atomic.Bool                 // a Release has returned the loss
	stopTTL  atomic.Pointer[func() bool] // set once the TTL timer runs
}

const (
	leaseInvalid  int32 = iota // the zero value: never a live lease
	leaseHeld                  // nobody has ended it
	leaseReleased              // a Release ended it
	leaseLost                  // lose ended it: the loss is signalled, or about to be
)

var (
	_ tenace.FencedLease  = (*lease)(nil)
	_ tenace.LosableLease = (*lease)(nil)
)

// grant turns conn, whose session now holds the lock of key, into a lease
// on a session of its own, which owns conn and its connection slot from
// here, even when grant fails (the provider was closed meanwhile: the
// lease ends at once).
func (p *Provider) grant(conn *pgxpool.Conn, key string, id int32, fence uint64, mode lockMode, opts tenace.LockAcquireOptions) (tenace.LockLease, error) {
	l := &lease{p: p, s: newSession(p, conn), key: key, id: id, token: fence, mode: mode}
	if mode == modePermit {
		l.permits = opts.Permits
	}
	if err := p.hold(l, opts); err != nil {
		return nil, err
	}
	if !p.fencing {
		return unfenced{l}, nil
	}
	return l, nil
}

// hold makes l, whose session (taken by the caller) holds its lock (its
// set's, when l.set is set), a held lease: it joins the session, which is
// given back (its watcher runs from then on), is booked with the provider,
// and its TTL timer starts. When the provider was closed meanwhile, l ends
// at once and hold fails.
func (p *Provider) hold(l *lease, opts tenace.LockAcquireOptions) error {
	s := l.s
	l.pid = s.pid
	l.state.Store(leaseHeld)
	p.held.Add(l.count())
	if l.mode != modeExclusive {
		p.sharedHeld.Add(1)
	}
	s.mu.Lock()
	s.leases = append(s.leases, l)
	s.mu.Unlock()
	s.put()
	p.mu.Lock()
	if p.isEnded {
		p.mu.Unlock()
		l.end(fmt.Errorf("%w: the provider was closed as the lock on %s was granted", tenace.ErrLeaseLost, l.name()))
		return p.closedErr()
	}
	p.leases[l] = struct{}{}
	p.mu.Unlock()
	// An ender that comes before stopTTL is set finds no timer to stop; the
	// timer then finds the lease ended and does nothing.
	l.stopTTL.Store(provkit.CapHold(opts.Clock, opts.TTL, p.ttl, func(ttl time.Duration) {
		l.end(fmt.Errorf("%w: pglock: the lock on %s reached its TTL of %v and was released", tenace.ErrLeaseExpired, l.name(), ttl))
	}))
	return nil
}

// unfenced is a lease of a provider WithoutFencing: it has no Token.
type unfenced struct{ l *lease }

var _ tenace.LosableLease = unfenced{}

// Release is (*lease).Release.
func (u unfenced) Release(ctx context.Context) error { return u.l.Release(ctx) }

// Lost is (*lease).Lost.
func (u unfenced) Lost() <-chan struct{} { return u.l.Lost() }

// Err is (*lease).Err.
func (u unfenced) Err() error { return u.l.Err() }

// Token is the lease's fencing token: the key's counter in the table of
// keys, incremented in the statement that took the lock. It strictly
// increases, grant after grant, across processes and server restarts (it is
// committed before the grant is returned).
func (l *lease) Token() uint64 { return l.token }

// Release unlocks the key and returns the connection to the pool (or closes
// it, when ctx ended while the unlock ran: a cancel request may still be on
// its way to the session, and must not hit another caller's statement; the
// unlock itself succeeded, and Release returns nil). A second
// call does nothing and returns nil. After the lease was lost (its
// connection ended, its TTL passed, the provider closed) it touches nothing
// and returns an error wrapping tenace.ErrLeaseLost that says why (the
// first Release after the loss; later ones return nil). So does a Release
// whose unlock finds the connection ended (a backend terminated a moment
// before, whose end the lease had not seen yet): the lease was lost then.
// When the unlock fails otherwise (ctx ended, the server does not answer),
// the connection is closed instead, which releases the lock when the server
// ends the session, and the error is returned. A ctx without a deadline is
// bounded (5 s, a deadline on the unlock's socket, past which the
// connection is closed), so that a stalled server cannot hold the caller.
func (l *lease) Release(ctx context.Context) error {
	if !l.state.CompareAndSwap(leaseHeld, leaseReleased) {
		if l.state.Load() == leaseLost {
			// An ender claimed the lease as lost, and signals the loss
			// next, with nothing in between that blocks: wait for it
			// rather than return nil as if the lock had been held to the
			// end.
			if h := l.p.hooks; h != nil && h.releaseWaits != nil {
				h.releaseWaits()
			}
			<-l.Lost()
		}
		if err := l.Err(); err != nil && l.reportLoss() {
			return fmt.Errorf("pglock: Release of %s touched nothing: %w", l.name(), err)
		}
		return nil
	}
	var bound time.Time
	if _, ok := ctx.Deadline(); !ok {
		// A ctx without a deadline (the Lock step releases with one) is
		// bounded, so that a stalled server cannot hold the caller: past
		// the bound the unlock's socket times out and the connection is
		// closed, which releases the lock when the server ends the
		// session. A deadline on the socket rather than a context's: no
		// timer and no cancel request on the common path.
		bound = time.Now().Add(releaseTimeout)
	}
	return l.finish(ctx, bound, nil)
}

// releaseTimeout bounds a Release whose ctx has no deadline (a variable for
// tests).
var releaseTimeout = provkit.CleanupTimeout

// reported is set by the first Release that returned the loss.
func (l *lease) reportLoss() bool { return l.reported.CompareAndSwap(false, true) }

// end ends the lease as lost with cause (wrapping the lost error), if it is
// still held: the TTL timer, a grant that finds the provider closed.
func (l *lease) end(cause error) {
	if l.lose(cause) {
		l.unlockLost(cause)
	}
}

// lose makes the caller the lease's ender, if it is still held, and
// signals the loss (cause) at once; it reports whether it did. The ender
// then calls unlockLost (the watcher discards the connection instead).
// Close loses every lease first, then unlocks them.
//
// Between the claim and the signal, a Release finds the lease lost but not
// yet signalled: it waits for the signal (see Release). Signalling before
// the claim instead would signal a loss for a lease that a Release had
// claimed at that moment, whose caller had not lost the lock.
func (l *lease) lose(cause error) bool {
	if !l.state.CompareAndSwap(leaseHeld, leaseLost) {
		return false
	}
	if h := l.p.hooks; h != nil && h.losing != nil {
		h.losing()
	}
	l.Lose(cause)
	return true
}

// unlockLost is finish for a lease that lose ended, bounded by endTimeout
// (then the cancel's grace).
func (l *lease) unlockLost(cause error) {
	ctx, cancel := context.WithTimeout(context.Background(), endTimeout)
	defer cancel()
	_ = l.finish(ctx, time.Time{}, cause)
}

// endTimeout bounds the unlock of a lease lost to its TTL or to Close (a
// variable for tests).
var endTimeout = provkit.CleanupTimeout

// finish is run by the one ender: stop the TTL timer, take the session
// (waiting, within ctx and bound, for a nested wait on it to end); if its connection
// ended meanwhile, the lease is lost; otherwise unlock l's lock alone and
// give the session back, which returns the connection to the pool once no
// lease is left on it. cause, when not nil, is why the lease is lost (TTL,
// Close), which lose has signalled already, so that fn's context ends
// before the lock is released. bound, when not zero, bounds the call
// besides ctx (see Release).
func (l *lease) finish(ctx context.Context, bound time.Time, cause error) error {
	if stop := l.stopTTL.Load(); stop != nil {
		(*stop)()
	}
	defer l.p.forget(l)
	s := l.s
	if !s.take(ctx, bound) {
		s.mu.Lock()
		ended, endErr := s.ended, s.endErr
		s.mu.Unlock()
		if ended {
			// The session ended under the lease: the server has released
			// the lock already, and may have granted it to another.
			if cause != nil {
				return nil
			}
			l.reported.Store(true)
			l.Lose(l.lostErr(endErr))
			return fmt.Errorf("pglock: Release of %s touched nothing: %w", l.name(), l.Err())
		}
		// A nested wait of the execution, on another goroutine, still uses
		// the session: close its socket, and that wait ends the session.
		if h := l.p.hooks; h != nil && h.killing != nil {
			h.killing()
		}
		s.kill(l)
		return fmt.Errorf("pglock: unlocking %s: its session still ran another goroutine's nested wait when the release's context ended, so its connection was closed, which frees every lock on it; give goroutines that lock inside fn fn's context or a Timeout", l.name())
	}
	if err := s.watchErr; err != nil {
		// The connection ended before we could unlock: the server has
		// released the lock already, and may have granted it to another.
		// (An ender with a cause went through lose, which signalled the
		// loss.) A Release signals it here, having marked it reported
		// first, so that a second Release, which may find it signalled,
		// returns nil.
		if cause == nil {
			l.reported.Store(true)
			l.Lose(l.lostErr(err))
		}
		s.remove(l)
		s.end(err)
		if cause != nil {
			return nil
		}
		return fmt.Errorf("pglock: Release of %s touched nothing: %w", l.name(), l.Err())
	}
	unlocked, err := s.unlockOn(ctx, bound, l)
	if err == nil && !unlocked {
		err = errors.New("the session did not hold the lock")
	}
	s.remove(l)
	if err != nil && cause == nil && connEnded(s.conn, err) {
		// The connection had ended before the unlock reached the server
		// (a backend terminated a moment ago, whose end the watcher had
		// not read yet when it was stopped): the server released the lock
		// with the session, so the lease was lost before this Release, as
		// if the watcher had seen it. (Had the server unlocked and then
		// ended the session before it replied, this reports a loss that
		// came after the unlock: the safe side of the doubt.)
		l.reported.Store(true)
		l.Lose(l.lostErr(err))
		s.end(err)
		return fmt.Errorf("pglock: Release of %s could not unlock: %w", l.name(), l.Err())
	}
	if err != nil {
		s.end(fmt.Errorf("unlocking %s failed: %w", l.name(), err))
		return fmt.Errorf("pglock: unlocking %s: %w; its connection was closed instead, which releases the lock when the server ends the session", l.name(), err)
	}
	if ctx.Err() != nil {
		// Unlocked, but ctx ended while the unlock ran: cancel requests
		// may still be on their way to this session, and would hit the
		// connection's next statement. The session is tainted (see
		// dropNested): never pooled again.
		s.mu.Lock()
		s.tainted = true
		s.mu.Unlock()
	}
	s.put()
	return nil
}

// forget drops the lease from the provider's books (its session frees the
// connection slot when it ends).
func (p *Provider) forget(l *lease) {
	p.mu.Lock()
	delete(p.leases, l)
	p.mu.Unlock()
	p.held.Add(-l.count())
	if l.mode != modeExclusive {
		p.sharedHeld.Add(-1)
	}
}

// connEnded reports whether err, from a statement on c, says that c's
// connection ended by itself — the server ended the session (a FATAL error:
// a terminated backend, a shutdown) or the socket failed — rather than that
// the statement was cut short by its context (a cancel, or the cancel's
// grace running out), after which pgconn closes the connection too.
func connEnded(c *pgxpool.Conn, err error) bool {
	return c.Conn().IsClosed() && !pgconn.Timeout(err) &&
		!errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded)
}

func (l *lease) lostErr(err error) error {
	return fmt.Errorf("%w: pglock: the connection holding the lock on %s (backend %d) ended: %v; the server released the lock with the session, and another caller may hold it now", tenace.ErrLeaseLost, l.name(), l.pid, err)
}

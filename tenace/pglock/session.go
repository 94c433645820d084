package pglock

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"tenace.dev/tenace"
	"tenace.dev/tenace/internal/provkit"
)

// session is a connection pinned by held leases: the server session that
// holds their advisory locks, one watcher goroutine that learns at once
// when the connection ends, and the provider's connection slot. A lease
// of one key or of a set has a session of its own; a nested Acquire,
// exclusive or a reader's (an execution that holds leases of the provider asks for another
// key through a Lock step) waits on the session of a lease it holds (see
// sessionFor), so that PostgreSQL's deadlock detector sees the execution's
// keys and its wait as one session's, and its lease joins that session.
// The connection goes back to the pool when the last lease on it ends.
//
// Concurrency: one goroutine at a time uses conn: the one that took the
// session (busy; see take), while the watcher, which owns conn's reads
// otherwise, is stopped. mu guards leases, busy, free, ended and tainted.
type session struct {
	p    *Provider
	conn *pgxpool.Conn
	pid  uint32 // the backend's process id, for tests and errors

	mu      sync.Mutex
	leases  []*lease      // the leases held on the session, in grant order
	busy    bool          // taken: the watcher is stopped, and the taker alone uses conn
	free    chan struct{} // closed when busy clears or the session ends
	ended   bool          // conn went back to the pool or was closed; the slot is free
	endErr  error         // why the session ended under its leases, if it did
	tainted bool          // a statement on it saw its context end: a cancel request may still come (see dropNested)
	// draining: the taker is a nested call whose caller has its verdict
	// ("held") already, and drops what the wait may have taken before it
	// gives s back (see call.tellHeld): a nested wait of the execution
	// waits for that round trip rather than take a connection of its own.
	draining bool

	watching  bool        // a watcher was started since the session was last taken; guarded by mu
	watchLate *time.Timer // starts the watcher watchDelay after put, without a poller (see startWatch)
	// fd is conn's socket (hasFD: it has one); polled, guarded by mu: it
	// is in the provider's poller, which starts the watcher when it
	// becomes readable (see put). killed, guarded by mu: kill closed the
	// socket, which is never put in the poller again (its number may be
	// another socket's by now).
	fd        int32
	hasFD     bool
	polled    bool
	killed    bool
	stopping  atomic.Bool   // set by the taker before it stops the watcher
	watchDone chan struct{} // closed when the watcher has exited
	watchErr  error         // what ended the watcher, if not its stop; written before watchDone closes
}

// newSession returns the session of conn, which a call has just been
// granted a lock on: taken by that call, with no watcher yet (see put).
func newSession(p *Provider, conn *pgxpool.Conn) *session {
	s := &session{p: p, conn: conn, pid: conn.Conn().PgConn().PID(), busy: true, free: make(chan struct{})} // no watcher yet
	if h, ok := conn.Conn().PgConn().CustomData()[handlerKey].(*cancelHandler); ok {
		s.fd, s.hasFD = h.fd, h.hasFD
	}
	return s
}

// take waits until nobody else uses s, within ctx and bound (when not
// zero), and takes it, the watcher stopped. It reports false, having taken
// nothing, when s ended (its leases were lost with it) or ctx ended or
// bound passed first. A connection that ended while the watcher ran is
// found by the taker (watchErr).
func (s *session) take(ctx context.Context, bound time.Time) bool {
	s.mu.Lock()
	for s.busy && !s.ended {
		free := s.free
		s.mu.Unlock()
		if !bound.IsZero() {
			var cancel context.CancelFunc
			ctx, cancel = context.WithDeadline(ctx, bound)
			defer cancel()
			bound = time.Time{}
		}
		select {
		case <-free:
		case <-ctx.Done():
			return false
		}
		s.mu.Lock()
	}
	if s.ended {
		s.mu.Unlock()
		return false
	}
	s.occupy()
	return true
}

// tryTake takes s for a nested wait for key, if nobody uses it, it is
// fit for one (not tainted), and none of its leases holds key — a
// session's advisory locks are reentrant, so a wait there for a key it
// holds would be granted at once beside the holder. It reports whether it
// took s; a session whose connection ended meanwhile is ended (its leases
// lost) and not taken. A session draining (see draining) is waited for,
// within ctx.
func (s *session) tryTake(ctx context.Context, key string) bool {
	s.mu.Lock()
	for s.busy && s.draining && !s.ended {
		free := s.free
		s.mu.Unlock()
		select {
		case <-free:
		case <-ctx.Done():
			return false
		}
		s.mu.Lock()
	}
	if s.busy || s.ended || s.tainted || slices.ContainsFunc(s.leases, func(l *lease) bool { return l.has(key) }) {
		s.mu.Unlock()
		return false
	}
	s.occupy()
	if s.watchErr != nil {
		s.end(s.watchErr)
		return false
	}
	return true
}

// occupy marks s busy, called with s.mu held, which it unlocks; then it
// stops the watcher, if one was started. A watcher's timer that fires
// anyway finds s busy and starts none.
func (s *session) occupy() {
	s.busy, s.free = true, make(chan struct{})
	watching := s.watching
	s.watching = false
	s.unpoll()
	if s.watchLate != nil {
		s.watchLate.Stop()
	}
	s.mu.Unlock()
	s.stopWatch(watching)
}

// unpoll takes s's socket out of the provider's poller, if it is there,
// called with s.mu held: by a taker, and before anything closes the socket
// of an idle session (see poller).
func (s *session) unpoll() {
	if s.polled {
		s.p.poller.remove(s.fd)
		s.polled = false
	}
}

// stopWatch stops the watcher, when one was started (watching), waits for
// it to exit, and clears the read deadline that stopped it. A watcher not
// started yet never starts now: the session is busy (see startWatch).
func (s *session) stopWatch(watching bool) {
	if watching {
		s.stopping.Store(true)
		_ = s.conn.Conn().PgConn().Conn().SetReadDeadline(time.Now())
	}
	if h := s.p.hooks; h != nil && h.stopping != nil {
		h.stopping()
	}
	if watching {
		<-s.watchDone
		_ = s.conn.Conn().PgConn().Conn().SetReadDeadline(time.Time{})
	}
}

// put gives s back, by its taker: with leases left on it, the watcher
// runs again — once the socket has something to read (the provider's
// poller: the server's termination message, the socket's end), or, where
// there is no poller, watchDelay later (see startWatch); with none, the
// connection goes back to the pool (closed instead when tainted) and the
// slot is freed.
func (s *session) put() {
	s.mu.Lock()
	if len(s.leases) == 0 {
		s.ended = true
		free, tainted := s.free, s.tainted
		s.busy = false
		s.mu.Unlock()
		if tainted {
			discard(s.conn)
		} else {
			_ = s.conn.Conn().PgConn().Conn().SetDeadline(time.Time{})
			s.conn.Release()
		}
		<-s.p.slots
		close(free)
		return
	}
	_ = s.conn.Conn().PgConn().Conn().SetDeadline(time.Time{})
	free := s.free
	s.busy, s.draining = false, false
	if s.killed {
		s.watchLocked() // it reads the closed socket, and ends s
	} else if s.hasFD && s.p.poller != nil && s.p.poller.add(s, s.fd) {
		s.polled = true
	} else if s.watchLate == nil {
		s.watchLate = time.AfterFunc(watchDelay, s.startWatch)
	} else {
		s.watchLate.Reset(watchDelay)
	}
	s.mu.Unlock()
	close(free)
}

// watchDelay is how long after a session is given back its watcher
// starts. A lease released sooner (a short critical section: the common
// uncontended case) costs no goroutine, no read and no stop; a connection
// that ends within watchDelay of the grant is seen when the watcher
// starts, by a taker's statement (which finds it ended) if one comes
// first. It is small beside the loss signal's latency on loopback (see the
// package doc, Lost leases).
const watchDelay = 100 * time.Microsecond

// startWatch starts the watcher of s, given back, unless a taker has
// taken s since (it gives s back, and starts the timer again, when done),
// s ended, or a watcher was started already (a timer Reset as it fired).
func (s *session) startWatch() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.watchLocked()
}

// readable is the poller's news that the socket fd became readable: s's
// watcher starts, unless s was taken since (the taker took fd off the
// poller; a later put registers it again).
func (s *session) readable(fd int32) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.polled || s.fd != fd {
		return
	}
	s.p.poller.remove(fd)
	s.polled = false
	s.watchLocked()
}

// watchLocked is startWatch with s.mu held.
func (s *session) watchLocked() {
	if s.busy || s.ended || s.watching {
		return
	}
	s.watching = true
	s.stopping.Store(false)
	s.watchErr = nil
	done := make(chan struct{})
	s.watchDone = done
	go s.watch(done)
}

// end ends s under its leases, by its taker (or the watcher, which then
// takes it): every lease still held on it is lost with err as the
// reason, the connection is closed, which ends the server session and
// frees every lock it holds, and the slot is freed. A lease another ender
// claimed (a Release waiting for s) learns of the end from endErr.
func (s *session) end(err error) {
	s.mu.Lock()
	s.unpoll()
	leases := s.leases
	s.leases, s.ended, s.endErr = nil, true, err
	free := s.free
	s.busy = false
	s.mu.Unlock()
	var claimed []*lease
	for _, l := range leases {
		if l.lose(l.lostErr(err)) {
			claimed = append(claimed, l)
		}
	}
	discard(s.conn)
	for _, l := range claimed {
		if stop := l.stopTTL.Load(); stop != nil {
			(*stop)()
		}
		s.p.forget(l)
	}
	<-s.p.slots
	close(free)
}

// kill takes l off s and closes s's socket under whoever uses it, for
// l's ender that could not take s in time: the taker's statement fails,
// and it ends s (every lease on it lost). s is tainted first, so that a
// taker past its last statement closes the connection rather than pool it.
// The taker may have given s back already (its take timed out just as the
// nested wait ended): then s is idle, its socket maybe in the poller,
// which would never hear of the close. So the socket leaves the poller
// first, and an idle s gets its watcher, which reads the closed socket and
// ends s; a taker that gives s back later starts it (see put). A session
// that ended meanwhile (its taker, or its watcher, ended it: the server
// released its locks, and its connection is closed or back in the pool)
// is left alone. The socket is read under s.mu, before anything can end
// s and hijack its connection.
func (s *session) kill(l *lease) {
	s.mu.Lock()
	s.leases = slices.DeleteFunc(s.leases, func(m *lease) bool { return m == l })
	if s.ended {
		s.mu.Unlock()
		return
	}
	s.tainted, s.killed = true, true
	nc := s.conn.Conn().PgConn().Conn()
	s.unpoll()
	s.watchLocked()
	s.mu.Unlock()
	_ = nc.Close()
}

// remove takes l off s's leases.
func (s *session) remove(l *lease) {
	s.mu.Lock()
	s.leases = slices.DeleteFunc(s.leases, func(m *lease) bool { return m == l })
	s.mu.Unlock()
}

// isTainted reports whether a cancel request may still reach s (see
// dropNested).
func (s *session) isTainted() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.tainted
}

// keys returns the keys of s's leases, in grant order.
func (s *session) keys() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var keys []string
	for _, l := range s.leases {
		if l.set == nil {
			keys = append(keys, l.key)
			continue
		}
		for _, g := range l.set {
			keys = append(keys, g.key)
		}
	}
	return keys
}

// watch waits on the pinned connection, which is idle between the
// statements of its session's takers: the server sends nothing to it (no
// LISTEN), so a read returns only when the connection ends — the backend
// terminated (pg_terminate_backend, a shutdown or restart: the server says
// so and closes the socket), the socket closed, or the keepalive found the
// peer gone — or when a taker stops it with a read deadline. Then, unless
// a taker is about to use conn (which finds watchErr), the watcher takes
// the session and ends it: every lease on it is lost.
func (s *session) watch(done chan struct{}) {
	defer close(done)
	if h := s.p.hooks; h != nil && h.watching != nil {
		h.watching()
	}
	pc := s.conn.Conn().PgConn()
	for {
		err := pc.WaitForNotification(context.Background())
		if err == nil {
			continue // a notification: nobody listens, but harmless
		}
		var ne net.Error
		if s.stopping.Load() && errors.As(err, &ne) && ne.Timeout() {
			return // stopped by a taker
		}
		s.watchErr = err
		s.p.ids.forget() // a connection found dead (see idCache)
		s.mu.Lock()
		mine := !s.busy && !s.ended
		if mine {
			s.busy, s.free = true, make(chan struct{})
		}
		s.mu.Unlock()
		if mine {
			s.end(err)
		}
		return
	}
}

// unlockOn runs l's unlock on s, taken, within ctx and bound (when not
// zero: the socket's deadline, which put clears): it returns whether the
// session held what l holds. A cancel request meant for an earlier
// statement of a tainted session can reach it only now and cancel the
// unlock (SQLSTATE 57014) while ctx runs: the unlock is tried again then,
// a few times (see unlockAll).
func (s *session) unlockOn(ctx context.Context, bound time.Time, l *lease) (unlocked bool, err error) {
	if !bound.IsZero() {
		_ = s.conn.Conn().PgConn().Conn().SetDeadline(bound)
	}
	for range unlockTries {
		sctx, stop := detach(s.conn, ctx)
		err = l.unlock(sctx).Scan(&unlocked)
		stop()
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != sqlstateQueryCanceled || ctx.Err() != nil || !s.isTainted() {
			return unlocked, err
		}
	}
	return unlocked, err
}

// sessionFor returns the session of a lease that c's execution holds from
// p through the Lock steps around it (provkit.HeldLeases), taken for c's
// wait, or nil: c then waits on a connection of its own. Only a wait for
// one key, exclusive or a reader's, joins a session; a bulkhead caller
// (whose wait holds a gate, and may end its session), a set and a NoWait
// try (which never waits, so closes no cycle) do not; nor does a wait join
// a bulkhead permit's session. The innermost lease whose session is free
// is chosen.
func (p *Provider) sessionFor(c *call) *session {
	if c.keys != nil || c.mode() == modePermit || c.opts.Timeout == tenace.NoWait {
		return nil
	}
	for _, h := range provkit.HeldLeases(c.ctx, p) {
		// A bulkhead permit's session is its own: its release unlocks
		// everything the session holds (see unlockSQL).
		if l := leaseOf(h); l != nil && l.p == p && l.mode != modePermit && l.s.tryTake(c.wctx, c.key) {
			return l.s
		}
	}
	return nil
}

// leaseOf is the *lease behind a lease this provider handed out, or nil.
func leaseOf(h any) *lease {
	switch l := h.(type) {
	case *lease:
		return l
	case unfenced:
		return l.l
	case *tenace.SetLease:
		if ls := l.Leases(); len(ls) > 0 {
			return leaseOf(ls[0])
		}
	case setKey:
		return l.l
	case fencedSetKey:
		return l.l
	}
	return nil
}

// lockOn is lock for a nested call (see sessionFor), on the session c
// took: the acquire statement runs there, and the grant becomes a lease
// on that session. step decides as for any call; what differs is the
// cleanup, which must keep the session's other locks: a call that gets no
// lease drops its own key if the session took it (dropNested), and only
// when that fails, or the connection ended, is the session ended — every
// lease on it lost, as its connection's end would.
func (c *call) lockOn() (tenace.LockLease, error) {
	s := c.sess
	var id int32
	var token uint64
	registered := false
	d := decision{next: doLock}
	for {
		var r reply
		switch d.next {
		case doLock, doRetry:
			c.retry = d.next == doRetry
			if c.state.Load() == callAbandoned {
				s.put() // Acquire has left (see runBounded): ask nothing more
				return nil, nil
			}
			r, id, token = c.lockStatement(s.conn, c.key)
		case doRegister:
			c.phase.Store(phaseRegistering)
			_, err := s.conn.Exec(c.wctx, c.p.registerSQL, []byte(c.key))
			r = c.replied(s.conn, stmtRegister, err)
			registered = true
		case doDrop:
			c.tellHeld()
			_, err := s.conn.Exec(c.wctx, c.p.dropSQL[c.mode()], []byte(c.key), c.p.classID)
			r = c.replied(s.conn, stmtDrop, err)
		case doGrant:
			return c.claimOn(id, token)
		default:
			return c.concludeOn(d)
		}
		d = step(c.attempt(c.key, 0, registered, false), r)
	}
}

// claimOn makes the lease of c's key, which c's session now holds, unless
// Acquire left without waiting for the grant (see runBounded): then the
// key is dropped.
func (c *call) claimOn(id int32, token uint64) (tenace.LockLease, error) {
	s := c.sess
	if !c.state.CompareAndSwap(callRunning, callClaimed) {
		c.dropNested(false)
		return nil, nil
	}
	l := &lease{p: c.p, s: s, key: c.key, id: id, token: token, mode: c.mode()}
	if err := c.p.hold(l, c.opts); err != nil {
		return nil, err
	}
	if !c.p.fencing {
		return unfenced{l}, nil
	}
	return l, nil
}

// concludeOn is conclude for a nested call, by step's outcome d.
func (c *call) concludeOn(d decision) (tenace.LockLease, error) {
	s := c.sess
	switch d.next {
	case outHeld, outAbandoned:
		s.put()
		return nil, nil
	case outDeadlock:
		// The wait was aborted and took nothing: the session holds what
		// it held, and the other sessions of the cycle go on.
		held := s.keys()
		s.put()
		return nil, &tenace.DeadlockError{Key: c.key, Cycle: append([]string{c.key}, held...)}
	case outDropped:
		s.end(fmt.Errorf("pglock: dropping a grant of %s that raced its lock timeout failed", c.name()))
		return nil, nil
	}
	c.dropNested(d.next == outCutShort)
	switch d.next {
	case outBroken:
		return nil, d.err
	case outCutShort:
		return c.waitEnded(true)
	}
	return c.failed(d.err, d.answered)
}

// dropNested gives c's session back without c's key: a statement whose
// outcome is unknown (cut short, failed) may have taken it. cut says a
// cancel request was sent to the session: it may reach a later statement,
// so the session is tainted — no nested wait joins it any more, its
// unlocks are tried again when a cancel hits them, and its connection is
// closed rather than pooled at the end. A connection that ended, or a drop
// that fails, ends the session.
func (c *call) dropNested(cut bool) {
	s := c.sess
	if s.conn.Conn().IsClosed() {
		s.end(fmt.Errorf("pglock: the connection ended while %s was waited for on it", c.name()))
		return
	}
	if cut {
		s.mu.Lock()
		s.tainted = true
		s.mu.Unlock()
	}
	nc := s.conn.Conn().PgConn().Conn()
	_ = nc.SetDeadline(graceEnd(s.conn))
	var err error
	for range unlockTries {
		_, err = s.conn.Exec(context.Background(), c.p.dropSQL[c.mode()], []byte(c.key), c.p.classID)
		var pgErr *pgconn.PgError
		if err == nil || !errors.As(err, &pgErr) || pgErr.Code != sqlstateQueryCanceled {
			break
		}
	}
	if err != nil {
		s.end(fmt.Errorf("pglock: dropping what a wait for %s may have taken failed: %w", c.name(), err))
		return
	}
	s.put()
}

package pglock

import (
	"context"
	"database/sql/driver"
	"errors"
	"fmt"
	"math"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"tenace.dev/tenace"
	"tenace.dev/tenace/clock"
	"tenace.dev/tenace/internal/keyfmt"
	"tenace.dev/tenace/internal/noreply"
)

// ErrNoReply is wrapped by the error Acquire returns when PostgreSQL, once
// dialled, did not answer within the call's Timeout (see Acquire): a
// stalled or overloaded server, or a network that drops the packets — not
// a held key, which the server says itself, and which is (nil, nil). It
// wraps tenace.ErrNoReply, so one errors.Is covers every provider; a Lock
// reports it as a failure (*tenace.UnexpectedError, event lock.failed).
// Retry later; if it persists, the server is down or cut off. The error
// does not wrap context.DeadlineExceeded: the caller's ctx did not end.
var ErrNoReply error = noreply.Error("pglock: PostgreSQL did not answer in time")

// A Timeout on the system clock is kept by the server and bounded by the
// client (see Acquire):
const (
	// verdictLead is how long before the Timeout the server stops waiting
	// for the key, at most (a third of the time left when that is less):
	// its "held" is then on its way back by the Timeout. The lead and the
	// allowance are the time a late "held" has to arrive; the allowance
	// alone is Acquire's overrun. A loopback answer takes well under a
	// millisecond; beside two CPU burners on a loaded 2-core machine, a
	// round trip took 20–90 ms, sometimes 250 ms.
	verdictLead = 50 * time.Millisecond
	// replyAllowance is how long past its Timeout an Acquire waits for an
	// answer that is due before it calls the server silent: the godoc bounds
	// the overrun at 50 ms, and the scheduler takes its share of that.
	replyAllowance = 30 * time.Millisecond
)

// errGaveUp is the cause of a bounded call's statement context once its
// Timeout, the reply allowance and cancelGrace have passed (see
// runBounded).
var errGaveUp = errors.New("pglock: the server did not answer the call its Acquire left")

// Acquire waits for key and returns its lease: a lease when granted; (nil,
// nil) when not granted within opts.Timeout (at once with NoWait) because
// the key is held by another — PostgreSQL said so, or every connection was
// pinned by callers of this process that hold or wait for the same key, or
// a lease of this provider holds it; (nil, ctx's error) when ctx ends
// first; (nil, err) otherwise:
//
//   - an error wrapping ErrNoReply when PostgreSQL, dialled, did not answer
//     by the Timeout and 30 ms (a Timeout on the system clock: Acquire
//     returns then, the server calls going on in the background; see the
//     package doc, Waiting);
//   - the dial's error, at once, when the server refused the connection or
//     could not be reached, whatever the Timeout (errors.Is reaches the
//     cause, such as syscall.ECONNREFUSED), or the statement's when the
//     server failed;
//   - an error wrapping tenace.ErrProviderClosed once the provider is closed;
//   - ErrPoolExhausted (or an error wrapping it) when no connection is free:
//     at once with NoWait, or once the Timeout passed while it waited for
//     one and nobody else in the process holds or waits for key (the key
//     was not asked for, so this is not "not granted");
//   - for invalid input (an empty key, a negative Timeout other than
//     NoWait, a negative TTL), an error wrapping tenace.ErrMissingKey or
//     tenace.ErrInvalidOption.
//
// A nil ctx panics.
//
// A NoWait refusal calls opts.OnHeld (a Lock: its *LockNotAcquiredError)
// with the holder the refusal's own statement read, only when refused,
// from pg_locks and each holder's owner record (see WithOwner): the holder
// of a key held exclusive, or the oldest of its readers or permit holders,
// named with its grant time and token. A refusal at a Timeout names
// nobody: the wait's statement ends in lock_timeout, with no row.
//
// With a ctx inside Lock steps that hold leases of p (a nested Lock), a
// wait for the key, exclusive or a reader's (not NoWait), runs on the session of those leases, and its
// lease joins it, so that PostgreSQL's deadlock detector sees a cycle
// through it: its verdict is a *tenace.DeadlockError (see the package
// doc, Deadlocks).
//
// With opts.Shared, the key is taken shared: with Permits 0, beside other
// readers and never beside a writer; with Permits N, as one of at most N
// holders, admitted through the key's gate (see the package doc, Shared
// locks and permits). Every rule here holds for shared calls too.
//
// The server keeps the Timeout: the acquire statement sets lock_timeout for
// itself to what remains of it, less a third and 50 ms at most, and the
// server's "lock timeout" (SQLSTATE 55P03) is the answer that Acquire
// reports as (nil, nil), on a connection that goes back to the pool. With a
// Timeout on another Clock (a test's), the server cannot follow it: when it
// passes, the statement is cancelled, and the server's answer to the cancel
// counts as "held"; no answer is ErrNoReply.
//
// A statement that completes as ctx ends counts as cut short, whatever it
// found: a grant is given back, and the call returns ctx's error (with
// NoWait too); the connection is closed, not reused, since a cancel
// request may still be on its way to its session. When Acquire returns no
// lease, this provider holds nothing for the call on the server — for
// ErrNoReply, nothing once the server answers again: a grant that lands
// after Acquire left is given back in the background; for a Timeout's
// (nil, nil), nothing one round trip after (a grant that raced the
// server's lock_timeout is dropped then; see the package doc, Waiting).
// A stalled backend
// delays a call without a Timeout by 2 s at most (see the package doc).
func (p *Provider) Acquire(ctx context.Context, key string, opts tenace.LockAcquireOptions) (tenace.LockLease, error) {
	if ctx == nil {
		panic("tenace: pglock.Provider.Acquire: nil context: pass context.Background() or the caller's context")
	}
	if err := tenace.ValidateAcquire(key, opts); err != nil {
		return nil, err
	}
	c := &call{p: p, ctx: ctx, key: key, opts: opts}
	l, err := p.acquire(c)
	if l == nil && err == nil && opts.OnHeld != nil {
		c.onHeld(opts.OnHeld)
	}
	return l, err
}

// acquire runs c, whose input is checked (Acquire, AcquireSet): unless ctx
// ended or the provider is closed, it counts c's keys as waited for, waits
// for a connection slot within c's Timeout and ctx, and runs c on it.
func (p *Provider) acquire(c *call) (tenace.LockLease, error) {
	ctx, opts := c.ctx, c.opts
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if p.closed.Err() != nil {
		return nil, p.closedErr()
	}
	c.queue(1)
	defer c.queue(-1)

	// base ends with ctx or the provider's Close; wctx with the Timeout
	// too.
	base, bcancel := context.WithCancelCause(ctx)
	defer bcancel(nil)
	stop := context.AfterFunc(p.closed, func() { bcancel(tenace.ErrProviderClosed) })
	defer stop()
	c.bounded, c.deadline = opts.Timeout > 0 && clock.IsSystem(opts.Clock), time.Now().Add(opts.Timeout)
	c.permitEnd = c.deadline.Add(-2 * min(opts.Timeout/3, verdictLead))
	wctx, cancel := tenace.AcquireContext(base, opts)
	defer cancel()
	c.wctx = wctx

	// A nested wait takes the session of what its execution holds;
	// another, a connection slot: the provider's bound on connections.
	if c.sess = p.sessionFor(c); c.sess != nil {
		if !c.bounded {
			return c.run()
		}
		return c.runBounded()
	}
	select {
	case p.slots <- struct{}{}:
	default:
		if opts.Timeout == tenace.NoWait {
			return nil, ErrPoolExhausted
		}
		select {
		case p.slots <- struct{}{}:
		case <-wctx.Done():
			if tenace.TimedOut(ctx, wctx) && !c.busy() {
				// Not the key's contention: nobody in this process holds
				// or waits for it, and the server was never asked.
				return nil, fmt.Errorf("%w (no connection freed for %s within its %v Timeout; WithMaxConns %d)", ErrPoolExhausted, c.name(), opts.Timeout, p.maxConns)
			}
			return c.waitEnded(true)
		}
	}
	// From here the slot is the call's run: when it ends without a lease,
	// the slot goes back; a lease gives it back when it ends.
	if !c.bounded {
		return c.run()
	}
	return c.runBounded()
}

// call is one Acquire past its slot. Its server calls run on wctx: the
// Timeout's context (AcquireContext) when the call is not bounded; when it
// is (a Timeout on the system clock), on a worker goroutine that Acquire
// leaves behind if the server has not answered replyAllowance after the
// Timeout, with a context that ends cancelGrace later (see runBounded).
//
// Concurrency: every field but state, phase, gated, listening, told,
// retry, step, notified and freed is set before run starts and read-only after. run alone
// writes phase and those. state is the hand-off of a
// grant between the worker and the Acquire that may leave it: the worker
// claims the grant (callClaimed) before it makes a lease, Acquire abandons
// the call (callAbandoned) before it leaves; whichever moves state first
// decides — a grant Acquire did not wait for is given back by the worker.
type call struct {
	p        *Provider
	ctx      context.Context // the caller's
	wctx     context.Context
	key      string   // the key; a set's first (see set.go)
	keys     []string // a set's keys, sorted; nil for one key (Acquire)
	opts     tenace.LockAcquireOptions
	bounded  bool      // a Timeout on the system clock: the server keeps it
	deadline time.Time // the Timeout's end, when bounded
	// permitEnd is when a bulkhead's waiter stops waiting for a permit,
	// when bounded, and counts a last time: twice lockTimeout's lead
	// before the deadline, since that count is a round trip the client
	// starts, where lockTimeout's verdict is the server's own timer, so
	// that "held" is back by the deadline.
	permitEnd time.Time
	gated     bool // the session took the key's gate (a bulkhead's caller; see permits.go)
	listening bool // the session LISTENs on the key's permit channel
	// early, when bounded, is where the worker hands Acquire its outcome
	// (buffered: it never blocks); told is set once lock has sent a
	// verdict on it before its cleanup ran, so that the worker sends no
	// second one.
	early chan<- outcome
	told  bool
	retry bool // the last statement's wait ended by lock_timeout, with time left (see lock)
	// notified is the count of the connection's NOTIFYs before the last
	// acquire statement (see awaitPermit).
	notified uint64
	step     bool // the last statement's bound was maxLockTimeout, a step of a longer Timeout
	freed    bool // lock gave the connection slot back before it returned
	state    atomic.Int32
	phase    atomic.Int32 // what the server was last asked, for the error
	heldBy   []byte       // the key's holders when a NoWait try was refused (see onHeld)
	heldID   int32        // the lock id of the key the refusal was for
	// sess is the session of a lease the caller's execution holds, taken
	// for a nested wait (see sessionFor): the call uses no connection or
	// slot of its own. nil for a call on a connection of its own.
	sess *session
}

// The states of a call (see call).
const (
	callRunning   int32 = iota // nobody has decided
	callClaimed                // the worker hands Acquire a lease
	callAbandoned              // Acquire left without the worker's outcome
)

// What a call last asked the server (call.phase).
const (
	phaseConnecting int32 = iota
	phaseLocking
	phaseRegistering
)

// outcome is what a call's run returned.
type outcome struct {
	lease tenace.LockLease
	err   error
}

// runBounded runs c on a worker and waits for its outcome until the
// Timeout and the reply allowance have passed; then it leaves the worker
// behind (Close waits for it). The worker's statement is not cancelled
// then: it carries its own bound on the server (lock_timeout), whose
// answer, late, leaves the connection fit for the pool — a cancel request
// would leave it unfit (see discard), and a slow server with fewer
// connections still. Only a server still silent cancelGrace later (a
// stalled one) sees the statement cancelled and the connection given up,
// as does a worker whose caller's ctx ended while Acquire waited, or whose
// provider was closed.
func (c *call) runBounded() (tenace.LockLease, error) {
	p := c.p
	giveUp := c.deadline.Add(replyAllowance)
	// The worker's context outlives Acquire: ctx ends it only while
	// Acquire waits.
	wctx, wcancel := context.WithCancelCause(context.WithoutCancel(c.ctx))
	sctx, scancel := context.WithDeadlineCause(wctx, giveUp.Add(cancelGrace), errGaveUp)
	c.wctx = sctx
	stopCtx := context.AfterFunc(c.ctx, func() { wcancel(context.Cause(c.ctx)) })
	defer stopCtx()
	stopClosed := context.AfterFunc(p.closed, func() { wcancel(tenace.ErrProviderClosed) })
	p.mu.Lock()
	if p.isEnded {
		p.mu.Unlock()
		stopClosed()
		scancel()
		wcancel(nil)
		if c.sess != nil {
			c.sess.put()
		} else {
			<-p.slots
		}
		return nil, p.closedErr()
	}
	p.workers.Add(1)
	p.mu.Unlock()
	res := make(chan outcome, 1) // the worker never blocks on it: Acquire may have left
	c.early = res
	go func() {
		defer p.workers.Done()
		defer wcancel(nil)
		defer scancel()
		defer stopClosed()
		l, err := c.run()
		if !c.told {
			res <- outcome{l, err}
		}
	}()
	t := time.NewTimer(time.Until(giveUp))
	defer t.Stop()
	select {
	case r := <-res:
		if r.lease == nil && r.err == nil {
			// The server's "held" comes up to verdictLead early: the
			// caller hears it at its Timeout, not before, unless ctx ends
			// or the provider closes first (then that is the answer, as
			// it would have been had the server waited).
			return nil, c.untilDeadline()
		}
		return r.lease, r.err
	case <-t.C:
	}
	if !c.state.CompareAndSwap(callRunning, callAbandoned) {
		r := <-res // the worker claimed a grant: its lease is on its way
		return r.lease, r.err
	}
	if err := c.ctx.Err(); err != nil {
		return nil, err
	}
	if p.closed.Err() != nil {
		return nil, p.closedErr()
	}
	if c.keys != nil {
		// A set's session may still hold the keys it locked so far, which
		// the worker unlocks only once the server answers: (nil, nil)
		// would say they are free, so a key this provider holds does not
		// make the verdict "held" here.
		return nil, c.noReply()
	}
	return c.unanswered()
}

// untilDeadline waits until c's Timeout has passed and returns nil; or
// ctx's error if ctx ends first, the closed error if the provider closes.
func (c *call) untilDeadline() error {
	if d := time.Until(c.deadline); d > 0 {
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-t.C:
		case <-c.ctx.Done():
			return c.ctx.Err()
		case <-c.p.closed.Done():
			return c.p.closedErr()
		}
	}
	return nil
}

// run connects and locks, within wctx; it owns the call's connection slot
// (a nested call, the session it took, on which it locks instead).
func (c *call) run() (l tenace.LockLease, err error) {
	if c.sess != nil {
		return c.lockOn()
	}
	leased := false
	defer func() {
		if !leased && !c.freed {
			<-c.p.slots
		}
	}()
	conn, err := c.p.pool.Acquire(c.wctx)
	if err != nil {
		return c.failed(fmt.Errorf("pglock: connecting to PostgreSQL: %w", err), false)
	}
	l, leased, err = c.lock(conn)
	return l, err
}

// lock runs the acquire statement on conn, which it owns from here: it
// either becomes the lease's, goes back to the pool holding nothing, or is
// discarded. For a set it runs the statement for each key in turn, in
// sorted order, on the one connection, and only once every key is locked
// is the set granted; whenever it stops short, the keys locked so far are
// unlocked with the rest (giveBack, unlockAll) or the session ended
// (discard).
//
// lock is the driver: it runs what step decides, statement after
// statement, and ends the call through conclude.
func (c *call) lock(conn *pgxpool.Conn) (_ tenace.LockLease, leased bool, _ error) {
	var got []setGrant // a set's keys locked so far; nil for one key
	var id int32
	var token uint64
	registered, reconnected := false, false
	d := decision{next: doLock}
	for {
		key := c.key
		if c.keys != nil {
			key = c.keys[len(got)]
		}
		var r reply
		switch d.next {
		case doNextKey:
			got = append(got, setGrant{key: key, id: id, token: token})
			registered, c.retry = false, false
			key = c.keys[len(got)]
			fallthrough
		case doLock, doRetry:
			if d.next == doRetry {
				c.retry = true
			}
			if c.state.Load() == callAbandoned {
				// Acquire has left (see runBounded): ask nothing more. No
				// cancel was sent on the connection, which holds nothing
				// but a set's keys locked so far.
				return c.conclude(conn, got, decision{next: outAbandoned})
			}
			r, id, token = c.lockStatement(conn, key)
		case doRegister:
			c.phase.Store(phaseRegistering)
			_, err := conn.Exec(c.wctx, c.p.registerSQL, []byte(key))
			r = c.replied(conn, stmtRegister, err)
			registered = true
		case doAwaitPermit:
			c.gated = true
			r = c.replied(conn, stmtPermit, c.awaitPermit(conn, id, c.notified))
		case doReconnect, doRestart:
			discard(conn) // a dead connection, or a session that may hold the gate
			c.gated, c.listening = false, false
			why := "its connection ended"
			if d.next == doRestart {
				why = "a step of its wait ended"
			}
			reconnected = reconnected || d.next == doReconnect
			if d.next == doReconnect {
				c.p.ids.forget() // a connection found dead (see idCache)
			}
			c.phase.Store(phaseConnecting)
			var err error
			if conn, err = c.p.reconnect(c.wctx); err != nil {
				l, err := c.failed(fmt.Errorf("pglock: acquiring %s: %s, and reconnecting failed: %w", keyfmt.Quote(key), why, err), false)
				return l, false, err
			}
			d = decision{next: doLock}
			continue
		case doUnlisten:
			_, err := conn.Exec(c.wctx, `UNLISTEN *`)
			r = c.replied(conn, stmtUnlisten, err)
			c.listening = false
		case doDrop:
			c.tellHeld()
			_, err := conn.Exec(c.wctx, c.p.dropSQL[c.mode()], []byte(key), c.p.classID)
			r = c.replied(conn, stmtDrop, err)
		case doGrant:
			if c.keys != nil {
				got = append(got, setGrant{key: key, id: id, token: token})
			}
			return c.claim(conn, key, id, token, got)
		default:
			return c.conclude(conn, got, d)
		}
		d = step(c.attempt(key, len(got), registered, reconnected), r)
	}
}

// lockStatement runs the acquire statement for key on conn and returns
// the reply, with the key's lock id and the grant's token when locked.
func (c *call) lockStatement(conn *pgxpool.Conn, key string) (r reply, id int32, token uint64) {
	c.phase.Store(phaseLocking)
	gen := c.p.ids.epoch()
	sql, args := c.statement(key)
	c.notified = seen(conn)
	var pid *int32
	var fence *int64
	var locked bool
	ctx, stop := detach(conn, c.wctx)
	err := conn.QueryRow(ctx, sql, args...).Scan(&pid, &locked, &fence, &c.heldBy)
	stop()
	if h := c.p.hooks; h != nil && h.statementDone != nil {
		h.statementDone(conn.Conn().PgConn().PID(), err == nil && locked)
	}
	r = c.replied(conn, stmtLock, err)
	r.hasID, r.locked, r.fenced = pid != nil, locked, fence != nil
	if pid != nil {
		id = *pid
		c.heldID = id
		c.p.ids.learn(key, id, gen)
	}
	if fence != nil {
		token = uint64(*fence)
		c.p.learnLabel(c.label()) // the grant's statement found it, or added it
	}
	return r, id, token
}

// replied is the reply to statement s on conn, which returned err.
func (c *call) replied(conn *pgxpool.Conn, s stmt, err error) reply {
	return reply{stmt: s, err: err, cut: c.wctx.Err() != nil, dead: conn.Conn().IsClosed(), closed: c.p.closed.Err() != nil, settled: cancelSettled(conn)}
}

// attempt is what step knows of c, asking for key with got of a set's
// keys locked.
func (c *call) attempt(key string, got int, registered, reconnected bool) attempt {
	a := attempt{
		key: key, table: c.p.table, mode: c.mode(), noWait: c.opts.Timeout == tenace.NoWait, fencing: c.p.fencing,
		bounded: c.bounded, set: c.keys != nil, got: got, keys: len(c.keys),
		registered: registered, reconnected: reconnected, gated: c.gated, listening: c.listening, stepped: c.step,
		holding: c.sess != nil,
	}
	if c.bounded {
		now := time.Now()
		a.left, a.permitLeft = c.deadline.Sub(now), c.permitEnd.Sub(now)
	}
	return a
}

// tellHeld hands Acquire the verdict "held" now, when bounded, before the
// drop's round trip runs on the worker (see runBounded). The connection
// slot goes back first, so that the caller's next Acquire finds it: that
// one then waits in the pool, whose MaxConns is the same bound, for this
// connection (a round trip), rather than fail with ErrPoolExhausted. A
// nested call's session is marked draining: the execution's next nested
// wait waits for the drop, and runs on the session, rather than take a
// connection of its own (see session.tryTake).
func (c *call) tellHeld() {
	if c.early == nil {
		return
	}
	c.told, c.freed = true, true
	if c.sess == nil {
		<-c.p.slots // a nested call has no slot of its own
	} else {
		c.sess.mu.Lock()
		c.sess.draining = true
		c.sess.mu.Unlock()
	}
	c.early <- outcome{}
}

// claim makes the lease of conn, whose session holds key (every key of
// got, for a set), unless Acquire left without waiting for the grant (see
// runBounded): then it is nobody's, and given back.
func (c *call) claim(conn *pgxpool.Conn, key string, id int32, token uint64, got []setGrant) (tenace.LockLease, bool, error) {
	if !c.state.CompareAndSwap(callRunning, callClaimed) {
		c.p.unlockAll(conn)
		discard(conn)
		return nil, false, nil
	}
	if c.keys != nil {
		l, err := c.p.grantSet(conn, got, c.opts)
		return l, true, err
	}
	l, err := c.p.grant(conn, key, id, token, c.mode(), c.opts)
	return l, true, err
}

// conclude ends a call that gets no lease, by step's outcome d: it cleans
// up conn (the session holds a set's keys locked so far, maybe a grant or
// a gate) and applies the error precedence once (failed, waitEnded).
func (c *call) conclude(conn *pgxpool.Conn, got []setGrant, d decision) (tenace.LockLease, bool, error) {
	switch d.next {
	case outHeld, outAbandoned:
		c.giveBack(conn, got)
		return nil, false, nil
	case outDeadlock:
		c.giveBack(conn, got)
		return nil, false, deadlocked(c.keys[len(got)], got)
	case outBroken:
		if !d.unlock {
			c.giveBack(conn, got)
			return nil, false, d.err
		}
	case outDropped:
		discard(conn) // its session, and whatever it holds, ends
		return nil, false, nil
	case outCutShort:
		if d.keep {
			c.giveBack(conn, got)
			l, err := c.waitEnded(true)
			return l, false, err
		}
	}
	if d.unlock {
		c.p.unlockAll(conn)
	}
	discard(conn)
	var l tenace.LockLease
	var err error
	switch d.next {
	case outBroken:
		return nil, false, d.err
	case outCutShort:
		l, err = c.waitEnded(true)
	default:
		l, err = c.failed(d.err, d.answered)
	}
	return l, false, err
}

// statement returns the acquire statement for key (c's, or one of its
// set's) and its arguments, by c's mode (exclusive, shared, a bulkhead's
// gate, then its admission) and how it waits: the try for NoWait; with a
// bound on the server (see lockTimeout) when c is bounded, what remains of
// the Timeout; else the plain wait, which only ctx and the Timeout's cancel
// end.
func (c *call) statement(key string) (sql string, args []any) {
	p := c.p
	kind := waitPlain
	args = make([]any, 2, 5) // room for the bound, a bulkhead's count and the owner
	args[0], args[1] = []byte(key), p.classID
	switch {
	case c.opts.Timeout == tenace.NoWait:
		kind = waitNone
	case c.bounded:
		kind = waitBounded
		c.step = stepped(time.Until(c.deadline))
		args = append(args, waitBound{c.deadline})
	}
	defer func() {
		args = c.withOwner(args) // the last parameter
		if byID, ok := p.byID[sql]; ok && (!p.fencing || c.opts.Owner == "" && p.ownerID != 0) {
			if id, ok := p.ids.get(key); ok {
				sql, args[0] = byID, id
				if p.fencing {
					args[len(args)-1] = p.ownerIDArg
				}
				return
			}
		}
		if adding, ok := p.adding[sql]; ok && !p.knownLabel(c.label()) {
			sql = adding
		}
	}()
	if c.retry && kind == waitBounded && c.mode() != modePermit {
		return p.retrySQL[c.mode()], args
	}
	switch c.mode() {
	case modeShared:
		return p.sharedSQL[kind], args
	case modePermit:
		sql := p.entrySQL[kind]
		if c.gated {
			sql = p.admitSQL[kind]
		}
		return sql, append(args, c.opts.Permits)
	}
	return p.lockSQL[kind], args
}

// giveBack is Provider.giveBack for a call that got no lease, whose
// session holds a set's keys locked so far, or nothing — or, for a
// bulkhead's caller that waits, maybe the key's gate, a slot and a LISTEN
// (see givePermitBack).
func (c *call) giveBack(conn *pgxpool.Conn, got []setGrant) {
	if c.mode() == modePermit && c.opts.Timeout != tenace.NoWait {
		c.givePermitBack(conn)
		return
	}
	c.p.giveBack(conn, got)
}

// lockTimeout is the server's bound on a wait for the key (lock_timeout,
// in milliseconds) when left remains of the Timeout: verdictLead earlier
// (a third of left when less), so that the server's "held" is on its way
// back by the Timeout; at least 1 ms, since 0 is no bound.
func lockTimeout(left time.Duration) string {
	left -= min(left/3, verdictLead)
	return strconv.FormatInt(min(max(left.Milliseconds(), 1), maxLockTimeout.Milliseconds()), 10)
}

// waitBound is a bounded statement's $3: lockTimeout of what is left
// until end when pgx encodes it, which is once the statement is prepared —
// its first run on a connection asks the server to prepare it first, a
// round trip that a bound computed before it would not leave for: the
// server's "held" would come that much past its lead. Only the send and the
// server's wake-up are left between the bound and the wait's start.
type waitBound struct{ end time.Time }

// Value is the bound, in milliseconds, as lock_timeout takes it.
func (b waitBound) Value() (driver.Value, error) { return lockTimeout(time.Until(b.end)), nil }

// maxLockTimeout is the server's largest lock_timeout (an int of
// milliseconds: about 24.8 days; a variable for tests). A longer Timeout
// waits in steps: the server's verdict at the end of one, with time left,
// is followed by the wait again (see lock).
var maxLockTimeout = math.MaxInt32 * time.Millisecond

// stepped reports whether the server's bound for a wait with left of the
// Timeout remaining is a step of it (maxLockTimeout), not its end.
func stepped(left time.Duration) bool {
	return left-min(left/3, verdictLead) > maxLockTimeout
}

// sqlstateLockTimeout is the SQLSTATE of a statement that lock_timeout
// ended (lock_not_available).
const sqlstateLockTimeout = "55P03"

func isLockTimeout(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == sqlstateLockTimeout
}

// sqlstateDeadlock is the SQLSTATE of a statement whose wait the server's
// deadlock detector failed to break a cycle (deadlock_detected).
const sqlstateDeadlock = "40P01"

func isDeadlock(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == sqlstateDeadlock
}

// answered reports whether err, from a statement cut short, is the
// server's answer (a cancelled statement's error, say), not the client
// giving up on a silent server; a nil err is a statement that completed.
func answered(err error) bool {
	var pgErr *pgconn.PgError
	return err == nil || errors.As(err, &pgErr)
}

// reconnect returns a connection found alive, for the retry after a dead
// one. The pool's idle connections may have died together (a server
// restart, backends terminated), and the pool pings only those idle for
// over a second: reconnect pings each it gets, closes a dead one and takes
// another, up to maxConns+1 times — past the pool's idle connections, the
// pool dials a new one. All within wctx.
func (p *Provider) reconnect(wctx context.Context) (*pgxpool.Conn, error) {
	var err error
	for range p.maxConns + 1 {
		var conn *pgxpool.Conn
		if conn, err = p.pool.Acquire(wctx); err != nil {
			return nil, err
		}
		err = conn.Ping(wctx)
		if err == nil && wctx.Err() == nil {
			return conn, nil
		}
		// Dead, or the wait ended during the ping (a cancel may be on its
		// way): never reuse it.
		discard(conn)
		if wctx.Err() != nil {
			return nil, wctx.Err()
		}
	}
	return nil, err
}

// unlockAll releases every advisory lock of conn's session, best effort,
// before the cancel's grace ends (graceEnd): after it, or after discard at
// the latest, the session holds nothing. A closed connection needs
// nothing; the caller discards conn next.
//
// The bound is the socket's deadline, not a context's: a context that ended
// would start the cancel handler, and with it a grace of its own, which on
// a backend that stalls after the grant doubled the call's wait (a cancel is
// no use here anyway: discard ends the session, which frees its locks).
// Past the deadline pgconn closes the connection.
//
// A cancel request sent for the statement cut short can reach the backend
// only now (the server signals the backend after it has answered the
// request) and cancel the unlock itself (SQLSTATE 57014): the session
// would then keep the lock until the server notices the closed connection,
// a few milliseconds after Acquire returned no lease. A cancel's signal is
// spent on the statement it cancels, so the unlock is tried again, a few
// times: the handler may have sent more than one request.
func (p *Provider) unlockAll(conn *pgxpool.Conn) {
	if conn.Conn().IsClosed() {
		return
	}
	_ = conn.Conn().PgConn().Conn().SetDeadline(graceEnd(conn))
	for range unlockTries {
		_, err := conn.Exec(context.Background(), `SELECT pg_advisory_unlock_all()`)
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != sqlstateQueryCanceled {
			return
		}
	}
}

// unlockTries bounds unlockAll's tries; sqlstateQueryCanceled is the
// SQLSTATE of a statement a cancel request ended.
const (
	unlockTries           = 4
	sqlstateQueryCanceled = "57014"
)

// failed says why a step of Acquire failed with err: ctx's error when the
// caller's context ended; the closed error when Close was called meanwhile
// (the step may have failed because of it — a closed pool, a cancelled dial
// or statement — before Close's cancellation of wctx ran); why the wait
// ended when it did (see waitEnded; answered is whether the server had
// answered the step); err otherwise.
func (c *call) failed(err error, answered bool) (tenace.LockLease, error) {
	if err := c.ctx.Err(); err != nil {
		return nil, err
	}
	if c.p.closed.Err() != nil {
		return nil, c.p.closedErr()
	}
	if c.wctx.Err() != nil {
		return c.waitEnded(answered)
	}
	return nil, err
}

// waitEnded says why c's wait ended without a grant: ctx's error when the
// caller's context ended; the closed error; ErrNoReply when the server did
// not answer by the bounded call's Timeout and allowance; for a Timeout on
// the call's Clock, (nil, nil) when the server had answered (the wait was
// for the key), ErrNoReply when it had not.
func (c *call) waitEnded(answered bool) (tenace.LockLease, error) {
	if err := c.ctx.Err(); err != nil {
		return nil, err
	}
	cause := context.Cause(c.wctx)
	switch {
	case errors.Is(cause, tenace.ErrProviderClosed) || c.p.closed.Err() != nil:
		return nil, c.p.closedErr()
	case cause == errGaveUp, cause == tenace.ErrAcquireContextTimeout && !answered:
		return c.unanswered()
	case cause == tenace.ErrAcquireContextTimeout:
		return nil, nil
	}
	return nil, cause
}

// unanswered is the outcome of a call whose server did not answer by the
// Timeout (and its allowance, when bounded): not "held", which only the
// server says, but a failure (noReply) — unless a lease of this provider
// holds the key, which the server did say.
func (c *call) unanswered() (tenace.LockLease, error) {
	if c.held() {
		return nil, nil
	}
	return nil, c.noReply()
}

// noReply is the error of a call that the server did not answer in time.
func (c *call) noReply() error {
	asked := map[int32]string{
		phaseConnecting:  "connecting got no answer",
		phaseLocking:     "the lock statement got no answer",
		phaseRegistering: "registering the key got no answer",
	}[c.phase.Load()]
	within := fmt.Sprintf("its %v Timeout", c.opts.Timeout)
	if c.bounded {
		within += fmt.Sprintf(" and %v more", replyAllowance)
	}
	return fmt.Errorf("%w: acquiring %s, %s within %s; retry later, and if it persists, the server is stalled, overloaded or cut off (what was sent is cleaned up in the background)", ErrNoReply, c.name(), asked, within)
}

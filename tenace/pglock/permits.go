package pglock

import (
	"context"
	"errors"
	"net"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"tenace.dev/tenace"
)

// Shared locks and permits.
//
// A shared caller with Permits 0 (a reader) takes the key's advisory lock
// shared (pg_advisory_lock_shared): the same lock a writer takes exclusive,
// so PostgreSQL's lock manager keeps readers and writers apart, and queues
// a reader behind a writer that waits (a new request that conflicts with a
// waiter's waits too): a waiting writer is not overtaken.
//
// A caller with Permits N > 0 (a bulkhead) goes through the key's gate, a
// second advisory lock (class id, −id) that only bulkhead callers take,
// exclusive, and hold only while they are being admitted:
//
//	gate (exclusive, FIFO on the server's queue)
//	  └─ admission statement, repeated until admitted:
//	       count the key's shared holders (pg_locks)
//	       fewer than N → take the key shared (waits behind a writer),
//	                      increment the fence, unlock the gate: granted
//	       N or more    → LISTEN on the key's channel; wait for a NOTIFY
//	                      (a permit holder's Release sends one) or
//	                      permitRepoll, whichever first; count again
//
// Only the gate's holder admits, so two callers never both count N−1 and
// both enter. A holder whose session ends (its process killed, its backend
// terminated) sends no NOTIFY; the gate's holder counts again within
// permitRepoll and sees its permit back. The gate queues the bulkhead's
// waiters in arrival at the server's lock queue, FIFO as a plain lock's;
// the caller at the head of it keeps those behind waiting.
//
// The count is what the server's lock manager says (pg_locks), so a
// caller's Permits is checked by that caller alone, against the holders
// there are: PostgreSQL keeps no "first holder's count" for a key. Callers
// that pass different Permits for one key each enforce their own; a reader
// with Permits 0 takes no gate and counts nobody, and is admitted beside
// any number of permit holders (but is counted by them). Hence: give every
// caller of a key the same Permits.

// waitKind is how an acquire statement waits for its lock.
type waitKind int

const (
	waitPlain   waitKind = iota // until granted or cancelled
	waitBounded                 // lock_timeout ($3): a Timeout on the system clock
	waitNone                    // tries once: NoWait
	waitKinds                   // the number of kinds
)

// permitRepoll bounds a bulkhead waiter's wait for a NOTIFY before it counts
// the holders again: the time it takes at most to see the permit of a
// holder whose session ended, which sends none. A waiter whose wait ends
// sooner (its Timeout) does not LISTEN, which costs a round trip, but
// counts again every permitPoll.
const (
	permitRepoll = 100 * time.Millisecond
	permitPoll   = 10 * time.Millisecond
)

// permitStatement is a bulkhead caller's acquire statement: $1 the key,
// $2 the class id, (bounded: $3 the wait's bound on the server), then N.
// It returns what lockStatement returns: (id, admitted, fence).
//
// With gateExpr (the entry statement), it first takes the key's gate
// (waits for it, or tries: NoWait); without (the admission), the session
// holds the gate already. Then, when the key's shared holders are fewer
// than N, it takes the key shared — which waits, behind a writer that
// holds or waits for the key — increments the fence and unlocks the gate.
// Else admitted is false, and the gate stays held, unless release (NoWait:
// the caller will not wait).
//
// The count is taken once the gate is held (n uses gt) and before the lock
// (l uses n); the gate is unlocked after the lock (g reads l in its FROM,
// also when release unlocks it whatever l found: PostgreSQL runs the final
// SELECT's FROM before its select list, so a g that did not read l would
// open the gate before the count, and two NoWait callers could both count
// N−1 and both enter), before the
// fence's update commits, which is safe: the next caller's count already
// sees this holder, and its own fence update waits for this one's to
// commit, as two readers' do.
//
// A statement that fails (lock_timeout in the shared wait, a cancel) may
// leave the session holding the gate: session advisory locks survive
// their transaction's abort. The caller then ends the session (see
// call.giveBack), unless it knows it holds the gate (the admission).
func (p *Provider) permitStatement(gateExpr, sharedExpr, nParam string, release bool, owner string) string {
	gate := `true`
	if gateExpr != "" {
		gate = gateExpr
	}
	count := `SELECT count(*) AS held FROM pg_locks
	WHERE (SELECT ok FROM gt) AND locktype = 'advisory' AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
	AND classid = $2::int4::oid AND objid = (SELECT id FROM k)::oid AND objsubid = 2 AND mode = 'ShareLock' AND granted`
	unlock := `(SELECT ok FROM l)`
	if release {
		unlock = `(SELECT ok FROM gt)`
	}
	head := `WITH k AS (SELECT id` + p.heldByCols() + ` FROM ` + p.table + ` WHERE key = $1),
gt AS MATERIALIZED (SELECT ` + gate + ` AS ok FROM k),
n AS MATERIALIZED (` + count + `),
l AS MATERIALIZED (SELECT CASE WHEN (SELECT ok FROM gt) AND n.held < ` + nParam + `::int8 THEN ` + sharedExpr + ` ELSE false END AS ok FROM k, n),
g AS MATERIALIZED (SELECT CASE WHEN ` + unlock + ` THEN pg_advisory_unlock($2::int4, -(SELECT id FROM k)) END AS open FROM (SELECT count(*) FROM l) AS after_l)`
	if !p.fencing {
		return head + `
SELECT (SELECT id FROM k), coalesce((SELECT ok FROM l), false), NULL::bigint` + heldBySelect + ` FROM g`
	}
	return head + `,
u AS (UPDATE ` + p.table + ` SET fence = fence + 1` + owner + ` WHERE id = (SELECT id FROM k) AND (SELECT ok FROM l) RETURNING fence),
s AS MATERIALIZED (SELECT ` + syncCommit + `)
SELECT (SELECT id FROM k), coalesce((SELECT ok FROM l), false), (SELECT fence FROM u)` + heldBySelect + ` FROM s, g`
}

// permitChannel is the NOTIFY channel of key id's permits.
func (p *Provider) permitChannel(id int32) string {
	return "tenace_permits_" + strconv.FormatUint(uint64(uint32(p.classID)), 10) + "_" + strconv.FormatInt(int64(id), 10)
}

// notifications counts the NOTIFYs a connection received, whoever read
// them (a statement, or awaitPermit): a waiter that saw one arrive during
// its count counts again rather than wait for the next. It lives in the
// connection's CustomData, put there as the connection is built, so that
// the reader of a notification (the connection's owner, or a lease's
// watcher) only reads the map.
type notifications struct{ n atomic.Uint64 }

const notificationsKey = "tenace.dev/tenace/pglock.notifications"

// onNotification is the connections' pgconn OnNotification: it counts.
// (pgx's default buffers them in the connection without bound.)
func onNotification(c *pgconn.PgConn, _ *pgconn.Notification) {
	if n := received(c); n != nil {
		n.n.Add(1)
	}
}

// received is c's count of NOTIFYs; nil only for a connection that the
// provider did not build.
func received(c *pgconn.PgConn) *notifications {
	n, _ := c.CustomData()[notificationsKey].(*notifications)
	return n
}

// seen is how many NOTIFYs conn has received.
func seen(conn *pgxpool.Conn) uint64 {
	if n := received(conn.Conn().PgConn()); n != nil {
		return n.n.Load()
	}
	return 0
}

// errPermitWait is the cause of a failed wait for a permit's NOTIFY.
var errPermitWait = errors.New("pglock: waiting for a permit's release")

// awaitPermit is a bulkhead waiter's wait, holding the gate of key id,
// for a permit to come back: when the wait may last longer than
// permitRepoll, LISTEN on the key's channel the first time (then count
// again at once: a release before the LISTEN sent its NOTIFY to nobody);
// then until a NOTIFY arrives (before is the count of them before the
// statement that found the permits taken), permitRepoll passes
// (permitPoll, not listening), the end of the wait (c.permitEnd, when
// bounded) comes, or wctx ends. It returns the LISTEN's error, or the
// connection's when it failed while waiting; nil otherwise — the caller
// looks at wctx and the time next.
func (c *call) awaitPermit(conn *pgxpool.Conn, id int32, before uint64) error {
	if !c.listening && (!c.bounded || time.Until(c.permitEnd) > permitRepoll) {
		c.listening = true
		_, err := conn.Exec(c.wctx, "LISTEN "+pgx.Identifier{c.p.permitChannel(id)}.Sanitize())
		return err
	}
	if seen(conn) != before {
		return nil
	}
	step := permitRepoll
	if !c.listening {
		step = permitPoll
	}
	end := time.Now().Add(step)
	if c.bounded && c.permitEnd.Before(end) {
		end = c.permitEnd
	}
	pc := conn.Conn().PgConn()
	nc := pc.Conn()
	_ = nc.SetReadDeadline(end)
	// wctx's end cuts the wait short through the same deadline; the
	// connection's context handler is not involved (no statement runs: a
	// cancel request would find the backend idle, and could hit the next).
	woken := make(chan struct{})
	stop := context.AfterFunc(c.wctx, func() {
		defer close(woken)
		_ = nc.SetReadDeadline(time.Now())
	})
	err := pc.WaitForNotification(context.Background())
	if !stop() {
		<-woken
	}
	_ = nc.SetReadDeadline(time.Time{})
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() && !pc.IsClosed() {
		return nil
	}
	if err != nil {
		return errors.Join(errPermitWait, err)
	}
	return nil
}

// unlockSQL is the statement that unlocks l's key, by l's mode: a permit
// holder's also sends a NOTIFY to the gate's holder, if one waits ($3, its
// channel).
func (l *lease) unlockSQL() string {
	switch l.mode {
	case modeShared:
		return `SELECT pg_advisory_unlock_shared($1::int4, $2)`
	case modePermit:
		// pg_notify returns void, which IS NOT NULL; the NOTIFY is sent
		// when the statement commits, after the unlock.
		return `SELECT pg_advisory_unlock_shared($1::int4, $2) AND pg_notify($3, '') IS NOT NULL`
	}
	return `SELECT pg_advisory_unlock($1::int4, $2)`
}

// lockMode is what a call asks for of its key, and what a lease holds.
type lockMode int

const (
	modeExclusive lockMode = iota // the whole key (the zero value: Shared false)
	modeShared                    // a reader's share (Permits 0)
	modePermit                    // one of N permits: shared, and NOTIFY on release
)

// mode is how c takes its key.
func (c *call) mode() lockMode {
	switch {
	case !c.opts.Shared:
		return modeExclusive
	case c.opts.Permits == 0:
		return modeShared
	}
	return modePermit
}

// SupportsShared reports true: Acquire honours LockAcquireOptions.Shared
// and Permits (tenace.SharedLockProvider). Readers (Permits 0) take the
// key's advisory lock shared; a bulkhead's callers (Permits N) are
// admitted one at a time through a gate and counted on the server. See
// the package doc, Shared locks and permits.
func (p *Provider) SupportsShared() bool { return true }

var _ tenace.SharedLockProvider = (*Provider)(nil)

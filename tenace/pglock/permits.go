package pglock

import (
	"context"
	"errors"
	"fmt"
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
// A caller with Permits N > 0 (a bulkhead) holds one of the key's N permit
// slots: slot i is an advisory lock of its own, taken exclusive, so that
// two holders never share one, and PostgreSQL releases it with the session
// that holds it. A holder also holds the key shared, so that a writer
// excludes it. Nothing counts holders: a free slot is a permit free.
//
//	NoWait    ── one statement: try the slots 0, 1, … in turn
//	             (pg_try_advisory_lock), the first free one taken;
//	             then try the key shared; fence: granted
//	             (no slot free, or a writer holds or waits: not granted,
//	             the slot given back in the same statement)
//	a waiter  ── one statement: take the key's gate (waits in its queue,
//	             FIFO), try the slots as above, then
//	             a slot → wait for the key shared (behind a writer),
//	                      fence, unlock the gate: granted
//	             none   → keep the gate, and wait, with no statement
//	                      running, for a NOTIFY on the key's channel
//	                      (a Release sends one while the gate is
//	                      held), or permitRepoll;
//	                      then try the slots again, holding the gate
//
// Slots: a caller takes the lowest free slot, so a held slot's index is
// below the number of the key's holders when it was taken; slots past
// max_connections (sessions) are never needed, and a caller tries
// min(N, max_connections) at most. Slot i of the key of id k is the lock
// (slotClass, k XOR reverse32(i)): slotClass is the OID of the table's
// primary key index, an OID no table has, so the slots meet neither the
// keys and gates (the table's OID) nor another table's; k XOR
// reverse32(i) is one-to-one for a given k (a key's slots are distinct)
// and for a given i, and for every pair as long as k < 2^(32−b) with
// i < 2^b (a million keys and 4,096 holders of one key, say). Past that,
// two keys' slots may share a lock: never more than N holders of a key
// (each holds a distinct lock of its own key's N), but one may hold a
// slot another key counts on, which that key then sees taken.
//
// Waking: a permit comes back either by a Release, which sends a NOTIFY
// after its unlock, or by the end of its holder's session (a killed
// process, a terminated backend), which sends none. PostgreSQL wakes a
// session on the grant of the one lock it waits for, on a cancel or a
// timeout, and delivers a NOTIFY only to an idle session: it has no wait
// for "any one of N locks". So the gate's holder waits idle for the
// NOTIFY (a Release wakes it at once, without a scan of the lock table),
// and tries the slots again every permitRepoll to see the permit of a
// holder whose session ended — N try-locks, no scan of pg_locks. A
// waiter blocked on one busy slot instead would see that slot's holder
// end at once, but not a Release of another slot.
//
// Only the gate's holder and NoWait callers take slots, and a slot is
// taken by one session at a time, so at most N hold the key. The gate
// keeps the waiters in arrival at its queue on the server; a NoWait caller
// takes no gate, and is granted whenever a slot is free and no writer
// holds or waits for the key — also while the gate's holder has not yet
// taken a permit that a Release gave back a moment before (the NoWait
// caller may take it; the waiter then waits for the next).
//
// Callers of one key that pass different Permits each try their own
// number of slots: a caller with Permits 2 is admitted while slot 0 or 1
// is free, whatever those with Permits 5 hold in slots 2–4. A reader with
// Permits 0 takes no slot, and is admitted beside any number of permit
// holders. Hence: give every caller of a key the same Permits.

// waitKind is how an acquire statement waits for its lock.
type waitKind int

const (
	waitPlain   waitKind = iota // until granted or cancelled
	waitBounded                 // lock_timeout ($3): a Timeout on the system clock
	waitNone                    // tries once: NoWait
	waitKinds                   // the number of kinds
)

// permitRepoll bounds a bulkhead waiter's wait for a NOTIFY before it
// tries the slots again: the time it takes at most to see the permit of a
// holder whose session ended, which sends none. A waiter whose wait ends
// sooner (its Timeout) does not LISTEN, which costs a round trip, but
// tries again every permitPoll. (permitRepoll is a variable for tests.)
var permitRepoll = 100 * time.Millisecond

const permitPoll = 10 * time.Millisecond

// slotSQL is the advisory lock of the key's slot i (an SQL expression),
// on the lock's two int4: see "Slots" above.
func (p *Provider) slotSQL(i string) string {
	return strconv.Itoa(int(p.slotClass)) + `, (SELECT id FROM k) # reverse((` + i + `)::int4::bit(32)::text)::bit(32)::int4`
}

// permitStatement is a bulkhead caller's acquire statement: $1 the key,
// $2 the class id, (bounded: $3 the wait's bound on the server), then N.
// It returns what lockStatement returns: (id, admitted, token, holders).
//
// With gateExpr (the entry statement), it first takes the key's gate;
// without (the admission, and NoWait), it takes none: the session holds
// the gate already, or needs none. Then it tries the key's slots in turn
// (sl: a recursive CTE, which PostgreSQL runs step by step, so that it
// stops at the first slot taken) and, with one, takes the key shared
// (sharedExpr: waits behind a writer that holds or waits for the key, or
// tries: NoWait), takes the token and unlocks the gate (see tail). With no slot,
// admitted is false, and the gate stays held; with a slot and a refused
// try (NoWait), the slot is unlocked (x).
//
// Each CTE reads the one before it (gt, sl, l, then x and g read l in
// their FROM: PostgreSQL runs the final SELECT's FROM before its select
// list, so a g that did not read l would open the gate before the slots
// are tried), and the gate is unlocked before the statement commits,
// which is safe: the next caller finds this one's slot taken already, and
// takes a later token from the sequence.
//
// A statement that fails (lock_timeout in the shared wait, a cancel) may
// leave the session holding the gate and a slot: session advisory locks
// survive their transaction's abort. The call then unlocks everything its
// session holds (see call.giveBack), or ends the session.
func (p *Provider) permitStatement(gateExpr, sharedExpr, nParam string, try bool, owner string) string {
	gate := `true`
	if gateExpr != "" {
		gate = gateExpr
	}
	slots := `least(` + nParam + `::int8, current_setting('max_connections')::int8)`
	head := `WITH k AS (SELECT id FROM ` + p.table + ` WHERE key = $1),
gt AS MATERIALIZED (SELECT ` + gate + ` AS ok FROM k),
sl AS MATERIALIZED (WITH RECURSIVE st(i, ok) AS (
	SELECT 0, pg_try_advisory_lock(` + p.slotSQL("0") + `) FROM gt WHERE gt.ok
	UNION ALL
	SELECT st.i + 1, pg_try_advisory_lock(` + p.slotSQL("st.i + 1") + `) FROM st WHERE NOT st.ok AND st.i + 1 < ` + slots + `)
	SELECT i FROM st WHERE ok),
l AS MATERIALIZED (SELECT CASE WHEN EXISTS (SELECT 1 FROM sl) THEN ` + sharedExpr + ` ELSE false END AS ok FROM k),`
	if try {
		head += `
g AS MATERIALIZED (SELECT CASE WHEN NOT l.ok AND EXISTS (SELECT 1 FROM sl) THEN pg_advisory_unlock(` + p.slotSQL("(SELECT i FROM sl)") + `) END AS open FROM l)`
	} else {
		head += `
g AS MATERIALIZED (SELECT CASE WHEN (SELECT ok FROM l) THEN pg_advisory_unlock($2::int4, -(SELECT id FROM k)) END AS open FROM (SELECT count(*) FROM l) AS after_l)`
	}
	return head + p.tail(p.fencing, owner, nParam, try, `(SELECT count(*) FROM g) AS after_g`)
}

// slotClassSQL finds the slots' class id: the OID of the table's primary
// key index ($1, the table's OID).
const slotClassSQL = `SELECT indexrelid FROM pg_index WHERE indrelid = $1::oid AND indisprimary`

// findSlotClass sets p.slotClass (see slotClassSQL), on c.
func (p *Provider) findSlotClass(ctx context.Context, c *pgxpool.Conn) error {
	var oid uint32
	if err := c.QueryRow(ctx, slotClassSQL, uint32(p.classID)).Scan(&oid); err != nil {
		return fmt.Errorf("pglock: the table %s has no primary key index, whose OID names a bulkhead's permit slots (create the table with pglock.Schema): %w", p.table, err)
	}
	p.slotClass = int32(oid)
	return nil
}

// permitChannel is the NOTIFY channel of key id's permits.
func (p *Provider) permitChannel(id int32) string {
	return "tenace_permits_" + strconv.FormatUint(uint64(uint32(p.classID)), 10) + "_" + strconv.FormatInt(int64(id), 10)
}

// notifications counts the NOTIFYs a connection received, whoever read
// them (a statement, or awaitPermit): a waiter that saw one arrive during
// its try of the slots tries again rather than wait for the next. It lives in the
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
// permitRepoll, LISTEN on the key's channel the first time (then try the
// slots again at once: a release before the LISTEN sent its NOTIFY to
// nobody);
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
// holder's also unlocks its slot (the session holds nothing else) and
// sends a NOTIFY to the gate's holder, if one waits ($3, its channel).
func (l *lease) unlockSQL() string {
	switch l.mode {
	case modeShared:
		return `SELECT pg_advisory_unlock_shared($1::int4, $2)`
	case modePermit:
		// pg_advisory_unlock_all and pg_notify return void, which IS NOT
		// NULL; the NOTIFY is sent when the statement commits, after the
		// unlock. It is sent only while someone holds the key's gate (a
		// try of it, shared, fails): a waiter that holds it waits for the
		// NOTIFY, or tries the slots again after its LISTEN; one that
		// takes the gate after this try tries the slots then. A NOTIFY's
		// commit takes the database's notify lock, which every notifying
		// commit queues for.
		return `SELECT CASE WHEN pg_advisory_unlock_shared($1::int4, $2) THEN pg_advisory_unlock_all() IS NOT NULL AND
	CASE WHEN pg_try_advisory_lock_shared($1::int4, -$2::int4) THEN pg_advisory_unlock_shared($1::int4, -$2::int4) ELSE pg_notify($3, '') IS NOT NULL END
ELSE false END`
	}
	return `SELECT pg_advisory_unlock($1::int4, $2)`
}

// lockMode is what a call asks for of its key, and what a lease holds.
type lockMode int

const (
	modeExclusive lockMode = iota // the whole key (the zero value: Shared false)
	modeShared                    // a reader's share (Permits 0)
	modePermit                    // one of N permits: a slot and the key shared, and NOTIFY on release
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
// key's advisory lock shared; a bulkhead's callers (Permits N) each take
// one of the key's N permit slots, waiters in turn through the key's gate.
// See the package doc, Shared locks and permits.
func (p *Provider) SupportsShared() bool { return true }

var _ tenace.SharedLockProvider = (*Provider)(nil)

// givePermitBack is giveBack for a bulkhead caller that waited and got no
// permit: its session may hold the key's gate, a slot (taken before a
// shared wait that failed), the key shared (a grant that raced the
// server's lock_timeout, or a cancel), and LISTEN on the key's channel;
// no cancel request sent for it can reach it any more (see
// cancelSettled). One round trip unlocks all and stops listening, and the
// connection goes back to the pool; it is closed instead when that fails,
// or the server does not answer within cancelGrace (the socket's
// deadline: pgconn then closes it).
func (c *call) givePermitBack(conn *pgxpool.Conn) {
	if h, ok := conn.Conn().PgConn().CustomData()[handlerKey].(*cancelHandler); ok {
		h.graceEnd, h.settled = time.Time{}, false // the next statement's cancel is its own
	}
	nc := conn.Conn().PgConn().Conn()
	_ = nc.SetDeadline(time.Now().Add(cancelGrace))
	_, err := conn.Exec(context.Background(), `SELECT pg_advisory_unlock_all(); UNLISTEN *`)
	c.gated, c.listening = false, false
	if err != nil || conn.Conn().IsClosed() {
		discard(conn)
		return
	}
	_ = nc.SetDeadline(time.Time{})
	conn.Release()
}

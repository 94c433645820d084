package pglock

import (
	"fmt"
	"time"

	"tenace.dev/tenace/internal/keyfmt"
)

// The acquire path is split in two: step decides, from the call's state
// and what the server just said, what comes next; the driver (call.lock)
// runs the statements, cleans up and applies the error precedence (see
// call.conclude). step does no I/O, reads no clock and touches no
// connection, so that every branch is tested without a server
// (step_test.go).

// stmt is a statement of the acquire path, whose answer step reads.
type stmt int

const (
	stmtLock     stmt = iota // the acquire statement (call.statement)
	stmtRegister             // the key's row inserted (registerSQL)
	stmtPermit               // a bulkhead waiter's wait for a permit (awaitPermit)
	stmtUnlisten             // UNLISTEN * before the connection becomes a lease's
	stmtDrop                 // the drop of a grant that raced the lock timeout (dropSQL)
)

// reply is what the server said to the call's last statement, and what
// the call's context and connection were once it returned.
type reply struct {
	stmt   stmt
	err    error
	cut    bool // the call's statement context (wctx) had ended when the statement returned
	dead   bool // the connection was closed when the statement returned
	closed bool // the provider is closed
	// settled: the server answered every cancel request sent for the
	// statement, if any (see cancelSettled)
	settled bool
	// The acquire statement's row (see lockStatement): hasID false when
	// the key has no row; fenced false when it returned no fence.
	hasID, locked, fenced bool
}

// attempt is what step knows of the call: its settings, and how far it
// has come.
type attempt struct {
	key         string // the key the last statement asked for
	table       string // the table of keys, for errors
	mode        lockMode
	noWait      bool
	fencing     bool          // the provider's leases carry a token
	bounded     bool          // a Timeout on the system clock: the server keeps it
	left        time.Duration // what remains of the Timeout, when bounded
	permitLeft  time.Duration // until the call stops waiting for a permit, when bounded
	set         bool          // a set's call
	got         int           // a set's keys locked so far
	keys        int           // a set's keys
	registered  bool          // the key's row was inserted by this call
	reconnected bool          // the call has reconnected once after a dead connection
	gated       bool          // the session holds the key's gate (a bulkhead's)
	listening   bool          // the session LISTENs on the key's permit channel
	stepped     bool          // the last statement's bound was a step of a longer Timeout
	holding     bool          // a nested call: the session holds the locks of other leases (see sessionFor)
}

// next is what the driver does after a step: a statement to run, or the
// call's outcome.
type next int

const (
	// Statements: the call goes on.
	doLock        next = iota // run the acquire statement: the first time, after a registration or a permit wait
	doRetry                   // wait again after the server's verdict came with time left (retrySQL)
	doNextKey                 // a set's key is locked: record it, lock the next one
	doRegister                // insert the key's row, then lock again
	doAwaitPermit             // every permit is taken: wait for one, holding the gate
	doReconnect               // the connection had died: once more on a live one
	doRestart                 // a step of a bulkhead's long wait ended: again on a new connection
	doUnlisten                // UNLISTEN before the grant
	doDrop                    // tell Acquire "held" now, then drop a grant that raced the timeout
	doGrant                   // every key is locked: make the lease
	// Outcomes: the call ends without a lease.
	outHeld      // give back (unlock a set's keys) and return (nil, nil): the key is held
	outDropped   // the drop failed: discard, (nil, nil) told already
	outCutShort  // wctx ended during a statement: discard, and say why the wait ended
	outFailed    // a statement failed: discard, and say why (err, or the precedence's)
	outBroken    // the table of keys is broken (a row deleted): err, nothing held
	outAbandoned // Acquire left: nothing more is asked
	outDeadlock  // the server failed the wait to break a cycle (40P01): give back, *tenace.DeadlockError
)

// decision is step's answer.
type decision struct {
	next next
	// unlock: before discard, unlock whatever the session holds (its
	// grant, a set's keys, a permit), best effort (unlockAll).
	unlock bool
	// err and answered, for outFailed and outBroken: the failure, and
	// whether the server had answered the statement (see failed).
	err      error
	answered bool
	// keep, for outCutShort: no statement saw the cut (a bulkhead's wait
	// for a NOTIFY), so the session goes back to the pool once it gave
	// back what it holds (giveBack), rather than end.
	keep bool
}

// step decides what follows the server's reply r in attempt a.
func step(a attempt, r reply) decision {
	switch r.stmt {
	case stmtLock:
		return stepLock(a, r)
	case stmtRegister:
		if r.err != nil || r.cut {
			// A failure, or a context that ended during the statement
			// (a cancel may be on its way): never reuse the connection.
			d := decision{next: outFailed, answered: answered(r.err)}
			if r.err != nil {
				d.err = fmt.Errorf("pglock: registering the key %s in %s: %w", keyfmt.Quote(a.key), a.table, r.err)
			}
			return d
		}
		return decision{next: doLock}
	case stmtPermit:
		if r.err != nil {
			// A LISTEN cut short, a connection that failed: as any
			// failed statement.
			return decision{next: outFailed, unlock: true, err: a.failure(r.err), answered: answered(r.err)}
		}
		if r.cut {
			// No statement ran: the session is fit for the pool once it
			// gives back the gate.
			return decision{next: outCutShort, keep: true}
		}
		return decision{next: doLock}
	case stmtUnlisten:
		switch {
		case r.err != nil:
			return decision{next: outFailed, unlock: true, err: fmt.Errorf("pglock: acquiring %s: UNLISTEN: %w", keyfmt.Quote(a.key), r.err), answered: answered(r.err)}
		case r.cut:
			return decision{next: outCutShort, unlock: true}
		}
		return decision{next: doGrant}
	case stmtDrop:
		switch {
		case r.cut:
			return decision{next: outCutShort}
		case r.err != nil:
			return decision{next: outDropped}
		}
		return decision{next: outHeld}
	}
	panic(fmt.Sprintf("tenace: pglock: step: unknown statement %d", r.stmt))
}

// stepLock decides what follows the acquire statement.
func stepLock(a attempt, r reply) decision {
	if d, ended := stepLockEnded(a, r); ended {
		return d
	}
	return stepLockAnswered(a, r)
}

// stepLockEnded decides what follows an acquire statement that failed, was
// cut short, or ended in the server's verdict (lock_timeout, a deadlock);
// ended is false for one that answered (see stepLockAnswered).
func stepLockEnded(a attempt, r reply) (d decision, ended bool) {
	switch {
	case r.cut && a.mode == modePermit && !a.noWait && r.settled && !r.dead && answered(r.err):
		// A bulkhead waiter's statement cut short (waiting for the gate,
		// or behind a writer), which the server answered, and whose cancel
		// requests it answered too: whatever the session holds (the gate,
		// a slot, a grant that landed) is given back, and the session kept.
		return decision{next: outCutShort, keep: true}, true
	case isLockTimeout(r.err):
		return stepLockTimeout(a, r), true
	case isDeadlock(r.err) && !r.cut && (a.got > 0 || a.holding):
		// The server's deadlock detector failed this wait to break a
		// cycle of sessions: a set's session holds its keys so far and
		// waited for the next, or a nested call's session holds the keys
		// of its execution's leases. The statement took nothing (the wait
		// was aborted). A set's session is fit for the pool once it
		// unlocked what it holds, before the caller hears the verdict, so
		// that the other sessions of the cycle go on; a nested call's
		// keeps its leases' locks, and its execution gives them back as
		// its Lock steps return the error.
		return decision{next: outDeadlock}, true
	case r.err != nil:
		// Unknown outcome: the statement may have taken the lock before
		// it failed or was cancelled. Release whatever the session holds,
		// and never reuse the connection. A connection that had died (the
		// pool's idle ones after a server restart, a backend terminated
		// while waiting) held nothing that lives on: the call tries once
		// more on a live one, unless it had something to lose there.
		if a.mayReconnect(r) {
			return decision{next: doReconnect}, true
		}
		return decision{next: outFailed, unlock: true, err: a.failure(r.err), answered: answered(r.err)}, true
	case r.cut:
		// The statement succeeded, but its context ended while it ran:
		// cancel requests may be on their way to this session. Whatever it
		// found, the call gave up.
		return decision{next: outCutShort, unlock: r.locked || a.got > 0 || a.mode == modePermit}, true
	}
	return decision{}, false
}

// stepLockAnswered decides what follows an acquire statement the server
// answered: granted, refused, or a step of a longer wait.
func stepLockAnswered(a attempt, r reply) decision {
	switch {
	case !r.hasID && !a.registered:
		return decision{next: doRegister}
	case !r.hasID:
		return decision{next: outBroken, err: fmt.Errorf("pglock: the key %s vanished from %s as it was registered; is something deleting its rows?", keyfmt.Quote(a.key), a.table)}
	case !r.locked && a.mode == modePermit && !a.noWait:
		// Every permit is taken: wait for one to come back, holding the
		// gate, and try the slots again; "held" once the wait's end has
		// come.
		if a.bounded && a.permitLeft <= 0 {
			return decision{next: outHeld}
		}
		return decision{next: doAwaitPermit}
	case !r.locked:
		return decision{next: outHeld} // the try failed: the session holds nothing (but a set's keys so far)
	case !r.fenced && a.fencing:
		return decision{next: outBroken, unlock: true, err: fmt.Errorf("pglock: the row of key %s vanished from %s while it was locked; rows must never be deleted", keyfmt.Quote(a.key), a.table)}
	case a.set && a.got+1 < a.keys:
		return decision{next: doNextKey}
	case a.listening:
		// The lease's connection must not receive NOTIFYs: its watcher
		// would read them, and the pool would keep them.
		return decision{next: doUnlisten}
	}
	return decision{next: doGrant}
}

// stepLockTimeout decides what follows the server's verdict (lock_timeout
// ended the wait): the key stayed held until the bound it was given. The
// verdict can come with the lock granted — a grant that lands as the
// timeout fires keeps the lock, and the timeout's interrupt, already
// pending, still fails the statement (see ProcSleep) — a session lock,
// which the aborted transaction does not give back: the session drops it
// before the connection is used again.
func stepLockTimeout(a attempt, r reply) decision {
	switch {
	case r.cut:
		return decision{next: outCutShort}
	case a.mode == modePermit && a.stepped:
		// A step of a longer wait: its session may hold the gate, and is
		// ended; the wait starts again on another connection.
		return decision{next: doRestart}
	case a.mode == modePermit:
		// Its session may hold the gate (taken before the timeout): it is
		// ended (see call.giveBack).
		return decision{next: outHeld}
	case a.bounded && a.left > verdictLead/3:
		// The server's bound ends up to verdictLead before the Timeout
		// (see lockTimeout), or is a step of it: with more than a third of
		// that left, wait again for what remains, so that a release in
		// the Timeout's last moments still grants; less is not worth a
		// statement (each scans pg_locks, see retrySQL), and runBounded
		// holds the "held" back until the Timeout. The retry's statement
		// finds a raced grant held (and fences it) rather than take the
		// lock a second time.
		return decision{next: doRetry}
	case a.got > 0:
		// A set unlocks everything its session holds (pg_advisory_unlock_all,
		// which drops a raced grant too) before the caller hears "held".
		return decision{next: outHeld}
	}
	return decision{next: doDrop}
}

// mayReconnect reports whether a call whose statement failed with r may
// try once more on another connection: its connection had died, and
// nothing of the call lived on it (a set's keys, a gate, a nested call's
// leases), and it has not
// tried again already; its context still runs and the provider is open.
func (a attempt) mayReconnect(r reply) bool {
	return r.dead && !a.reconnected && a.got == 0 && !a.gated && !a.holding && !r.cut && !r.closed
}

// failure is the error of the acquire statement (or a permit's wait) for
// a's key.
func (a attempt) failure(err error) error {
	return fmt.Errorf("pglock: acquiring %s: %w", keyfmt.Quote(a.key), err)
}

package pglock

import (
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// TestStep: every decision of the acquire path, from the call's state and
// the server's reply, with no server.
func TestStep(t *testing.T) {
	lockTimeout := &pgconn.PgError{Code: sqlstateLockTimeout}
	deadlock := &pgconn.PgError{Code: sqlstateDeadlock}
	failed := &pgconn.PgError{Code: "XX000"}
	silent := errors.New("read: i/o timeout") // not the server's answer
	one := attempt{key: "k", table: "t", fencing: true}
	bounded := one
	bounded.bounded, bounded.left, bounded.permitLeft = true, time.Second, time.Second
	set := one
	set.set, set.keys = true, 3
	setSecond := set
	setSecond.got = 1
	setLast := set
	setLast.got = 2
	permit := bounded
	permit.mode = modePermit
	permitWaiting := permit
	permitWaiting.gated = true
	permitDone := permitWaiting
	permitDone.permitLeft = 0
	permitStepped := permit
	permitStepped.stepped = true
	permitNoWait := one
	permitNoWait.mode, permitNoWait.noWait = modePermit, true
	listening := permitWaiting
	listening.listening = true
	lastMoments := bounded
	lastMoments.left = verdictLead / 4
	nested := one
	nested.holding = true
	registered := one
	registered.registered = true
	reconnected := one
	reconnected.reconnected = true
	unfenced := one
	unfenced.fencing = false
	granted := reply{stmt: stmtLock, hasID: true, locked: true, fenced: true}
	refused := reply{stmt: stmtLock, hasID: true}

	for _, tc := range []struct {
		name string
		a    attempt
		r    reply
		want decision
	}{
		// The acquire statement.
		{"granted", one, granted, decision{next: doGrant}},
		{"granted without fencing", unfenced, reply{stmt: stmtLock, hasID: true, locked: true}, decision{next: doGrant}},
		{"a set's first key", set, granted, decision{next: doNextKey}},
		{"a set's second key", setSecond, granted, decision{next: doNextKey}},
		{"a set's last key", setLast, granted, decision{next: doGrant}},
		{"granted, listening", listening, granted, decision{next: doUnlisten}},
		{"no row", one, reply{stmt: stmtLock}, decision{next: doRegister}},
		{"no row once registered", registered, reply{stmt: stmtLock}, decision{next: outBroken}},
		{"locked without a fence", one, reply{stmt: stmtLock, hasID: true, locked: true}, decision{next: outBroken, unlock: true}},
		{"the try refused", one, refused, decision{next: outHeld}},
		{"a set's try refused", setSecond, refused, decision{next: outHeld}},
		{"no permit, NoWait", permitNoWait, refused, decision{next: outHeld}},
		{"no permit", permit, refused, decision{next: doAwaitPermit}},
		{"no permit, the wait's end come", permitDone, refused, decision{next: outHeld}},
		{"granted, cut short", one, reply{stmt: stmtLock, hasID: true, locked: true, fenced: true, cut: true}, decision{next: outCutShort, unlock: true}},
		{"refused, cut short", one, reply{stmt: stmtLock, hasID: true, cut: true}, decision{next: outCutShort}},
		{"a set refused, cut short", setSecond, reply{stmt: stmtLock, hasID: true, cut: true}, decision{next: outCutShort, unlock: true}},
		{"a bulkhead refused, cut short", permit, reply{stmt: stmtLock, hasID: true, cut: true}, decision{next: outCutShort, unlock: true}},
		{"a bulkhead waiter cancelled, cancels answered", permit, reply{stmt: stmtLock, err: &pgconn.PgError{Code: "57014"}, cut: true, settled: true}, decision{next: outCutShort, keep: true}},
		{"a bulkhead waiter granted as cut, cancels answered", permit, reply{stmt: stmtLock, hasID: true, locked: true, fenced: true, cut: true, settled: true}, decision{next: outCutShort, keep: true}},
		{"a bulkhead waiter cancelled, a cancel unanswered", permit, reply{stmt: stmtLock, err: &pgconn.PgError{Code: "57014"}, cut: true}, decision{next: outFailed, unlock: true, answered: true}},
		{"a bulkhead waiter cut short, unanswered", permit, reply{stmt: stmtLock, err: silent, cut: true, settled: true}, decision{next: outFailed, unlock: true}},
		{"a NoWait bulkhead cut short, cancels answered", permitNoWait, reply{stmt: stmtLock, hasID: true, cut: true, settled: true}, decision{next: outCutShort, unlock: true}},
		{"failed", one, reply{stmt: stmtLock, err: failed}, decision{next: outFailed, unlock: true, answered: true}},
		{"no answer", one, reply{stmt: stmtLock, err: silent}, decision{next: outFailed, unlock: true}},
		{"a dead connection", one, reply{stmt: stmtLock, err: silent, dead: true}, decision{next: doReconnect}},
		{"a dead connection again", reconnected, reply{stmt: stmtLock, err: silent, dead: true}, decision{next: outFailed, unlock: true}},
		{"a dead connection of a set", setSecond, reply{stmt: stmtLock, err: silent, dead: true}, decision{next: outFailed, unlock: true}},
		{"a dead connection holding a gate", permitWaiting, reply{stmt: stmtLock, err: silent, dead: true}, decision{next: outFailed, unlock: true}},
		{"a dead connection, cut short", one, reply{stmt: stmtLock, err: silent, dead: true, cut: true}, decision{next: outFailed, unlock: true}},
		{"a dead connection, closed", one, reply{stmt: stmtLock, err: silent, dead: true, closed: true}, decision{next: outFailed, unlock: true}},
		// The server's verdict.
		{"verdict, time left", bounded, reply{stmt: stmtLock, err: lockTimeout}, decision{next: doRetry}},
		{"verdict, the last moments", lastMoments, reply{stmt: stmtLock, err: lockTimeout}, decision{next: doDrop}},
		{"verdict of a set's key", func() attempt { a := setSecond; a.bounded = true; return a }(), reply{stmt: stmtLock, err: lockTimeout}, decision{next: outHeld}},
		{"verdict, cut short", bounded, reply{stmt: stmtLock, err: lockTimeout, cut: true}, decision{next: outCutShort}},
		{"verdict for a bulkhead", permit, reply{stmt: stmtLock, err: lockTimeout}, decision{next: outHeld}},
		{"verdict for a bulkhead, a step", permitStepped, reply{stmt: stmtLock, err: lockTimeout}, decision{next: doRestart}},
		// The server's deadlock detector.
		{"a set's wait in a cycle", setSecond, reply{stmt: stmtLock, err: deadlock}, decision{next: outDeadlock}},
		{"a set's wait in a cycle, cut short", setSecond, reply{stmt: stmtLock, err: deadlock, cut: true}, decision{next: outFailed, unlock: true, answered: true}},
		{"a wait in a cycle, holding nothing", one, reply{stmt: stmtLock, err: deadlock}, decision{next: outFailed, unlock: true, answered: true}},
		{"a nested wait in a cycle", nested, reply{stmt: stmtLock, err: deadlock}, decision{next: outDeadlock}},
		{"a nested wait in a cycle, cut short", nested, reply{stmt: stmtLock, err: deadlock, cut: true}, decision{next: outFailed, unlock: true, answered: true}},
		{"a dead connection of a nested wait", nested, reply{stmt: stmtLock, err: silent, dead: true}, decision{next: outFailed, unlock: true}},
		// The statements that follow.
		{"registered", one, reply{stmt: stmtRegister}, decision{next: doLock}},
		{"registered, cut short", one, reply{stmt: stmtRegister, cut: true}, decision{next: outFailed, answered: true}},
		{"registering failed", one, reply{stmt: stmtRegister, err: failed}, decision{next: outFailed, answered: true}},
		{"a permit's wait ended", permitWaiting, reply{stmt: stmtPermit}, decision{next: doLock}},
		{"a permit's wait cut short", permitWaiting, reply{stmt: stmtPermit, cut: true}, decision{next: outCutShort, keep: true}},
		{"a permit's wait failed", permitWaiting, reply{stmt: stmtPermit, err: silent}, decision{next: outFailed, unlock: true}},
		{"unlistened", listening, reply{stmt: stmtUnlisten}, decision{next: doGrant}},
		{"unlisten cut short", listening, reply{stmt: stmtUnlisten, cut: true}, decision{next: outCutShort, unlock: true}},
		{"unlisten failed", listening, reply{stmt: stmtUnlisten, err: failed}, decision{next: outFailed, unlock: true, answered: true}},
		{"dropped", lastMoments, reply{stmt: stmtDrop}, decision{next: outHeld}},
		{"the drop failed", lastMoments, reply{stmt: stmtDrop, err: failed}, decision{next: outDropped}},
		{"the drop cut short", lastMoments, reply{stmt: stmtDrop, cut: true}, decision{next: outCutShort}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := step(tc.a, tc.r)
			if (got.err != nil) != (tc.want.next == outBroken || tc.want.next == outFailed && (tc.r.err != nil)) {
				t.Errorf("err %v", got.err)
			}
			got.err = nil
			if got != tc.want {
				t.Errorf("step(%+v, %+v) = %+v, want %+v", tc.a, tc.r, got, tc.want)
			}
		})
	}
}

// TestStepUnknownStatementPanics: a statement step does not know is the
// driver's bug, told as such.
func TestStepUnknownStatementPanics(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Error("no panic")
		}
	}()
	step(attempt{}, reply{stmt: stmtDrop + 1})
}

package pglock

import (
	"time"

	"tenace.dev/tenace"
)

// BackendPID is the process id of the server backend whose session holds
// l's lock (a set's: the one session of all its keys).
func BackendPID(l tenace.LockLease) uint32 {
	switch l := l.(type) {
	case unfenced:
		return l.l.pid
	case setKey:
		return l.l.pid
	case fencedSetKey:
		return l.l.pid
	case *tenace.SetLease:
		return BackendPID(l.Leases()[0])
	}
	return l.(*lease).pid
}

// ClassID is the first key of the provider's advisory locks.
func (p *Provider) ClassID() int32 { return p.classID }

// SetReleaseTimeout sets the bound of a Release whose ctx has no deadline,
// and returns a func that restores it.
func SetReleaseTimeout(d time.Duration) (restore func()) {
	old := releaseTimeout
	releaseTimeout = d
	return func() { releaseTimeout = old }
}

// SetEndTimeout sets the bound of the unlock of a lease lost to its TTL or
// to Close, and returns a func that restores it.
func SetEndTimeout(d time.Duration) (restore func()) {
	old := endTimeout
	endTimeout = d
	return func() { endTimeout = old }
}

// Hooks are the provider's test hooks (see testHooks): each runs at a point
// where a race has a window, so that a test can hold it open.
type Hooks struct {
	// Losing runs in an ender that has claimed the lease as lost, before
	// it signals the loss.
	Losing func()
	// ReleaseWaits runs in a Release that found the lease claimed by such
	// an ender, before it waits for the signal.
	ReleaseWaits func()
	// Watching runs in a lease's watcher, before its first read.
	Watching func()
	// Stopping runs in a taker of the session (an ender, a nested wait)
	// once it has set the watcher's read deadline, before it waits for the
	// watcher to stop; also when no watcher was started yet.
	Stopping func()
	// StatementDone runs in Acquire once the acquire statement has
	// returned, with its backend's pid and whether it took the lock,
	// before Acquire looks at its context.
	StatementDone func(pid uint32, locked bool)
	// Killing runs in a lease's ender that could not take the session in
	// time (a nested wait used it), before it closes the session's socket.
	Killing func()
}

// SetHooks sets p's test hooks; call it before p's first Acquire.
func (p *Provider) SetHooks(h Hooks) {
	p.hooks = &testHooks{losing: h.Losing, releaseWaits: h.ReleaseWaits, watching: h.Watching, stopping: h.Stopping,
		statementDone: h.StatementDone, killing: h.Killing}
}

// ReplyAllowance is how long past its Timeout an Acquire waits for an
// answer that is due.
const ReplyAllowance = replyAllowance

// RaceSQL returns the statements that deal with a grant that raced a lock
// timeout, for an exclusive caller: the wait again (retrySQL: $1 the key,
// $2 the class id, $3 lock_timeout) and the drop (dropSQL: $1, $2).
func (p *Provider) RaceSQL() (retry, drop string) {
	return p.retrySQL[modeExclusive], p.dropSQL[modeExclusive]
}

// SetMaxLockTimeout sets the server's largest lock_timeout as the provider
// sees it (a longer Timeout waits in steps of it), and returns a func that
// restores it.
func SetMaxLockTimeout(d time.Duration) (restore func()) {
	old := maxLockTimeout
	maxLockTimeout = d
	return func() { maxLockTimeout = old }
}

// VerdictLead is how long before the Timeout the server's "held" is due,
// at most (a third of the Timeout when that is less).
const VerdictLead = verdictLead

package tenace

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"tenace.dev/tenace/internal/keyfmt"
	"tenace.dev/tenace/policy"
)

// ErrMissingKey is returned when a Lock has no key: neither LockOptions.Key
// nor the execution's key (WithKey) is set. fn does not run, nor do the
// steps inside that Lock; steps outside it have run (an outer Lock with a
// key of its own has acquired and released it).
var ErrMissingKey = errors.New("tenace: no lock key: set LockOptions.Key, or pass tenace.WithKey(key) to Execute")

// ErrProviderClosed is returned by a MemoryLockProvider's Acquire once the
// provider is closed, and to every waiter queued when Close was called; the
// distributed providers (redislock, pglock) return errors wrapping it.
// Through a Lock it arrives wrapped in an *UnexpectedError.
var ErrProviderClosed = errors.New("tenace: the lock provider is closed; acquire from an open provider")

// ErrInvalidOption is wrapped by the errors that report an option out of its
// range (LockOptions.Timeout below zero other than NoWait, a negative TTL, a
// WithTimeout duration that is not positive, or a bound of the provider's
// own, such as redislock's TTL of at least 1ms); the message names the
// option.
// It comes from the step with the option, when the call reaches it: fn does
// not run, nor do the steps inside that one, but steps outside it have run
// (a Lock around a WithTimeout(0) has acquired and released its lock).
var ErrInvalidOption = policy.ErrInvalidOption

// ErrLeaseLost is the cause (context.Cause) of the context a Lock gives the
// inner steps when its lease was lost while they ran (see LosableLease): a
// renewal failed or found another holder, the connection that held it
// dropped, or it reached its TTL. The lock may now be held by another caller,
// so the work should stop and not commit what it did. Providers also wrap it
// in the error Release returns after a loss.
var ErrLeaseLost = errors.New("tenace: the lock's lease was lost while held; another caller may hold the lock now, so stop and do not commit")

// ErrLeaseExpired is the loss of a lease that reached its TTL, the longest
// time a lock may be held (LockOptions.TTL): errors.Is(err, ErrLeaseLost)
// holds for it too, so one check catches every loss, and this one tells a
// lease that ran out of time from one taken away.
var ErrLeaseExpired = fmt.Errorf("%w: it reached its TTL, the longest time the lock may be held", ErrLeaseLost)

// ErrAcquireContextTimeout is for provider authors: it is the cause
// (context.Cause) of a context from AcquireContext whose Timeout passed, and
// a provider asks TimedOut rather than compare causes itself. Neither
// Execute nor a provider's Acquire returns it: the provider turns it into
// "not granted in time", (nil, nil), which a Lock returns as a
// *LockNotAcquiredError (test a rejection with errors.As and that type,
// never with this), or into an error of its own when the server never
// answered (see AcquireContext).
var ErrAcquireContextTimeout = errors.New("tenace: the Timeout of an AcquireContext passed; a provider reports it as not granted, (nil, nil)")

// ErrNoReply is wrapped by a provider's error when its server was reached
// but did not answer within the call's Timeout or ctx (a stalled server, a
// partitioned member): the provider cannot tell whether the key is held, so
// it reports a failure rather than contention. Through a Lock it arrives
// wrapped in an *UnexpectedError (event lock.failed), never as a
// *LockNotAcquiredError. Every provider of this repository wraps it
// (redislock.ErrNoReply, pglock and etcdlock likewise), so one errors.Is
// check covers them all. Retry later; if it persists, the lock server is
// down or unreachable.
var ErrNoReply = errors.New("tenace: the lock server did not answer in time")

// errDefaultClose is returned by Close on the default provider.
var errDefaultClose = errors.New("tenace: DefaultLockProvider() cannot be closed; close only providers made by NewMemoryLockProvider")

// LockNotAcquiredError is returned, as *LockNotAcquiredError, when a Lock
// did not get its key within LockOptions.Timeout (or at once with NoWait).
// fn did not run. It is not returned when the context ended first: then the
// context's error is. Its message quotes the key, cut after 256 bytes (a
// key from a request must not make a message as long as itself); Key is
// whole. When the provider said who held the key as it refused it
// (LockAcquireOptions.OnHeld), the message names that holder and how long
// it had held the key:
//
//	tenace: lock "k" not acquired within its 1s timeout: held by api-7f9c/pid 4127 for 3m12s; retry later or raise LockOptions.Timeout
type LockNotAcquiredError struct {
	// Key is the lock key.
	Key string
	// Timeout is the Lock's LockOptions.Timeout: how long it waited, or
	// NoWait when it tried once. 0 (it had none, and waited as long as its
	// context allowed) only when a provider answered "not granted" anyway.
	Timeout time.Duration
	// Holder is the key's holder as the provider saw it when it refused
	// (for a set of keys, the holder of the key that refused it; for a key
	// held shared, its oldest holder); nil when the provider did not say.
	Holder *HolderInfo
	// HeldFor is how long Holder had held the key when the Lock was
	// refused (by the system clock); 0 when Holder or its Since is not
	// known.
	HeldFor time.Duration
}

// Error names the key, how long the Lock waited, who holds the key when
// the provider said, and what to do about it.
func (e *LockNotAcquiredError) Error() string {
	why := ": another call holds it; retry later"
	if e.Holder != nil {
		why = ": held " + e.whoHolds() + "; retry later"
	}
	key := keyfmt.Quote(e.Key)
	switch {
	case e.Timeout == NoWait:
		return "tenace: lock " + key + " not acquired at once (NoWait)" + why + ", or wait with a LockOptions.Timeout"
	case e.Timeout > 0:
		return "tenace: lock " + key + " not acquired within its " + e.Timeout.String() + " timeout" + why + " or raise LockOptions.Timeout"
	default:
		return "tenace: lock " + key + " not acquired" + why
	}
}

// whoHolds says who holds the key and for how long: "by api-7f9c/pid 4127
// for 3m12s".
func (e *LockNotAcquiredError) whoHolds() string {
	s := "by " + keyfmt.Label(e.Holder.Owner)
	switch {
	case e.Holder.Owner == "" && e.Holder.Shared:
		s = "shared by readers the provider does not name"
	case e.Holder.Owner == "":
		s = "by an owner the provider does not name"
	case e.Holder.Shared:
		s = "shared " + s + " (its oldest holder)"
	}
	switch {
	case e.HeldFor >= time.Second:
		s += " for " + e.HeldFor.Round(time.Second).String()
	case e.HeldFor > 0:
		s += " for under 1s"
	}
	return s
}

// UnexpectedError is returned, as *UnexpectedError, when the lock provider
// failed to acquire: Redis unreachable, the provider closed (it wraps
// ErrProviderClosed), and so on. fn did not run. errors.Is and errors.As
// reach the cause. An error wrapping ErrInvalidOption from the provider (an
// option it bounds, such as redislock's TTL) is returned as it is instead:
// the caller's mistake, not a failure.
type UnexpectedError struct {
	// Err is the provider's error: why the lock was not acquired.
	Err error
}

// Error says that the work did not run, and why.
func (e *UnexpectedError) Error() string {
	if e.Err == nil { // only a value built by hand: never one tenace returns
		return "tenace: the lock provider failed, so the work did not run"
	}
	// The cause often carries the same prefix ("tenace: ..."): say it once.
	return "tenace: the lock provider failed, so the work did not run: " + strings.TrimPrefix(e.Err.Error(), "tenace: ")
}

// Unwrap returns the provider's error.
func (e *UnexpectedError) Unwrap() error { return e.Err }

func invalidOption(option string, d any, want string) error {
	return fmt.Errorf("%w: %s is %v; %s", ErrInvalidOption, option, d, want)
}

package tenace

import (
	"context"
	"log/slog"
)

// LogEvents returns a listener that logs every event of a policy through
// logger (nil: slog.Default() as it is when LogEvents is called):
//
//	p := tenace.NewPolicy().WithLock(opts).OnEvent(tenace.LogEvents(logger))
//
// The message is the event's name; the attributes are those the event has:
//
//	key     string    the lock key (the execution key for timeout); always
//	shared  bool      true, on the events of a shared Lock (Event.Shared)
//	permits int       Event.Permits, when Shared and not 0
//	wait    duration  how long the acquire waited (events that end a wait)
//	hold    duration  how long the lock was held (lock.released, lock.lost)
//	token   uint64    the fencing token, when the lease has one
//	holder  string    lock.rejected: who held the key, when the provider said
//	held    duration  lock.rejected: how long it had held it, when known
//	err     error     Event.Err, when set
//
// Levels: lock.deadlock is logged at Error — a programming error (nested
// locks on one key, or taken in orders that cross), not contention;
// lock.rejected, lock.lost, lock.failed, timeout and a lock.released whose
// Release failed at Warn — each means work did not run, was cut short, or
// ran without its lock for a while; every other event at Debug. The event's Context goes to the handler, so a
// handler that adds a trace id from the context does so. Nothing is built
// for a level the logger does not enable.
//
// The keys can hold what your keys hold (customer ids, say): give a logger
// whose handler drops or hashes "key" if they must not reach the logs — and
// "err", or rewrites it: the errors of lock.rejected
// (*LockNotAcquiredError), lock.deadlock (*DeadlockError) and timeout
// (*TimeoutError) name the key in their message, and a provider's error may.
func LogEvents(logger *slog.Logger) func(Event) {
	if logger == nil {
		logger = slog.Default()
	}
	return func(e Event) {
		ctx := e.Context
		if ctx == nil {
			ctx = context.Background()
		}
		level := eventLevel(e)
		if !logger.Enabled(ctx, level) {
			return
		}
		// At most nine attributes, in an array on the stack.
		var buf [9]slog.Attr
		attrs := append(buf[:0], slog.String("key", e.Key))
		if e.Shared {
			attrs = append(attrs, slog.Bool("shared", true))
			if e.Permits != 0 {
				attrs = append(attrs, slog.Int("permits", e.Permits))
			}
		}
		switch e.Name {
		case EventLockAcquired, EventLockRejected, EventLockDeadlock, EventLockCancelled, EventLockFailed:
			attrs = append(attrs, slog.Duration("wait", e.Wait))
		case EventLockReleased, EventLockLost:
			attrs = append(attrs, slog.Duration("hold", e.Hold))
		}
		if e.Token != 0 {
			attrs = append(attrs, slog.Uint64("token", e.Token))
		}
		if r, ok := e.Err.(*LockNotAcquiredError); ok && r.Holder != nil {
			attrs = append(attrs, slog.String("holder", r.Holder.Owner))
			if r.HeldFor > 0 {
				attrs = append(attrs, slog.Duration("held", r.HeldFor))
			}
		}
		if e.Err != nil {
			attrs = append(attrs, slog.Any("err", e.Err))
		}
		logger.LogAttrs(ctx, level, e.Name, attrs...)
	}
}

// eventLevel is the level LogEvents logs e at.
func eventLevel(e Event) slog.Level {
	switch e.Name {
	case EventLockDeadlock:
		return slog.LevelError
	case EventLockRejected, EventLockLost, EventLockFailed, EventTimeout:
		return slog.LevelWarn
	case EventLockReleased:
		if e.Err != nil {
			return slog.LevelWarn
		}
	}
	return slog.LevelDebug
}

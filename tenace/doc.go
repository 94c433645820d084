// Package tenace makes a call resilient through a policy pipeline. Its
// centrepiece is the Lock step: run the work while holding a lock on a key,
// so that calls with the same key run one at a time.
//
//	lock := tenace.NewLock(tenace.LockOptions{Key: "reports", Timeout: 5 * time.Second})
//	p := tenace.NewPolicy().WithTimeout(time.Minute).With(lock)
//	err := p.Execute(ctx, buildReport)
//
// # Policies
//
// A Policy is an immutable list of steps. Each With... method returns a new
// policy; the one it was called on is unchanged, so policies are built once
// and shared freely between goroutines. A step wraps the steps added before
// it: the first added runs innermost, closest to fn, and the last added runs
// first. In the example above the lock is outermost: it is acquired, then the
// one-minute timeout starts, then buildReport runs; the minute bounds the
// work, and the lock's Timeout bounds the wait. Written
// NewPolicy().With(lock).WithTimeout(time.Minute), the minute bounds the wait
// and the work together; a *TimeoutError whose deadline passed during the
// wait has BeforeFn set, and says the work did not start.
//
// Execute runs fn through the steps; Get does the same for a function that
// returns a value. The execution key, passed with WithKey, is the lock key of
// every Lock that names none.
//
// # The Lock step
//
// LockOptions, every field optional:
//
//	Provider  what hands out the locks        nil: DefaultLockProvider(), shared by all
//	Key       the lock key                    "": the execution key (WithKey); one is required
//	Keys      a set of keys, all or none      instead of Key; any order, never a deadlock
//	Timeout   longest wait for the lock       0: as long as ctx allows; NoWait: try once
//	TTL       longest hold, for providers     0: the provider's default
//	          whose locks expire
//	Shared    take the key shared             false: exclusive, the whole key
//	Permits   shared holders at once          0: any number (read/write); N: a bulkhead
//
// The default MemoryLockProvider gives one holder per key, in arrival order,
// within the process. Every Lock without a Provider shares it, so two
// policies that each WithLock(LockOptions{Key: "reports"}) exclude each
// other. Locks are not reentrant: a call that asks for a key its execution
// already holds, such as a nested policy locking the same execution key,
// gets a *DeadlockError at once. Give nested locks distinct keys. A set of
// keys (Keys; AcquireAll for a provider used directly) is granted all or
// none, in one global order, so sets never deadlock each other.
//
// Shared locks: a Lock with Shared takes one of the key's permits, beside
// other shared holders and never beside an exclusive one. With Permits 0
// that is a read/write lock per key (readers set Shared, writers do not);
// with Permits N, at most N callers hold the key at once: a keyed bulkhead
// ("at most 5 exports per customer"). Grants stay first come, first
// served: a waiting writer is not overtaken by later readers, and a caller
// that cannot be admitted keeps those behind it waiting. The provider
// must implement SharedLockProvider (MemoryLockProvider does); on another,
// and for a set of keys, the Lock returns an error wrapping
// ErrInvalidOption instead of taking the key exclusive.
//
// The lock is released when the inner steps return, normally, with an
// error or by panic, with a context that neither the caller's cancellation
// nor its deadline can end, even while the release runs (so that a
// distributed release still reaches its server); a failure to release is
// ignored, because a distributed lock expires on its own and the work is
// done. Inside fn, LeaseFrom returns the lease, and TokenFrom its fencing
// token (FencedLease), which a resource can check.
//
// # Errors
//
// What Execute returns:
//
//	fn returned err                          err, unchanged
//	ctx already ended on entry               ctx's error; nothing runs
//	no key from the lock nor the execution   ErrMissingKey; fn does not run
//	an option out of range                   an error wrapping ErrInvalidOption, naming it
//	                                         (also one the provider refuses: event lock.failed)
//	lock not acquired within its Timeout     *LockNotAcquiredError{Key}; event lock.rejected
//	                                         (the server answered that another holds it)
//	the execution already holds the key,     *DeadlockError, at once; event lock.deadlock
//	or its wait closes a cycle of waits
//	ctx ends while waiting for the lock      ctx's error; fn does not run, even if the
//	                                         grant lands at that moment
//	the provider fails, refuses the          *UnexpectedError wrapping the cause; event
//	connection, or does not answer           lock.failed (silence wraps ErrNoReply)
//	WithTimeout's deadline passes            *TimeoutError; errors.Is context.DeadlineExceeded
//	Get with any error                       the zero value and the error
//
// An outage is an error, never contention: a provider returns "not
// granted" only when its server answered that another caller holds the
// key, and the Lock's Timeout bounds the wait even on a stalled server.
//
// Programming mistakes (a nil fn, a nil step, WithShards(0)) panic with a
// "tenace: " prefix; nothing passed at run time does.
//
// # Events
//
// OnEvent listeners are policy-wide: each sees every event of every step,
// synchronously, in the order the listeners were added. Event names, and
// the Event fields each sets besides Name, Key and Context (the caller's
// context, where a tracing listener finds its span):
//
//	lock.acquiring  EventLockAcquiring  the Lock starts to wait for its key
//	lock.acquired   EventLockAcquired   the lock is held; the inner steps run next   Wait, Token
//	lock.rejected   EventLockRejected   not acquired within its Timeout              Wait, Err
//	lock.deadlock   EventLockDeadlock   waiting would never end (DeadlockError)      Wait, Err
//	lock.cancelled  EventLockCancelled  ctx ended while waiting                      Wait, Err
//	lock.failed     EventLockFailed     the provider failed                          Wait, Err
//	lock.lost       EventLockLost       the lease was lost while held (LosableLease);
//	                                    fn's ctx ended with cause ErrLeaseLost      Hold, Token, Err
//	lock.released   EventLockReleased   the inner steps returned; lock released      Hold, Token, Err
//	timeout         EventTimeout        a WithTimeout deadline passed;               Err
//	                                    Key: the execution key
//
// Every lock.acquiring is followed by exactly one of acquired, rejected,
// deadlock, cancelled or failed, so a listener can count the callers waiting now.
// Every lock event of a Lock with LockOptions.Shared also has Shared, and
// Permits its LockOptions.Permits: readers and a bulkhead's callers are
// counted apart from writers. MemoryLockProvider.Stats counts by mode too
// (LockStats' SharedKeys, SharedHolders — the permits in use — and
// SharedWaiting).
// Durations are measured on the policy's clock, and only when the policy
// has a listener: without one, events cost no clock read and no
// allocation. A listener that panics: the panic goes on up through
// Execute, and the lock is still released.
//
// LogEvents is a listener that logs through log/slog; the module
// tenace.dev/tenace/oteltenace records OpenTelemetry metrics and spans.
//
// # Providers
//
// A LockProvider hands out leases. MemoryLockProvider is the in-process one,
// built as actors: keys hash with xxhash to N shard goroutines, each of which
// alone owns its keys' FIFO wait queues, with no mutex (see package
// tenace.dev/tenace/shard for the design and its invariants). The
// distributed providers are tenace.dev/tenace/redislock, on Redis;
// tenace.dev/tenace/pglock, on PostgreSQL's advisory locks; and
// tenace.dev/tenace/etcdlock, on etcd's leases and revisions. Each is a
// module of its own, and each passes the conformance suite
// tenace.dev/tenace/locktest, which a provider of your own can run too.
//
// # Writing a step
//
// A step implements Strategy (package tenace.dev/tenace/policy): Run gets
// the context, the call's Execution (key, clock, events) and a Next that
// runs the inner steps. Add it with Policy.With.
package tenace

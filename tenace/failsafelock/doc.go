// Package failsafelock runs a tenace lock as a failsafe-go policy
// (github.com/failsafe-go/failsafe-go), so that a service whose resilience
// pipeline is failsafe-go's gets tenace's keyed locks — in-process
// (tenace.MemoryLockProvider) or distributed (tenace.dev/tenace/redislock,
// pglock, any tenace.LockProvider) — as one more policy:
//
//	retry := retrypolicy.NewBuilder[string]().
//		HandleErrorTypes(&tenace.LockNotAcquiredError{}).
//		WithBackoff(10*time.Millisecond, time.Second).
//		Build()
//	lock := failsafelock.New[string](tenace.LockOptions{Provider: provider, Key: "reports", Timeout: tenace.NoWait})
//	report, err := failsafe.With(retry, lock).Get(buildReport)
//
// # Where the lock goes
//
// failsafe-go composes policies outside in: in failsafe.With(a, b, c), a
// wraps b wraps c wraps the function. The Lock holds its key around the
// policies after it and the function, so it usually goes last, innermost:
//
//	failsafe.With(fallback, retry, breaker, bulkhead, timeout, lock)
//
//	fallback            a value when everything below failed
//	└─ retry            retries a *tenace.LockNotAcquiredError with backoff
//	   └─ breaker       opens on provider failures (*tenace.UnexpectedError)
//	      └─ bulkhead   bounds the executions holding or waiting for the lock
//	         └─ timeout bounds the wait for the lock and the work
//	            └─ lock
//	               └─ fn(exec)   exec.Context() carries the lease
//
// A Timeout outside the Lock bounds the wait and the work together; one
// inside it (failsafe.With(retry, lock, timeout)) bounds the work alone, and
// LockOptions.Timeout the wait. A Retry inside the Lock retries while
// holding it.
//
// # What an execution does
//
// Each execution that reaches the Lock runs tenace's own Lock step
// (tenace.Lock) — the same code, not a copy of it — with the execution's
// context, failsafe.Execution.Context:
//
//	the lock is granted           the policies inside and fn run, then the
//	                              lock is released (also when they panic:
//	                              the panic goes on up); their result is
//	                              the execution's, unchanged
//	not granted within Timeout    *tenace.LockNotAcquiredError; fn does not
//	(at once with tenace.NoWait)  run; OnRejected
//	waiting would never end       *tenace.DeadlockError, at once: the
//	                              execution holds the key already (a Lock
//	                              nested in one on the same key), or its
//	                              wait closed a cycle between executions
//	                              (tenace.MemoryLockProvider); fn does not
//	                              run; OnDeadlock
//	the context ends first        what failsafe-go returns for a cancelled
//	(an outer Timeout fires, the  execution: timeout.ErrExceeded, or the
//	executor's context ends)      context's error; fn does not run, and a
//	                              grant that landed at that moment is
//	                              released
//	the provider fails            *tenace.UnexpectedError wrapping the cause
//	                              (errors.Is reaches tenace.ErrProviderClosed,
//	                              tenace.ErrNoReply, a network error)
//	no key                        an error wrapping tenace.ErrMissingKey
//	an option out of range        an error wrapping tenace.ErrInvalidOption
//
// By default failsafe-go's policies treat every error as a failure. Say
// which ones each should handle: a Retry that should retry contention
// only, HandleErrorTypes(&tenace.LockNotAcquiredError{}); a CircuitBreaker
// that should open on outages, not on contention,
// HandleErrorTypes(&tenace.UnexpectedError{}).
//
// # The key
//
// LockOptions.Key, when set, is the key of every execution. Otherwise each
// execution finds its own from its context: by default the key WithKey put
// in the context given to the executor,
//
//	ctx = failsafelock.WithKey(ctx, "order:"+id)
//	err := failsafe.With(retry, lock).WithContext(ctx).Run(ship)
//
// or, with Builder.WithKeyFunc, any function of the context (a tenant or a
// resource id the request already carries).
//
// # The lease, the fencing token, a lost lease
//
// While the lock is held, fn's execution carries the lease as tenace's
// pipeline does: tenace.LeaseFrom(exec.Context()) returns it (use
// GetWithExecution or RunWithExecution), and a tenace.FencedLease gives the
// fencing token. A lease that can be lost (a distributed one whose renewal
// failed) ends exec.Context() the moment the loss is known, with a cause
// wrapping tenace.ErrLeaseLost: fn should watch its context and return
// context.Cause(exec.Context()) when it ends, so that the caller can tell a
// loss from a cancellation.
//
//	report, err := failsafe.With(retry, lock).GetWithExecution(func(exec failsafe.Execution[string]) (string, error) {
//		lease, _ := tenace.LeaseFrom(exec.Context())
//		return build(exec.Context(), lease.(tenace.FencedLease).Token())
//	})
//
// # The execution under the lock
//
// failsafe-go gives a policy no way to hand the policies inside it an
// execution with a context of its own, so the Lock runs them on a new
// execution whose context is the lock's, made to report the attempt,
// retry and hedge counts and the last result and error of the execution it
// belongs to. Two things it cannot carry over: under the lock, StartTime
// and AttemptStartTime are when the lock was granted, and Executions counts
// the runs under this grant only; outside it, failsafe-go's Executions
// (on the executor's done, success and failure events, say) does not count
// the runs under the lock. Attempts does.
//
// # Limits
//
//   - A Lock is not result-agnostic: compose it with failsafe.With or
//     Compose and the executor's result type (New[R]), not ComposeAny or
//     WithAny, which would run the work on an execution without the lease.
//   - Hedges each acquire the lock: under a lock on one key a hedge waits
//     for the attempt it hedges.
//   - Locks are not reentrant (see tenace.Lock): a Lock inside another on
//     the same key and provider gets a *tenace.DeadlockError at once,
//     without asking the provider. Give nested locks distinct keys.
//   - fn's context ends when the lock is released (with a provider whose
//     leases can be lost, such as redislock): finish with it inside fn —
//     read an HTTP response's body there, not after the execution returns
//     (failsafehttp's DeferCancel cannot keep it open past the lock).
//   - The async executions (GetAsync, RunAsync) run on a goroutine of
//     failsafe-go's, where a panic in fn crashes the process, as it does
//     without a Lock; the lock is released first.
package failsafelock

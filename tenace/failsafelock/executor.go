package failsafelock

import (
	"context"

	"github.com/failsafe-go/failsafe-go"
	"github.com/failsafe-go/failsafe-go/common"
	"github.com/failsafe-go/failsafe-go/policy"

	"tenace.dev/tenace"
)

// executor is the policy.Executor of a Lock, built from failsafe-go's
// policy.BaseExecutor as its own policies are. It overrides Apply alone:
// the acquire and the release cannot be a PreExecute and a PostExecute
// (Bulkhead's shape), because failsafe-go calls PostExecute only when the
// inner function returns, not when it panics, and a panic must not leak the
// lock. It judges no result a failure of its own (PostExecute is never
// called): the policies outside it see the inner result unchanged, or the
// Lock's error.
type executor[R any] struct {
	policy.BaseExecutor[R]
	*lock[R]
}

var _ policy.Executor[any] = (*executor[any])(nil)

// Apply runs innerFn, the policies inside the Lock and the function, under
// the lock.
//
// The wait for the lock ends with the execution's context: a failsafe-go
// Timeout outside the Lock, a cancelled executor context, a hedge cancelled
// by a sibling's result. The execution then returns what failsafe-go's own
// executors return on cancellation (the Timeout's timeout.ErrExceeded, the
// context's error), and a grant that landed at that moment is released
// (tenace's Lock does it). While innerFn runs, the same cancellation
// reaches its context, which derives from the execution's.
func (e *executor[R]) Apply(innerFn func(failsafe.Execution[R]) *common.PolicyResult[R]) func(failsafe.Execution[R]) *common.PolicyResult[R] {
	return func(exec failsafe.Execution[R]) *common.PolicyResult[R] {
		outer := exec.(policy.ExecutionInternal[R])
		ctx := exec.Context()
		key := e.config.opts.Key
		if key == "" {
			key = e.config.keyFunc(ctx)
		}
		if key == "" {
			return failure[R](errMissingKey)
		}
		var result *common.PolicyResult[R]
		err := e.pipelineFor(outer).Execute(ctx, func(held context.Context) error {
			result = runHeld(held, outer, innerFn)
			return nil
		}, tenace.WithKey(key))
		if result != nil {
			return result
		}
		// innerFn did not run. If the execution was cancelled (the wait
		// ended with its context), the cancellation's result wins, as in
		// failsafe-go's own blocking policies.
		if canceled, cancelResult := outer.IsCanceledWithResult(); canceled {
			return cancelResult
		}
		return failure[R](err)
	}
}

// pipelineFor is the Lock's tenace pipeline, with a listener that turns
// tenace's events into the failsafe-go listeners' events of exec when any
// is set (one allocation per execution then; none otherwise).
func (e *executor[R]) pipelineFor(exec policy.ExecutionInternal[R]) tenace.Policy {
	if !e.execListeners {
		return e.pipeline
	}
	return e.pipeline.OnEvent(func(ev tenace.Event) {
		switch ev.Name {
		case tenace.EventLockAcquired:
			call(e.config.onAcquired, exec, nil)
		case tenace.EventLockRejected:
			call(e.config.onRejected, exec, failure[R](ev.Err))
		case tenace.EventLockDeadlock:
			call(e.config.onDeadlock, exec, failure[R](ev.Err))
		case tenace.EventLockReleased:
			call(e.config.onReleased, exec, nil)
		}
	})
}

// call calls listener, if set, with an event on a copy of exec with result
// (nil: exec's last one), as failsafe-go's policies do, so that the
// listener sees the execution as it was.
func call[R any](listener func(failsafe.ExecutionEvent[R]), exec policy.ExecutionInternal[R], result *common.PolicyResult[R]) {
	if listener != nil {
		listener(failsafe.ExecutionEvent[R]{ExecutionAttempt: exec.CopyWithResult(result)})
	}
}

// failure is failsafe-go's result of a policy that stopped an execution
// with err (its internal.FailureResult).
func failure[R any](err error) *common.PolicyResult[R] {
	return &common.PolicyResult[R]{Error: err, Done: true}
}

// runHeld runs innerFn while the lock is held, with an execution whose
// Context is held: the context tenace's Lock gives the work, from which
// tenace.LeaseFrom returns the lease and which ends, with a cause wrapping
// tenace.ErrLeaseLost, if the lease is lost.
//
// failsafe-go has no way to give an execution a context of one's own: its
// executions are of an unexported type, which the innermost function
// insists on, and only copy themselves with a cancellable child of their
// own context (CopyForCancellable), which cannot carry the lease. The one
// public way to make an execution on a given context is an executor: a
// failsafe.With with no policies, run on held, gives one, and innerFn runs
// on it. Being new, it counts from zero: mirror makes it report the outer
// execution's attempts, retries, hedges and last result, which fn and the
// inner policies read. What it cannot mirror — StartTime and Executions,
// which count from the grant, and the outer execution's Executions, which
// does not count the runs under the lock — the package documentation
// states.
func runHeld[R any](held context.Context, outer policy.ExecutionInternal[R], innerFn func(failsafe.Execution[R]) *common.PolicyResult[R]) *common.PolicyResult[R] {
	var result *common.PolicyResult[R]
	_, _ = failsafe.With[R]().WithContext(held).GetWithExecution(func(fresh failsafe.Execution[R]) (R, error) {
		inner, done := mirror(fresh.(policy.ExecutionInternal[R]), outer)
		defer done()
		result = innerFn(inner)
		return result.Result, result.Error
	})
	return result
}

// mirror makes fresh, a new execution on the lock's context, count what
// outer counts, through the methods failsafe-go's own policies count with:
// CopyForHedge adds an attempt and a hedge (its copies share the counters),
// InitializeRetry an attempt and a retry, RecordResult sets the last result
// and error. It returns the execution to run innerFn on — fresh, or a hedge
// copy of it when outer is a hedge — and what to call once innerFn has
// returned (it cancels the hedge copies' contexts, children of the lock's).
//
// Should the lock's context end meanwhile, InitializeRetry and RecordResult
// refuse (the counts may fall short); innerFn then sees the cancellation
// first.
func mirror[R any](fresh, outer policy.ExecutionInternal[R]) (policy.ExecutionInternal[R], func()) {
	hedges := outer.Hedges()
	if outer.IsHedge() {
		hedges-- // the last is made below, and is the execution innerFn runs on
	}
	for range hedges {
		fresh.CopyForHedge().(policy.ExecutionInternal[R]).Cancel(nil)
	}
	for range outer.Retries() {
		fresh.InitializeRetry()
	}
	if outer.Attempts() > 1 { // a first attempt has no last result to carry
		// Through a copy: a Timeout or a hedge may Cancel outer, which
		// writes its last result, at any moment; CopyWithResult reads it
		// under outer's mutex.
		last := outer.CopyWithResult(nil)
		fresh.RecordResult(&common.PolicyResult[R]{Result: last.LastResult(), Error: last.LastError()})
	}
	if !outer.IsHedge() {
		return fresh, func() {}
	}
	hedge := fresh.CopyForHedge().(policy.ExecutionInternal[R])
	return hedge, func() { hedge.Cancel(nil) }
}

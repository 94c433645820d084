package pglock_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"tenace.dev/internal/pgtest"
	"tenace.dev/tenace"
	"tenace.dev/tenace/pglock"
)

// lockIn runs fn under a Lock of key on p, with Timeout (0: no Timeout).
func lockIn(ctx context.Context, p *pglock.Provider, key string, timeout time.Duration, fn func(context.Context) error) error {
	return tenace.NewPolicy().WithLock(tenace.LockOptions{Provider: p, Key: key, Timeout: timeout}).Execute(ctx, fn)
}

// registerKeys gives each key its row, so that pg_locks can be read by key.
func registerKeys(t *testing.T, p *pglock.Provider, keys ...string) {
	t.Helper()
	for _, k := range keys {
		require.NoError(t, mustAcquire(t, p, k, tenace.LockAcquireOptions{}).Release(bg))
	}
}

// waitingPID is the backend that waits for key on srv (0 if none).
func waitingPID(t *testing.T, srv *pgtest.Server, key string) uint32 {
	t.Helper()
	for _, row := range strings.Fields(locks(t, srv, key)) {
		if pid, ok := strings.CutSuffix(row, ":false"); ok {
			n, err := strconv.ParseUint(pid, 10, 32)
			require.NoError(t, err)
			return uint32(n)
		}
	}
	return 0
}

// requireNoLocks fails unless nobody holds or waits for any of keys.
func requireNoLocks(t *testing.T, srv *pgtest.Server, keys ...string) {
	t.Helper()
	for _, k := range keys {
		require.Empty(t, locks(t, srv, k), "key %q is still locked", k)
	}
}

// verdict is how an execution's Lock ended, and when.
type verdict struct {
	i   int
	err error
	at  time.Time
}

// TestNestedDeadlockAcrossProcesses: n executions, each of its own
// provider (its own pool: to the server, another process), each holding
// key i and asking, nested, for key i+1 with a 15 s Timeout — a ring. The
// nested waits run on the sessions that hold the outer keys, so the
// server's deadlock detector sees the cycle: one execution gets a
// *tenace.DeadlockError within deadlock_timeout and 1 s of the wait that
// closed the ring (measured against a control timer of deadlock_timeout in
// the same run), naming the key it asked for and the key it held; its
// outer lock is released as its Lock returns, and every other execution
// is granted its nested key. The same with a reader's nested Lock (Shared)
// in the ring, and with two executions of one provider (one process: the
// server sees their sessions all the same). Nothing is left locked.
func TestNestedDeadlockAcrossProcesses(t *testing.T) {
	for _, tc := range []struct {
		n      int
		reader bool // execution 0's nested Lock is a reader's (Shared)
		one    bool // the executions share one provider: one process
	}{{2, false, false}, {3, false, false}, {2, true, false}, {2, false, true}} {
		n := tc.n
		t.Run(fmt.Sprintf("%d processes, reader %v, one provider %v", n, tc.reader, tc.one), func(t *testing.T) {
			srv := server(t)
			const deadlockTimeout = 200 * time.Millisecond
			ps := make([]*pglock.Provider, n)
			for i := range ps {
				if i == 0 || !tc.one {
					ps[i] = withDeadlockTimeout(t, srv, deadlockTimeout)
				} else {
					ps[i] = ps[0]
				}
			}
			keys := setKeys(t, n)
			registerKeys(t, ps[0], keys...)
			held := make([]chan struct{}, n)
			ask := make([]chan struct{}, n)
			for i := range n {
				held[i], ask[i] = make(chan struct{}), make(chan struct{})
			}
			var ran [3]atomic.Bool
			verdicts := make(chan verdict, n)
			for i := range n {
				go func() {
					err := lockIn(bg, ps[i], keys[i], 15*time.Second, func(ctx context.Context) error {
						close(held[i])
						<-ask[i]
						nested := tenace.LockOptions{Provider: ps[i], Key: keys[(i+1)%n], Timeout: 15 * time.Second, Shared: tc.reader && i == 0}
						return tenace.NewPolicy().WithLock(nested).Execute(ctx, func(context.Context) error {
							ran[i].Store(true)
							return nil
						})
					})
					verdicts <- verdict{i, err, time.Now()}
				}()
			}
			for i := range n {
				<-held[i]
			}
			// Execution i waits for key i+1; the last closes the ring.
			for i := range n - 1 {
				close(ask[i])
				waitForWaiters(t, srv, keys[i+1], 1)
			}
			start := time.Now()
			control := time.NewTimer(deadlockTimeout)
			close(ask[n-1])
			<-control.C
			late := time.Since(start) - deadlockTimeout
			var deadlocks []verdict
			first := time.Time{}
			for range n {
				var v verdict
				select {
				case v = <-verdicts:
				case <-time.After(30 * time.Second):
					t.Fatalf("the executions of the ring did not end: %s / %s", locks(t, srv, keys[0]), locks(t, srv, keys[1]))
				}
				if first.IsZero() {
					first = v.at
				}
				var d *tenace.DeadlockError
				if errors.As(v.err, &d) {
					deadlocks = append(deadlocks, v)
					require.Equal(t, keys[(v.i+1)%n], d.Key)
					require.Equal(t, []string{keys[(v.i+1)%n], keys[v.i]}, d.Cycle)
					require.False(t, ran[v.i].Load())
					continue
				}
				require.NoError(t, v.err, "execution %d", v.i)
				require.True(t, ran[v.i].Load(), "execution %d", v.i)
			}
			require.Len(t, deadlocks, 1, "one execution of the ring is failed, and only one")
			took := deadlocks[0].at.Sub(start)
			allowance := 2 * max(late, 0)
			t.Logf("the server's verdict came %v after the ring closed (deadlock_timeout %v; the control timer was %v late)", took, deadlockTimeout, late)
			require.Less(t, took, deadlockTimeout+time.Second+allowance)
			requireNoLocks(t, srv, keys...)
		})
	}
}

// TestNestedChainIsNoDeadlock: an execution holds k1 and waits, nested,
// for k2, which another process holds and releases after 1.5 s — past the
// server's deadlock check, at 200 ms — while a third waits for k1: a chain
// of waits, no cycle. The nested wait runs on the session that holds k1
// (the server sees the chain), and nobody is failed: the execution gets
// k2, then the third gets k1.
func TestNestedChainIsNoDeadlock(t *testing.T) {
	srv := server(t)
	p := withDeadlockTimeout(t, srv, 200*time.Millisecond)
	holder := withDeadlockTimeout(t, srv, 200*time.Millisecond)
	third := withDeadlockTimeout(t, srv, 200*time.Millisecond)
	keys := setKeys(t, 2)
	registerKeys(t, p, keys...)
	k2 := mustAcquire(t, holder, keys[1], tenace.LockAcquireOptions{})
	done := make(chan error, 1)
	outerPID := make(chan uint32, 1)
	go func() {
		done <- lockIn(bg, p, keys[0], 0, func(ctx context.Context) error {
			l, _ := tenace.LeaseFrom(ctx)
			outerPID <- pglock.BackendPID(l)
			return lockIn(ctx, p, keys[1], 15*time.Second, func(context.Context) error { return nil })
		})
	}()
	pid := <-outerPID
	waitForWaiters(t, srv, keys[1], 1)
	require.Equal(t, pid, waitingPID(t, srv, keys[1]), "the nested wait runs on the session that holds the outer key")
	thirdGot := acquireAsync(bg, third, keys[0], tenace.LockAcquireOptions{Timeout: 15 * time.Second})
	waitForWaiters(t, srv, keys[0], 1)
	// The holder's 1.5 s is the server's clock at work: its deadlock
	// checks run during it.
	time.Sleep(1500 * time.Millisecond)
	require.NoError(t, k2.Release(bg))
	require.NoError(t, <-done)
	r := <-thirdGot
	require.NoError(t, r.err)
	require.NotNil(t, r.lease)
	require.NoError(t, r.lease.Release(bg))
	requireNoLocks(t, srv, keys...)
}

// TestNestedLocksShareTheSession: a nested Lock's lease is on the session
// of the outer one (one backend), and its release unlocks its own key
// alone: the outer key stays held, by the same session, which goes back
// to the pool only when the outer lock is released too. The nested grant
// gets its fencing token, as any grant.
func TestNestedLocksShareTheSession(t *testing.T) {
	srv := server(t)
	p := newProvider(t, srv)
	other := newProvider(t, srv)
	keys := setKeys(t, 3)
	registerKeys(t, p, keys...)
	first := mustAcquire(t, p, keys[1], tenace.LockAcquireOptions{})
	registered := first.(tenace.FencedLease).Token()
	require.NoError(t, first.Release(bg))
	try := func(key string) bool {
		l, err := other.Acquire(bg, key, tenace.LockAcquireOptions{Timeout: tenace.NoWait})
		require.NoError(t, err)
		if l != nil {
			require.NoError(t, l.Release(bg))
		}
		return l != nil
	}
	err := lockIn(bg, p, keys[0], 0, func(ctx context.Context) error {
		outer, _ := tenace.LeaseFrom(ctx)
		err := lockIn(ctx, p, keys[1], time.Minute, func(ctx context.Context) error {
			inner, _ := tenace.LeaseFrom(ctx)
			require.Equal(t, pglock.BackendPID(outer), pglock.BackendPID(inner))
			require.Equal(t, 2, p.Stats().Held)
			// The nested grant is fenced: the key's counter, past the
			// registering grant's.
			token, ok := tenace.TokenFrom(ctx)
			require.True(t, ok)
			require.Greater(t, token, registered)
			return lockIn(ctx, p, keys[2], time.Minute, func(ctx context.Context) error {
				innermost, _ := tenace.LeaseFrom(ctx)
				require.Equal(t, pglock.BackendPID(outer), pglock.BackendPID(innermost))
				return nil
			})
		})
		require.NoError(t, err)
		require.True(t, try(keys[1]), "the inner key is free once its Lock returned")
		require.True(t, try(keys[2]), "the innermost key is free once its Lock returned")
		require.False(t, try(keys[0]), "the outer key is still held")
		require.Nil(t, outer.(tenace.LosableLease).Err())
		require.Equal(t, 1, p.Stats().Held)
		return nil
	})
	require.NoError(t, err)
	require.Equal(t, 0, p.Stats().Held)
	requireNoLocks(t, srv, keys...)
}

// TestNestedSessionLossLosesEveryKey: the session that holds an outer and
// a nested key ends (its backend terminated): both leases are lost, and
// both Locks' contexts end with tenace.ErrLeaseLost as the cause.
func TestNestedSessionLossLosesEveryKey(t *testing.T) {
	srv := server(t)
	p := newProvider(t, srv)
	keys := setKeys(t, 2)
	registerKeys(t, p, keys...)
	var outerLost, innerLost error
	err := lockIn(bg, p, keys[0], 0, func(octx context.Context) error {
		outer, _ := tenace.LeaseFrom(octx)
		return lockIn(octx, p, keys[1], time.Minute, func(ictx context.Context) error {
			inner, _ := tenace.LeaseFrom(ictx)
			require.Equal(t, pglock.BackendPID(outer), pglock.BackendPID(inner), "one session")
			srv.Terminate(t, pglock.BackendPID(inner))
			for _, c := range []context.Context{ictx, octx} {
				select {
				case <-c.Done():
				case <-time.After(20 * time.Second):
					t.Fatal("the loss of the session was not reported")
				}
			}
			innerLost, outerLost = context.Cause(ictx), context.Cause(octx)
			return nil
		})
	})
	require.NoError(t, err)
	require.ErrorIs(t, innerLost, tenace.ErrLeaseLost)
	require.ErrorIs(t, outerLost, tenace.ErrLeaseLost)
	require.Equal(t, 0, p.Stats().Held)
	requireNoLocks(t, srv, keys...)
}

// TestNestedWaitKeepsItsTimeoutAndContext: a nested wait on the outer
// key's session ends at its Timeout (*tenace.LockNotAcquiredError) and at
// its ctx's end (ctx's error), and neither costs the outer lock: it is
// still held, not lost, on the same session; the wait left no waiter
// behind. A later nested Lock still gets its key.
func TestNestedWaitKeepsItsTimeoutAndContext(t *testing.T) {
	srv := server(t)
	p := newProvider(t, srv)
	other := newProvider(t, srv)
	keys := setKeys(t, 3)
	registerKeys(t, p, keys...)
	k1 := mustAcquire(t, other, keys[1], tenace.LockAcquireOptions{})
	err := lockIn(bg, p, keys[0], 0, func(ctx context.Context) error {
		outer, _ := tenace.LeaseFrom(ctx)
		pid := pglock.BackendPID(outer)

		start := time.Now()
		err := lockIn(ctx, p, keys[1], 300*time.Millisecond, func(context.Context) error { return nil })
		var rejected *tenace.LockNotAcquiredError
		require.ErrorAs(t, err, &rejected)
		require.GreaterOrEqual(t, time.Since(start), 300*time.Millisecond)

		cctx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- lockIn(cctx, p, keys[1], 15*time.Second, func(context.Context) error { return nil }) }()
		waitForWaiters(t, srv, keys[1], 1)
		require.Equal(t, pid, waitingPID(t, srv, keys[1]), "the nested wait runs on the outer key's session")
		cancel()
		require.ErrorIs(t, <-done, context.Canceled)
		require.Equal(t, 0, waiters(t, srv, keys[1]), "the cancelled wait left its queue")

		require.Nil(t, outer.(tenace.LosableLease).Err(), "the outer lease is not lost")
		require.Nil(t, ctx.Err())
		require.Contains(t, locks(t, srv, keys[0]), fmt.Sprintf("%d:true", pid), "the outer key is held by its session")

		return lockIn(ctx, p, keys[2], time.Minute, func(context.Context) error { return nil })
	})
	require.NoError(t, err)
	require.NoError(t, k1.Release(bg))
	requireNoLocks(t, srv, keys...)
}

// TestNestedSiblingsNeverShareAKey: two goroutines of one execution ask
// for the same key through nested Locks: a session's advisory locks are
// reentrant, so the second must not wait on the session that holds the
// key (it would be granted at once): it waits for the first, and is not
// granted while the first holds it.
func TestNestedSiblingsNeverShareAKey(t *testing.T) {
	srv := server(t)
	p := newProvider(t, srv)
	keys := setKeys(t, 2)
	registerKeys(t, p, keys...)
	err := lockIn(bg, p, keys[0], 0, func(ctx context.Context) error {
		holding, release := make(chan struct{}), make(chan struct{})
		first := make(chan error, 1)
		go func() {
			first <- lockIn(ctx, p, keys[1], time.Minute, func(context.Context) error {
				close(holding)
				<-release
				return nil
			})
		}()
		<-holding
		err := lockIn(ctx, p, keys[1], 300*time.Millisecond, func(context.Context) error { return nil })
		var rejected *tenace.LockNotAcquiredError
		require.ErrorAs(t, err, &rejected, "a sibling was granted a key its execution's session holds")
		close(release)
		return <-first
	})
	require.NoError(t, err)
	requireNoLocks(t, srv, keys...)
}

// TestNestedTTLEndsTheNestedKeyAlone: a nested lease's TTL loses it
// (tenace.ErrLeaseExpired) and unlocks its key alone: the outer lease, on
// the same session, is still held and not lost.
func TestNestedTTLEndsTheNestedKeyAlone(t *testing.T) {
	srv := server(t)
	p := newProvider(t, srv)
	keys := setKeys(t, 2)
	registerKeys(t, p, keys...)
	err := lockIn(bg, p, keys[0], 0, func(ctx context.Context) error {
		outer, _ := tenace.LeaseFrom(ctx)
		var cause error
		err := tenace.NewPolicy().WithLock(tenace.LockOptions{Provider: p, Key: keys[1], Timeout: time.Minute, TTL: 100 * time.Millisecond}).
			Execute(ctx, func(ictx context.Context) error {
				select {
				case <-ictx.Done():
				case <-time.After(20 * time.Second):
					t.Fatal("the nested lease's TTL did not end it")
				}
				cause = context.Cause(ictx)
				return nil
			})
		require.NoError(t, err)
		require.ErrorIs(t, cause, tenace.ErrLeaseExpired)
		require.Nil(t, outer.(tenace.LosableLease).Err(), "the outer lease is not lost")
		require.Nil(t, ctx.Err())
		require.Contains(t, locks(t, srv, keys[0]), fmt.Sprintf("%d:true", pglock.BackendPID(outer)))
		require.Empty(t, locks(t, srv, keys[1]))
		return nil
	})
	require.NoError(t, err)
	requireNoLocks(t, srv, keys...)
}

// TestNestedClose: Close while an outer and a nested lease share a
// session loses both, and leaves nothing locked.
func TestNestedClose(t *testing.T) {
	srv := server(t)
	p, err := pglock.New(bg, srv.ConnString())
	require.NoError(t, err)
	keys := setKeys(t, 2)
	registerKeys(t, p, keys...)
	var causes []error
	err = lockIn(bg, p, keys[0], 0, func(octx context.Context) error {
		return lockIn(octx, p, keys[1], time.Minute, func(ictx context.Context) error {
			require.NoError(t, p.Close())
			for _, c := range []context.Context{ictx, octx} {
				<-c.Done() // Close signals every loss before it returns
				causes = append(causes, context.Cause(c))
			}
			return nil
		})
	})
	require.NoError(t, err)
	for _, c := range causes {
		require.ErrorIs(t, c, tenace.ErrLeaseLost)
	}
	requireNoLocks(t, srv, keys...)
}

// TestNestedWaitOutlivesTheOuterLock: a goroutine of the execution waits,
// nested, on the outer key's session when the outer Lock returns. With
// fn's context, the wait ends as fn returns (context.Canceled), and the
// outer key is unlocked after it. With context.WithoutCancel(fn's
// context), nothing ends the wait: the outer Lock's release waits for the
// session up to its bound (here 300 ms), then closes the session's
// connection, which frees every lock on it; the goroutine's wait fails.
// Either way nothing is left locked.
func TestNestedWaitOutlivesTheOuterLock(t *testing.T) {
	defer pglock.SetReleaseTimeout(300 * time.Millisecond)()
	for _, detached := range []bool{false, true} {
		t.Run(fmt.Sprintf("WithoutCancel %v", detached), func(t *testing.T) {
			srv := server(t)
			p := newProvider(t, srv)
			other := newProvider(t, srv)
			keys := setKeys(t, 2)
			registerKeys(t, p, keys...)
			k1 := mustAcquire(t, other, keys[1], tenace.LockAcquireOptions{})
			nested := make(chan error, 1)
			err := lockIn(bg, p, keys[0], 0, func(ctx context.Context) error {
				outer, _ := tenace.LeaseFrom(ctx)
				if detached {
					ctx = context.WithoutCancel(ctx)
				}
				go func() { nested <- lockIn(ctx, p, keys[1], 0, func(context.Context) error { return nil }) }()
				waitForWaiters(t, srv, keys[1], 1)
				require.Equal(t, pglock.BackendPID(outer), waitingPID(t, srv, keys[1]))
				return nil
			})
			require.NoError(t, err)
			select {
			case err := <-nested:
				if detached {
					var failed *tenace.UnexpectedError
					require.ErrorAs(t, err, &failed)
				} else {
					require.ErrorIs(t, err, context.Canceled)
				}
			case <-time.After(20 * time.Second):
				t.Fatal("the nested wait did not end")
			}
			require.NoError(t, k1.Release(bg))
			require.Equal(t, 0, p.Stats().Held)
			requireNoLocks(t, srv, keys...)
		})
	}
}

// TestNestedInASet: a Lock nested in a set's Lock (LockOptions.Keys) waits
// on the set's session, and its release leaves the set's keys held.
func TestNestedInASet(t *testing.T) {
	srv := server(t)
	p := newProvider(t, srv)
	keys := setKeys(t, 3)
	registerKeys(t, p, keys...)
	err := tenace.NewPolicy().WithLock(tenace.LockOptions{Provider: p, Keys: keys[:2]}).Execute(bg, func(ctx context.Context) error {
		set, _ := tenace.LeaseFrom(ctx)
		pid := pglock.BackendPID(set)
		err := lockIn(ctx, p, keys[2], time.Minute, func(ctx context.Context) error {
			inner, _ := tenace.LeaseFrom(ctx)
			require.Equal(t, pid, pglock.BackendPID(inner))
			return nil
		})
		require.NoError(t, err)
		require.Empty(t, locks(t, srv, keys[2]))
		for _, k := range keys[:2] {
			require.Equal(t, fmt.Sprintf("%d:true", pid), locks(t, srv, k))
		}
		return nil
	})
	require.NoError(t, err)
	requireNoLocks(t, srv, keys...)
}

// TestNestedInAPermitWaitsApart: a Lock nested in a bulkhead permit's Lock
// waits on a session of its own: a permit's release unlocks everything its
// session holds, which would take the nested key with it.
func TestNestedInAPermitWaitsApart(t *testing.T) {
	srv := server(t)
	p := newProvider(t, srv)
	keys := setKeys(t, 2)
	registerKeys(t, p, keys...)
	err := tenace.NewPolicy().WithLock(tenace.LockOptions{Provider: p, Key: keys[0], Shared: true, Permits: 1}).Execute(bg, func(ctx context.Context) error {
		permit, _ := tenace.LeaseFrom(ctx)
		return lockIn(ctx, p, keys[1], time.Minute, func(ctx context.Context) error {
			inner, _ := tenace.LeaseFrom(ctx)
			require.NotEqual(t, pglock.BackendPID(permit), pglock.BackendPID(inner))
			return nil
		})
	})
	require.NoError(t, err)
	requireNoLocks(t, srv, keys...)
}

// TestKillOfAnEndedSessionLeavesItAlone: a Release that could not take its
// session in time kills it — unless the session ended in the meantime (the
// server ended it, and the nested wait that used it ended it on the client:
// its connection is closed and hijacked). The kill then has nothing to
// close; it must not reach for the connection (before, a nil pointer
// dereference in the Release brought the process down).
func TestKillOfAnEndedSessionLeavesItAlone(t *testing.T) {
	defer pglock.SetReleaseTimeout(300 * time.Millisecond)()
	srv := server(t)
	p, other, keys := newProvider(t, srv), newProvider(t, srv), setKeys(t, 2)
	registerKeys(t, p, keys...)
	k1 := mustAcquire(t, other, keys[1], tenace.LockAcquireOptions{})
	defer func() { _ = k1.Release(bg) }()
	nested := make(chan error, 1)
	var pid uint32
	killing := false
	p.SetHooks(pglock.Hooks{Killing: func() {
		// The outer Release's bound has passed while the nested wait used
		// the session: end the session under both before the kill.
		killing = true
		srv.Terminate(t, pid)
		select {
		case err := <-nested:
			require.Error(t, err, "the nested wait, its session terminated")
		case <-time.After(lossBound):
			t.Fatal("the nested wait did not end with its session")
		}
	}})
	err := lockIn(bg, p, keys[0], 0, func(ctx context.Context) error {
		l, _ := tenace.LeaseFrom(ctx)
		pid = pglock.BackendPID(l)
		go func() {
			nested <- lockIn(context.WithoutCancel(ctx), p, keys[1], 0, func(context.Context) error { return nil })
		}()
		waitForWaiters(t, srv, keys[1], 1)
		return nil
	})
	require.True(t, killing, "the outer Release took the session: it was never busy past the Release's bound")
	t.Logf("the outer Lock: %v", err)
	require.NoError(t, k1.Release(bg))
	for _, k := range keys {
		waitFree(t, srv, k)
	}
}

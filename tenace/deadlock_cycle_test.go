package tenace_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"testing/synctest"

	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"

	"tenace.dev/internal/proptest"
	"tenace.dev/tenace"
)

// holdThenWait runs, on its own goroutine, an execution that holds outer
// and then, once proceed is closed, asks for inner with no Timeout; its
// error comes on the returned channel. Options without a Provider use p.
func holdThenWait(p *tenace.MemoryLockProvider, outer tenace.LockOptions, inner tenace.LockOptions, holding chan<- struct{}, proceed <-chan struct{}) <-chan error {
	if outer.Provider == nil {
		outer.Provider = p
	}
	if inner.Provider == nil {
		inner.Provider = p
	}
	errc := make(chan error, 1)
	go func() {
		errc <- tenace.NewPolicy().WithLock(outer).Execute(context.Background(), func(ctx context.Context) error {
			holding <- struct{}{}
			<-proceed
			return tenace.NewPolicy().WithLock(inner).Execute(ctx, func(context.Context) error { return nil })
		})
	}()
	return errc
}

// A cycle of waits between executions, through any number of keys and
// shards, is broken at once by failing the waiter that closed it with a
// *DeadlockError naming the cycle; the others go on. No Timeout anywhere:
// without the detector, every test here would hang.
func TestDeadlockCycle(t *testing.T) {
	for _, tc := range []struct {
		name  string
		holds []tenace.LockOptions
		waits []tenace.LockOptions
		cycle []string // the error of the last to wait
	}{
		{
			name:  "two keys",
			holds: []tenace.LockOptions{{Key: "k1"}, {Key: "k2"}},
			waits: []tenace.LockOptions{{Key: "k2"}, {Key: "k1"}},
			cycle: []string{"k1", "k2"},
		},
		{
			name:  "three keys",
			holds: []tenace.LockOptions{{Key: "k1"}, {Key: "k2"}, {Key: "k3"}},
			waits: []tenace.LockOptions{{Key: "k2"}, {Key: "k3"}, {Key: "k1"}},
			cycle: []string{"k1", "k2", "k3"},
		},
		{
			name:  "through a set",
			holds: []tenace.LockOptions{{Key: "x"}, {Keys: []string{"k2", "k1"}}},
			waits: []tenace.LockOptions{{Keys: []string{"k1", "k3"}}, {Key: "x"}},
			cycle: []string{"x", "k1"},
		},
	} {
		for _, shards := range []int{1, 3} {
			t.Run(fmt.Sprintf("%s/shards=%d", tc.name, shards), func(t *testing.T) {
				synctest.Test(t, func(t *testing.T) {
					p := tenace.NewMemoryLockProvider(tenace.WithShards(shards))
					defer p.Close()
					holding := make(chan struct{}, len(tc.holds))
					var proceed []chan struct{}
					var errs []<-chan error
					for i := range tc.holds {
						proceed = append(proceed, make(chan struct{}))
						errs = append(errs, holdThenWait(p, tc.holds[i], tc.waits[i], holding, proceed[i]))
					}
					for range tc.holds {
						<-holding
					}
					// One by one, so that the last one closes the cycle.
					for _, c := range proceed {
						close(c)
						synctest.Wait()
					}
					last := len(errs) - 1
					err := <-errs[last]
					var d *tenace.DeadlockError
					require.ErrorAs(t, err, &d)
					require.Equal(t, tc.cycle, d.Cycle)
					require.Equal(t, tc.cycle[0], d.Key)
					require.ErrorContains(t, err, "this wait closes the cycle of waits")
					for _, e := range errs[:last] {
						require.NoError(t, <-e, "the others go on")
					}
					require.Zero(t, p.Size())
				})
			})
		}
	}
}

// A holding waiter behind a holder that does not wait is no cycle: it
// waits, and goes on when the key is released.
func TestDeadlockNoCycle(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := tenace.NewMemoryLockProvider()
		defer p.Close()
		blocker, err := p.Acquire(context.Background(), "k2", tenace.LockAcquireOptions{})
		require.NoError(t, err)
		holding, proceed := make(chan struct{}, 1), make(chan struct{})
		errc := holdThenWait(p, tenace.LockOptions{Key: "k1"}, tenace.LockOptions{Key: "k2"}, holding, proceed)
		<-holding
		close(proceed)
		synctest.Wait()
		select {
		case err := <-errc:
			t.Fatalf("returned %v while k2 is held", err)
		default:
		}
		require.NoError(t, blocker.Release(context.Background()))
		require.NoError(t, <-errc)
		// A waiter cancelled while it waits leaves the graph: the same
		// shape again is still no cycle.
		blocker, err = p.Acquire(context.Background(), "k2", tenace.LockAcquireOptions{})
		require.NoError(t, err)
		ctx, cancel := context.WithCancel(context.Background())
		errc2 := make(chan error, 1)
		go func() {
			errc2 <- tenace.NewPolicy().WithLock(tenace.LockOptions{Provider: p, Key: "k1"}).Execute(ctx, func(ctx context.Context) error {
				return tenace.NewPolicy().WithLock(tenace.LockOptions{Provider: p, Key: "k2"}).Execute(ctx, func(context.Context) error { return nil })
			})
		}()
		synctest.Wait()
		cancel()
		require.True(t, errors.Is(<-errc2, context.Canceled))
		require.NoError(t, blocker.Release(context.Background()))
		require.Zero(t, p.Size())
	})
}

// A set that waits holds the keys it was granted already: F holds b and
// asks for a, while E's set {b, a} took a and waits for b — a cycle, also
// when E's execution holds nothing else. F, the last to wait, gets the
// *DeadlockError, and E goes on. No Timeout: without it, both wait forever.
func TestDeadlockCycleThroughAPartlyGrantedSet(t *testing.T) {
	for _, eHolds := range []string{"", "x"} {
		for _, shards := range []int{1, 8} {
			t.Run(fmt.Sprintf("E holds %q/shards=%d", eHolds, shards), func(t *testing.T) {
				synctest.Test(t, func(t *testing.T) {
					p := tenace.NewMemoryLockProvider(tenace.WithShards(shards))
					defer p.Close()
					fHolds, fAsk := make(chan struct{}, 1), make(chan struct{})
					fErr := holdThenWait(p, tenace.LockOptions{Key: "b"}, tenace.LockOptions{Key: "a"}, fHolds, fAsk)
					<-fHolds
					set := tenace.NewPolicy().WithLock(tenace.LockOptions{Provider: p, Keys: []string{"b", "a"}})
					eErr := make(chan error, 1)
					go func() {
						if eHolds == "" {
							eErr <- set.Execute(bg, func(context.Context) error { return nil })
							return
						}
						eErr <- tenace.NewPolicy().WithLock(tenace.LockOptions{Provider: p, Key: eHolds}).Execute(bg, func(ctx context.Context) error {
							return set.Execute(ctx, func(context.Context) error { return nil })
						})
					}()
					synctest.Wait() // E holds a and waits for b
					close(fAsk)
					err := <-fErr
					var d *tenace.DeadlockError
					require.ErrorAs(t, err, &d)
					require.Equal(t, []string{"a", "b"}, d.Cycle)
					require.NoError(t, <-eErr, "E goes on")
					require.Zero(t, p.Size())
				})
			})
		}
	}
}

// forwarding is a wrapper around a provider that passes keys through and
// forwards its DeadlockDetector: detection is kept, and keys taken through
// it and through the provider itself are one lock space.
type forwarding struct {
	p     *tenace.MemoryLockProvider
	panic func(key string) bool // Acquire panics for these keys
}

func (f forwarding) Acquire(ctx context.Context, key string, opts tenace.LockAcquireOptions) (tenace.LockLease, error) {
	if f.panic != nil && f.panic(key) {
		panic("acquire of " + key)
	}
	return f.p.Acquire(ctx, key, opts)
}

func (f forwarding) DeadlockDetector() *tenace.DeadlockDetector { return f.p.DeadlockDetector() }

var _ tenace.DeadlockDetectingProvider = forwarding{}

// Detection goes through the DeadlockDetectingProvider interface: a wrapper
// that forwards it keeps it, for a cycle through the wrapper and the
// provider it wraps, and for a key its execution holds through the other.
func TestDeadlockThroughAForwardingWrapper(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := tenace.NewMemoryLockProvider()
		defer p.Close()
		w := forwarding{p: p}
		holding := make(chan struct{}, 2)
		proceedA, proceedB := make(chan struct{}), make(chan struct{})
		errA := holdThenWait(p, tenace.LockOptions{Provider: w, Key: "k1"}, tenace.LockOptions{Key: "k2"}, holding, proceedA)
		errB := holdThenWait(p, tenace.LockOptions{Key: "k2"}, tenace.LockOptions{Provider: w, Keys: []string{"k1", "k3"}}, holding, proceedB)
		<-holding
		<-holding
		close(proceedA)
		synctest.Wait()
		close(proceedB)
		var d *tenace.DeadlockError
		require.ErrorAs(t, <-errB, &d)
		require.Equal(t, []string{"k1", "k2"}, d.Cycle)
		require.NoError(t, <-errA)

		err := tenace.NewPolicy().WithLock(tenace.LockOptions{Provider: w, Key: "k"}).Execute(bg, func(ctx context.Context) error {
			return tenace.NewPolicy().WithLock(tenace.LockOptions{Provider: p, Key: "k"}).Execute(ctx, func(context.Context) error { return nil })
		})
		require.ErrorAs(t, err, &d)
		require.Equal(t, "k", d.Key)
		require.Zero(t, p.Size())
	})
}

// A provider's Acquire that panics leaves no wait in the detector's graph:
// X, which holds k1 and goes on holding it, recovers from the panic of its
// wait for k2; then Y, holding k2, waits for k1 — held by X, which no
// longer waits. That is no cycle: Y waits until X lets go.
func TestDeadlockDetectorForgetsAPanickedWait(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := tenace.NewMemoryLockProvider()
		defer p.Close()
		var panicked atomic.Bool
		w := forwarding{p: p, panic: func(key string) bool { return key == "k2" && panicked.CompareAndSwap(false, true) }}
		lock := func(key string) tenace.Policy {
			return tenace.NewPolicy().WithLock(tenace.LockOptions{Provider: w, Key: key})
		}
		xHolds, xRelease := make(chan struct{}), make(chan struct{})
		errX := make(chan error, 1)
		go func() {
			errX <- lock("k1").Execute(bg, func(ctx context.Context) error {
				func() {
					defer func() { _ = recover() }()
					_ = lock("k2").Execute(ctx, func(context.Context) error { return nil })
				}()
				close(xHolds)
				<-xRelease
				return nil
			})
		}()
		<-xHolds
		holding, proceed := make(chan struct{}, 1), make(chan struct{})
		errY := holdThenWait(p, tenace.LockOptions{Provider: w, Key: "k2"}, tenace.LockOptions{Provider: w, Key: "k1"}, holding, proceed)
		<-holding
		close(proceed)
		synctest.Wait()
		select {
		case err := <-errY:
			t.Fatalf("Y returned %v while X holds k1 and waits for nothing", err)
		default:
		}
		close(xRelease)
		require.NoError(t, <-errX)
		require.NoError(t, <-errY)
		require.Zero(t, p.Size())
	})
}

// TestExecutionProperty: executions drawn by rapid nest Locks on keys and
// sets, return from them, and start from contexts kept past their Lock;
// every *DeadlockError is justified and no deadlock is left standing (see
// proptest.ExecutionProperty), in one synctest bubble.
func TestExecutionProperty(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rapid.Check(proptest.BubbleTB{T: t}, proptest.ExecutionProperty)
	})
}

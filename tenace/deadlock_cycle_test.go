package tenace_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"testing/synctest"

	"github.com/stretchr/testify/require"

	"tenace.dev/tenace"
)

// holdThenWait runs, on its own goroutine, an execution that holds outer
// and then, once go is closed, asks for inner with no Timeout; its error
// comes on the returned channel.
func holdThenWait(p *tenace.MemoryLockProvider, outer tenace.LockOptions, inner tenace.LockOptions, holding chan<- struct{}, proceed <-chan struct{}) <-chan error {
	outer.Provider, inner.Provider = p, p
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
					require.ErrorContains(t, err, "form a cycle")
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
		held, err := p.Acquire(context.Background(), "k2", tenace.LockAcquireOptions{})
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
		require.NoError(t, held.Release(context.Background()))
		require.NoError(t, <-errc)
		// A waiter cancelled while it waits leaves the graph: the same
		// shape again is still no cycle.
		held, err = p.Acquire(context.Background(), "k2", tenace.LockAcquireOptions{})
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
		require.NoError(t, held.Release(context.Background()))
		require.Zero(t, p.Size())
	})
}

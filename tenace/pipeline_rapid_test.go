package tenace_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"

	"tenace.dev/tenace"
)

// execution is one drawn call: a policy shape and how its context behaves.
type execution struct {
	key          string // execution key; "" if the outer lock names its own
	outerKey     string // the outer lock's own key, or ""
	nestedKey    string // an inner lock with a distinct key, or ""
	timeoutFirst bool   // WithTimeout before (inside) the lock, else after (outside)
	withTimeout  bool
	noWait       bool
	preCancelled bool // the context ended before Execute
}

func drawExecution(rt *rapid.T, i int) execution {
	keys := []string{"a", "b", "c"}
	e := execution{
		withTimeout:  rapid.Bool().Draw(rt, fmt.Sprint("timeout", i)),
		timeoutFirst: rapid.Bool().Draw(rt, fmt.Sprint("timeoutFirst", i)),
		noWait:       rapid.Bool().Draw(rt, fmt.Sprint("noWait", i)),
		preCancelled: rapid.IntRange(0, 4).Draw(rt, fmt.Sprint("preCancelled", i)) == 0,
	}
	k := rapid.SampledFrom(keys).Draw(rt, fmt.Sprint("key", i))
	if rapid.Bool().Draw(rt, fmt.Sprint("keyOnLock", i)) {
		e.outerKey = k
	} else {
		e.key = k
	}
	if rapid.Bool().Draw(rt, fmt.Sprint("nested", i)) {
		e.nestedKey = "nested-" + k // distinct from every outer key
	}
	return e
}

func (e execution) policy(p tenace.LockProvider) tenace.Policy {
	lockTimeout := time.Duration(0)
	if e.noWait {
		lockTimeout = tenace.NoWait
	}
	pol := tenace.NewPolicy()
	if e.nestedKey != "" {
		pol = pol.WithLock(tenace.LockOptions{Provider: p, Key: e.nestedKey})
	}
	if e.withTimeout && e.timeoutFirst {
		pol = pol.WithTimeout(time.Hour)
	}
	pol = pol.WithLock(tenace.LockOptions{Provider: p, Key: e.outerKey, Timeout: lockTimeout})
	if e.withTimeout && !e.timeoutFirst {
		pol = pol.WithTimeout(time.Hour)
	}
	return pol
}

// TestPipelineProperty runs random policies (lock, timeout before or after,
// an inner lock with a distinct key, NoWait) over random concurrent
// executions, and checks that each key is held by at most one fn at a time,
// that fn never runs for a context that had ended before Execute, that every
// error is one the table allows, and that nothing is left held.
func TestPipelineProperty(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		p := tenace.NewMemoryLockProvider(tenace.WithShards(rapid.IntRange(1, 3).Draw(rt, "shards")))
		defer p.Close()
		n := rapid.IntRange(1, 12).Draw(rt, "executions")
		execs := make([]execution, n)
		for i := range execs {
			execs[i] = drawExecution(rt, i)
		}
		var inside sync.Map // key → *atomic.Int32: fns running under that key
		counter := func(k string) *atomic.Int32 {
			c, _ := inside.LoadOrStore(k, new(atomic.Int32))
			return c.(*atomic.Int32)
		}
		errs := make([]error, n)
		ran := make([]bool, n)
		var violations atomic.Int32
		var wg sync.WaitGroup
		for i, e := range execs {
			wg.Go(func() {
				ctx, cancel := context.WithCancel(context.Background())
				defer cancel()
				if e.preCancelled {
					cancel()
				}
				lockKey := e.outerKey
				if lockKey == "" {
					lockKey = e.key
				}
				opts := []tenace.ExecuteOption{}
				if e.key != "" {
					opts = append(opts, tenace.WithKey(e.key))
				}
				errs[i] = e.policy(p).Execute(ctx, func(ctx context.Context) error {
					ran[i] = true
					for _, k := range []string{lockKey, e.nestedKey} {
						if k != "" && counter(k).Add(1) != 1 {
							violations.Add(1)
						}
					}
					for _, k := range []string{lockKey, e.nestedKey} {
						if k != "" {
							counter(k).Add(-1)
						}
					}
					return nil
				}, opts...)
			})
		}
		wg.Wait()
		require.Zero(rt, violations.Load(), "two fns ran under one key at once")
		for i, e := range execs {
			err := errs[i]
			var nae *tenace.LockNotAcquiredError
			switch {
			case e.preCancelled:
				require.False(rt, ran[i], "execution %d: fn ran with a context that had ended", i)
				require.ErrorIs(rt, err, context.Canceled)
			case err == nil:
				require.True(rt, ran[i])
			case errors.As(err, &nae):
				require.True(rt, e.noWait, "execution %d: only NoWait locks give up here", i)
				require.False(rt, ran[i])
			default:
				rt.Fatalf("execution %d: unexpected error %v", i, err)
			}
		}
		require.NoError(rt, tenace.SyncProvider(p))
		require.Zero(rt, p.Size(), "nothing left held")
	})
}

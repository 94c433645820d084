package redislock_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"tenace.dev/tenace"
	"tenace.dev/tenace/redislock"
)

// TestFencedGetSetAdmitTheHighestTokenAndRefuseLower: the guard itself,
// token by token: a read raises the fence as a write does; an equal token
// passes (one holder's read, then its write); a lower one is refused with
// an error that wraps both ErrStaleToken and tenace.ErrLeaseLost.
func TestFencedGetSetAdmitTheHighestTokenAndRefuseLower(t *testing.T) {
	_, c := setup(t)
	_, err := redislock.FencedGet(bg, c, "r", 5)
	require.ErrorIs(t, err, redis.Nil, "nothing set yet")
	require.NoError(t, redislock.FencedSet(bg, c, "r", "a", 5))
	v, err := redislock.FencedGet(bg, c, "r", 5)
	require.NoError(t, err)
	require.Equal(t, "a", v)
	_, err = redislock.FencedGet(bg, c, "r", 7)
	require.NoError(t, err)
	err = redislock.FencedSet(bg, c, "r", "b", 6)
	require.ErrorIs(t, err, redislock.ErrStaleToken, "a write below a read's token")
	require.ErrorIs(t, err, tenace.ErrLeaseLost)
	require.ErrorContains(t, err, "6 is below 7")
	_, err = redislock.FencedGet(bg, c, "r", 6)
	require.ErrorIs(t, err, redislock.ErrStaleToken, "a read below")
	require.NoError(t, redislock.FencedSet(bg, c, "r", "c", 1<<53-1), "tokens as large as redislock's")
	require.ErrorIs(t, redislock.FencedSet(bg, c, "r", "d", 1<<53-2), redislock.ErrStaleToken, "compared exactly")
	require.ErrorContains(t, redislock.FencedSet(bg, c, "r", "d", 1<<53+1), "2^53")
	// FenceLua run by hand, by a program that does not check what it passes.
	hand := func(token, op string) error {
		return c.Eval(bg, redislock.FenceLua, []string{"r"}, token, op, "e").Err()
	}
	require.ErrorContains(t, hand(strconv.FormatUint(1<<53, 10), "SET"), `takes "get" or "set"`, "an operation it does not know")
	require.ErrorContains(t, hand(strconv.FormatUint(1<<53+1, 10), "set"), "no greater than 2^53", "a token that Lua would round to 2^53")
	require.ErrorContains(t, hand("12345678901234567", "set"), "no greater than 2^53", "17 digits")
	require.ErrorContains(t, hand("-1", "get"), "decimal token", "not digits")
	require.ErrorContains(t, hand("", "get"), "decimal token", "empty")
	got, err := c.HGetAll(bg, "r").Result()
	require.NoError(t, err)
	require.Equal(t, map[string]string{"value": "c", "fence": strconv.FormatUint(1<<53-1, 10)}, got, "refused calls changed nothing")
}

// TestFencedGetSetKeepARegisterLinearizable is the finding of issue 24,
// item 5, and its fix, on Redis. Clients increment a counter in Redis, each
// holding a redislock lock from its read to its write, while the test
// deletes the lock key under its holder (as the server does when a holder
// paused past its window), so that a holder that lost its lock goes on to
// write. On one run in eight the test holds the deposed holder's write
// until the next holder has read, and lets it land between that holder's
// read and its write (the interleaving that breaks a write-only guard); on
// another in eight it lets the deposed holder write at once, racing the
// next holder. porcupine checks each history, every read-modify-write one
// operation on a counter.
//
//   - fenced on every access (FencedGet and FencedSet), the history is
//     linearizable, and the counter ends at the number of acknowledged
//     increments;
//   - fenced on the write alone (a plain HGET, then FencedSet), it is not:
//     updates are lost.
func TestFencedGetSetKeepARegisterLinearizable(t *testing.T) {
	_, c := setup(t)
	for _, fenceReads := range []bool{true, false} {
		name := map[bool]string{true: "read and write fenced", false: "write fenced only"}[fenceReads]
		t.Run(name, func(t *testing.T) {
			key, register := "counter/"+name, "register/"+name
			parse := func(s string, err error) (int64, error) {
				if errors.Is(err, redis.Nil) {
					return 0, nil
				}
				if err != nil {
					return 0, err
				}
				return strconv.ParseInt(s, 10, 64)
			}
			res := runRegister(t, registerRun{
				provider: newProvider(t, c, redislock.WithRetryInterval(20*time.Millisecond)),
				key:      key,
				read: func(ctx context.Context, token uint64) (int64, error) {
					if fenceReads {
						return parse(redislock.FencedGet(ctx, c, register, token))
					}
					return parse(c.HGet(ctx, register, "value").Result())
				},
				write: func(ctx context.Context, token uint64, v int64) error {
					return redislock.FencedSet(ctx, c, register, strconv.FormatInt(v, 10), token)
				},
				depose: func(tenace.LockLease) error { // the key gone, and its waiters told
					if err := c.Del(bg, "tenace:lock:{"+key+"}").Err(); err != nil {
						return err
					}
					return c.Publish(bg, "tenace:lock:{"+key+"}:released", "1").Err()
				},
				final: func(ctx context.Context) (int64, error) {
					return parse(c.HGet(ctx, register, "value").Result())
				},
			})
			res.check(t, fenceReads)
		})
	}
}

// The counter and its model. Every read-modify-write is one operation: the
// value it read, and whether its write of that value + 1 was acknowledged.

// registerOps is how many read-modify-writes a test does, among
// registerClients clients; every registerFaultEvery-th one deposes its
// holder after the read and holds its write until the next holder has read,
// and the one halfway between two of them deposes its holder and lets it
// write at once.
const (
	registerOps        = 160
	registerClients    = 4
	registerFaultEvery = 8
)

type rmwOutput struct {
	read    int64
	wrote   bool // the write of read+1 was acknowledged
	refused bool // the read was refused: nothing observed, nothing done
}

var counterModel = porcupine.Model{
	Init: func() any { return int64(0) },
	Step: func(state, _, output any) (bool, any) {
		s, o := state.(int64), output.(rmwOutput)
		switch {
		case o.refused:
			return true, s
		case o.read != s:
			return false, s
		case o.wrote:
			return true, s + 1
		default: // a refused write: a read of s
			return true, s
		}
	},
	DescribeOperation: func(_, output any) string { return fmt.Sprintf("%+v", output.(rmwOutput)) },
}

// registerRun is what runRegister needs of a provider and a guard: read and
// write return an error wrapping tenace.ErrLeaseLost when the guard refuses
// the token; depose makes a held lease stale, so that another caller can be
// granted the lock while its holder goes on; final reads the counter
// without a guard once every client is done.
type registerRun struct {
	provider tenace.LockProvider
	key      string
	read     func(ctx context.Context, token uint64) (int64, error)
	write    func(ctx context.Context, token uint64, v int64) error
	depose   func(tenace.LockLease) error
	final    func(ctx context.Context) (int64, error)
}

type registerResult struct {
	history                         []porcupine.Operation
	acked, final                    int64 // acknowledged increments, and the counter at the end
	overlaps, staleRefused, refused int   // deposed writes let in between a read and a write; stale writes refused; reads refused
}

// staleWrite is a deposed holder's write, held until the next holder has
// read (write closed), then done.
type staleWrite struct{ write, done chan struct{} }

func runRegister(t *testing.T, r registerRun) registerResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(bg, 60*time.Second)
	defer cancel()
	start := time.Now()
	var (
		mu       sync.Mutex
		res      registerResult
		n        atomic.Int64
		finish   = make(chan struct{})      // the last run has been drawn: parked writes go on
		parked   = make(chan staleWrite, 1) // at most one deposed holder waits
		failures = make(chan error, registerClients)
	)
	record := func(call int64, o rmwOutput, f func(*registerResult)) {
		mu.Lock()
		defer mu.Unlock()
		res.history = append(res.history, porcupine.Operation{Call: call, Return: time.Since(start).Nanoseconds(), Output: o})
		f(&res)
	}
	client := func() error {
		for {
			i := n.Add(1)
			if i > registerOps {
				if i == registerOps+1 {
					close(finish)
				}
				return nil
			}
			l, err := r.provider.Acquire(ctx, r.key, tenace.LockAcquireOptions{Timeout: 20 * time.Second})
			if err != nil || l == nil {
				return fmt.Errorf("acquire: %v (lease %v)", err, l)
			}
			token := l.(tenace.FencedLease).Token()
			call := time.Since(start).Nanoseconds()
			v, err := r.read(ctx, token)
			if errors.Is(err, tenace.ErrLeaseLost) {
				record(call, rmwOutput{refused: true}, func(r *registerResult) { r.refused++ })
				if err := l.Release(ctx); err != nil && !errors.Is(err, tenace.ErrLeaseLost) {
					return err
				}
				continue
			} else if err != nil {
				return fmt.Errorf("read: %w", err)
			}
			select {
			case s := <-parked: // a deposed holder writes between this read and this write
				close(s.write)
				<-s.done
				mu.Lock()
				res.overlaps++
				mu.Unlock()
			default:
			}
			var mine *staleWrite
			switch i % registerFaultEvery {
			case 0:
				s := staleWrite{make(chan struct{}), make(chan struct{})}
				select {
				case parked <- s: // parked before the deposition: the next holder's read finds it
					mine = &s
				default:
				}
				if err := r.depose(l); err != nil {
					return fmt.Errorf("depose: %w", err)
				}
				if mine != nil {
					select {
					case <-s.write:
					case <-finish:
					case <-ctx.Done():
					}
				}
			case registerFaultEvery / 2:
				if err := r.depose(l); err != nil {
					return fmt.Errorf("depose: %w", err)
				}
			}
			err = r.write(ctx, token, v+1)
			if mine != nil {
				close(mine.done)
			}
			switch {
			case err == nil:
				record(call, rmwOutput{read: v, wrote: true}, func(r *registerResult) { r.acked++ })
			case errors.Is(err, tenace.ErrLeaseLost):
				record(call, rmwOutput{read: v}, func(r *registerResult) { r.staleRefused++ })
			default:
				return fmt.Errorf("write: %w", err)
			}
			if err := l.Release(ctx); err != nil && !errors.Is(err, tenace.ErrLeaseLost) {
				return fmt.Errorf("release: %w", err)
			}
		}
	}
	var wg sync.WaitGroup
	for range registerClients {
		wg.Go(func() {
			if err := client(); err != nil {
				cancel() // the other clients stop too
				failures <- err
			}
		})
	}
	wg.Wait()
	close(failures)
	for err := range failures {
		require.NoError(t, err)
	}
	call := time.Since(start).Nanoseconds()
	final, err := r.final(ctx)
	require.NoError(t, err)
	res.final = final
	record(call, rmwOutput{read: final}, func(*registerResult) {})
	return res
}

// check asserts what the guard promises: with reads fenced, a linearizable
// history and no lost update, every deposed write let in between a read and
// a write refused; with writes fenced alone, neither.
func (res registerResult) check(t *testing.T, fenceReads bool) {
	t.Helper()
	verdict := porcupine.CheckOperationsTimeout(counterModel, res.history, 20*time.Second)
	t.Logf("%d operations: %d increments acknowledged, counter %d (%d lost); %d deposed writes let in between a read and a write, %d stale writes and %d reads refused; porcupine: %s",
		len(res.history), res.acked, res.final, res.acked-res.final, res.overlaps, res.staleRefused, res.refused, verdict)
	require.Positive(t, res.overlaps, "no deposed holder wrote between another's read and write: the run tested nothing")
	if fenceReads {
		require.Equal(t, porcupine.Ok, verdict, "fenced on every access, the history is linearizable")
		require.Equal(t, res.acked, res.final, "no acknowledged increment is lost")
		require.GreaterOrEqual(t, res.staleRefused, res.overlaps, "every write let in after a newer holder's read is refused")
		return
	}
	require.Equal(t, porcupine.Illegal, verdict, "fenced on writes alone, a read-modify-write is not linearizable")
	require.Greater(t, res.acked, res.final, "updates are lost")
}

// Package fencecheck is the fencing test the distributed providers share:
// clients increment a counter, each holding the provider's lock from its
// read to its write, while the test deposes holders (as a server does when
// a holder paused past its lease) so that a holder that lost its lock goes
// on to write. On one run in eight the test holds the deposed holder's
// write until the next holder has read, and lets it land between that
// holder's read and its write (the interleaving that breaks a write-only
// guard); on another in eight it lets the deposed holder write at once,
// racing the next holder.
//
// Every read-modify-write is one operation of the history: the value it
// read, and whether its write of that value + 1 was acknowledged. The
// history is checked by the caller's linearizability checker (porcupine, in
// the providers' tests, which this package does not import so that the
// core module does not require it): Init, Step and Describe are the
// counter's model, and Convert turns the history into the checker's
// operations.
package fencecheck

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"tenace.dev/tenace"
)

// ops is how many read-modify-writes a run does, among clients clients;
// every faultEvery-th one deposes its holder after the read and holds its
// write until the next holder has read, and the one halfway between two of
// them deposes its holder and lets it write at once.
const (
	ops        = 160
	clients    = 4
	faultEvery = 8
)

// Output is what one read-modify-write observed.
type Output struct {
	Read    int64
	Wrote   bool // the write of Read+1 was acknowledged
	Refused bool // the read was refused: nothing observed, nothing done
}

// Op is one read-modify-write of the history: when it was called and when
// it returned, in ns from the run's start, and what it observed.
type Op struct {
	Call, Return int64
	Output       Output
}

// Init is the counter's initial state, for a checker's model.
func Init() any { return int64(0) }

// Step is the counter's step, for a checker's model: output (an Output)
// from state (an int64) is legal if it read state, and moves it to
// state+1 if its write was acknowledged.
func Step(state, _, output any) (bool, any) {
	s, o := state.(int64), output.(Output)
	switch {
	case o.Refused:
		return true, s
	case o.Read != s:
		return false, s
	case o.Wrote:
		return true, s + 1
	default: // a refused write: a read of s
		return true, s
	}
}

// Describe describes an operation by its output, for a checker's model.
func Describe(_, output any) string { return fmt.Sprintf("%+v", output.(Output)) }

// Convert returns the history as a checker's operations, each made by op
// from an Op's call, return and output.
func Convert[T any](history []Op, op func(call, ret int64, output any) T) []T {
	out := make([]T, len(history))
	for i, o := range history {
		out[i] = op(o.Call, o.Return, o.Output)
	}
	return out
}

// Register is what Run needs of a provider and a guard: Read and Write
// return an error wrapping tenace.ErrLeaseLost when the guard refuses the
// token; Depose makes a held lease stale, so that another caller can be
// granted the lock while its holder goes on; Final reads the counter
// without a guard once every client is done.
type Register struct {
	Provider tenace.LockProvider
	Key      string
	Read     func(ctx context.Context, token uint64) (int64, error)
	Write    func(ctx context.Context, token uint64, v int64) error
	Depose   func(tenace.LockLease) error
	Final    func(ctx context.Context) (int64, error)
}

// Result is a run's history and what it counted.
type Result struct {
	History                         []Op
	Acked, Final                    int64 // acknowledged increments, and the counter at the end
	Overlaps, StaleRefused, Refused int   // deposed writes let in between a read and a write; stale writes refused; reads refused
}

// staleWrite is a deposed holder's write, held until the next holder has
// read (write closed), then done.
type staleWrite struct{ write, done chan struct{} }

// Run runs the clients against r and returns the history; it fails t if a
// client fails other than by a refusal of the guard.
func Run(t *testing.T, r Register) Result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	start := time.Now()
	var (
		mu       sync.Mutex
		res      Result
		n        atomic.Int64
		finish   = make(chan struct{})      // the last run has been drawn: parked writes go on
		parked   = make(chan staleWrite, 1) // at most one deposed holder waits
		failures = make(chan error, clients)
	)
	record := func(call int64, o Output, f func(*Result)) {
		mu.Lock()
		defer mu.Unlock()
		res.History = append(res.History, Op{Call: call, Return: time.Since(start).Nanoseconds(), Output: o})
		f(&res)
	}
	client := func() error {
		for {
			i := n.Add(1)
			if i > ops {
				if i == ops+1 {
					close(finish)
				}
				return nil
			}
			l, err := r.Provider.Acquire(ctx, r.Key, tenace.LockAcquireOptions{Timeout: 20 * time.Second})
			if err != nil || l == nil {
				return fmt.Errorf("acquire: %v (lease %v)", err, l)
			}
			token := l.(tenace.FencedLease).Token()
			call := time.Since(start).Nanoseconds()
			v, err := r.Read(ctx, token)
			if errors.Is(err, tenace.ErrLeaseLost) {
				record(call, Output{Refused: true}, func(r *Result) { r.Refused++ })
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
				res.Overlaps++
				mu.Unlock()
			default:
			}
			var mine *staleWrite
			switch i % faultEvery {
			case 0:
				s := staleWrite{make(chan struct{}), make(chan struct{})}
				select {
				case parked <- s: // parked before the deposition: the next holder's read finds it
					mine = &s
				default:
				}
				if err := r.Depose(l); err != nil {
					return fmt.Errorf("depose: %w", err)
				}
				if mine != nil {
					select {
					case <-s.write:
					case <-finish:
					case <-ctx.Done():
					}
				}
			case faultEvery / 2:
				if err := r.Depose(l); err != nil {
					return fmt.Errorf("depose: %w", err)
				}
			}
			err = r.Write(ctx, token, v+1)
			if mine != nil {
				close(mine.done)
			}
			switch {
			case err == nil:
				record(call, Output{Read: v, Wrote: true}, func(r *Result) { r.Acked++ })
			case errors.Is(err, tenace.ErrLeaseLost):
				record(call, Output{Read: v}, func(r *Result) { r.StaleRefused++ })
			default:
				return fmt.Errorf("write: %w", err)
			}
			if err := l.Release(ctx); err != nil && !errors.Is(err, tenace.ErrLeaseLost) {
				return fmt.Errorf("release: %w", err)
			}
		}
	}
	var wg sync.WaitGroup
	for range clients {
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
	final, err := r.Final(ctx)
	require.NoError(t, err)
	res.Final = final
	record(call, Output{Read: final}, func(*Result) {})
	return res
}

// Check asserts what the guard promises, given the checker's verdict on
// the history ("Ok", "Illegal" or "Unknown", porcupine's words): with
// reads fenced, a linearizable history and no lost update, every deposed
// write let in between a read and a write refused; with writes fenced
// alone, neither.
func (res Result) Check(t *testing.T, fenceReads bool, verdict string) {
	t.Helper()
	t.Logf("%d operations: %d increments acknowledged, counter %d (%d lost); %d deposed writes let in between a read and a write, %d stale writes and %d reads refused; linearizable: %s",
		len(res.History), res.Acked, res.Final, res.Acked-res.Final, res.Overlaps, res.StaleRefused, res.Refused, verdict)
	require.Positive(t, res.Overlaps, "no deposed holder wrote between another's read and write: the run tested nothing")
	if fenceReads {
		require.Equal(t, "Ok", verdict, "fenced on every access, the history is linearizable")
		require.Equal(t, res.Acked, res.Final, "no acknowledged increment is lost")
		require.GreaterOrEqual(t, res.StaleRefused, res.Overlaps, "every write let in after a newer holder's read is refused")
		return
	}
	require.Equal(t, "Illegal", verdict, "fenced on writes alone, a read-modify-write is not linearizable")
	require.Greater(t, res.Acked, res.Final, "updates are lost")
}

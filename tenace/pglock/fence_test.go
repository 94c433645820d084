package pglock_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"tenace.dev/tenace"
	"tenace.dev/tenace/pglock"
)

// TestFenceAdmitsTheHighestTokenAndRefusesLower: the check itself, token by
// token: a read raises the fence as a write does; an equal token passes
// (one holder's read, then its write); a lower one is refused with an error
// that wraps both ErrStaleToken and tenace.ErrLeaseLost.
func TestFenceAdmitsTheHighestTokenAndRefusesLower(t *testing.T) {
	db := fenceDB(t)
	resource := keyOf(t, "r")
	fence := func(token uint64) error {
		return pgx.BeginFunc(bg, db, func(tx pgx.Tx) error { return pglock.Fence(bg, tx, resource, token) })
	}
	require.NoError(t, fence(5), "the first token")
	require.NoError(t, fence(5), "the same token again")
	require.NoError(t, fence(7))
	err := fence(6)
	require.ErrorIs(t, err, pglock.ErrStaleToken)
	require.ErrorIs(t, err, tenace.ErrLeaseLost)
	require.ErrorContains(t, err, resource)
	require.NoError(t, fence(7))
	require.ErrorContains(t, fence(math.MaxInt64+1), "bigint")
	var highest int64
	require.NoError(t, db.QueryRow(bg, `SELECT token FROM tenace_fences WHERE resource = $1`, resource).Scan(&highest))
	require.EqualValues(t, 7, highest, "a refused token leaves the fence as it was")
}

// TestFenceMakesAConcurrentAccessWaitForTheOneBefore: Fence locks the
// resource's row until its transaction ends, so a fenced read that comes
// while a fenced write is uncommitted waits, and then sees the write (READ
// COMMITTED) or fails with a serialization error (REPEATABLE READ) — never
// the value from before the write. A stale write that waited is refused
// once the newer read has committed.
func TestFenceMakesAConcurrentAccessWaitForTheOneBefore(t *testing.T) {
	db := fenceDB(t)
	_, err := db.Exec(bg, `CREATE TABLE IF NOT EXISTS fence_register (id text PRIMARY KEY, value bigint NOT NULL)`)
	require.NoError(t, err)
	for _, iso := range []pgx.TxIsoLevel{pgx.ReadCommitted, pgx.RepeatableRead} {
		t.Run(string(iso), func(t *testing.T) {
			key := keyOf(t, "r")
			_, err := db.Exec(bg, `INSERT INTO fence_register VALUES ($1, 0)`, key)
			require.NoError(t, err)
			write, err := db.Begin(bg)
			require.NoError(t, err)
			defer func() { _ = write.Rollback(bg) }()
			require.NoError(t, pglock.Fence(bg, write, key, 5))
			_, err = write.Exec(bg, `UPDATE fence_register SET value = 1 WHERE id = $1`, key)
			require.NoError(t, err)

			type readResult struct {
				v   int64
				err error
			}
			read := make(chan readResult, 1) // the goroutine never blocks on it
			go func() {
				var v int64
				err := pgx.BeginTxFunc(bg, db, pgx.TxOptions{IsoLevel: iso}, func(tx pgx.Tx) error {
					if err := pglock.Fence(bg, tx, key, 6); err != nil {
						return err
					}
					return tx.QueryRow(bg, `SELECT value FROM fence_register WHERE id = $1`, key).Scan(&v)
				})
				read <- readResult{v, err}
			}()
			waitForFenceWaiters(t, db, 1)
			require.NoError(t, write.Commit(bg))
			got := <-read
			if iso == pgx.ReadCommitted {
				require.NoError(t, got.err)
				require.EqualValues(t, 1, got.v, "the read that waited sees the write it waited for")

				newer, err := db.Begin(bg)
				require.NoError(t, err)
				defer func() { _ = newer.Rollback(bg) }()
				require.NoError(t, pglock.Fence(bg, newer, key, 7))
				stale := make(chan error, 1) // the goroutine never blocks on it
				go func() {
					stale <- pgx.BeginFunc(bg, db, func(tx pgx.Tx) error { return pglock.Fence(bg, tx, key, 6) })
				}()
				waitForFenceWaiters(t, db, 1)
				require.NoError(t, newer.Commit(bg))
				require.ErrorIs(t, <-stale, pglock.ErrStaleToken, "an older token that waited is refused once the newer one committed")
			} else {
				var pgErr *pgconn.PgError
				require.ErrorAs(t, got.err, &pgErr)
				require.Equal(t, "40001", pgErr.Code, "a serialization failure, to retry")
			}
		})
	}
}

// waitForFenceWaiters waits until n sessions wait for a row lock on the
// fence table. No event tells when a statement waits for a lock, so this
// asks pg_stat_activity until it says so (as PostgreSQL's own isolation
// tester does), within 20 s.
func waitForFenceWaiters(t *testing.T, db *pgxpool.Pool, n int) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		var waiting int
		require.NoError(t, db.QueryRow(bg, `SELECT count(*) FROM pg_stat_activity
WHERE wait_event_type = 'Lock' AND query LIKE 'INSERT INTO tenace_fences%'`).Scan(&waiting))
		if waiting == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d sessions wait for the fence's row lock, not %d, after 20s", waiting, n)
		}
		time.Sleep(5 * time.Millisecond) // polling interval, not synchronisation
	}
}

// TestFenceOnEveryAccessKeepsARegisterLinearizable is the finding of issue
// 24, item 5, and its fix. Clients increment a counter in PostgreSQL, each
// holding a pglock lock from its read to its write, while the test
// terminates lock-holding backends (pg_terminate_backend) under them, so
// that a holder that lost its lock goes on to write. On one run in eight
// the test holds the deposed holder's write until the next holder has read,
// and lets it land between that holder's read and its write (the
// interleaving that broke the write-only guard); on another in eight it
// lets the deposed holder write at once, racing the next holder. porcupine checks each
// history, every read-modify-write one operation on a counter.
//
//   - fenced on every access (Fence in the read's transaction and in the
//     write's), the history is linearizable, and the counter ends at the
//     number of acknowledged increments;
//   - fenced on the write alone (the pattern "a resource that records the
//     highest token it accepted"), it is not: updates are lost.
func TestFenceOnEveryAccessKeepsARegisterLinearizable(t *testing.T) {
	srv := server(t)
	db := fenceDB(t) // the superuser's, as srv's
	_, err := db.Exec(bg, `CREATE TABLE IF NOT EXISTS fence_register (id text PRIMARY KEY, value bigint NOT NULL)`)
	require.NoError(t, err)
	for _, fenceReads := range []bool{true, false} {
		name := map[bool]string{true: "read and write fenced", false: "write fenced only"}[fenceReads]
		t.Run(name, func(t *testing.T) {
			key := keyOf(t, "counter")
			_, err := db.Exec(bg, `INSERT INTO fence_register VALUES ($1, 0)`, key)
			require.NoError(t, err)
			// access runs one transaction on the register, fenced or not.
			access := func(ctx context.Context, token uint64, fenced bool, sql string, args ...any) (v int64, err error) {
				err = pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
					if fenced {
						if err := pglock.Fence(ctx, tx, key, token); err != nil {
							return err
						}
					}
					return tx.QueryRow(ctx, sql, append([]any{key}, args...)...).Scan(&v)
				})
				return v, err
			}
			res := runRegister(t, registerRun{
				provider: newProvider(t, srv),
				key:      key,
				read: func(ctx context.Context, token uint64) (int64, error) {
					return access(ctx, token, fenceReads, `SELECT value FROM fence_register WHERE id = $1`)
				},
				write: func(ctx context.Context, token uint64, v int64) error {
					_, err := access(ctx, token, true, `UPDATE fence_register SET value = $2 WHERE id = $1 RETURNING value`, v)
					return err
				},
				depose: func(l tenace.LockLease) error { // as srv.Terminate, on a pooled connection
					var ended bool
					err := db.QueryRow(bg, `SELECT pg_terminate_backend($1, 10000)`, int64(pglock.BackendPID(l))).Scan(&ended)
					if err == nil && !ended {
						err = errors.New("pg_terminate_backend returned false")
					}
					return err
				},
				final: func(ctx context.Context) (v int64, err error) {
					return v, db.QueryRow(ctx, `SELECT value FROM fence_register WHERE id = $1`, key).Scan(&v)
				},
			})
			res.check(t, fenceReads)
		})
	}
}

// fenceDB returns a pool on the shared server, for the guarded data, with
// the fence table created.
func fenceDB(t *testing.T) *pgxpool.Pool {
	t.Helper()
	db, err := pgxpool.New(bg, server(t).ConnString())
	require.NoError(t, err)
	t.Cleanup(db.Close)
	_, err = db.Exec(bg, pglock.FenceSchema)
	require.NoError(t, err)
	return db
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

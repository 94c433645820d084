package pglock_test

import (
	"context"
	"errors"
	"math"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"tenace.dev/internal/fencecheck"
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
			res := fencecheck.Run(t, fencecheck.Register{
				Provider: newProvider(t, srv),
				Key:      key,
				Read: func(ctx context.Context, token uint64) (int64, error) {
					return access(ctx, token, fenceReads, `SELECT value FROM fence_register WHERE id = $1`)
				},
				Write: func(ctx context.Context, token uint64, v int64) error {
					_, err := access(ctx, token, true, `UPDATE fence_register SET value = $2 WHERE id = $1 RETURNING value`, v)
					return err
				},
				Depose: func(l tenace.LockLease) error { // as srv.Terminate, on a pooled connection
					var ended bool
					err := db.QueryRow(bg, `SELECT pg_terminate_backend($1, 10000)`, int64(pglock.BackendPID(l))).Scan(&ended)
					if err == nil && !ended {
						err = errors.New("pg_terminate_backend returned false")
					}
					return err
				},
				Final: func(ctx context.Context) (v int64, err error) {
					return v, db.QueryRow(ctx, `SELECT value FROM fence_register WHERE id = $1`, key).Scan(&v)
				},
			})
			res.Check(t, fenceReads, linearizable(res.History))
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

// linearizable is porcupine's verdict on a fencecheck history.
func linearizable(h []fencecheck.Op) string {
	model := porcupine.Model{Init: fencecheck.Init, Step: fencecheck.Step, DescribeOperation: fencecheck.Describe}
	ops := fencecheck.Convert(h, func(call, ret int64, o any) porcupine.Operation {
		return porcupine.Operation{Call: call, Return: ret, Output: o}
	})
	return string(porcupine.CheckOperationsTimeout(model, ops, 20*time.Second))
}

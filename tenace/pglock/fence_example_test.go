package pglock_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"tenace.dev/tenace"
	"tenace.dev/tenace/pglock"
)

// A counter in PostgreSQL, incremented under a lock, with the lease's
// fencing token checked on the read and on the write, each in its own
// transaction: a holder whose lock has passed to another (its session
// ended, say, while it worked) can no longer write once the new holder has
// read. The data need not be in the lock's database; the fence table must
// be in the data's.
func ExampleFence() {
	ctx := context.Background()
	locks, err := pglock.New(ctx, exampleConnString())
	if err != nil {
		fmt.Println(err)
		return
	}
	defer locks.Close()
	db, err := pgxpool.New(ctx, exampleConnString())
	if err != nil {
		fmt.Println(err)
		return
	}
	defer db.Close()
	for _, sql := range []string{
		pglock.FenceSchema, // once, with the application's own schema
		`CREATE TABLE IF NOT EXISTS example_counters (name text PRIMARY KEY, n bigint NOT NULL)`,
		`INSERT INTO example_counters VALUES ('visits', 0) ON CONFLICT DO NOTHING`,
	} {
		if _, err := db.Exec(ctx, sql); err != nil {
			fmt.Println(err)
			return
		}
	}

	var token uint64
	p := tenace.NewPolicy().WithLock(tenace.LockOptions{Provider: locks, Key: "example/visits"})
	err = p.Execute(ctx, func(ctx context.Context) error {
		token, _ = tenace.TokenFrom(ctx)
		var n int64
		err := pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error { // the read, fenced
			if err := pglock.Fence(ctx, tx, "visits", token); err != nil {
				return err
			}
			return tx.QueryRow(ctx, `SELECT n FROM example_counters WHERE name = 'visits'`).Scan(&n)
		})
		if err != nil {
			return err
		}
		return pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error { // the write, fenced too
			if err := pglock.Fence(ctx, tx, "visits", token); err != nil {
				return err // wraps pglock.ErrStaleToken: a newer holder has been here
			}
			_, err := tx.Exec(ctx, `UPDATE example_counters SET n = $1 WHERE name = 'visits'`, n+1)
			return err
		})
	})
	fmt.Println("incremented:", err)

	// A holder with an older token is refused, on a read as on a write.
	err = pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error { return pglock.Fence(ctx, tx, "visits", token-1) })
	fmt.Println("an older holder refused:", errors.Is(err, pglock.ErrStaleToken), errors.Is(err, tenace.ErrLeaseLost))
	// Output:
	// incremented: <nil>
	// an older holder refused: true true
}

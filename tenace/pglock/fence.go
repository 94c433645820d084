package pglock

import (
	"context"
	"errors"
	"fmt"
	"math"

	"github.com/jackc/pgx/v5"

	"tenace.dev/tenace"
)

// FenceSchema creates the table in which Fence records, per resource, the
// highest fencing token the resource has admitted. Run it once, in the
// database that holds the guarded data (it is idempotent):
//
//	_, err := pool.Exec(ctx, pglock.FenceSchema)
//
// A row is one resource: a name of your choosing (the lock's key is a good
// one) and its highest token. Rows must outlive every holder that may still
// write: a deleted row admits any token again.
const FenceSchema = `CREATE TABLE IF NOT EXISTS tenace_fences (
	resource text PRIMARY KEY,
	token    bigint NOT NULL
)`

// FenceSQL is the check Fence runs, for programs that do not use pgx (with
// database/sql, say) or SQL written by hand: $1 is the resource, $2 the
// holder's fencing token. It returns one row when the token is admitted —
// the resource's highest token is raised to it, and the row stays locked
// until the transaction ends — and no row when the resource has already
// admitted a higher one: then roll back.
const FenceSQL = `INSERT INTO tenace_fences AS f (resource, token) VALUES ($1, $2)
ON CONFLICT (resource) DO UPDATE SET token = excluded.token WHERE f.token <= excluded.token
RETURNING f.token`

// ErrStaleToken is what Fence returns, wrapped, when the resource has
// already admitted a higher fencing token than the caller's: a newer holder
// of the lock has read or written it, so the caller's lease is lost
// (errors.Is(err, tenace.ErrLeaseLost) is true). Roll the transaction back
// and stop; retrying with the same token fails the same way.
var ErrStaleToken = fmt.Errorf("pglock: stale fencing token, the resource has admitted a higher one from a newer holder of the lock: %w", tenace.ErrLeaseLost)

// Fence guards one access to resource by a holder whose lease carries token
// (tenace.FencedLease's Token). Call it first in the transaction of every
// read and every write of the guarded data, and do the access in the same
// transaction, tx:
//
//   - the token is admitted when it is at least the highest one the
//     resource has admitted before; it becomes the highest. Reads raise it
//     too, so that a holder whose lock has passed to another cannot write
//     after the new holder has read: its write would land between the new
//     holder's read and write, and one of the two updates would be lost.
//   - a lower token is refused: Fence returns an error wrapping
//     ErrStaleToken, and the transaction must be rolled back.
//
// Fenced on writes alone, a read-modify-write is not safe; fenced on every
// access it is (both tested with a linearizability checker, with the lock
// holders' sessions terminated under them).
//
// The check locks the resource's row until tx ends, so fenced accesses to
// one resource run one at a time; an access that waits for the row sees
// what the one before it committed. That holds at READ COMMITTED, the
// default; at REPEATABLE READ or SERIALIZABLE, an access that had to wait
// fails with a serialization error instead (retry it, as such errors ask).
// A holder that pauses inside a fenced transaction (its lock lost
// meanwhile) holds up the next holder's Fence until that transaction ends:
// bound it with idle_in_transaction_session_timeout on the data's
// sessions, and the wait with lock_timeout or ctx.
// The table must exist (FenceSchema). resource is any valid UTF-8 text
// without NUL. A token above the bigint range is refused with an error.
// Fence takes any provider's tokens, as long as one lock (one provider,
// one key) guards the resource: tokens of different locks do not compare.
// FenceSQL is the same check as SQL.
func Fence(ctx context.Context, tx pgx.Tx, resource string, token uint64) error {
	if token > math.MaxInt64 {
		return fmt.Errorf("pglock: Fence: token %d does not fit the fence table's bigint; PostgreSQL tokens never exceed it, so pass the lease's own Token", token)
	}
	var admitted int64
	err := tx.QueryRow(ctx, FenceSQL, resource, int64(token)).Scan(&admitted)
	if errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("%w (resource %q, token %d)", ErrStaleToken, resource, token)
	}
	if err != nil {
		return fmt.Errorf("pglock: Fence(%q, %d): %w", resource, token, err)
	}
	return nil
}

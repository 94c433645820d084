package pglock_test

import (
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"tenace.dev/tenace"
)

// TestARaceOfGrantAndLockTimeout: PostgreSQL can fail a wait with a lock
// timeout although the lock was granted (the grant lands as the timeout
// fires), and the session keeps the lock. Here a session takes the lock
// by hand, as such a grant leaves it; then:
//
//   - the wait again (with time left) counts it granted, fenced, and does
//     not take it a second time: one unlock frees the key;
//   - the drop (no time left) gives it back: the key is free.
//
// Without either, a pooled connection kept the lock (seen in
// TestSharedStress).
func TestARaceOfGrantAndLockTimeout(t *testing.T) {
	srv := server(t)
	p := newProvider(t, srv)
	key := keyOf(t, "k")
	l := mustAcquire(t, p, key, tenace.LockAcquireOptions{})
	token := l.(tenace.FencedLease).Token()
	require.NoError(t, l.Release(bg))
	conn, err := pgx.Connect(bg, srv.ConnString())
	require.NoError(t, err)
	defer conn.Close(bg)
	retry, drop := p.RaceSQL()
	free := func() bool {
		l, err := p.Acquire(bg, key, tenace.LockAcquireOptions{Timeout: tenace.NoWait})
		require.NoError(t, err)
		if l != nil {
			require.NoError(t, l.Release(bg))
		}
		return l != nil
	}
	raced := func() {
		_, err := conn.Exec(bg, `SELECT pg_advisory_lock($2::int4, id) FROM tenace_lock_keys WHERE key = $1`, []byte(key), p.ClassID())
		require.NoError(t, err)
		require.False(t, free(), "the raced grant holds the key")
	}

	raced()
	var id *int32
	var locked bool
	var fence *int64
	var heldBy any // the statement's last column: the holders a refusal names
	require.NoError(t, conn.QueryRow(bg, retry, []byte(key), p.ClassID(), "100", "race test").Scan(&id, &locked, &fence, &heldBy))
	require.True(t, locked, "the wait again counts the raced grant")
	require.NotNil(t, fence)
	require.Greater(t, uint64(*fence), token, "and fences it")
	_, err = conn.Exec(bg, `SELECT pg_advisory_unlock($1::int4, $2)`, p.ClassID(), *id)
	require.NoError(t, err)
	require.True(t, free(), "one unlock frees the key: the wait again did not take it twice")

	raced()
	_, err = conn.Exec(bg, drop, []byte(key), p.ClassID())
	require.NoError(t, err)
	require.True(t, free(), "the drop gave the raced grant back")
	_, err = conn.Exec(bg, drop, []byte(key), p.ClassID())
	require.NoError(t, err, "a drop of a lock not held does nothing")
}

package pglock_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"tenace.dev/internal/pgtest"
	"tenace.dev/tenace"
	"tenace.dev/tenace/pglock"
)

// asyncServer is a server of the test's own whose commits are
// asynchronous (synchronous_commit off) and whose WAL writer waits 10 s
// between flushes: a commit's WAL reaches the disk only when a synchronous
// commit flushes it, or 10 s later. A crash (Kill) within those 10 s loses
// what was committed asynchronously — the server's clock is the point.
// b, a provider, has created the table and registered a key, and one of
// its fenced grants flushed the WAL (the sequence of ids logs 32 values
// ahead: the next rows' ids come from that range, so that a row lost in
// the crash and added again after it gets a new id).
func asyncServer(t *testing.T) (srv *pgtest.Server, b *pglock.Provider) {
	t.Helper()
	srv = pgtest.Start(t)
	srv.MustExec(t, "ALTER SYSTEM SET synchronous_commit = off")
	srv.MustExec(t, "ALTER SYSTEM SET wal_writer_delay = '10s'")
	srv.MustExec(t, "SELECT pg_reload_conf()")
	b = newProvider(t, srv)
	require.NoError(t, mustAcquire(t, b, keyOf(t, "warm"), tenace.LockAcquireOptions{}).Release(bg))
	require.NoError(t, mustAcquire(t, b, keyOf(t, "warm"), tenace.LockAcquireOptions{}).Release(bg))
	return srv, b
}

// rows counts key's rows in the table of keys.
func rows(t *testing.T, srv *pgtest.Server, key string) string {
	t.Helper()
	return srv.MustExec(t, fmt.Sprintf("SELECT count(*) FROM tenace_lock_keys WHERE key = convert_to(%s, 'UTF8')", quote(key)))
}

// TestKeyRowSurvivesACrash: a key's row, registered by its first grant,
// commits synchronously whatever the server's synchronous_commit: a crash
// right after the grant keeps it (its id is cached by the provider, and
// must stay the key's). The provider is WithoutFencing, whose grants write
// nothing that would flush the row with them.
func TestKeyRowSurvivesACrash(t *testing.T) {
	srv, _ := asyncServer(t)
	a := newProvider(t, srv, pglock.WithoutFencing())
	key := keyOf(t, "k")
	require.NoError(t, mustAcquire(t, a, key, tenace.LockAcquireOptions{}).Release(bg))
	require.Equal(t, "1", rows(t, srv, key))
	srv.Kill()
	srv.Restart(t)
	require.Equal(t, "1", rows(t, srv, key), "the key's row, registered by a grant, was lost in a crash")
}

// TestCachedIDForgottenAfterACrash: a provider that learned a key's id
// from a row that a crash then loses (a row committed asynchronously by
// someone else: here the test's own INSERT; an older version's
// registration; a replica behind its primary at a failover) must not lock
// that id after the crash: the key, registered again by another provider,
// has a new id, and the two would hold one key at once. The provider
// forgets every id when it opens a connection. WithoutFencing: a fenced
// grant flushes the WAL before it answers when the flush is behind, which
// would save the row.
func TestCachedIDForgottenAfterACrash(t *testing.T) {
	srv, b := asyncServer(t)
	a := newProvider(t, srv, pglock.WithoutFencing())
	key := keyOf(t, "k")
	srv.MustExec(t, fmt.Sprintf("INSERT INTO tenace_lock_keys (key) VALUES (convert_to(%s, 'UTF8'))", quote(key)))
	for range 2 { // the first grant learns the id, the second locks by it
		require.NoError(t, mustAcquire(t, a, key, tenace.LockAcquireOptions{}).Release(bg))
	}
	idBefore := srv.MustExec(t, fmt.Sprintf("SELECT id FROM tenace_lock_keys WHERE key = convert_to(%s, 'UTF8')", quote(key)))
	srv.Kill()
	srv.Restart(t)
	require.Equal(t, "0", rows(t, srv, key), "the asynchronously committed row survived the crash: the test proves nothing")
	held := mustAcquire(t, b, key, tenace.LockAcquireOptions{Timeout: 10 * time.Second})
	defer func() { _ = held.Release(bg) }()
	idAfter := srv.MustExec(t, fmt.Sprintf("SELECT id FROM tenace_lock_keys WHERE key = convert_to(%s, 'UTF8')", quote(key)))
	require.NotEqual(t, idBefore, idAfter, "the key's new row has its old id: the test proves nothing")
	requireRefusedAfterCrash(t, a, key, "its id %s before the crash, %s after", idBefore, idAfter)
}

// requireRefusedAfterCrash asks a for key, held by another provider, at
// once — past the dead connections a's pool may hand out first — and
// fails t if a is granted it: two providers would hold the key at once.
func requireRefusedAfterCrash(t *testing.T, a *pglock.Provider, key, why string, args ...any) {
	t.Helper()
	var got tenace.LockLease
	var err error
	for range 20 {
		if got, err = a.Acquire(bg, key, tenace.LockAcquireOptions{Timeout: tenace.NoWait}); err == nil {
			break
		}
	}
	require.NoError(t, err)
	if got != nil {
		_ = got.Release(bg)
	}
	require.Nil(t, got, "two providers hold the key at once (%s)", fmt.Sprintf(why, args...))
}

// TestNoIDCachedThroughAPooler: through PgBouncer in session mode
// (AllowPooler), a client connection that has not sent a query is tied to
// no server session, so the pooler keeps it through a server crash and the
// provider opens no connection that would tell it the server came back
// (pgxpool hands out such a connection after dropping a dead one, with no
// AfterConnect). A cached id would then outlive the key's row, and the key,
// registered again by another provider under a new id, would be two
// locks: through a pooler the provider caches no id.
func TestNoIDCachedThroughAPooler(t *testing.T) {
	srv, b := asyncServer(t)
	cfg, err := pgxpool.ParseConfig(pgtest.StartPooler(t, srv, "session").ConnString())
	require.NoError(t, err)
	cfg.MinConns = 4 // opened at once and left unused: tied to no server session
	a, err := pglock.NewWithConfig(bg, cfg, pglock.AllowPooler(), pglock.WithoutFencing())
	require.NoError(t, err)
	defer a.Close()
	key := keyOf(t, "k")
	srv.MustExec(t, fmt.Sprintf("INSERT INTO tenace_lock_keys (key) VALUES (convert_to(%s, 'UTF8'))", quote(key)))
	for range 2 { // a cache would learn the id, then lock by it
		require.NoError(t, mustAcquire(t, a, key, tenace.LockAcquireOptions{}).Release(bg))
	}
	srv.Kill()
	srv.Restart(t)
	require.Equal(t, "0", rows(t, srv, key), "the asynchronously committed row survived the crash: the test proves nothing")
	held := mustAcquire(t, b, key, tenace.LockAcquireOptions{Timeout: 10 * time.Second})
	defer func() { _ = held.Release(bg) }()
	// pgxpool pings a connection idle for more than a second before it
	// hands it out, drops a dead one and hands out the next: its clock is
	// the point.
	time.Sleep(1500 * time.Millisecond)
	requireRefusedAfterCrash(t, a, key, "through a pooler")
}

// TestLabelRowSurvivesACrash: the owner label's row, added by a fenced
// grant's statement, commits synchronously whatever synchronous_commit
// says, as the provider then remembers the label as added: a crash right
// after must not lose it (Inspect and refusals would name no owner).
func TestLabelRowSurvivesACrash(t *testing.T) {
	srv, b := asyncServer(t)
	const q = "SELECT count(*) FROM tenace_lock_keys_owners WHERE convert_from(owner, 'UTF8') LIKE '%(label-job)'"
	require.NoError(t, mustAcquire(t, b, keyOf(t, "k"), tenace.LockAcquireOptions{Owner: "label-job"}).Release(bg))
	require.Equal(t, "1", srv.MustExec(t, q))
	srv.Kill()
	srv.Restart(t)
	require.Equal(t, "1", srv.MustExec(t, q), "the label's row was lost in the crash")
}

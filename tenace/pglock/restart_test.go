package pglock_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"tenace.dev/internal/pgtest"
	"tenace.dev/tenace"
	"tenace.dev/tenace/pglock"
)

// TestServerStopWhileHoldingAndWaiting: a clean shutdown (which terminates
// every session) while one caller holds the lock and another waits: the
// holder's lease is lost at once, the waiter gets an error (no hang), and
// once the server is back the provider works again, its tokens above the
// ones before.
func TestServerStopWhileHoldingAndWaiting(t *testing.T) {
	srv := pgtest.Start(t)
	p := newProvider(t, srv)
	key := keyOf(t, "k")
	held := mustAcquire(t, p, key, tenace.LockAcquireOptions{})
	r := acquireAsync(bg, p, key, tenace.LockAcquireOptions{})
	waitForWaiters(t, srv, key, 1)
	srv.Stop()
	ll := held.(tenace.LosableLease)
	<-ll.Lost()
	require.ErrorIs(t, ll.Err(), tenace.ErrLeaseLost)
	res := <-r
	require.Nil(t, res.lease)
	require.Error(t, res.err, "the waiter learns that the server went away")
	require.False(t, errors.Is(res.err, context.Canceled))
	// With the server down, Acquire fails at once.
	_, err := p.Acquire(bg, key, tenace.LockAcquireOptions{})
	require.Error(t, err)
	require.ErrorIs(t, held.Release(bg), tenace.ErrLeaseLost)

	srv.Restart(t)
	l := mustAcquire(t, p, key, tenace.LockAcquireOptions{Timeout: 10 * time.Second})
	require.Greater(t, l.(tenace.FencedLease).Token(), held.(tenace.FencedLease).Token())
	require.NoError(t, l.Release(bg))
	require.Equal(t, tenace.LockStats{}, p.Stats())
}

// TestFencingSurvivesACrash: tokens keep increasing across a crash
// (immediate shutdown, no checkpoint) and restart: the fence is committed
// before a grant is returned.
func TestFencingSurvivesACrash(t *testing.T) {
	srv := pgtest.Start(t)
	p := newProvider(t, srv)
	key := keyOf(t, "k")
	var last uint64
	for range 3 {
		l := mustAcquire(t, p, key, tenace.LockAcquireOptions{Timeout: 10 * time.Second})
		tok := l.(tenace.FencedLease).Token()
		require.Greater(t, tok, last)
		last = tok
		srv.Kill()
		<-l.(tenace.LosableLease).Lost()
		srv.Restart(t)
	}
}

// TestFencingSurvivesACrashWithAsyncCommit: the same on a server whose
// default is synchronous_commit off (a common tuning), with the WAL writer
// slowed down so that nothing flushes the fence's commits behind their
// back: the acquire statements commit synchronously all the same, and a
// crash hands out no token twice.
func TestFencingSurvivesACrashWithAsyncCommit(t *testing.T) {
	srv := pgtest.Start(t)
	srv.MustExec(t, "ALTER SYSTEM SET synchronous_commit = off")
	srv.MustExec(t, "ALTER SYSTEM SET wal_writer_delay = '10s'")
	srv.MustExec(t, "SELECT pg_reload_conf()")
	require.Equal(t, "off", srv.MustExec(t, "SHOW synchronous_commit"))
	p := newProvider(t, srv)
	key := keyOf(t, "k")
	// Register the key and flush its row, so that only the fence updates
	// are at stake.
	l := mustAcquire(t, p, key, tenace.LockAcquireOptions{})
	require.NoError(t, l.Release(bg))
	srv.MustExec(t, "CHECKPOINT")
	var last uint64
	for range 5 {
		l := mustAcquire(t, p, key, tenace.LockAcquireOptions{})
		last = l.(tenace.FencedLease).Token()
		require.NoError(t, l.Release(bg))
	}
	srv.Kill() // a crash: the WAL buffers are lost
	srv.Restart(t)
	l = mustAcquire(t, p, key, tenace.LockAcquireOptions{Timeout: 10 * time.Second})
	tok := l.(tenace.FencedLease).Token()
	require.NoError(t, l.Release(bg))
	t.Logf("last token before the crash %d, first after %d", last, tok)
	require.Greater(t, tok, last, "a token handed out before the crash was handed out again")
}

// TestFencingSurvivesACrashAfterAnotherLogged: the token is the table's
// sequence, which writes WAL once in 32 values: a grant that takes a value
// from a range another transaction logged, that log not flushed yet, must
// flush it itself before it answers, or a crash hands its token out again.
// Here the other transaction logs (its nextval is the first after a
// checkpoint) and stays open, uncommitted, on a server whose WAL writer
// sleeps 10 s, until the crash. (Without the grant's flush, the first
// token after the crash was 2, below the grant's 3.) With synchronous_commit
// off too: the statement asks for a synchronous commit of its own
// transaction, whose message gave it an xid and WAL to flush.
func TestFencingSurvivesACrashAfterAnotherLogged(t *testing.T) {
	for _, sc := range []string{"on", "off"} {
		t.Run("synchronous_commit="+sc, func(t *testing.T) { fencingSurvivesACrashAfterAnotherLogged(t, sc) })
	}
}

func fencingSurvivesACrashAfterAnotherLogged(t *testing.T, syncCommit string) {
	srv := pgtest.Start(t)
	srv.MustExec(t, "ALTER SYSTEM SET wal_writer_delay = '10s'")
	srv.MustExec(t, "ALTER SYSTEM SET synchronous_commit = "+syncCommit)
	srv.MustExec(t, "SELECT pg_reload_conf()")
	require.Equal(t, syncCommit, srv.MustExec(t, "SHOW synchronous_commit"))
	p := newProvider(t, srv)
	key := keyOf(t, "k")
	l := mustAcquire(t, p, key, tenace.LockAcquireOptions{})
	require.NoError(t, l.Release(bg))
	other, err := pgx.Connect(bg, srv.ConnString())
	require.NoError(t, err)
	defer other.Close(bg)
	srv.MustExec(t, "CHECKPOINT")
	tx, err := other.Begin(bg)
	require.NoError(t, err)
	var logged int64
	require.NoError(t, tx.QueryRow(bg, "SELECT nextval('tenace_lock_keys_tokens')").Scan(&logged))
	l = mustAcquire(t, p, key, tenace.LockAcquireOptions{})
	last := l.(tenace.FencedLease).Token()
	require.NoError(t, l.Release(bg))
	t.Logf("the other transaction's value %d, the grant's token %d", logged, last)
	srv.Kill() // a crash: the WAL buffers are lost
	srv.Restart(t)
	l = mustAcquire(t, p, key, tenace.LockAcquireOptions{Timeout: 10 * time.Second})
	tok := l.(tenace.FencedLease).Token()
	require.NoError(t, l.Release(bg))
	t.Logf("first token after the crash %d", tok)
	require.Greater(t, tok, last, "a token handed out before the crash was handed out again")
}

// TestATableOfAnOlderVersion: New brings a table made by a version that
// kept each key's last token in its row (a fence column) up to date: the
// sequence starts above every token the table gave, and the columns an
// older provider writes are gone, so that one still running fails rather
// than hand out a lower token. WithoutSetup refuses such a table.
func TestATableOfAnOlderVersion(t *testing.T) {
	srv := server(t)
	table := "tenace_old_" + strings.ToLower(strconv.FormatInt(time.Now().UnixNano(), 36))
	srv.MustExec(t, `CREATE TABLE `+table+` (id integer GENERATED ALWAYS AS IDENTITY PRIMARY KEY, key bytea NOT NULL UNIQUE,
	fence bigint NOT NULL DEFAULT 0, owners jsonb);
	INSERT INTO `+table+` (key, fence) VALUES ('a', 500), ('b', 7)`)
	_, err := pglock.New(bg, srv.ConnString(), pglock.WithTable(table+"_none"), pglock.WithoutSetup())
	require.ErrorContains(t, err, "is missing: create it with pglock.Schema")
	require.NotContains(t, err.Error(), "NULL")
	_, err = pglock.New(bg, srv.ConnString(), pglock.WithTable(table), pglock.WithoutSetup())
	require.ErrorContains(t, err, "pglock.Schema")
	p := newProvider(t, srv, pglock.WithTable(table))
	for _, key := range []string{"b", "a", "new"} {
		l := mustAcquire(t, p, key, tenace.LockAcquireOptions{})
		require.Greater(t, l.(tenace.FencedLease).Token(), uint64(500), "key %q", key)
		require.NoError(t, l.Release(bg))
	}
	require.Equal(t, "0", srv.MustExec(t, `SELECT count(*) FROM pg_attribute WHERE attrelid = '`+table+`'::regclass AND attname IN ('fence', 'owners') AND NOT attisdropped`))
	// Schema is idempotent on the table it brought up to date.
	srv.MustExec(t, pglock.Schema(table))
	q := newProvider(t, srv, pglock.WithTable(table), pglock.WithoutSetup())
	l := mustAcquire(t, q, "a", tenace.LockAcquireOptions{})
	require.Greater(t, l.(tenace.FencedLease).Token(), uint64(502))
	require.NoError(t, l.Release(bg))
}

// TestRetryAfterDeadConnFindsALiveOne: several idle connections of the
// pool died together (their backends terminated), used less than a second
// ago, so the pool does not ping them on Acquire: the statement on the
// first fails, and the one retry must not land on another dead one.
func TestRetryAfterDeadConnFindsALiveOne(t *testing.T) {
	srv := server(t)
	p := newProvider(t, srv, pglock.WithMaxConns(4))
	var pids []uint32
	var held []tenace.LockLease
	for i := range 3 {
		l := mustAcquire(t, p, keyOf(t, string(rune('a'+i))), tenace.LockAcquireOptions{})
		pids = append(pids, pglock.BackendPID(l))
		held = append(held, l)
	}
	for _, l := range held {
		require.NoError(t, l.Release(bg))
	}
	for _, pid := range pids {
		srv.Terminate(t, pid)
	}
	l, err := p.Acquire(bg, keyOf(t, "k"), tenace.LockAcquireOptions{Timeout: 10 * time.Second})
	require.NoError(t, err, "the server is up: the retry must use a live connection")
	require.NotNil(t, l)
	require.NotContains(t, pids, pglock.BackendPID(l))
	require.NoError(t, l.Release(bg))
	require.Equal(t, tenace.LockStats{}, p.Stats())
}

// TestLostThroughAPolicy: the holder's backend is terminated while fn runs
// under a Lock: fn's ctx ends with the lost cause, the step emits
// lock.lost, and the next waiter gets the lock.
func TestLostThroughAPolicy(t *testing.T) {
	srv := server(t)
	p := newProvider(t, srv)
	key := keyOf(t, "k")
	var events []string
	pol := tenace.NewPolicy().WithLock(tenace.LockOptions{Provider: p, Key: key}).
		OnEvent(func(e tenace.Event) {
			switch e.Name {
			case tenace.EventLockAcquired, tenace.EventLockLost, tenace.EventLockReleased:
				events = append(events, e.Name)
			}
		})
	started := make(chan uint32, 1) // the holder's backend pid
	done := make(chan error, 1)
	go func() {
		done <- pol.Execute(bg, func(ctx context.Context) error {
			l, _ := tenace.LeaseFrom(ctx)
			started <- pglock.BackendPID(l)
			<-ctx.Done()
			return context.Cause(ctx)
		})
	}()
	pid := <-started
	r := acquireAsync(bg, p, key, tenace.LockAcquireOptions{})
	waitForWaiters(t, srv, key, 1)
	srv.Terminate(t, pid)
	err := <-done
	require.ErrorIs(t, err, tenace.ErrLeaseLost)
	require.ErrorContains(t, err, fmt.Sprintf("backend %d", pid))
	require.Equal(t, []string{tenace.EventLockAcquired, tenace.EventLockLost, tenace.EventLockReleased}, events)
	next := <-r
	require.NoError(t, next.err)
	require.NoError(t, next.lease.Release(bg))
}

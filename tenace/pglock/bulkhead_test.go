package pglock_test

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"tenace.dev/internal/pgtest"
	"tenace.dev/tenace"
	"tenace.dev/tenace/pglock"
)

// keyID is the id of key in the table of keys (registered first by an
// acquire and a release).
func keyID(t *testing.T, p *pglock.Provider, srv *pgtest.Server, key string) int32 {
	t.Helper()
	require.NoError(t, mustAcquire(t, p, key, tenace.LockAcquireOptions{}).Release(bg))
	id, err := strconv.Atoi(srv.MustExec(t, fmt.Sprintf(`SELECT id FROM tenace_lock_keys WHERE key = convert_to(%s, 'UTF8')`, quote(key))))
	require.NoError(t, err)
	return int32(id)
}

// TestNoWaitBulkheadAdmittedWhileAnotherPassesTheGate: a NoWait caller of
// a bulkhead is granted whenever a permit is free, also while another
// caller holds the key's gate — here a session that took the gate by hand,
// as a caller does for the moment of its admission, or a waiter for as
// long as it waits. It is refused once the N permits are taken.
func TestNoWaitBulkheadAdmittedWhileAnotherPassesTheGate(t *testing.T) {
	srv := server(t)
	p := newProvider(t, srv)
	key := keyOf(t, "k")
	id := keyID(t, p, srv, key)
	gate, err := pgx.Connect(bg, srv.ConnString())
	require.NoError(t, err)
	defer func() { require.NoError(t, gate.Close(bg)) }()
	_, err = gate.Exec(bg, `SELECT pg_advisory_lock($1::int4, $2::int4)`, p.ClassID(), -id)
	require.NoError(t, err)

	try := tenace.LockAcquireOptions{Shared: true, Permits: 2, Timeout: tenace.NoWait}
	var held []tenace.LockLease
	for i := range 2 {
		l, err := p.Acquire(bg, key, try)
		require.NoError(t, err)
		require.NotNil(t, l, "NoWait caller %d refused with a permit free, while the gate is held", i)
		held = append(held, l)
	}
	l, err := p.Acquire(bg, key, try)
	require.NoError(t, err)
	require.Nil(t, l, "a third holder of two permits")
	for _, l := range held {
		require.NoError(t, l.Release(bg))
	}
	_, err = gate.Exec(bg, `SELECT pg_advisory_unlock_all()`)
	require.NoError(t, err)
	waitFree(t, srv, key)
}

// TestABulkheadWaiterThatGivesUpKeepsItsSession: a bulkhead caller that
// waits and gives up — its Timeout passes, or its ctx ends while it waits
// for a permit to come back (no statement running), for the key's gate or
// behind a writer (its statement cancelled) — leaves the server holding
// nothing for it and keeps its connection: the pool still has it open, and
// the provider's next call runs on the same backend.
func TestABulkheadWaiterThatGivesUpKeepsItsSession(t *testing.T) {
	srv := server(t)
	one := bulkhead(1)
	for _, tc := range []struct {
		name    string
		timeout time.Duration // 0: ctx ends once the caller waits
		holder  tenace.LockAcquireOptions
		gate    bool // another waiter holds the gate: the caller waits for it
		waiting func(t *testing.T, key string)
	}{
		{name: "Timeout", timeout: 300 * time.Millisecond, holder: one},
		{name: "ctx, waiting for a permit", holder: one, waiting: func(t *testing.T, key string) { waitForPermitWait(t, srv, key) }},
		{name: "ctx, waiting for the gate", holder: one, gate: true, waiting: func(t *testing.T, key string) { waitForGate(t, srv, key, 2) }},
		{name: "ctx, waiting behind a writer", holder: writer, waiting: func(t *testing.T, key string) { waitForWaiters(t, srv, key, 1) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			key := keyOf(t, "k")
			other := newProvider(t, srv)
			h := mustAcquire(t, other, key, tc.holder)
			var first <-chan result
			if tc.gate {
				first = acquireAsync(bg, other, key, one)
				waitForPermitWait(t, srv, key)
			}
			p := newProvider(t, srv)
			var mu sync.Mutex
			var pids []uint32
			p.SetHooks(pglock.Hooks{StatementDone: func(pid uint32, _ bool) {
				mu.Lock()
				pids = append(pids, pid)
				mu.Unlock()
			}})
			ctx, cancel := context.WithCancel(bg)
			defer cancel()
			opts := one
			opts.Timeout = tc.timeout
			r := acquireAsync(ctx, p, key, opts)
			if tc.waiting != nil {
				tc.waiting(t, key)
				cancel()
			}
			res := <-r
			require.Nil(t, res.lease)
			if tc.waiting != nil {
				require.ErrorIs(t, res.err, context.Canceled)
			} else {
				require.NoError(t, res.err, "not granted within its Timeout")
			}
			mu.Lock()
			waiter := pids[0]
			mu.Unlock()
			require.Equal(t, int32(1), pglock.PoolConns(p), "the waiter's connection was closed")
			require.Equal(t, "0", srv.MustExec(t, fmt.Sprintf(`SELECT count(*) FROM pg_locks WHERE pid = %d AND locktype = 'advisory'`, waiter)),
				"the waiter's session holds locks: %s", held(t, srv, key))
			require.NoError(t, h.Release(bg))
			if first != nil {
				got := <-first
				require.NoError(t, got.err)
				require.NoError(t, got.lease.Release(bg))
			}
			l := mustAcquire(t, p, key, one)
			require.Equal(t, waiter, pglock.BackendPID(l), "the next call runs on another backend: the waiter's session ended")
			require.NoError(t, l.Release(bg))
			waitFree(t, srv, key)
		})
	}
}

// statements counts the provider's statements whose SQL holds a string.
type statements struct {
	mu   sync.Mutex
	sqls []string
}

func (s *statements) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	s.mu.Lock()
	s.sqls = append(s.sqls, d.SQL)
	s.mu.Unlock()
	return ctx
}

func (s *statements) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// with returns how many statements held sub, and clears the record.
func (s *statements) with(sub string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, q := range s.sqls {
		if strings.Contains(q, sub) {
			n++
		}
	}
	s.sqls = nil
	return n
}

// TestABulkheadHandOffReadsNoLockTable: a bulkhead caller that waits for a
// permit, for several times the re-try interval, then is granted the
// permit a Release gives back, runs no statement that reads pg_locks (a
// scan of the server's lock table, whose partitions it locks): neither
// while it waits nor once woken. The provider is WithoutFencing, whose
// statements record no owner: with fencing, a shared grant's owner record
// names pg_locks too, read only to prune the key's owners once they
// number maxOwners (see inspect.go) — the inspection's cost, not the
// bulkhead's.
func TestABulkheadHandOffReadsNoLockTable(t *testing.T) {
	srv := server(t)
	cfg, err := pgxpool.ParseConfig(srv.ConnString())
	require.NoError(t, err)
	var rec statements
	cfg.ConnConfig.Tracer = &rec
	p, err := pglock.NewWithConfig(bg, cfg, pglock.WithoutFencing())
	require.NoError(t, err)
	defer func() { require.NoError(t, p.Close()) }()
	key := keyOf(t, "k")
	h := mustAcquire(t, newProvider(t, srv), key, bulkhead(1))
	rec.with("")
	opts := bulkhead(1)
	opts.Timeout = 20 * time.Second
	r := acquireAsync(bg, p, key, opts)
	waitForPermitWait(t, srv, key)
	time.Sleep(350 * time.Millisecond) // several of the waiter's re-tries (permitRepoll): what it runs while it waits
	require.NoError(t, h.Release(bg))
	res := <-r
	require.NoError(t, res.err)
	require.NotNil(t, res.lease)
	require.Zero(t, rec.with("pg_locks"), "statements of the waiter that read pg_locks")
	require.NoError(t, res.lease.Release(bg))
	waitFree(t, srv, key)
}

// TestABulkheadWaiterWakesOnRelease: a waiter for a permit is woken by the
// holder's Release itself (its NOTIFY), not by a timer: with the waiter's
// re-try set to an hour, each of five waiters is granted once the holder
// releases, within 10 s (a loaded machine's room). The hand-offs' median
// is logged beside a control, three round trips of a bare statement on a
// connection of its own (the Release's, the waiter's try, its UNLISTEN).
func TestABulkheadWaiterWakesOnRelease(t *testing.T) {
	srv := server(t)
	defer pglock.SetPermitRepoll(time.Hour)()
	holders, waiters := newProvider(t, srv), newProvider(t, srv)
	ctl, err := pgx.Connect(bg, srv.ConnString())
	require.NoError(t, err)
	defer func() { require.NoError(t, ctl.Close(bg)) }()
	var wakes, controls []time.Duration
	for i := range 5 {
		key := keyOf(t, "k"+strconv.Itoa(i))
		h := mustAcquire(t, holders, key, bulkhead(1))
		opts := bulkhead(1)
		opts.Timeout = 20 * time.Second
		r := acquireAsync(bg, waiters, key, opts)
		waitForPermitWait(t, srv, key)
		start := time.Now()
		require.NoError(t, h.Release(bg))
		var res result
		select {
		case res = <-r:
		case <-time.After(10 * time.Second):
			t.Fatalf("waiter %d not granted within 10s of the Release: no NOTIFY woke it", i)
		}
		wakes = append(wakes, time.Since(start))
		require.NoError(t, res.err)
		require.NotNil(t, res.lease)
		require.NoError(t, res.lease.Release(bg))
		start = time.Now()
		for range 3 {
			_, err := ctl.Exec(bg, `SELECT 1`)
			require.NoError(t, err)
		}
		controls = append(controls, time.Since(start))
	}
	slices.Sort(wakes)
	slices.Sort(controls)
	t.Logf("hand-off %v (median of %v); control, three round trips: %v", wakes[2], wakes, controls[2])
}

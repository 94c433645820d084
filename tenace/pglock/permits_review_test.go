package pglock_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"tenace.dev/tenace"
	"tenace.dev/tenace/pglock"
)

// TestANoWaitBulkheadNeverAdmitsMoreThanN: NoWait callers of a bulkhead of
// one permit, never more than one holder at once. Before the fix it saw 3:
// in permitStatement with release (NoWait), g, the gate's unlock, was read
// in the final SELECT's FROM without depending on l, so PostgreSQL ran it
// before the target list's (SELECT ok FROM l): the gate was unlocked before
// the count and the take, and two NoWait callers both counted N-1 and both
// took a permit.
func TestANoWaitBulkheadNeverAdmitsMoreThanN(t *testing.T) {
	hammerBulkhead(t, func(int) time.Duration { return tenace.NoWait })
}

// TestAWaitingBulkheadNeverAdmitsMoreThanN is the same with callers that
// wait (a short Timeout, and none): the gate is held through the count and
// the take.
func TestAWaitingBulkheadNeverAdmitsMoreThanN(t *testing.T) {
	hammerBulkhead(t, func(g int) time.Duration { return time.Duration(g%2) * 50 * time.Millisecond })
}

// hammerBulkhead runs 8 goroutines of callers of a one-permit bulkhead for
// 3s, each with the Timeout timeout(g) gives it, and fails if two ever
// hold at once (counted in the process, dropped before each Release: it
// can only undercount).
func hammerBulkhead(t *testing.T, timeout func(g int) time.Duration) {
	srv := server(t)
	p := newProvider(t, srv)
	key := keyOf(t, "k")
	var in, most, grants atomic.Int64
	end := time.Now().Add(3 * time.Second)
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			opts := tenace.LockAcquireOptions{Shared: true, Permits: 1, Timeout: timeout(g)}
			for time.Now().Before(end) {
				l, err := p.Acquire(bg, key, opts)
				if errors.Is(err, pglock.ErrNoReply) && opts.Timeout > 0 {
					continue // a loaded machine
				}
				if err != nil {
					t.Error(err)
					return
				}
				if l == nil {
					continue
				}
				grants.Add(1)
				n := in.Add(1)
				for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
				}
				time.Sleep(time.Millisecond) // hold it a moment: a real overlap is seen
				in.Add(-1)
				require.NoError(t, l.Release(bg))
			}
		})
	}
	wg.Wait()
	t.Logf("grants %d, most holders at once %d", grants.Load(), most.Load())
	require.LessOrEqual(t, most.Load(), int64(1), "more holders than permits")
}

// TestABulkheadCallerBehindAWriterIsContentionAtItsTimeout: a bulkhead caller that
// waits for the gate, then for a writer, is told "held" at its Timeout,
// not ErrNoReply. Before the fix, the entry statement gave the gate wait
// and then the shared wait each the whole lock_timeout ($3), so a caller
// granted the gate late in its Timeout waits for the writer past it, and
// Acquire, hearing nothing by the Timeout and the reply allowance, reports
// an outage of a server that answered all along.
//
// The bound is the subject: the server's "held" is due a lead before the
// Timeout, and a machine that delays a reply by more than the lead and the
// allowance turns it into ErrNoReply, as the package doc says. Each
// caller's path: its entry statement, whose bound on the server is set
// just before it is sent (after pgx prepares it: a round trip); the
// server's verdict (lock_timeout) in the shared wait; then a round trip
// that gives back the gate and the slot (givePermitBack), and only then
// the verdict to Acquire. So each caller runs beside a control on the
// same path (serverControlPath, no round trip before the wait, one
// after): ErrNoReply passes only when that control, too, came at least
// the allowance late.
func TestABulkheadCallerBehindAWriterIsContentionAtItsTimeout(t *testing.T) {
	srv := server(t)
	key := keyOf(t, "k")
	w := mustAcquire(t, newProvider(t, srv), key, writer) // another process's writer
	first := bulkhead(2)
	first.Timeout = 3 * time.Second // long enough for waitForWaiters to see it wait on a loaded machine
	p1, p2 := newProvider(t, srv), newProvider(t, srv)
	late1 := serverControlPath(t, srv, first.Timeout, 0, 1) // a waiter's verdict comes after its clean-up's round trip
	r1 := acquireAsync(bg, p1, key, first)                  // holds the gate, waits for the writer
	waitForWaiters(t, srv, key, 1)
	second := bulkhead(2)
	second.Timeout = 2 * first.Timeout
	late2 := serverControlPath(t, srv, second.Timeout, 0, 1)
	start := time.Now()
	l, err := p2.Acquire(bg, key, second) // waits for the gate, then the writer
	took := time.Since(start)
	r := <-r1
	require.Nil(t, r.lease)
	if !noReplyOfALoadedMachine(t, r.err, late1) {
		require.NoError(t, r.err, "the gate's holder")
	}
	require.Nil(t, l)
	if !noReplyOfALoadedMachine(t, err, late2) {
		require.NoError(t, err, "the caller behind it, after %v", took)
	}
	require.NoError(t, w.Release(bg))
	waitFree(t, srv, key)
}

// slowPrepare is a tracer that holds back the prepare of each bounded
// statement (one that sets lock_timeout) by delay: the round trip of a
// statement's first run on a connection (pgx prepares it then), as slow
// as a loaded machine makes one.
type slowPrepare struct{ delay time.Duration }

func (s slowPrepare) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	return ctx
}

func (slowPrepare) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (s slowPrepare) TracePrepareStart(ctx context.Context, _ *pgx.Conn, d pgx.TracePrepareStartData) context.Context {
	if strings.Contains(d.SQL, "lock_timeout") {
		time.Sleep(s.delay) // the slow round trip under test, not synchronisation
	}
	return ctx
}

func (slowPrepare) TracePrepareEnd(context.Context, *pgx.Conn, pgx.TracePrepareEndData) {}

// TestTheServersBoundIsSetAfterThePrepare: a bounded call's first
// statement on a connection is prepared first, a round trip; the server's
// bound on the wait (lock_timeout) is what is left of the Timeout once
// that trip is done, so that "held" is still due a lead before the
// Timeout. Before the fix, the bound was computed before the prepare, and
// a slow prepare pushed the verdict past the Timeout and the allowance:
// ErrNoReply from a server that answered as told.
func TestTheServersBoundIsSetAfterThePrepare(t *testing.T) {
	srv := server(t)
	key := keyOf(t, "k")
	w := mustAcquire(t, newProvider(t, srv), key, writer)
	cfg, err := pgxpool.ParseConfig(srv.ConnString())
	require.NoError(t, err)
	cfg.ConnConfig.Tracer = slowPrepare{delay: 300 * time.Millisecond} // past the lead and the allowance
	p, err := pglock.NewWithConfig(bg, cfg)
	require.NoError(t, err)
	defer func() { require.NoError(t, p.Close()) }()
	opts := bulkhead(2)
	opts.Timeout = 2 * time.Second
	late := serverControlPath(t, srv, opts.Timeout, 0, 1) // the verdict comes after the clean-up's round trip
	start := time.Now()
	l, err := p.Acquire(bg, key, opts)
	took := time.Since(start)
	require.Nil(t, l)
	if !noReplyOfALoadedMachine(t, err, late) {
		require.NoError(t, err, "after %v", took)
	}
	require.NoError(t, w.Release(bg))
	waitFree(t, srv, key)
}

package pglock_test

import (
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

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
// allowance turns it into ErrNoReply, as the package doc says. So each
// caller runs beside a control (serverControl), a reply of the server due
// at the same moment: ErrNoReply passes only when that reply, too, came at
// least the allowance late.
func TestABulkheadCallerBehindAWriterIsContentionAtItsTimeout(t *testing.T) {
	srv := server(t)
	key := keyOf(t, "k")
	w := mustAcquire(t, newProvider(t, srv), key, writer) // another process's writer
	first := bulkhead(2)
	first.Timeout = 3 * time.Second // long enough for waitForWaiters to see it wait on a loaded machine
	p1, p2 := newProvider(t, srv), newProvider(t, srv)
	late1 := serverControlTrips(t, srv, first.Timeout, 2) // a waiter's verdict comes after its clean-up's round trip
	r1 := acquireAsync(bg, p1, key, first)                // holds the gate, waits for the writer
	waitForWaiters(t, srv, key, 1)
	second := bulkhead(2)
	second.Timeout = 2 * first.Timeout
	late2 := serverControlTrips(t, srv, second.Timeout, 2)
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

package pglock_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"tenace.dev/tenace"
	"tenace.dev/tenace/pglock"
)

// A statement whose context ends while it runs makes the client send cancel
// requests, which reach the backend some time later. A connection whose
// statement succeeded all the same must not go back to the pool: a late
// cancel would hit its next statement, another caller's, which would fail
// with "canceling statement due to user request" although its own ctx and
// Timeout are fine. These tests end contexts at random moments around a
// statement (the deadlines are the point, not synchronisation), and after
// each call whose ctx ended they run an Acquire that waits 30 ms on the
// server (for a key held elsewhere) on the provider's one connection: the
// window in which a stray cancel would land.

const (
	strayRounds = 300
	strayProbes = 50 // before the fix, a stray cancel showed within 7 probes
)

// probeStray runs the probing Acquire and reports whether a stray cancel
// hit it.
func probeStray(t *testing.T, p *pglock.Provider, busy string) bool {
	t.Helper()
	l, err := p.Acquire(bg, busy, tenace.LockAcquireOptions{Timeout: 30 * time.Millisecond})
	if err != nil && strings.Contains(err.Error(), "canceling statement") {
		t.Logf("Acquire(bg, Timeout 30ms) failed: %v", err)
		return true
	}
	if errors.Is(err, pglock.ErrNoReply) {
		// The server's "held" came after the Timeout and its allowance
		// (a loaded machine): no stray cancel, which the server answers.
		// The call's connection waits for that answer in the background:
		// the next call waits for it too, rather than find the pool full.
		t.Logf("probe: %v", err)
		l, err := p.Acquire(bg, busy+"/free", tenace.LockAcquireOptions{Timeout: time.Minute})
		require.NoError(t, err)
		require.NotNil(t, l)
		require.NoError(t, l.Release(bg))
		return false
	}
	require.NoError(t, err)
	require.Nil(t, l, "busy is held elsewhere")
	return false
}

// TestNoStrayCancelAfterRelease: a Release whose ctx ends while its unlock
// runs, and whose unlock succeeds, closes the connection.
func TestNoStrayCancelAfterRelease(t *testing.T) {
	srv := server(t)
	p := newProvider(t, srv, pglock.WithMaxConns(1)) // one connection: always reused
	other := newProvider(t, srv)
	key, busy := keyOf(t, "k"), keyOf(t, "busy")
	hold := mustAcquire(t, other, busy, tenace.LockAcquireOptions{})
	defer func() { require.NoError(t, hold.Release(bg)) }()
	r := rand.New(rand.NewPCG(3, 4))
	probes := 0
	for i := 0; i < strayRounds && probes < strayProbes; i++ {
		l := mustAcquire(t, p, key, tenace.LockAcquireOptions{})
		ctx, cancel := context.WithTimeout(bg, time.Duration(20+r.IntN(600))*time.Microsecond)
		err := l.Release(ctx)
		cancel()
		if err != nil || ctx.Err() == nil {
			continue // the unlock failed (connection closed), or ctx did not end
		}
		probes++
		require.False(t, probeStray(t, p, busy), "round %d: a stray cancel from a Release hit a later Acquire", i)
	}
	t.Logf("%d successful Releases whose ctx ended", probes)
	require.NotZero(t, probes, "no Release succeeded with its ctx ended: the test tested nothing")
}

// TestNoStrayCancelAfterNoWait: a NoWait Acquire whose ctx ends while its
// try runs closes the connection, whatever the try found, and returns ctx's
// error — or (nil, nil) when ctx ended only after the call's last look at
// it. Most calls whose ctx ended never touched the connection (ctx ended
// before), so the slow probe runs only when the call's connection is still
// the pool's one: a lease on a free key says which backend that is (and is
// a quick probe itself).
func TestNoStrayCancelAfterNoWait(t *testing.T) {
	srv := server(t)
	p := newProvider(t, srv, pglock.WithMaxConns(1))
	other := newProvider(t, srv)
	key, busy, free := keyOf(t, "k"), keyOf(t, "busy"), keyOf(t, "free")
	h1 := mustAcquire(t, other, key, tenace.LockAcquireOptions{})
	defer func() { require.NoError(t, h1.Release(bg)) }()
	h2 := mustAcquire(t, other, busy, tenace.LockAcquireOptions{})
	defer func() { require.NoError(t, h2.Release(bg)) }()
	// backend is the pid of p's one connection, or a stray cancel.
	backend := func() (pid uint32, stray bool) {
		l, err := p.Acquire(bg, free, tenace.LockAcquireOptions{})
		if err != nil && strings.Contains(err.Error(), "canceling statement") {
			t.Logf("Acquire(bg) failed: %v", err)
			return 0, true
		}
		require.NoError(t, err)
		pid = pglock.BackendPID(l)
		require.NoError(t, l.Release(bg))
		return pid, false
	}
	pid, _ := backend()
	r := rand.New(rand.NewPCG(5, 6))
	ended, probes := 0, 0
	for i := 0; i < strayRounds && probes < strayProbes; i++ {
		ctx, cancel := context.WithTimeout(bg, time.Duration(20+r.IntN(600))*time.Microsecond)
		l, err := p.Acquire(ctx, key, tenace.LockAcquireOptions{Timeout: tenace.NoWait})
		done := ctx.Err() != nil
		cancel()
		require.Nil(t, l, "key is held elsewhere")
		if err != nil {
			require.True(t, errors.Is(err, context.DeadlineExceeded), "round %d: %v", i, err)
		}
		if !done {
			continue
		}
		ended++
		next, stray := backend()
		require.False(t, stray, "round %d: a stray cancel from a NoWait try hit a later Acquire", i)
		if next == pid {
			// The connection was reused after a call whose ctx ended.
			probes++
			require.False(t, probeStray(t, p, busy), "round %d: a stray cancel from a NoWait try hit a later Acquire", i)
		}
		pid = next
	}
	t.Logf("%d NoWait calls whose ctx ended; %d left their connection in the pool", ended, probes)
	require.NotZero(t, ended)
}

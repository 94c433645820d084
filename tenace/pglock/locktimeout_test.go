package pglock_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"tenace.dev/tenace"
)

// TestALockTimeoutThatCameWithTheGrantLeavesNothingHeld: PostgreSQL can
// grant an advisory lock at the moment the statement's lock_timeout fires
// and still fail the statement with the timeout (55P03); the session keeps
// the lock, which outlives the error. Waiters with short Timeouts (and
// ctx ends) give up around a holder, round after round; once every one has
// returned and the holder has released, no session may keep the key
// (pg_locks). Before the provider let go of the session's locks on a lock
// timeout, a pooled idle connection kept the key in about one round of
// four, until the connection was closed.
func TestALockTimeoutThatCameWithTheGrantLeavesNothingHeld(t *testing.T) {
	srv := server(t)
	p := newProvider(t, srv)
	key := keyOf(t, "k")
	for round := range 30 {
		held := mustAcquire(t, p, key, tenace.LockAcquireOptions{})
		var waiters []<-chan result
		for i := range 9 {
			switch i % 3 {
			case 0:
				waiters = append(waiters, acquireAsync(bg, p, key, tenace.LockAcquireOptions{Timeout: 20 * time.Millisecond}))
			case 1:
				ctx, cancel := context.WithTimeout(bg, 20*time.Millisecond)
				t.Cleanup(cancel)
				waiters = append(waiters, acquireAsync(ctx, p, key, tenace.LockAcquireOptions{}))
			case 2:
				waiters = append(waiters, acquireAsync(bg, p, key, tenace.LockAcquireOptions{Timeout: 5 * time.Millisecond}))
			}
		}
		for i, w := range waiters {
			r := <-w
			require.Nil(t, r.lease, "round %d: waiter %d was granted while the key was held", round, i)
		}
		require.NoError(t, held.Release(bg))
		// A call that Acquire left behind at its Timeout may still hold
		// the key for a round trip (see runBounded); a session that kept
		// it holds it until the connection is closed.
		holders := `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted AND objid = (SELECT id FROM tenace_lock_keys WHERE key = '` + key + `')::oid`
		for deadline := time.Now().Add(5 * time.Second); srv.MustExec(t, holders) != "0"; time.Sleep(5 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("round %d: the key is still held 5s after its holder released, with every waiter gone: %s", round,
					srv.MustExec(t, `SELECT string_agg(a.pid || ' ' || a.state || ': ' || left(a.query, 40), '; ') FROM pg_locks l JOIN pg_stat_activity a USING (pid) WHERE l.locktype = 'advisory' AND l.granted`))
			}
		}
		l, err := p.Acquire(bg, key, tenace.LockAcquireOptions{Timeout: tenace.NoWait})
		require.NoError(t, err)
		require.NotNil(t, l, "round %d: the key is held by nobody, yet not granted", round)
		require.NoError(t, l.Release(bg))
	}
}

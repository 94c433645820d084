package redislock_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"tenace.dev/tenace/redislock"
)

// TestAReaderIsWokenWhenAWaitingWriterGivesUp: a reader held back by a
// waiting writer's mark is granted soon after that writer gives up (another
// reader holds the key: nothing else keeps it out). Before the fix it slept until
// its fallback timer (half to all of the retry interval): the writer's
// unmark was a bare ZREM, with no PUBLISH, so waiters in other processes
// were not told.
func TestAReaderIsWokenWhenAWaitingWriterGivesUp(t *testing.T) {
	_, c := setup(t)
	const retry = 8 * time.Second
	pr := redislock.New(c, redislock.WithRetryInterval(retry))
	pw := redislock.New(newClient(t, c.Options().Addr), redislock.WithRetryInterval(retry)) // another process
	pr2 := redislock.New(newClient(t, c.Options().Addr), redislock.WithRetryInterval(retry))
	t.Cleanup(func() { _ = pr.Close(); _ = pw.Close(); _ = pr2.Close() })
	key := "k"
	r1 := mustAcquire(t, pr, key, reader)
	w := writer
	w.Timeout = 500 * time.Millisecond
	wr := acquireAsync(bg, pw, key, w)
	eventually(t, "the writer's mark", func() bool { return c.ZCard(bg, "tenace:lock:{k}:writers").Val() == 1 })
	r := reader
	r.Timeout = 30 * time.Second
	rr := acquireAsync(bg, pr2, key, r)
	waitSubscribed(t, c, key, 2) // the writer and the second reader wait
	res := <-wr
	require.NoError(t, res.err)
	require.Nil(t, res.lease, "the writer was granted beside a reader")
	gaveUp := time.Now()
	eventually(t, "the mark's removal", func() bool { return c.ZCard(bg, "tenace:lock:{k}:writers").Val() == 0 })
	select {
	case res := <-rr:
		require.NoError(t, res.err)
		require.NotNil(t, res.lease)
		require.NoError(t, res.lease.Release(bg))
	case <-time.After(2 * time.Second):
		t.Errorf("the reader still waits %v after the writer gave up, beside a reader, with no writer waiting", time.Since(gaveUp))
		res := <-rr
		t.Logf("granted %v after", time.Since(gaveUp))
		require.NoError(t, res.err)
		require.NoError(t, res.lease.Release(bg))
	}
	require.NoError(t, r1.Release(bg))
}

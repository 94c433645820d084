package redislock_test

import (
	"context"
	"errors"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"tenace.dev/internal/redistest"
	"tenace.dev/tenace"
)

// A Dialer that fails while the server answers on the pooled connections —
// a failover client whose sentinels are down (its Dialer asks them for the
// master first), a process out of file descriptors — is not a server that
// refuses connections: once a stall has left a try unanswered past the
// probe's 5ms (the dial failing too), later acquires must still send their
// try and be granted while the pool reaches the server. Before, every later
// acquire probed first and failed, unsent, for as long as dials failed.
func TestADialerErrorIsNotARefusalWhileThePoolAnswers(t *testing.T) {
	srv := redistest.Start(t)
	var failDials atomic.Bool
	errSentinels := errors.New("redis: all sentinels specified in configuration are unreachable")
	c := redis.NewClient(&redis.Options{
		Addr: srv.Addr, ContextTimeoutEnabled: true, DialTimeout: time.Second,
		Dialer: func(ctx context.Context, network, addr string) (net.Conn, error) {
			if failDials.Load() {
				return nil, errSentinels
			}
			var d net.Dialer
			return d.DialContext(ctx, network, addr)
		},
	})
	t.Cleanup(func() { _ = c.Close() })
	p := newProvider(t, c)
	warm(t, c, p)
	failDials.Store(true)

	// A stall (SIGSTOP) while dials fail: the acquire fails (its try got
	// no reply), but once the server runs again the pool reaches it.
	srv.Pause()
	l, err := p.Acquire(bg, "stalled", tenace.LockAcquireOptions{Timeout: 100 * time.Millisecond})
	srv.Resume()
	require.Nil(t, l)
	t.Logf("acquire on a stalled server whose new dials fail: %v", err)
	require.Error(t, err)
	require.NoError(t, c.Ping(bg).Err(), "the pool reaches the server")

	// A try still ends on the failed dial if no reply comes within 5ms
	// (a starved process may see that happen): the first of a few that
	// is answered is granted, and the ones after it too.
	var errs []error
	granted := 0
	for range 5 {
		l, err := p.Acquire(bg, "after", tenace.LockAcquireOptions{Timeout: time.Second})
		if err != nil {
			errs = append(errs, err)
			continue
		}
		require.NotNil(t, l)
		require.NoError(t, l.Release(bg))
		granted++
	}
	require.NotZero(t, granted, "no acquire was granted while the pool reached the server: %v", errs)
	t.Logf("%d of 5 granted; failed: %v", granted, errs)
}

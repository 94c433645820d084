package pglock_test

import (
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"tenace.dev/tenace"
	"tenace.dev/tenace/pglock"
)

// TestLostSignalDelay measures (and logs; timing is not asserted) how long
// after an administrator's pg_terminate_backend is sent the lease's Lost
// channel closes.
func TestLostSignalDelay(t *testing.T) {
	srv := server(t)
	p := newProvider(t, srv)
	admin, err := pgx.Connect(bg, srv.ConnString())
	require.NoError(t, err)
	defer admin.Close(bg)
	var delays []time.Duration
	for range 20 {
		l := mustAcquire(t, p, keyOf(t, "k"), tenace.LockAcquireOptions{})
		start := time.Now()
		_, err := admin.Exec(bg, "SELECT pg_terminate_backend($1)", int(pglock.BackendPID(l)))
		require.NoError(t, err)
		<-l.(tenace.LosableLease).Lost()
		delays = append(delays, time.Since(start))
		require.ErrorIs(t, l.Release(bg), tenace.ErrLeaseLost)
	}
	slices.Sort(delays)
	t.Logf("Lost closed after pg_terminate_backend was sent: min %v, median %v, max %v (20 runs)", delays[0], delays[len(delays)/2], delays[len(delays)-1])
}

package pglock_test

import (
	"context"
	"flag"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"tenace.dev/internal/pgtest"
	"tenace.dev/tenace"
	"tenace.dev/tenace/pglock"
)

var (
	bg = context.Background()
	// shared is the server of every test that does not stop or restart
	// its server; each such test uses keys of its own (keyOf).
	shared    *pgtest.Server
	sharedErr error
)

func TestMain(m *testing.M) {
	if conn := os.Getenv(helperEnv); conn != "" {
		os.Exit(helperProcess(conn))
	}
	shared, sharedErr = pgtest.New()
	if sharedErr != nil && os.Getenv("CI") == "" {
		// The tests skip without a server (see server); the examples,
		// which cannot skip, are left out.
		_ = flag.Set("test.run", "^Test")
	}
	goleak.VerifyTestMain(closingM{m})
}

// closingM closes the shared server once the tests ran, before goleak
// looks for goroutines left behind.
type closingM struct{ *testing.M }

func (c closingM) Run() int {
	defer shared.Close()
	return c.M.Run()
}

// server returns the shared server, skipping (or failing, under CI) the
// test when PostgreSQL is not installed.
func server(t *testing.T) *pgtest.Server {
	t.Helper()
	pgtest.Require(t, sharedErr)
	return shared
}

// keyOf is a key no other test uses.
func keyOf(t *testing.T, name string) string { return t.Name() + "/" + name }

// newProvider returns a provider on srv, closed at the end of the test.
func newProvider(t *testing.T, srv *pgtest.Server, opts ...pglock.Option) *pglock.Provider {
	t.Helper()
	p, err := pglock.New(bg, srv.ConnString(), opts...)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, p.Close()) })
	return p
}

func mustAcquire(t *testing.T, p tenace.LockProvider, key string, opts tenace.LockAcquireOptions) tenace.LockLease {
	t.Helper()
	l, err := p.Acquire(bg, key, opts)
	require.NoError(t, err)
	require.NotNil(t, l)
	return l
}

type result struct {
	lease tenace.LockLease
	err   error
}

func acquireAsync(ctx context.Context, p tenace.LockProvider, key string, opts tenace.LockAcquireOptions) <-chan result {
	r := make(chan result, 1) // the goroutine never blocks on it
	go func() {
		l, err := p.Acquire(ctx, key, opts)
		r <- result{l, err}
	}()
	return r
}

// locks returns the sessions of the key's advisory lock on srv, as
// "pid:granted" lines ordered by pid, "" when nobody holds or waits.
func locks(t *testing.T, srv *pgtest.Server, key string) string {
	t.Helper()
	return srv.MustExec(t, fmt.Sprintf(`SELECT coalesce(string_agg(l.pid || ':' || l.granted, ' ' ORDER BY l.pid), '')
FROM pg_locks l JOIN tenace_lock_keys k ON l.objid = k.id::oid
WHERE l.locktype = 'advisory' AND l.objsubid = 2 AND l.classid = 'tenace_lock_keys'::regclass::oid AND k.key = convert_to(%s, 'UTF8')`, quote(key)))
}

// waiters returns how many sessions wait for the key's lock.
func waiters(t *testing.T, srv *pgtest.Server, key string) int {
	t.Helper()
	return strings.Count(locks(t, srv, key), ":false")
}

// waitForWaiters waits until n sessions wait for key on the server. No
// event tells when a statement has reached the server's lock queue, so this
// asks pg_locks until it says so (as PostgreSQL's own isolation tester
// does), within 20 s.
func waitForWaiters(t *testing.T, srv *pgtest.Server, key string, n int) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for waiters(t, srv, key) != n {
		if time.Now().After(deadline) {
			t.Fatalf("%d sessions did not come to wait for %q within 20s: %s", n, key, locks(t, srv, key))
		}
		time.Sleep(5 * time.Millisecond) // polling interval, not synchronisation
	}
}

func quote(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

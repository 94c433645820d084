package etcdlock_test

import (
	"context"
	"flag"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"
	"go.uber.org/zap"

	"tenace.dev/internal/etcdtest"
	"tenace.dev/tenace"
	"tenace.dev/tenace/etcdlock"
)

var bg = context.Background()

// testWindow is the etcd lease TTL of the tests' providers: short, so that
// the faults play out in seconds. Its margin is 500ms.
const testWindow = 2 * time.Second

// busyWindow is the window of the tests that load the machine and whose
// subject is not a lease's life: a keepalive of a process starved of CPU
// (48 callers under -race, beside other work: load average 30 on 2 cores)
// may take more than testWindow's 1.5s to come back, and a lease lost
// there would fail what the test checks for another reason.
const busyWindow = 15 * time.Second

// shared is the one-member cluster of the examples, which cannot start
// their own.
var (
	shared    *etcdtest.Cluster
	sharedErr error
)

func TestMain(m *testing.M) {
	if ep := os.Getenv(helperEnv); ep != "" {
		os.Exit(helperProcess(ep))
	}
	shared, sharedErr = etcdtest.New(1)
	if sharedErr != nil && os.Getenv("CI") == "" {
		// The tests skip without etcd (etcdtest.Start); the examples,
		// which cannot skip, are left out.
		_ = flag.Set("test.run", "^Test")
	}
	goleak.VerifyTestMain(closingM{m})
}

// closingM stops the shared cluster once the tests ran, before goleak
// looks for goroutines left behind.
type closingM struct{ *testing.M }

func (c closingM) Run() int {
	defer shared.Close()
	if sharedErr != nil && os.Getenv("CI") != "" {
		fmt.Fprintln(os.Stderr, "etcdlock: the examples' etcd:", sharedErr)
		return 1
	}
	return c.M.Run()
}

// newClient returns a client on endpoints, closed at the end of the test
// (after the providers on it, which register their Close later).
func newClient(t testing.TB, endpoints ...string) *clientv3.Client {
	t.Helper()
	c, err := clientv3.New(clientv3.Config{Endpoints: endpoints, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// newProvider returns a provider on c with the tests' window, closed at the
// end of the test.
func newProvider(t testing.TB, c *clientv3.Client, opts ...etcdlock.Option) *etcdlock.Provider {
	t.Helper()
	p := etcdlock.New(c, append([]etcdlock.Option{etcdlock.WithWindow(testWindow)}, opts...)...)
	t.Cleanup(func() { require.NoError(t, p.Close()) })
	return p
}

// keyOf is a key no other test uses.
func keyOf(t *testing.T, name string) string { return t.Name() + "/" + name }

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
	at    time.Time
}

func acquireAsync(ctx context.Context, p tenace.LockProvider, key string, opts tenace.LockAcquireOptions) <-chan result {
	r := make(chan result, 1) // the goroutine never blocks on it
	go func() {
		l, err := p.Acquire(ctx, key, opts)
		r <- result{l, err, time.Now()}
	}()
	return r
}

// waitFor receives from ch within d.
func waitFor(t *testing.T, ch <-chan result, d time.Duration, what string) result {
	t.Helper()
	select {
	case r := <-ch:
		return r
	case <-time.After(d):
		t.Fatalf("%s: no answer within %v", what, d)
		return result{}
	}
}

// eventually polls cond every 10ms for up to d: for a state the provider
// reaches on its own, which no event announces (a waiter in etcd's queue).
func eventually(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v", what, d)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// queued is how many keys etcd has in key's queue (holder and waiters).
func queued(t *testing.T, c *clientv3.Client, p *etcdlock.Provider, key string) int {
	t.Helper()
	resp, err := c.Get(bg, p.Dir(key), clientv3.WithPrefix(), clientv3.WithCountOnly())
	require.NoError(t, err)
	return int(resp.Count)
}

func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// cluster starts a one-member etcd for the test.
func cluster(t *testing.T) *etcdtest.Cluster { t.Helper(); return etcdtest.Start(t) }

package etcdlock_test

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"tenace.dev/tenace"
	"tenace.dev/tenace/etcdlock"
)

// The test binary re-executes itself as a helper process when helperEnv
// holds the etcd endpoints (comma-separated); the others say what to do.
const (
	helperEnv   = "ETCDLOCK_TEST_HELPER_ENDPOINTS"
	helperMode  = "ETCDLOCK_TEST_HELPER_MODE" // "count", "order", "hold" or "hold-shared"
	helperKey   = "ETCDLOCK_TEST_HELPER_KEY"
	helperFile  = "ETCDLOCK_TEST_HELPER_FILE"
	helperIndex = "ETCDLOCK_TEST_HELPER_INDEX"

	helperRounds = 20
)

// helperProcess is main of a helper: "hold" takes the lock, prints "held"
// and its token, and holds it until killed ("hold-shared": shared, with
// one permit); "count" increments the number
// in the file helperRounds times under the lock, by read and rewrite (a
// lost update shows if two processes ever hold it at once); "order" takes
// the lock once and appends its index to the file.
func helperProcess(endpoints string) int {
	ctx := context.Background()
	c, err := clientv3.New(clientv3.Config{Endpoints: strings.Split(endpoints, ","), DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		fmt.Fprintln(os.Stderr, "helper:", err)
		return 1
	}
	defer c.Close()
	p := etcdlock.New(c, etcdlock.WithWindow(testWindow))
	defer p.Close()
	key, file := os.Getenv(helperKey), os.Getenv(helperFile)
	if mode := os.Getenv(helperMode); mode == "hold" || mode == "hold-shared" {
		var opts tenace.LockAcquireOptions
		if mode == "hold-shared" {
			opts = tenace.LockAcquireOptions{Shared: true, Permits: 1}
		}
		l, err := p.Acquire(ctx, key, opts)
		if err != nil || l == nil {
			fmt.Fprintln(os.Stderr, "helper: acquire:", l, err)
			return 1
		}
		fmt.Println("held", l.(tenace.FencedLease).Token())
		select {}
	}
	rounds := helperRounds
	if os.Getenv(helperMode) == "order" {
		rounds = 1
	}
	for range rounds {
		l, err := p.Acquire(ctx, key, tenace.LockAcquireOptions{})
		if err != nil || l == nil {
			fmt.Fprintln(os.Stderr, "helper: acquire:", l, err)
			return 1
		}
		b, err := os.ReadFile(file)
		if err != nil {
			fmt.Fprintln(os.Stderr, "helper:", err)
			return 1
		}
		var out string
		if os.Getenv(helperMode) == "order" {
			out = string(b) + os.Getenv(helperIndex) + " "
		} else {
			n, _ := strconv.Atoi(strings.TrimSpace(string(b)))
			out = strconv.Itoa(n + 1)
		}
		if err := os.WriteFile(file, []byte(out), 0o600); err != nil {
			fmt.Fprintln(os.Stderr, "helper:", err)
			return 1
		}
		if err := l.Release(ctx); err != nil {
			fmt.Fprintln(os.Stderr, "helper: release:", err)
			return 1
		}
	}
	return 0
}

// helper starts a helper process in mode on the endpoints.
func helper(t *testing.T, endpoints []string, mode, key, file string, index int) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), helperEnv+"="+strings.Join(endpoints, ","), helperMode+"="+mode,
		helperKey+"="+key, helperFile+"="+file, helperIndex+"="+strconv.Itoa(index))
	cmd.Stderr = os.Stderr
	return cmd
}

// TestExclusionAcrossProcesses: four processes increment a number in a file
// under the lock, by read and rewrite: no update is lost.
func TestExclusionAcrossProcesses(t *testing.T) {
	c := cluster(t)
	key := keyOf(t, "k")
	file := filepath.Join(t.TempDir(), "n")
	require.NoError(t, os.WriteFile(file, []byte("0"), 0o600))
	const procs = 4
	cmds := make([]*exec.Cmd, procs)
	for i := range cmds {
		cmds[i] = helper(t, c.Endpoints(), "count", key, file, i)
		require.NoError(t, cmds[i].Start())
	}
	for _, cmd := range cmds {
		require.NoError(t, cmd.Wait())
	}
	b, err := os.ReadFile(file)
	require.NoError(t, err)
	require.Equal(t, strconv.Itoa(procs*helperRounds), string(b), "updates were lost: two processes held the lock at once")
}

// TestFIFOAcrossProcesses: processes that queue one after another (each
// starts once the previous one's key is in etcd's queue) are granted in
// that order.
func TestFIFOAcrossProcesses(t *testing.T) {
	c := cluster(t)
	cl := newClient(t, c.Endpoints()...)
	p := newProvider(t, cl)
	key := keyOf(t, "k")
	file := filepath.Join(t.TempDir(), "order")
	require.NoError(t, os.WriteFile(file, nil, 0o600))
	held := mustAcquire(t, p, key, tenace.LockAcquireOptions{})
	const procs = 4
	cmds := make([]*exec.Cmd, procs)
	for i := range cmds {
		cmds[i] = helper(t, c.Endpoints(), "order", key, file, i)
		require.NoError(t, cmds[i].Start())
		eventually(t, 20*time.Second, fmt.Sprintf("process %d queued", i), func() bool { return queued(t, cl, p, key) == i+2 })
	}
	require.NoError(t, held.Release(bg))
	for _, cmd := range cmds {
		require.NoError(t, cmd.Wait())
	}
	b, err := os.ReadFile(file)
	require.NoError(t, err)
	require.Equal(t, "0 1 2 3 ", string(b))
}

// TestKilledHolderFreesTheKey: a holder process killed with SIGKILL leaves
// its key to its etcd lease, which etcd expires within one window: the
// waiter is granted within it (plus the server's expiry checks), with a
// higher token. In the shared mode, the killed holder's one permit comes
// back.
func TestKilledHolderFreesTheKey(t *testing.T) { forModes(t, testKilledHolderFreesTheKey) }

func testKilledHolderFreesTheKey(t *testing.T, m mode) {
	c := cluster(t)
	p := newProvider(t, newClient(t, c.Endpoints()...))
	key := keyOf(t, "k")
	hold := "hold"
	if m.shared {
		hold = "hold-shared"
	}
	cmd := helper(t, c.Endpoints(), hold, key, "", 0)
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	line, err := bufio.NewReader(out).ReadString('\n')
	require.NoError(t, err)
	var token uint64
	_, err = fmt.Sscanf(line, "held %d", &token)
	require.NoError(t, err, "helper said %q", line)

	ch := acquireAsync(bg, p, key, m.with(tenace.LockAcquireOptions{}))
	eventually(t, 10*time.Second, "waiter counted", func() bool { return p.Stats().Waiting == 1 })
	killed := time.Now()
	require.NoError(t, cmd.Process.Kill())
	r := waitFor(t, ch, 3*testWindow, "the waiter after the holder was killed")
	require.NoError(t, r.err)
	require.NotNil(t, r.lease)
	d := r.at.Sub(killed)
	t.Logf("granted %v after the holder was killed (window %v)", d, testWindow)
	// etcd checks lease expiry every 500ms, and a lease lasts at least its
	// TTL from its last keepalive, which came up to a renewal interval
	// before the kill.
	require.Less(t, d, testWindow+time.Second, "the key stayed held past the window")
	require.Greater(t, r.lease.(tenace.FencedLease).Token(), token)
	require.NoError(t, r.lease.Release(bg))
}

package pglock_test

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

	"tenace.dev/internal/pgtest"
	"tenace.dev/tenace"
	"tenace.dev/tenace/pglock"
)

// The test binary re-executes itself as a helper process when helperEnv
// holds a connection string; the other variables say what to do.
const (
	helperEnv   = "PGLOCK_TEST_HELPER_CONN"
	helperMode  = "PGLOCK_TEST_HELPER_MODE" // "count", "order", "hold" or "holdpermit"
	helperKey   = "PGLOCK_TEST_HELPER_KEY"
	helperFile  = "PGLOCK_TEST_HELPER_FILE"
	helperIndex = "PGLOCK_TEST_HELPER_INDEX"

	helperRounds = 40
)

// helperProcess is main of a helper: "count" increments the number in
// the file helperRounds times under the lock, by read and rewrite (a lost
// update shows if two processes ever hold the lock at once); "order" takes
// the lock once and appends its index to the file.
func helperProcess(conn string) int {
	ctx := context.Background()
	p, err := pglock.New(ctx, conn, pglock.WithMaxConns(2))
	if err != nil {
		fmt.Fprintln(os.Stderr, "helper:", err)
		return 1
	}
	defer p.Close()
	key, file := os.Getenv(helperKey), os.Getenv(helperFile)
	if mode := os.Getenv(helperMode); mode == "hold" || mode == "holdpermit" {
		// Take the lock (the one permit of the key), say so, and hold it
		// until killed.
		opts := tenace.LockAcquireOptions{}
		if mode == "holdpermit" {
			opts = tenace.LockAcquireOptions{Shared: true, Permits: 1}
		}
		if l, err := p.Acquire(ctx, key, opts); err != nil || l == nil {
			fmt.Fprintln(os.Stderr, "helper: acquire:", l, err)
			return 1
		}
		fmt.Println("held")
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
		if os.Getenv(helperMode) == "order" {
			f, err := os.OpenFile(file, os.O_APPEND|os.O_WRONLY, 0)
			if err == nil {
				_, err = fmt.Fprintln(f, os.Getenv(helperIndex))
				err = errorsJoin(err, f.Close())
			}
			if err != nil {
				fmt.Fprintln(os.Stderr, "helper:", err)
				return 1
			}
		} else {
			b, err := os.ReadFile(file)
			n, _ := strconv.Atoi(strings.TrimSpace(string(b)))
			if err == nil {
				err = os.WriteFile(file, []byte(strconv.Itoa(n+1)), 0o600)
			}
			if err != nil {
				fmt.Fprintln(os.Stderr, "helper:", err)
				return 1
			}
		}
		if err := l.Release(ctx); err != nil {
			fmt.Fprintln(os.Stderr, "helper: release:", err)
			return 1
		}
	}
	return 0
}

func errorsJoin(a, b error) error {
	if a != nil {
		return a
	}
	return b
}

func startHelper(t *testing.T, connString, mode, key, file string, index int) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), helperEnv+"="+connString, helperMode+"="+mode,
		helperKey+"="+key, helperFile+"="+file, helperIndex+"="+strconv.Itoa(index))
	cmd.Stderr = os.Stderr
	require.NoError(t, cmd.Start())
	return cmd
}

// TestMutualExclusionAcrossThreeProcesses: three OS processes increment a
// counter in a file by read-and-rewrite, each under the lock; no update is
// lost.
func TestMutualExclusionAcrossThreeProcesses(t *testing.T) {
	srv := server(t)
	key := keyOf(t, "counter")
	file := filepath.Join(t.TempDir(), "counter")
	require.NoError(t, os.WriteFile(file, []byte("0"), 0o600))
	const procs = 3
	var cmds []*exec.Cmd
	for i := range procs {
		cmds = append(cmds, startHelper(t, srv.ConnString(), "count", key, file, i))
	}
	for _, cmd := range cmds {
		require.NoError(t, cmd.Wait())
	}
	b, err := os.ReadFile(file)
	require.NoError(t, err)
	require.Equal(t, strconv.Itoa(procs*helperRounds), string(b), "no lost update")
}

// TestFIFOAcrossProcesses: waiters in different processes are granted in
// the order they reached the server's lock queue. Each helper starts only
// once the previous one waits on the server (pg_locks says so).
func TestFIFOAcrossProcesses(t *testing.T) {
	srv := server(t)
	p := newProvider(t, srv)
	key := keyOf(t, "k")
	file := filepath.Join(t.TempDir(), "order")
	require.NoError(t, os.WriteFile(file, nil, 0o600))
	held := mustAcquire(t, p, key, tenace.LockAcquireOptions{})
	const procs = 4
	var cmds []*exec.Cmd
	for i := range procs {
		cmds = append(cmds, startHelper(t, srv.ConnString(), "order", key, file, i))
		waitForWaiters(t, srv, key, i+1)
	}
	require.NoError(t, held.Release(bg))
	for _, cmd := range cmds {
		require.NoError(t, cmd.Wait())
	}
	b, err := os.ReadFile(file)
	require.NoError(t, err)
	require.Equal(t, "0\n1\n2\n3\n", string(b), "granted in arrival order")
}

// TestKilledHolderFreesTheKey: a holder process killed with SIGKILL (its
// socket closed by the kernel) frees the key for a waiter in another
// process at once: the server ends the session when the socket ends.
func TestKilledHolderFreesTheKey(t *testing.T) {
	srv := server(t)
	p := newProvider(t, srv)
	key := keyOf(t, "k")
	kill := startHolder(t, srv, "hold", key)
	r := acquireAsync(bg, p, key, tenace.LockAcquireOptions{Timeout: 10 * time.Second})
	waitForWaiters(t, srv, key, 1)
	start := time.Now()
	kill()
	res := <-r
	delay := time.Since(start)
	require.NoError(t, res.err)
	require.NotNil(t, res.lease, "granted within 10s of the kill")
	t.Logf("granted %v after the holder process was killed", delay)
	require.NoError(t, res.lease.Release(bg))
}

// startHolder starts a helper process that takes key (mode "hold": the
// whole key; "holdpermit": its one permit) and holds it until kill, which
// sends it SIGKILL and reaps it.
func startHolder(t *testing.T, srv *pgtest.Server, mode, key string) (kill func()) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), helperEnv+"="+srv.ConnString(), helperMode+"="+mode, helperKey+"="+key)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	killed := false
	kill = func() {
		if !killed {
			killed = true
			require.NoError(t, cmd.Process.Kill())
			_ = cmd.Wait()
		}
	}
	t.Cleanup(kill)
	line, err := bufio.NewReader(out).ReadString('\n')
	require.NoError(t, err)
	require.Equal(t, "held\n", line)
	return kill
}

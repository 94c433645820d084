package redislock_test

import (
	"bufio"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"tenace.dev/tenace"
	"tenace.dev/tenace/redislock"
)

// Every name a script of the package reads or writes is one of its
// declared KEYS: a Cluster redirects a script, or asks it to try again
// while the slot migrates, by its declared keys only, so a name made
// inside the script could be missing on the node that runs it. The server
// shows every command a script runs (MONITOR); COMMAND GETKEYS says which
// of its arguments are keys. Run through each script's paths: grants,
// refusals, a waiting writer's mark and unmark, renewals, releases, a set,
// Inspect and the fence.
func TestScriptsTouchOnlyTheirDeclaredKeys(t *testing.T) {
	srv, c := setup(t)
	conn, err := net.Dial("tcp", srv.Addr)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	_, err = conn.Write([]byte("MONITOR\r\n"))
	require.NoError(t, err)
	r := bufio.NewReader(conn)
	ok, err := r.ReadString('\n')
	require.NoError(t, err)
	require.Equal(t, "+OK\r\n", ok)
	var (
		mu    sync.Mutex
		lines []string
		done  = make(chan struct{})
	)
	go func() {
		defer close(done)
		for {
			line, err := r.ReadString('\n')
			if err != nil {
				return
			}
			mu.Lock()
			lines = append(lines, strings.TrimSuffix(line, "\r\n"))
			mu.Unlock()
		}
	}()

	saw := func(script string) bool {
		mu.Lock()
		defer mu.Unlock()
		for _, l := range lines {
			if f := strings.Fields(l); len(f) > 4 && strings.EqualFold(f[3], `"evalsha"`) && redislock.ScriptName(redis.NewCmd(bg, "evalsha", strings.Trim(f[4], `"`))) == script {
				return true
			}
		}
		return false
	}
	p := newProvider(t, c, redislock.WithWindow(300*time.Millisecond), redislock.WithRenewInterval(50*time.Millisecond))
	x := mustAcquire(t, p, "x", tenace.LockAcquireOptions{Owner: "job"})
	held, err := p.Acquire(bg, "x", tenace.LockAcquireOptions{Timeout: tenace.NoWait})
	require.NoError(t, err)
	require.Nil(t, held)
	require.Eventually(t, func() bool { return saw("renew") }, 5*time.Second, 5*time.Millisecond)
	_, err = p.Inspect(bg, "x")
	require.NoError(t, err)
	require.NoError(t, x.Release(bg))
	x = mustAcquire(t, p, "x", tenace.LockAcquireOptions{}) // a grant over the last one's owner record
	require.NoError(t, x.Release(bg))

	s1 := mustAcquire(t, p, "s", tenace.LockAcquireOptions{Shared: true, Permits: 2})
	s2 := mustAcquire(t, p, "s", tenace.LockAcquireOptions{Shared: true, Permits: 2})
	full, err := p.Acquire(bg, "s", tenace.LockAcquireOptions{Shared: true, Permits: 2, Timeout: tenace.NoWait})
	require.NoError(t, err)
	require.Nil(t, full)
	writer, err := p.Acquire(bg, "s", tenace.LockAcquireOptions{Timeout: 30 * time.Millisecond}) // marks, gives up, unmarks
	require.NoError(t, err)
	require.Nil(t, writer)
	require.Eventually(t, func() bool { return saw("sharedRenew") }, 5*time.Second, 5*time.Millisecond)
	_, err = p.List(bg, tenace.ListOptions{})
	require.NoError(t, err)
	require.NoError(t, s1.Release(bg))
	require.NoError(t, s2.Release(bg))

	set, err := p.AcquireSet(bg, []string{"acct}1", "acct}2"}, tenace.LockAcquireOptions{})
	require.NoError(t, err)
	require.NoError(t, set.Release(bg))
	require.NoError(t, redislock.FencedSet(bg, c, "guarded", "v", 1))
	require.NoError(t, p.Close())

	// The unmark runs in the background.
	require.Eventually(t, func() bool { return saw("unmark") }, 5*time.Second, 5*time.Millisecond)
	require.NoError(t, c.Ping(bg).Err()) // a marker in the stream: everything before it has been fed
	require.Eventually(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(lines) > 0 && strings.Contains(strings.ToLower(lines[len(lines)-1]), `"ping"`)
	}, 5*time.Second, 10*time.Millisecond)
	_ = conn.Close()
	<-done

	// MONITOR feeds a script's call, then the commands it runs.
	seen := map[string]int{}
	var script string
	var declared []string
	for _, line := range lines {
		src, args := monitorLine(t, line)
		if src != "lua" {
			script, declared = "", nil
			if name := strings.ToLower(args[0]); name == "evalsha" || name == "eval" {
				script = redislock.ScriptName(redis.NewCmd(bg, name, args[1]))
				n, err := strconv.Atoi(args[2])
				require.NoError(t, err)
				declared = args[3 : 3+n]
				seen[script]++
			}
			continue
		}
		if len(args) == 1 {
			continue // TIME: no arguments, no keys
		}
		keys, err := c.CommandGetKeys(bg, anys(args)...).Result()
		if err != nil && strings.Contains(err.Error(), "no key arguments") {
			continue
		}
		require.NoError(t, err, args)
		for _, k := range keys {
			require.Contains(t, declared, k, "script %q ran %q on an undeclared key (declared: %q)", script, args, declared)
		}
	}
	for _, s := range []string{"acquire", "acquireSet", "renew", "sharedRenew", "release", "sharedRelease", "unmark", "fence"} {
		require.NotZero(t, seen[s], "the script %q ran (seen: %v)", s, seen)
	}
}

// monitorLine reads a MONITOR line: `+1700000000.000000 [0 127.0.0.1:5000]
// "GET" "k"`, where the source is "lua" for a script's own commands.
func monitorLine(t *testing.T, line string) (src string, args []string) {
	t.Helper()
	open, end := strings.IndexByte(line, '['), strings.IndexByte(line, ']')
	require.True(t, open >= 0 && end > open, line)
	fields := strings.Fields(line[open+1 : end])
	require.Len(t, fields, 2, line)
	rest := line[end+1:]
	for {
		i := strings.IndexByte(rest, '"')
		if i < 0 {
			break
		}
		var b strings.Builder
		j := i + 1
		for ; j < len(rest) && rest[j] != '"'; j++ {
			if rest[j] == '\\' && j+1 < len(rest) {
				j++
				if rest[j] == 'x' && j+2 < len(rest) {
					v, err := strconv.ParseUint(rest[j+1:j+3], 16, 8)
					require.NoError(t, err, line)
					b.WriteByte(byte(v))
					j += 2
					continue
				}
				switch rest[j] {
				case 'n':
					b.WriteByte('\n')
				case 'r':
					b.WriteByte('\r')
				case 't':
					b.WriteByte('\t')
				case 'a':
					b.WriteByte('\a')
				case 'b':
					b.WriteByte('\b')
				default:
					b.WriteByte(rest[j])
				}
				continue
			}
			b.WriteByte(rest[j])
		}
		args = append(args, b.String())
		rest = rest[j+1:]
	}
	require.NotEmpty(t, args, line)
	return fields[1], args
}

func anys(ss []string) []any {
	out := make([]any, len(ss))
	for i, s := range ss {
		out[i] = s
	}
	return out
}

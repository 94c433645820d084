package main

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"
	"go.uber.org/zap"

	"tenace.dev/internal/etcdtest"
	"tenace.dev/internal/pgtest"
	"tenace.dev/internal/redistest"
	"tenace.dev/internal/serverproc"
	"tenace.dev/tenace"
	"tenace.dev/tenace/etcdlock"
	"tenace.dev/tenace/lockhttp"
	"tenace.dev/tenace/pglock"
	"tenace.dev/tenace/redislock"
)

func TestMain(m *testing.M) {
	if os.Getenv("TENACE_TEST_MAIN") == "1" {
		main() // the command itself, for TestReaderLeaves
	}
	// go-redis dials a pool connection on a goroutine Client.Close does not
	// stop (see redislock's tests); it ends on its own.
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction("github.com/redis/go-redis/v9/internal/pool.(*ConnPool).dialConn"))
}

var bg = context.Background()

// engine is one server the command reads, with a provider that locks on it.
type engine struct {
	name  string
	start func(t *testing.T) (flags []string, p tenace.LockProvider)
	// down returns the flags of a server that refuses connections.
	down func(t *testing.T) []string
}

func freeAddr(t *testing.T) string {
	port, err := serverproc.FreePort()
	require.NoError(t, err)
	return fmt.Sprintf("127.0.0.1:%d", port)
}

var engines = []engine{
	{
		name: "redis",
		start: func(t *testing.T) ([]string, tenace.LockProvider) {
			srv := redistest.Start(t)
			c := redis.NewClient(&redis.Options{Addr: srv.Addr, ContextTimeoutEnabled: true})
			p := redislock.New(c, redislock.WithOwner("api-7f9c"))
			t.Cleanup(func() { _ = p.Close(); _ = c.Close() })
			return []string{"--redis", srv.Addr}, p
		},
		down: func(t *testing.T) []string { return []string{"--redis", freeAddr(t)} },
	},
	{
		name: "postgres",
		start: func(t *testing.T) ([]string, tenace.LockProvider) {
			srv := pgtest.Start(t)
			p, err := pglock.New(bg, srv.ConnString(), pglock.WithOwner("api-7f9c"))
			require.NoError(t, err)
			t.Cleanup(func() { _ = p.Close() })
			return []string{"--postgres", srv.ConnString()}, p
		},
		down: func(t *testing.T) []string {
			return []string{"--postgres", "postgres://postgres@" + freeAddr(t) + "/postgres?sslmode=disable"}
		},
	},
	{
		name: "etcd",
		start: func(t *testing.T) ([]string, tenace.LockProvider) {
			c := etcdtest.Start(t)
			cl, err := clientv3.New(clientv3.Config{Endpoints: c.Endpoints(), DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
			require.NoError(t, err)
			p := etcdlock.New(cl, etcdlock.WithOwner("api-7f9c"))
			t.Cleanup(func() { _ = p.Close(); _ = cl.Close() })
			return []string{"--etcd", strings.Join(c.Endpoints(), ",")}, p
		},
		down: func(t *testing.T) []string { return []string{"--etcd", "http://" + freeAddr(t)} },
	},
}

// A key and an owner's label that are not UTF-8, with a terminal's escape.
const (
	badKey   = "jobs/\xff\xfe"
	badOwner = "night\xff\x1b[31m"
)

func unquote(t *testing.T, s string) string {
	t.Helper()
	u, err := strconv.Unquote(s)
	require.NoError(t, err, "%s", s)
	return u
}

// withoutMoment is a JSON document decoded, without what depends on the
// moment it was written: "at", "held_ms" (counted from it), and the time
// of "expires" (a TTL read then), true in its place, or nothing when
// noExpires.
func withoutMoment(t *testing.T, doc string, noExpires bool) any {
	t.Helper()
	var v any
	require.NoError(t, json.Unmarshal([]byte(doc), &v))
	var strip func(any)
	strip = func(v any) {
		switch v := v.(type) {
		case map[string]any:
			delete(v, "at")
			delete(v, "held_ms")
			if _, ok := v["expires"]; ok {
				v["expires"] = true
			}
			if noExpires {
				delete(v, "expires")
			}
			for _, e := range v {
				strip(e)
			}
		case []any:
			for _, e := range v {
				strip(e)
			}
		}
	}
	strip(v)
	return v
}

// runCmd runs the command in-process and returns its status and output.
func runCmd(args ...string) (int, string, string) {
	var out, errOut bytes.Buffer
	code := run(args, &out, &errOut)
	return code, out.String(), errOut.String()
}

// The command lists the held keys under a prefix — hostile ones shown
// inert — as a table and as JSON, and inspects one key with its waiter,
// on every engine.
func TestLocksAndInspect(t *testing.T) {
	for _, e := range engines {
		t.Run(e.name, func(t *testing.T) {
			flags, p := e.start(t)
			hostile := "jobs/\x1b[31mred\n<script>"
			var leases []tenace.LockLease
			for _, k := range []string{"jobs/a", "jobs/b", hostile, "other"} {
				l, err := p.Acquire(bg, k, tenace.LockAcquireOptions{Owner: "nightly"})
				require.NoError(t, err)
				require.NotNil(t, l)
				leases = append(leases, l)
			}
			// Bytes that are not UTF-8, in a key and in an owner's label.
			l, err := p.Acquire(bg, badKey, tenace.LockAcquireOptions{Owner: badOwner})
			require.NoError(t, err)
			require.NotNil(t, l)
			leases = append(leases, l)
			defer func() {
				for _, l := range leases {
					require.NoError(t, l.Release(bg))
				}
			}()

			code, out, errOut := runCmd(append([]string{"locks", "--prefix", "jobs/"}, flags...)...)
			require.Equal(t, 0, code, errOut)
			t.Logf("tenace locks:\n%s", out)
			require.Contains(t, out, "KEY")
			require.Contains(t, out, "jobs/a")
			require.Contains(t, out, "api-7f9c (nightly)")
			require.Contains(t, out, `"jobs/\x1b[31mred\n<script>"`, "quoted, inert")
			require.NotContains(t, out, "\x1b", "no raw escape reaches the terminal")
			require.NotContains(t, out, "\xff", "no byte that is not UTF-8 reaches the terminal")
			require.Contains(t, out, `"jobs/\xff\xfe"`)
			require.Contains(t, out, strconv.Quote("api-7f9c ("+badOwner+")"))
			require.NotContains(t, out, "other")

			code, out, errOut = runCmd(append([]string{"locks", "--json"}, flags...)...)
			require.Equal(t, 0, code, errOut)
			var got lockhttp.Snapshot
			require.NoError(t, json.Unmarshal([]byte(out), &got))
			keys := map[string]lockhttp.Key{}
			for _, k := range got.Keys {
				raw, err := base64.StdEncoding.DecodeString(k.Base64)
				require.NoError(t, err)
				keys[string(raw)] = k
			}
			require.Contains(t, keys, hostile)
			require.Contains(t, keys, "other")
			require.False(t, got.Truncated)
			require.Equal(t, "api-7f9c (nightly)", keys["jobs/a"].Holders[0].Owner)
			require.NotNil(t, keys["jobs/a"].Holders[0].Since)
			// Lossless: the text unquotes to the bytes, and base64 is them.
			bad := keys[badKey]
			require.True(t, bad.Quoted)
			require.Equal(t, badKey, unquote(t, bad.Key))
			require.True(t, bad.Holders[0].OwnerQuoted)
			require.Equal(t, "api-7f9c ("+badOwner+")", unquote(t, bad.Holders[0].Owner))
			raw, err := base64.StdEncoding.DecodeString(bad.Holders[0].OwnerBase64)
			require.NoError(t, err)
			require.Equal(t, "api-7f9c ("+badOwner+")", string(raw))
			require.NotContains(t, out, `\ufffd`)
			require.NotContains(t, out, "\ufffd")

			// The same document as lockhttp's page serves for the same
			// locks, but for the moment it was taken.
			rec := httptest.NewRecorder()
			lockhttp.Handler(p.(tenace.Inspector)).ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/json", nil))
			require.Equal(t, http.StatusOK, rec.Code, rec.Body.String())
			require.Equal(t, withoutMoment(t, rec.Body.String(), false), withoutMoment(t, out, false))
			// inspect writes the key as the page would list it (but
			// for Expires, which etcdlock's List does not read).
			code, out, errOut = runCmd(append([]string{"inspect", badKey, "--json"}, flags...)...)
			require.Equal(t, 0, code, errOut)
			rec = httptest.NewRecorder()
			lockhttp.Handler(p.(tenace.Inspector)).ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/json?prefix="+url.QueryEscape(badKey), nil))
			var fromPage lockhttp.Snapshot
			require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &fromPage))
			require.Len(t, fromPage.Keys, 1)
			page, err := json.Marshal(fromPage.Keys[0])
			require.NoError(t, err)
			require.Equal(t, withoutMoment(t, string(page), true), withoutMoment(t, out, true))

			code, out, errOut = runCmd(append([]string{"locks", "--max", "1", "--prefix", "jobs/"}, flags...)...)
			require.Equal(t, 0, code, errOut)
			require.Contains(t, out, "more keys are held")
			code, out, errOut = runCmd(append([]string{"locks", "--max", "1", "--prefix", "jobs/", "--json"}, flags...)...)
			require.Equal(t, 0, code, errOut)
			require.NoError(t, json.Unmarshal([]byte(out), &got))
			require.True(t, got.Truncated)
			require.Len(t, got.Keys, 1)

			// A waiter, then inspect.
			ctx, cancel := context.WithCancel(bg)
			waited := make(chan error, 1)
			go func() {
				_, err := p.Acquire(ctx, "jobs/a", tenace.LockAcquireOptions{Timeout: time.Minute})
				waited <- err
			}()
			require.Eventually(t, func() bool {
				info, err := p.(tenace.Inspector).Inspect(bg, "jobs/a")
				require.NoError(t, err)
				return info.Waiting == 1
			}, 20*time.Second, 10*time.Millisecond)
			code, out, errOut = runCmd(append([]string{"inspect", "jobs/a"}, flags...)...)
			cancel()
			require.ErrorIs(t, <-waited, context.Canceled)
			require.Equal(t, 0, code, errOut)
			t.Logf("tenace inspect:\n%s", out)
			require.Contains(t, out, "key jobs/a")
			require.Contains(t, out, "api-7f9c (nightly)")
			require.Contains(t, out, "exclusive")
			require.Contains(t, out, "1 waiting")

			code, out, errOut = runCmd(append(append([]string{"inspect"}, flags...), "--json", "free")...)
			require.Equal(t, 0, code, errOut)
			var free lockhttp.Key
			require.NoError(t, json.Unmarshal([]byte(out), &free))
			require.Equal(t, "free", free.Key)
			require.Empty(t, free.Holders)

			code, out, _ = runCmd(append([]string{"locks", "--prefix", "none/"}, flags...)...)
			require.Equal(t, 0, code)
			require.Equal(t, "no key is held\n", out)
		})
	}
}

// A server that refuses connections is a clear error and status 1, within
// a few seconds, never an empty listing.
func TestUnreachableServer(t *testing.T) {
	for _, e := range engines {
		t.Run(e.name, func(t *testing.T) {
			for _, cmd := range [][]string{{"locks"}, {"inspect", "k"}} {
				start := time.Now()
				code, out, errOut := runCmd(append(cmd, append(e.down(t), "--timeout", "3s")...)...)
				took := time.Since(start)
				t.Logf("%s on a dead %s: status %d after %v: %s", cmd[0], e.name, code, took.Round(time.Millisecond), errOut)
				require.Equal(t, 1, code)
				require.Empty(t, out)
				require.Contains(t, errOut, "tenace "+cmd[0]+": ")
				require.Contains(t, errOut, "refused")
				require.Contains(t, errOut, "check", "what to do")
				require.Less(t, took, 4*time.Second)
			}
		})
	}
}

// A PostgreSQL database without the table is an error that says what to
// check, not a connection's advice.
func TestPostgresWithoutTheTable(t *testing.T) {
	srv := pgtest.Start(t)
	for _, args := range [][]string{{"locks"}, {"inspect", "k", "--table", "nope"}} {
		code, out, errOut := runCmd(append(args, "--postgres", srv.ConnString())...)
		require.Equal(t, 1, code, "%q", args)
		require.Empty(t, out)
		require.Contains(t, errOut, "is missing")
		require.Contains(t, errOut, "check that --postgres names the database, and --table the table, that your services lock with")
		require.NotContains(t, errOut, "reach it")
	}
}

// A silent server is an error within --timeout.
func TestSilentServer(t *testing.T) {
	srv := redistest.Start(t)
	srv.Pause()
	defer srv.Resume()
	// SIGSTOP takes effect when the kernel next schedules the server: wait
	// until a command of another client goes unanswered.
	probe := redis.NewClient(&redis.Options{Addr: srv.Addr, ContextTimeoutEnabled: true})
	defer probe.Close()
	require.Eventually(t, func() bool {
		ctx, cancel := context.WithTimeout(bg, 100*time.Millisecond)
		defer cancel()
		return probe.Ping(ctx).Err() != nil
	}, 10*time.Second, time.Millisecond)
	start := time.Now()
	code, _, errOut := runCmd("locks", "--redis", srv.Addr, "--timeout", "300ms")
	require.Equal(t, 1, code)
	require.Contains(t, errOut, "no answer within --timeout 300ms")
	require.Less(t, time.Since(start), 3*time.Second)
}

// Misuse is status 2 with a word on what is wrong.
func TestUsage(t *testing.T) {
	for _, c := range []struct {
		args []string
		says string
	}{
		{nil, "usage:"},
		{[]string{"frobnicate"}, `unknown command "frobnicate"`},
		{[]string{"locks"}, "give one server"},
		{[]string{"locks", "--redis", "a", "--etcd", "b"}, "give one server"},
		{[]string{"inspect", "--redis", "a"}, "which key?"},
		{[]string{"locks", "--redis", "a", "extra"}, "unexpected arguments"},
		{[]string{"locks", "--bogus"}, "flag provided but not defined"},
	} {
		code, _, errOut := runCmd(c.args...)
		require.Equal(t, 2, code, "%q", c.args)
		require.Contains(t, errOut, c.says, "%q", c.args)
	}
	code, _, errOut := runCmd("--help")
	require.Equal(t, 0, code)
	require.Contains(t, errOut, "usage:")
}

// showKey and showText leave plain keys and owners as they are and quote
// the rest: no quoted text is taken for another.
func TestShowKey(t *testing.T) {
	for in, want := range map[string]string{
		"jobs/a":   "jobs/a",
		"héllo":    "héllo",
		"a b":      `"a b"`,
		"\xff":     `"\xff"`,
		"\x1b[31m": `"\x1b[31m"`,
		"":         `""`,
	} {
		require.Equal(t, want, showKey(in))
	}
	for in, want := range map[string]string{
		"api-7f9c (nightly)": "api-7f9c (nightly)",
		"":                   "-",
		"\xff":               `"\xff"`,
		"\x1b[31m":           `"\x1b[31m"`,
		`"\xff"`:             `"\"\\xff\""`,
	} {
		require.Equal(t, want, showText(in))
	}
}

// The key of inspect may sit anywhere among the flags, as the usage line
// allows: flags after it are read, not taken for extra arguments.
func TestInspectKeyAmongFlags(t *testing.T) {
	for _, c := range []struct {
		args []string
		key  string
	}{
		{[]string{"--timeout", "2s", "k", "--json"}, "k"},
		{[]string{"k", "--json", "--timeout", "2s"}, "k"},
		{[]string{"--json", "k"}, "k"},
		{[]string{"--json", "--", "-k"}, "-k"},
	} {
		var errOut bytes.Buffer
		cfg, key, status := parse("inspect", append([]string{"--redis", "127.0.0.1:1"}, c.args...), &errOut)
		require.Equal(t, -1, status, "%q: %s", c.args, errOut.String())
		require.Equal(t, c.key, key, "%q", c.args)
		require.True(t, cfg.json, "%q: --json read", c.args)
		if slices.Contains(c.args, "--timeout") {
			require.Equal(t, 2*time.Second, cfg.timeout, "%q: --timeout read", c.args)
		}
	}
	code, _, errOut := runCmd("inspect", "a", "b", "--redis", "127.0.0.1:1")
	require.Equal(t, 2, code)
	require.Contains(t, errOut, `unexpected arguments ["a" "b"]`)
}

// Help asked for, of a command or of the program, is status 0 with the
// flags described; a bad flag is status 2.
func TestHelp(t *testing.T) {
	for _, args := range [][]string{{"-h"}, {"help"}, {"locks", "-h"}, {"inspect", "--help"}} {
		code, out, errOut := runCmd(args...)
		require.Equal(t, 0, code, "%q", args)
		require.Empty(t, out)
		require.Contains(t, errOut, "usage:", "%q", args)
	}
	code, _, errOut := runCmd("locks", "-h")
	require.Equal(t, 0, code)
	require.Contains(t, errOut, "-prefix", "the command's flags described")
	code, _, _ = runCmd("locks", "--redis")
	require.Equal(t, 2, code)
}

// A reader that leaves early (tenace locks | head -1): the command ends
// quietly with a non-zero status, as a Go program does, by SIGPIPE on its
// standard output, and with status 1 on any other writer.
func TestReaderLeaves(t *testing.T) {
	srv := redistest.Start(t)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr, ContextTimeoutEnabled: true})
	p := redislock.New(c)
	defer func() { _ = p.Close(); _ = c.Close() }()
	l, err := p.Acquire(bg, "jobs/a", tenace.LockAcquireOptions{})
	require.NoError(t, err)
	defer l.Release(bg)

	for _, args := range [][]string{{"locks"}, {"locks", "--json"}, {"inspect", "jobs/a"}, {"inspect", "jobs/a", "--json"}} {
		args = append(args, "--redis", srv.Addr)
		// A pipe whose reader has left, in-process: EPIPE.
		r, w, err := os.Pipe()
		require.NoError(t, err)
		require.NoError(t, r.Close())
		var errOut bytes.Buffer
		require.Equal(t, 1, run(args, w, &errOut), "%q", args)
		require.NoError(t, w.Close())
		require.Empty(t, errOut.String(), "%q: quiet", args)

		// The program, its standard output such a pipe: SIGPIPE.
		r, w, err = os.Pipe()
		require.NoError(t, err)
		require.NoError(t, r.Close())
		cmd := exec.Command(os.Args[0], args...)
		cmd.Env = append(os.Environ(), "TENACE_TEST_MAIN=1")
		cmd.Stdout = w
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		err = cmd.Run()
		require.NoError(t, w.Close())
		var exit *exec.ExitError
		require.ErrorAs(t, err, &exit, "%q", args)
		ws := exit.Sys().(syscall.WaitStatus)
		require.True(t, ws.Signaled() && ws.Signal() == syscall.SIGPIPE, "%q: %v", args, err)
		require.Empty(t, stderr.String(), "%q: quiet", args)
	}

	// Any other failed write is said, with status 1.
	var errOut bytes.Buffer
	require.Equal(t, 1, run([]string{"locks", "--redis", srv.Addr}, failingWriter{syscall.ENOSPC}, &errOut))
	require.Equal(t, "tenace: writing the answer: "+syscall.ENOSPC.Error()+"\n", errOut.String())
}

type failingWriter struct{ err error }

func (f failingWriter) Write([]byte) (int, error) { return 0, f.err }

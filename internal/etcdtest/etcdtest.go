// Package etcdtest starts throwaway etcd clusters for tests and benchmarks:
// one member or three, each member on free loopback ports with its own data
// directory under the test's temporary directory, stopped when the test
// ends. Members can be killed, stopped (SIGTERM), paused (SIGSTOP), resumed
// and restarted from their data directory.
//
// When etcd is not installed, Start skips the test — except when the CI
// environment variable is set, where it fails instead, so that CI never
// passes by skipping. Install it with `apt-get install etcd-server`
// (Debian's 3.4 speaks the v3 API).
//
// The package uses the standard library only (the core module's
// dependencies stay small): the leader is read from each member's /metrics.
package etcdtest

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"tenace.dev/internal/serverproc"
)

// Timing of the test clusters: a heartbeat of 50ms and an election timeout
// of 500ms (etcd's defaults are 100ms and 1s), so that a leader's death is
// noticed within a second. etcd's shortest lease TTL is then 1.5 × 500ms,
// rounded up to whole seconds: 1s.
const (
	HeartbeatMS = 50
	ElectionMS  = 500
)

// readyLine is what an etcd member logs once it serves clients.
const readyLine = "serving client traffic"

// Member is one etcd process of a Cluster.
type Member struct {
	Name      string
	ClientURL string // http://127.0.0.1:port
	peerURL   string
	dir       string
	c         *Cluster
	cmd       *exec.Cmd
	done      chan error
	paused    bool

	logMu sync.Mutex
	logs  []string // its last logLines lines, for report
}

// logLines is how many of a member's last log lines a failed test shows.
const logLines = 30

// Cluster is a running etcd cluster of one or more members.
type Cluster struct {
	Members []*Member
	bin     string
	token   string
	tb      testing.TB // nil for a cluster from New
	tmp     string     // the data of a cluster from New, removed by Close
}

// Start starts a one-member cluster for tb and registers its stop with
// tb.Cleanup.
func Start(tb testing.TB) *Cluster { tb.Helper(); return StartN(tb, 1) }

// ErrNotInstalled is returned by New when etcd is not installed (see
// Require).
var ErrNotInstalled = errors.New("etcd is not installed: scripts/servers check prints the install command for this system (make test installs it when run as root with apt-get)")

// Require skips tb when err is ErrNotInstalled (fails it when the CI
// environment variable is set: CI must not skip the etcd tests), and fails
// it on any other error.
func Require(tb testing.TB, err error) {
	tb.Helper()
	switch {
	case err == nil:
	case errors.Is(err, ErrNotInstalled) && os.Getenv("CI") == "":
		tb.Skip(err)
	case errors.Is(err, ErrNotInstalled):
		tb.Fatalf("%v; CI must not skip the etcd tests", err)
	default:
		tb.Fatalf("etcdtest: %v", err)
	}
}

// StartN starts an n-member cluster for tb, and returns once every member
// serves clients (a cluster has a leader then).
func StartN(tb testing.TB, n int) *Cluster {
	tb.Helper()
	c, err := newCluster(n, tb.TempDir())
	if c != nil {
		c.tb = tb
		tb.Cleanup(func() {
			if tb.Failed() {
				c.report()
			}
			c.Stop()
		})
	}
	Require(tb, err)
	return c
}

// New starts an n-member cluster for a TestMain that shares one between
// tests (its data under a new temporary directory); the caller must Close
// it. It returns ErrNotInstalled (see Require) when etcd is missing. Its
// members' methods that fail a test need a cluster from StartN.
func New(n int) (*Cluster, error) {
	dir, err := os.MkdirTemp("", "etcdtest")
	if err != nil {
		return nil, err
	}
	c, err := newCluster(n, dir)
	if c != nil {
		c.tmp = dir
	}
	if err != nil {
		c.Close()
		_ = os.RemoveAll(dir)
		return nil, err
	}
	return c, nil
}

// Close stops every member and removes the data of a cluster from New. A
// nil cluster is fine.
func (c *Cluster) Close() {
	if c == nil {
		return
	}
	c.Stop()
	if c.tmp != "" {
		_ = os.RemoveAll(c.tmp)
	}
}

func newCluster(n int, dir string) (*Cluster, error) {
	bin, err := exec.LookPath("etcd")
	if err != nil {
		return nil, ErrNotInstalled
	}
	// A port free a moment ago may be taken by another process before the
	// member binds it (tests of other packages start servers at the same
	// time): the member exits at start, and the cluster is started again
	// on new ports, a few times.
	for try := 1; ; try++ {
		c, err := tryCluster(bin, n, dir)
		if err == nil || c == nil || try == startTries || !strings.Contains(err.Error(), "address already in use") {
			return c, err
		}
		c.Stop()
		for _, m := range c.Members {
			_ = os.RemoveAll(m.dir)
		}
	}
}

// startTries bounds the starts of a new cluster whose ports were taken.
const startTries = 3

func tryCluster(bin string, n int, dir string) (*Cluster, error) {
	c := &Cluster{bin: bin, token: fmt.Sprintf("tenace-%d", time.Now().UnixNano())}
	for i := range n {
		cp, err1 := serverproc.FreePort()
		pp, err2 := serverproc.FreePort()
		if err := errors.Join(err1, err2); err != nil {
			return nil, fmt.Errorf("no free loopback port: %w", err)
		}
		c.Members = append(c.Members, &Member{
			Name: fmt.Sprintf("m%d", i), c: c, dir: filepath.Join(dir, fmt.Sprintf("m%d", i)),
			ClientURL: "http://127.0.0.1:" + strconv.Itoa(cp), peerURL: "http://127.0.0.1:" + strconv.Itoa(pp),
		})
	}
	return c, c.startAll()
}

// Endpoints are the members' client URLs, for clientv3.Config.
func (c *Cluster) Endpoints() []string {
	e := make([]string, len(c.Members))
	for i, m := range c.Members {
		e[i] = m.ClientURL
	}
	return e
}

// startAll starts every member that is not running, at once (a member of a
// cluster is ready only once a quorum runs), and waits until all are ready.
func (c *Cluster) startAll() error {
	var readies []<-chan struct{}
	var starting []*Member
	for _, m := range c.Members {
		if m.cmd != nil {
			continue
		}
		ready, err := m.spawn()
		if err != nil {
			return err
		}
		readies = append(readies, ready)
		starting = append(starting, m)
	}
	deadline := time.After(30 * time.Second)
	for i, ready := range readies {
		m := starting[i]
		select {
		case <-ready:
		case err := <-m.done:
			m.done <- err
			return fmt.Errorf("etcd member %s exited at start: %v", m.Name, err)
		case <-deadline:
			return fmt.Errorf("etcd member %s was not ready within 30s", m.Name)
		}
	}
	return nil
}

// mustStartAll is startAll for a cluster from StartN.
func (c *Cluster) mustStartAll() {
	c.tb.Helper()
	if err := c.startAll(); err != nil {
		c.tb.Fatalf("etcdtest: %v", err)
	}
}

func (m *Member) spawn() (<-chan struct{}, error) {
	c := m.c
	var initial []string
	for _, o := range c.Members {
		initial = append(initial, o.Name+"="+o.peerURL)
	}
	m.cmd = exec.Command(c.bin,
		"--name", m.Name, "--data-dir", m.dir,
		"--listen-client-urls", m.ClientURL, "--advertise-client-urls", m.ClientURL,
		"--listen-peer-urls", m.peerURL, "--initial-advertise-peer-urls", m.peerURL,
		"--initial-cluster", strings.Join(initial, ","), "--initial-cluster-state", "new",
		"--initial-cluster-token", c.token,
		"--heartbeat-interval", strconv.Itoa(HeartbeatMS), "--election-timeout", strconv.Itoa(ElectionMS),
		"--logger", "zap", "--log-outputs", "stderr", "--log-level", "info",
	)
	out, err := m.cmd.StderrPipe()
	if err != nil {
		return nil, err
	}
	m.cmd.Stdout = nil
	if err := m.cmd.Start(); err != nil {
		m.cmd = nil
		return nil, fmt.Errorf("etcdtest: starting etcd: %w", err)
	}
	m.logMu.Lock()
	m.logs = m.logs[:0]
	m.logMu.Unlock()
	ready, done := serverproc.Watch(m.cmd, out, readyLine, func(line string) {
		m.logMu.Lock()
		defer m.logMu.Unlock()
		if len(m.logs) == logLines {
			m.logs = append(m.logs[:0], m.logs[1:]...)
		}
		m.logs = append(m.logs, line)
	})
	m.done = done
	m.paused = false
	return ready, nil
}

// report logs, for a failed test, each member's state, and the last lines
// of a member that exited while it was to run: a client's "connection
// refused" from a member then says why.
func (c *Cluster) report() {
	for _, m := range c.Members {
		if m.cmd == nil {
			c.tb.Logf("etcdtest: member %s (%s) was stopped by the test", m.Name, m.ClientURL)
			continue
		}
		select {
		case err := <-m.done:
			m.done <- err // for Stop
			m.logMu.Lock()
			c.tb.Logf("etcdtest: member %s (%s) exited while it was to run: %v; its last log lines:\n%s",
				m.Name, m.ClientURL, err, strings.Join(m.logs, "\n"))
			m.logMu.Unlock()
		default:
			c.tb.Logf("etcdtest: member %s (%s) runs (pid %d, paused %v)", m.Name, m.ClientURL, m.cmd.Process.Pid, m.paused)
		}
	}
}

// Stop stops every member (resuming paused ones first); it is idempotent.
func (c *Cluster) Stop() {
	for _, m := range c.Members {
		m.Kill()
	}
}

// Restart stops every member and starts them again from their data
// directories, and waits until all serve clients: the cluster keeps its
// keys, leases (their TTLs start again) and revisions.
func (c *Cluster) Restart() {
	c.tb.Helper()
	for _, m := range c.Members {
		m.Terminate()
	}
	c.mustStartAll()
}

// Kill stops the member abruptly (SIGKILL), as a crash would, and waits for
// it to exit. It does nothing to a stopped member.
func (m *Member) Kill() {
	m.signalAndWait(syscall.SIGKILL)
}

// Terminate stops the member cleanly (SIGTERM) and waits for it to exit.
func (m *Member) Terminate() {
	m.signalAndWait(syscall.SIGTERM)
}

func (m *Member) signalAndWait(sig syscall.Signal) {
	if m.cmd == nil {
		return
	}
	if m.paused {
		_ = m.cmd.Process.Signal(syscall.SIGCONT)
	}
	_ = m.cmd.Process.Signal(sig)
	select {
	case <-m.done:
	case <-time.After(10 * time.Second):
		_ = m.cmd.Process.Kill()
		<-m.done
	}
	m.cmd = nil
}

// Start starts a stopped member again from its data directory, and waits
// until it serves clients (which needs a quorum of the cluster running).
func (m *Member) Start() {
	m.c.tb.Helper()
	m.c.mustStartAll()
}

// Pause stalls the member with SIGSTOP, as a long GC pause or a stalled VM
// would: its connections stay open and requests go unanswered. Resume
// undoes it; Stop and Kill resume a paused member first.
func (m *Member) Pause() {
	m.c.tb.Helper()
	if err := m.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		m.c.tb.Fatalf("etcdtest: SIGSTOP: %v", err)
	}
	m.paused = true
}

// Resume lets a paused member run again (SIGCONT).
func (m *Member) Resume() {
	if m.cmd == nil || !m.paused {
		return
	}
	_ = m.cmd.Process.Signal(syscall.SIGCONT)
	m.paused = false
}

// IsLeader reports whether the member is the cluster's leader, from its
// etcd_server_is_leader metric; false when it does not answer within 2s.
func (m *Member) IsLeader() bool {
	if m.cmd == nil || m.paused {
		return false
	}
	cl := http.Client{Timeout: 2 * time.Second}
	resp, err := cl.Get(m.ClientURL + "/metrics")
	if err != nil {
		return false
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if f := strings.Fields(sc.Text()); len(f) == 2 && f[0] == "etcd_server_is_leader" {
			_, _ = io.Copy(io.Discard, resp.Body)
			return f[1] == "1"
		}
	}
	return false
}

// Leader returns the member that leads the cluster, waiting up to 10s for
// one (after an election, say).
func (c *Cluster) Leader() *Member {
	c.tb.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		for _, m := range c.Members {
			if m.IsLeader() {
				return m
			}
		}
		if time.Now().After(deadline) {
			c.tb.Fatal("etcdtest: no leader within 10s")
		}
		time.Sleep(20 * time.Millisecond) // polling a metric: no event says so
	}
}

// Package redistest starts throwaway redis-server processes for tests and
// benchmarks: each on a free loopback port, in its own temporary directory,
// with persistence off, stopped when the test ends.
//
// When redis-server is not installed, Start skips the test — except when the
// CI environment variable is set, where it fails instead, so that CI never
// passes by skipping. Install it with `apt-get install redis-server`
// (.ci/run and make test do so where they can).
package redistest

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"tenace.dev/internal/serverproc"
)

// Server is one running redis-server.
type Server struct {
	Addr    string // host:port on 127.0.0.1
	port    int
	dir     string
	cmd     *exec.Cmd
	done    chan error // the process's exit
	tb      testing.TB
	cluster bool
	// clusterOK is closed when a cluster-enabled server logs that its
	// cluster state is ok.
	clusterOK chan struct{}
	// monitors is the primary a sentinel watches, as "host port"; "" for a
	// plain server.
	monitors string
}

// MasterName is the name a sentinel from StartSentinel knows its primary by.
const MasterName = "tenace-primary"

// StartSentinel starts a Redis Sentinel that monitors primary under
// MasterName, so that a redis.FailoverClient can find it. It returns once
// the sentinel has started monitoring.
func StartSentinel(tb testing.TB, primary *Server) *Server {
	tb.Helper()
	host, port, _ := net.SplitHostPort(primary.Addr)
	return startWith(tb, func(s *Server) { s.monitors = host + " " + port })
}

// Start starts a redis-server for tb and registers its stop with tb.Cleanup.
func Start(tb testing.TB) *Server { tb.Helper(); return start(tb, false) }

// StartCluster starts a one-node Redis Cluster: a cluster-enabled server
// that owns every hash slot, so that a redis.ClusterClient can run the same
// scripts and Pub/Sub against it. It returns once the cluster state is ok.
func StartCluster(tb testing.TB) *Server {
	tb.Helper()
	s := start(tb, true)
	if err := command(s.Addr, "CLUSTER", "ADDSLOTSRANGE", "0", "16383"); err != nil {
		tb.Fatalf("redistest: assigning the hash slots: %v", err)
	}
	select {
	case <-s.clusterOK:
	case <-time.After(10 * time.Second):
		tb.Fatal("redistest: the cluster state did not become ok within 10s")
	}
	return s
}

func start(tb testing.TB, cluster bool) *Server {
	tb.Helper()
	return startWith(tb, func(s *Server) { s.cluster = cluster })
}

func startWith(tb testing.TB, set func(*Server)) *Server {
	tb.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		const msg = "redis-server is not installed: scripts/servers check prints the install command for this system (make test installs it when run as root with apt-get)"
		if os.Getenv("CI") != "" {
			tb.Fatal(msg + "; CI must not skip the Redis tests")
		}
		tb.Skip(msg)
	}
	port, err := serverproc.FreePort()
	if err != nil {
		tb.Fatalf("redistest: no free loopback port: %v", err)
	}
	s := &Server{Addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), port: port, dir: tb.TempDir(), tb: tb}
	set(s)
	if err := s.start(bin); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(s.Stop)
	return s
}

func (s *Server) start(bin string) error {
	args := []string{
		"--port", strconv.Itoa(s.port), "--bind", "127.0.0.1",
		"--dir", s.dir, "--save", "", "--appendonly", "no",
		"--daemonize", "no", "--protected-mode", "yes", "--loglevel", "notice",
	}
	if s.cluster {
		args = append(args, "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf")
	}
	readyLine := "Ready to accept connections"
	if s.monitors != "" {
		// A sentinel rewrites its configuration file, so it needs one.
		conf := filepath.Join(s.dir, "sentinel.conf")
		body := fmt.Sprintf("port %d\nbind 127.0.0.1\ndir %s\nsentinel monitor %s %s 1\n", s.port, s.dir, MasterName, s.monitors)
		if err := os.WriteFile(conf, []byte(body), 0o600); err != nil {
			return err
		}
		args = []string{conf, "--sentinel", "--loglevel", "notice"}
		readyLine = "+monitor master " + MasterName
	}
	s.cmd = exec.Command(bin, args...)
	out, err := s.cmd.StdoutPipe()
	if err != nil {
		return err
	}
	s.cmd.Stderr = s.cmd.Stdout
	if err := s.cmd.Start(); err != nil {
		return fmt.Errorf("redistest: starting redis-server: %w", err)
	}
	s.clusterOK = make(chan struct{})
	clusterOK := s.clusterOK
	isOK := false // read and written by the watcher's goroutine only
	var ready <-chan struct{}
	ready, s.done = serverproc.Watch(s.cmd, out, readyLine, func(line string) {
		if !isOK && strings.Contains(line, "Cluster state changed: ok") {
			isOK = true
			close(clusterOK)
		}
	})
	// The server says when it is ready; no polling.
	select {
	case <-ready:
	case err := <-s.done:
		s.done <- err
		return fmt.Errorf("redistest: redis-server exited at start: %v", err)
	case <-time.After(10 * time.Second):
		_ = s.cmd.Process.Kill()
		return errors.New("redistest: redis-server was not ready within 10s")
	}
	return ping(s.Addr)
}

// ping sends one RESP PING and expects +PONG.
func ping(addr string) error { return command(addr, "PING") }

// command sends one command in RESP and expects a simple-string reply
// (+PONG, +OK).
func command(addr string, args ...string) error {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(time.Second))
	var b strings.Builder
	fmt.Fprintf(&b, "*%d\r\n", len(args))
	for _, a := range args {
		fmt.Fprintf(&b, "$%d\r\n%s\r\n", len(a), a)
	}
	if _, err := c.Write([]byte(b.String())); err != nil {
		return err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return err
	}
	if !strings.HasPrefix(line, "+") {
		return fmt.Errorf("%s: unexpected reply %q", args[0], strings.TrimSpace(line))
	}
	return nil
}

// Kill stops the server abruptly (SIGKILL), as a crash would, and waits for
// the process to exit.
func (s *Server) Kill() {
	if s.cmd == nil || s.cmd.Process == nil {
		return
	}
	_ = s.cmd.Process.Kill()
	<-s.done
	s.cmd = nil
}

// Restart kills the server and starts it again on the same port, empty:
// the server keeps no data (no RDB, no AOF), as a cache node restarted
// after a crash.
func (s *Server) Restart() {
	s.tb.Helper()
	s.Kill()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		s.tb.Fatal(err)
	}
	if err := s.start(bin); err != nil {
		s.tb.Fatal(err)
	}
}

// Pause stalls the server with SIGSTOP, as a long GC pause, a swapped-out
// process or a stalled VM would: connections stay open, commands queue
// unanswered in the socket buffers, and the server runs them once resumed.
// Resume undoes it; the test's cleanup resumes a paused server before
// stopping it.
func (s *Server) Pause() {
	s.tb.Helper()
	if err := s.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		s.tb.Fatalf("redistest: SIGSTOP: %v", err)
	}
	s.tb.Cleanup(s.Resume)
}

// Resume lets a paused server run again (SIGCONT); it does nothing to a
// running or stopped one.
func (s *Server) Resume() {
	if s.cmd == nil || s.cmd.Process == nil {
		return
	}
	_ = s.cmd.Process.Signal(syscall.SIGCONT)
}

// Stop stops the server; it is idempotent.
func (s *Server) Stop() { s.Kill() }

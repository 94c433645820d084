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
	"strconv"
	"strings"
	"testing"
	"time"
)

// Server is one running redis-server.
type Server struct {
	Addr string // host:port on 127.0.0.1
	port int
	dir  string
	cmd  *exec.Cmd
	done chan error // the process's exit
	tb   testing.TB
}

// Start starts a redis-server for tb and registers its stop with tb.Cleanup.
func Start(tb testing.TB) *Server {
	tb.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		const msg = "redis-server is not installed: apt-get install redis-server (make test installs it when run as root)"
		if os.Getenv("CI") != "" {
			tb.Fatal(msg + "; CI must not skip the Redis tests")
		}
		tb.Skip(msg)
	}
	port, err := freePort()
	if err != nil {
		tb.Fatalf("redistest: no free loopback port: %v", err)
	}
	s := &Server{Addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), port: port, dir: tb.TempDir(), tb: tb}
	if err := s.start(bin); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(s.Stop)
	return s
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func (s *Server) start(bin string) error {
	s.cmd = exec.Command(bin,
		"--port", strconv.Itoa(s.port), "--bind", "127.0.0.1",
		"--dir", s.dir, "--save", "", "--appendonly", "no",
		"--daemonize", "no", "--protected-mode", "yes", "--loglevel", "notice")
	out, err := s.cmd.StdoutPipe()
	if err != nil {
		return err
	}
	s.cmd.Stderr = s.cmd.Stdout
	if err := s.cmd.Start(); err != nil {
		return fmt.Errorf("redistest: starting redis-server: %w", err)
	}
	s.done = make(chan error, 1)
	ready := make(chan struct{})
	var lines []string // what it printed before it was ready, for the error
	go func() {
		sc := bufio.NewScanner(out)
		isReady := false
		for sc.Scan() {
			if !isReady {
				lines = append(lines, sc.Text())
				if strings.Contains(sc.Text(), "Ready to accept connections") {
					isReady = true
					close(ready)
				}
			}
		}
		err := s.cmd.Wait()
		if !isReady {
			s.done <- fmt.Errorf("%v: %s", err, strings.Join(lines, "\n"))
			return
		}
		s.done <- err
	}()
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
func ping(addr string) error {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(time.Second))
	if _, err := c.Write([]byte("*1\r\n$4\r\nPING\r\n")); err != nil {
		return err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return err
	}
	if !strings.HasPrefix(line, "+PONG") {
		return fmt.Errorf("unexpected reply %q", line)
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

// Restart starts the server again on the same port (after Kill), empty.
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

// Stop stops the server; it is idempotent.
func (s *Server) Stop() { s.Kill() }

// Package pgtest starts throwaway PostgreSQL servers for tests and
// benchmarks: each is a fresh cluster (initdb) in its own temporary
// directory, listening on a free loopback port with its unix socket in that
// directory, stopped and removed when the test ends.
//
// It uses the binaries of Debian's postgresql package, found under
// /usr/lib/postgresql/<version>/bin (the newest version), or on PATH. The
// server refuses to run as root, so when the tests run as root, initdb and
// postgres run as the postgres user (which the package creates) and the
// temporary directory is owned by it.
//
// StartPooler puts a PgBouncer (Debian's pgbouncer package) in front of a
// server, for tests of what a pooler breaks.
//
// When PostgreSQL is not installed, Start skips the test — except when the CI
// environment variable is set, where it fails instead, so that CI never
// passes by skipping. Install it with `apt-get install postgresql`
// (.ci/run and make test do so where they can).
//
// The servers run with fsync off, which is safe here: Kill and Restart stop
// processes, not the machine, so what the server wrote is in the page cache
// and a restart on the same data directory finds it (crash recovery replays
// the WAL after Kill).
//
// Only the standard library is used (SQL runs through the psql client), so
// that the core module gains no dependency.
package pgtest

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"tenace.dev/internal/serverproc"
)

// readyLine is what the postmaster logs once it accepts connections.
const readyLine = "database system is ready to accept connections"

// startTimeout bounds initdb and a start; a healthy server needs a second or
// two.
const startTimeout = 30 * time.Second

// Server is one PostgreSQL cluster. Stop, Kill, Restart and Close are not
// safe for concurrent use; Exec is.
type Server struct {
	// Port is the TCP port on 127.0.0.1; it stays the same across Restart.
	Port int

	bin     string // the directory of initdb, postgres and psql
	dir     string // owned by the server's user: data/ and the socket
	cred    *syscall.Credential
	cmd     *exec.Cmd
	done    chan error // the postmaster's exit, buffered
	stopped bool
	stalled []int // the processes Stall stopped, postmaster first; nil when none
}

// ErrNotInstalled is returned by New when no PostgreSQL binaries are found.
var ErrNotInstalled = errors.New("PostgreSQL is not installed: scripts/servers check prints the install command for this system (make test installs it when run as root with apt-get)")

// Start creates and starts a server for tb and registers its removal with
// tb.Cleanup. Without PostgreSQL it skips tb, or fails it when CI is set.
func Start(tb testing.TB) *Server {
	tb.Helper()
	s, err := New()
	Require(tb, err)
	tb.Cleanup(s.Close)
	return s
}

// Require skips tb when err is ErrNotInstalled (fails it when the CI
// environment variable is set: CI must not skip the PostgreSQL tests), and
// fails it on any other error.
func Require(tb testing.TB, err error) {
	tb.Helper()
	switch {
	case err == nil:
	case errors.Is(err, ErrNotInstalled) && os.Getenv("CI") == "":
		tb.Skip(err)
	case errors.Is(err, ErrNotInstalled):
		tb.Fatalf("%v; CI must not skip the PostgreSQL tests", err)
	default:
		tb.Fatalf("pgtest: %v", err)
	}
}

// New creates and starts a server, for a TestMain that shares one server
// between tests; the caller must Close it. It returns ErrNotInstalled (see
// Require) when PostgreSQL is missing.
func New() (*Server, error) {
	bin, err := findBin()
	if err != nil {
		return nil, fmt.Errorf("%w (%v)", ErrNotInstalled, err)
	}
	s := &Server{bin: bin}
	if s.dir, s.cred, err = makeDir(); err != nil {
		return nil, err
	}
	initdb := exec.Command(filepath.Join(bin, "initdb"), "-D", s.dataDir(), "-U", "postgres",
		"-A", "trust", "-E", "UTF8", "--no-sync", "--no-instructions", "--locale=C")
	initdb.SysProcAttr = s.sysProcAttr()
	if out, err := initdb.CombinedOutput(); err != nil {
		s.Close()
		return nil, fmt.Errorf("initdb: %v\n%s", err, out)
	}
	// A free port can be taken by someone else before the server binds it:
	// try a few.
	for attempt := 0; ; attempt++ {
		if s.Port, err = serverproc.FreePort(); err != nil {
			s.Close()
			return nil, fmt.Errorf("no free loopback port: %v", err)
		}
		if err = s.start(); err == nil {
			return s, nil
		}
		if attempt == 4 || !strings.Contains(err.Error(), "could not bind") && !strings.Contains(err.Error(), "could not create any TCP/IP sockets") {
			s.Close()
			return nil, err
		}
	}
}

// Close stops the server and removes its directory. It is idempotent.
func (s *Server) Close() {
	if s == nil {
		return
	}
	s.Stop()
	_ = os.RemoveAll(s.dir)
}

// ConnString is a libpq keyword/value connection string for the server's
// postgres database, as the superuser postgres, over TCP.
func (s *Server) ConnString() string {
	return fmt.Sprintf("host=127.0.0.1 port=%d user=postgres dbname=postgres sslmode=disable", s.Port)
}

// Addr is the server's host:port.
func (s *Server) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(s.Port)) }

// DataDir is the cluster's data directory, kept across Kill, Stop and
// Restart.
func (s *Server) DataDir() string { return s.dataDir() }

func (s *Server) dataDir() string { return filepath.Join(s.dir, "data") }

// findBin returns the bin directory of the newest PostgreSQL under
// /usr/lib/postgresql, else the directory of postgres on PATH.
func findBin() (string, error) {
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(dirs, func(i, j int) bool { return version(dirs[i]) > version(dirs[j]) })
	for _, d := range dirs {
		if _, err := os.Stat(filepath.Join(d, "postgres")); err == nil {
			return d, nil
		}
	}
	p, err := exec.LookPath("postgres")
	if err != nil {
		return "", errors.New("no postgres binary under /usr/lib/postgresql/*/bin nor on PATH")
	}
	return filepath.Dir(p), nil
}

func version(binDir string) int {
	n, _ := strconv.Atoi(filepath.Base(filepath.Dir(binDir)))
	return n
}

// makeDir makes the temporary directory, owned by the postgres user when we
// are root (the server refuses to run as root); cred is then the postgres
// user's, nil otherwise.
func makeDir() (string, *syscall.Credential, error) {
	dir, err := os.MkdirTemp("", "pgtest-")
	if err != nil {
		return "", nil, err
	}
	if os.Geteuid() != 0 {
		return dir, nil, nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		_ = os.RemoveAll(dir)
		return "", nil, fmt.Errorf("running as root, and there is no postgres user to run the server as: %v", err)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	if err := os.Chown(dir, uid, gid); err != nil {
		_ = os.RemoveAll(dir)
		return "", nil, err
	}
	return dir, &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
}

func (s *Server) sysProcAttr() *syscall.SysProcAttr {
	// Pdeathsig: a test binary that dies takes its server with it
	// (SIGQUIT is PostgreSQL's immediate shutdown).
	return &syscall.SysProcAttr{Credential: s.cred, Pdeathsig: syscall.SIGQUIT, Setpgid: true}
}

// start runs the postmaster and returns once it logs that it accepts
// connections.
func (s *Server) start() error {
	s.cmd = exec.Command(filepath.Join(s.bin, "postgres"),
		"-D", s.dataDir(), "-p", strconv.Itoa(s.Port), "-k", s.dir,
		"-c", "listen_addresses=127.0.0.1",
		"-c", "fsync=off", "-c", "full_page_writes=off",
		"-c", "max_connections=200",
		"-c", "logging_collector=off", "-c", "log_destination=stderr")
	s.cmd.SysProcAttr = s.sysProcAttr()
	out, err := s.cmd.StderrPipe()
	if err != nil {
		return err
	}
	if err := s.cmd.Start(); err != nil {
		return fmt.Errorf("starting postgres: %w", err)
	}
	s.stopped = false
	ready, done := serverproc.Watch(s.cmd, out, readyLine, nil)
	s.done = done
	// The server says when it is ready; no polling.
	t := time.NewTimer(startTimeout)
	defer t.Stop()
	select {
	case <-ready:
		return nil
	case err := <-done:
		done <- err
		s.stopped = true
		return fmt.Errorf("postgres exited at start: %v", err)
	case <-t.C:
		s.signal(syscall.SIGQUIT)
		<-done
		s.stopped = true
		return fmt.Errorf("postgres was not ready within %v", startTimeout)
	}
}

func (s *Server) signal(sig syscall.Signal) {
	if s.cmd != nil && s.cmd.Process != nil {
		_ = s.cmd.Process.Signal(sig)
	}
}

// halt sends sig to the postmaster and waits for it to exit.
func (s *Server) halt(sig syscall.Signal) {
	if s == nil || s.cmd == nil || s.stopped {
		return
	}
	s.Continue() // a stopped process would never handle sig
	s.signal(sig)
	<-s.done
	s.stopped = true
}

// Pause stops the postmaster (SIGSTOP) until Resume: running backends go
// on, but a new connection hangs in its startup, unanswered, as on a
// stalled or overloaded server.
func (s *Server) Pause() { s.signal(syscall.SIGSTOP) }

// Resume continues the postmaster after Pause (SIGCONT).
func (s *Server) Resume() { s.signal(syscall.SIGCONT) }

// Stall stops the whole cluster (SIGSTOP): the postmaster first, so that it
// starts no new process, then every process it started — backends,
// checkpointer, WAL writer and the rest. Nothing answers then: the kernel
// still accepts new connections and answers keepalives, but no startup, no
// statement and no cancel request gets a reply, as on a server that hangs
// or a machine that froze. Continue resumes it; Stop, Kill, Restart and
// Close continue it first. Stall fails tb if a process cannot be stopped.
func (s *Server) Stall(tb testing.TB) {
	tb.Helper()
	if s.cmd == nil || s.stopped || s.stalled != nil {
		tb.Fatalf("pgtest: Stall on a server that is not running, or already stalled")
	}
	pm := s.cmd.Process.Pid
	if err := syscall.Kill(pm, syscall.SIGSTOP); err != nil {
		tb.Fatalf("pgtest: stopping the postmaster: %v", err)
	}
	s.stalled = []int{pm}
	children, err := childrenOf(pm)
	if err != nil {
		s.Continue()
		tb.Fatalf("pgtest: listing the postmaster's processes: %v", err)
	}
	for _, pid := range children {
		// A child that exits meanwhile (ESRCH) needs no stopping.
		if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil && !errors.Is(err, syscall.ESRCH) {
			s.Continue()
			tb.Fatalf("pgtest: stopping process %d: %v", pid, err)
		}
		s.stalled = append(s.stalled, pid)
	}
	// A signal is delivered when its process next runs: Stall returns once
	// every process is stopped, so that nothing runs past it.
	deadline := time.Now().Add(startTimeout)
	for _, pid := range s.stalled {
		// A child that exited is a zombie ('Z') until the postmaster,
		// stopped, reaps it: it runs no more either.
		for state := procState(pid); state != 'T' && state != 'Z' && state != 'X' && state != 0; state = procState(pid) {
			if time.Now().After(deadline) {
				s.Continue()
				tb.Fatalf("pgtest: process %d did not stop within %v (state %c)", pid, startTimeout, state)
			}
			time.Sleep(time.Millisecond) // the kernel tells nobody; ask it again
		}
	}
}

// procState is the state letter of process pid in /proc (T: stopped), 0
// when it has exited.
func procState(pid int) byte {
	f, err := procStat(pid)
	if err != nil {
		return 0
	}
	return f[0][0]
}

// procStat returns the fields of /proc/pid/stat after the command's name
// (state, ppid, ...): the name may hold spaces and parentheses, so they are
// read after its last ')'.
func procStat(pid int) ([]string, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return nil, err
	}
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	if len(f) < 2 {
		return nil, fmt.Errorf("/proc/%d/stat: %q", pid, b)
	}
	return f, nil
}

// Continue resumes a cluster that Stall stopped (SIGCONT), its children
// before the postmaster; it does nothing when none is stalled.
func (s *Server) Continue() {
	for i := len(s.stalled) - 1; i >= 0; i-- {
		_ = syscall.Kill(s.stalled[i], syscall.SIGCONT)
	}
	s.stalled = nil
}

// StalledPIDs returns the processes Stall stopped, the postmaster first;
// nil when the server is not stalled.
func (s *Server) StalledPIDs() []int { return append([]int(nil), s.stalled...) }

// childrenOf returns the processes whose parent is pid, from /proc. The
// children of a stopped postmaster cannot change but by exiting: it forks
// no new one.
func childrenOf(pid int) ([]int, error) {
	dirs, err := filepath.Glob("/proc/[0-9]*")
	if err != nil {
		return nil, err
	}
	var pids []int
	for _, d := range dirs {
		child, _ := strconv.Atoi(filepath.Base(d))
		f, err := procStat(child)
		if err != nil {
			continue // it exited
		}
		if ppid, _ := strconv.Atoi(f[1]); ppid == pid {
			pids = append(pids, child)
		}
	}
	return pids, nil
}

// Stop shuts the server down cleanly (fast shutdown: every session is
// terminated, the server checkpoints and exits) and waits for it to exit.
// It is idempotent; Restart starts it again.
func (s *Server) Stop() { s.halt(syscall.SIGINT) }

// Kill stops the server abruptly, as a crash would (immediate shutdown:
// every process quits at once, without a checkpoint), and waits for it to
// exit. Restart recovers from the WAL, so committed data survives.
func (s *Server) Kill() { s.halt(syscall.SIGQUIT) }

// Restart stops the server if it runs (cleanly) and starts it again on the
// same port and data directory.
func (s *Server) Restart(tb testing.TB) {
	tb.Helper()
	s.Stop()
	if err := s.start(); err != nil {
		tb.Fatalf("pgtest: restart: %v", err)
	}
}

// Exec runs sql (one or more statements) with psql as the superuser, and
// returns what it printed: unaligned, tuples only, one row a line, columns
// separated by '|', without the trailing newline.
func (s *Server) Exec(sql string) (string, error) {
	cmd := exec.Command(filepath.Join(s.bin, "psql"), "-X", "-q", "-A", "-t",
		"-v", "ON_ERROR_STOP=1", "-h", "127.0.0.1", "-p", strconv.Itoa(s.Port),
		"-U", "postgres", "-d", "postgres", "-c", sql)
	cmd.Env = append(os.Environ(), "PGCONNECT_TIMEOUT=10", "PGSSLMODE=disable")
	out, err := cmd.CombinedOutput()
	res := strings.TrimRight(string(out), "\n")
	if err != nil {
		return res, fmt.Errorf("psql %q: %v: %s", sql, err, res)
	}
	return res, nil
}

// MustExec is Exec that fails the test on error.
func (s *Server) MustExec(tb testing.TB, sql string) string {
	tb.Helper()
	out, err := s.Exec(sql)
	if err != nil {
		tb.Fatalf("pgtest: %v", err)
	}
	return out
}

// Terminate ends the backend with process id pid (pg_terminate_backend),
// as an administrator would, and waits for it to exit (up to 10 s).
func (s *Server) Terminate(tb testing.TB, pid uint32) {
	tb.Helper()
	out := s.MustExec(tb, fmt.Sprintf("SELECT pg_terminate_backend(%d, 10000)", pid))
	if out != "t" {
		tb.Fatalf("pgtest: pg_terminate_backend(%d) returned %q", pid, out)
	}
}

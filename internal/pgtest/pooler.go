package pgtest

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"tenace.dev/internal/serverproc"
)

// Pooler is a PgBouncer in front of a Server.
type Pooler struct {
	// Port is its TCP port on 127.0.0.1.
	Port int
}

// ConnString is a connection string to the server's postgres database
// through the pooler.
func (p *Pooler) ConnString() string {
	return fmt.Sprintf("host=127.0.0.1 port=%d user=postgres dbname=postgres sslmode=disable", p.Port)
}

// StartPooler starts PgBouncer (Debian's pgbouncer package) in front of s,
// in the given pool_mode ("session", "transaction" or "statement"),
// accepting the startup parameters that pglock sends, and stops it when tb
// ends. Without pgbouncer it skips tb, or fails it when CI is set.
func StartPooler(tb testing.TB, s *Server, mode string) *Pooler {
	tb.Helper()
	bin, err := exec.LookPath("pgbouncer")
	if err != nil {
		if bin, err = exec.LookPath("/usr/sbin/pgbouncer"); err != nil {
			Require(tb, fmt.Errorf("%w: pgbouncer is missing (scripts/servers check prints the install command for this system)", ErrNotInstalled))
		}
	}
	dir, err := os.MkdirTemp(s.dir, "pgbouncer-"+mode+"-")
	if err != nil {
		tb.Fatal(err)
	}
	if s.cred != nil {
		if err := os.Chown(dir, int(s.cred.Uid), int(s.cred.Gid)); err != nil {
			tb.Fatal(err)
		}
	}
	port, err := serverproc.FreePort()
	if err != nil {
		tb.Fatal(err)
	}
	ini := fmt.Sprintf(`[databases]
postgres = host=127.0.0.1 port=%d dbname=postgres user=postgres
[pgbouncer]
listen_addr = 127.0.0.1
listen_port = %d
auth_type = trust
auth_file = %s
pool_mode = %s
unix_socket_dir =
ignore_startup_parameters = extra_float_digits,statement_timeout,lock_timeout,default_transaction_isolation,tcp_keepalives_idle,tcp_keepalives_interval,tcp_keepalives_count
`, s.Port, port, filepath.Join(dir, "users.txt"), mode)
	for name, body := range map[string]string{"pgbouncer.ini": ini, "users.txt": `"postgres" ""` + "\n"} {
		f := filepath.Join(dir, name)
		if err := os.WriteFile(f, []byte(body), 0o600); err != nil {
			tb.Fatal(err)
		}
		if s.cred != nil {
			_ = os.Chown(f, int(s.cred.Uid), int(s.cred.Gid))
		}
	}
	cmd := exec.Command(bin, filepath.Join(dir, "pgbouncer.ini"))
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: s.cred, Pdeathsig: syscall.SIGTERM, Setpgid: true}
	out, err := os.Create(filepath.Join(dir, "log"))
	if err != nil {
		tb.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		tb.Fatal(err)
	}
	done := make(chan error, 1) // never blocks the waiter
	go func() { done <- cmd.Wait(); _ = out.Close() }()
	tb.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		<-done
	})
	// PgBouncer logs nothing on stdout that says it listens for sure;
	// its port accepting a connection does (within startTimeout).
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	deadline := time.Now().Add(startTimeout)
	for {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			_ = c.Close()
			return &Pooler{Port: port}
		}
		select {
		case err := <-done:
			done <- err
			log, _ := os.ReadFile(filepath.Join(dir, "log"))
			tb.Fatalf("pgtest: pgbouncer exited: %v\n%s", err, log)
		default:
		}
		if time.Now().After(deadline) {
			tb.Fatalf("pgtest: pgbouncer did not listen within %v", startTimeout)
		}
		time.Sleep(10 * time.Millisecond) // polling the port: no event says it listens
	}
}

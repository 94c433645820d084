package pgtest_test

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"tenace.dev/internal/pgtest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestRestartKeepsData: a server starts, takes SQL, and keeps committed data
// across a clean restart and across a crash (Kill) and restart.
func TestRestartKeepsData(t *testing.T) {
	s := pgtest.Start(t)
	s.MustExec(t, "CREATE TABLE t (v int); INSERT INTO t VALUES (1)")
	s.Restart(t)
	s.MustExec(t, "INSERT INTO t VALUES (2)")
	s.Kill()
	if _, err := s.Exec("SELECT 1"); err == nil {
		t.Fatal("a killed server still answered")
	}
	s.Restart(t)
	if got := s.MustExec(t, "SELECT string_agg(v::text, ',' ORDER BY v) FROM t"); got != "1,2" {
		t.Fatalf("after a crash and restart the table holds %q, want 1,2", got)
	}
}

// TestStopIsIdempotent: psql is the one client; Stop twice is fine.
func TestStopIsIdempotent(t *testing.T) {
	s := pgtest.Start(t)
	if got := s.MustExec(t, "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend'"); got != "1" {
		t.Fatalf("client backends: %s, want 1 (psql itself)", got)
	}
	s.Stop()
	s.Stop() // idempotent
}

// TestStallStopsEveryProcess: Stall stops the postmaster and each of its
// processes (state T in /proc), a new connection gets no answer to its
// startup, and Continue brings the server back.
func TestStallStopsEveryProcess(t *testing.T) {
	s := pgtest.Start(t)
	s.Stall(t)
	stalled := true
	defer func() {
		if stalled {
			s.Continue()
		}
	}()
	pids := s.StalledPIDs()
	if len(pids) < 3 { // the postmaster, and at least a checkpointer and a WAL writer
		t.Fatalf("stalled %v: want the postmaster and its processes", pids)
	}
	for _, pid := range pids {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			t.Fatalf("process %d: %v", pid, err)
		}
		if f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:])); f[0] != "T" {
			t.Errorf("process %d is in state %s once Stall returned, want T (stopped)", pid, f[0])
		}
	}
	c, err := net.Dial("tcp", s.Addr())
	if err != nil {
		t.Fatalf("the kernel should accept the connection: %v", err)
	}
	defer c.Close()
	// A startup packet for protocol 3.0, user postgres: no answer comes.
	body := append([]byte{0, 3, 0, 0}, "user\x00postgres\x00\x00"...)
	_, err = c.Write(append(binary.BigEndian.AppendUint32(nil, uint32(4+len(body))), body...))
	if err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
	if n, err := c.Read(make([]byte, 1)); n != 0 || !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("a stalled server answered a startup: %d bytes, %v", n, err)
	}
	s.Continue()
	stalled = false
	if got := s.MustExec(t, "SELECT 1"); got != "1" {
		t.Fatalf("after Continue: %q", got)
	}
}

package pgtest_test

import (
	"testing"

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

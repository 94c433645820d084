package etcdtest

import (
	"fmt"
	"net/http"
	"strings"
	"syscall"
	"testing"
)

func health(t *testing.T, m *Member) bool {
	t.Helper()
	resp, err := http.Get(m.ClientURL + "/health")
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// TestClusterLifecycle starts three members, finds the leader, kills it,
// finds the next one, and restarts the whole cluster from its data.
func TestClusterLifecycle(t *testing.T) {
	c := StartN(t, 3)
	old := c.Leader()
	old.Kill()
	if health(t, old) {
		t.Fatal("a killed member answers")
	}
	if l := c.Leader(); l == old {
		t.Fatal("the killed member still leads")
	}
	old.Start()
	c.Restart()
	for _, m := range c.Members {
		if !health(t, m) {
			t.Fatalf("member %s not healthy after the restart", m.Name)
		}
	}
}

// failedTB is a test that has failed: it keeps what is logged, and runs its
// cleanups when told.
type failedTB struct {
	testing.TB
	logs     []string
	cleanups []func()
}

func (f *failedTB) Helper()                 {}
func (f *failedTB) Failed() bool            { return true }
func (f *failedTB) Cleanup(fn func())       { f.cleanups = append(f.cleanups, fn) }
func (f *failedTB) Logf(s string, a ...any) { f.logs = append(f.logs, fmt.Sprintf(s, a...)) }

// A failed test says which member exited while it was to run, with its
// last log lines (a client's "connection refused" then says why).
func TestFailedTestReportsAnExitedMember(t *testing.T) {
	f := &failedTB{TB: t}
	c := StartN(f, 1)
	defer func() {
		for i := len(f.cleanups) - 1; i >= 0; i-- {
			f.cleanups[i]()
		}
		report := strings.Join(f.logs, "\n")
		if !strings.Contains(report, "member m0 ("+c.Members[0].ClientURL+") exited while it was to run: signal: killed") ||
			!strings.Contains(report, readyLine) {
			t.Errorf("the report does not say the member died, with its log:\n%s", report)
		}
	}()
	if err := syscall.Kill(c.Members[0].cmd.Process.Pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if err := <-c.Members[0].done; err == nil {
		t.Fatal("a killed member exited without an error")
	} else {
		c.Members[0].done <- err
	}
}

package etcdtest

import (
	"net/http"
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

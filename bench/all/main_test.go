package main

import (
	"strings"
	"testing"

	"go.uber.org/goleak"

	"tenace.dev/bench/internal/load"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

type captured struct {
	code   int
	stdout string
}

// runCapture runs the tool with args and returns its exit code, stdout and
// stderr; results go to a throwaway directory unless args name one.
func runCapture(t *testing.T, args []string) (captured, string) {
	t.Helper()
	var stdout, stderr strings.Builder
	code := load.Run(append([]string{"-out", t.TempDir()}, args...), &stdout, &stderr)
	return captured{code, stdout.String()}, stderr.String()
}

// go run ./bench/all writes into a directory of its own, so that it does not
// overwrite go run ./bench's chart in bench-results/.
func TestTheDefaultOutIsItsOwn(t *testing.T) {
	var stdout, stderr strings.Builder
	load.Run([]string{"-h"}, &stdout, &stderr)
	if !strings.Contains(stderr.String(), `(default "bench-results/all")`) {
		t.Fatalf("-out's default is not bench-results/all:\n%s", stderr.String())
	}
}

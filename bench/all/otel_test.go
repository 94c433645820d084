package main

import (
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestOtelRunsThePipelineWithAndWithoutTheListenerAndPrintsItsMetrics(t *testing.T) {
	dir := t.TempDir()
	out, _ := runCapture(t, []string{"-otel", "-scenario", "hot", "-goroutines", "4", "-duration", "50ms", "-quiet", "-out", dir})
	require.Equal(t, 0, out.code)
	require.Regexp(t, `(?m)^pipeline\s+hot`, out.stdout)
	require.Regexp(t, `(?m)^pipeline\+otel\s+hot`, out.stdout)
	require.Contains(t, out.stdout, "OpenTelemetry metrics recorded by pipeline+otel hot g=4")

	// The acquisitions the listener counted are the operations the cell ran
	// (every acquire of the hot scenario succeeds), and nobody waits at the end.
	acquired := regexp.MustCompile(`tenace\.lock\.acquisitions\s+\(\{acquisition\}\)\s+mode=exclusive,outcome=acquired\s+(\d+)`).FindStringSubmatch(out.stdout)
	require.NotNil(t, acquired, out.stdout)
	n, err := strconv.Atoi(acquired[1])
	require.NoError(t, err)
	require.Positive(t, n)
	require.Regexp(t, `tenace\.lock\.wait\.duration\s+\(s\)\s+mode=exclusive,outcome=acquired\s+count `+acquired[1]+` `, out.stdout)
	require.Regexp(t, `tenace\.lock\.hold\.duration\s+\(s\)\s+mode=exclusive\s+count `+acquired[1]+` `, out.stdout)
	require.Regexp(t, `tenace\.lock\.waiting\s+\(\{caller\}\)\s+mode=exclusive\s+0\n`, out.stdout)

	txt, err := os.ReadFile(filepath.Join(dir, "notes.txt"))
	require.NoError(t, err)
	require.Contains(t, string(txt), "tenace.lock.wait.duration")
}

func TestOtelGoesWithTheMemoryProvider(t *testing.T) {
	out, errOut := runCapture(t, []string{"-otel", "-providers", "redis", "-redis", "127.0.0.1:1"})
	require.Equal(t, 2, out.code)
	require.Contains(t, errOut, "-otel goes with -providers memory")
}

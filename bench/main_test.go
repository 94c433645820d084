package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestBadFlagsGetAMessageTheUsageAndExitCode2(t *testing.T) {
	for _, args := range [][]string{
		{"-impl", "nope"},
		{"-scenario", "lukewarm"},
		{"-goroutines", "0"},
		{"-goroutines", "x"},
		{"-duration", "-1s"},
		{"-hold", "-1ms"},
		{"-shards", "-2"},
		{"-keys", "-1"},
		{"-busy", "-1"},
		{"-nosuchflag"},
		{"stray"},
	} {
		out, errOut := runCapture(t, args)
		require.Equal(t, 2, out.code, "%v", args)
		require.Contains(t, errOut, "usage: go run ./bench", "%v", args)
	}
}

// Every implementation, every scenario, a short cell: the tool runs, counts
// operations, and no key ever had two holders.
func TestEveryCellRunsAndKeepsMutualExclusion(t *testing.T) {
	for _, impl := range impls {
		for _, sc := range scenarios {
			l, _ := makeLocker(impl.name, 0)
			takes := l.TakesContext()
			l.Close()
			if sc == "cancel" && !takes {
				continue
			}
			r, err := runCell(cell{Impl: impl.name, Scenario: sc, Goroutines: 8, Hold: time.Microsecond, Duration: 50 * time.Millisecond}, nil, "")
			require.NoError(t, err)
			require.Positive(t, r.Ops, "%s %s", impl.name, sc)
			require.Equal(t, int32(1), r.MaxInside, "%s %s: holders inside one key", impl.name, sc)
			require.Positive(t, r.P50)
		}
	}
}

// -busy runs every cell beside goroutines that burn CPU, says so in the
// table's title, and stops them after the cell (TestMain's goleak would
// find one left running).
func TestBusyRunsBesideTheCellsAndStops(t *testing.T) {
	dir := t.TempDir()
	out, _ := runCapture(t, []string{"-impl", "tenace", "-scenario", "distinct", "-goroutines", "4", "-duration", "30ms", "-quiet", "-busy", "2", "-out", dir})
	require.Equal(t, 0, out.code)
	require.Contains(t, out.stdout, "beside 2 goroutines burning CPU")
	require.Contains(t, out.stdout, "\ntenace ")
	md, err := os.ReadFile(filepath.Join(dir, "results.md"))
	require.NoError(t, err)
	require.Contains(t, string(md), "beside 2 goroutines burning CPU")
	js, err := os.ReadFile(filepath.Join(dir, "results.json"))
	require.NoError(t, err)
	require.Contains(t, string(js), `"busy": 2`)
}

func TestOutWritesTheTableJSONAndChart(t *testing.T) {
	dir := t.TempDir()
	out, _ := runCapture(t, []string{"-impl", "tenace,moby", "-scenario", "hot", "-goroutines", "1,4", "-duration", "30ms", "-quiet", "-out", dir})
	require.Equal(t, 0, out.code)
	require.Contains(t, out.stdout, "tenace")
	for _, f := range []string{"results.md", "results.json", "chart.svg", "chart.png"} {
		b, err := os.ReadFile(filepath.Join(dir, f))
		require.NoError(t, err)
		require.NotEmpty(t, b)
	}
	md, _ := os.ReadFile(filepath.Join(dir, "results.md"))
	require.Equal(t, 1+1+1+4, strings.Count(string(md), "\n")-1, "machine line, header, separator, 4 rows")
}

type captured struct {
	code   int
	stdout string
}

// runCapture runs the tool with args and returns its exit code, stdout and
// stderr.
func runCapture(t *testing.T, args []string) (captured, string) {
	t.Helper()
	var stdout, stderr strings.Builder
	code := run(args, &stdout, &stderr)
	return captured{code, stdout.String()}, stderr.String()
}

// A cell that let two holders in says so, also when some of its operations
// gave up; results.md shows the give-ups the terminal table shows.
func TestTheTableAndResultsMDShowBrokenAndGaveUp(t *testing.T) {
	r := result{cell: cell{Impl: "tenace", Scenario: "cancel", Goroutines: 16}, Ops: 100, Gaveup: 7, OpsPerSec: 100, MaxInside: 2}
	var row strings.Builder
	printRow(&row, r, nil)
	require.Contains(t, row.String(), "BROKEN")
	require.Contains(t, row.String(), "7 gave up")

	dir := t.TempDir()
	require.NoError(t, writeOutputs(dir, []result{r}))
	md, err := os.ReadFile(filepath.Join(dir, "results.md"))
	require.NoError(t, err)
	require.Contains(t, string(md), "| gave up |")
	require.Contains(t, string(md), "| 2 | 7 |")
}

// cancel runs only for implementations that take a context: with none of
// those, there is nothing to run, and the tool says so instead of printing
// an empty table and exiting 0.
func TestNoCellToRunIsAnError(t *testing.T) {
	out, errOut := runCapture(t, []string{"-impl", "moby,keymutex", "-scenario", "cancel", "-quiet"})
	require.Equal(t, 2, out.code)
	require.Contains(t, errOut, "no cell to run")
}

// Named after its peers, tenace still runs first in each cell, so that the
// peers' rows print their ratio to it instead of "-".
func TestThePeersRowsCarryTheirRatioWhateverTheImplOrder(t *testing.T) {
	out, _ := runCapture(t, []string{"-impl", "semaphore,tenace", "-scenario", "distinct", "-goroutines", "2", "-duration", "20ms", "-quiet"})
	require.Equal(t, 0, out.code)
	var rows []string
	for _, line := range strings.Split(out.stdout, "\n") {
		if f := strings.Fields(line); len(f) > 1 && f[1] == "distinct" {
			rows = append(rows, line)
		}
	}
	require.Len(t, rows, 2, out.stdout)
	require.True(t, strings.HasPrefix(rows[0], "tenace "), "tenace first: %q", rows)
	require.Regexp(t, `^semaphore\s+distinct\s+2\s+\d+\s+\d+\.\d\dx `, rows[1])
}

package load

import (
	"os"
	"path/filepath"
	"regexp"
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
	for _, impl := range family("memory").Impls {
		for _, sc := range scenarios {
			if sc == "cancel" && !takesContext(impl.Name) {
				continue
			}
			r, _, err := runCell(cell{Impl: impl.Name, Family: "memory", Scenario: sc, Goroutines: 8, Hold: time.Microsecond, Duration: 50 * time.Millisecond}, nil, "")
			require.NoError(t, err)
			require.Positive(t, r.Ops, "%s %s", impl.Name, sc)
			require.Equal(t, int32(1), r.MaxInside, "%s %s: holders inside one key", impl.Name, sc)
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
	for _, f := range []string{"results.md", "results.json", "chart.svg"} {
		b, err := os.ReadFile(filepath.Join(dir, f))
		require.NoError(t, err)
		require.NotEmpty(t, b)
	}
	md, _ := os.ReadFile(filepath.Join(dir, "results.md"))
	require.Len(t, regexp.MustCompile(`(?m)^\| (tenace|moby) \| hot \| [14] \|`).FindAllString(string(md), -1), 4, "4 rows:\n%s", md)
	require.Contains(t, string(md), "above 1, tenace is better", "the ratios explained")
	require.Contains(t, string(md), "moby              github.com/moby/locker", "the implementations named")
	svg, _ := os.ReadFile(filepath.Join(dir, "chart.svg"))
	for _, want := range []string{"higher is better", "lower is better", "goroutines", "floor: one channel round"} {
		require.Contains(t, string(svg), want)
	}
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
	// Results go to a throwaway directory unless the test names one.
	code := Run(append([]string{"-out", t.TempDir()}, args...), &stdout, &stderr)
	return captured{code, stdout.String()}, stderr.String()
}

// A cell that let two holders in says so, also when some of its operations
// gave up; results.md shows the give-ups the terminal table shows.
func TestTheTableAndResultsMDShowBrokenAndGaveUp(t *testing.T) {
	r := result{cell: cell{Impl: "tenace", Family: "memory", Scenario: "cancel", Goroutines: 16}, Ops: 100, Gaveup: 7, OpsPerSec: 100, MaxInside: 2}
	var row strings.Builder
	printRow(&row, r, nil)
	require.Contains(t, row.String(), "BROKEN")
	require.Contains(t, row.String(), "7 gave up")

	dir := t.TempDir()
	require.NoError(t, writeOutputs(dir, []result{r}, nil))
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
	// A ratio, not "-", in whichever form ratio prints it: its value is the
	// scheduler's (on a busy machine tenace's 20ms may get a fraction of
	// the semaphore's CPU: 0.087, even 4.3e-05).
	require.Regexp(t, `^semaphore\s+distinct\s+2\s+\d+\s+\d+(\.\d+)?(e-\d+)? `, rows[1])
}

// go run ./bench compiles none of the distributed clients nor the
// OpenTelemetry SDK: asked for them, it names the command that has them.
func TestTheLightCommandNamesTheOneWithTheDistributedProviders(t *testing.T) {
	for args, want := range map[string]string{
		"-providers redis,postgres": "go run ./bench/all -providers redis,postgres",
		"-providers etcd":           "go run ./bench/all -providers etcd",
		"-otel":                     "go run ./bench/all -otel",
		"-providers nope":           `unknown provider "nope"`,
		"-providers memory,memory":  "memory named twice",
	} {
		out, errOut := runCapture(t, strings.Fields(args))
		require.Equal(t, 2, out.code, args)
		require.Contains(t, errOut, want, args)
	}
}

// A tool with distributed families but not the one asked for (bench/all
// before its etcd family) says that family is not registered, instead of
// pointing to itself.
func TestAFamilyNotRegisteredYetSaysSo(t *testing.T) {
	n := len(families)
	Register(&Family{Name: "other", Base: "x"})
	t.Cleanup(func() { families = families[:n] })
	out, errOut := runCapture(t, []string{"-providers", "etcd"})
	require.Equal(t, 2, out.code)
	require.Contains(t, errOut, "no etcd family is registered in this tool yet")
}

// Every ratio reads the same way: above 1, tenace is better in that cell —
// for throughput (tenace's ops/s over the row's) and for the tail (the
// row's p999 over tenace's) — and vs floor is the row's rate over one
// channel round trip per op.
func TestRatiosAboveOneMeanTenaceIsBetter(t *testing.T) {
	tenace := result{cell: cell{Impl: "tenace", Family: "memory"}, OpsPerSec: 2e6, P999: time.Millisecond, Floor: 250 * time.Nanosecond}
	slowerLongerTail := result{cell: cell{Impl: "moby", Family: "memory"}, OpsPerSec: 1e6, P999: 3 * time.Millisecond, Floor: 250 * time.Nanosecond}
	ops, tail := ratios(slowerLongerTail, &tenace)
	require.Equal(t, "2.00", ops)
	require.Equal(t, "3.00", tail)
	ops, tail = ratios(tenace, &slowerLongerTail)
	require.Equal(t, "0.50", ops)
	require.Equal(t, "0.33", tail)
	require.Equal(t, "0.50", vsFloor(tenace), "2 M ops/s against a 4 M/s floor")
	require.Equal(t, "-", vsFloor(result{cell: cell{Family: "redis"}, OpsPerSec: 1e4, Floor: time.Microsecond}), "no floor for a server round trip")
	require.Equal(t, "0.0043", ratio(0.00432), "small ratios keep two significant digits")
}

package load

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// The chart's columns and lines come in the order of the first result of
// each, its x axis ascending, whatever order the cells ran in.
func TestChartAxesKeepFirstSeenOrderAndSortTheGoroutines(t *testing.T) {
	var rs []result
	for _, c := range []struct {
		impl, sc string
		g        int
	}{{"semaphore", "zipf", 64}, {"tenace", "hot", 1}, {"semaphore", "hot", 8}, {"tenace", "zipf", 64}} {
		r := result{}
		r.Impl, r.Scenario, r.Goroutines = c.impl, c.sc, c.g
		rs = append(rs, r)
	}
	scs, impls, gs := chartAxes(rs)
	require.Equal(t, []string{"zipf", "hot"}, scs)
	require.Equal(t, []string{"semaphore", "tenace"}, impls)
	require.Equal(t, []int{1, 8, 64}, gs)
}

// A latency is always on a log axis; a throughput is on a linear one from
// 0 unless its values span more than one linear axis can show.
func TestYAxisIsLogForLatencyAndForAWideThroughput(t *testing.T) {
	ticks, ymin, ymax, log := yAxis(1e3, 5e4, true)
	require.True(t, log)
	require.Equal(t, []float64{3, 5}, []float64{ymin, ymax}, "decades 10^3 to 10^5")
	require.Equal(t, []float64{1e3, 2e3, 5e3, 1e4, 2e4, 5e4, 1e5}, ticks, "two decades: 2 and 5 too")

	_, _, _, log = yAxis(10, 1e6, false)
	require.True(t, log, "five decades of throughput")

	ticks, ymin, ymax, log = yAxis(2e5, 9e5, false)
	require.False(t, log)
	require.Zero(t, ymin)
	require.Equal(t, 0.0, ticks[0])
	require.GreaterOrEqual(t, ymax, 9e5*1.1)
	require.Equal(t, ymax, ticks[len(ticks)-1])
}

package load

import (
	"fmt"
	"html"
	"math"
	"slices"
	"strings"
	"time"
)

// The chart: one column of panels per scenario, one row per measure —
// throughput, then the acquire latency's p99, p999 and max — each line an
// implementation across the goroutine counts. It is written as plain SVG
// so that the tool needs no plotting library (one would take most of its
// build time).

const (
	panelW, panelH = 250, 170 // the plotting area of one panel
	padL, padR     = 120, 24  // left: the row title and the y tick labels
	padT, padB     = 74, 58   // top: the title and the column titles
	gapX, gapY     = 62, 46
	legendW        = 250
)

var palette = []string{"#d62728", "#1f77b4", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#7f7f7f"}

var scenarioTitle = map[string]string{
	"distinct": "distinct: no contention",
	"hot":      "hot: every goroutine on one key",
	"zipf":     "zipf: 10,000 keys, Zipf s=1.1",
	"cancel":   "cancel: one key, 1 in 10 gives up",
}

type measureRow struct {
	title   string
	value   func(result) float64
	latency bool // a duration in ns, on a log axis; else ops/s
}

var measureRows = []measureRow{
	{"throughput, ops/s\nhigher is better", func(r result) float64 { return r.OpsPerSec }, false},
	{"acquire latency p99\nlower is better (log)", func(r result) float64 { return float64(r.P99) }, true},
	{"acquire latency p99.9\nlower is better (log)", func(r result) float64 { return float64(r.P999) }, true},
	{"acquire latency max\nlower is better (log)", func(r result) float64 { return float64(r.Max) }, true},
}

// chartSVG draws rs.
func chartSVG(rs []result) []byte {
	scs, names, gs := chartAxes(rs)
	floorRate := floorRateOf(rs)
	W := padL + len(scs)*panelW + (len(scs)-1)*gapX + padR + legendW
	H := padT + len(measureRows)*panelH + (len(measureRows)-1)*gapY + padB
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="Helvetica, Arial, sans-serif" font-size="12">`+"\n", W, H, W, H)
	fmt.Fprintf(&b, `<rect width="%d" height="%d" fill="white"/>`+"\n", W, H)
	title := "tenace and its peers: throughput and acquire latency per cell"
	sub := ""
	if len(rs) > 0 {
		sub = fmt.Sprintf("%s; cells of %v, hold %v", machine(), rs[0].Duration, rs[0].Hold)
	}
	text(&b, padL, 24, title, `font-size="16" font-weight="bold"`)
	text(&b, padL, 42, sub, `fill="#555"`)
	for col, sc := range scs {
		x0 := padL + col*(panelW+gapX)
		t := scenarioTitle[sc]
		if t == "" {
			t = sc
		}
		text(&b, x0+panelW/2, padT-12, t, `text-anchor="middle" font-weight="bold" font-size="13"`)
		for row, m := range measureRows {
			y0 := padT + row*(panelH+gapY)
			ref := 0.0
			if row == 0 {
				ref = floorRate
			}
			panel(&b, x0, y0, gs, seriesOf(rs, names, gs, sc, m), m, ref, row == len(measureRows)-1)
			if col == 0 {
				for i, l := range strings.Split(m.title, "\n") {
					attrs := `text-anchor="middle" font-weight="bold"`
					if i > 0 {
						attrs = `text-anchor="middle" fill="#555"`
					}
					cx, cy := 16+i*15, y0+panelH/2
					text(&b, cx, cy, l, fmt.Sprintf(`%s transform="rotate(-90 %d %d)"`, attrs, cx, cy))
				}
			}
		}
	}
	// The legend, beside the panels: never over a line.
	lx := padL + len(scs)*panelW + (len(scs)-1)*gapX + padR
	ly := padT
	text(&b, lx, ly, "implementation", `font-weight="bold"`)
	for i, name := range names {
		y := ly + 20 + i*20
		w := 2.0
		if isBase(name) {
			w = 3.5
		}
		fmt.Fprintf(&b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="%s" stroke-width="%.1f"/><circle cx="%d" cy="%d" r="3.5" fill="%s"/>`+"\n",
			lx, y-4, lx+28, y-4, palette[i%len(palette)], w, lx+14, y-4, palette[i%len(palette)])
		text(&b, lx+36, y, name, "")
	}
	y := ly + 20 + len(names)*20
	if floorRate > 0 {
		fmt.Fprintf(&b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="#444" stroke-width="1.5" stroke-dasharray="5 4"/>`+"\n", lx, y-4, lx+28, y-4)
		text(&b, lx+36, y, "floor: one channel round", "")
		text(&b, lx+36, y+15, fmt.Sprintf("trip per op (%s)", Dur(rs[0].Floor)), "")
		y += 36
	}
	for i, l := range []string{
		"x axis: goroutines locking at",
		"once (1 = uncontended).",
		"Latency: from the acquire call",
		"to the critical section's start.",
		"Throughput: all goroutines'",
		"acquire + release per second.",
	} {
		text(&b, lx, y+16+i*16, l, `fill="#555"`)
	}
	b.WriteString("</svg>\n")
	return []byte(b.String())
}

// chartAxes returns what the chart's axes run over: the scenarios (its
// columns) and the implementations (its lines), each in the order of their
// first result, and the goroutine counts (each panel's x axis), ascending.
func chartAxes(rs []result) (scenarios, impls []string, gs []int) {
	for _, r := range rs {
		if !slices.Contains(scenarios, r.Scenario) {
			scenarios = append(scenarios, r.Scenario)
		}
		if !slices.Contains(impls, r.Impl) {
			impls = append(impls, r.Impl)
		}
		if !slices.Contains(gs, r.Goroutines) {
			gs = append(gs, r.Goroutines)
		}
	}
	slices.Sort(gs)
	return scenarios, impls, gs
}

// floorRateOf is the throughput of the floor (one channel round trip per
// operation), drawn on the throughput panels; 0 when no in-process cell
// ran, as the floor bounds only those.
func floorRateOf(rs []result) float64 {
	if len(rs) > 0 && rs[0].Floor > 0 && slices.ContainsFunc(rs, func(r result) bool { return r.Family == "memory" }) {
		return 1 / rs[0].Floor.Seconds()
	}
	return 0
}

// seriesOf returns one line per implementation in impls for scenario sc's
// panel of measure m: a point per goroutine count (an index into gs) whose
// value is positive.
func seriesOf(rs []result, impls []string, gs []int, sc string, m measureRow) []series {
	var lines []series
	for i, name := range impls {
		s := series{name: name, color: palette[i%len(palette)], base: isBase(name)}
		for _, r := range rs {
			if r.Impl == name && r.Scenario == sc {
				if v := m.value(r); v > 0 {
					s.pts = append(s.pts, point{slices.Index(gs, r.Goroutines), v})
				}
			}
		}
		lines = append(lines, s)
	}
	return lines
}

type point struct {
	x int // index into the goroutine counts
	y float64
}

type series struct {
	name, color string
	base        bool
	pts         []point
}

// panel draws one panel's axes, ticks and lines with its top-left corner
// at x0, y0; ref, if positive, is drawn as the floor's dashed line.
func panel(b *strings.Builder, x0, y0 int, gs []int, lines []series, m measureRow, ref float64, xLabel bool) {
	lo, hi := math.Inf(1), 0.0
	for _, s := range lines {
		for _, p := range s.pts {
			lo, hi = math.Min(lo, p.y), math.Max(hi, p.y)
		}
	}
	if ref > 0 {
		lo, hi = math.Min(lo, ref), math.Max(hi, ref)
	}
	if hi == 0 {
		return
	}
	ticks, ymin, ymax, log := yAxis(lo, hi, m.latency)
	yOf := func(v float64) float64 {
		if log {
			return float64(y0+panelH) - (math.Log10(v)-ymin)/(ymax-ymin)*panelH
		}
		return float64(y0+panelH) - v/ymax*panelH
	}
	xOf := func(i int) float64 {
		if len(gs) == 1 {
			return float64(x0) + panelW/2
		}
		return float64(x0) + 20 + float64(i)*(panelW-40)/float64(len(gs)-1)
	}
	fmt.Fprintf(b, `<rect x="%d" y="%d" width="%d" height="%d" fill="#fafafa" stroke="#999"/>`+"\n", x0, y0, panelW, panelH)
	for _, t := range ticks {
		y := yOf(t)
		fmt.Fprintf(b, `<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#e2e2e2"/>`+"\n", x0, y, x0+panelW, y)
		label := rate(t)
		if m.latency {
			label = durTick(t)
		}
		text(b, x0-6, int(y)+4, label, `text-anchor="end" fill="#333"`)
	}
	for i, g := range gs {
		x := xOf(i)
		fmt.Fprintf(b, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#999"/>`+"\n", x, y0+panelH, x, y0+panelH+4)
		text(b, int(x), y0+panelH+17, fmt.Sprint(g), `text-anchor="middle" fill="#333"`)
	}
	if xLabel {
		text(b, x0+panelW/2, y0+panelH+34, "goroutines", `text-anchor="middle" fill="#333"`)
	}
	if ref > 0 {
		y := yOf(ref)
		fmt.Fprintf(b, `<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#444" stroke-width="1.5" stroke-dasharray="5 4"/>`+"\n", x0, y, x0+panelW, y)
	}
	for _, s := range lines {
		if len(s.pts) == 0 {
			continue
		}
		w := 2.0
		if s.base {
			w = 3.5
		}
		var path []string
		for _, p := range s.pts {
			path = append(path, fmt.Sprintf("%.1f,%.1f", xOf(p.x), yOf(p.y)))
		}
		fmt.Fprintf(b, `<polyline points="%s" fill="none" stroke="%s" stroke-width="%.1f" stroke-linejoin="round"/>`+"\n", strings.Join(path, " "), s.color, w)
		for _, p := range s.pts {
			fmt.Fprintf(b, `<circle cx="%.1f" cy="%.1f" r="3.5" fill="%s"><title>%s g=%d: %s</title></circle>`+"\n",
				xOf(p.x), yOf(p.y), s.color, html.EscapeString(s.name), gs[p.x], html.EscapeString(valueLabel(m, p.y)))
		}
	}
}

// yAxis returns the y axis of a panel whose values run from lo to hi (hi
// > 0): whether it is logarithmic (a latency's always, a throughput's when
// one linear axis cannot show both ends), its range (in decades when log)
// and its ticks.
func yAxis(lo, hi float64, latency bool) (ticks []float64, ymin, ymax float64, log bool) {
	log = latency || hi/lo > 200
	if log {
		ymin, ymax = math.Floor(math.Log10(lo)), math.Ceil(math.Log10(hi))
		if ymax == ymin {
			ymax++
		}
		for e := ymin; e <= ymax; e++ {
			ticks = append(ticks, math.Pow(10, e))
			if ymax-ymin <= 2 && e < ymax { // few decades: 2 and 5 too
				ticks = append(ticks, 2*math.Pow(10, e), 5*math.Pow(10, e))
			}
		}
		return ticks, ymin, ymax, log
	}
	step := niceStep(hi * 1.1 / 5)
	ymax = math.Ceil(hi*1.1/step) * step
	for v := 0.0; v <= ymax+step/2; v += step {
		ticks = append(ticks, v)
	}
	return ticks, ymin, ymax, log
}

func valueLabel(m measureRow, v float64) string {
	if !m.latency {
		return fmt.Sprintf("%.0f ops/s", v)
	}
	return Dur(time.Duration(v))
}

// niceStep rounds a tick step up to 1, 2 or 5 times a power of ten.
func niceStep(raw float64) float64 {
	p := math.Pow(10, math.Floor(math.Log10(raw)))
	for _, m := range []float64{1, 2, 5, 10} {
		if raw <= m*p {
			return m * p
		}
	}
	return 10 * p
}

// rate labels a throughput tick: 0, 500 k, 1.5 M.
func rate(v float64) string {
	switch {
	case v == 0:
		return "0"
	case v >= 1e6:
		return strings.TrimSuffix(strings.TrimSuffix(fmt.Sprintf("%.1f", v/1e6), "0"), ".") + " M"
	case v >= 1e3:
		return strings.TrimSuffix(strings.TrimSuffix(fmt.Sprintf("%.1f", v/1e3), "0"), ".") + " k"
	}
	return fmt.Sprintf("%.0f", v)
}

// durTick labels a latency tick, a power of ten nanoseconds: 100 ns, 1 µs, 10 ms.
func durTick(ns float64) string {
	for _, u := range []struct {
		n    float64
		name string
	}{{1e9, "s"}, {1e6, "ms"}, {1e3, "µs"}} {
		if ns >= u.n {
			return fmt.Sprintf("%.3g %s", ns/u.n, u.name)
		}
	}
	return fmt.Sprintf("%.0f ns", ns)
}

func text(b *strings.Builder, x, y int, s, attrs string) {
	fmt.Fprintf(b, `<text x="%d" y="%d" %s>%s</text>`+"\n", x, y, attrs, html.EscapeString(s))
}

package main

import (
	"encoding/json"
	"fmt"
	"image/color"
	"io"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
	"gonum.org/v1/plot/vg/vgsvg"
)

const header = "%-14s %-9s %5s %14s %9s %10s %10s %10s %10s %7s %s\n"

func printHeader(w io.Writer) {
	fmt.Fprintf(w, header, "impl", "scenario", "g", "ops/s", "vs tenace", "p50", "p99", "p999", "max", "inside", "")
}

// printRow prints one result; base is the tenace result of the same cell,
// if it ran.
func printRow(w io.Writer, r result, base *result) {
	ratio := "-"
	if base != nil && base.OpsPerSec > 0 {
		ratio = fmt.Sprintf("%.2fx", r.OpsPerSec/base.OpsPerSec)
	}
	var notes []string
	if r.MaxInside > 1 {
		notes = append(notes, "BROKEN: two holders at once")
	}
	if r.Gaveup > 0 {
		notes = append(notes, fmt.Sprintf("%d gave up", r.Gaveup))
	}
	note := strings.Join(notes, "; ")
	fmt.Fprintf(w, header, r.Impl, r.Scenario, fmt.Sprint(r.Goroutines), fmt.Sprintf("%.0f", r.OpsPerSec), ratio,
		dur(r.P50), dur(r.P99), dur(r.P999), dur(r.Max), fmt.Sprint(r.MaxInside), note)
}

func dur(d time.Duration) string {
	switch {
	case d < time.Microsecond:
		return fmt.Sprintf("%dns", d.Nanoseconds())
	case d < time.Millisecond:
		return fmt.Sprintf("%.1fµs", float64(d)/float64(time.Microsecond))
	default:
		return fmt.Sprintf("%.2fms", float64(d)/float64(time.Millisecond))
	}
}

func machine() string {
	return fmt.Sprintf("%d cores (GOMAXPROCS %d), %s, %s/%s", runtime.NumCPU(), runtime.GOMAXPROCS(0), runtime.Version(), runtime.GOOS, runtime.GOARCH)
}

// writeOutputs writes results.md, results.json, chart.svg and chart.png
// into dir.
func writeOutputs(dir string, rs []result) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	js, err := json.MarshalIndent(struct {
		Machine string   `json:"machine"`
		Results []result `json:"results"`
	}{machine(), rs}, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "results.json"), append(js, '\n'), 0o644); err != nil {
		return err
	}
	var md strings.Builder
	fmt.Fprintf(&md, "Machine: %s.\n\n", machine())
	if len(rs) > 0 && rs[0].Busy > 0 {
		fmt.Fprintf(&md, "Every cell ran beside %d goroutines burning CPU (-busy).\n\n", rs[0].Busy)
	}
	// The gave-up column only when some cell gave up (the cancel scenario),
	// so that the usual table keeps its shape.
	gaveUp := slices.ContainsFunc(rs, func(r result) bool { return r.Gaveup > 0 })
	md.WriteString("| impl | scenario | g | ops/s | vs tenace | p50 | p99 | p999 | max | inside |")
	if gaveUp {
		md.WriteString(" gave up |")
	}
	md.WriteString("\n|---|---|--:|--:|--:|--:|--:|--:|--:|--:|")
	if gaveUp {
		md.WriteString("--:|")
	}
	md.WriteString("\n")
	for _, r := range rs {
		ratio := "-"
		if b := baseOf(rs, r); b != nil && b.OpsPerSec > 0 {
			ratio = fmt.Sprintf("%.2fx", r.OpsPerSec/b.OpsPerSec)
		}
		fmt.Fprintf(&md, "| %s | %s | %d | %.0f | %s | %s | %s | %s | %s | %d |", r.Impl, r.Scenario, r.Goroutines,
			r.OpsPerSec, ratio, dur(r.P50), dur(r.P99), dur(r.P999), dur(r.Max), r.MaxInside)
		if gaveUp {
			fmt.Fprintf(&md, " %d |", r.Gaveup)
		}
		md.WriteString("\n")
	}
	if err := os.WriteFile(filepath.Join(dir, "results.md"), []byte(md.String()), 0o644); err != nil {
		return err
	}
	if err := writeChart(filepath.Join(dir, "chart.svg"), rs, svgCanvas); err != nil {
		return err
	}
	return writeChart(filepath.Join(dir, "chart.png"), rs, pngCanvas)
}

// isBase reports whether impl is what the "vs tenace" column compares
// with: tenace on its provider.
func isBase(impl string) bool {
	return impl == "tenace" || impl == "tenace-redis" || impl == "tenace-pg"
}

// baseOf is the result of r's cell for the base implementation (isBase), or
// nil if it has not run.
func baseOf(rs []result, r result) *result {
	for i := range rs {
		b := &rs[i]
		if isBase(b.Impl) && b.Scenario == r.Scenario && b.Goroutines == r.Goroutines {
			return b
		}
	}
	return nil
}

var palette = []color.Color{
	color.RGBA{R: 0xd6, G: 0x27, B: 0x28, A: 0xff},
	color.RGBA{R: 0x1f, G: 0x77, B: 0xb4, A: 0xff},
	color.RGBA{R: 0x2c, G: 0xa0, B: 0x2c, A: 0xff},
	color.RGBA{R: 0xff, G: 0x7f, B: 0x0e, A: 0xff},
	color.RGBA{R: 0x94, G: 0x67, B: 0xbd, A: 0xff},
	color.RGBA{R: 0x8c, G: 0x56, B: 0x4b, A: 0xff},
}

// writeChart draws throughput per implementation across goroutine counts,
// one panel per scenario, with gonum/plot.
type canvas interface {
	vg.CanvasSizer
	WriteTo(w io.Writer) (int64, error)
}

func svgCanvas(w, h vg.Length) canvas { return vgsvg.New(w, h) }
func pngCanvas(w, h vg.Length) canvas {
	return vgimg.PngCanvas{Canvas: vgimg.NewWith(vgimg.UseWH(w, h), vgimg.UseDPI(110))}
}

func writeChart(path string, rs []result, newCanvas func(w, h vg.Length) canvas) error {
	var scs, names []string
	seen := map[string]bool{}
	for _, r := range rs {
		if !seen["s"+r.Scenario] {
			seen["s"+r.Scenario] = true
			scs = append(scs, r.Scenario)
		}
		if !seen["i"+r.Impl] {
			seen["i"+r.Impl] = true
			names = append(names, r.Impl)
		}
	}
	const panelW, panelH = 4.5 * vg.Inch, 3.5 * vg.Inch
	c := newCanvas(panelW*vg.Length(len(scs)), panelH)
	dc := draw.New(c)
	tiles := draw.Tiles{Rows: 1, Cols: len(scs), PadX: vg.Millimeter * 4, PadTop: vg.Millimeter * 2, PadBottom: vg.Millimeter * 2}
	for col, sc := range scs {
		p := plot.New()
		p.Title.Text = sc
		p.X.Label.Text = "goroutines"
		p.Y.Label.Text = "ops/s"
		p.X.Scale = plot.LogScale{}
		p.X.Tick.Marker = plot.LogTicks{Prec: -1}
		p.Y.Min = 0
		for i, name := range names {
			var pts plotter.XYs
			for _, r := range rs {
				if r.Impl == name && r.Scenario == sc && r.OpsPerSec > 0 {
					pts = append(pts, plotter.XY{X: float64(r.Goroutines), Y: r.OpsPerSec})
				}
			}
			if len(pts) == 0 {
				continue
			}
			line, points, err := plotter.NewLinePoints(pts)
			if err != nil {
				return err
			}
			line.Color = palette[i%len(palette)]
			points.Color = line.Color
			line.Width = vg.Points(1.5)
			p.Add(line, points)
			p.Legend.Add(name, line, points)
			p.Y.Max = math.Max(p.Y.Max, maxY(pts)*1.1)
		}
		p.Legend.Top = true
		p.Legend.TextStyle.Font.Size = vg.Points(8)
		p.Draw(tiles.At(dc, col, 0))
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := c.WriteTo(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func maxY(pts plotter.XYs) float64 {
	m := 0.0
	for _, p := range pts {
		m = math.Max(m, p.Y)
	}
	return m
}

package load

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"time"
)

const header = "%-17s %-9s %5s %12s %11s %9s %9s %9s %9s %12s %8s %6s %s\n"

func printHeader(w io.Writer) {
	fmt.Fprintf(w, header, "impl", "scenario", "g", "ops/s", "tenace ops×", "p50", "p99", "p999", "max", "tenace p999×", "vs floor", "inside", "")
}

// printRow prints one result; base is the family's tenace result of the
// same cell, if it ran.
func printRow(w io.Writer, r result, base *result) {
	opsX, tailX := ratios(r, base)
	var notes []string
	if r.MaxInside > 1 {
		notes = append(notes, "BROKEN: two holders at once")
	}
	if r.Gaveup > 0 {
		notes = append(notes, fmt.Sprintf("%d gave up", r.Gaveup))
	}
	note := strings.Join(notes, "; ")
	fmt.Fprintf(w, header, r.Impl, r.Scenario, fmt.Sprint(r.Goroutines), fmt.Sprintf("%.0f", r.OpsPerSec), opsX,
		Dur(r.P50), Dur(r.P99), Dur(r.P999), Dur(r.Max), tailX, vsFloor(r), fmt.Sprint(r.MaxInside), note)
}

// ratios are the row's two comparisons with tenace, written so that above
// 1 always means tenace is better: tenace's ops/s ÷ the row's, and the
// row's p999 ÷ tenace's.
func ratios(r result, base *result) (ops, tail string) {
	ops, tail = "-", "-"
	if base == nil {
		return ops, tail
	}
	if r.OpsPerSec > 0 {
		ops = ratio(base.OpsPerSec / r.OpsPerSec)
	}
	if base.P999 > 0 {
		tail = ratio(float64(r.P999) / float64(base.P999))
	}
	return ops, tail
}

// ratio prints a ratio with two decimals, or two significant digits below
// 0.1 (0.0043: a tail 230 times tenace's shorter is not 0.00).
func ratio(v float64) string {
	if v < 0.1 {
		return fmt.Sprintf("%.2g", v)
	}
	return fmt.Sprintf("%.2f", v)
}

// vsFloor is the row's ops/s over the floor's rate (one channel round trip
// per operation), for the in-process rows.
func vsFloor(r result) string {
	if r.Family != "memory" || r.Floor <= 0 {
		return "-"
	}
	return ratio(r.OpsPerSec * r.Floor.Seconds())
}

// footnote explains the table's columns and names every implementation in
// it.
func footnote(rs []result) string {
	var b strings.Builder
	b.WriteString(`
ops/s: operations (acquire, run the critical section, release) per second over all goroutines; higher is better.
p50, p99, p999, max: acquire latency, from the call to the start of the critical section; lower is better.
tenace ops× = tenace's ops/s ÷ this row's;  tenace p999× = this row's p999 ÷ tenace's.
  Both read the same way: above 1, tenace is better in that cell; below 1, this row is. (tenace's own row: 1.00.)
vs floor = this row's ops/s ÷ the floor's rate (one channel round trip per operation, the line above the table):
  the most an actor design such as tenace's can reach with one shard; above 1, faster than one round trip per op.
inside: the most goroutines ever seen inside one key's critical section at once; anything but 1 is a broken lock.
`)
	seen := map[string]bool{}
	for _, r := range rs {
		if seen[r.Impl] {
			continue
		}
		seen[r.Impl] = true
		if f := familyOf(r.Impl); f != nil {
			fmt.Fprintf(&b, "  %-17s %s\n", r.Impl, f.impl(r.Impl).Desc)
		}
	}
	return b.String()
}

// Dur prints d as the table does: 830ns, 12.5µs, 1.20ms.
func Dur(d time.Duration) string {
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

// writeOutputs writes results.md, results.json and chart.svg into dir, and
// notes.txt when there are notes.
func writeOutputs(dir string, rs []result, notes []string) error {
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
	fmt.Fprintf(&md, "Machine: %s.", machine())
	if len(rs) > 0 && rs[0].Floor > 0 {
		fmt.Fprintf(&md, " Floor: one channel round trip, %s.", Dur(rs[0].Floor))
	}
	md.WriteString("\n\n")
	if len(rs) > 0 && rs[0].Busy > 0 {
		fmt.Fprintf(&md, "Every cell ran beside %d goroutines burning CPU (-busy).\n\n", rs[0].Busy)
	}
	// The gave-up column only when some cell gave up (the cancel scenario),
	// so that the usual table keeps its shape.
	gaveUp := slices.ContainsFunc(rs, func(r result) bool { return r.Gaveup > 0 })
	md.WriteString("| impl | scenario | g | ops/s | tenace ops× | p50 | p99 | p999 | max | tenace p999× | vs floor | inside |")
	if gaveUp {
		md.WriteString(" gave up |")
	}
	md.WriteString("\n|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|")
	if gaveUp {
		md.WriteString("--:|")
	}
	md.WriteString("\n")
	for _, r := range rs {
		opsX, tailX := ratios(r, baseOf(rs, r))
		fmt.Fprintf(&md, "| %s | %s | %d | %.0f | %s | %s | %s | %s | %s | %s | %s | %d |", r.Impl, r.Scenario, r.Goroutines,
			r.OpsPerSec, opsX, Dur(r.P50), Dur(r.P99), Dur(r.P999), Dur(r.Max), tailX, vsFloor(r), r.MaxInside)
		if gaveUp {
			fmt.Fprintf(&md, " %d |", r.Gaveup)
		}
		md.WriteString("\n")
	}
	md.WriteString("\n```" + footnote(rs) + "```\n")
	if err := os.WriteFile(filepath.Join(dir, "results.md"), []byte(md.String()), 0o644); err != nil {
		return err
	}
	if len(notes) > 0 {
		if err := os.WriteFile(filepath.Join(dir, "notes.txt"), []byte(strings.Join(notes, "\n")), 0o644); err != nil {
			return err
		}
	}
	return os.WriteFile(filepath.Join(dir, "chart.svg"), chartSVG(rs), 0o644)
}

// isBase reports whether impl is what the ratio columns compare with: tenace
// on its provider.
func isBase(impl string) bool {
	f := familyOf(impl)
	return f != nil && f.Base == impl
}

// baseOf is the result of r's cell for its family's base implementation
// (isBase), or nil if it has not run.
func baseOf(rs []result, r result) *result {
	for i := range rs {
		b := &rs[i]
		if isBase(b.Impl) && b.Family == r.Family && b.Scenario == r.Scenario && b.Goroutines == r.Goroutines {
			return b
		}
	}
	return nil
}

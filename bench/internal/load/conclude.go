package load

import (
	"fmt"
	"io"
	"slices"
	"strings"
)

// Guarantees an implementation can give its callers, in the words the
// conclusions print (Impl.Gives).
const (
	givesOrder   = "arrival order"
	givesCancel  = "timeouts and cancellation that never leak"
	givesFencing = "fencing tokens"
)

// isOwn reports whether impl is one of tenace's own rows (the base, its
// variants, the pipeline), which the conclusions do not count as peers.
func isOwn(f *Family, impl string) bool {
	return impl == f.Base || strings.HasPrefix(impl, "tenace") || strings.HasPrefix(impl, "pipeline")
}

// conclude writes what the run's table means, one line per scenario of
// each family that ran its base: where tenace stands against the floor (the
// in-process family) and against its fastest peer in throughput and in
// p999 and max latency, and what tenace gives that every faster row lacks.
// Everything is computed from rs.
func conclude(w io.Writer, rs []result) {
	var lines []string
	for _, f := range families {
		for _, sc := range scenariosOf(rs, f) {
			if l := concludeScenario(f, sc, rs); l != "" {
				lines = append(lines, l)
			}
		}
	}
	if len(lines) == 0 {
		return
	}
	fmt.Fprintln(w, "\nWhat this run says:")
	for _, l := range lines {
		fmt.Fprintln(w, "  "+l)
	}
}

// scenariosOf lists, in order of appearance, the scenarios in which f's
// base ran.
func scenariosOf(rs []result, f *Family) []string {
	var out []string
	for _, r := range rs {
		if r.Family == f.Name && r.Impl == f.Base && !slices.Contains(out, r.Scenario) {
			out = append(out, r.Scenario)
		}
	}
	return out
}

// concludeScenario is conclude's line for scenario sc of family f, or ""
// when tenace did not run in it.
func concludeScenario(f *Family, sc string, rs []result) string {
	var b strings.Builder
	base := f.impl(f.Base)
	st := standing(f, sc, rs)
	if len(st.gs) == 0 {
		return ""
	}
	fmt.Fprintf(&b, "%s (g=%s): ", sc, joinInts(st.gs))
	if st.floorHi > 0 {
		fmt.Fprintf(&b, "tenace runs at %s the floor's rate (one round trip per op); ", span(st.floorLo, st.floorHi))
	}
	if st.top.x == 0 {
		b.WriteString("no peer ran.")
		return b.String()
	}
	p, t := st.top.r, st.top.base
	if st.top.x > 1 {
		fmt.Fprintf(&b, "the fastest peer, %s, does %s× tenace's ops/s at g=%d", p.Impl, ratio(st.top.x), p.Goroutines)
	} else {
		fmt.Fprintf(&b, "tenace leads every peer; the closest, %s, does %s× tenace's ops/s at g=%d", p.Impl, ratio(st.top.x), p.Goroutines)
	}
	fmt.Fprintf(&b, ", p999 %s and max %s against tenace's %s and %s. ", Dur(p.P999), Dur(p.Max), Dur(t.P999), Dur(t.Max))
	if len(base.Gives) == 0 {
		return b.String()
	}
	if len(st.faster) == 0 {
		fmt.Fprintf(&b, "No row is faster; tenace gives %s.", strings.Join(base.Gives, ", "))
		return b.String()
	}
	b.WriteString(fasterRows(f, base, st.faster))
	return b.String()
}

// scenarioStanding is where tenace stands in one scenario of a family.
type scenarioStanding struct {
	gs               []int   // the goroutine counts tenace ran at
	floorLo, floorHi float64 // tenace's ops/s as a share of the floor's rate (in-process only)
	// For every cell of the scenario, the peer furthest ahead of tenace in
	// ops/s (or least behind), and the rows faster than tenace.
	top struct {
		r, base result
		x       float64
	}
	faster map[string]float64 // impl → its best ops/s ÷ tenace's, where above 1
}

// standing is where f's base stands in scenario sc of rs.
func standing(f *Family, sc string, rs []result) *scenarioStanding {
	st := &scenarioStanding{faster: map[string]float64{}}
	for _, t := range rs {
		if t.Family != f.Name || t.Impl != f.Base || t.Scenario != sc || t.OpsPerSec <= 0 {
			continue
		}
		st.gs = append(st.gs, t.Goroutines)
		if t.Floor > 0 && f.Name == "memory" {
			v := t.OpsPerSec * t.Floor.Seconds()
			if len(st.gs) == 1 || v < st.floorLo {
				st.floorLo = v
			}
			if len(st.gs) == 1 || v > st.floorHi {
				st.floorHi = v
			}
		}
		st.comparePeers(f, t, rs)
	}
	return st
}

// comparePeers compares tenace's cell t with the peers' cells of the same
// scenario and goroutine count.
func (st *scenarioStanding) comparePeers(f *Family, t result, rs []result) {
	for _, p := range rs {
		if p.Family != f.Name || p.Scenario != t.Scenario || p.Goroutines != t.Goroutines || isOwn(f, p.Impl) || p.OpsPerSec <= 0 {
			continue
		}
		x := p.OpsPerSec / t.OpsPerSec
		if st.top.x == 0 || x > st.top.x {
			st.top.r, st.top.base, st.top.x = p, t, x
		}
		if x > 1 && x > st.faster[p.Impl] {
			st.faster[p.Impl] = x
		}
	}
}

// fasterRows is the sentence naming the rows faster than base, grouped by
// what of base's guarantees they lack.
func fasterRows(f *Family, base *Impl, faster map[string]float64) string {
	var b strings.Builder
	var groups []string
	byLack := map[string][]string{}
	for name := range faster {
		var lack []string
		if i := f.impl(name); i != nil {
			for _, g := range base.Gives {
				if !slices.Contains(i.Gives, g) {
					lack = append(lack, g)
				}
			}
		}
		k := "with all of tenace's guarantees"
		if len(lack) > 0 {
			k = "without " + strings.Join(lack, ", ")
		}
		if byLack[k] == nil {
			groups = append(groups, k)
		}
		byLack[k] = append(byLack[k], name)
	}
	slices.Sort(groups)
	b.WriteString("Faster: ")
	for i, k := range groups {
		slices.Sort(byLack[k])
		if i > 0 {
			b.WriteString("; ")
		}
		fmt.Fprintf(&b, "%s (%s)", strings.Join(byLack[k], ", "), k)
	}
	b.WriteString(".")
	return b.String()
}

// span prints lo–hi as ratios, or one ratio when they print the same.
func span(lo, hi float64) string {
	if ratio(lo) == ratio(hi) {
		return ratio(lo) + "×"
	}
	return ratio(lo) + "–" + ratio(hi) + "×"
}

func joinInts(ns []int) string {
	s := make([]string, len(ns))
	for i, n := range ns {
		s[i] = fmt.Sprint(n)
	}
	return strings.Join(s, ",")
}

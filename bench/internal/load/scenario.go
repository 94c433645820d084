package load

import (
	"fmt"
	"math/rand/v2"
	"slices"
)

// A scenario says which key each operation of each goroutine uses.
//
//	distinct  each goroutine cycles over keys of its own: no contention
//	hot       every operation on one key: all contention
//	zipf      10,000 keys drawn Zipf(s=1.1) from a precomputed sequence
//	cancel    the hot key, with one operation in ten carrying a context that
//	          ends after a fixed short wait (cancelWait): waiters really do
//	          leave the queue. Only for implementations that take a context.
var scenarios = []string{"distinct", "hot", "zipf", "cancel"}

// Scenarios names the scenarios, in table order.
func Scenarios() []string { return slices.Clone(scenarios) }

const (
	zipfKeys   = 10_000
	zipfS      = 1.1
	seqLen     = 1 << 16 // precomputed keys per goroutine, reused cyclically
	distinctN  = 16      // keys per goroutine in distinct
	cancelWait = 20_000  // ns: the cancelled operations' context lifetime
)

// keySeq returns goroutine g's key sequence for a scenario; keys are
// formatted once here so that the measured loop only indexes a slice. The
// zipf sequence is drawn once and shared: each goroutine starts at its own
// offset into it (see Worker.op).
func keySeq(scenario string, g, keys int) []string {
	switch scenario {
	case "hot", "cancel":
		return []string{"hot"}
	case "distinct":
		if keys <= 0 {
			keys = distinctN
		}
		out := make([]string, keys)
		for i := range out {
			out[i] = fmt.Sprintf("g%d-k%d", g, i)
		}
		return out
	case "zipf":
		if keys <= 0 {
			keys = zipfKeys
		}
		return zipfSeq(keys)
	}
	panic("unknown scenario " + scenario)
}

var zipfCache = map[int][]string{}

func zipfSeq(keys int) []string {
	if s, ok := zipfCache[keys]; ok {
		return s
	}
	r := rand.New(rand.NewPCG(1, 42))
	z := rand.NewZipf(r, zipfS, 1, uint64(keys-1))
	names := make([]string, keys)
	for i := range names {
		names[i] = fmt.Sprintf("z%d", i)
	}
	out := make([]string, seqLen)
	for i := range out {
		out[i] = names[z.Uint64()]
	}
	zipfCache[keys] = out
	return out
}

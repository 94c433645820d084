// Package load is tenace's load tool: it runs keyed locks — tenace and the
// locks Go developers use today — through contention scenarios, and prints
// throughput, acquire latency percentiles and a mutual-exclusion check.
//
// Two commands run it. go run ./bench has the in-process family only, so
// that it compiles in seconds; go run ./bench/all registers the distributed
// families (Redis, PostgreSQL) and the OpenTelemetry listener as well:
//
//	go run ./bench                 # the comparison matrix, about a minute; writes bench-results/
//	go run ./bench -impl tenace,semaphore -scenario hot -goroutines 64 -hold 10us
//	go run ./bench/all -providers redis,postgres   # starts throwaway servers, runs both families
//	go run ./bench/all -providers redis -redis 127.0.0.1:6379   # on a server of yours
//	go run ./bench/all -otel       # the pipeline with and without the OpenTelemetry listener
//	go run ./bench -busy 2         # every cell beside 2 goroutines that burn CPU
package load

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Impl is one implementation the tool can run.
type Impl struct {
	Name string
	Desc string
	// Make makes the implementation on addr (the family's server; "" for the
	// in-process family), with room for goroutines concurrent callers and,
	// for tenace in-process, shards shards (0: the default).
	Make func(addr string, goroutines, shards int) (Locker, error)
	// Gives lists the guarantees it gives its callers (givesOrder,
	// givesCancel, givesFencing), for the conclusions under the table.
	Gives []string
}

// Family is a set of implementations that run on one provider: the
// in-process locks, or one distributed store and its peers.
type Family struct {
	Name string // the -providers value: memory, redis, postgres
	// Base is the tenace implementation every other row of the family is
	// compared with.
	Base  string
	Impls []Impl
	// Scenarios and Goroutines are the family's defaults, comma-separated.
	Scenarios, Goroutines string
	// AddrFlag names the flag that gives the server's address (redis:
	// -redis host:port); AddrUsage is its help. Empty for in-process.
	AddrFlag, AddrUsage string
	// Start starts a throwaway server on a free loopback port when no
	// address is given, and returns its address and how to stop it.
	Start func() (addr string, stop func(), err error)
}

var families = []*Family{memoryFamily()}

// elsewhere are the families go run ./bench/all has and go run ./bench has
// not: asked for one, the light command names the one that has it.
var elsewhere = []string{"redis", "postgres", "etcd"}

// Register adds a family to the tool (go run ./bench/all registers Redis and
// PostgreSQL; an etcd family registers the same way). It is for init
// functions: it panics on a name already taken.
func Register(f *Family) {
	if family(f.Name) != nil {
		panic("tenace: bench family " + f.Name + " registered twice")
	}
	families = append(families, f)
}

// AddImpl adds an implementation to a registered family (go run ./bench/all
// adds pipeline+otel to memory). It is for init functions.
func AddImpl(familyName string, i Impl) {
	f := family(familyName)
	if f == nil {
		panic("tenace: bench family " + familyName + " is not registered")
	}
	f.Impls = append(f.Impls, i)
}

func family(name string) *Family {
	for _, f := range families {
		if f.Name == name {
			return f
		}
	}
	return nil
}

// otelImpl, when registered (go run ./bench/all), is what -otel adds.
const otelImpl = "pipeline+otel"

// defaults of the no-flag comparison matrix: 4 × 3 × 3 cells of 1.5 s, about
// 60 s in all.
var (
	defaultImpls     = []string{"tenace", "moby", "keymutex", "semaphore"}
	defaultScenarios = []string{"distinct", "hot", "zipf"}
)

// DefaultOut is where the table and chart go when -out is not given. A
// command that registers more families sets its own in init, so that its
// chart does not overwrite go run ./bench's (go run ./bench/all:
// bench-results/all).
var DefaultOut = "bench-results"

type config struct {
	families   []*Family
	impls      []string
	scenarios  []string
	goroutines []int
	keys       int
	hold       time.Duration
	busy       int
	duration   time.Duration
	shards     int
	out        string
	quiet      bool
	addrs      map[string]string // family → address given on the command line
}

func parse(args []string, stderr io.Writer) (config, error) {
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var famNames []string
	for _, f := range families {
		famNames = append(famNames, f.Name)
	}
	providers := fs.String("providers", "memory", "provider families, comma-separated: "+strings.Join(famNames, ", ")+"; a distributed one with no address starts a throwaway server")
	impl := fs.String("impl", "", "implementations, comma-separated (default: every implementation of the families; for memory "+strings.Join(defaultImpls, ",")+"): "+strings.Join(implNames(families), ", "))
	scenario := fs.String("scenario", "", "scenarios, comma-separated (default: the family's; memory "+strings.Join(defaultScenarios, ",")+"): "+strings.Join(scenarios, ", "))
	gs := fs.String("goroutines", "", "goroutine counts, comma-separated (default: the family's; memory 1,16,256)")
	keys := fs.Int("keys", 0, "keys per goroutine for distinct (default 16), keys in all for zipf (default 10000)")
	hold := fs.Duration("hold", 0, "time spent inside the critical section")
	busy := fs.Int("busy", 0, "goroutines that burn CPU beside the lockers throughout every cell: what a lock that yields its P or spins costs when the process has other work")
	duration := fs.Duration("duration", 1500*time.Millisecond, "how long each cell runs")
	shards := fs.Int("shards", 0, "shards of the tenace provider (0: its default, GOMAXPROCS)")
	out := fs.String("out", DefaultOut, "directory to write results.md, results.json and chart.svg into (\"\": none)")
	quiet := fs.Bool("quiet", false, "no live progress line")
	withOtel := fs.Bool("otel", false, "also run "+otelImpl+" (the pipeline with tenace/oteltenace's listener) and print the OpenTelemetry metrics it recorded; without -impl, runs pipeline and "+otelImpl+" (go run ./bench/all)")
	addrs := map[string]*string{}
	for _, f := range families {
		if f.AddrFlag != "" {
			addrs[f.Name] = fs.String(f.AddrFlag, "", f.AddrUsage)
		}
	}
	fs.Usage = func() {
		fmt.Fprintf(stderr, "usage: go run ./bench [flags]   (go run ./bench/all [flags]: also redis, postgres, -otel)\n\nRuns keyed locks through contention scenarios and prints a table.\n\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return config{}, err
	}
	bad := func(format string, a ...any) (config, error) {
		err := fmt.Errorf(format, a...)
		fmt.Fprintf(stderr, "bench: %v\n\n", err)
		fs.Usage()
		return config{}, err
	}
	if fs.NArg() > 0 {
		return bad("unexpected argument %q: every setting is a flag", fs.Arg(0))
	}
	c := config{keys: *keys, hold: *hold, busy: *busy, duration: *duration, shards: *shards, out: *out, quiet: *quiet, addrs: map[string]string{}}
	for _, name := range split(*providers) {
		f := family(name)
		switch {
		case f == nil && slices.Contains(elsewhere, name) && len(families) > 1:
			return bad("-providers %s: no %s family is registered in this tool yet", name, name)
		case f == nil && slices.Contains(elsewhere, name):
			return bad("-providers %s: the distributed providers are in a command of their own, so that this one compiles in seconds: go run ./bench/all -providers %s", name, *providers)
		case f == nil:
			return bad("-providers: unknown provider %q (known: %s)", name, strings.Join(famNames, ", "))
		case slices.Contains(c.families, f):
			return bad("-providers: %s named twice", name)
		}
		c.families = append(c.families, f)
	}
	if len(c.families) == 0 {
		return bad("-providers needs at least one value")
	}
	for name, a := range addrs {
		if *a == "" {
			continue
		}
		if !slices.ContainsFunc(c.families, func(f *Family) bool { return f.Name == name }) {
			return bad("-%s goes with -providers %s", family(name).AddrFlag, name)
		}
		c.addrs[name] = *a
	}
	mem := slices.ContainsFunc(c.families, func(f *Family) bool { return f.Name == "memory" })
	if *withOtel {
		switch {
		case family("memory").impl(otelImpl) == nil:
			return bad("-otel: the OpenTelemetry listener is in go run ./bench/all -otel, so that this command compiles in seconds")
		case !mem:
			return bad("-otel goes with -providers memory")
		case !isSet(fs, "impl"):
			*impl = "pipeline," + otelImpl
		case !slices.Contains(split(*impl), otelImpl):
			*impl += "," + otelImpl
		}
	}
	// Implementations: those named, else each family's defaults.
	if *impl == "" {
		for _, f := range c.families {
			if f.Name == "memory" {
				c.impls = append(c.impls, defaultImpls...)
				continue
			}
			for _, i := range f.Impls {
				c.impls = append(c.impls, i.Name)
			}
		}
	}
	all := implNames(c.families)
	for _, n := range split(*impl) {
		if !slices.Contains(all, n) {
			return bad("-impl: unknown implementation %q (known: %s)", n, strings.Join(all, ", "))
		}
		c.impls = append(c.impls, n)
	}
	// Rows go family by family, and the base implementation runs first in
	// each, so that every other row can print its ratio to it as soon as it
	// finishes.
	rank := func(impl string) int {
		r := 2 * slices.Index(families, familyOf(impl))
		if !isBase(impl) {
			r++
		}
		return r
	}
	slices.SortStableFunc(c.impls, func(a, b string) int { return rank(a) - rank(b) })
	if *scenario == "" {
		*scenario = familyDefault(c.families, func(f *Family) string { return f.Scenarios })
	}
	for _, s := range split(*scenario) {
		if !slices.Contains(scenarios, s) {
			return bad("-scenario: unknown scenario %q (known: %s)", s, strings.Join(scenarios, ", "))
		}
		c.scenarios = append(c.scenarios, s)
	}
	if *gs == "" {
		*gs = familyDefault(c.families, func(f *Family) string { return f.Goroutines })
	}
	for _, g := range split(*gs) {
		n, err := strconv.Atoi(g)
		if err != nil || n < 1 {
			return bad("-goroutines: %q is not a positive whole number", g)
		}
		c.goroutines = append(c.goroutines, n)
	}
	switch {
	case len(c.impls) == 0 || len(c.scenarios) == 0 || len(c.goroutines) == 0:
		return bad("-impl, -scenario and -goroutines each need at least one value")
	case c.keys < 0:
		return bad("-keys must not be negative, got %d", c.keys)
	case c.keys == 1 && slices.Contains(c.scenarios, "zipf"):
		return bad("-keys 1 leaves zipf nothing to draw from: use hot for a single key")
	case c.hold < 0:
		return bad("-hold must not be negative, got %v", c.hold)
	case c.busy < 0:
		return bad("-busy must not be negative, got %d", c.busy)
	case c.duration <= 0:
		return bad("-duration must be positive, got %v", c.duration)
	case c.shards < 0:
		return bad("-shards must not be negative, got %d", c.shards)
	}
	return c, nil
}

// familyDefault merges the families' defaults for a list flag (scenarios,
// goroutines), first family's first, without repeats.
func familyDefault(fs []*Family, of func(*Family) string) string {
	var out []string
	for _, f := range fs {
		for _, v := range split(of(f)) {
			if !slices.Contains(out, v) {
				out = append(out, v)
			}
		}
	}
	return strings.Join(out, ",")
}

func implNames(fs []*Family) []string {
	var names []string
	for _, f := range fs {
		for _, i := range f.Impls {
			names = append(names, i.Name)
		}
	}
	return names
}

func (f *Family) impl(name string) *Impl {
	for i := range f.Impls {
		if f.Impls[i].Name == name {
			return &f.Impls[i]
		}
	}
	return nil
}

// familyOf is the registered family that has implementation name.
func familyOf(name string) *Family {
	for _, f := range families {
		if f.impl(name) != nil {
			return f
		}
	}
	return nil
}

func isSet(fs *flag.FlagSet, name string) bool {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}

func split(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

// Run runs the tool with args (without the program name) and returns its
// exit code: 0, 1 when a cell failed or a lock let two holders in, 2 for bad
// flags.
func Run(args []string, stdout, stderr io.Writer) int {
	c, err := parse(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		return 2
	}
	var cells []cell
	for _, sc := range c.scenarios {
		for _, g := range c.goroutines {
			for _, impl := range c.impls {
				if sc == "cancel" && !takesContext(impl) {
					continue // takes no context: nothing to cancel
				}
				cells = append(cells, cell{Impl: impl, Family: familyOf(impl).Name, Scenario: sc, Goroutines: g, Keys: c.keys, Hold: c.hold, Busy: c.busy, Shards: c.shards, Duration: c.duration})
			}
		}
	}
	if len(cells) == 0 {
		fmt.Fprintf(stderr, "bench: no cell to run: the cancel scenario runs only for implementations that take a context (not %s)\n", strings.Join(c.impls, ", "))
		return 2
	}
	var progress io.Writer
	if !c.quiet {
		progress = stderr
	}
	// The servers the cells need, started before the table: a distributed
	// family with no address given gets a throwaway server for the run.
	for _, f := range c.families {
		if f.Start == nil || c.addrs[f.Name] != "" || !slices.ContainsFunc(cells, func(cl cell) bool { return cl.Family == f.Name }) {
			continue
		}
		if progress != nil {
			fmt.Fprintf(progress, "starting a throwaway %s server on a free loopback port…\n", f.Name)
		}
		addr, stop, err := f.Start()
		if err != nil {
			fmt.Fprintf(stderr, "bench: starting a %s server: %v (or give one: -%s)\n", f.Name, err, f.AddrFlag)
			return 1
		}
		defer stop()
		c.addrs[f.Name] = addr
	}
	for i := range cells {
		cells[i].Addr = c.addrs[cells[i].Family]
	}
	busyNote := ""
	if c.busy > 0 {
		busyNote = fmt.Sprintf(", beside %d goroutines burning CPU", c.busy)
	}
	fmt.Fprintf(stdout, "tenace load tool — %s; %d cells of %v, hold %v%s\n", machine(), len(cells), c.duration, c.hold, busyNote)
	floor := measureFloor()
	fmt.Fprintf(stdout, "floor: one channel round trip between two goroutines takes %s here (%.2f M/s; the fastest of ten 10ms samples)\n\n", Dur(floor), 1e3/float64(floor.Nanoseconds()))
	printHeader(stdout)
	var rs []result
	var notes []string
	broken := false
	for i, cl := range cells {
		label := fmt.Sprintf("[%d/%d] %s %s g=%d", i+1, len(cells), cl.Impl, cl.Scenario, cl.Goroutines)
		r, note, err := runCell(cl, progress, label)
		if err != nil {
			fmt.Fprintf(stderr, "bench: %v\n", err)
			return 1
		}
		r.Floor = floor
		rs = append(rs, r)
		printRow(stdout, r, baseOf(rs, r))
		broken = broken || r.MaxInside > 1
		if note != "" {
			notes = append(notes, note)
		}
	}
	fmt.Fprint(stdout, footnote(rs))
	conclude(stdout, rs)
	for _, n := range notes {
		fmt.Fprintf(stdout, "\n%s", n)
	}
	if c.out != "" {
		if err := writeOutputs(c.out, rs, notes); err != nil {
			fmt.Fprintf(stderr, "bench: writing -out: %v\n", err)
			return 1
		}
		fmt.Fprintf(stdout, "\nwrote %s/results.md (the table), results.json, chart.svg (throughput and latency per cell)\n", c.out)
	}
	if broken {
		fmt.Fprintln(stderr, "bench: an implementation let two holders into one key at once")
		return 1
	}
	return 0
}

func takesContext(impl string) bool {
	f := familyOf(impl)
	if f.Name != "memory" {
		return true // every distributed implementation takes a context
	}
	l, err := f.impl(impl).Make("", 1, 0)
	if err != nil {
		return true
	}
	defer l.Close()
	return l.TakesContext()
}

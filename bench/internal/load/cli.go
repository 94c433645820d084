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

// flags are parse's flag values, before they are checked.
type flags struct {
	providers, impl, scenario, goroutines *string
	keys, busy, shards                    *int
	hold, duration                        *time.Duration
	out                                   *string
	quiet, otel                           *bool
	addrs                                 map[string]*string // family → its address flag
}

// defineFlags defines the tool's flags on fs; famNames are the registered
// families' names, for the help.
func defineFlags(fs *flag.FlagSet, famNames []string) flags {
	fl := flags{
		providers:  fs.String("providers", "memory", "provider families, comma-separated: "+strings.Join(famNames, ", ")+"; a distributed one with no address starts a throwaway server"),
		impl:       fs.String("impl", "", "implementations, comma-separated (default: every implementation of the families; for memory "+strings.Join(defaultImpls, ",")+"): "+strings.Join(implNames(families), ", ")),
		scenario:   fs.String("scenario", "", "scenarios, comma-separated (default: the family's; memory "+strings.Join(defaultScenarios, ",")+"): "+strings.Join(scenarios, ", ")),
		goroutines: fs.String("goroutines", "", "goroutine counts, comma-separated (default: the family's; memory 1,16,256)"),
		keys:       fs.Int("keys", 0, "keys per goroutine for distinct (default 16), keys in all for zipf (default 10000)"),
		hold:       fs.Duration("hold", 0, "time spent inside the critical section"),
		busy:       fs.Int("busy", 0, "goroutines that burn CPU beside the lockers throughout every cell: what a lock that yields its P or spins costs when the process has other work"),
		duration:   fs.Duration("duration", 1500*time.Millisecond, "how long each cell runs"),
		shards:     fs.Int("shards", 0, "shards of the tenace provider (0: its default, GOMAXPROCS)"),
		out:        fs.String("out", DefaultOut, "directory to write results.md, results.json and chart.svg into (\"\": none)"),
		quiet:      fs.Bool("quiet", false, "no live progress line"),
		otel:       fs.Bool("otel", false, "also run "+otelImpl+" (the pipeline with tenace/oteltenace's listener) and print the OpenTelemetry metrics it recorded; without -impl, runs pipeline and "+otelImpl+" (go run ./bench/all)"),
		addrs:      map[string]*string{},
	}
	for _, f := range families {
		if f.AddrFlag != "" {
			fl.addrs[f.Name] = fs.String(f.AddrFlag, "", f.AddrUsage)
		}
	}
	return fl
}

func parse(args []string, stderr io.Writer) (config, error) {
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var famNames []string
	for _, f := range families {
		famNames = append(famNames, f.Name)
	}
	fl := defineFlags(fs, famNames)
	fs.Usage = func() {
		fmt.Fprintf(stderr, "usage: go run ./bench [flags]   (go run ./bench/all [flags]: also redis, postgres, -otel)\n\nRuns keyed locks through contention scenarios and prints a table.\n\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return config{}, err
	}
	c, err := fl.config(fs, famNames)
	if err != nil {
		fmt.Fprintf(stderr, "bench: %v\n\n", err)
		fs.Usage()
		return config{}, err
	}
	return c, nil
}

// config checks the parsed flags, in the order their errors are reported,
// and returns the run they describe.
func (fl flags) config(fs *flag.FlagSet, famNames []string) (config, error) {
	if fs.NArg() > 0 {
		return config{}, fmt.Errorf("unexpected argument %q: every setting is a flag", fs.Arg(0))
	}
	c := config{keys: *fl.keys, hold: *fl.hold, busy: *fl.busy, duration: *fl.duration, shards: *fl.shards, out: *fl.out, quiet: *fl.quiet}
	var err error
	if c.families, err = parseProviders(*fl.providers, famNames); err != nil {
		return config{}, err
	}
	if c.addrs, err = parseAddrs(fl.addrs, c.families); err != nil {
		return config{}, err
	}
	impl := *fl.impl
	if *fl.otel {
		if impl, err = withOtel(impl, isSet(fs, "impl"), c.families); err != nil {
			return config{}, err
		}
	}
	if c.impls, err = parseImpls(impl, c.families); err != nil {
		return config{}, err
	}
	if c.scenarios, err = parseScenarios(*fl.scenario, c.families); err != nil {
		return config{}, err
	}
	if c.goroutines, err = parseGoroutines(*fl.goroutines, c.families); err != nil {
		return config{}, err
	}
	return c, c.check()
}

// parseProviders is the families -providers names.
func parseProviders(providers string, famNames []string) ([]*Family, error) {
	var fams []*Family
	for _, name := range split(providers) {
		f := family(name)
		switch {
		case f == nil && slices.Contains(elsewhere, name) && len(families) > 1:
			return nil, fmt.Errorf("-providers %s: no %s family is registered in this tool yet", name, name)
		case f == nil && slices.Contains(elsewhere, name):
			return nil, fmt.Errorf("-providers %s: not built into this command; run go run ./bench/all -providers %s", name, providers)
		case f == nil:
			return nil, fmt.Errorf("-providers: unknown provider %q (known: %s)", name, strings.Join(famNames, ", "))
		case slices.Contains(fams, f):
			return nil, fmt.Errorf("-providers: %s named twice", name)
		}
		fams = append(fams, f)
	}
	if len(fams) == 0 {
		return nil, fmt.Errorf("-providers needs at least one value")
	}
	return fams, nil
}

// parseAddrs is the server addresses given by the families' address flags,
// each of a family in fams.
func parseAddrs(addrs map[string]*string, fams []*Family) (map[string]string, error) {
	out := map[string]string{}
	for name, a := range addrs {
		if *a == "" {
			continue
		}
		if !slices.ContainsFunc(fams, func(f *Family) bool { return f.Name == name }) {
			return nil, fmt.Errorf("-%s goes with -providers %s", family(name).AddrFlag, name)
		}
		out[name] = *a
	}
	return out, nil
}

// withOtel is -impl with -otel: pipeline and the OpenTelemetry
// implementation when -impl is not set, else -impl and that implementation.
func withOtel(impl string, implSet bool, fams []*Family) (string, error) {
	mem := slices.ContainsFunc(fams, func(f *Family) bool { return f.Name == "memory" })
	switch {
	case family("memory").impl(otelImpl) == nil:
		return "", fmt.Errorf("-otel: not built into this command; run go run ./bench/all -otel")
	case !mem:
		return "", fmt.Errorf("-otel goes with -providers memory")
	case !implSet:
		return "pipeline," + otelImpl, nil
	case !slices.Contains(split(impl), otelImpl):
		return impl + "," + otelImpl, nil
	}
	return impl, nil
}

// parseImpls is the implementations -impl names, else each family's
// defaults. Rows go family by family, and the base implementation runs
// first in each, so that every other row can print its ratio to it as soon
// as it finishes.
func parseImpls(impl string, fams []*Family) ([]string, error) {
	var impls []string
	if impl == "" {
		for _, f := range fams {
			if f.Name == "memory" {
				impls = append(impls, defaultImpls...)
				continue
			}
			for _, i := range f.Impls {
				impls = append(impls, i.Name)
			}
		}
	}
	all := implNames(fams)
	for _, n := range split(impl) {
		if !slices.Contains(all, n) {
			return nil, fmt.Errorf("-impl: unknown implementation %q (known: %s)", n, strings.Join(all, ", "))
		}
		impls = append(impls, n)
	}
	rank := func(impl string) int {
		r := 2 * slices.Index(families, familyOf(impl))
		if !isBase(impl) {
			r++
		}
		return r
	}
	slices.SortStableFunc(impls, func(a, b string) int { return rank(a) - rank(b) })
	return impls, nil
}

// parseScenarios is the scenarios -scenario names, else the families'.
func parseScenarios(scenario string, fams []*Family) ([]string, error) {
	if scenario == "" {
		scenario = familyDefault(fams, func(f *Family) string { return f.Scenarios })
	}
	var out []string
	for _, s := range split(scenario) {
		if !slices.Contains(scenarios, s) {
			return nil, fmt.Errorf("-scenario: unknown scenario %q (known: %s)", s, strings.Join(scenarios, ", "))
		}
		out = append(out, s)
	}
	return out, nil
}

// parseGoroutines is the goroutine counts -goroutines names, else the
// families'.
func parseGoroutines(gs string, fams []*Family) ([]int, error) {
	if gs == "" {
		gs = familyDefault(fams, func(f *Family) string { return f.Goroutines })
	}
	var out []int
	for _, g := range split(gs) {
		n, err := strconv.Atoi(g)
		if err != nil || n < 1 {
			return nil, fmt.Errorf("-goroutines: %q is not a positive whole number", g)
		}
		out = append(out, n)
	}
	return out, nil
}

// check checks the settings that stand alone or go in pairs.
func (c config) check() error {
	switch {
	case len(c.impls) == 0 || len(c.scenarios) == 0 || len(c.goroutines) == 0:
		return fmt.Errorf("-impl, -scenario and -goroutines each need at least one value")
	case c.keys < 0:
		return fmt.Errorf("-keys must not be negative, got %d", c.keys)
	case c.keys == 1 && slices.Contains(c.scenarios, "zipf"):
		return fmt.Errorf("-keys 1 leaves zipf nothing to draw from: use hot for a single key")
	case c.hold < 0:
		return fmt.Errorf("-hold must not be negative, got %v", c.hold)
	case c.busy < 0:
		return fmt.Errorf("-busy must not be negative, got %d", c.busy)
	case c.duration <= 0:
		return fmt.Errorf("-duration must be positive, got %v", c.duration)
	case c.shards < 0:
		return fmt.Errorf("-shards must not be negative, got %d", c.shards)
	}
	return nil
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
	cells := c.cells()
	if len(cells) == 0 {
		fmt.Fprintf(stderr, "bench: no cell to run: the cancel scenario runs only for implementations that take a context (not %s)\n", strings.Join(c.impls, ", "))
		return 2
	}
	var progress io.Writer
	if !c.quiet {
		progress = stderr
	}
	stops, err := c.startServers(cells, progress)
	defer func() {
		for i := len(stops) - 1; i >= 0; i-- {
			stops[i]()
		}
	}()
	if err != nil {
		fmt.Fprintf(stderr, "bench: %v\n", err)
		return 1
	}
	for i := range cells {
		cells[i].Addr = c.addrs[cells[i].Family]
	}
	rs, notes, err := c.runCells(cells, progress, stdout)
	if err != nil {
		fmt.Fprintf(stderr, "bench: %v\n", err)
		return 1
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
	if slices.ContainsFunc(rs, func(r result) bool { return r.MaxInside > 1 }) {
		fmt.Fprintln(stderr, "bench: an implementation let two holders into one key at once")
		return 1
	}
	return 0
}

// cells is the run's cells, scenario by scenario, then goroutine count, then
// implementation; the cancel scenario only for implementations that take a
// context (the others have nothing to cancel).
func (c config) cells() []cell {
	var cells []cell
	for _, sc := range c.scenarios {
		for _, g := range c.goroutines {
			for _, impl := range c.impls {
				if sc == "cancel" && !takesContext(impl) {
					continue
				}
				cells = append(cells, cell{Impl: impl, Family: familyOf(impl).Name, Scenario: sc, Goroutines: g, Keys: c.keys, Hold: c.hold, Busy: c.busy, Shards: c.shards, Duration: c.duration})
			}
		}
	}
	return cells
}

// startServers starts the servers the cells need before the table: a
// distributed family with no address given gets a throwaway server for the
// run, its address in c.addrs. It returns how to stop those it started, also
// when it fails to start one.
func (c config) startServers(cells []cell, progress io.Writer) (stops []func(), err error) {
	for _, f := range c.families {
		if f.Start == nil || c.addrs[f.Name] != "" || !slices.ContainsFunc(cells, func(cl cell) bool { return cl.Family == f.Name }) {
			continue
		}
		if progress != nil {
			fmt.Fprintf(progress, "starting a throwaway %s server on a free loopback port…\n", f.Name)
		}
		addr, stop, err := f.Start()
		if err != nil {
			return stops, fmt.Errorf("starting a %s server: %v (or give one: -%s)", f.Name, err, f.AddrFlag)
		}
		stops = append(stops, stop)
		c.addrs[f.Name] = addr
	}
	return stops, nil
}

// runCells prints the header and the floor, then runs the cells, printing
// each row as it finishes, and returns their results and notes.
func (c config) runCells(cells []cell, progress, stdout io.Writer) ([]result, []string, error) {
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
	for i, cl := range cells {
		label := fmt.Sprintf("[%d/%d] %s %s g=%d", i+1, len(cells), cl.Impl, cl.Scenario, cl.Goroutines)
		r, note, err := runCell(cl, progress, label)
		if err != nil {
			return nil, nil, err
		}
		r.Floor = floor
		rs = append(rs, r)
		printRow(stdout, r, baseOf(rs, r))
		if note != "" {
			notes = append(notes, note)
		}
	}
	return rs, notes, nil
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

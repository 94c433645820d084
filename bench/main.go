// Command bench is tenace's load tool: it runs keyed locks — tenace and the
// locks Go developers use today — through contention scenarios, and prints
// throughput, acquire latency percentiles and a mutual-exclusion check.
//
//	go run ./bench                 # the comparison matrix, about a minute
//	go run ./bench -impl tenace,semaphore -scenario hot -goroutines 64 -hold 10us
//	go run ./bench -out results    # also writes results.md, results.json, chart.svg
//	go run ./bench -provider redis -redis localhost:6379   # the distributed locks
//	go run ./bench -provider postgres -postgres 'host=localhost user=postgres'
//	go run ./bench -otel           # the pipeline with and without the OpenTelemetry listener, and its metrics
//	go run ./bench -busy 2         # every cell beside 2 goroutines that burn CPU (a scheduling check)
//
// The Go benchmarks of the same implementations are in bench_test.go:
// go test ./bench -bench . -benchmem.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"
)

func main() { os.Exit(run(os.Args[1:], os.Stdout, os.Stderr)) }

// defaults of the no-flag comparison matrix: 4 × 3 × 3 cells of 1.5 s, about
// 60 s in all.
var (
	defaultImpls     = []string{"tenace", "moby", "keymutex", "semaphore"}
	defaultScenarios = []string{"distinct", "hot", "zipf"}
)

type config struct {
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
	redis      string // server address when -provider redis
	postgres   string // connection string when -provider postgres
}

func parse(args []string, stderr io.Writer) (config, error) {
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var names []string
	for _, i := range impls {
		names = append(names, i.name)
	}
	impl := fs.String("impl", strings.Join(defaultImpls, ","), "implementations, comma-separated: "+strings.Join(names, ", "))
	scenario := fs.String("scenario", strings.Join(defaultScenarios, ","), "scenarios, comma-separated: "+strings.Join(scenarios, ", "))
	gs := fs.String("goroutines", "1,16,256", "goroutine counts, comma-separated")
	keys := fs.Int("keys", 0, "keys per goroutine for distinct (default 16), keys in all for zipf (default 10000)")
	hold := fs.Duration("hold", 0, "time spent inside the critical section")
	busy := fs.Int("busy", 0, "goroutines that burn CPU beside the lockers throughout every cell: what a lock that yields its P or spins costs when the process has other work")
	duration := fs.Duration("duration", 1500*time.Millisecond, "how long each cell runs")
	shards := fs.Int("shards", 0, "shards of the tenace provider (0: its default, GOMAXPROCS)")
	out := fs.String("out", "", "directory to write results.md, results.json, chart.svg and chart.png into")
	quiet := fs.Bool("quiet", false, "no live progress line")
	provider := fs.String("provider", "memory", "memory: the in-process locks; redis: the distributed ones (tenace-redis, redsync, bsm) on -redis; postgres: tenace-pg, tenace-pg-nofence and pg-hand on -postgres")
	redisAddr := fs.String("redis", "", "Redis server address (host:port) for -provider redis")
	pgConn := fs.String("postgres", "", "PostgreSQL connection string for -provider postgres")
	withOtel := fs.Bool("otel", false, "also run "+otelImpl+" (the pipeline with tenace/oteltenace's listener) and print the OpenTelemetry metrics it recorded; without -impl, runs pipeline and "+otelImpl)
	fs.Usage = func() {
		fmt.Fprintf(stderr, "usage: go run ./bench [flags]\n\nRuns keyed locks through contention scenarios and prints a table.\n\n")
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
	c := config{keys: *keys, hold: *hold, busy: *busy, duration: *duration, shards: *shards, out: *out, quiet: *quiet}
	switch *provider {
	case "memory":
		if *redisAddr != "" {
			return bad("-redis goes with -provider redis")
		}
		if *pgConn != "" {
			return bad("-postgres goes with -provider postgres")
		}
		if *withOtel && !isSet(fs, "impl") {
			*impl = "pipeline," + otelImpl
		} else if *withOtel && !slices.Contains(split(*impl), otelImpl) {
			*impl += "," + otelImpl
		}
	case "redis":
		if *redisAddr == "" {
			return bad("-provider redis needs -redis host:port")
		}
		c.redis = *redisAddr
		if *pgConn != "" {
			return bad("-postgres goes with -provider postgres")
		}
		if *withOtel {
			return bad("-otel goes with -provider memory")
		}
		names = nil
		for _, i := range redisImpls {
			names = append(names, i.name)
		}
		if !isSet(fs, "impl") {
			*impl = strings.Join(names, ",")
		}
		if !isSet(fs, "goroutines") {
			*gs = "1,8"
		}
		if !isSet(fs, "scenario") {
			*scenario = "distinct,hot"
		}
	case "postgres":
		if *pgConn == "" {
			return bad("-provider postgres needs -postgres CONNSTRING")
		}
		c.postgres = *pgConn
		if *redisAddr != "" {
			return bad("-redis goes with -provider redis")
		}
		if *withOtel {
			return bad("-otel goes with -provider memory")
		}
		names = nil
		for _, i := range postgresImpls {
			names = append(names, i.name)
		}
		if !isSet(fs, "impl") {
			*impl = strings.Join(names, ",")
		}
		if !isSet(fs, "goroutines") {
			*gs = "1,8"
		}
		if !isSet(fs, "scenario") {
			*scenario = "distinct,hot"
		}
	default:
		return bad("-provider: %q is not memory, redis or postgres", *provider)
	}
	for _, n := range split(*impl) {
		if !slices.Contains(names, n) {
			return bad("-impl: unknown implementation %q (known: %s)", n, strings.Join(names, ", "))
		}
		c.impls = append(c.impls, n)
	}
	// The base implementation runs first in each cell, so that every other
	// row can print its ratio to it as soon as it finishes.
	slices.SortStableFunc(c.impls, func(a, b string) int {
		switch {
		case isBase(a) && !isBase(b):
			return -1
		case isBase(b) && !isBase(a):
			return 1
		}
		return 0
	})
	for _, s := range split(*scenario) {
		if !slices.Contains(scenarios, s) {
			return bad("-scenario: unknown scenario %q (known: %s)", s, strings.Join(scenarios, ", "))
		}
		c.scenarios = append(c.scenarios, s)
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

func run(args []string, stdout, stderr io.Writer) int {
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
				if l, ok := makeLocker(impl, c.shards); ok {
					takesCtx := l.TakesContext()
					l.Close()
					if sc == "cancel" && !takesCtx {
						continue // takes no context: nothing to cancel
					}
				}
				cells = append(cells, cell{Impl: impl, Scenario: sc, Goroutines: g, Keys: c.keys, Hold: c.hold, Busy: c.busy, Shards: c.shards, Duration: c.duration, Redis: c.redis, Postgres: c.postgres})
			}
		}
	}
	if len(cells) == 0 {
		fmt.Fprintf(stderr, "bench: no cell to run: the cancel scenario runs only for implementations that take a context (not %s)\n", strings.Join(c.impls, ", "))
		return 2
	}
	busyNote := ""
	if c.busy > 0 {
		busyNote = fmt.Sprintf(", beside %d goroutines burning CPU", c.busy)
	}
	fmt.Fprintf(stdout, "tenace load tool — %s; %d cells of %v, hold %v%s\n\n", machine(), len(cells), c.duration, c.hold, busyNote)
	printHeader(stdout)
	var progress io.Writer
	if !c.quiet {
		progress = stderr
	}
	var rs []result
	var otels []otelReport
	broken := false
	for i, cl := range cells {
		label := fmt.Sprintf("[%d/%d] %s %s g=%d", i+1, len(cells), cl.Impl, cl.Scenario, cl.Goroutines)
		r, err := runCell(cl, progress, label)
		if err != nil {
			fmt.Fprintf(stderr, "bench: %v\n", err)
			return 1
		}
		rs = append(rs, r)
		printRow(stdout, r, baseOf(rs, r))
		broken = broken || r.MaxInside > 1
		if rm := lastOtel.Swap(nil); rm != nil && cl.Impl == otelImpl {
			otels = append(otels, otelReport{label: fmt.Sprintf("%s %s g=%d", cl.Impl, cl.Scenario, cl.Goroutines), rm: rm})
		}
	}
	printOtel(stdout, otels)
	if c.out != "" {
		if err := writeOutputs(c.out, rs); err != nil {
			fmt.Fprintf(stderr, "bench: writing -out: %v\n", err)
			return 1
		}
		fmt.Fprintf(stdout, "\nwrote %s/results.md, results.json, chart.svg, chart.png\n", c.out)
		if len(otels) > 0 {
			if err := writeOtel(c.out, otels); err != nil {
				fmt.Fprintf(stderr, "bench: writing -out: %v\n", err)
				return 1
			}
			fmt.Fprintf(stdout, "wrote %s/otel.txt\n", c.out)
		}
	}
	if broken {
		fmt.Fprintln(stderr, "bench: an implementation let two holders into one key at once")
		return 1
	}
	return 0
}

// Command tenace answers, from outside, the first question asked of a
// stuck lock: who holds it, since when, and who waits. It reads the locks
// that tenace's distributed providers keep in Redis, PostgreSQL or etcd,
// and never changes one.
//
//	tenace locks   --redis ADDR | --postgres URL | --etcd URLS [--prefix P] [--json]
//	tenace inspect KEY --redis ADDR | --postgres URL | --etcd URLS [--json]
//
// locks lists the held keys (those that begin with --prefix), one line a
// holder: the key, its mode, owner, how long it has been held, its fencing
// token, how long its grant lasts without a renewal, and how many wait.
// inspect shows one key: its holders and its waiters. The answer is a
// table; with --json, the JSON of the lockhttp package, the
// debug page's: locks writes a lockhttp.Snapshot (its "truncated" says
// that --max cut the listing), inspect a lockhttp.Key. Keys and owners
// are arbitrary bytes. In the table, a key that is not printable text
// without spaces, or an owner that is not printable text, is quoted as a
// Go string (%q), so that no byte of it reaches the terminal raw (as is
// one with a double quote, which could pass for a quoted one). In JSON
// they follow lockhttp's convention: text (quoted as %q, with a
// "quoted"/"owner_quoted" flag, when not valid UTF-8 of printable
// characters) and the exact bytes in base64 ("base64", "owner_base64");
// no byte is lost.
//
// Flags, for both commands:
//
//	--redis ADDR        a Redis server (host:port)
//	--postgres URL      a PostgreSQL server (a URL or keyword/value string)
//	--etcd URLS         an etcd cluster's endpoints, comma-separated
//	--namespace NS      the provider's namespace: redislock.WithPrefix or
//	                    etcdlock.WithPrefix (their defaults when empty)
//	--table T           pglock's table of keys (pglock.DefaultTable)
//	--timeout D         the bound on the whole command (default 5s)
//	--json              JSON instead of a table
//
// and for locks:
//
//	--prefix P          only the keys that begin with P
//	--max N             at most N keys (default 1000); the answer says
//	                    when more are held
//
// An unreachable or silent server is an error, never an empty answer: the
// command says what failed and exits with status 1 within its timeout;
// misuse exits with status 2; -h (of the program or of a command) prints
// the usage and the flags, and exits with status 0. A reader that leaves
// before the end of the answer (tenace locks ... | head -1) ends the
// command as it ends any Go program, quietly: the write to the closed pipe
// raises SIGPIPE, and the shell sees status 141 (128+SIGPIPE). Any other
// failed write of the answer is said on stderr, with status 1.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/redis/go-redis/v9"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"tenace.dev/tenace"
	"tenace.dev/tenace/etcdlock"
	"tenace.dev/tenace/lockhttp"
	"tenace.dev/tenace/pglock"
	"tenace.dev/tenace/redislock"
)

func main() { os.Exit(run(os.Args[1:], os.Stdout, os.Stderr)) }

// usage is printed on misuse.
const usage = `usage:
  tenace locks   --redis ADDR | --postgres URL | --etcd URLS [--prefix P] [--max N] [--json]
  tenace inspect KEY --redis ADDR | --postgres URL | --etcd URLS [--json]
common flags: --namespace NS, --table T (PostgreSQL), --timeout D (default 5s)
`

// DefaultTimeout bounds a command that is given no --timeout.
const DefaultTimeout = 5 * time.Second

// config is what the flags say.
type config struct {
	redis, postgres, etcd string
	namespace, table      string
	prefix                string
	max                   int
	timeout               time.Duration
	json                  bool
}

// inspector is a provider the command reads, and closes when done.
type inspector interface {
	tenace.Inspector
	Close() error
}

// run is the command: args without the program's name. It returns the
// exit status: 0, 1 when the server failed, 2 on misuse.
func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		fmt.Fprint(stderr, usage)
		if len(args) == 0 {
			return 2
		}
		return 0
	}
	cmd, rest := args[0], args[1:]
	if cmd != "locks" && cmd != "inspect" {
		fmt.Fprintf(stderr, "tenace: unknown command %q\n%s", cmd, usage)
		return 2
	}
	cfg, key, status := parse(cmd, rest, stderr)
	if status >= 0 {
		return status
	}
	ctx, cancel := context.WithTimeout(context.Background(), cfg.timeout)
	defer cancel()
	p, err := open(ctx, cfg)
	if err != nil {
		fmt.Fprintf(stderr, "tenace %s: %v\n", cmd, explain(err, cfg))
		return 1
	}
	defer p.Close()
	if cmd == "inspect" {
		return inspectKey(ctx, p, cfg, key, stdout, stderr)
	}
	return listLocks(ctx, p, cfg, stdout, stderr)
}

// parse reads the flags of cmd (and the key of inspect, before, among or
// after the flags) from args. It returns status -1 when the command is to
// run; else the exit status: 0 when help was asked for (written on
// stderr), 2 on misuse (said why on stderr).
func parse(cmd string, args []string, stderr io.Writer) (cfg config, key string, status int) {
	fs := flag.NewFlagSet("tenace "+cmd, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(stderr, "%sflags of tenace %s:\n", usage, cmd)
		fs.PrintDefaults()
	}
	fs.StringVar(&cfg.redis, "redis", "", "a Redis server, host:port")
	fs.StringVar(&cfg.postgres, "postgres", "", "a PostgreSQL server, as a URL or keyword/value string")
	fs.StringVar(&cfg.etcd, "etcd", "", "an etcd cluster's endpoints, comma-separated")
	fs.StringVar(&cfg.namespace, "namespace", "", "the provider's namespace (redislock or etcdlock WithPrefix)")
	fs.StringVar(&cfg.table, "table", pglock.DefaultTable, "pglock's table of keys")
	fs.DurationVar(&cfg.timeout, "timeout", DefaultTimeout, "the bound on the whole command")
	fs.BoolVar(&cfg.json, "json", false, "JSON instead of a table")
	if cmd == "locks" {
		fs.StringVar(&cfg.prefix, "prefix", "", "only the keys that begin with it")
		fs.IntVar(&cfg.max, "max", 1000, "at most this many keys")
	}
	// flag stops at the first argument that is not a flag: take it, and
	// read the flags after it too; after "--", every argument is one.
	var operands []string
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return cfg, "", 0
			}
			return cfg, "", 2
		}
		rest := fs.Args()
		if len(rest) == 0 {
			break
		}
		if n := len(args) - len(rest); n > 0 && args[n-1] == "--" {
			operands = append(operands, rest...)
			break
		}
		operands, args = append(operands, rest[0]), rest[1:]
	}
	if cmd == "inspect" && len(operands) == 1 {
		key = operands[0]
	} else if len(operands) > 0 {
		fmt.Fprintf(stderr, "tenace %s: unexpected arguments %q\n%s", cmd, operands, usage)
		return cfg, "", 2
	}
	if cmd == "inspect" && key == "" {
		fmt.Fprintf(stderr, "tenace inspect: which key? tenace inspect KEY --redis ADDR\n")
		return cfg, "", 2
	}
	if n := btoi(cfg.redis != "") + btoi(cfg.postgres != "") + btoi(cfg.etcd != ""); n != 1 {
		fmt.Fprintf(stderr, "tenace %s: give one server: --redis ADDR, --postgres URL or --etcd URLS\n", cmd)
		return cfg, "", 2
	}
	if cfg.timeout <= 0 || cfg.max <= 0 && cmd == "locks" {
		fmt.Fprintf(stderr, "tenace %s: --timeout and --max must be positive\n", cmd)
		return cfg, "", 2
	}
	return cfg, key, -1
}

// inspectKey writes what p says of key, and returns the exit status.
func inspectKey(ctx context.Context, p inspector, cfg config, key string, stdout, stderr io.Writer) int {
	info, err := p.Inspect(ctx, key)
	if err != nil {
		fmt.Fprintf(stderr, "tenace inspect: %v\n", explain(err, cfg))
		return 1
	}
	out := &output{w: stdout}
	if cfg.json {
		writeJSON(out, lockhttp.NewKey(info, time.Now()))
	} else {
		writeInspect(out, info, time.Now())
	}
	return out.status(stderr)
}

// listLocks writes the keys p holds under cfg.prefix, and returns the exit
// status.
func listLocks(ctx context.Context, p inspector, cfg config, stdout, stderr io.Writer) int {
	keys, more, err := list(ctx, p, cfg)
	if err != nil {
		fmt.Fprintf(stderr, "tenace locks: %v\n", explain(err, cfg))
		return 1
	}
	out := &output{w: stdout}
	if cfg.json {
		writeJSON(out, lockhttp.NewSnapshot(cfg.prefix, keys, more, time.Now()))
	} else {
		writeLocks(out, keys, more, time.Now())
	}
	return out.status(stderr)
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// open returns the provider cfg names, for reading only.
func open(ctx context.Context, cfg config) (inspector, error) {
	switch {
	case cfg.redis != "":
		client := redis.NewClient(&redis.Options{Addr: cfg.redis, ContextTimeoutEnabled: true, DialTimeout: cfg.timeout, MaxRetries: -1})
		var opts []redislock.Option
		if cfg.namespace != "" {
			opts = append(opts, redislock.WithPrefix(cfg.namespace))
		}
		return closing{redislock.New(client, opts...), client.Close}, nil
	case cfg.postgres != "":
		// WithoutSetup: the command creates nothing; one connection is
		// all it needs.
		p, err := pglock.New(ctx, cfg.postgres, pglock.WithoutSetup(), pglock.WithTable(cfg.table), pglock.WithMaxConns(1))
		var ne net.Error
		switch {
		case errors.As(err, &ne) || errors.Is(err, syscall.ECONNREFUSED):
			return nil, fmt.Errorf("%w; check --postgres, that the server runs, and that this process can reach it", err)
		case err != nil:
			return nil, fmt.Errorf("%w; check that --postgres names the database, and --table the table, that your services lock with", err)
		}
		return p, nil
	default:
		client, err := clientv3.New(clientv3.Config{Endpoints: strings.Split(cfg.etcd, ","), DialTimeout: cfg.timeout, Logger: zap.NewNop()})
		if err != nil {
			return nil, err
		}
		var opts []etcdlock.Option
		if cfg.namespace != "" {
			opts = append(opts, etcdlock.WithPrefix(cfg.namespace))
		}
		return closing{etcdlock.New(client, opts...), client.Close}, nil
	}
}

// closing is a provider whose Close closes its client too.
type closing struct {
	inspector
	closeClient func() error
}

func (c closing) Close() error {
	err := c.inspector.Close()
	return errors.Join(err, c.closeClient())
}

// explain adds to err what to check, when the server could not be reached
// or did not answer.
func explain(err error, cfg config) error {
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, tenace.ErrNoReply) {
		return fmt.Errorf("%w (no answer within --timeout %v: is the server up and reachable?)", err, cfg.timeout)
	}
	return err
}

// list pages through the held keys, cfg.max at most; more reports that
// the listing was cut short.
func list(ctx context.Context, p tenace.Inspector, cfg config) (keys []tenace.KeyInfo, more bool, err error) {
	opts := tenace.ListOptions{Prefix: cfg.prefix, Limit: min(cfg.max, 100)}
	for {
		page, err := p.List(ctx, opts)
		if err != nil {
			return nil, false, err
		}
		for _, k := range page.Keys {
			if len(keys) == cfg.max {
				return keys, true, nil
			}
			keys = append(keys, k)
		}
		if page.Next == "" {
			return keys, false, nil
		}
		opts.Cursor = page.Next
	}
}

// showKey is key as a person may read it: as it is when it is printable
// text without spaces, else quoted as a Go string (control characters, a
// terminal's escape sequences and invalid UTF-8 escaped).
func showKey(key string) string {
	if key == "" || !utf8.ValidString(key) {
		return strconv.Quote(key)
	}
	for _, r := range key {
		if !unicode.IsPrint(r) || unicode.IsSpace(r) || r == '"' {
			return strconv.Quote(key)
		}
	}
	return key
}

// showText is an owner label as a person may read it: as it is when it is
// printable text (spaces included: owners hold them), else quoted as a Go
// string, as is a label with a double quote (which could pass for a
// quoted one); "-" when empty.
func showText(s string) string {
	if s == "" {
		return "-"
	}
	if !utf8.ValidString(s) {
		return strconv.Quote(s)
	}
	for _, r := range s {
		if !unicode.IsPrint(r) || r == '"' {
			return strconv.Quote(s)
		}
	}
	return s
}

// age is how long ago t was, rounded for a person; "-" when unknown.
func age(now, t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return roundFor(now.Sub(t))
}

// left is how long until t, "-" when never.
func left(now, t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return roundFor(t.Sub(now))
}

func roundFor(d time.Duration) string {
	switch {
	case d < 0:
		return "0s"
	case d < time.Second:
		return d.Round(time.Millisecond).String()
	case d < time.Minute:
		return d.Round(100 * time.Millisecond).String()
	default:
		return d.Round(time.Second).String()
	}
}

func mode(h tenace.HolderInfo) string {
	switch {
	case !h.Shared:
		return "exclusive"
	case h.Permits > 0:
		return "shared/" + strconv.Itoa(h.Permits)
	default:
		return "shared"
	}
}

func token(t uint64) string {
	if t == 0 {
		return "-"
	}
	return strconv.FormatUint(t, 10)
}

// writeLocks writes the table of locks: one line a holder.
func writeLocks(w io.Writer, keys []tenace.KeyInfo, more bool, now time.Time) {
	if len(keys) == 0 {
		fmt.Fprintln(w, "no key is held")
		return
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "KEY\tMODE\tOWNER\tHELD FOR\tTOKEN\tEXPIRES IN\tWAITING\tLONGEST WAIT")
	for _, k := range keys {
		wait := "-"
		if k.LongestWait > 0 {
			wait = roundFor(k.LongestWait)
		}
		if len(k.Holders) == 0 {
			fmt.Fprintf(tw, "%s\t-\t-\t-\t-\t-\t%d\t%s\n", showKey(k.Key), k.Waiting, wait)
		}
		for _, h := range k.Holders {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%d\t%s\n", showKey(k.Key), mode(h), showText(h.Owner), age(now, h.Since), token(h.Token), left(now, h.Expires), k.Waiting, wait)
		}
	}
	_ = tw.Flush()
	if more {
		fmt.Fprintln(w, "(more keys are held: raise --max, or narrow --prefix)")
	}
}

// writeInspect writes one key's holders and waiters.
func writeInspect(w io.Writer, k tenace.KeyInfo, now time.Time) {
	fmt.Fprintf(w, "key %s\n", showKey(k.Key))
	if len(k.Holders) == 0 {
		fmt.Fprintln(w, "held by nobody")
	} else {
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "HOLDER\tMODE\tHELD FOR\tSINCE\tTOKEN\tEXPIRES IN")
		for _, h := range k.Holders {
			since := "-"
			if !h.Since.IsZero() {
				since = h.Since.Format(time.RFC3339)
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", showText(h.Owner), mode(h), age(now, h.Since), since, token(h.Token), left(now, h.Expires))
		}
		_ = tw.Flush()
	}
	switch {
	case k.Waiting == 0:
		fmt.Fprintln(w, "nobody waits")
	default:
		fmt.Fprintf(w, "%d waiting", k.Waiting)
		if k.LongestWait > 0 {
			fmt.Fprintf(w, ", the longest for %s", roundFor(k.LongestWait))
		}
		fmt.Fprintln(w)
		if len(k.Waiters) > 0 {
			tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
			fmt.Fprintln(tw, "WAITER\tMODE\tWAITING FOR")
			for _, wt := range k.Waiters {
				m := "exclusive"
				if wt.Shared {
					m = "shared"
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\n", showText(wt.Owner), m, age(now, wt.Since))
			}
			_ = tw.Flush()
		}
	}
}

// writeJSON writes v as lockhttp writes its JSON.
func writeJSON(w io.Writer, v any) {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v) // a write error is kept by output
}

// output is the command's standard output: it keeps the first error a
// write returns, and writes nothing after it.
type output struct {
	w   io.Writer
	err error
}

func (o *output) Write(p []byte) (int, error) {
	if o.err != nil {
		return 0, o.err
	}
	n, err := o.w.Write(p)
	if err != nil {
		o.err = err
	}
	return n, err
}

// status is the exit status once the answer is written to out: 0, or 1
// when a write failed, said on stderr unless the reader left (EPIPE: the
// reader of a pipe such as "tenace locks | head -1" has all it wants).
func (o *output) status(stderr io.Writer) int {
	switch {
	case o.err == nil:
		return 0
	case errors.Is(o.err, syscall.EPIPE):
		return 1
	default:
		fmt.Fprintf(stderr, "tenace: writing the answer: %v\n", o.err)
		return 1
	}
}

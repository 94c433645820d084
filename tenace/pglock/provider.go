package pglock

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"tenace.dev/tenace"
	"tenace.dev/tenace/internal/provkit"
)

// Defaults.
const (
	// DefaultTable is the table that maps keys to lock ids and fences.
	DefaultTable = "tenace_lock_keys"
	// DefaultMaxConns bounds the connections of a provider: held locks plus
	// waiting callers (see WithMaxConns).
	DefaultMaxConns = 16
)

// ErrPoolExhausted is what Acquire returns, or wraps, when every connection
// the provider may open is pinned by a held lock or a waiting caller: at
// once with NoWait; with a Timeout, once the Timeout passed while it waited
// for a connection and nobody else in the process holds or waits for the
// key (it never asked the server for the key, which may be free, so this is
// not "not granted in time"; when others do hold or wait for it, the wait
// was the key's, and the answer is (nil, nil)). A ctx that ends while it
// waits gives ctx's error, as always.
var ErrPoolExhausted = errors.New("pglock: every connection of the provider is pinned by a held lock or a waiting caller; raise WithMaxConns, or give the call a Timeout (a longer one) to wait for a connection")

// ErrPooler is returned by New when the connection goes through a pooler
// (PgBouncer, pgcat, Supavisor...): a session advisory lock must stay with
// one server session from lock to unlock, which a pooler in transaction or
// statement mode does not keep. Connect to the server directly, or, for a
// pooler in session mode, pass AllowPooler.
var ErrPooler = errors.New("pglock: the connection goes through a pooler, and session advisory locks need one server session; connect to PostgreSQL directly, or pass pglock.AllowPooler() for a pooler in session mode")

// Provider is a tenace.LockProvider on PostgreSQL advisory locks. Create it
// with New or NewWithConfig; it is safe for concurrent use. Close it when
// done: it owns a connection pool.
type Provider struct {
	pool     *pgxpool.Pool
	table    string // sanitized, possibly schema-qualified
	classID  int32  // the first key of every advisory lock: the table's OID
	ttl      time.Duration
	maxConns int
	fencing  bool          // leases carry a fencing token (not WithoutFencing)
	owner    string        // recorded with every grant (WithOwner)
	ownerArg any           // owner, boxed once for the acquire statements' arguments
	owners   bool          // the table has the owners column (see ownerColumnsDDL)
	slots    chan struct{} // a token per connection in use (held + waiting); cap maxConns

	// The acquire statements, by how they wait (waitKind): lockSQL takes
	// the key exclusive, sharedSQL shared (Permits 0); entrySQL takes a
	// bulkhead's gate and, if one is free, one of its permits, admitSQL a
	// permit for a session that holds the gate (see permits.go).
	lockSQL, sharedSQL, entrySQL, admitSQL [waitKinds]string
	// dropSQL[mode] unlocks the key's lock ($1, $2 as above) if the
	// session holds it in mode (exclusive or shared): after a lock timeout
	// (see call.lock).
	dropSQL [modeShared + 1]string
	// retrySQL[mode] is lockSQL or sharedSQL, bounded, for the wait again
	// after a lock timeout: it counts the lock granted if the session
	// holds it already (a grant that raced the timeout; see call.lock).
	retrySQL    [modeShared + 1]string
	registerSQL string
	// slotClass is the first key of a bulkhead's permit slots: the OID of
	// the table's primary key index (see permits.go).
	slotClass int32

	held    atomic.Int64 // leases held through this provider
	waiting atomic.Int64 // callers inside Acquire
	// sharedHeld and sharedWaiting: those of held and waiting that are
	// shared (a reader's, a bulkhead's)
	sharedHeld, sharedWaiting atomic.Int64
	longest                   atomic.Int64 // most callers inside Acquire for one key

	closed  context.Context // ends when Close is called; its cause is ErrProviderClosed
	close   context.CancelCauseFunc
	mu      sync.Mutex          // guards leases, isEnded and queues
	leases  map[*lease]struct{} // held leases, for Close
	isEnded bool
	queues  queues
	ended   sync.Once
	workers sync.WaitGroup // Acquire's statements that may outlive it (see call); added to under mu while !isEnded

	hooks *testHooks // nil but in tests (see export_test.go)
}

// testHooks are the points where a test holds a race's window open, set
// through export_test.go before the provider's first Acquire. Each nil
// field, and a nil hooks, is no hook.
type testHooks struct {
	// losing runs in an ender (the watcher, the TTL timer, Close) that has
	// claimed the lease as lost and not yet signalled the loss.
	losing func()
	// releaseWaits runs in a Release that found the lease claimed by such
	// an ender, before it waits for the signal.
	releaseWaits func()
	// watching runs in the watcher, before its first read.
	watching func()
	// stopping runs in a taker of the session (an ender, a nested wait)
	// once it has set the watcher's read deadline, before it waits for the
	// watcher to stop; also when no watcher was started yet.
	stopping func()
	// statementDone runs in Acquire once the acquire statement has
	// returned, with its backend's pid and whether it took the lock,
	// before Acquire looks at its context.
	statementDone func(pid uint32, locked bool)
}

// queues counts the callers inside Acquire per key, so that Stats can say
// the longest queue in O(1): keysWith[n] is the number of keys with n
// callers, and longest the largest n with keysWith[n] > 0.
type queues struct {
	perKey   map[string]int
	keysWith []int
	longest  int
}

func (q *queues) add(key string, d int) {
	if q.perKey == nil {
		q.perKey = map[string]int{}
	}
	n := q.perKey[key]
	if n > 0 {
		q.keysWith[n]--
	}
	n += d
	if n == 0 {
		delete(q.perKey, key)
	} else {
		q.perKey[key] = n
		for len(q.keysWith) <= n {
			q.keysWith = append(q.keysWith, 0)
		}
		q.keysWith[n]++
	}
	q.longest = max(q.longest, n)
	for q.longest > 0 && q.keysWith[q.longest] == 0 {
		q.longest--
	}
}

// queue counts a caller in (d 1) or out (d -1) of Acquire, in the queue of
// each key it asks for: one key, or a set's; a shared caller in
// sharedWaiting too.
func (p *Provider) queue(d int, shared bool, keys ...string) {
	p.mu.Lock()
	for _, key := range keys {
		p.queues.add(key, d)
	}
	p.longest.Store(int64(p.queues.longest))
	p.waiting.Add(int64(d))
	if shared {
		p.sharedWaiting.Add(int64(d))
	}
	p.mu.Unlock()
}

// Stats reports the leases held through this provider and the callers
// waiting in this process (inside Acquire, whether for a connection or on
// the server's lock queue), and the most of those waiting for one key. A
// set (AcquireSet) counts each of its keys in Held, and once in Waiting, in
// the queue of each of its keys; a shared lease (a reader's, a bulkhead
// permit's) counts as one lease in Held, as an exclusive one does, and a
// shared caller once in Waiting. By mode: SharedKeys and SharedHolders are
// both the shared leases among Held (a lease is one key held shared, and
// one permit in use, through this provider), SharedWaiting the shared
// callers among Waiting. It is five atomic loads.
//
// A lease counts in Held from its grant until its lock is given back: a
// Release's unlock; for a lease lost to its TTL or to Close, until the
// unlock that follows the loss has run — which can be after a Release that
// returned the loss, since the lock is held on the server and its
// connection pinned until then (Close returns after it); for a lease whose
// connection ended, until that connection is closed, a moment after Lost.
func (p *Provider) Stats() tenace.LockStats {
	shared := int(p.sharedHeld.Load())
	return tenace.LockStats{Held: int(p.held.Load()), Waiting: int(p.waiting.Load()), LongestQueue: int(p.longest.Load()),
		SharedKeys: shared, SharedHolders: shared, SharedWaiting: int(p.sharedWaiting.Load())}
}

var (
	_ tenace.LockProvider  = (*Provider)(nil)
	_ tenace.StatsProvider = (*Provider)(nil)
)

type settings struct {
	table       string
	maxConns    int
	ttl         time.Duration
	keepalive   net.KeepAliveConfig
	setup       bool
	allowPooler bool
	fencing     bool
	owner       string
}

// Option configures New.
type Option interface{ apply(*settings) }

type optionFunc func(*settings)

func (f optionFunc) apply(s *settings) { f(s) }

// WithTable sets the table of keys (default DefaultTable); "schema.table"
// names a schema too. Every provider that must exclude the others uses the
// same table: the lock ids and fences are rows of it. It panics on an empty
// name.
func WithTable(name string) Option {
	if name == "" {
		panic("tenace: pglock.WithTable: empty table name")
	}
	return optionFunc(func(s *settings) { s.table = name })
}

// WithMaxConns bounds the connections the provider opens (default
// DefaultMaxConns). A held lock pins one connection from Acquire to Release,
// and a waiting caller one too: N holders and M waiters use N+M connections.
// When all are in use, Acquire waits for one within its Timeout and ctx; it
// returns ErrPoolExhausted at once with NoWait, and an error wrapping it if
// the Timeout passes first. Leave room in the server's
// max_connections for every process. It panics if n < 1.
func WithMaxConns(n int) Option {
	if n < 1 {
		panic("tenace: pglock.WithMaxConns: n must be at least 1")
	}
	return optionFunc(func(s *settings) { s.maxConns = n })
}

// WithTTL sets the default longest hold, used when the call gives no TTL.
// The default is 0: a lock is held until Release, or until its connection
// ends (the holder's process dies, the server restarts...). It panics if d
// is negative.
func WithTTL(d time.Duration) Option {
	return optionFunc(provkit.Duration(d, 0, "pglock.WithTTL: negative TTL", func(s *settings, d time.Duration) { s.ttl = d }))
}

// WithKeepalive sets the TCP keepalive of the connections (default
// DefaultKeepalive); Enable false leaves the dialer's and the server's own.
func WithKeepalive(ka net.KeepAliveConfig) Option {
	return optionFunc(func(s *settings) { s.keepalive = ka })
}

// WithoutSetup makes New only check that the table exists, instead of
// creating it when missing: for a role without CREATE, when the table is
// made by a migration (see Schema).
func WithoutSetup() Option { return optionFunc(func(s *settings) { s.setup = false }) }

// AllowPooler lets New accept a connection through a pooler, which it
// refuses otherwise (ErrPooler). Use it only for a pooler in session mode,
// which keeps a client on one server session.
func AllowPooler() Option { return optionFunc(func(s *settings) { s.allowPooler = true }) }

// WithoutFencing drops the fencing token: the acquire statement then only
// takes the lock, and writes nothing, so a grant costs no commit (on a
// server that flushes its WAL on commit, the fence's write is most of an
// uncontended acquire; see bench/README.md). The leases are then not
// tenace.FencedLease. Use it where nothing downstream checks tokens.
func WithoutFencing() Option { return optionFunc(func(s *settings) { s.fencing = false }) }

// Schema returns the statement that creates the table of keys, for a
// migration tool (see WithoutSetup). table is a name as WithTable takes it.
func Schema(table string) string { return schema(sanitize(table)) }

func schema(table string) string {
	return `CREATE TABLE IF NOT EXISTS ` + table + ` (
	id integer GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
	key bytea NOT NULL UNIQUE,
	fence bigint NOT NULL DEFAULT 0,
	` + ownerColumnsDDL + `
)`
}

func sanitize(name string) string { return pgx.Identifier(strings.Split(name, ".")).Sanitize() }

// New connects to PostgreSQL with connString (a URL or keyword/value string,
// as pgxpool.ParseConfig takes it) and returns a provider. See
// NewWithConfig.
func New(ctx context.Context, connString string, opts ...Option) (*Provider, error) {
	cfg, err := pgxpool.ParseConfig(connString)
	if err != nil {
		return nil, fmt.Errorf("pglock: parsing the connection string: %w", err)
	}
	return NewWithConfig(ctx, cfg, opts...)
}

// NewWithConfig returns a provider with a pool of its own built from a copy
// of cfg: its MaxConns is the provider's bound (WithMaxConns), and the
// provider sets the connections' context handler (cancel requests),
// keepalives and session settings (statement_timeout and lock_timeout 0,
// READ COMMITTED). It connects once to check the server: it creates the
// table of keys when missing (unless WithoutSetup), and refuses a pooler
// (ErrPooler) or a server in recovery (a standby cannot take locks that
// exclude the primary's, nor write fences). It panics if cfg is nil.
func NewWithConfig(ctx context.Context, cfg *pgxpool.Config, opts ...Option) (*Provider, error) {
	if cfg == nil {
		panic("tenace: pglock.NewWithConfig: nil config")
	}
	s := settings{table: DefaultTable, maxConns: DefaultMaxConns, keepalive: DefaultKeepalive, setup: true, fencing: true}
	for _, o := range opts {
		o.apply(&s)
	}
	cfg = cfg.Copy()
	configure(cfg, s.maxConns, s.keepalive)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("pglock: creating the pool: %w", err)
	}
	p := &Provider{
		pool: pool, table: sanitize(s.table), ttl: s.ttl, maxConns: s.maxConns, fencing: s.fencing, owner: s.owner,
		slots: make(chan struct{}, s.maxConns), leases: map[*lease]struct{}{},
	}
	p.closed, p.close = context.WithCancelCause(context.Background())
	if err := p.check(ctx, s); err != nil {
		p.close(tenace.ErrProviderClosed)
		pool.Close()
		return nil, err
	}
	p.prepareSQL()
	return p, nil
}

// check connects once: pooler, recovery, table, class id.
func (p *Provider) check(ctx context.Context, s settings) error {
	c, err := p.pool.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("pglock: connecting to PostgreSQL: %w", err)
	}
	defer func() {
		if ctx.Err() != nil {
			discard(c) // a cancel request may be on its way (see discard)
			return
		}
		c.Release()
	}()
	var pid uint32
	var recovery bool
	if err := c.QueryRow(ctx, `SELECT pg_backend_pid(), pg_is_in_recovery()`).Scan(&pid, &recovery); err != nil {
		return fmt.Errorf("pglock: checking the server: %w", err)
	}
	if pid != c.Conn().PgConn().PID() && !s.allowPooler {
		return ErrPooler
	}
	if recovery {
		return errors.New("pglock: the server is a standby in recovery: locks need the primary (connect to it, e.g. target_session_attrs=read-write)")
	}
	if s.setup {
		_, err := c.Exec(ctx, schema(p.table))
		var pgErr *pgconn.PgError
		// Two processes creating the table at once: one of them gets a
		// unique violation on the catalog; the table is there.
		if errors.As(err, &pgErr) && (pgErr.Code == "23505" || pgErr.Code == "42P07") {
			err = nil
		}
		if err != nil {
			return fmt.Errorf("pglock: creating the table %s (or pass WithoutSetup and create it with pglock.Schema): %w", p.table, err)
		}
	}
	var oid uint32
	if err := c.QueryRow(ctx, `SELECT to_regclass($1)::oid`, p.table).Scan(&oid); err != nil {
		return fmt.Errorf("pglock: the table %s is missing (create it with pglock.Schema, or let New create it): %w", p.table, err)
	}
	p.classID = int32(oid)
	if err := p.findSlotClass(ctx, c); err != nil {
		return err
	}
	return p.checkOwners(ctx, c, s)
}

// lockStatement: $1 the key, $2 the class id. One round trip: it finds the
// key's id, takes the advisory lock (lockFn waits, or tries), and — only
// when the lock is held — increments the key's fence and returns it, all
// in one statement (one implicit transaction, committed before the reply,
// synchronously: see syncCommit). A statement that does not fence (a
// provider WithoutFencing, a bulkhead's gate) only takes the lock.
//
// Returns (id, locked, fence): id NULL when the key has no row yet
// (register it and run again); locked false when the try failed; fence NULL
// with locked true only if the row vanished meanwhile.
//
// Why one statement is correct: the CTE l is evaluated once, before the
// UPDATE can pass its filter, so the row is updated only while the lock is
// held; the UPDATE takes no row lock before that (no deadlock with the
// holder's own fence update); and although the statement's snapshot was
// taken before the wait, an UPDATE under READ COMMITTED applies to the
// row's newest committed version (it rechecks and follows the update
// chain), so the previous holder's increment is never lost — nor a shared
// holder's, granted beside this one: the second UPDATE of the row waits
// for the first to commit, and increments what it committed.
func (p *Provider) lockStatement(lockExpr string, fence bool, owner string) string {
	if !fence {
		return `WITH k AS (SELECT id` + p.heldByCols() + ` FROM ` + p.table + ` WHERE key = $1),
l AS MATERIALIZED (SELECT ` + lockExpr + ` AS ok FROM k)
SELECT (SELECT id FROM k), coalesce((SELECT ok FROM l), false), NULL::bigint` + heldBySelect
	}
	return `WITH k AS (SELECT id` + p.heldByCols() + ` FROM ` + p.table + ` WHERE key = $1),
l AS MATERIALIZED (SELECT ` + lockExpr + ` AS ok FROM k),
u AS (UPDATE ` + p.table + ` SET fence = fence + 1` + owner + ` WHERE id = (SELECT id FROM k) AND (SELECT ok FROM l) RETURNING fence),
s AS MATERIALIZED (SELECT ` + syncCommit + `)
SELECT (SELECT id FROM k), coalesce((SELECT ok FROM l), false), (SELECT fence FROM u)` + heldBySelect + ` FROM s`
}

// syncCommit makes the acquire statement's transaction commit
// synchronously, whatever the session's synchronous_commit: the fence must
// reach the disk before the grant returns, or a crash would hand its token
// out again. A server tuned with synchronous_commit off (or local, which
// does not wait for a synchronous standby) gets on for this transaction
// only (set_config's is_local); remote_write and remote_apply are kept. It
// is set within the statement rather than as a startup parameter, which a
// pooler in session mode may refuse.
const syncCommit = `set_config('synchronous_commit', CASE WHEN current_setting('synchronous_commit') IN ('off', 'local') THEN 'on' ELSE current_setting('synchronous_commit') END, true)`

// bounded is the lock expression of lock (a pg_advisory_lock function) on
// ($2, id) for a bounded wait (see prepareSQL).
func bounded(lock, id string) string {
	return `CASE WHEN set_config('lock_timeout', $3::text, true) IS NOT NULL THEN CASE WHEN ` + lock + `($2::int4, ` + id + `) IS NOT NULL THEN set_config('lock_timeout', '0', true) IS NOT NULL END END`
}

// boundedLeft is bounded for a wait that comes second in its statement
// (a bulkhead's shared wait, after the gate's): lock_timeout is what
// remains of $3 since the statement started, at least 1 ms, so that the
// two waits together keep the caller's bound.
func boundedLeft(lock, id string) string {
	left := `greatest(1, $3::int8 - floor(extract(epoch FROM clock_timestamp() - statement_timestamp()) * 1000)::int8)::text`
	return strings.Replace(bounded(lock, id), `$3::text`, left, 1)
}

func (p *Provider) prepareSQL() {
	// $3 is the wait's bound on the server (see lockTimeout): set_config
	// runs before the lock function, as a CASE evaluates its condition
	// first, and is local to the statement's transaction. Once the lock is
	// granted, lock_timeout goes back to 0: the bound is the advisory
	// lock's wait alone. The fence's UPDATE may wait for another grant's
	// (a shared holder's) to commit, and a lock_timeout there would fail
	// the statement with the advisory lock taken — a session lock, which
	// the transaction's abort does not release — as if the wait had
	// failed; the caller would take it again (a session's advisory locks
	// are reentrant) and release it once: a leak.
	// The grant's owner is the statement's last parameter (see
	// call.statement), when the table records owners.
	owner := func(n int, mode lockMode, permits string) string {
		if !p.recordsOwners() {
			return ""
		}
		return p.ownerSet("$"+strconv.Itoa(n), mode, permits)
	}
	for kind, f := range map[waitKind]func(lock, id string) string{
		// pg_advisory_lock returns void, which IS NOT NULL.
		waitPlain: func(lock, id string) string {
			return lock + `($2::int4, ` + id + `) IS NOT NULL`
		},
		waitBounded: bounded,
		waitNone:    func(lock, id string) string { return `pg_try_` + lock[len("pg_"):] + `($2::int4, ` + id + `)` },
	} {
		n := 3 // the parameters after $1, $2 (and $3, bounded)
		if kind == waitBounded {
			n = 4
		}
		p.lockSQL[kind] = p.lockStatement(f("pg_advisory_lock", "k.id"), p.fencing, owner(n, modeExclusive, ""))
		p.sharedSQL[kind] = p.lockStatement(f("pg_advisory_lock_shared", "k.id"), p.fencing, owner(n, modeShared, ""))
		nParam := "$" + strconv.Itoa(n) // N follows the statement's other parameters
		shared := f("pg_advisory_lock_shared", "k.id")
		if kind == waitBounded {
			shared = boundedLeft("pg_advisory_lock_shared", "k.id")
		}
		gate := f("pg_advisory_lock", "-k.id")
		if kind == waitNone {
			gate = "" // NoWait takes no gate
		}
		p.entrySQL[kind] = p.permitStatement(gate, shared, nParam, kind == waitNone, owner(n+1, modeShared, nParam))
		// With the gate held, only the shared wait sets lock_timeout.
		p.admitSQL[kind] = p.permitStatement("", shared, nParam, kind == waitNone, owner(n+1, modeShared, nParam))
	}
	for mode, m := range map[lockMode]struct{ lock, unlock, lockMode string }{
		modeExclusive: {"pg_advisory_lock", "pg_advisory_unlock", "ExclusiveLock"},
		modeShared:    {"pg_advisory_lock_shared", "pg_advisory_unlock_shared", "ShareLock"},
	} {
		mine := `EXISTS (SELECT 1 FROM pg_locks l WHERE l.pid = pg_backend_pid() AND l.locktype = 'advisory' AND l.classid = $2::int4::oid
	AND l.objid = k.id::oid AND l.objsubid = 2 AND l.mode = '` + m.lockMode + `' AND l.granted)`
		// Checked in pg_locks first: an unlock of a lock not held says so
		// in a WARNING, to the client and the server's log.
		p.dropSQL[mode] = `SELECT ` + m.unlock + `($2::int4, k.id) FROM ` + p.table + ` k WHERE k.key = $1 AND ` + mine
		p.retrySQL[mode] = p.lockStatement(`CASE WHEN `+mine+` THEN true ELSE `+bounded(m.lock, "k.id")+` END`, p.fencing, owner(4, mode, ""))
	}
	p.registerSQL = `INSERT INTO ` + p.table + ` (key) VALUES ($1) ON CONFLICT (key) DO NOTHING`
}

// keyBusy reports whether another caller of this process holds one of
// keys (in a mode that excludes mode's: see holds) or waits for it (the
// caller asking counts itself in the queue): then a Timeout that passed
// while waiting for a connection is the key's contention, (nil, nil),
// whatever the pool.
func (p *Provider) keyBusy(keys []string, mode lockMode, permits int) bool {
	p.mu.Lock()
	busy := false
	for _, key := range keys {
		busy = busy || p.queues.perKey[key] > 1
	}
	p.mu.Unlock()
	return busy || p.holds(keys, mode, permits)
}

// holds reports whether leases of this provider hold one of keys in a
// mode that excludes a caller in mode (an exclusive lease excludes all; a
// shared one, an exclusive caller; a bulkhead caller of permits N, N
// permit leases of the key with that count): then a call for them that
// the server did not answer in time is the key's contention, (nil, nil) —
// the server said the key is held when it granted those leases, and has
// not said otherwise since — not ErrNoReply. Fewer permit leases, or a
// reader's, say nothing of a shared caller (the key's other permits are
// held elsewhere, or not).
func (p *Provider) holds(keys []string, mode lockMode, permits int) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	taken := 0
	for l := range p.leases {
		for _, key := range keys {
			if !l.has(key) {
				continue
			}
			switch {
			case l.mode == modeExclusive, mode == modeExclusive:
				return true
			case mode == modePermit && l.mode == modePermit && l.permits == permits:
				if taken++; taken >= permits {
					return true
				}
			}
		}
	}
	return false
}

func (p *Provider) closedErr() error {
	return fmt.Errorf("%w (pglock.Provider.Close was called)", tenace.ErrProviderClosed)
}

// Close ends the provider: waiting callers return an error wrapping
// tenace.ErrProviderClosed, and so do later calls to Acquire; every lease
// still held is lost (all their Lost channels close at once, fn's context
// ends), then their locks are released, all in parallel (each unlock
// bounded by 5 s, then the cancel's grace of 2 s, after which its
// connection is closed, which frees the lock as the server ends the
// session); then the pool is closed. It returns once every connection is
// closed, and is idempotent.
func (p *Provider) Close() error {
	p.ended.Do(func() {
		p.close(tenace.ErrProviderClosed)
		// Every lease learns of its loss first, at once; then the unlocks
		// run in parallel, so that a stalled backend delays neither the
		// other leases' Lost nor their unlock.
		var wg sync.WaitGroup
		provkit.EndHeld(&p.mu, &p.isEnded, p.leases, nil, func(l *lease) {
			cause := fmt.Errorf("%w: the provider was closed while the lock on %s was held", tenace.ErrLeaseLost, l.name())
			if l.lose(cause) {
				wg.Go(func() { l.unlockLost(cause) })
			}
		})
		wg.Wait()
		// The calls that Acquire left to end in the background (see
		// call): their context ended with Close, and each is bounded.
		p.workers.Wait()
		p.pool.Close()
	})
	return nil
}

package pglock

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
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
	// DefaultTable is the table that maps keys to lock ids; its sequence
	// of tokens and its owners are DefaultTable_tokens and _owners.
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
	fencing  bool   // leases carry a fencing token (not WithoutFencing)
	owner    string // recorded with every grant (WithOwner)
	ownerArg any    // owner, boxed once for the acquire statements' arguments
	// adding maps each fencing acquire statement to its form that adds
	// the owner label to the owners table (see labelled); labels are
	// those known to be there.
	adding   map[string]string
	labelsMu sync.Mutex
	labels   map[string]struct{}
	// ownerID is the owners table's id of the provider's own label (0
	// when New could not read it), boxed in ownerIDArg; byID maps each
	// exclusive or shared acquire statement to its form that takes the
	// key's lock id ($1) and, fencing, that label id (its last parameter)
	// instead of the key and the label: a grant that reads no table. ids
	// are the lock ids of keys granted before (see idCache).
	ownerID    int32
	ownerIDArg any
	byID       map[string]string
	ids        *idCache
	names      names         // the table's relations: its sequence of tokens, its owner labels
	slots      chan struct{} // a token per connection in use (held + waiting); cap maxConns
	// poller starts an idle session's watcher when its socket becomes
	// readable; nil where the system has none (see session.put).
	poller *poller

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
	// killing runs in a lease's ender that could not take the session in
	// time, before it closes the session's socket (see session.kill).
	killing func()
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
// same table: the lock ids are its rows, the tokens its sequence's. It panics on an empty
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

// WithoutFencing drops the fencing token and the owner record: the
// acquire statement then only takes the lock. The leases are then not
// tenace.FencedLease, and Inspect names no owner. Use it where nothing
// downstream checks tokens.
func WithoutFencing() Option { return optionFunc(func(s *settings) { s.fencing = false }) }

// Schema returns the statements that create the table of keys, its
// sequence of fencing tokens and its table of owner labels, for a
// migration tool (see WithoutSetup); table is a name as WithTable takes
// it. They are idempotent, and they bring a table made by an older
// version (whose rows kept each key's last token, in a fence column) up to
// date: the sequence is raised above every token the table gave, and the
// fence and owners columns dropped, under the table's exclusive lock, so
// that a provider of an older version still running fails its next
// acquire with the server's error (column "fence" does not exist) rather
// than hand out a token below the sequence's.
func Schema(table string) string { return schema(relationsOf(table)) }

// names are the relations of a table of keys, sanitized: the table, its
// sequence of tokens and its owner labels.
type names struct{ table, seq, owners string }

func relationsOf(table string) names {
	parts := strings.Split(table, ".")
	with := func(suffix string) string {
		q := slices.Clone(parts)
		q[len(q)-1] += suffix
		return pgx.Identifier(q).Sanitize()
	}
	return names{table: pgx.Identifier(parts).Sanitize(), seq: with("_tokens"), owners: with("_owners")}
}

// literal quotes s as an SQL string literal.
func literal(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

func schema(n names) string {
	return `CREATE TABLE IF NOT EXISTS ` + n.table + ` (
	id integer GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
	key bytea NOT NULL UNIQUE
);
CREATE SEQUENCE IF NOT EXISTS ` + n.seq + ` AS bigint NO CYCLE CACHE 1;
CREATE TABLE IF NOT EXISTS ` + n.owners + ` (
	id integer GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
	owner bytea NOT NULL UNIQUE
);
DO $tenace$ BEGIN
	IF EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = ` + literal(n.table) + `::regclass AND attname = 'fence' AND attnum > 0 AND NOT attisdropped) THEN
		LOCK TABLE ` + n.table + ` IN ACCESS EXCLUSIVE MODE;
		PERFORM setval(` + literal(n.seq) + `, max(fence)) FROM ` + n.table + ` HAVING max(fence) >= (SELECT last_value FROM ` + n.seq + `);
		ALTER TABLE ` + n.table + ` DROP COLUMN fence, DROP COLUMN IF EXISTS owners;
	END IF;
END $tenace$`
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
// exclude the primary's, nor hand out tokens). It also brings a table of
// an older version up to date (see Schema). It panics if cfg is nil.
func NewWithConfig(ctx context.Context, cfg *pgxpool.Config, opts ...Option) (*Provider, error) {
	if cfg == nil {
		panic("tenace: pglock.NewWithConfig: nil config")
	}
	s := settings{table: DefaultTable, maxConns: DefaultMaxConns, keepalive: DefaultKeepalive, setup: true, fencing: true}
	for _, o := range opts {
		o.apply(&s)
	}
	cfg = cfg.Copy()
	ids := &idCache{ids: map[string]int32{}, off: s.allowPooler}
	configure(cfg, s.maxConns, s.keepalive, ids.forget)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("pglock: creating the pool: %w", err)
	}
	p := &Provider{
		pool: pool, table: sanitize(s.table), names: relationsOf(s.table), ttl: s.ttl, maxConns: s.maxConns, fencing: s.fencing, owner: s.owner,
		slots: make(chan struct{}, s.maxConns), leases: map[*lease]struct{}{}, labels: map[string]struct{}{}, ids: ids,
	}
	p.closed, p.close = context.WithCancelCause(context.Background())
	if err := p.check(ctx, s); err != nil {
		p.close(tenace.ErrProviderClosed)
		pool.Close()
		return nil, err
	}
	p.prepareSQL()
	p.poller = newPoller()
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
		if err := p.setup(ctx, c); err != nil {
			return err
		}
	}
	var oid *uint32
	if err := c.QueryRow(ctx, `SELECT to_regclass($1)::oid`, p.table).Scan(&oid); err != nil {
		return fmt.Errorf("pglock: looking up the table %s: %w", p.table, err)
	}
	if oid == nil {
		return fmt.Errorf("pglock: the table %s is missing: create it with pglock.Schema, or let New create it (without WithoutSetup)", p.table)
	}
	p.classID = int32(*oid)
	if err := p.findSlotClass(ctx, c); err != nil {
		return err
	}
	if p.owner == "" {
		p.owner = tenace.DefaultOwner()
	}
	p.ownerArg = []byte(p.owner)
	var ready bool
	err = c.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL AND to_regclass($2) IS NOT NULL AND NOT EXISTS (SELECT 1 FROM pg_attribute
	WHERE attrelid = $3::regclass AND attname = 'fence' AND attnum > 0 AND NOT attisdropped)`, p.names.seq, p.names.owners, p.table).Scan(&ready)
	if err != nil {
		return fmt.Errorf("pglock: reading the relations of %s: %w", p.table, err)
	}
	if !ready {
		return fmt.Errorf("pglock: the table %s lacks its sequence of tokens %s or its owners %s, or was made by an older version: run pglock.Schema(table) (it brings an older table up to date), or let New do it (without WithoutSetup)", p.table, p.names.seq, p.names.owners)
	}
	// The provider's own label, added now (a write on New) so that its
	// grants find it; failing that, its first grant adds it.
	// It commits synchronously: the grants by id name the label by its id.
	if _, err := c.Exec(ctx, `INSERT INTO `+p.names.owners+` (owner) SELECT $1::bytea WHERE `+syncCommit+` IS NOT NULL ON CONFLICT (owner) DO NOTHING`, []byte(p.owner)); err == nil {
		p.learnLabel(p.owner)
		var id int32
		if c.QueryRow(ctx, `SELECT id FROM `+p.names.owners+` WHERE owner = $1`, []byte(p.owner)).Scan(&id) == nil {
			p.ownerID, p.ownerIDArg = id, id
		}
	}
	return nil
}

// setup runs schema on c, in one transaction that waits for the table's
// lock 5 s at most (the migration of an older table takes it exclusive,
// after the acquire statements of older providers that wait for keys);
// a concurrent New's creation of the same relations is retried once.
func (p *Provider) setup(ctx context.Context, c *pgxpool.Conn) error {
	run := func() error {
		return pgx.BeginFunc(ctx, c, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `SET LOCAL lock_timeout = '5s'`); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, schema(p.names))
			return err
		})
	}
	err := run()
	var pgErr *pgconn.PgError
	// Two processes creating the relations at once: one of them gets a
	// unique violation on the catalog; they are there the second time.
	if errors.As(err, &pgErr) && (pgErr.Code == "23505" || pgErr.Code == "42P07") {
		err = run()
	}
	if isLockTimeout(err) {
		return fmt.Errorf("pglock: bringing %s up to date (a sequence of tokens instead of its fence column) needs its exclusive lock, which others held for 5s: stop the providers of older versions that use it, and call New again: %w", p.table, err)
	}
	if err != nil {
		return fmt.Errorf("pglock: creating the table %s (or pass WithoutSetup and create it with pglock.Schema): %w", p.table, err)
	}
	return nil
}

// lockStatement: $1 the key, $2 the class id. One round trip: it finds the
// key's id, takes the advisory lock (lockFn waits, or tries), and — only
// when the lock is held — takes the grant's fencing token and records its
// owner (see tail). A statement that does not fence (a provider
// WithoutFencing, a bulkhead's gate) only takes the lock.
//
// Returns (id, locked, token, holders): id NULL when the key has no row
// yet (register it and run again); locked false when the try failed;
// holders the key's holders when a NoWait try was refused (see heldBy).
func (p *Provider) lockStatement(lockExpr string, fence bool, owner string, try bool) string {
	return `WITH k AS (SELECT id FROM ` + p.table + ` WHERE key = $1),
l AS MATERIALIZED (SELECT ` + lockExpr + ` AS ok FROM k)` + p.tail(fence, owner, "", try, "")
}

// tail ends an acquire statement whose CTEs k (the key's id) and l (ok:
// the lock taken) come first: the grant's token and owner record when
// fence (owner the owner label's parameter, permits the bulkhead's count's
// or ""), the refusal's holders when try; after is a FROM item that the
// final SELECT must run first ("" for none).
//
// The token is nextval of the table's sequence, taken once the lock is
// held, in the statement's one transaction. It is durable before the
// statement answers (see the package doc, Fencing tokens): nextval writes
// WAL once in 32 values (and once after each checkpoint), and a value is
// safe once that log record — this statement's, or another
// transaction's — is flushed. So the statement reads the WAL insert
// position after nextval (the record, inserted before nextval could read
// the value, ends at or before it), then the flush position: when the
// flush is behind, or a synchronous standby must have the record too, the
// transaction writes a transactional logical message, which gives it an
// xid and WAL, and commits synchronously (syncCommit), so that its commit
// flushes (and waits for the standby) past the record. When the flush is
// not behind, the record is on disk: no synchronous commit is needed, and
// none is asked (a set_config less per grant).
//
// The owner record is the session's application_name (session-level, no
// write: see ownerRecord), which Inspect and a refusal read through
// pg_stat_activity for the pids pg_locks shows holding the key.
func (p *Provider) tail(fence bool, owner, permits string, try bool, after string) string {
	held := `NULL::jsonb`
	if try {
		held = `CASE WHEN NOT coalesce((SELECT ok FROM l), true) THEN (` + p.holdersSQL(`(SELECT id FROM k)`) + `) END`
	}
	from := ""
	if after != "" {
		from = ` FROM ` + after
	}
	if !fence {
		return `
SELECT (SELECT id FROM k), coalesce((SELECT ok FROM l), false), NULL::bigint, ` + held + from
	}
	oi, _ := p.labelInsert(owner)
	if from == "" {
		from = ` FROM d`
	} else {
		from += `, d`
	}
	return `,
t AS MATERIALIZED (SELECT nextval(` + literal(p.names.seq) + `) AS f FROM l WHERE l.ok),
w AS MATERIALIZED (SELECT f, pg_current_wal_insert_lsn() AS i FROM t),` + oi + `
d AS MATERIALIZED (SELECT (SELECT f FROM w) AS f, (SELECT CASE WHEN i > pg_current_wal_flush_lsn() OR current_setting('synchronous_standby_names') <> ''` + labelOpen + ` OR true` + labelClose + `
	THEN pg_logical_emit_message(true, 'tenace', '') IS NOT NULL AND ` + syncCommit + ` IS NOT NULL END FROM w) AS flushed,
	(SELECT ` + p.ownerRecord(owner, permits) + ` FROM w) AS rec)
SELECT (SELECT id FROM k), coalesce((SELECT ok FROM l), false), d.f, ` + held + from
}

// syncCommit makes the acquire statement's transaction commit
// synchronously, whatever the session's synchronous_commit, when the WAL
// flush is behind the token's log record (see tail): the token must reach
// the disk before the grant returns, or a crash would hand it out again.
// The statement's form that adds the owner label's row (see labelled) asks
// it always: the provider remembers the label as added, so the row must
// outlive a crash too. A server tuned with synchronous_commit
// off (or local, which does not wait for a synchronous standby) gets on
// for this transaction only (set_config's is_local); remote_write and
// remote_apply are kept. It is set within the statement rather than as a
// startup parameter, which a pooler in session mode may refuse.
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
	// lock's wait alone. The owner label's first insert may wait for
	// another's insert of the same label to commit, and a lock_timeout there would fail
	// the statement with the advisory lock taken — a session lock, which
	// the transaction's abort does not release — as if the wait had
	// failed; the caller would take it again (a session's advisory locks
	// are reentrant) and release it once: a leak.
	// The grant's owner label is the statement's last parameter (see
	// call.statement), when it fences.
	owner := func(n int) string {
		if !p.fencing {
			return ""
		}
		return "$" + strconv.Itoa(n)
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
		try := kind == waitNone
		p.lockSQL[kind] = p.lockStatement(f("pg_advisory_lock", "k.id"), p.fencing, owner(n), try)
		p.sharedSQL[kind] = p.lockStatement(f("pg_advisory_lock_shared", "k.id"), p.fencing, owner(n), try)
		nParam := "$" + strconv.Itoa(n) // N follows the statement's other parameters
		shared := f("pg_advisory_lock_shared", "k.id")
		if kind == waitBounded {
			shared = boundedLeft("pg_advisory_lock_shared", "k.id")
		}
		gate := f("pg_advisory_lock", "-k.id")
		if kind == waitNone {
			gate = "" // NoWait takes no gate
		}
		p.entrySQL[kind] = p.permitStatement(gate, shared, nParam, try, owner(n+1))
		// With the gate held, only the shared wait sets lock_timeout.
		p.admitSQL[kind] = p.permitStatement("", shared, nParam, try, owner(n+1))
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
		p.retrySQL[mode] = p.lockStatement(`CASE WHEN `+mine+` THEN true ELSE `+bounded(m.lock, "k.id")+` END`, p.fencing, owner(4), false)
	}
	// A key's row commits synchronously, whatever the session's
	// synchronous_commit (once per key: see idCache).
	p.registerSQL = `INSERT INTO ` + p.table + ` (key) SELECT $1::bytea WHERE ` + syncCommit + ` IS NOT NULL ON CONFLICT (key) DO NOTHING`
	p.adding = map[string]string{}
	for _, set := range [][]string{p.lockSQL[:], p.sharedSQL[:], p.entrySQL[:], p.admitSQL[:], p.retrySQL[:]} {
		for i, sql := range set {
			usual, adding := labelled(sql)
			set[i] = usual
			if p.fencing {
				p.adding[usual] = adding
			}
		}
	}
	p.byID = map[string]string{}
	lookup := labelLookup(p.names.owners)
	for _, set := range [][]string{p.lockSQL[:], p.sharedSQL[:], p.retrySQL[:]} {
		for _, sql := range set {
			byKey := `SELECT id FROM ` + p.table + ` WHERE key = $1`
			if strings.Count(sql, byKey) != 1 || p.fencing && len(lookup.FindAllStringIndex(sql, -1)) != 1 {
				continue // a form this rewrite does not know: always by key and label
			}
			p.byID[sql] = lookup.ReplaceAllString(strings.Replace(sql, byKey, `SELECT $1::int4 AS id`, 1), `$1::int4`)
		}
	}
}

// idCache is the lock ids of keys granted before, which let a grant's
// statement take the key's lock by its id and read no table (see byID).
//
// An id is the key's row's, and a row outlives every cached id only if
// it is on disk before its id is read and nobody deletes it: the row is
// registered with a synchronous commit (registerSQL), and rows are never
// deleted (see the package doc, Keys). What is left is a server that comes
// back without rows it had — a crash of a server whose rows an older
// version committed asynchronously, a failover to a replica that lags, a
// backup restored: each ends every connection of the provider, so the
// cache is forgotten whenever the provider opens a connection (and when
// it finds one dead), and an id read by a statement sent before that is
// not learned (gen). Through a pooler (AllowPooler) a client connection
// outlives the server's (the pooler keeps it, and ties it to a new server
// session), so nothing tells the provider that the server came back:
// there the cache is off, and every grant finds its key's id by the key.
//
// Concurrency: mu guards gen and ids; off is set before the cache is used.
type idCache struct {
	mu  sync.Mutex
	off bool   // through a pooler: nothing is cached
	gen uint64 // counts forget calls
	ids map[string]int32
}

// get returns the lock id of key, if a grant found it since the cache was
// last forgotten.
func (c *idCache) get(key string) (int32, bool) {
	if c.off {
		return 0, false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	id, ok := c.ids[key]
	return id, ok
}

// epoch returns the cache's generation, read before a statement that may
// find a key's id is sent: learn takes it back.
func (c *idCache) epoch() uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.gen
}

// learn records key's lock id, read by a statement sent in generation gen,
// unless the cache was forgotten since; past maxIDs keys, the cache
// forgets them all (the next grant of each reads its id again).
func (c *idCache) learn(key string, id int32, gen uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.off || gen != c.gen {
		return
	}
	if _, ok := c.ids[key]; ok {
		return
	}
	if len(c.ids) >= maxIDs {
		clear(c.ids)
	}
	c.ids[key] = id
}

// forget drops every id: the provider opened a connection (the server may
// have restarted without rows it had), or found one dead.
func (c *idCache) forget() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.gen++
	clear(c.ids)
}

// maxIDs bounds the keys whose lock ids a provider remembers.
const maxIDs = 4096

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
		if p.poller != nil {
			p.poller.close()
		}
		p.pool.Close()
	})
	return nil
}

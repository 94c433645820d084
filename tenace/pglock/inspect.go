package pglock

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"tenace.dev/tenace"
	"tenace.dev/tenace/internal/keyfmt"
)

var _ tenace.Inspector = (*Provider)(nil)

// ownerColumnsDDL is the column of the table of keys where each grant
// records its owner, written by the grant's own statement (the fence's
// UPDATE): a JSON object whose members are the backends holding the key
// (by pg_backend_pid, which pg_locks names) and whose values are the
// grant's owner ("o"), time ("t"), fencing token ("f") and, for a
// bulkhead, permit count ("n"). An exclusive grant replaces the object
// (nobody else holds the key); a shared one adds its member, after
// dropping those of backends that no longer hold the key once there are
// 32 or more (a read of pg_locks, rare). Members of backends that let go
// of the key stay until then, and Inspect shows only the members that
// pg_locks says hold it.
const ownerColumnsDDL = `owners jsonb`

// maxOwners is how many members the owners object may have before a
// shared grant drops those of backends that let go (see ownerColumnsDDL).
const maxOwners = 32

// WithOwner sets the provider's owner label, recorded with every grant it
// makes and shown by Inspect, List and a refusal's holder (a pod name, a
// job id); by default tenace.DefaultOwner(). A Lock's own label
// (tenace.LockOptions.Owner) follows it, as "owner (label)". It panics if
// label is empty.
//
// The label is written in the key's row of the table by the grant's own
// statement, with the fence, under the backend that holds the grant (a
// pooled session's application_name would name whoever last borrowed the
// connection, not the grant): a provider WithoutFencing writes nothing,
// and records no owner. A table created by a version without the owners
// column gets it from New (ALTER TABLE ... ADD COLUMN, waiting 1s at most
// for the table's lock), unless WithoutSetup; without it, grants record no
// owner.
func WithOwner(label string) Option {
	if label == "" {
		panic("tenace: pglock.WithOwner: the owner label must not be empty")
	}
	return optionFunc(func(s *settings) { s.owner = label })
}

// Owner returns the provider's owner label (see WithOwner).
func (p *Provider) Owner() string { return p.owner }

// ownerOf is the owner a grant records, boxed for the statement's
// arguments: the provider's label (boxed once, by New), and the caller's
// after it when it gave one.
func (p *Provider) ownerOf(label string) any {
	if label == "" {
		return p.ownerArg
	}
	return p.owner + " (" + label + ")"
}

// recordsOwners reports whether the acquire statements record the grant's
// owner: they write the row (fencing), and the table has the columns.
func (p *Provider) recordsOwners() bool { return p.fencing && p.owners }

// withOwner appends the grant's owner to an acquire statement's arguments,
// when it records one: its last parameter (see prepareSQL).
func (c *call) withOwner(args []any) []any {
	if !c.p.recordsOwners() {
		return args
	}
	return append(args, c.p.ownerOf(c.opts.Owner))
}

// checkOwners sets p.owner's default and finds whether the table has the
// owners column; it adds it when missing, unless WithoutSetup, waiting
// a second at most for the table's lock (acquire statements that wait for
// a key hold a share of it): failing that, grants record no owner.
func (p *Provider) checkOwners(ctx context.Context, c *pgxpool.Conn, s settings) error {
	if p.owner == "" {
		p.owner = tenace.DefaultOwner()
	}
	p.ownerArg = p.owner
	count := func() (int, error) {
		var n int
		err := c.QueryRow(ctx, `SELECT count(*) FROM pg_attribute WHERE attrelid = $1::regclass
	AND attname = 'owners' AND attnum > 0 AND NOT attisdropped`, p.table).Scan(&n)
		return n, err
	}
	n, err := count()
	if err != nil {
		return fmt.Errorf("pglock: reading the columns of %s: %w", p.table, err)
	}
	if n < 1 && s.setup {
		err := pgx.BeginFunc(ctx, c, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `SET LOCAL lock_timeout = '1s'`); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, `ALTER TABLE `+p.table+` ADD COLUMN IF NOT EXISTS `+ownerColumnsDDL)
			return err
		})
		var pgErr *pgconn.PgError
		if err != nil && !errors.As(err, &pgErr) {
			return fmt.Errorf("pglock: adding the owners column to %s: %w", p.table, err)
		}
		if n, err = count(); err != nil {
			return fmt.Errorf("pglock: reading the columns of %s: %w", p.table, err)
		}
	}
	p.owners = n == 1
	return nil
}

// heldByCols is the column an acquire statement reads from the key's row,
// beside its id, for the holders a refusal names: its owners.
func (p *Provider) heldByCols() string {
	if !p.owners {
		return `, NULL::jsonb AS owners`
	}
	return `, owners`
}

// heldBySelect returns it, after the acquire statement's (id, locked,
// fence).
const heldBySelect = `, (SELECT owners FROM k)`

// ownerSet is the fence UPDATE's assignment of the grant's owner, param
// (a "$n"), in mode; permits is the bulkhead's count parameter ("" for
// none). See ownerColumnsDDL.
func (p *Provider) ownerSet(param string, mode lockMode, permits string) string {
	n := ``
	if permits != "" {
		n = `, 'n', ` + permits + `::int4`
	}
	if mode != modeExclusive {
		n += `, 's', true`
	}
	member := `jsonb_build_object(pg_backend_pid()::text, jsonb_build_object('o', ` + param + `::text, 't', clock_timestamp(), 'f', fence + 1` + n + `))`
	if mode == modeExclusive {
		return `, owners = ` + member
	}
	live := `(SELECT jsonb_object_agg(e.key, e.value) FROM jsonb_each(owners) e WHERE e.key IN (SELECT l.pid::text FROM pg_locks l
	WHERE l.locktype = 'advisory' AND l.classid = $2::int4::oid AND l.objid = id::oid AND l.objsubid = 2 AND l.granted))`
	return `, owners = CASE WHEN owners IS NULL THEN '{}'::jsonb
	WHEN (SELECT count(*) FROM jsonb_object_keys(owners)) < ` + strconv.Itoa(maxOwners) + ` THEN owners
	ELSE coalesce(` + live + `, '{}'::jsonb) END || ` + member
}

// owned is one member of the owners object.
type owned struct {
	Owner   string    `json:"o"`
	Since   time.Time `json:"t"`
	Token   int64     `json:"f"`
	Permits int       `json:"n"`
	Shared  bool      `json:"s"`
}

// onHeld calls f with the holder a NoWait try's refusal read, if it read
// one. Only a NoWait call: the others' statements end in lock_timeout or a
// cancel, which return no row (and may run on a worker Acquire left).
//
// An exclusive grant makes its holder the key's only owner: that one is
// named. A shared grant adds its holder to the owners and keeps the others
// (pruned to the live ones only past maxOwners, see ownerSet), so a
// refusal by readers cannot tell which members still hold the key without
// reading pg_locks: it says "held shared" and names nobody (Inspect names
// the live holders).
func (c *call) onHeld(f func(tenace.HolderInfo)) {
	if c.opts.Timeout != tenace.NoWait || len(c.heldBy) == 0 {
		return
	}
	var owners map[string]owned
	if json.Unmarshal(c.heldBy, &owners) != nil || len(owners) == 0 {
		return
	}
	for _, o := range owners {
		if o.Shared || len(owners) > 1 {
			f(tenace.HolderInfo{Shared: true})
			return
		}
		f(tenace.HolderInfo{Owner: o.Owner, Since: o.Since, Token: uint64(max(o.Token, 0)), Permits: o.Permits})
	}
}

// inspectSQL reads keys ($1, an array) with their locks ($2, the class
// id) from pg_locks: one row for each lock of a key, or one with NULL
// lock columns for a key with none. A bulkhead's gate (objid −id) counts
// as its waiters'.
func (p *Provider) inspectSQL() string {
	owner := `k.owners -> l.pid::text`
	if !p.owners {
		owner = `NULL::jsonb`
	}
	return `SELECT k.key, ` + owner + `, l.pid, l.mode, l.granted,
	(to_jsonb(l) ->> 'waitstart')::timestamptz, l.objid <> k.id::oid, clock_timestamp()
FROM ` + p.table + ` k LEFT JOIN pg_locks l ON l.locktype = 'advisory'
	AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
	AND l.classid = $2::int4::oid AND l.objsubid = 2 AND (l.objid = k.id::oid OR l.objid = (-k.id)::oid)
WHERE k.key = ANY($1::bytea[])
ORDER BY k.key, l.granted DESC`
}

// listSQL is one page of the keys locked or waited for ($1 the class id),
// from pg_locks (a bulkhead's gate, objid −id, names its key too), between
// $2 and $3 (NULL: no bound), after $4 (NULL: from the first), $5 at most,
// in order: its cost is bounded by the server's lock table, never the
// table of keys.
func (p *Provider) listSQL() string {
	return `WITH h AS (SELECT DISTINCT abs((l.objid::int8 << 32) >> 32)::int4 AS id FROM pg_locks l
	WHERE l.locktype = 'advisory' AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
	AND l.classid = $1::int4::oid AND l.objsubid = 2)
SELECT k.key FROM h JOIN ` + p.table + ` k ON k.id = h.id
WHERE k.key >= $2 AND ($3::bytea IS NULL OR k.key < $3) AND ($4::bytea IS NULL OR k.key > $4)
ORDER BY k.key LIMIT $5`
}

// Inspect reports key's holders and waiters (tenace.Inspector), in one
// read-only statement: the key's row of the table, and its locks in
// pg_locks, the server's lock manager. It never changes a lock.
//
// Holders are the sessions pg_locks shows granted the key (Shared for a
// reader's or a bulkhead's share), each with the Owner, Since (the
// server's clock), fencing Token and bulkhead Permits its grant recorded
// in the key's row (see WithOwner; a grant of a provider WithoutFencing or
// of an older version recorded none: Owner "", zero Since and Token). A
// session lock never expires: Expires is zero (a lease's TTL is kept by
// its own process).
//
// Waiters are the sessions waiting for the key in pg_locks (and those at
// or waiting for a bulkhead's gate), oldest first with the time they began
// to wait (PostgreSQL 14 and later; a bulkhead's head waiter, which holds
// the gate while it waits for a permit, is granted the gate, so pg_locks
// gives it no wait start: zero Since); their owners are not known (Owner
// ""). LongestWait is the oldest known wait.
//
// An outage is an error, as in Acquire: a refused connection wraps the
// dial's error (errors.Is(err, syscall.ECONNREFUSED)); a server that does
// not answer before ctx ends, an error wrapping ErrNoReply (after up to
// 2s more, the cancel's grace: see the package doc). It panics on a nil
// ctx; an empty key is an error wrapping tenace.ErrMissingKey.
func (p *Provider) Inspect(ctx context.Context, key string) (tenace.KeyInfo, error) {
	if ctx == nil {
		panic("tenace: pglock.Provider.Inspect: nil context: pass context.Background() or the caller's context")
	}
	if key == "" {
		return tenace.KeyInfo{}, fmt.Errorf("pglock: Inspect: %w", tenace.ErrMissingKey)
	}
	infos, err := p.inspect(ctx, "inspecting "+keyfmt.Quote(key), []string{key})
	if err != nil {
		return tenace.KeyInfo{}, err
	}
	if len(infos) == 0 {
		return tenace.KeyInfo{Key: key}, nil // never locked: no row
	}
	return infos[0], nil
}

// inspect reads keys (see inspectSQL), on a connection of its own.
func (p *Provider) inspect(ctx context.Context, what string, keys []string) ([]tenace.KeyInfo, error) {
	raw := make([][]byte, len(keys))
	for i, k := range keys {
		raw[i] = []byte(k)
	}
	var infos []tenace.KeyInfo
	err := p.read(ctx, what, func(ctx context.Context, conn *pgxpool.Conn) error {
		rows, err := conn.Query(ctx, p.inspectSQL(), raw, p.classID)
		if err != nil {
			return err
		}
		infos, err = readInspect(rows)
		return err
	})
	return infos, err
}

// readInspect turns inspectSQL's rows into a KeyInfo a key.
func readInspect(rows pgx.Rows) ([]tenace.KeyInfo, error) {
	var infos []tenace.KeyInfo
	var oldest []time.Time
	for rows.Next() {
		var (
			key       []byte
			owner     []byte
			pid       *int32
			waitStart *time.Time
			mode      *string
			granted   *bool
			gate      *bool
			now       time.Time
		)
		if err := rows.Scan(&key, &owner, &pid, &mode, &granted, &waitStart, &gate, &now); err != nil {
			return nil, err
		}
		if len(infos) == 0 || infos[len(infos)-1].Key != string(key) {
			infos = append(infos, tenace.KeyInfo{Key: string(key)})
			oldest = append(oldest, time.Time{})
		}
		info := &infos[len(infos)-1]
		if pid == nil {
			continue // no lock
		}
		if *granted && !*gate {
			h := tenace.HolderInfo{Shared: *mode == "ShareLock"}
			var o owned
			if len(owner) > 0 && json.Unmarshal(owner, &o) == nil {
				h.Owner, h.Since, h.Token, h.Permits = o.Owner, o.Since, uint64(max(o.Token, 0)), o.Permits
			}
			info.Holders = append(info.Holders, h)
			continue
		}
		// A waiter: for the key, or at (or for) its gate.
		info.Waiting++
		w := tenace.WaiterInfo{Shared: *mode == "ShareLock" || *gate}
		if waitStart != nil {
			w.Since = *waitStart
			if o := &oldest[len(oldest)-1]; o.IsZero() || waitStart.Before(*o) {
				*o = *waitStart
				info.LongestWait = max(now.Sub(*waitStart), 0)
			}
		}
		info.Waiters = append(info.Waiters, w)
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	for i := range infos {
		slices.SortStableFunc(infos[i].Waiters, func(a, b tenace.WaiterInfo) int {
			switch {
			case a.Since.IsZero() || b.Since.IsZero():
				return 0
			default:
				return a.Since.Compare(b.Since)
			}
		})
	}
	return infos, nil
}

// read runs f on a connection of the pool, within ctx and a connection
// slot (the provider's bound: a read waits for one as Acquire does). A
// statement that ctx cut short leaves its connection discarded (a cancel
// may be on its way to its session). The error says what failed: silence
// until ctx's end wraps ErrNoReply.
func (p *Provider) read(ctx context.Context, what string, f func(context.Context, *pgxpool.Conn) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if p.closed.Err() != nil {
		return p.closedErr()
	}
	select {
	case p.slots <- struct{}{}:
	case <-ctx.Done():
		return fmt.Errorf("pglock: %s: %w (no connection freed before the context ended; WithMaxConns %d)", what, ErrPoolExhausted, p.maxConns)
	case <-p.closed.Done():
		return p.closedErr()
	}
	defer func() { <-p.slots }()
	conn, err := p.pool.Acquire(ctx)
	if err != nil {
		return p.readFailed(ctx, what, err)
	}
	err = f(ctx, conn)
	if ctx.Err() != nil {
		discard(conn)
	} else {
		conn.Release()
	}
	if err != nil {
		return p.readFailed(ctx, what, err)
	}
	return nil
}

// readFailed words the error of a read: ctx's cancellation as itself; a
// deadline or a timeout with no answer, ErrNoReply; anything else (a
// refused dial, the server's error) wrapped.
func (p *Provider) readFailed(ctx context.Context, what string, err error) error {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) && ctx.Err() != nil && !errors.Is(ctx.Err(), context.Canceled) {
		return fmt.Errorf("pglock: %s: %w before the context ended (%v)", what, ErrNoReply, err)
	}
	if errors.Is(ctx.Err(), context.Canceled) {
		return fmt.Errorf("pglock: %s: %w", what, ctx.Err())
	}
	return fmt.Errorf("pglock: %s: %w", what, err)
}

// List returns one page of the keys locked or waited for under
// opts.Prefix (tenace.Inspector), each with what Inspect says of it, in
// two statements: the page's keys from pg_locks joined with the table of
// keys (its cost bounded by the server's lock table, never a scan of the
// table of keys), keyset-paged in key order, then their inspection. A page
// holds at most opts.Limit keys (100 when 0); an empty Next ends the
// listing. An outage is an error, as for Inspect; so are a negative Limit
// (wrapping tenace.ErrInvalidOption) and a closed provider
// (tenace.ErrProviderClosed), for List and Inspect alike.
func (p *Provider) List(ctx context.Context, opts tenace.ListOptions) (tenace.ListPage, error) {
	if ctx == nil {
		panic("tenace: pglock.Provider.List: nil context: pass context.Background() or the caller's context")
	}
	if opts.Limit < 0 {
		return tenace.ListPage{}, fmt.Errorf("%w: pglock: List: ListOptions.Limit is %d; give 0 for the default page, or a positive count", tenace.ErrInvalidOption, opts.Limit)
	}
	limit := opts.Limit
	if limit == 0 {
		limit = 100
	}
	var after []byte
	if opts.Cursor != "" {
		var err error
		if after, err = hex.DecodeString(opts.Cursor); err != nil || len(after) == 0 {
			return tenace.ListPage{}, fmt.Errorf("%w: pglock: List: the cursor %q is not one this provider returned", tenace.ErrInvalidOption, opts.Cursor)
		}
	}
	what := "listing the keys under " + keyfmt.Quote(opts.Prefix)
	var keys []string
	err := p.read(ctx, what, func(ctx context.Context, conn *pgxpool.Conn) error {
		rows, err := conn.Query(ctx, p.listSQL(), p.classID, []byte(opts.Prefix), upperBound(opts.Prefix), after, limit)
		if err != nil {
			return err
		}
		keys, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (string, error) {
			var k []byte
			err := r.Scan(&k)
			return string(k), err
		})
		return err
	})
	if err != nil {
		return tenace.ListPage{}, err
	}
	var page tenace.ListPage
	if len(keys) == 0 {
		return page, nil
	}
	if len(keys) == limit {
		page.Next = hex.EncodeToString([]byte(keys[len(keys)-1]))
	}
	infos, err := p.inspect(ctx, what, keys)
	if err != nil {
		return tenace.ListPage{}, err
	}
	for _, info := range infos {
		if len(info.Holders) > 0 || info.Waiting > 0 {
			page.Keys = append(page.Keys, info)
		}
	}
	return page, nil
}

// upperBound is the least byte string above every string that begins with
// prefix; nil when there is none (prefix is empty or all 0xff).
func upperBound(prefix string) []byte {
	b := []byte(prefix)
	for len(b) > 0 && b[len(b)-1] == 0xff {
		b = b[:len(b)-1]
	}
	if len(b) == 0 {
		return nil
	}
	b[len(b)-1]++
	return b
}

package pglock

import (
	"context"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"tenace.dev/tenace"
	"tenace.dev/tenace/internal/keyfmt"
)

var _ tenace.Inspector = (*Provider)(nil)

// WithOwner sets the provider's owner label, recorded with every grant it
// makes and shown by Inspect, List and a refusal's holder (a pod name, a
// job id); by default tenace.DefaultOwner(). A Lock's own label
// (tenace.LockOptions.Owner) follows it, as "owner (label)". It panics if
// label is empty.
//
// The grant's statement records it in its session's application_name
// (see the package doc, How it works), by the label's id in the table's
// owners: each label is a row there, added by the first grant that uses
// it (one write; give Locks labels from a small set, not one per call). A
// session that holds several keys (a set, nested Locks) records its
// latest grant: for its other keys Inspect gives that grant's owner and no
// Since or Token. A provider WithoutFencing records no owner.
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
// after it when it gave one — as bytes, kept as bytea in the owners
// table, so that any Go string is a label (NUL, invalid UTF-8).
func (p *Provider) ownerOf(label string) any {
	if label == "" {
		return p.ownerArg
	}
	return []byte(p.owner + " (" + label + ")")
}

// label is the owner label c's grant records.
func (c *call) label() string {
	if c.opts.Owner == "" {
		return c.p.owner
	}
	return c.p.owner + " (" + c.opts.Owner + ")"
}

// withOwner appends the grant's owner label to an acquire statement's
// arguments, when it records one (fencing): its last parameter (see
// prepareSQL).
func (c *call) withOwner(args []any) []any {
	if !c.p.fencing {
		return args
	}
	return append(args, c.p.ownerOf(c.opts.Owner))
}

// ownerRecord is the SQL expression, run once the lock is held (w's row
// gives the token, f), that records the grant in its session's
// application_name: "tenace ID:TOKEN OWNER SINCE [PERMITS]", each in hex —
// the key's lock id, the fencing token, the owner label's id in the
// table's owners (see Schema), the server's clock in ms since the epoch,
// and a bulkhead's permit count. application_name is the one session
// state that every other session can read (pg_stat_activity, whatever its
// role), and setting it writes nothing: no transaction id, no WAL. It
// holds up to 63 bytes, hence the ids (this record is 62 at most). A
// session that holds several keys (a set, nested Locks) records the
// latest grant: see holder.
func (p *Provider) ownerRecord(owner, permits string) string {
	n := ``
	if permits != "" {
		n = ` || ' ' || to_hex(` + permits + `::int4)`
	}
	_, ref := p.labelInsert(owner)
	label := `coalesce((SELECT o.id FROM ` + p.names.owners + ` o WHERE o.owner = ` + owner + `::bytea)` + ref + `, 0)`
	return `set_config('application_name', 'tenace ' || to_hex((SELECT id FROM k)) || ':' || to_hex(w.f) || ' ' || to_hex(` + label + `) || ' '
	|| to_hex(floor(extract(epoch FROM clock_timestamp()) * 1000)::int8)` + n + `, false)`
}

// A fencing acquire statement is written in its form that adds the
// grant's owner label to the owners table (oi, see labelInsert), the
// parts for that between these marks (see labelled).
const (
	labelOpen  = `/*oi{*/`
	labelClose = `/*}oi*/`
)

// labelInsert is the CTE oi of a fencing acquire statement's form that
// adds the owner label, param, to the owners table when missing; and the
// label id's fallback to it.
func (p *Provider) labelInsert(owner string) (cte, ref string) {
	return labelOpen + `
oi AS (INSERT INTO ` + p.names.owners + ` (owner) SELECT ` + owner + `::bytea FROM w
	WHERE NOT EXISTS (SELECT 1 FROM ` + p.names.owners + ` o WHERE o.owner = ` + owner + `::bytea) ON CONFLICT (owner) DO NOTHING RETURNING id),` + labelClose,
		labelOpen + `, (SELECT id FROM oi)` + labelClose
}

var labelParts = regexp.MustCompile(`(?s)/\*oi\{\*/.*?/\*\}oi\*/`)

// labelLookup matches the owner label id's lookup in the owners table
// (see ownerRecord), its parameter as $1.
func labelLookup(owners string) *regexp.Regexp {
	return regexp.MustCompile(regexp.QuoteMeta(`coalesce((SELECT o.id FROM `+owners+` o WHERE o.owner = `) + `(\$\d+)` + regexp.QuoteMeta(`::bytea), 0)`))
}

// labelled returns the two forms of a fencing acquire statement sql: the
// usual one, which finds the owner label's id, and the one for a label
// not known to be in the owners table yet, which adds it — a write, and a
// data-modifying CTE that costs the statement several times its lookup's
// server time, so it runs only until a grant with the label succeeded
// (see knownLabel). An insert that meets another's insert of the same
// label leaves that grant's record without a label id, once.
func labelled(sql string) (usual, adding string) {
	return labelParts.ReplaceAllString(sql, ""), strings.NewReplacer(labelOpen, "", labelClose, "").Replace(sql)
}

// maxLabels bounds the labels a provider remembers as being in the
// owners table; past it, it forgets them all (a label is then added again
// by its next grant: a lookup that finds it, and no write).
const maxLabels = 1024

// knownLabel reports whether label is known to be in the owners table.
func (p *Provider) knownLabel(label string) bool {
	p.labelsMu.Lock()
	defer p.labelsMu.Unlock()
	_, ok := p.labels[label]
	return ok
}

// learnLabel records that label is in the owners table (a grant with it
// succeeded).
func (p *Provider) learnLabel(label string) {
	p.labelsMu.Lock()
	defer p.labelsMu.Unlock()
	if len(p.labels) >= maxLabels {
		clear(p.labels)
	}
	p.labels[label] = struct{}{}
}

// recordSQL is the SQL of the application_name of the backend pid, and
// of the owner label its record names: two columns.
func (p *Provider) recordSQL(pid string) string {
	app := `(SELECT a.application_name FROM pg_stat_get_activity(` + pid + `) a WHERE a.pid = ` + pid + `)`
	return app + `, (SELECT o.owner FROM ` + p.names.owners + ` o WHERE o.id = CASE WHEN ` + app + ` ~ '^tenace [0-9a-f]{1,8}:[0-9a-f]{1,16} [0-9a-f]{1,8} '
	THEN ('x' || lpad(split_part(` + app + `, ' ', 3), 8, '0'))::bit(32)::int4 END)`
}

// holdersSQL is the refusal's read of the key's holders (id, an SQL
// expression): a JSON array of [application_name, owner label (base64),
// shared]
// for each session pg_locks shows granted the key. Run only when a NoWait
// try was refused, it costs that refusal a read of pg_locks.
func (p *Provider) holdersSQL(id string) string {
	return `SELECT jsonb_agg(jsonb_build_array(r.app, encode(r.owner, 'base64'), r.shared)) FROM (SELECT ` + p.recordSQL(`l.pid`) + `, l.mode = 'ShareLock'
	FROM pg_locks l WHERE l.locktype = 'advisory' AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
	AND l.classid = $2::int4::oid AND l.objid = ` + id + `::oid AND l.objsubid = 2 AND l.granted) AS r(app, owner, shared)`
}

// record is a grant's owner record, read back (see ownerRecord).
type record struct {
	id      int32
	token   uint64
	since   time.Time
	permits int
}

// parseRecord reads an application_name written by ownerRecord; ok is
// false for any other.
func parseRecord(app string) (r record, ok bool) {
	f := strings.Fields(app)
	if len(f) < 4 || len(f) > 5 || f[0] != "tenace" {
		return r, false
	}
	idTok := strings.SplitN(f[1], ":", 2)
	if len(idTok) != 2 {
		return r, false
	}
	id, err1 := strconv.ParseUint(idTok[0], 16, 32)
	tok, err2 := strconv.ParseUint(idTok[1], 16, 64)
	ms, err3 := strconv.ParseInt(f[3], 16, 64)
	if err1 != nil || err2 != nil || err3 != nil {
		return r, false
	}
	r = record{id: int32(id), token: tok, since: time.UnixMilli(ms)}
	if len(f) == 5 {
		n, err := strconv.ParseUint(f[4], 16, 32)
		if err != nil {
			return r, false
		}
		r.permits = int(int32(n))
	}
	return r, true
}

// holder is what Inspect and a refusal say of the session pid, granted
// the key of lock id id (shared or not), from its record app and the
// owner label it names: a record of this key's grant gives its owner,
// time, token and permits; a record of another key's grant (the session
// holds several: a set, nested Locks), its owner alone — the session is
// one provider's, one execution's; no record (a provider WithoutFencing,
// or an older version), nothing but Shared.
func holder(id int32, app string, owner *string, shared bool) tenace.HolderInfo {
	h := tenace.HolderInfo{Shared: shared}
	r, ok := parseRecord(app)
	if !ok {
		return h
	}
	if owner != nil {
		h.Owner = *owner
	}
	if r.id == id {
		h.Since, h.Token, h.Permits = r.since, r.token, r.permits
	}
	return h
}

// onHeld calls f with the holder a NoWait try's refusal read, if it read
// one: the exclusive holder, or the oldest of the readers (or permit
// holders), each named by its owner record (see ownerRecord). Only a
// NoWait call: the others' statements end in lock_timeout or a cancel,
// which return no row (and may run on a worker Acquire left).
func (c *call) onHeld(f func(tenace.HolderInfo)) {
	if c.opts.Timeout != tenace.NoWait || len(c.heldBy) == 0 || c.heldID == 0 {
		return
	}
	var rows [][3]any
	if json.Unmarshal(c.heldBy, &rows) != nil || len(rows) == 0 {
		return
	}
	var first tenace.HolderInfo
	for i, row := range rows {
		app, _ := row[0].(string)
		var owner *string
		if enc, ok := row[1].(string); ok {
			if b, err := base64.StdEncoding.DecodeString(enc); err == nil {
				o := string(b)
				owner = &o
			}
		}
		shared, _ := row[2].(bool)
		h := holder(c.heldID, app, owner, shared)
		if i == 0 || (!h.Since.IsZero() && (first.Since.IsZero() || h.Since.Before(first.Since))) {
			first = h
		}
	}
	f(first)
}

// inspectSQL reads keys ($1, an array) with their locks ($2, the class
// id) from pg_locks: one row for each lock of a key, or one with NULL
// lock columns for a key with none; each lock with its session's owner
// record and the label it names (see ownerRecord). A bulkhead's gate
// (objid −id) counts as its waiters'.
func (p *Provider) inspectSQL() string {
	return `SELECT k.key, k.id, ` + p.recordSQL(`l.pid`) + `, l.pid, l.mode, l.granted,
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
// server's clock, to the ms), fencing Token and bulkhead Permits its grant
// recorded in its session's application_name (see WithOwner; a grant of a
// provider WithoutFencing recorded none: Owner "", zero Since and Token). A
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
			id        int32
			app       *string
			owner     []byte
			pid       *int32
			waitStart *time.Time
			mode      *string
			granted   *bool
			gate      *bool
			now       time.Time
		)
		if err := rows.Scan(&key, &id, &app, &owner, &pid, &mode, &granted, &waitStart, &gate, &now); err != nil {
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
			var a string
			if app != nil {
				a = *app
			}
			var o *string
			if owner != nil {
				label := string(owner)
				o = &label
			}
			info.Holders = append(info.Holders, holder(id, a, o, *mode == "ShareLock"))
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
// may be on its way to its session); one that found its connection dead
// runs once more on a live one. The error says what failed: silence
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
	if err != nil && ctx.Err() == nil && conn.Conn().IsClosed() {
		// The connection had died idle in the pool: a server shut down or
		// restarted sends its backends' FATAL (57P01), read only now. Once
		// more on a connection found alive, as Acquire does: the answer,
		// or the outage's own error (a refused dial).
		discard(conn)
		if conn, err = p.reconnect(ctx); err != nil {
			return p.readFailed(ctx, what, err)
		}
		err = f(ctx, conn)
	}
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

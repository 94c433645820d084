package pglock

import (
	"context"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"tenace.dev/tenace"
	"tenace.dev/tenace/internal/keyfmt"
	"tenace.dev/tenace/internal/provkit"
)

var _ tenace.MultiLockProvider = (*Provider)(nil)

// AcquireSet acquires every key of keys, all or none
// (tenace.MultiLockProvider; tenace.AcquireAll and a Lock with
// LockOptions.Keys call it), on one connection: its session takes the keys'
// advisory locks one after another, in sorted (byte) order — the order of
// tenace.AcquireAll's generic path, so that sets and callers of that path
// in other processes never wait for each other in a cycle — and holds them
// all until Release.
//
// It returns what Acquire returns, for the set, under the same rules: the
// Timeout and ctx cover the whole set (each key's wait on the server is
// bounded by what remains of the Timeout); (nil, nil) only when PostgreSQL
// said a key is held (or the pool's and the provider's own leases did, as
// for Acquire); ErrNoReply when it did not answer in time. Whenever it
// returns no lease, the keys locked so far are unlocked first (or their
// session ended, which frees them; for ErrNoReply, once the server answers
// again). When PostgreSQL's deadlock detector fails the set's wait to break
// a cycle of sessions (SQLSTATE 40P01), it returns a *tenace.DeadlockError,
// once the keys locked so far are unlocked (see the package doc,
// Deadlocks).
//
// The lease's keys are in sorted order, each with its own fencing token,
// incremented as its lock was taken. The set is one session: when its
// connection ends (its backend terminated, the server restarted), its TTL
// passes or the provider is closed, every key is lost at once, and the
// SetLease's Lost, and every key's, is closed. Release unlocks every key in
// one statement and gives the connection back. Stats counts each key of a
// held set in Held, and a waiting set once in Waiting, in the queue of each
// of its keys.
func (p *Provider) AcquireSet(ctx context.Context, keys []string, opts tenace.LockAcquireOptions) (*tenace.SetLease, error) {
	if ctx == nil {
		panic("tenace: pglock.Provider.AcquireSet: nil context: pass context.Background() or the caller's context")
	}
	if err := tenace.ValidateSet(keys, opts); err != nil {
		return nil, err
	}
	sorted := slices.Sorted(slices.Values(keys))
	l, err := p.acquire(&call{p: p, ctx: ctx, key: sorted[0], keys: sorted, opts: opts})
	if l == nil {
		return nil, err
	}
	return l.(*tenace.SetLease), err
}

// setGrant is a key of a set whose lock the set's session took: its lock
// id (the key's row in the table of keys) and its fencing token.
//
// No two keys of a set share a lock id: ids are the table's identity
// column, one per key. They must not: a session's advisory locks are
// reentrant, so a second key on the same id would be "granted" at once
// without excluding anyone.
type setGrant struct {
	key   string
	id    int32
	token uint64
}

// grantSet turns conn, whose session now holds the lock of every key of
// got, into the set's lease: one lease (see lease) holds the connection,
// watches it and keeps the TTL for the whole set, and each key gets a view
// of it (setKey) with its own token. Like grant, it owns conn from here.
func (p *Provider) grantSet(conn *pgxpool.Conn, got []setGrant, opts tenace.LockAcquireOptions) (tenace.LockLease, error) {
	l := &lease{p: p, s: newSession(p, conn), key: got[0].key, id: got[0].id, token: got[0].token, set: got}
	if err := p.hold(l, opts); err != nil {
		return nil, err
	}
	keys := make([]string, len(got))
	leases := make([]tenace.LockLease, len(got))
	for i, g := range got {
		keys[i] = g.key
		// The first key's view releases the set: SetLease releases the
		// last key first, so it comes last, once the others did nothing.
		k := setKey{l: l, token: g.token, owner: i == 0}
		leases[i] = k
		if p.fencing {
			leases[i] = fencedSetKey{k}
		}
	}
	return tenace.NewSetLease(keys, leases), nil
}

// setKey is the lease of one key of a set: a view of the set's lease, lost
// when it is. Only the owner's Release does something: it releases the
// whole set (the leases of a SetLease are released together, by its
// Release).
type setKey struct {
	l     *lease
	token uint64
	owner bool
}

var (
	_ tenace.LosableLease = setKey{}
	_ tenace.FencedLease  = fencedSetKey{}
)

// Release releases the set, for the owner; nothing for the others.
func (k setKey) Release(ctx context.Context) error {
	if !k.owner {
		return nil
	}
	return k.l.Release(ctx)
}

// Lost is the set's lease's Lost.
func (k setKey) Lost() <-chan struct{} { return k.l.Lost() }

// Err is the set's lease's Err.
func (k setKey) Err() error { return k.l.Err() }

// fencedSetKey is a setKey of a provider with fencing.
type fencedSetKey struct{ setKey }

// Token is the key's fencing token, as a single grant's (see lease.Token).
func (k fencedSetKey) Token() uint64 { return k.token }

// deadlocked is the error of a set whose wait for key, with the keys of
// got held, the server failed to break a cycle of sessions: Cycle names
// the keys this process knows of it, key first, then those its session
// held (the others of the cycle are other sessions' keys).
func deadlocked(key string, got []setGrant) *tenace.DeadlockError {
	cycle := []string{key}
	for _, g := range got {
		cycle = append(cycle, g.key)
	}
	return &tenace.DeadlockError{Key: key, Cycle: cycle}
}

// giveBack returns conn to the pool after a call that got no lease and saw
// no cancel, when its session holds nothing but the keys got of a set: it
// unlocks them first, and closes the connection instead (see discard) if
// the unlock did not plainly succeed.
func (p *Provider) giveBack(conn *pgxpool.Conn, got []setGrant) {
	if got != nil {
		ctx, cancel := context.WithTimeout(context.Background(), provkit.CleanupTimeout)
		_, err := conn.Exec(ctx, `SELECT pg_advisory_unlock_all()`)
		ended := ctx.Err() != nil
		cancel()
		if err != nil || ended {
			discard(conn)
			return
		}
	}
	conn.Release()
}

// has reports whether l holds key.
func (l *lease) has(key string) bool {
	return l.key == key || slices.ContainsFunc(l.set, func(g setGrant) bool { return g.key == key })
}

// count is how many keys l holds, for Stats.
func (l *lease) count() int64 { return int64(max(1, len(l.set))) }

// name is how errors name what l holds: its key, or its set's.
func (l *lease) name() string {
	if l.set == nil {
		return keyfmt.Quote(l.key)
	}
	keys := make([]string, len(l.set))
	for i, g := range l.set {
		keys[i] = g.key
	}
	return namesOf(keys)
}

// unlock is the statement that unlocks what l holds: its key's lock, or
// every key's of its set; it returns whether the session held them all.
func (l *lease) unlock(ctx context.Context) pgx.Row {
	if l.set == nil {
		args := []any{l.p.classID, l.id}
		if l.mode == modePermit {
			args = append(args, l.p.permitChannel(l.id))
		}
		return l.s.conn.QueryRow(ctx, l.unlockSQL(), args...)
	}
	ids := make([]int32, len(l.set))
	for i, g := range l.set {
		ids[i] = g.id
	}
	return l.s.conn.QueryRow(ctx, `SELECT coalesce(bool_and(pg_advisory_unlock($1::int4, id)), false) FROM unnest($2::int4[]) AS u(id)`, l.p.classID, ids)
}

// all returns the keys c asks for: its set's, or its key.
func (c *call) all() []string {
	if c.keys != nil {
		return c.keys
	}
	return []string{c.key}
}

// queue counts c in (d 1) or out (d -1) of the queue of each of its keys.
func (c *call) queue(d int) { c.p.queue(d, c.opts.Shared, c.all()...) }

// busy is keyBusy for c's keys.
func (c *call) busy() bool { return c.p.keyBusy(c.all(), c.mode(), c.opts.Permits) }

// held is holds for c's keys.
func (c *call) held() bool { return c.p.holds(c.all(), c.mode(), c.opts.Permits) }

// name is how errors name what c asks for: its key, or its set's.
func (c *call) name() string {
	if c.keys == nil {
		return keyfmt.Quote(c.key)
	}
	return namesOf(c.keys)
}

// namesOf names a set in errors: "the set {"a", "b"}".
func namesOf(keys []string) string {
	q := make([]string, len(keys))
	for i, k := range keys {
		q[i] = keyfmt.Quote(k)
	}
	return "the set {" + strings.Join(q, ", ") + "}"
}

package shard

import (
	"context"
	"strings"
	"time"
)

// HolderView is one grant of a key, as [Table.Inspect] shows it. Since is
// the table's clock at the grant (see [Table.SetNow]).
type HolderView struct {
	Token   uint64
	Label   string
	Since   int64
	Shared  bool
	Permits int // the key's permit count, when Shared (0: no limit)
}

// WaiterView is one queued waiter of a key, as [Table.Inspect] shows it.
// Since is the table's clock when it queued.
type WaiterView struct {
	Label  string
	Since  int64
	Shared bool
}

// KeyView is what the table holds of one key at one step: its holders, in
// grant order, and its waiters, oldest first. Waiting counts every waiter;
// Waiters names at most the number Inspect or List was asked for, the
// oldest.
type KeyView struct {
	Key     string
	Holders []HolderView
	Waiting int
	Waiters []WaiterView
}

// Inspect returns key's holders and its first named waiters (oldest first),
// and false when nobody holds the key. It only reads: the owner's, like
// every method but ReleaseByCAS. A holder that frees the key by CAS while
// it runs may still be shown: the view is of the word's value when read.
func (t *Table[T]) Inspect(key string, named int) (KeyView, bool) {
	e := t.entries[key]
	if e == nil {
		return KeyView{}, false
	}
	return view(e, named)
}

// view is Inspect of entry e.
func view[T any](e *entry[T], named int) (KeyView, bool) {
	s := e.state.Load()
	if s == stFree || s == stDead {
		return KeyView{}, false
	}
	v := KeyView{Key: e.key, Waiting: int(e.waiting)}
	if s == stShared {
		v.Holders = make([]HolderView, len(e.readers))
		for i, m := range e.readers {
			v.Holders[i] = HolderView{Token: m.token, Label: m.label, Since: m.since, Shared: true, Permits: int(e.permits)}
		}
	} else {
		v.Holders = []HolderView{{Token: tokenOfWord(s), Label: e.label, Since: e.since}}
	}
	if n := min(int(e.waiting), named); n > 0 {
		v.Waiters = make([]WaiterView, 0, n)
		for w := e.head; w != nil && len(v.Waiters) < n; w = w.next {
			v.Waiters = append(v.Waiters, WaiterView{Label: w.label, Since: w.since, Shared: w.shared})
		}
	}
	return v, true
}

// List returns the held keys that begin with prefix among the table's
// entries from position pos on, in the table's own order (not sorted):
// it stops once it has limit keys or has looked at budget entries, and
// returns the position to continue from, or -1 when it looked at every
// entry. Its cost is bounded by budget, whatever the table holds. When
// nothing changes between two calls, continuing from the returned
// position lists every held key exactly once; a key freed, reaped or made
// meanwhile may move, and be listed twice or not at all.
func (t *Table[T]) List(prefix string, pos, limit, budget, named int) (keys []KeyView, next int) {
	for ; pos < len(t.all) && len(keys) < limit && budget > 0; pos, budget = pos+1, budget-1 {
		e := t.all[pos]
		if !strings.HasPrefix(e.key, prefix) {
			continue
		}
		if v, ok := view(e, named); ok {
			keys = append(keys, v)
		}
	}
	if pos >= len(t.all) {
		return keys, -1
	}
	return keys, pos
}

// query is an Inspect or a List, sent to the shard as msgQuery on the
// waiter that carries it, and answered in place: the shard fills in the
// answer before its reply, which the caller receives before it reads it.
type query struct {
	// The question: Inspect of key, or (list) List of the keys beginning
	// with key, from pos.
	list                      bool
	key                       string
	pos, limit, budget, named int

	// The answer.
	keys []KeyView
	next int
}

// answer applies q to the table.
func (s *Shard) answer(q *query) {
	if q.list {
		q.keys, q.next = s.table.List(q.key, q.pos, q.limit, q.budget, q.named)
		return
	}
	if v, ok := s.table.Inspect(q.key, q.named); ok {
		q.keys = []KeyView{v}
	}
}

// ask sends q to the shard and waits for its answer, or for ctx.
func (s *Shard) ask(ctx context.Context, q *query) error {
	w := s.getWaiter()
	w.query = q // read by the shard after it receives the message
	if err := s.mb.Send(ctx, message{kind: msgQuery, w: w}); err != nil {
		w.query = nil
		if err != ErrStopped {
			s.putWaiter(w)
		}
		return err
	}
	select {
	case <-w.Value:
	case <-ctx.Done():
		// The reply comes later, to a waiter no one pools again.
		return ctx.Err()
	}
	w.query = nil
	s.putWaiter(w)
	return nil
}

// Inspect returns what the shard holds of key: its holders and at most
// named of its waiters; false when nobody holds it. It is one message to
// the shard, answered after every message sent before it: read-only, it
// changes no lock. It returns ctx's error when ctx ends first, and
// ErrStopped once the group is stopped.
func (s *Shard) Inspect(ctx context.Context, key string, named int) (KeyView, bool, error) {
	q := &query{key: key, named: named}
	if err := s.ask(ctx, q); err != nil {
		return KeyView{}, false, err
	}
	if len(q.keys) == 0 {
		return KeyView{}, false, nil
	}
	return q.keys[0], true, nil
}

// List is [Table.List] on the shard: one message, answered after every
// message sent before it, read-only. It returns ctx's error when ctx ends
// first, and ErrStopped once the group is stopped.
func (s *Shard) List(ctx context.Context, prefix string, pos, limit, budget, named int) ([]KeyView, int, error) {
	q := &query{list: true, key: prefix, pos: pos, limit: limit, budget: budget, named: named}
	if err := s.ask(ctx, q); err != nil {
		return nil, 0, err
	}
	return q.keys, q.next, nil
}

// Time returns the time of a table clock reading (a HolderView's or
// WaiterView's Since): the group's clock is the monotonic time since it
// started.
func (g *Group) Time(since int64) time.Time { return g.start.Add(time.Duration(since)) }

// now is the group's clock: monotonic nanoseconds since it started.
func (g *Group) now() int64 { return int64(time.Since(g.start)) }

// Request is what an acquire asks for beyond its key and Mode, for
// [Shard.AcquireWith]; the shard also reports in it the holder it found.
type Request struct {
	// Shared and Permits: see [Shard.AcquireShared].
	Shared  bool
	Permits int
	// Label is the caller's own label, shown with its wait and its grant.
	Label string

	// Holder is, when HolderSeen, the key's holder the shard found when it
	// refused the request (Try) or withdrew it after its timeout passed:
	// its label, grant time and mode (the oldest holder when the key was
	// held shared; no Token or Permits). Set by AcquireWith.
	Holder     HolderView
	HolderSeen bool
}

// see reports in r the holder w found (see Waiter.Seen). It is a call of
// its own so that its temporaries are not in acquire's frame, which every
// parked waiter keeps on its stack (see bench/README.md, Waiters).
//
//go:noinline
func (r *Request) see(w *waiter) { r.Holder, r.HolderSeen = w.Seen() }

package proptest

import (
	"slices"

	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"

	"tenace.dev/tenace/shard"
)

// sharedReq is a request the shared model keeps: its token, mode and the
// permit count it asked for.
type sharedReq struct {
	token   uint64
	shared  bool
	permits int
}

// sharedKey is the shared model of one key: an exclusive holder, or shared
// holders and their permit count, and a FIFO queue. Like model, the most
// obvious implementation possible.
type sharedKey struct {
	excl    uint64
	holders []uint64 // shared holders, in grant order
	permits int
	queue   []sharedReq
}

// admits is the admission rule: a free key takes anyone; a key held shared
// takes a shared request while a permit is free (0 permits: no limit).
func (k *sharedKey) admits(r sharedReq) bool {
	if k.excl == 0 && len(k.holders) == 0 {
		return true
	}
	return r.shared && k.excl == 0 && (k.permits == 0 || len(k.holders) < k.permits)
}

func (k *sharedKey) grant(r sharedReq) {
	switch {
	case !r.shared:
		k.excl = r.token
	case len(k.holders) == 0:
		k.holders, k.permits = []uint64{r.token}, r.permits
	default:
		k.holders = append(k.holders, r.token)
	}
}

// admitQueue grants from the head of the queue while the head fits, and
// returns the tokens granted, in order.
func (k *sharedKey) admitQueue() []uint64 {
	var granted []uint64
	for len(k.queue) > 0 && k.admits(k.queue[0]) {
		k.grant(k.queue[0])
		granted = append(granted, k.queue[0].token)
		k.queue = k.queue[1:]
	}
	return granted
}

func (k *sharedKey) held() bool { return k.excl != 0 || len(k.holders) > 0 }

// leave ends holder token's grant and admits whom that lets in.
func (k *sharedKey) leave(token uint64) []uint64 {
	if k.excl == token {
		k.excl = 0
	} else {
		k.holders = slices.DeleteFunc(k.holders, func(t uint64) bool { return t == token })
	}
	return k.admitQueue()
}

// sharedMachine drives a Table[int] with exclusive and shared requests of
// several permit counts, against the shared model.
type sharedMachine struct {
	t       *shard.Table[int]
	m       map[string]*sharedKey
	keys    []string
	waiters map[uint64]*shard.Waiter[int]
	helds   map[uint64]*shard.Held[int] // the Held each grant's releases go through
	keyOf   map[uint64]string
	last    uint64
	gone    []uint64 // the grants released, oldest first
}

// NewSharedMachine returns a machine over keys with an empty table and
// model; Actions lists its rapid actions.
func NewSharedMachine(keys []string) *sharedMachine {
	sm := &sharedMachine{t: shard.NewTable[int](), m: map[string]*sharedKey{}, keys: keys,
		waiters: map[uint64]*shard.Waiter[int]{}, helds: map[uint64]*shard.Held[int]{}, keyOf: map[uint64]string{}}
	for _, k := range keys {
		sm.m[k] = &sharedKey{}
	}
	return sm
}

// chain is the tokens of next and the waiters granted with it.
func chain(next *shard.Waiter[int]) []uint64 {
	var out []uint64
	for w := next; w != nil; w = w.Also() {
		out = append(out, w.Token())
	}
	return out
}

func (sm *sharedMachine) request(rt *rapid.T) (string, *shard.Waiter[int], sharedReq) {
	key := rapid.SampledFrom(sm.keys).Draw(rt, "key")
	shared := rapid.Bool().Draw(rt, "shared")
	permits := 0
	if shared {
		permits = rapid.IntRange(0, 3).Draw(rt, "permits")
	}
	w := &shard.Waiter[int]{}
	w.SetShared(shared, permits)
	return key, w, sharedReq{shared: shared, permits: permits}
}

func (sm *sharedMachine) record(rt *rapid.T, key string, w *shard.Waiter[int], r *sharedReq) {
	require.Greater(rt, w.Token(), sm.last, "tokens only go up")
	sm.last, r.token = w.Token(), w.Token()
	sm.waiters[w.Token()], sm.keyOf[w.Token()] = w, key
}

func (sm *sharedMachine) Acquire(rt *rapid.T) {
	key, w, r := sm.request(rt)
	granted := sm.t.Acquire(key, w)
	sm.record(rt, key, w, &r)
	k := sm.m[key]
	if len(k.queue) == 0 && k.admits(r) {
		require.True(rt, granted, "a key that admits the request and has no waiters grants it at once")
		k.grant(r)
		return
	}
	require.False(rt, granted, "a request that does not fit, or has waiters before it, queues")
	require.Equal(rt, shard.Queued, w.State())
	k.queue = append(k.queue, r)
}

func (sm *sharedMachine) TryAcquire(rt *rapid.T) {
	key, w, r := sm.request(rt)
	granted := sm.t.TryAcquire(key, w)
	sm.record(rt, key, w, &r)
	k := sm.m[key]
	if len(k.queue) == 0 && k.admits(r) {
		require.True(rt, granted)
		k.grant(r)
		return
	}
	require.False(rt, granted, "a try never queues nor overtakes a waiter")
	require.Equal(rt, shard.Refused, w.State())
}

// holder draws a current holder, exclusive or shared; ok is false when
// nothing is held.
func (sm *sharedMachine) holder(rt *rapid.T) (key string, token uint64, ok bool) {
	var hs []uint64
	for _, key := range sm.keys {
		k := sm.m[key]
		if k.excl != 0 {
			hs = append(hs, k.excl)
		}
		hs = append(hs, k.holders...)
	}
	if len(hs) == 0 {
		return "", 0, false
	}
	token = rapid.SampledFrom(hs).Draw(rt, "holder")
	return sm.keyOf[token], token, true
}

func (sm *sharedMachine) held(token uint64) *shard.Held[int] {
	h := sm.helds[token]
	if h == nil {
		v := sm.waiters[token].Held()
		h = &v
		sm.helds[token] = h
	}
	return h
}

// Release is a holder's release, as a lease makes it: a CAS first, which
// frees only an exclusive key nobody waits for, then the message.
func (sm *sharedMachine) Release(rt *rapid.T) {
	key, token, ok := sm.holder(rt)
	if !ok {
		return
	}
	k, h := sm.m[key], sm.held(token)
	released, _ := sm.t.ReleaseByCAS(h)
	if k.excl == token && len(k.queue) == 0 {
		require.True(rt, released, "an exclusive holder nobody waits for frees its key by CAS")
		k.leave(token)
		return
	}
	require.False(rt, released, "a shared grant, or a key with waiters, is released by message")
	released, next := sm.t.ReleaseHeld(h)
	require.True(rt, released)
	require.Equal(rt, k.leave(token), chain(next), "the release admits the oldest waiters that fit, in order")
	released, next = sm.t.ReleaseHeld(h)
	require.False(rt, released, "a second release of the same grant gives nothing back")
	require.Nil(rt, next)
	sm.gone = append(sm.gone, token)
}

// ReleaseStale releases, by CAS and then by message, a copy of the Held of
// a grant released earlier: its key may be held again since, by exclusive
// or shared holders, or its entry reaped and made again for another key
// (a Reap between). Neither release changes anything: a Held may be
// copied, and the table, not the Held, knows which grants are current.
func (sm *sharedMachine) ReleaseStale(rt *rapid.T) {
	if len(sm.gone) == 0 {
		return
	}
	token := rapid.SampledFrom(sm.gone).Draw(rt, "released")
	h := sm.waiters[token].Held() // a fresh copy, not the one released
	released, _ := sm.t.ReleaseByCAS(&h)
	require.False(rt, released, "a released grant's copy frees nothing by CAS")
	released, next := sm.t.ReleaseHeld(&h)
	require.False(rt, released, "a released grant's copy gives nothing back")
	require.Nil(rt, next)
}

func (sm *sharedMachine) CancelQueued(rt *rapid.T) {
	var queued []uint64
	for _, key := range sm.keys {
		for _, r := range sm.m[key].queue {
			queued = append(queued, r.token)
		}
	}
	if len(queued) == 0 {
		return
	}
	token := rapid.SampledFrom(queued).Draw(rt, "queued")
	k := sm.m[sm.keyOf[token]]
	removed, next := sm.t.Cancel(sm.waiters[token])
	require.True(rt, removed)
	k.queue = slices.DeleteFunc(k.queue, func(r sharedReq) bool { return r.token == token })
	require.Equal(rt, k.admitQueue(), chain(next), "a cancelled head lets in the waiters it blocked")
}

// CancelGranted is the abort during grant, for an exclusive or a shared
// grant: its permit, or the key, passes on; a second cancel does nothing.
func (sm *sharedMachine) CancelGranted(rt *rapid.T) {
	key, token, ok := sm.holder(rt)
	if !ok {
		return
	}
	w := sm.waiters[token]
	removed, next := sm.t.Cancel(w)
	require.False(rt, removed)
	require.Equal(rt, sm.m[key].leave(token), chain(next), "the raced grant passes on, permits and all")
	removed, next = sm.t.Cancel(w)
	require.False(rt, removed)
	require.Nil(rt, next, "a second cancel of a raced grant gives nothing back")
}

func (sm *sharedMachine) Reap(rt *rapid.T) { sm.t.Reap() }

// Check runs after every action: the table's invariants, and the table
// agreeing with the model — never more shared holders than permits, never
// an exclusive holder beside anyone, the queues in arrival order.
func (sm *sharedMachine) Check(rt *rapid.T) {
	require.NoError(rt, sm.t.CheckInvariants())
	n := 0
	for _, key := range sm.keys {
		k := sm.m[key]
		if k.held() {
			n++
		}
		excl, held := sm.t.Holder(key)
		holders, permits := sm.t.Shared(key)
		require.Equal(rt, k.held(), held, "key %q held", key)
		require.Equal(rt, k.excl, excl, "key %q exclusive holder", key)
		require.Equal(rt, len(k.holders), holders, "key %q shared holders", key)
		require.False(rt, excl != 0 && holders != 0, "key %q: a writer beside readers", key)
		if holders > 0 {
			require.Equal(rt, k.permits, permits, "key %q permits: the first shared holder's", key)
			require.True(rt, permits == 0 || holders <= permits, "key %q: %d holders of %d permits", key, holders, permits)
		}
		var want []uint64
		for _, r := range k.queue {
			want = append(want, r.token)
		}
		require.Equal(rt, want, sm.t.Queue(key), "key %q queue, in arrival order", key)
	}
	require.Equal(rt, n, sm.t.Len())
}

// Actions are the machine's named actions for rapid.T.Repeat.
func (sm *sharedMachine) Actions() map[string]func(*rapid.T) {
	return map[string]func(*rapid.T){
		"acquire":        sm.Acquire,
		"try":            sm.TryAcquire,
		"release":        sm.Release,
		"release-stale":  sm.ReleaseStale,
		"cancel-queued":  sm.CancelQueued,
		"cancel-granted": sm.CancelGranted,
		"reap":           sm.Reap,
		"":               sm.Check,
	}
}

// SharedTableProperty is the table's state-machine property with modes and
// permit counts: any sequence of exclusive and shared acquires and tries
// (permit counts 0 to 3), releases (by CAS and message, and again),
// cancels of queued waiters and of raced grants (exclusive and shared)
// keeps the invariants and agrees with the FIFO model; at the end,
// releasing every holder in turn empties the table.
func SharedTableProperty(rt *rapid.T) {
	sm := NewSharedMachine([]string{"a", "b"})
	rt.Repeat(sm.Actions())
	for _, key := range sm.keys {
		k := sm.m[key]
		for k.held() {
			token := k.excl
			if token == 0 {
				token = k.holders[0]
			}
			h := sm.held(token)
			if released, _ := sm.t.ReleaseByCAS(h); released {
				k.leave(token)
				continue
			}
			_, next := sm.t.ReleaseHeld(h)
			require.Equal(rt, k.leave(token), chain(next))
		}
	}
	require.Zero(rt, sm.t.Len(), "an idle table holds nothing")
	sm.t.Reap()
	require.Zero(rt, sm.t.Entries(), "an idle, reaped table keeps no entry")
	require.NoError(rt, sm.t.CheckInvariants())
}

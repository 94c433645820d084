package proptest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing/synctest"

	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"

	"tenace.dev/tenace"
)

// frame is one Lock an execution was granted: its key, or its set's keys.
type frame struct {
	keys     []string
	released bool
}

// xexec is one execution: a goroutine running nested Lock steps, whose
// innermost fn takes the machine's commands.
type xexec struct {
	id        int
	cmds      chan xcmd
	frames    []*frame // granted and not released, outermost first
	inherited []*frame // the frames of the context it was started from
	want      []string // the Lock it waits for: its key, or its set's keys
	wantSet   bool
	waiting   bool
	done      bool
}

func (x *xexec) String() string { return fmt.Sprintf("x%d", x.id) }

// holds reports whether x holds key through a Lock not released: its own,
// or one of the context it was started from (the same execution).
func (x *xexec) holds(key string) bool {
	for _, f := range slices.Concat(x.frames, x.inherited) {
		if !f.released && slices.Contains(f.keys, key) {
			return true
		}
	}
	return false
}

type xcmdKind uint8

const (
	_       xcmdKind = iota
	cmdNest          // take another Lock inside this one
	cmdRet           // return from the innermost fn: its Lock releases
	cmdKeep          // hand the innermost fn's context to the machine
)

type xcmd struct {
	kind xcmdKind
	keys []string
	set  bool
}

type xeventKind uint8

const (
	_         xeventKind = iota
	evGranted            // a Lock was granted; its fn runs
	evErr                // a Lock returned an error
	evKept               // ctx is the innermost fn's context
	evDone               // the execution's goroutine returned
)

type xevent struct {
	x    *xexec
	kind xeventKind
	err  error
	ctx  context.Context
}

// kept is a context kept from inside a Lock: an execution started from it
// holds what the Locks around it hold, until they release.
type kept struct {
	ctx    context.Context
	frames []*frame
}

// view is what the machine knows of an execution at one moment, for
// judging a *DeadlockError.
type view struct {
	x       *xexec
	waiting bool
	want    []string
	wantSet bool
	held    map[string]bool
}

// execMachine drives executions — goroutines running nested Lock steps on
// one MemoryLockProvider, single keys and sets, with no Timeout — and
// contexts kept past their Lock (context.WithoutCancel, as work that
// outlives a request does). It checks that deadlock detection never hangs
// and never cries wolf:
//   - every *DeadlockError is justified: the execution holds the key it
//     asks for, through a Lock that has not released; or its wait closes a
//     cycle of waits, where a waiting set may hold any of its keys and
//     waits for all of them (the machine cannot tell which were granted),
//     and an execution holds only what its unreleased Locks hold;
//   - nothing hangs: once every execution that is not waiting has returned
//     from all its Locks, nobody may still wait — a cycle left standing is
//     a deadlock the detector missed;
//   - mutual exclusion between the granted Locks, and nothing left held.
type execMachine struct {
	p      *tenace.MemoryLockProvider
	keys   []string
	events chan xevent
	execs  []*xexec
	kept   []kept
	errs   []xevent // *DeadlockErrors of the current action, judged after it
}

func (m *execMachine) views() map[*xexec]view {
	vs := map[*xexec]view{}
	for _, x := range m.execs {
		v := view{x: x, waiting: x.waiting, want: x.want, wantSet: x.wantSet, held: map[string]bool{}}
		for _, k := range m.keys {
			v.held[k] = x.holds(k)
		}
		vs[x] = v
	}
	return vs
}

// act runs one action: mark marks the model (who waits now), do sends the
// command; then the bubble settles, the events are applied, and every
// *DeadlockError is judged against the union of the states before and
// after (an over-approximation: events of one action arrive in an order
// the machine cannot always tell).
func (m *execMachine) act(rt *rapid.T, mark func(), do func()) {
	mark()
	before := m.views()
	do()
	synctest.Wait()
	m.apply(rt)
	after := m.views()
	for _, e := range m.errs {
		m.judge(rt, e, before, after)
	}
	m.errs = m.errs[:0]
}

func (m *execMachine) apply(rt *rapid.T) {
	for {
		select {
		case e := <-m.events:
			x := e.x
			switch e.kind {
			case evGranted:
				require.True(rt, x.waiting, "%v granted while not waiting", x)
				for _, y := range m.execs {
					for _, f := range y.frames {
						for _, k := range x.want {
							if slices.Contains(f.keys, k) {
								rt.Fatalf("%v granted %q while %v holds it", x, k, y)
							}
						}
					}
				}
				x.frames = append(x.frames, &frame{keys: x.want})
				x.waiting, x.want = false, nil
			case evErr:
				require.True(rt, x.waiting, "%v: an error while not waiting: %v", x, e.err)
				var d *tenace.DeadlockError
				require.ErrorAs(rt, e.err, &d, "%v: only a deadlock can fail a Lock here", x)
				m.errs = append(m.errs, e)
				x.waiting = false // want is kept for judge, cleared there
			case evKept:
				m.kept = append(m.kept, kept{ctx: e.ctx, frames: slices.Concat(x.frames, x.inherited)})
			case evDone:
				require.Empty(rt, x.frames, "%v returned holding Locks", x)
				x.done = true
			}
		default:
			return
		}
	}
}

// judge fails the run unless e's *DeadlockError is justified.
func (m *execMachine) judge(rt *rapid.T, e xevent, before, after map[*xexec]view) {
	x := e.x
	want := x.want
	x.want = nil
	var d *tenace.DeadlockError
	errors.As(e.err, &d)
	if len(d.Cycle) == 1 {
		require.True(rt, slices.ContainsFunc(want, func(k string) bool { return before[x].held[k] }),
			"%v: %v, but its execution holds none of %q through a Lock not released", x, e.err, want)
		return
	}
	waits := func(y *xexec) (bool, []string) {
		b, a := before[y], after[y]
		switch {
		case b.waiting:
			return true, b.want
		case a.waiting:
			return true, a.want
		}
		return false, nil
	}
	mayHold := func(y *xexec, k string) bool {
		b, a := before[y], after[y]
		return b.held[k] || a.held[k] || (b.waiting && b.wantSet && slices.Contains(b.want, k)) || (a.waiting && a.wantSet && slices.Contains(a.want, k))
	}
	visited := map[*xexec]bool{x: true}
	var reaches func(y *xexec) bool
	reaches = func(y *xexec) bool {
		ok, ks := waits(y)
		if y == x {
			ok, ks = true, want
		}
		if !ok {
			return false
		}
		for _, k := range ks {
			for _, z := range m.execs {
				if z == y || !mayHold(z, k) {
					continue
				}
				if z == x {
					return true
				}
				if w, _ := waits(z); w && !visited[z] {
					visited[z] = true
					if reaches(z) {
						return true
					}
				}
			}
		}
		return false
	}
	if !reaches(x) {
		rt.Fatalf("%v: %v, but no cycle of waits runs through it (it wants %q)", x, e.err, want)
	}
}

// lock runs a Lock on keys (a set if set) with ctx; its fn takes x's
// commands until told to return.
func (m *execMachine) lock(x *xexec, ctx context.Context, keys []string, set bool) error {
	opts := tenace.LockOptions{Provider: m.p, Key: keys[0]}
	if set {
		opts = tenace.LockOptions{Provider: m.p, Keys: keys}
	}
	return tenace.NewPolicy().WithLock(opts).Execute(ctx, func(ctx context.Context) error {
		m.events <- xevent{x: x, kind: evGranted}
		for c := range x.cmds {
			switch c.kind {
			case cmdNest:
				if err := m.lock(x, ctx, c.keys, c.set); err != nil {
					m.events <- xevent{x: x, kind: evErr, err: err}
				}
			case cmdRet:
				return nil
			case cmdKeep:
				m.events <- xevent{x: x, kind: evKept, ctx: ctx}
			}
		}
		return nil
	})
}

// drawLock draws what a Lock asks for: one key, or a set of two or three.
func (m *execMachine) drawLock(rt *rapid.T) ([]string, bool) {
	if rapid.Bool().Draw(rt, "set") {
		n := rapid.IntRange(2, min(3, len(m.keys))).Draw(rt, "set size")
		return rapid.Permutation(m.keys).Draw(rt, "set keys")[:n], true
	}
	return []string{rapid.SampledFrom(m.keys).Draw(rt, "key")}, false
}

func (m *execMachine) start(rt *rapid.T, parent context.Context, inherited []*frame, keys []string, set bool) *xexec {
	x := &xexec{id: len(m.execs) + 1, cmds: make(chan xcmd, 1), inherited: inherited}
	m.execs = append(m.execs, x)
	m.act(rt, func() { x.want, x.wantSet, x.waiting = keys, set, true }, func() {
		go func() {
			if err := m.lock(x, parent, keys, set); err != nil {
				m.events <- xevent{x: x, kind: evErr, err: err}
			}
			m.events <- xevent{x: x, kind: evDone}
		}()
	})
	return x
}

func (m *execMachine) live() int {
	n := 0
	for _, x := range m.execs {
		if !x.done {
			n++
		}
	}
	return n
}

func (m *execMachine) idle() []*xexec {
	var xs []*xexec
	for _, x := range m.execs {
		if !x.done && !x.waiting && len(x.frames) > 0 {
			xs = append(xs, x)
		}
	}
	return xs
}

// Start starts an execution with a Lock: from the background, or from a
// context kept from inside another Lock (itself, or WithoutCancel of it),
// which may have released since.
func (m *execMachine) Start(rt *rapid.T) {
	if m.live() >= 5 {
		return // a no-op step, not a skip (see providerMachine.heldKey)
	}
	keys, set := m.drawLock(rt)
	parent, inherited := context.Background(), []*frame(nil)
	if len(m.kept) > 0 && rapid.Bool().Draw(rt, "from a kept context") {
		k := rapid.SampledFrom(m.kept).Draw(rt, "kept")
		parent, inherited = k.ctx, k.frames
		if rapid.Bool().Draw(rt, "WithoutCancel") {
			parent = context.WithoutCancel(parent)
		}
	}
	m.start(rt, parent, inherited, keys, set)
}

// Nest makes an execution that holds Locks ask for another inside them.
func (m *execMachine) Nest(rt *rapid.T) {
	xs := m.idle()
	if len(xs) == 0 {
		return
	}
	x := rapid.SampledFrom(xs).Draw(rt, "nest in")
	keys, set := m.drawLock(rt)
	m.act(rt, func() { x.want, x.wantSet, x.waiting = keys, set, true }, func() {
		x.cmds <- xcmd{kind: cmdNest, keys: keys, set: set}
	})
}

// Return makes an execution return from its innermost Lock, which
// releases.
func (m *execMachine) Return(rt *rapid.T) {
	xs := m.idle()
	if len(xs) == 0 {
		return
	}
	m.ret(rt, rapid.SampledFrom(xs).Draw(rt, "return"))
}

func (m *execMachine) ret(rt *rapid.T, x *xexec) {
	m.act(rt, func() {
		f := x.frames[len(x.frames)-1]
		x.frames = x.frames[:len(x.frames)-1]
		f.released = true
	}, func() { x.cmds <- xcmd{kind: cmdRet} })
}

// Keep keeps the context of an execution's innermost Lock, for Start.
func (m *execMachine) Keep(rt *rapid.T) {
	xs := m.idle()
	if len(xs) == 0 || len(m.kept) >= 4 {
		return
	}
	x := rapid.SampledFrom(xs).Draw(rt, "keep")
	m.act(rt, func() {}, func() { x.cmds <- xcmd{kind: cmdKeep} })
}

// PartlyGrantedCycle builds the cycle through a set that holds part of its
// keys: F holds b; E's set {b, a} takes a and waits for b; F asks for a.
// One of them must get a *DeadlockError (judged like any other); without
// one, both wait forever, and drain reports it.
func (m *execMachine) PartlyGrantedCycle(rt *rapid.T) {
	if m.live() > 3 {
		return
	}
	var free []string
	for _, k := range m.keys {
		if !slices.ContainsFunc(m.execs, func(x *xexec) bool { return x.holds(k) || (x.waiting && slices.Contains(x.want, k)) }) {
			free = append(free, k)
		}
	}
	if len(free) < 2 {
		return
	}
	ab := rapid.Permutation(free).Draw(rt, "a and b")[:2]
	a, b := min(ab[0], ab[1]), max(ab[0], ab[1])
	f := m.start(rt, context.Background(), nil, []string{b}, false)
	m.start(rt, context.Background(), nil, []string{b, a}, true)
	if f.waiting || f.done {
		return
	}
	m.act(rt, func() { f.want, f.wantSet, f.waiting = []string{a}, false, true }, func() {
		f.cmds <- xcmd{kind: cmdNest, keys: []string{a}}
	})
}

// drain returns every execution from its Locks; nobody may be left
// waiting, and nothing held.
func (m *execMachine) drain(rt *rapid.T) {
	for {
		if xs := m.idle(); len(xs) > 0 {
			m.ret(rt, xs[0])
			continue
		}
		var waiting []*xexec
		for _, x := range m.execs {
			if x.waiting {
				waiting = append(waiting, x)
			}
		}
		if len(waiting) > 0 {
			rt.Fatalf("deadlock not detected: %v wait, and no execution holds a Lock it could return from", waiting)
		}
		if m.live() == 0 {
			break
		}
		synctest.Wait()
		m.apply(rt)
		if len(m.idle()) == 0 && m.live() > 0 {
			rt.Fatalf("executions neither waiting nor holding, yet not returned")
		}
	}
	require.Zero(rt, m.p.Size(), "nothing left held")
}

// ExecutionProperty: executions drawn by rapid nest Locks on single keys
// and sets of keys, return from them, and start from contexts kept past
// their Lock, with no Timeout anywhere; deadlock detection must never hang
// and never cry wolf (see execMachine). It must run inside a
// testing/synctest bubble; it makes its provider there.
func ExecutionProperty(rt *rapid.T) {
	m := &execMachine{
		keys:   []string{"a", "b", "c", "d"}[:rapid.IntRange(2, 4).Draw(rt, "keys")],
		events: make(chan xevent, 1024),
	}
	shards := rapid.IntRange(1, 3).Draw(rt, "shards")
	// No draw between here and the defer (see SetProperty).
	m.p = tenace.NewMemoryLockProvider(tenace.WithShards(shards))
	defer func() {
		// Unblock whatever is left (a failed run), then stop.
		for _, x := range m.execs {
			close(x.cmds)
		}
		require.NoError(rt, m.p.Close())
		synctest.Wait()
	}()
	rt.Repeat(map[string]func(*rapid.T){
		"start":  m.Start,
		"nest":   m.Nest,
		"return": m.Return,
		"keep":   m.Keep,
		"cycle":  m.PartlyGrantedCycle,
		"":       func(*rapid.T) {},
	})
	m.drain(rt)
}

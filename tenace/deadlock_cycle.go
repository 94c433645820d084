package tenace

import (
	"context"
	"slices"

	"tenace.dev/tenace/actor"
)

// Cycles between executions. A Lock that waits while its execution holds
// keys of a provider, or a set (LockOptions.Keys) that waits while it holds
// keys it was granted already, is a "holding waiter": only such a caller can
// close a cycle of waits (A holds k1 and waits for k2 while B holds k2 and
// waits for k1), since every member of a cycle holds a key another waits for
// and waits itself. A provider that implements DeadlockDetectingProvider
// has a DeadlockDetector — one goroutine, an actor that alone owns the
// wait-for graph — and a holding waiter tells it what it holds and what it
// waits for before it asks for a key, and that it no longer waits once its
// acquire has returned (in a defer: a provider's Acquire that panics leaves
// no node behind). A set that is not granted at its first try, which the
// Lock step then acquires one key at a time in sorted order, reports each key it was granted before it asks for
// the next: the keys it holds while it waits count as held, also when its
// execution holds nothing else.
//
// The detector checks, each time a node arrives or a set's node is granted
// a key, whether a path of waits leads from that node back to itself. An
// edge only comes with an arrival or a grant (a release only takes edges
// away), so the event that closes a cycle is the last the detector sees of
// it, and the check it runs finds it. It breaks the cycle by ending that
// waiter's acquire (the context the Lock gave the provider, with a
// *DeadlockError as its cause): its Lock returns the *DeadlockError,
// releasing what its set was granted, and the others go on once its
// execution gives back what it holds.
//
// A set waits for every key it has not been granted yet, not only the one it
// is queued for: it gives back none of its keys until it has them all, so
// what holds one of the later keys blocks it as surely.
//
// A caller that holds nothing while it waits never reaches the detector: the
// Lock step finds no held key in its context (the same ctx.Value it makes
// for the reentrance check) and acquires with its own context.
//
// The graph is a snapshot of waits that may have ended a moment ago: a
// waiter whose timeout or cancel ended its wait at the very moment the cycle
// closed is still in it, and the cycle is reported though that give-up was
// about to break it. What a node holds through an enclosing Lock is read
// when the detector walks: a Lock that has released (while a goroutine of
// its execution still waits) holds nothing from then on.

// DeadlockDetector is a provider's graph of the waits between the
// executions of the process that take its keys through Lock steps: the
// Lock step reports to it every wait that holds something (see
// DeadlockDetectingProvider), and it fails the wait that closes a cycle
// with a *DeadlockError. A MemoryLockProvider has one; a provider author
// whose provider waits in the process can give theirs one too, made with
// NewDeadlockDetector.
//
// Concurrency: the graph is owned by one goroutine; Lock steps only send it
// messages. A waiter's messages come from its own goroutine, in order, so a
// node leaves after it arrived.
type DeadlockDetector struct {
	mb      *actor.Actor[cycleMsg]
	holders map[string][]*waitNode // key → the nodes that hold it, or may
}

// NewDeadlockDetector starts a detector: one goroutine, which Close stops.
func NewDeadlockDetector() *DeadlockDetector { return newDeadlockDetector(nil) }

func newDeadlockDetector(spawn func(loop func())) *DeadlockDetector {
	d := &DeadlockDetector{holders: map[string][]*waitNode{}}
	d.mb = actor.Start(d.handle, actor.Options[cycleMsg]{Go: spawn})
	return d
}

// Close stops the detector's goroutine and returns once it has exited.
// Waits that begin afterwards are not checked. It is idempotent.
func (d *DeadlockDetector) Close() { d.mb.Stop() }

// DeadlockDetectingProvider is the optional interface of a provider whose
// waits a Lock step checks for cycles between executions: the Lock step
// tells DeadlockDetector() what each holding waiter holds and waits for
// (see DeadlockError). MemoryLockProvider implements it. A wrapper around
// a provider that passes keys through unchanged keeps detection by
// forwarding the method; keys taken through the wrapper and through the
// provider itself then count as one lock space, as they are. A wrapper that
// changes keys (a prefix, say) must not forward it.
//
// With a detector, a Lock with LockOptions.Keys first tries the whole set
// once (AcquireAll with NoWait: a try never waits, so it closes no cycle);
// if that is not granted, it acquires the set one key at a time in sorted
// order through Acquire, as AcquireAll's generic path does, so that the
// detector sees each grant. A NoWait Lock only tries.
type DeadlockDetectingProvider interface {
	LockProvider
	// DeadlockDetector returns the provider's detector, the same on every
	// call; nil turns detection off.
	DeadlockDetector() *DeadlockDetector
}

// detectorOf is p's detector, or nil.
func detectorOf(p LockProvider) *DeadlockDetector {
	if dp, ok := p.(DeadlockDetectingProvider); ok {
		return dp.DeadlockDetector()
	}
	return nil
}

// sameLocks reports whether a and b hand out the same locks: the same
// provider, or two that report to the same detector (a wrapper that
// forwards it, and the provider).
func sameLocks(a, b LockProvider) bool {
	if sameProvider(a, b) {
		return true
	}
	d := detectorOf(a)
	return d != nil && d == detectorOf(b)
}

// waitNode is one holding waiter, owned by the detector once sent.
type waitNode struct {
	locks []*lockCtx // the enclosing Locks of its execution on the provider
	// keys is what it asks for, in the order acquired: one key, or a set's
	// keys; it holds keys[:granted] and waits for keys[granted:].
	keys    []string
	granted int
	cancel  context.CancelCauseFunc
}

// indexed returns the keys under which n is indexed in the detector's
// holders: what its execution held when it arrived (some may be released
// since, see holds), and, for a set, every key of the set.
func (n *waitNode) indexed() []string {
	var ks []string
	for _, h := range n.locks {
		ks = append(ks, h.keys()...)
	}
	if len(n.keys) > 1 {
		ks = append(ks, n.keys...)
	}
	return ks
}

// holds reports whether n holds key now: granted to its set, or held
// through an enclosing Lock that has not released it.
func (n *waitNode) holds(key string) bool {
	if slices.Contains(n.keys[:n.granted], key) {
		return true
	}
	for _, h := range n.locks {
		if !h.released.Load() && slices.Contains(h.keys(), key) {
			return true
		}
	}
	return false
}

type cycleMsgKind uint8

const (
	_           cycleMsgKind = iota // the zero kind is invalid
	cycleArrive                     // n starts to wait
	cycleGrant                      // n's set was granted its keys up to granted
	cycleLeave                      // n's acquire returned
)

type cycleMsg struct {
	kind    cycleMsgKind
	n       *waitNode
	granted int // cycleGrant: n.keys[:granted] are granted
}

func (d *DeadlockDetector) handle(batch []cycleMsg) {
	for _, m := range batch {
		switch m.kind {
		case cycleArrive:
			for _, k := range m.n.indexed() {
				d.holders[k] = append(d.holders[k], m.n)
			}
			d.check(m.n)
		case cycleGrant:
			m.n.granted = m.granted
			d.check(m.n)
		case cycleLeave:
			for _, k := range m.n.indexed() {
				hs := slices.DeleteFunc(d.holders[k], func(x *waitNode) bool { return x == m.n })
				if len(hs) == 0 {
					delete(d.holders, k)
				} else {
					d.holders[k] = hs
				}
			}
		default:
			panic("tenace: internal error: cycle message of unknown kind")
		}
	}
}

// check fails n's wait if it closes a cycle.
func (d *DeadlockDetector) check(n *waitNode) {
	if cycle := d.cycleFrom(n); cycle != nil {
		n.cancel(&DeadlockError{Key: cycle[0], Cycle: cycle})
	}
}

// cycleFrom returns the keys of a cycle of waits through start, in the order
// of the waits (start's key first), or nil: a depth-first search over the
// edges "n waits for a key that m holds".
func (d *DeadlockDetector) cycleFrom(start *waitNode) []string {
	visited := map[*waitNode]bool{start: true}
	var path []string
	var walk func(n *waitNode) bool
	walk = func(n *waitNode) bool {
		for _, k := range n.keys[n.granted:] {
			for _, m := range d.holders[k] {
				if !m.holds(k) {
					continue
				}
				path = append(path, k)
				if m == start {
					return true
				}
				if !visited[m] {
					visited[m] = true
					if walk(m) {
						return true
					}
				}
				path = path[:len(path)-1]
			}
		}
		return false
	}
	if walk(start) {
		return path
	}
	return nil
}

// cycleWatch is a waiter's side: before each key it asks for, it tells the
// detector what it holds (arriving the first time it holds something), and
// leave ends it.
type cycleWatch struct {
	d     *DeadlockDetector
	locks []*lockCtx // the enclosing Locks of its execution on the provider
	keys  []string   // in the order acquired
	ctx   context.Context
	n     *waitNode       // nil until it arrived
	wctx  context.Context // once it arrived: ctx, or ended by the detector
}

// watchCycles returns the watch of a wait for keys (one key, or a set's in
// sorted order) from p, with ctx, by an execution whose nearest enclosing
// Lock is outer (nil: none). Without a detector its before returns ctx.
func watchCycles(ctx context.Context, outer *lockCtx, p LockProvider, keys []string) cycleWatch {
	w := cycleWatch{d: detectorOf(p), keys: keys, ctx: ctx}
	if w.d == nil {
		return w
	}
	for h := outer; h != nil; h, _ = h.Context.Value(lockCtxKey{}).(*lockCtx) {
		if !h.released.Load() && sameLocks(h.provider, p) {
			w.locks = append(w.locks, h)
		}
	}
	return w
}

// before is called before the acquire of keys[granted], with the keys
// before it granted; it returns the context to acquire with.
func (w *cycleWatch) before(granted int) context.Context {
	switch {
	case w.d == nil:
		return w.ctx
	case w.n != nil:
		_ = w.d.mb.Send(w.ctx, cycleMsg{kind: cycleGrant, n: w.n, granted: granted}) // failed: closed or ctx ended, which the acquire reports
		return w.wctx
	case granted == 0 && len(w.locks) == 0:
		return w.ctx // holds nothing: cannot close a cycle
	}
	wctx, cancel := context.WithCancelCause(w.ctx)
	n := &waitNode{locks: w.locks, keys: w.keys, granted: granted, cancel: cancel}
	if w.d.mb.Send(w.ctx, cycleMsg{kind: cycleArrive, n: n}) != nil {
		cancel(nil)
		w.d = nil // closed or ctx ended: the acquire reports it
		return w.ctx
	}
	w.n, w.wctx = n, wctx
	return wctx
}

// leave tells the detector the wait is over, and returns the
// *DeadlockError that ended it, if the detector did.
func (w *cycleWatch) leave() *DeadlockError {
	if w.n == nil {
		return nil
	}
	// Never gives up: a node that stayed would be a holder forever. It
	// blocks only while the mailbox is full; after Close it fails at once,
	// and the graph is gone with the detector.
	_ = w.d.mb.Send(context.Background(), cycleMsg{kind: cycleLeave, n: w.n})
	d, _ := context.Cause(w.wctx).(*DeadlockError)
	w.n.cancel(nil)
	w.n = nil
	return d
}

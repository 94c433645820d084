package tenace

import (
	"context"
	"slices"

	"tenace.dev/tenace/actor"
)

// Cycles between executions. A Lock whose execution already holds keys of a
// MemoryLockProvider, and asks it for more, is a "holding waiter": only such
// a caller can close a cycle of waits (A holds k1 and waits for k2 while B
// holds k2 and waits for k1), since every member of a cycle holds a key
// another waits for and waits itself. A holding waiter tells the provider's
// cycle detector — one goroutine per provider, an actor that alone owns the
// wait-for graph — what it holds and what it waits for before it asks for
// the key, and that it no longer waits once its acquire has returned. The
// detector checks, as each holding waiter arrives, whether a path of waits
// leads from it back to itself; the arrival that closes a cycle is the last
// of its members to arrive, so the detector has seen all the others. It
// breaks the cycle by ending that waiter's acquire (the context the Lock
// gave the provider, with a *DeadlockError as its cause): its Lock returns
// the *DeadlockError, releasing nothing it did not take, and the others go
// on once its execution gives back what it holds.
//
// A caller that holds nothing while it waits never reaches the detector: the
// Lock step finds no held key in its context (the same ctx.Value it makes
// for the reentrance check) and acquires as before.
//
// The graph is a snapshot of waits that may have ended a moment ago: a
// waiter whose timeout or cancel ended its wait at the very moment the cycle
// closed is still in it, and the cycle is reported though that give-up was
// about to break it. Every waiter of a reported cycle was waiting for a key
// another of them held.

// waitNode is one holding waiter, owned by the detector once sent.
type waitNode struct {
	held   []*heldCtx // the Locks of its execution that hold keys of the provider
	waits  []string   // the key it asks for, or the keys of a set
	cancel context.CancelCauseFunc
}

// keys returns the keys n's execution held on the provider when it arrived;
// some may have been released since (see holds).
func (n *waitNode) keys() []string {
	var ks []string
	for _, h := range n.held {
		ks = append(ks, h.heldKeys()...)
	}
	return ks
}

// holds reports whether n's execution holds key now: through a Lock that
// has not released it. A Lock releases while a goroutine of its execution
// still waits (one started with context.WithoutCancel); from then on that
// waiter holds nothing through it.
func (n *waitNode) holds(key string) bool {
	for _, h := range n.held {
		if !h.released.Load() && slices.Contains(h.heldKeys(), key) {
			return true
		}
	}
	return false
}

type cycleMsgKind uint8

const (
	_           cycleMsgKind = iota // the zero kind is invalid
	cycleArrive                     // n starts to wait
	cycleLeave                      // n's acquire returned
)

type cycleMsg struct {
	kind cycleMsgKind
	n    *waitNode
}

// cycleDetector is a provider's wait-for graph, on an actor.
//
// Concurrency: holders is owned by the actor's loop; holding waiters only
// send messages. Their two sends come from the same goroutine, in order,
// so a node leaves after it arrived.
type cycleDetector struct {
	mb      *actor.Actor[cycleMsg]
	holders map[string][]*waitNode // key → the waiting nodes that hold it
}

func newCycleDetector(spawn func(loop func())) *cycleDetector {
	d := &cycleDetector{holders: map[string][]*waitNode{}}
	d.mb = actor.Start(d.handle, actor.Options[cycleMsg]{Go: spawn})
	return d
}

func (d *cycleDetector) stop() { d.mb.Stop() }

func (d *cycleDetector) handle(batch []cycleMsg) {
	for _, m := range batch {
		switch m.kind {
		case cycleArrive:
			for _, k := range m.n.keys() {
				d.holders[k] = append(d.holders[k], m.n)
			}
			if cycle := d.cycleFrom(m.n); cycle != nil {
				m.n.cancel(&DeadlockError{Key: cycle[0], Cycle: cycle})
			}
		case cycleLeave:
			for _, k := range m.n.keys() {
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

// cycleFrom returns the keys of a cycle of waits through start, in the order
// of the waits (start's key first), or nil: a depth-first search over the
// edges "n waits for a key that m holds".
func (d *cycleDetector) cycleFrom(start *waitNode) []string {
	visited := map[*waitNode]bool{start: true}
	var path []string
	var walk func(n *waitNode) bool
	walk = func(n *waitNode) bool {
		for _, k := range n.waits {
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

// cycleWatch is a holding waiter's side: arrive before the acquire, leave
// after it.
type cycleWatch struct {
	d *cycleDetector
	n *waitNode
}

// watchCycles returns the context to acquire with, and the watch to end
// with leave, when h's execution holds keys of p and p detects cycles;
// else ctx and a zero watch.
func watchCycles(ctx context.Context, h *heldCtx, p LockProvider, key string, keys []string) (context.Context, cycleWatch) {
	mp, ok := p.(*MemoryLockProvider)
	if !ok || h == nil || mp.cycles == nil {
		return ctx, cycleWatch{}
	}
	var held []*heldCtx
	for ; h != nil; h, _ = h.Context.Value(heldKey{}).(*heldCtx) {
		if !h.released.Load() && sameProvider(h.provider, p) {
			held = append(held, h)
		}
	}
	if len(held) == 0 {
		return ctx, cycleWatch{}
	}
	waits := keys
	if waits == nil {
		waits = []string{key}
	}
	wctx, cancel := context.WithCancelCause(ctx)
	n := &waitNode{held: held, waits: waits, cancel: cancel}
	if mp.cycles.mb.Send(ctx, cycleMsg{kind: cycleArrive, n: n}) != nil {
		cancel(nil)
		return ctx, cycleWatch{} // closed or ctx ended: the acquire reports it
	}
	return wctx, cycleWatch{d: mp.cycles, n: n}
}

// leave tells the detector the wait is over, and returns the
// *DeadlockError that ended it, if the detector did.
func (w cycleWatch) leave(wctx context.Context) *DeadlockError {
	if w.d == nil {
		return nil
	}
	// Never gives up: a node that stayed would be a holder forever. It
	// blocks only while the mailbox is full; after Stop it fails at once,
	// and the graph is gone with the detector.
	_ = w.d.mb.Send(context.Background(), cycleMsg{kind: cycleLeave, n: w.n})
	d, _ := context.Cause(wctx).(*DeadlockError)
	w.n.cancel(nil)
	return d
}

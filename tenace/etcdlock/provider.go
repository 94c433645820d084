package etcdlock

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/connectivity"

	"tenace.dev/tenace"
	"tenace.dev/tenace/clock"
	"tenace.dev/tenace/internal/keyfmt"
	"tenace.dev/tenace/internal/noreply"
	"tenace.dev/tenace/internal/provkit"
)

// Defaults.
const (
	// DefaultWindow is the TTL of the etcd lease behind each grant: a holder
	// that dies, or stops reaching the cluster, frees the key within it.
	DefaultWindow = 15 * time.Second
	// DefaultPrefix namespaces the lock keys in etcd.
	DefaultPrefix = "tenace/lock/"
	// MaxMargin bounds the margin by which a lease reports its loss before
	// the expiry etcd was last told (see WithWindow).
	MaxMargin = time.Second
)

// Provider is a tenace.LockProvider on etcd. It is safe for concurrent use;
// create it with New and Close it when done. It does not own the client:
// close the client after the provider.
//
// Goroutines: one per lease, held or waited for, from its first keepalive
// on (its keeper, started a renewal interval or less after the grant),
// and the client's own (gRPC, watches).
type Provider struct {
	client   *clientv3.Client
	prefix   string
	ttl      time.Duration // default cap of a hold; 0: none
	window   time.Duration
	interval time.Duration // 0 until New settles it
	owner    string        // recorded in every entry's value (WithOwner)

	held    atomic.Int64
	waiting atomic.Int64
	// sharedHeld and sharedWaiting: those of held and waiting that are
	// shared (a reader's, a bulkhead's)
	sharedHeld, sharedWaiting atomic.Int64
	longest                   atomic.Int64

	closed    context.Context // ends at Close; its cause is tenace.ErrProviderClosed
	close     context.CancelCauseFunc
	mu        sync.Mutex // guards leases, isClosed and queues
	leases    map[*lease]struct{}
	isClosed  bool
	queues    map[string]int
	keysWith  []int // keysWith[n]: keys with n queued waiters
	endedOnce sync.Once
	bg        sync.WaitGroup // keepers of leases and background revokes

	// The spare etcd lease, granted ahead of need (see takeSpare); under mu.
	spare     *clientv3.LeaseGrantResponse
	spareSent time.Time // when its grant was sent
	refilling bool      // a grant of the next spare is in flight

	beforeWatch func(rev int64) // a test hook (see SetBeforeWatch); nil otherwise
	// beforeTry, a test hook (see SetBeforeTry), runs at each try of the
	// queueing ("queue") and of a release's delete ("release"), with the
	// try's context and its number from 1; nil otherwise
	beforeTry func(ctx context.Context, req string, try int32)
}

var (
	_ tenace.LockProvider  = (*Provider)(nil)
	_ tenace.StatsProvider = (*Provider)(nil)

	_ tenace.SharedLockProvider = (*Provider)(nil)
)

// Option configures New.
type Option interface{ apply(*Provider) }

type optionFunc func(*Provider)

func (f optionFunc) apply(p *Provider) { f(p) }

// WithTTL sets the default cap of a hold, used when the call gives no TTL
// (by default none: held until Release or a loss). It panics if d is not
// positive.
func WithTTL(d time.Duration) Option {
	return optionFunc(provkit.Duration(d, time.Nanosecond, "etcdlock.WithTTL: the TTL must be positive", func(p *Provider, d time.Duration) { p.ttl = d }))
}

// WithWindow sets the TTL of the etcd lease behind each grant (DefaultWindow),
// rounded up to whole seconds as etcd keeps it; etcd may raise it to its own
// minimum (1.5 × the election timeout, 2s with etcd's defaults). A holder
// that dies frees the key within one window; a lease whose keepalives fail
// is reported lost a margin — a quarter of the window, at most MaxMargin —
// before the expiry etcd was last told (measured from before that keepalive
// was sent). It panics if d is under a second.
func WithWindow(d time.Duration) Option {
	return optionFunc(provkit.Duration(d, time.Second, "etcdlock.WithWindow: the window must be at least 1s (etcd keeps lease TTLs in seconds)", func(p *Provider, d time.Duration) { p.window = d }))
}

// WithRenewInterval sets how often a lease is kept alive; by default a third
// of the window. New panics if it is not below the window less its margin;
// WithRenewInterval panics if d is not positive.
func WithRenewInterval(d time.Duration) Option {
	return optionFunc(provkit.Duration(d, time.Nanosecond, "etcdlock.WithRenewInterval: the interval must be positive", func(p *Provider, d time.Duration) { p.interval = d }))
}

// WithPrefix sets the namespace of the lock keys (DefaultPrefix). Every
// process that locks the same keys must use the same prefix.
func WithPrefix(prefix string) Option {
	return optionFunc(func(p *Provider) { p.prefix = prefix })
}

// New returns a provider on client. It panics if client is nil.
func New(client *clientv3.Client, opts ...Option) *Provider {
	if client == nil {
		panic("tenace: etcdlock.New: nil client")
	}
	p := &Provider{client: client, prefix: DefaultPrefix, window: DefaultWindow, leases: map[*lease]struct{}{}, queues: map[string]int{}}
	for _, o := range opts {
		o.apply(p)
	}
	if p.owner == "" {
		p.owner = tenace.DefaultOwner()
	}
	p.window = (p.window + time.Second - 1).Truncate(time.Second) // etcd's whole seconds, rounded up
	if p.interval == 0 {
		p.interval = p.window / 3
	}
	if p.interval >= p.window-margin(p.window) {
		panic(fmt.Sprintf("tenace: etcdlock.New: the renewal interval (%v) must be below the window less its margin (%v)", p.interval, p.window-margin(p.window)))
	}
	p.closed, p.close = context.WithCancelCause(context.Background())
	return p
}

// margin is how long before the expiry etcd was told a lease reports its
// loss: a quarter of the window, at most MaxMargin. It covers a loss timer
// that fires late on a loaded machine, and the keepalive call that must
// return at its deadline.
func margin(window time.Duration) time.Duration { return min(window/4, MaxMargin) }

// ErrUnreachable is wrapped by the error Acquire returns at once when the
// client's connection to the cluster is in TRANSIENT_FAILURE: no member
// could be reached at its last try.
var ErrUnreachable = errors.New("etcdlock: no etcd member can be reached; check the client's endpoints and that the cluster runs")

// errClosed is what Acquire returns on a closed provider.
var errClosed = fmt.Errorf("%w (etcdlock.Provider.Close was called)", tenace.ErrProviderClosed)

// dir is the etcd prefix of key's queue: every waiter and the holder have a
// key under it. The key is escaped so that it contains no "/" (as "%2F",
// and "%" as "%25"): no key's queue lies inside another's.
func (p *Provider) dir(key string) string {
	return p.prefix + escaper.Replace(key) + "/"
}

var escaper = strings.NewReplacer("%", "%25", "/", "%2F")

// Acquire waits for key and returns its lease: a lease when granted; (nil,
// nil) when etcd said the key is held (for a shared caller, with
// opts.Shared: held by a writer, or with every permit taken, or with a
// writer waiting ahead; see "Shared locks and permits" in the package doc)
// and the wait ran out of opts.Timeout
// (at once with NoWait); (nil, ctx's error) when ctx ends first; (nil, err)
// when etcd fails, cannot be reached (ErrUnreachable, at once), does not
// answer within the Timeout (an error wrapping tenace.ErrNoReply: see the
// package doc), or the provider is closed (an
// error wrapping tenace.ErrProviderClosed). Invalid input returns an error
// wrapping tenace.ErrMissingKey or tenace.ErrInvalidOption. A nil ctx
// panics.
//
// When it returns no lease, the caller's queue entry is revoked before it
// returns if etcd answers (within 10ms past a Timeout, 1s otherwise; else
// the revoke goes on in the background, bounded by 5s); if etcd never
// answers it, keepalives have stopped and the entry lapses within one
// window.
func (p *Provider) Acquire(ctx context.Context, key string, opts tenace.LockAcquireOptions) (tenace.LockLease, error) {
	if ctx == nil {
		panic("tenace: etcdlock.Provider.Acquire: nil ctx")
	}
	if err := tenace.ValidateAcquire(key, opts); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if p.closed.Err() != nil {
		return nil, errClosed
	}
	// The wait context, wctx, ends with ctx, the Timeout (if any) and
	// Close.
	base, actx := ctx, ctx
	if opts.Timeout > 0 {
		var cancel context.CancelFunc
		actx, cancel = tenace.AcquireContext(ctx, opts)
		defer cancel()
		base = actx
	}
	if opts.Timeout > 0 && !clock.IsSystem(opts.Clock) {
		// actx's deadline is on opts.Clock, and gRPC would take it for a
		// real one (with a clock behind real time every call would time
		// out at once): the calls get ctx's deadline, and end with actx.
		call, cancelCall := context.WithCancelCause(ctx)
		stop := context.AfterFunc(actx, func() { cancelCall(context.Cause(actx)) })
		defer func() { stop(); cancelCall(nil) }()
		base = call
	}
	wctx, wcancel := context.WithCancelCause(base)
	defer wcancel(nil)
	stop := context.AfterFunc(p.closed, func() { wcancel(tenace.ErrProviderClosed) })
	defer stop()

	a := &attempt{p: p, ctx: ctx, wctx: wctx, first: wctx, key: key, opts: opts, sent: time.Now()}
	if d, ok := actx.Deadline(); ok && opts.Timeout > 0 && clock.IsSystem(opts.Clock) {
		// The lease grant and the queueing transaction may bring their
		// reply noreply.LateReply past the Timeout: a reply that says "held"
		// then gives (nil, nil), none gives ErrNoReply (see failed).
		first, cancelFirst := context.WithDeadline(ctx, d.Add(noreply.LateReply))
		stopFirst := context.AfterFunc(p.closed, cancelFirst)
		a.first = first
		peek := func() {}
		if opts.Timeout < noreply.Grace {
			peek = a.peekNow()
		}
		defer func() {
			stopFirst()
			cancelFirst()
			peek()
		}()
	}
	if err := p.reach(wctx); err != nil {
		if errors.Is(err, ErrUnreachable) {
			if cerr := ctx.Err(); cerr != nil {
				return nil, cerr // the caller's ctx ended first: its error, as always
			}
			return nil, fmt.Errorf("%w (acquiring %s)", err, keyfmt.Quote(key)) // wraps the dial's error, if any
		}
		return a.failed(fmt.Errorf("etcdlock: connecting to etcd for %s: %w", keyfmt.Quote(key), err))
	}
	l, err := a.run()
	if a.endReads != nil {
		a.endReads()
	}
	if l == nil && a.l != nil {
		a.l.abandon(a.abandonWait())
	}
	if l == nil && err == nil && opts.OnHeld != nil {
		a.onHeld(opts.OnHeld)
	}
	return l, err
}

// abandonWait is how long an Acquire that gives up waits for etcd to take it
// out of the queue: as long as the revoke takes (at most giveUpWait) when
// etcd answered its last request, so that the next caller finds the key as
// the caller left it; not at all when etcd did not answer (the revoke goes on
// in the background, bounded by provkit.CleanupTimeout); and within the 50ms
// the Timeout's bound allows when the Timeout ended the wait.
func (a *attempt) abandonWait() time.Duration {
	switch {
	case !a.replied:
		return 0
	case tenace.TimedOut(a.ctx, a.wctx):
		return timeoutSlack
	default:
		return giveUpWait
	}
}

// giveUpWait bounds the wait of an Acquire that gives up for its revoke,
// when etcd answered its last request (see abandonWait).
const giveUpWait = time.Second

// timeoutSlack is how long past its Timeout an Acquire may wait for its
// revoke: within the bound of Timeout + 50ms.
const timeoutSlack = 10 * time.Millisecond

// reach returns once the client's connection is ready, or ErrUnreachable
// when no member can be reached: the etcd client sends its requests with
// gRPC's WaitForReady, so that without this check a request to a cluster
// that is down waits for ctx instead of failing. A connection in
// TRANSIENT_FAILURE (its last dials failed) dials again at once, and gets
// reconnectWait to succeed; an idle one is woken and waited for within ctx
// (a member that accepts connections and does not answer keeps it
// connecting: the Timeout then reports ErrNoReply).
func (p *Provider) reach(ctx context.Context) error {
	conn := p.client.ActiveConnection()
	redialed := false
	for {
		st := conn.GetState()
		wctx := ctx
		switch st {
		case connectivity.Ready:
			return nil
		case connectivity.Shutdown:
			return errors.New("etcdlock: the etcd client is closed; close the provider before its client")
		case connectivity.Idle:
			conn.Connect()
		case connectivity.TransientFailure:
			if redialed {
				return ErrUnreachable
			}
			if err := p.refused(ctx); err != nil {
				return fmt.Errorf("%w: %w", ErrUnreachable, err)
			}
			redialed = true
			conn.ResetConnectBackoff()
			var cancel context.CancelFunc
			wctx, cancel = context.WithTimeout(ctx, reconnectWait)
			defer cancel()
		}
		if !conn.WaitForStateChange(wctx, st) {
			if ctx.Err() != nil && st != connectivity.TransientFailure {
				return ctx.Err()
			}
			// Still in TRANSIENT_FAILURE: its redial failed, or the
			// Timeout (or ctx) ended before it could succeed, and no
			// member was reached meanwhile: an outage, never a held key.
			return ErrUnreachable
		}
	}
}

// refused dials every endpoint of the client itself (TCP, or a Unix
// socket; no TLS, no gRPC: only whether anything accepts a connection) and
// returns the first dial's error when every dial failed other than by a
// timeout — every member refuses connections or cannot be reached: the
// cause, at once, rather than after reach's redial wait. nil when one
// connected, or a dial could not tell within reconnectWait.
func (p *Provider) refused(ctx context.Context) error {
	var first error
	for _, ep := range p.client.Endpoints() {
		network, addr := endpointAddr(ep)
		d := net.Dialer{Timeout: reconnectWait}
		c, err := d.DialContext(ctx, network, addr)
		if err == nil {
			_ = c.Close()
			return nil
		}
		var ne net.Error
		if ctx.Err() != nil || errors.As(err, &ne) && ne.Timeout() {
			return nil
		}
		if first == nil {
			first = err
		}
	}
	return first
}

// endpointAddr is the network and address an etcd client endpoint names:
// "unix://path", "unixs://path" or "unix:path"; a URL's host; else the
// endpoint itself as a TCP address.
func endpointAddr(ep string) (network, addr string) {
	for _, prefix := range []string{"unix://", "unixs://", "unix:"} {
		if rest, ok := strings.CutPrefix(ep, prefix); ok {
			return "unix", rest
		}
	}
	if u, err := url.Parse(ep); err == nil && u.Host != "" {
		return "tcp", u.Host
	}
	return "tcp", ep
}

// reconnectWait is how long reach lets a connection in TRANSIENT_FAILURE
// dial again before it reports the cluster unreachable: a dial to a member
// that is down fails in a round trip or less.
const reconnectWait = 500 * time.Millisecond

// attempt is one call of Acquire.
type attempt struct {
	p       *Provider
	ctx     context.Context // the caller's
	wctx    context.Context // ends with ctx, the Timeout, or Close
	key     string
	opts    tenace.LockAcquireOptions
	first   context.Context // the lease grant's and the queueing's: wctx, or noreply.LateReply past the Timeout
	l       *lease          // from the lease grant on
	sent    time.Time
	replied bool             // etcd answered a request of this attempt
	held    bool             // etcd answered that the key is held (another entry heads the queue)
	heldBy  *mvccpb.KeyValue // the head of the queue when the caller joined it (see onHeld)
	// unprompted: the waiter looks at its queue again with no change seen
	// (see waitEvents)
	unprompted bool

	// The driver's (run's) state, from request to request.
	until    time.Time                    // the lease grant and the queueing stop being retried
	g        *clientv3.LeaseGrantResponse // the caller's etcd lease
	spare    bool                         // g is the provider's spare, taken
	granted  time.Time                    // what its expiry is measured from
	dir      string                       // the key's queue
	rctx     context.Context              // a waiter's reads: end with wctx, or when its lease is lost
	endReads func()                       // ends rctx
	v        view                         // a waiter's last view
	rev      int64                        // the revision its watch starts from

	// The peek: a read of the queue's head beside the lease grant, for a
	// Timeout under noreply.Grace (see peekNow).
	peekDone chan struct{} // closed once the peek has ended; nil: no peek
	peeked   atomic.Pointer[view]
}

// peekNow sends, beside the lease grant, a serializable read of the key's
// queue on a.first (answered by the member from its own state: no Raft
// round, no disk sync): its head, and for a shared caller what admits it
// (see view). Its answer is etcd's word that the key is held (by the
// entry at the head, if it is not the caller's; for a shared caller, by
// entries that would not admit it) when the
// lease grant and the queueing — two Raft writes, each with a disk sync,
// slow on a loaded machine — come too late to say it within a short
// Timeout. It returns what ends it: called after a.first has ended, it
// waits for the read to return.
func (a *attempt) peekNow() func() {
	a.peekDone = make(chan struct{})
	dir := a.p.dir(a.key)
	go func() {
		defer close(a.peekDone)
		a.peek(a.first, dir)
	}()
	return func() { <-a.peekDone }
}

// peek reads the caller's view of the queue in dir with serializable reads
// on ctx, and records it.
func (a *attempt) peek(ctx context.Context, dir string) {
	resp, err := a.p.client.Txn(ctx).Then(a.viewOps(dir, 0, true)...).Commit()
	if err == nil {
		v := a.view(resp.Responses)
		a.peeked.Store(&v)
	}
}

// peekedHeld reports whether the peek found entries other than the
// caller's that do not admit it (another at the head, for an exclusive
// caller). Called once the Timeout has passed: it waits for the peek,
// which ends by a.first's deadline, noreply.LateReply past the Timeout.
func (a *attempt) peekedHeld() bool {
	if a.peekDone == nil {
		return false
	}
	<-a.peekDone
	if a.peeked.Load() == nil {
		// Seen failed later than noreply.StarvedBy past its deadline, the
		// peek is asked again once, with half of noreply.LateReply for its
		// answer (the bound is already stretched by the starvation).
		if d, ok := a.first.Deadline(); ok && time.Since(d) > noreply.StarvedBy && a.ctx.Err() == nil {
			ctx, cancel := context.WithTimeout(a.ctx, noreply.LateReply/2)
			a.peek(ctx, a.p.dir(a.key))
			cancel()
		}
	}
	v := a.peeked.Load()
	if v == nil {
		return false
	}
	var own clientv3.LeaseID // the caller's entry may be in the view: it is not in its own way
	if a.l != nil {
		own = a.l.id
	}
	return !v.without(own).admits(a.opts)
}

func (a *attempt) run() (tenace.LockLease, error) {
	p := a.p
	a.until = retryUntil(a.wctx)
	r := a.grantLease(true)
	for {
		d := step(call{key: a.key, noWait: a.opts.Timeout == tenace.NoWait}, r)
		if d.held && !a.held {
			a.held = true
			if d.next != outHeld && d.next != outFailed {
				a.queue(1) // a waiter from now on
				defer a.queue(-1)
			}
		}
		switch d.next {
		case doQueue:
			if err := a.newLease(); err != nil {
				return nil, err
			}
			r = a.queueUp()
		case doRegrant:
			a.l.drop()
			a.l = nil
			r = a.grantLease(false)
		case doLook:
			r = a.look()
		case doPause:
			t := time.NewTimer(retryPause)
			select {
			case <-t.C:
			case <-a.rctx.Done():
				t.Stop()
			}
			r = a.look()
		case doWatch:
			r = a.watch()
		case doGrant:
			return p.grant(a.l, a.opts)
		case outHeld:
			return nil, nil
		case outFailed:
			err := d.err
			if err == errEnded {
				err = a.wctx.Err()
			}
			return a.failed(err)
		}
	}
}

// ended fills the reply's view of the call's contexts and lease.
func (a *attempt) ended(r reply) reply {
	r.ended = a.wctx.Err() != nil
	r.timedOut = tenace.TimedOut(a.ctx, a.wctx)
	if a.l != nil && (a.l.Err() != nil || a.l.kctx.Err() != nil) {
		<-a.l.Lost() // lose signals, then stops the keeper
		r.lost, r.lostErr = true, a.l.Err()
	}
	return r
}

// grantLease takes the spare lease, when spare says it may, or grants one.
func (a *attempt) grantLease(spare bool) reply {
	p := a.p
	a.sent = time.Now()
	var g *clientv3.LeaseGrantResponse
	var granted time.Time
	if spare {
		g, granted = p.takeSpare()
	}
	a.spare = g != nil
	if g == nil {
		// A lease granted to a try that went unanswered has nothing
		// attached, and lapses on its own.
		var err error
		g, _, err = hedge(a.first, hedgeAfter, a.until, func(ctx context.Context) (*clientv3.LeaseGrantResponse, error) {
			return p.client.Grant(ctx, int64(p.window/time.Second))
		})
		if err != nil {
			return a.ended(reply{req: reqGrant, err: err})
		}
		granted = a.sent
	}
	a.replied = true
	a.g, a.granted = g, granted
	return a.ended(reply{req: reqGrant})
}

// newLease makes the granted etcd lease the caller's, with its keeper.
func (a *attempt) newLease() (err error) {
	a.dir = a.p.dir(a.key)
	a.l, err = a.p.newLease(a.key, entryName(a.dir, a.g.ID, a.opts.Shared), a.opts.Shared, a.g.ID, a.granted, time.Duration(a.g.TTL)*time.Second)
	return err
}

// queueUp joins the queue and reads it in one request: everything else in
// it came before the caller. The put is made only if the entry is not
// there yet, so that the request is safe to send again: a try that went
// unanswered may have queued the caller, and a later one then reads the
// entry's create revision instead.
func (a *attempt) queueUp() reply {
	p := a.p
	a.sent, a.replied = time.Now(), false
	view := a.viewOps(a.dir, 0, false)
	// Then: the put and the view; Else: a read of the entry and the view.
	ops := make([]clientv3.Op, 2*(1+len(view)))
	ops[0] = clientv3.OpPut(a.l.name, p.ownerValue(entryValue(a.opts), a.opts.Owner), clientv3.WithLease(a.g.ID))
	copy(ops[1:], view)
	ops[1+len(view)] = clientv3.OpGet(a.l.name, clientv3.WithKeysOnly())
	copy(ops[2+len(view):], view)
	then, els := ops[:1+len(view)], ops[1+len(view):]
	var try atomic.Int32
	resp, tries, err := hedge(a.first, hedgeAfter, a.until, func(ctx context.Context) (*clientv3.TxnResponse, error) {
		if p.beforeTry != nil {
			p.beforeTry(ctx, "queue", try.Add(1))
		}
		return p.client.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(a.l.name), "=", 0)).Then(then...).Else(els...).Commit()
	})
	if err != nil {
		return a.ended(reply{req: reqQueue, err: err, spareGone: a.spare && errors.Is(err, rpctypes.ErrLeaseNotFound)})
	}
	a.replied = true
	a.l.rev = resp.Header.Revision // the put's create revision: the only write of the Txn
	a.l.reusable = tries == 1 && resp.Succeeded
	if !resp.Succeeded {
		kvs := resp.Responses[0].GetResponseRange().Kvs
		if len(kvs) == 0 {
			return a.ended(reply{req: reqQueue, gone: true})
		}
		a.l.rev = kvs[0].CreateRevision // put by a try that went unanswered
	}
	admitted := a.view(resp.Responses[1:]).without(a.g.ID).admits(a.opts)
	if !admitted {
		// The reads of a waiter end when the wait does, or when its lease
		// is lost (its keeper's context ends).
		var cancel context.CancelFunc
		a.rctx, cancel = context.WithCancel(a.wctx)
		stop := context.AfterFunc(a.l.kctx, cancel)
		a.endReads = func() { stop(); cancel() }
	}
	if !admitted {
		a.heldBy = resp.Responses[1].GetResponseRange().Kvs[0] // the head: the view's first read, never empty here
	}
	return a.ended(reply{req: reqQueue, admitted: admitted})
}

// look reads the caller's entry and the entries created before it (a
// waiter's view), as concurrency.Mutex does with its predecessor.
func (a *attempt) look() reply {
	p, l := a.p, a.l
	// A look that no change prompted (a watch unconfirmed, or a renewal
	// interval without events) leaves etcd's last word, that the key is
	// held, standing: unanswered at the Timeout, it is (nil, nil), as the
	// watch it replaces would have been.
	a.sent, a.replied = time.Now(), a.unprompted
	a.unprompted = false
	ops := append([]clientv3.Op{clientv3.OpGet(l.name)}, a.viewOps(a.dir, l.rev-1, false)...)
	resp, _, err := hedge(a.rctx, hedgeAfter, time.Time{}, func(ctx context.Context) (*clientv3.TxnResponse, error) {
		return p.client.Txn(ctx).Then(ops...).Commit()
	})
	if err != nil {
		return a.ended(reply{req: reqLook, err: err})
	}
	a.replied = true
	if len(resp.Responses[0].GetResponseRange().Kvs) == 0 {
		return a.ended(reply{req: reqLook, gone: true})
	}
	a.v, a.rev = a.view(resp.Responses[1:]), resp.Header.Revision+1
	return a.ended(reply{req: reqLook, admitted: a.v.admits(a.opts)})
}

// watch waits from the revision after the last look for the change that
// may admit the caller (watching only its predecessor, for an exclusive
// caller: a release wakes one waiter, not all). A compaction that removes
// the revision a watch starts from makes it look again.
func (a *attempt) watch() reply {
	if a.p.beforeWatch != nil {
		a.p.beforeWatch(a.rev)
	}
	a.waitFor(a.dir, a.v, a.rev)
	return a.ended(reply{req: reqWatch})
}

// queue counts the caller as waiting (d = 1) or no longer (d = -1), once
// its place in the queue is fixed in etcd.
func (a *attempt) queue(d int) {
	p := a.p
	p.mu.Lock()
	defer p.mu.Unlock()
	n := p.queues[a.key]
	if n > 0 {
		p.keysWith[n]--
	}
	n += d
	if n == 0 {
		delete(p.queues, a.key)
	} else {
		p.queues[a.key] = n
		for len(p.keysWith) <= n {
			p.keysWith = append(p.keysWith, 0)
		}
		p.keysWith[n]++
	}
	longest := max(int(p.longest.Load()), n)
	for longest > 0 && p.keysWith[longest] == 0 {
		longest--
	}
	p.longest.Store(int64(longest))
	p.waiting.Add(int64(d))
	if a.opts.Shared {
		p.sharedWaiting.Add(int64(d))
	}
}

// failed says why the attempt ended without a grant, err being the failure
// of its last step: ctx's error when the caller's ctx ended; the closed
// error after Close; for the Timeout, once etcd said the key is held,
// (nil, nil) when etcd had answered the last request or the request in
// flight was cut short too soon to call etcd silent, else (and always
// before etcd said it is held) an error wrapping tenace.ErrNoReply; err
// otherwise. A Timeout on another clock than the system's keeps the first
// rule throughout: real time tells nothing of it.
func (a *attempt) failed(err error) (tenace.LockLease, error) {
	provkit.AwaitDeadline(a.ctx)
	provkit.AwaitDeadline(a.wctx)
	if cerr := a.ctx.Err(); cerr != nil {
		return nil, cerr
	}
	if a.p.closed.Err() != nil {
		return nil, errClosed
	}
	if tenace.TimedOut(a.ctx, a.wctx) {
		if !a.held && clock.IsSystem(a.opts.Clock) && !a.peekedHeld() {
			return nil, fmt.Errorf("%w: etcdlock: etcd did not say whether %s is held within the call's %v Timeout and %v more for a reply in flight; retry later, and if it persists, check that a quorum of the cluster runs and answers (%v)",
				tenace.ErrNoReply, keyfmt.Quote(a.key), a.opts.Timeout, noreply.LateReply, err)
		}
		if a.replied || noreply.Unanswered(a.wctx, a.sent) < noreply.Grace {
			return nil, nil
		}
		return nil, fmt.Errorf("%w: etcdlock: a request for %s went unanswered for %v, until the call's %v Timeout; retry later, and if it persists, check that a quorum of the cluster runs and answers (%v)",
			tenace.ErrNoReply, keyfmt.Quote(a.key), noreply.Unanswered(a.wctx, a.sent).Round(time.Millisecond), a.opts.Timeout, err)
	}
	return nil, err
}

// Stats reports the leases held through this provider (granted, not yet
// released nor lost), the callers waiting in this process (from the moment
// their place in etcd's queue is fixed until they are granted or give up),
// and the most waiting for one key. By mode: SharedKeys and SharedHolders
// are both the shared leases among Held (a lease is one key held shared,
// and one permit in use, through this provider), SharedWaiting the shared
// callers among Waiting. Five atomic loads.
func (p *Provider) Stats() tenace.LockStats {
	shared := int(p.sharedHeld.Load())
	return tenace.LockStats{Held: int(p.held.Load()), Waiting: int(p.waiting.Load()), LongestQueue: int(p.longest.Load()),
		SharedKeys: shared, SharedHolders: shared, SharedWaiting: int(p.sharedWaiting.Load())}
}

// Close ends the provider: callers waiting in Acquire return an error
// wrapping tenace.ErrProviderClosed, and so do later calls; every lease
// still held is lost (all their Lost channels close first), then their
// etcd leases are revoked in parallel (each bounded by 5s; one etcd does
// not answer lapses within its window). It returns once the provider's
// goroutines have ended; it is idempotent and returns nil. It does not
// close the client.
func (p *Provider) Close() error {
	p.endedOnce.Do(func() {
		p.close(tenace.ErrProviderClosed)
		provkit.EndHeld(&p.mu, &p.isClosed, p.leases, nil, func(l *lease) {
			l.lose(fmt.Errorf("%w: etcdlock: the provider was closed while the lock on %s was held", tenace.ErrLeaseLost, keyfmt.Quote(l.key)))
		})
	})
	p.bg.Wait()
	p.revokeSpare()
	return nil
}

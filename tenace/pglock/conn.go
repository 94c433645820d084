package pglock

import (
	"context"
	"net"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgconn/ctxwatch"
	"github.com/jackc/pgx/v5/pgxpool"
	"tenace.dev/tenace/internal/provkit"
)

// cancelGrace bounds how long a statement whose context ended may keep its
// caller: the server is sent a cancel request at once, and if neither the
// statement's end nor the cancel's answer arrives within cancelGrace (a
// stalled server, a lost network), the connection is given up (its reads and
// writes time out, and pgconn closes it).
const cancelGrace = 2 * time.Second

// DefaultKeepalive is the TCP keepalive of the provider's connections, on
// both ends: the client's socket, and the server's (tcp_keepalives_idle,
// _interval and _count, set for the session). Over TCP a peer that
// vanishes without closing its socket (a machine that died, a network that
// dropped packets) is noticed after Idle + Interval × Count of silence at
// most: then the client's lease is lost (its Lost channel closes), and the
// server ends the session, which releases its locks.
var DefaultKeepalive = net.KeepAliveConfig{Enable: true, Idle: 10 * time.Second, Interval: 5 * time.Second, Count: 3}

// cancelRepeat is how often a cancel request is sent again while the
// statement has not ended (see cancelHandler).
const cancelRepeat = 20 * time.Millisecond

// cancelHandler is the pgconn context handler of the provider's
// connections. When a statement's context ends, it sends the server a
// cancel request, so that a waiting pg_advisory_lock stops waiting on the
// server instead of being abandoned there to take the lock later; and sets
// a deadline of cancelGrace on the socket as a fallback (then pgconn closes
// the connection).
//
// It sends the cancel again every cancelRepeat until the statement ends: a
// cancel request travels on a connection of its own, and one that reaches
// the backend before the statement does is ignored (the backend is idle),
// which would leave the statement waiting on the server after the client
// gave up — a waiter nobody waits for, which takes the lock when its turn
// comes. pgx's own CancelRequestContextWatcherHandler sends one cancel and
// then sleeps 100 ms, to keep a late cancel from hitting the connection's
// next statement; this provider reuses a connection whose statement saw
// its context end only once the server has answered every cancel request
// sent for it (settled; a bulkhead's waiter, see call.givePermitBack), and
// discards the others (see discard), so it needs neither.
//
// No cancel is sent before the connection's startup has finished (ready,
// set by the pool's AfterConnect): the backend's key is not known yet, and
// there is no statement to cancel.
type cancelHandler struct {
	conn  *pgconn.PgConn
	ready atomic.Bool
	// fd is the connection's socket descriptor (hasFD: it has one), for
	// the provider's poller; set by AfterConnect.
	fd    int32
	hasFD bool
	// Owned by pgconn's context watcher, which calls HandleCancel and then
	// HandleUnwatchAfterCancel in sequence; graceEnd is read, too, once the
	// statement has returned (pgconn's Unwatch orders that after
	// HandleCancel, as it does HandleUnwatchAfterCancel).
	stop     context.CancelFunc
	quit     chan struct{} // closed once the statement has ended: send no more
	done     chan struct{} // closed when the cancel requests are over
	graceEnd time.Time     // when the connection is given up; zero before a cancel
	// settled: every cancel request sent for the last cancelled statement
	// was answered by the server (it closes the request's connection once
	// it has signalled the backend), so none can reach the session's next
	// statement: a signal that comes while the backend waits for a
	// command is dropped (see cancelSettled).
	settled bool
}

var _ ctxwatch.Handler = (*cancelHandler)(nil)

func (h *cancelHandler) HandleCancel(context.Context) {
	deadline := time.Now().Add(cancelGrace)
	_ = h.conn.Conn().SetDeadline(deadline)
	ctx, stop := context.WithDeadline(context.Background(), deadline)
	quit, done := make(chan struct{}), make(chan struct{})
	h.stop, h.quit, h.done, h.graceEnd, h.settled = stop, quit, done, deadline, false
	if !h.ready.Load() {
		h.settled = true
		close(done)
		return
	}
	go func() {
		defer close(done)
		t := time.NewTimer(cancelRepeat)
		defer t.Stop()
		for {
			_ = h.conn.CancelRequest(ctx)
			if ctx.Err() != nil {
				return // a request cut short may still reach the backend
			}
			select {
			case <-quit:
				h.settled = true
				return
			case <-ctx.Done():
				return
			case <-t.C:
				t.Reset(cancelRepeat)
			}
		}
	}()
}

// HandleUnwatchAfterCancel runs once the statement has ended: no more
// cancel requests are sent, and the one on its way is let finish (within
// the grace), so that settled says whether one can still reach the
// session.
func (h *cancelHandler) HandleUnwatchAfterCancel() {
	close(h.quit)
	<-h.done
	h.stop()
	_ = h.conn.Conn().SetDeadline(time.Time{})
}

// detach returns the context to run a statement on conn with in place of
// ctx, and the stop to call once the statement has returned: the same
// cancel handling as pgconn's context watcher gives a statement run on
// ctx (see cancelHandler), without the goroutine pgconn starts per
// statement for a ctx that can end. The statement runs on a ctx that
// cannot end; when ctx ends while it runs, context.AfterFunc runs the
// handler (cancel requests, the grace's deadline), and stop waits for it,
// then ends the requests as pgconn's Unwatch would. A ctx that cannot end,
// or has ended already (pgconn then refuses to start the statement, as
// for ctx itself), is returned as it is.
func detach(conn *pgxpool.Conn, ctx context.Context) (context.Context, func()) {
	if ctx.Done() == nil || ctx.Err() != nil {
		return ctx, func() {}
	}
	h, ok := conn.Conn().PgConn().CustomData()[handlerKey].(*cancelHandler)
	if !ok {
		return ctx, func() {}
	}
	fired := make(chan struct{})
	stop := context.AfterFunc(ctx, func() {
		defer close(fired)
		h.HandleCancel(ctx)
	})
	return context.WithoutCancel(ctx), func() {
		if !stop() {
			<-fired
			h.HandleUnwatchAfterCancel()
		}
	}
}

// cancelSettled reports whether conn's last statement, which has
// returned, saw no cancel request, or only requests the server has
// answered: then none can hit the next statement. The server signals the
// backend before it closes the request's connection, and a backend drops
// a cancel signal that arrives while it waits for a command (PostgresMain
// checks for interrupts after reading one, before it runs it).
func cancelSettled(conn *pgxpool.Conn) bool {
	h, ok := conn.Conn().PgConn().CustomData()[handlerKey].(*cancelHandler)
	return ok && (h.graceEnd.IsZero() || h.settled)
}

// graceEnd returns when the cancel's grace ends for conn's last statement,
// which has returned: the deadline its cancel handler set, when the
// statement's context ended while it ran; else cancelGrace from now (its
// context ended after it returned, or not at all). The cleanup after a
// statement cut short (unlockAll) ends by then, so that the caller waits
// one grace at most, not a grace for the statement and another for the
// cleanup. (A connection whose statement saw a cancel is discarded, or
// reused once the handler's state is cleared (call.givePermitBack), so the
// handler's deadline is its last statement's.)
func graceEnd(conn *pgxpool.Conn) time.Time {
	if h, ok := conn.Conn().PgConn().CustomData()[handlerKey].(*cancelHandler); ok && !h.graceEnd.IsZero() {
		return h.graceEnd
	}
	return time.Now().Add(cancelGrace)
}

// handlerKey is where a connection's CustomData keeps its cancelHandler,
// for the pool's AfterConnect to mark it ready.
const handlerKey = "tenace.dev/tenace/pglock.cancelHandler"

// configure turns the caller's pool configuration into the provider's:
// its own bound, the cancel handler, keepalives on both ends, and session
// settings that keep a DBA's defaults from breaking the locks. connected
// runs as each new connection is made, before it is used (the provider
// forgets the key ids it cached: see idCache).
func configure(cfg *pgxpool.Config, maxConns int, ka net.KeepAliveConfig, connected func()) {
	cfg.MaxConns = int32(maxConns)
	if cfg.MinConns > cfg.MaxConns {
		cfg.MinConns = cfg.MaxConns
	}
	cc := cfg.ConnConfig
	// A bulkhead's waiter counts NOTIFYs (see awaitPermit); a lease's
	// connection may receive one too, read by its watcher.
	cc.OnNotification = onNotification
	cc.BuildContextWatcherHandler = func(c *pgconn.PgConn) ctxwatch.Handler {
		h := &cancelHandler{conn: c}
		c.CustomData()[handlerKey] = h
		c.CustomData()[notificationsKey] = &notifications{}
		return h
	}
	after := cfg.AfterConnect
	cfg.AfterConnect = func(ctx context.Context, c *pgx.Conn) error {
		connected()
		if h, ok := c.PgConn().CustomData()[handlerKey].(*cancelHandler); ok {
			h.fd, h.hasFD = socketFD(c.PgConn().Conn())
			h.ready.Store(true)
		}
		if after != nil {
			return after(ctx, c)
		}
		return nil
	}
	dial := cc.DialFunc
	cc.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dial(ctx, network, addr)
		if tc, ok := c.(*net.TCPConn); ok && err == nil && ka.Enable {
			_ = tc.SetKeepAliveConfig(ka)
		}
		return c, err
	}
	if cc.RuntimeParams == nil {
		cc.RuntimeParams = map[string]string{}
	}
	rp := cc.RuntimeParams
	// A wait is bounded by the caller's Timeout and ctx only: the acquire
	// statement of a call with a Timeout sets lock_timeout for itself.
	rp["statement_timeout"] = "0"
	rp["lock_timeout"] = "0"
	// The acquire statement updates the key's fence after the lock wait, in
	// the snapshot it took before: READ COMMITTED rereads the row's newest
	// version (REPEATABLE READ would fail with a serialization error).
	rp["default_transaction_isolation"] = "read committed"
	if ka.Enable {
		rp["tcp_keepalives_idle"] = itoa(int(ka.Idle / time.Second))
		rp["tcp_keepalives_interval"] = itoa(int(ka.Interval / time.Second))
		rp["tcp_keepalives_count"] = itoa(ka.Count)
	}
}

func itoa(n int) string {
	if n < 1 {
		n = 1
	}
	var b [20]byte
	i := len(b)
	for n > 0 {
		i--
		b[i] = byte('0' + n%10)
		n /= 10
	}
	return string(b[i:])
}

// discard closes c's connection instead of returning it to the pool: the
// server ends the session, which releases every lock it holds. It is the
// answer to every uncertain state: a statement whose context ended while it
// ran, whether it failed or succeeded (a cancel request may still be on its
// way, and would hit the connection's next statement; a grant may have
// landed), an unlock that failed. Closing is bounded by provkit.CleanupTimeout.
func discard(c *pgxpool.Conn) {
	conn := c.Hijack()
	ctx, cancel := context.WithTimeout(context.Background(), provkit.CleanupTimeout)
	defer cancel()
	_ = conn.Close(ctx)
}

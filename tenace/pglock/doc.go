// Package pglock is a tenace.LockProvider on PostgreSQL advisory locks, for
// services that already run PostgreSQL and would rather not add a server
// just for locks.
//
//	locks, err := pglock.New(ctx, "postgres://app@db/app")
//	...
//	defer locks.Close()
//	p := tenace.NewPolicy().WithLock(tenace.LockOptions{Provider: locks, Key: "reports"})
//	err = p.Execute(ctx, buildReport)
//
// # How it works
//
// A table (DefaultTable, created by New when missing; see Schema) maps
// each key to an id, beside a sequence of fencing tokens and a table of
// owner labels:
//
//	id    integer identity primary key   the advisory lock is (table OID, id)
//	key   bytea unique                   the key's exact bytes
//	<table>_tokens   sequence            every grant's fencing token (nextval)
//	<table>_owners   (id, owner bytea)   each owner label used, once
//
// Acquire runs one statement on a connection of the provider's own pool: it
// looks up the key's id, takes the session advisory lock
// pg_advisory_lock(table OID, id) — or pg_try_advisory_lock with NoWait;
// the _shared forms for a shared caller (see Shared locks and permits) —
// and, only once the lock is held, takes the grant's token (nextval) and
// records the grant in its session's application_name ("tenace ID:TOKEN
// OWNER SINCE", in hex: the owner label's id, the server's clock in ms),
// which Inspect, List and a refusal read through pg_stat_activity for the
// sessions pg_locks shows holding the key. An uncontended grant writes no
// row, and usually no WAL: no commit to flush. A key's first use inserts
// its row (one more statement), an owner label's first use its row in
// the owners table, which keeps one row per label ever used: give labels
// that name a process or a job kind, not one per call. Release runs
// pg_advisory_unlock on the same connection and gives the connection back
// to the pool.
//
//   - Keys are exact: any Go string is a key (compared as bytes: no
//     collation, normalisation or hashing), and two keys are never one lock.
//     The locks use the two-integer advisory key space with the table's OID
//     as first integer, so they cannot meet the single-bigint advisory locks
//     an application takes by hand; do not use pg_advisory_lock(int, int)
//     with that OID yourself. A table holds up to 2³¹−1 keys, and keeps one
//     row per key ever used. A provider remembers the ids of up to 4,096
//     keys it granted, and locks a key it knows by its id, reading no
//     table. A key's row is committed synchronously when it is added
//     (whatever synchronous_commit says: once per key), so no crash loses
//     a row whose id a provider has read; and a provider forgets every id
//     whenever it opens a connection or finds one dead, so a server that
//     comes back without rows it had (a failover to a replica that lags, a
//     backup restored, a crash that loses a row an older version committed
//     asynchronously: each ends every connection) leaves no id behind
//     (TestKeyRowSurvivesACrash, TestCachedIDForgottenAfterACrash).
//     Through a pooler (AllowPooler) nothing is cached: the pooler keeps
//     a client's connection through the server's restart, so the provider
//     could not tell (TestNoIDCachedThroughAPooler). Rows
//     must never be deleted, nor the table truncated, while a provider
//     runs: a key whose row was deleted and added again gets a new id, and
//     a provider that remembers the old one holds a second lock of the
//     same key until it reconnects — a double grant no check catches. To
//     empty the table, close every provider first. A key must fit in a B-tree
//     index entry: up to about 2,700 bytes after compression (a longer one
//     fails with the server's error; hash it yourself if you need longer
//     keys).
//   - Fencing tokens (leases are tenace.FencedLease) strictly increase per
//     key, across processes and across server restarts and crashes; they
//     come from one sequence for the table, so they also increase across
//     keys, with gaps (a crash skips up to 32). A token never comes back
//     after a crash or an immediate shutdown, because it is on disk before
//     the grant answers: nextval writes WAL once in 32 values (and first
//     after each checkpoint), logging the value 32 ahead, and a value is
//     safe once that record — the acquire statement's own, or another
//     transaction's — is flushed. The acquire statement reads the WAL
//     insert position after its nextval (the record ends at or before it)
//     and then the flush position, and when the flush is behind it writes
//     a transactional logical message (pg_logical_emit_message) and commits
//     synchronously (it sets synchronous_commit to on for its own
//     transaction when the session's is off or local), so that its commit
//     flushes past the record (TestFencingSurvivesACrashAfterAnotherLogged);
//     when the flush is not behind, the record is on disk already.
//     On a busy server the flush is often behind (other transactions' WAL),
//     and a grant then costs a flush, as every grant did when the token was
//     a row update. A failover to a replica keeps the tokens only if the
//     replication is synchronous: with synchronous_standby_names set, every
//     grant writes that message, and its commit waits for the standby
//     (remote_write and remote_apply are kept). Through a pooler in session
//     mode nothing changes: everything is within the statement. Do not
//     setval or ALTER the sequence (restarting it lower breaks the tokens).
//     WithoutFencing drops the tokens and the owner record.
//
// A token protects a resource that checks it on every access: a read raises
// the highest token the resource has seen and refuses a lower one, a write
// refuses a token lower than the highest seen. Checked on writes alone, a
// read-modify-write still loses updates: a holder whose session ended under
// it can write between the new holder's read and its write. For data in
// PostgreSQL, Fence is that check, run in the transaction of every read and
// write (FenceSchema, the table; FenceSQL, the statement).
//
// Costs: an acquire is one round trip (three on a key's first use) and
// writes nothing but, once in 32 grants (and when the server's WAL flush
// is behind, see above), a WAL flush; a release is one round trip. A held lease costs a
// connection, and a goroutine once its connection has something to read,
// at once where there is no epoll (nested leases share theirs: see
// Deadlocks). Measured against two bare round trips on a
// held connection, and against redislock: bench/README.md.
//
// # Who gets the lock: PostgreSQL's lock queue
//
// Waiting is PostgreSQL's own: a waiter sleeps in the server's lock queue
// and is granted the lock by the server the moment the holder unlocks — no
// polling, no notification round trip. Waiters are granted in the order
// their statements reached the server's lock queue, whichever process they
// come from (FIFO across processes; tested with four processes). The
// exceptions:
//
//   - Arrival at the server is not the order of the Acquire calls: a caller
//     may first wait for a connection (see WithMaxConns), register a new key,
//     or dial; two statements sent at nearly the same moment on different
//     connections arrive in either order.
//   - NoWait never queues: pg_try_advisory_lock fails while anyone holds
//     the lock or waits for it (the server does not let a try jump the
//     queue).
//   - PostgreSQL's deadlock detector may reorder a queue when sessions wait
//     for each other in a cycle, which takes locks held across several
//     keys in different orders (nested Locks).
//   - A waiter whose connection died (after a server restart, say) tries
//     once more on a live connection (see Errors), and joins the end of the
//     queue.
//
// Release synchronizes before the Acquire it unblocks, in any process: the
// unlock and the grant are one step in the server's lock manager.
//
// # The connection is the lease
//
// A held lock pins one connection from Acquire to Release, and a waiter one
// too (a nested Lock shares its execution's: see Deadlocks): N holders and
// M waiters use N+M connections of the provider's pool,
// which WithMaxConns bounds (DefaultMaxConns). When all are in use, Acquire
// waits for one within its Timeout and ctx — or, with NoWait, returns
// ErrPoolExhausted at once. A Timeout that passes while it waits for a
// connection returns an error wrapping ErrPoolExhausted, not "not granted",
// unless another caller of the process holds or waits for the same key: the
// key was never asked for, and a Lock step reports lock.failed, not
// lock.rejected. A nested Lock, exclusive or a reader's, waits on the session of
// what its execution holds (see Deadlocks), and needs no connection of its
// own; a nested set or bulkhead Lock needs one per level: a pool full of holders
// that each wait for a second key that way ends in that error at their
// Timeout. A cancelled wait costs a connection: its connection is closed
// rather than reused (see below), and the pool dials a new one — but a
// bulkhead waiter's (see Shared locks and permits).
//
// A server that does not answer is not a held key either (see Waiting).
//
// Session locks need a session that stays one: a pooler in transaction or
// statement mode (PgBouncer's default) would break them silently, so New
// refuses a connection whose backend is not the one the server named at
// connect (ErrPooler; tested through PgBouncer in transaction and session
// mode — PgBouncer must be told to ignore the startup parameters the
// provider sets, else it refuses the connection itself); AllowPooler
// accepts a pooler in session mode. New also refuses a standby.
//
// # Waiting: Timeout, NoWait, ctx, and the abort during the grant
//
// The rule: (nil, nil) means that PostgreSQL said the key is held by
// another within the Timeout; a refused connection, a failure or a server
// that did not answer by then is an error (ErrNoReply for the last), which
// a Lock reports as lock.failed.
//
// A Timeout (on the system clock) is kept by the server and bounded by the
// client. The acquire statement sets lock_timeout, for its own transaction,
// to what remains of the Timeout as it is sent (after the round trip that
// prepares it, on its first run on a connection) less a third of it, 50 ms
// at most, so that the server's answer is on its way back by the Timeout;
// its "lock timeout"
// (SQLSTATE 55P03) is the server saying "held", and the connection goes
// back to the pool — once the session has dropped the lock if it holds it:
// a grant that lands as the timeout fires keeps the lock, and the
// statement still fails with the lock timeout. The drop is one more
// round trip, run after Acquire has its answer, on the connection the call
// still holds (its slot is free for the caller's next Acquire, which waits
// in the pool for that connection): for that round trip, a grant that
// raced the timeout is still held (a set unlocks everything its session
// holds before it answers instead). When the wait goes on instead (see
// below), the next statement counts such a grant as granted. The wait on the server's queue is therefore up to 50 ms
// shorter than the Timeout. Acquire returns within the Timeout and 30 ms
// whatever the server does: if no answer has come by then — a stalled or
// overloaded server, a dial or a startup left unanswered, a network that
// drops packets — it returns an error wrapping ErrNoReply, without waiting
// for the server. What it sent goes on in the background (Close waits for
// it): the statement ends on the server by its own lock_timeout, and its
// late answer is read, leaving the connection fit for reuse; a grant that
// lands after the caller left is given back (pg_advisory_unlock_all) and
// its connection closed; a server still silent 2 s later has the statement
// cancelled and the connection given up, which ends its session and frees
// whatever it held once it runs again (tested with the whole cluster
// stopped by SIGSTOP: 100 ms after it continues, the key is free). One
// exception: when a lease of this provider holds the key, a call the server
// did not answer in time is (nil, nil), as the server did say the key is
// held. A refused connection or a dial error fails the call at once,
// whatever the Timeout, wrapping the cause (errors.Is(err,
// syscall.ECONNREFUSED)).
//
// On a machine so loaded that a loopback round trip takes longer than the
// slack (a third of the Timeout, 50 ms at most, plus 30 ms), a held key can
// come back as ErrNoReply: the client cannot tell a late "held" from
// silence, and reports the failure. (Measured on a shared 2-core machine
// beside two CPU burners, Timeouts of 50 to 250 ms: up to 3 tries in ten at
// load 10, up to 5 at load 20.)
//
// With a Timeout on another Clock (a test's) the server cannot follow it:
// when it passes, the client cancels the statement, and the server's answer
// to the cancel counts as "held"; no answer within 2 s is ErrNoReply. A
// Timeout of 0 waits as long as ctx allows. Any other non-negative Timeout
// is valid, up to math.MaxInt64: one longer than the server's largest
// lock_timeout (about 24.8 days) waits in steps of it, the wait starting
// again at the end of each (a bulkhead's caller, on a new connection). NoWait never waits for the
// lock, but it does wait for the server's answer, one round trip: on a
// server that does not answer, only ctx bounds it.
//
// When ctx ends, or a Timeout on another Clock passes, the client sends
// the server a cancel request — again every 20 ms until the statement ends,
// since a cancel that outruns its statement is ignored — and Acquire
// returns once the server has answered: typically one round trip; at most
// 2 s when the server does not answer, as the connection is then given up
// (for a Timeout on the system clock, no later than the Timeout and 30 ms).
// The grant may land at that very moment: the server may have granted the
// lock just before the cancel arrived, or the cancel may hit after the lock
// and before the token. In every such case the call gives the lock back
// (pg_advisory_unlock_all) and closes the connection, so that a cancel
// still in flight cannot hit a later statement and nothing the session held
// survives it: when Acquire returns ctx's error, nothing is held for it on
// the server. (A test races cancels against grants and tells both outcomes
// apart by the token.) The give-back fits in the same 2 s: a backend that
// stalls between the grant and the unlock holds the caller no longer, and
// frees the lock when it runs again and finds its connection closed (tested
// with SIGSTOP).
//
// A waiting statement holds a snapshot, as any running query does, which
// holds back vacuum's horizon while it waits.
//
// # Lost leases
//
// Leases are tenace.LosableLease: the Lock step ends fn's context, with the
// loss as its cause, the moment the provider learns of it. A lease is lost
// when:
//
//   - its connection ends (and with it every lease on the same session:
//     see Deadlocks): the backend is terminated (pg_terminate_backend,
//     a shutdown or restart, a crash), the socket closes, or the network
//     drops. On Linux the provider keeps the socket of each session that
//     holds leases, while the session is idle, in one epoll set (an
//     epoll_ctl when the session is given back, one when it is taken: no
//     timer, no goroutine), read by one goroutine per provider; the
//     server's termination message or the socket's end starts the
//     session's watcher, which reads it and signals the loss. Linux drops
//     a closed socket from an epoll set without a word, so the one path
//     that closes an idle session's socket (a Release that could not take
//     the session from a nested wait in time) takes it out of the set
//     first and starts the watcher, which reads the closed socket and
//     signals the loss of the leases left on it
//     (TestKillOfAnIdleSessionSignalsLoss,
//     TestKilledSocketNeverUnregistersAnother); and if the set's goroutine
//     ends (epoll_wait fails), every session in the set gets its watcher,
//     and later ones a timer (TestPollerEndFallsBackToWatchers). Elsewhere a
//     goroutine per session blocks reading the idle connection, from 100 µs
//     after the grant (a lease released sooner costs no goroutine). Lost
//     closes a median 0.5 ms, at most 4 ms, after pg_terminate_backend is
//     sent (loopback, quiet; TestLostSignalDelay: under -race at load 4,
//     1.2–1.5 ms with the epoll set, 1.1–1.3 ms with the timer). A silent
//     loss (a peer machine gone, packets dropped) shows
//     through TCP keepalives within Idle + Interval × Count of silence,
//     25 s with DefaultKeepalive, on both ends: the server then ends the
//     session and frees the lock, the client loses the lease. The server
//     releases a session's locks when the session ends, so the next waiter
//     is granted then: a holder process that dies (even by SIGKILL) frees
//     its locks at once, as the kernel closes its sockets (measured: the
//     next waiter, in another process, granted 5–10 ms after the kill;
//     TestKilledHolderFreesTheKey). A stalled server process is not a loss:
//     its kernel still answers keepalives, and it grants nobody else.
//   - its TTL passes (LockAcquireOptions.TTL, else WithTTL; none by
//     default), timed from the grant on the call's LockAcquireOptions.Clock
//     as its Timeout is (on a test clock, when that clock passes it; the
//     server keeps no expiry): the lease is lost with
//     tenace.ErrLeaseExpired, and the lock released right after — Lost
//     closes first, then the unlock's round trip, so that the holder
//     learns of the loss before anyone else can be granted the lock.
//   - the provider is closed: every lease's Lost closes at once, before any
//     unlock; the unlocks then run in parallel, so that a stalled backend
//     holds up neither the other leases nor their locks (see Close).
//
// Release after a loss touches nothing and returns an error wrapping
// tenace.ErrLeaseLost that says why; so does a Release whose unlock finds
// the connection ended (a backend terminated a moment before, whose end the
// lease had not seen yet). If the unlock fails otherwise (ctx ended, the
// server does not answer), Release closes the connection instead — which
// releases the lock when the server ends the session — and says so; when the
// unlock succeeds but ctx ended while it ran, Release returns nil and closes
// the connection all the same, since a cancel request may still be on its
// way to the session (no connection whose statement saw its context end goes
// back to the pool, where it would hit another caller's). A Release whose
// ctx has no deadline (the Lock step's) gives the unlock 5 s, a deadline on
// its socket: on a stalled backend it returns after that, having closed
// the connection (tested with the backend stopped by SIGSTOP: the lock is
// free once it runs again).
//
// A holder that stalls (a long GC pause, a stopped process) keeps its lock
// as long as its connection lives: there is no expiry on the server (but a
// server whose idle_session_timeout or a pooler's idle timeout is shorter
// than a hold ends the session, and the lease is then lost, as above). Use a
// TTL to bound the hold, and fencing tokens where a late write would harm.
//
// # Several keys
//
// Provider is a tenace.MultiLockProvider: tenace.AcquireAll and a Lock with
// LockOptions.Keys call AcquireSet, which takes every key of the set on one
// connection — one session, one connection slot — in sorted (byte) order,
// one acquire statement per key, and holds them until Release, which
// unlocks them all in one statement. The order is the keys', not their
// lock ids' (ids follow the order keys were first used), so that a set
// agrees with tenace.AcquireAll's generic path in a process that takes the
// keys one by one: no two callers wait for each other in a cycle, whatever
// order they name the keys in. The Timeout and ctx cover the whole set,
// under the rules of Waiting: each key's wait on the server is bounded by
// what remains of the Timeout, (nil, nil) is the server's "held", and
// whenever no lease is returned the keys locked so far are unlocked (or
// their session ended) first. Each key gets its own fencing token, as a
// single grant would. The set lives and dies with its session: its
// connection ending, its TTL or Close loses every key at once (the
// SetLease's Lost and each key's close together). Stats counts every key
// of a held set in Held, and a waiting set once in Waiting. No cycle forms
// between sets, nor with the generic path, of any process; one with a
// caller that holds a key while it asks for another in its own order can,
// as between any two such callers: bound those waits with a Timeout.
//
// # Deadlocks
//
// PostgreSQL's deadlock detector covers advisory locks: deadlock_timeout
// (1 s by default; a session's setting, which a superuser sets with SET,
// ALTER ROLE or the connection string's options='-c deadlock_timeout=500')
// after a session began to wait, the server looks for a cycle of sessions
// that wait for each other, and fails a wait of it with SQLSTATE 40P01,
// which the provider returns as a *tenace.DeadlockError (through a Lock,
// event lock.deadlock; fn does not run). The other sessions of the cycle
// go on. A chain of waits is no cycle and is never reported. The server
// sees sessions, not executions, so the provider puts what an execution
// holds and what it waits for on one session:
//
//   - A set: its session holds its keys so far while it waits for the
//     next. When the server fails that wait, AcquireSet unlocks the set's
//     keys and returns the error; Key is the key it waited for, Cycle that
//     key, then the keys the set's session held. Sets of every process
//     take keys in sorted order, so a set meets such a cycle only with
//     sessions that take the provider's locks in another order (nested
//     Locks, or SQL of their own on its lock ids).
//   - A nested Lock: a Lock on one key, exclusive or a reader's (Shared,
//     Permits 0), with a Timeout other than NoWait, whose execution holds leases of the same Provider value
//     through the Lock steps around it (read from its context: see
//     tenace.DeadlockError for what counts as the execution) waits on the
//     session of the innermost of those leases, and its lease joins that
//     session — so a cycle is seen between executions of one process too,
//     each on its own sessions. When the server fails the wait, the Lock returns the error,
//     its Key the key it waited for, its Cycle that key, then the keys
//     held on the session (the cycle's other keys are other sessions',
//     which this process does not know); the execution's Lock steps
//     release the keys as they return it. With two and three providers
//     in a ring (each its own pool: to the server, separate processes)
//     and deadlock_timeout 200 ms, the verdict came 0.08–0.18 s after the
//     wait that closed the ring (an earlier waiter's check found it); the
//     test's bound is deadlock_timeout and 1 s
//     (TestNestedDeadlockAcrossProcesses).
//
// A session holds the locks of every lease on it, and stays pinned (one
// connection slot, one watcher goroutine) until the last of them ends;
// then its connection goes back to the pool. Each lease keeps its own
// Release, TTL and fencing token: its Release, or its TTL, unlocks its own
// key alone. Its loss is the session's: when the connection ends (a
// terminated backend, a restart, a dropped network) or the provider
// closes, every lease on the session is lost at once. A nested wait that
// ends without a grant — its Timeout, its ctx, the server's verdict —
// leaves the session's other locks held: the wait's own key is dropped if
// the grant raced the end. A wait cut short by its ctx sends a cancel
// request to the session, which may reach a later statement: the session
// then takes no further nested wait, its unlocks are tried again when a
// stray cancel fails them, and its connection is closed rather than pooled
// at the end. Only if that clean-up fails, or the connection ended, does
// the session end, and with it every lease on it (lost, as above).
//
// A session runs one statement at a time, so a nested wait joins a
// session only while nobody else uses it; otherwise (another goroutine of
// the execution waits there already), and when one of the session's
// leases holds the key asked for (a session's advisory locks are
// reentrant: a second grant there would exclude nobody), it waits on a
// connection of its own, as every other call does, and a cycle through
// that wait is not seen by the server. A Release that finds the session in
// use by such a goroutine's wait waits for it, within its ctx (5 s without
// a deadline); past that it closes the session's connection, which frees
// every lock on it and fails that wait.
//
// Not seen by the server, and bounded by the Timeout alone: a cycle
// through a bulkhead's wait (Permits), a nested set (Keys), or a NoWait
// try (which never waits, so closes none); a nested Lock whose
// execution holds the outer key through another Provider value, or a
// wrapper around this one (failsafelock), or through a lease taken with
// Acquire rather than a Lock step, or only through bulkhead permits (a
// permit's session is its own: its Release unlocks everything the session
// holds).
//
// # Shared locks and permits
//
// Provider is a tenace.SharedLockProvider: LockAcquireOptions.Shared and
// Permits work as the package tenace documents them, across processes.
//
// Read/write (Shared, Permits 0): a reader takes the key's advisory lock
// shared (pg_advisory_lock_shared, pg_try_advisory_lock_shared with
// NoWait), the lock a writer (Shared false) takes exclusive. PostgreSQL's
// lock manager keeps readers together and writers alone, and queues a
// new shared request behind an exclusive one that waits: a waiting writer
// is not overtaken by readers that come after it, nor by a NoWait reader
// (TestWriterNotOvertakenByLaterReaders shows both in pg_locks).
//
// A keyed bulkhead (Shared, Permits N > 0): a holder holds one of the
// key's N permit slots — advisory locks of their own (the OID of the
// table's primary key index, then the key's id mixed with the slot's
// number), each taken exclusive, so that two holders never share one —
// and the key shared, so that a writer excludes it. A free slot is a free
// permit: nothing counts holders, and PostgreSQL frees a slot with the
// session that holds it.
//
//	NoWait    ── one statement: try slots 0, 1, … (pg_try_advisory_lock),
//	             the first free one taken; try the key shared; token: granted
//	             (no slot free, or a writer holds or waits for the key:
//	             not granted, the slot given back in the same statement)
//	a waiter  ── one statement: take the key's gate, a second advisory
//	             lock (the table's OID, −id), exclusive (waits in its
//	             queue, FIFO); try the slots;
//	             a slot → wait for the key shared (behind a writer),
//	                      token, unlock the gate: granted
//	             none   → keep the gate; LISTEN on the key's channel
//	                      (a wait longer than 100 ms) and wait, with no
//	                      statement running, for the NOTIFY a Release
//	                      sends while the gate is held, or 100 ms (10 ms,
//	                      not listening, for a shorter wait); try the
//	                      slots again
//
// A caller takes the lowest free slot, so it tries min(N,
// max_connections) slots at most, and one when the key is free: an
// uncontended grant costs one try-lock and the key's shared lock beside
// the token (and the gate's lock and unlock, for a caller that waits). A
// Release is one statement, which reads nothing: it unlocks, then tries
// the gate shared, and sends the NOTIFY only when that fails (someone
// holds the gate: a waiter, or a caller being admitted), so that an
// uncontended release does not queue for the database's notify lock,
// which every notifying commit takes. The waiter it wakes tries the
// slots, and reads no lock table either.
//
// Why a waiter waits for a NOTIFY, and tries again every 100 ms: a permit
// comes back by a Release, which sends a NOTIFY, or by the end of its
// holder's session (a killed process, a terminated backend, a server
// restart), which sends none. PostgreSQL wakes a session waiting for a
// lock when that one lock is granted, and delivers a NOTIFY only to an
// idle session; it has no wait for "any one of N locks". A waiter blocked
// on one busy slot would see that holder's end at once, but not a Release
// of another slot; a waiter idle on LISTEN sees every Release at once, and
// a holder's end at its next try of the slots, 100 ms at most
// (TestKilledPermitHolderGivesItsPermitBack; locktest's
// PermitBackAfterLoss). A try is N try-locks on the gate holder's session,
// never a scan of the server's lock table (TestABulkheadHandOffReadsNoLockTable).
//
// Order: waiters are admitted in arrival at the gate's queue on the
// server, FIFO as a plain lock's, the one at its head keeping those behind
// it waiting (TestBulkheadWaitersInArrivalOrder). A NoWait caller takes no
// gate: it is granted whenever a slot is free and no writer holds or waits
// for the key, whoever holds the gate (TestNoWaitBulkheadAdmittedWhileAnotherPassesTheGate)
// — also in the moment between a Release and the waiting gate holder's
// try, when it takes the permit that waiter was woken for (the waiter then
// waits for the next). Limits:
//
//   - PostgreSQL keeps no count per key: each caller tries its own
//     Permits of slots. Callers of one key that pass different Permits
//     each enforce their own (one with Permits 2 is admitted while slot 0
//     or 1 is free, whatever slots 2–4 hold); a reader with Permits 0
//     takes no slot, and is admitted beside any number of permit holders.
//     So give every caller of a key the same Permits, as the package
//     tenace asks (the in-process provider keeps the first holder's;
//     pglock cannot).
//   - A slot's lock is (OID, id XOR the slot number's bits reversed): one
//     to one while the table's ids stay below 2^(32−b) for holders of one
//     key below 2^b (a million keys and 4,096 holders of one key, say).
//     Past that two keys' slots may share a lock: never more than N
//     holders of a key, but a key may see a slot taken by another's holder.
//   - A waiting bulkhead caller pins its connection, as any waiter does.
//     A waiter that gives up (its Timeout, its ctx, Close) keeps its
//     session: one round trip unlocks whatever the session holds (the
//     gate, a slot, a grant that landed as it gave up) and stops
//     listening, and the connection goes back to the pool
//     (TestABulkheadWaiterThatGivesUpKeepsItsSession). A Timeout on the
//     system clock ends a wait for the gate or behind a writer on the
//     server (lock_timeout); the wait for a NOTIFY runs no statement, and
//     ends on the client. A statement cut short by ctx (or a Timeout on
//     another Clock) is cancelled, and the session kept once the server
//     has answered every cancel request sent for it: the server signals
//     the backend before it closes the request's connection, and a backend
//     drops a cancel signal that comes while it waits for a command, so
//     none can hit the next statement. A request left unanswered within
//     the cancel's grace (a stalled server) closes the connection, as
//     every cancelled statement of an exclusive or shared caller does
//     (see Waiting).
//
// Every rule of the exclusive lock holds for shared leases: each grant,
// shared too, gets its own fencing token from the table's sequence,
// strictly increasing (readers' grants are numbered in the order of their
// nextval); a lease is lost with its connection, its TTL or Close,
// and its Release gives back its share alone; Timeout, NoWait, ctx and the
// outage rules (ErrNoReply, the server's lock_timeout verdict, a stalled
// server: TestSharedWaitersOnAStalledServer) are the same. A waiting writer
// holds the gate of no one, so a bulkhead and a writer never wait for each
// other in a cycle. Stats counts a shared lease as one lease in Held, as
// an exclusive one, and a shared waiter once in Waiting. AcquireSet takes
// its keys exclusive (Shared is an option error).
//
// # Errors
//
// A failing statement returns its error at once (through a Lock, a
// *tenace.UnexpectedError), except a statement whose connection had died,
// which is tried once more, on a connection found alive: the pool's idle
// connections (which may have died together, after a server restart say)
// are pinged one by one and the dead ones closed, up to WithMaxConns + 1 of
// them, past which the pool dials a new one; all within the call's Timeout
// and ctx. If that statement fails too (a connection that died between the
// ping and the statement, or a server still down), its error is returned.
// Nothing else retries.
package pglock

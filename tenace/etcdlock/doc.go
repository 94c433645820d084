// Package etcdlock is a tenace.LockProvider on an etcd cluster (v3 API),
// for locks that must hold across processes and machines on the store whose
// guarantees are proven: Raft, linearizable writes, leases kept alive by
// the server's own protocol, and revisions that only grow.
//
//	client, err := clientv3.New(clientv3.Config{Endpoints: endpoints})
//	...
//	defer client.Close()
//	locks := etcdlock.New(client)
//	defer locks.Close() // before the client's Close
//	p := tenace.NewPolicy().WithLock(tenace.LockOptions{Provider: locks, Key: "reports"})
//	err = p.Execute(ctx, buildReport) // buildReport's ctx ends if the lock is lost
//
// # How it works
//
// Each key is a queue: the etcd keys under prefix + key + "/" (the key with
// "%" escaped as "%25" and "/" as "%2F", so that no key's queue lies inside
// another's). Acquire takes an etcd lease of its own (the window; see
// "Leases" for the spare that spares it the grant), then, in one
// transaction, puts its queue entry — prefix + key + "/" + the lease
// ID — attached to that lease, and reads the entry with the lowest create
// revision: if that is its own, the lock is granted (a shared caller reads
// more: see "Shared locks and permits"). Otherwise it waits as
// concurrency.Mutex does: it reads its predecessor, the entry created last
// before its own, and watches only that entry's deletion (a release wakes
// one waiter, not every waiter: no herd), then looks again, until no entry
// older than its own is left. Release deletes the grant's entry, which
// wakes the next waiter. Costs: an uncontended acquire is one request (the
// transaction; two with the lease grant when no spare lease is at hand)
// and a release one, each a Raft write; a waiter adds a read and a watch per predecessor
// it outlives. The watch starts at the revision after that read: a watch
// from a revision etcd has already reached (concurrency.Mutex starts at
// the read's own) is served by etcd's catch-up loop, which runs every
// 100ms, while one from the next revision is fed as writes happen — so a
// hand-off to a waiter that has just queued takes a few milliseconds where
// concurrency.Mutex's takes about 50; with waiters queued for a while the
// gap is 1.4-1.6x (measured against it on the same server: bench/README.md).
//
// # Who gets the lock: FIFO by create revision
//
// Waiters are granted in the order their entries were created, whichever
// process they come from (tested with four processes). The exceptions:
//
//   - Creation is not the order of the Acquire calls: the lease grant comes
//     first, and two calls made at nearly the same moment create their
//     entries in either order.
//   - NoWait never queues: a try whose entry is not the oldest (for a
//     shared caller: is not admitted at once) deletes it (revokes its
//     lease) and returns (nil, nil), as concurrency.Mutex's TryLock does.
//   - A waiter that gives up — its Timeout, ctx or the provider's Close —
//     revokes its lease before Acquire returns (when etcd answers: within
//     10ms past a Timeout, 1s otherwise; then in the background), so that the
//     next in line is not held up by an entry nobody waits behind; a waiter
//     whose lease is lost leaves the queue with an error.
//
// Stats counts a caller as waiting from the moment its entry is in etcd
// until it is granted or gives up, so the conformance suite's FIFO check
// applies as written. Release synchronizes before the Acquire it unblocks,
// in any process: the delete is a Raft write, and the waiter is granted on
// seeing its effect.
//
// # Shared locks and permits
//
// The provider supports LockAcquireOptions.Shared and Permits
// (SupportsShared is true): readers of a read/write lock (Shared, Permits
// 0) hold a key together, a writer (Shared false) alone; a keyed bulkhead
// (Shared, Permits N) admits at most N holders at once. Shared callers
// queue in the same queue, by the same create revision, with the mode in
// the entry's name — exclusive entries keep the name above, shared ones
// are prefix + key + "/s" + the lease ID, so that the exclusive entries of
// a queue are one etcd range — and the permit count asked for in its value
// (exclusive entries have an empty count, the form an older version
// writes, so processes of an older version queue with these, and wait as writers
// behind their readers); the count is followed by a newline, the time the
// caller joined the queue and its owner (see WithOwner, Inspect), which
// older versions did not write. The rule, read in the transaction that queues and
// on each look while waiting:
//
//   - an exclusive entry is granted when no entry was created before it;
//   - a shared entry is granted when no exclusive entry was created before
//     it and, with a count N > 0, fewer than N entries were (grants go in
//     queue order, so those are the holders and the waiters granted before
//     it).
//
// The count in force is the head's — the oldest entry's, when it is
// shared: the first shared holder's count wins while it holds (then the
// next oldest's), whatever later callers asked for. Give every caller of
// a key the same Permits: with mixed counts the limit changes as the head
// does, and a holder admitted under a larger count keeps its permit when
// a smaller one comes into force. Permits 0 at the head admits any number.
//
// Fairness is FIFO in both modes: a writer waiting behind readers is not
// overtaken by readers that come after it (their entries are younger than
// an exclusive one), and a shared caller beyond the count waits its turn
// and keeps those behind it waiting, as x/sync/semaphore does — letting
// them pass would let a stream of readers starve a writer. A waiting
// writer watches the deletion of the entry just before it, as above; a
// shared waiter behind a writer watches the last exclusive entry before
// it; one beyond the count watches the queue's deletions, counts those of
// entries older than its own, and looks again once enough are gone for it
// to be within the count (or the head went, whose count may differ): a
// release sends one watch event to each waiter of a full bulkhead, but
// only a waiter it may admit reads the queue again. A shared caller's look reads the keys
// of every entry before its own (etcd counts a range before it filters it
// by create revision, so a count alone would not do): a cost that grows
// with the queue, small for the queues a bulkhead keeps. The rest is as for exclusive leases:
// the window and keepalive, the lost signal, the TTL, NoWait, the Timeout
// and its outage rules, Close, and the give-up that revokes the caller's
// entry. Each grant's fencing token is its entry's create revision, so
// shared holders have tokens of their own, all increasing; IsOwner works
// on a shared lease as on an exclusive one. Stats counts shared leases
// and waiters in Held and Waiting, and leaves the Shared... fields 0.
//
// # Leases: the window, the keepalive and the lost signal
//
// Every grant has an etcd lease of its own, with a TTL of one window
// (WithWindow, DefaultWindow 15s; etcd keeps whole seconds and may raise it
// to its minimum, 1.5 election timeouts). Each lease's keeper sends a
// keepalive every renewal interval (a third of the window), from the lease
// grant on — while the caller waits too; it is a goroutine started when the
// first keepalive is due, so that a lease released sooner costs none. A
// holder that dies or stops reaching the cluster frees the key when etcd
// expires the lease: within one window of its last keepalive (measured: a
// holder process killed with SIGKILL, the next waiter in another process
// granted 2.3s after the kill with a 2s window, etcd checking expiries every
// 500ms).
//
// An etcd lease carries one entry at most: that of the grant or the wait
// that has it, rather than one lease per provider, so that a waiter that
// gives up, a release that fails or a TTL that passes has a lease of its own
// to revoke or let lapse, and none leaves an entry behind that an unrelated
// live lease would keep alive. The lease grant is kept off the critical
// path: a provider keeps one spare lease, granted ahead of need in the
// background when it has none, or given back by a clean release — a release
// deletes the grant's entry, and once etcd says it did, the lease, with
// nothing attached any more, is the next Acquire's, if one try each of the
// queueing transaction and of the delete was sent (see "A member dies": no
// other try can land later and put an entry on it); else it is revoked. A
// spare is used only with at least a renewal interval and 0.5s left before
// its loss time (its keeper sends its first keepalive halfway there);
// otherwise it lapses, unused. A spare that etcd no longer has when the
// Acquire puts its entry on it (it lapsed while the process was starved of
// CPU, or was revoked) costs that Acquire a lease grant, never the call:
// etcd refuses the put, so nothing was written. Leases are never shared: a
// lost lease, a waiter's that gave up, a release that failed are revoked or
// left to lapse, never reused. A killed process's leases, spare or not,
// lapse within the window, so its keys are free within it. An uncontended
// acquire is then one Raft write (the transaction that queues) and a release
// one (the delete), as concurrency.Mutex's (bench/README.md).
//
// Leases are tenace.LosableLease: Lost is closed and Err says why (an error
// wrapping tenace.ErrLeaseLost), and a Lock ends fn's context, when:
//
//   - no keepalive got through before the loss time: the last expiry etcd
//     was told (the keepalive's TTL, measured from before that keepalive
//     was sent, so never later than the server's own) less a margin of a
//     quarter of the window, at most MaxMargin (1s). The margin covers a
//     loss timer that fires late on a loaded machine, and clock rates that
//     drift apart. So the holder is told before etcd can free the key and
//     grant it to another (tested with the holder's member stopped by
//     SIGSTOP past the window: the waiter, on the other members, is
//     granted after the holder's Lost closed). A leader change does not
//     end a lease: a new leader renews every lease for its TTL and an
//     election timeout more.
//   - a keepalive finds the lease gone (it expired, or was revoked from
//     outside): then the key is already free, and may be another's.
//   - its TTL passes (LockAcquireOptions.TTL, else WithTTL; none by
//     default), timed from the grant on the call's LockAcquireOptions.Clock:
//     the lease is lost with tenace.ErrLeaseExpired first, then revoked.
//   - the provider is closed: every lease's Lost closes at once, then the
//     leases are revoked in parallel.
//
// A lease lost by its keeper is revoked right after the signal (best
// effort: if etcd does not answer, it lapses on its own). Release after a
// loss touches nothing and returns an error wrapping tenace.ErrLeaseLost;
// so does a first Release that finds the etcd lease already gone.
//
// A holder that stalls (a GC pause, SIGSTOP) longer than the margin can
// have its key granted to another before its loss timer runs: use the
// fencing token where a late write would harm.
//
// Known etcd bug: a leader stalled past a lease's TTL (a long disk sync,
// SIGSTOP) revokes, when it runs again, leases that the new leader kept
// alive — etcd issue 15247, fixed by etcd pull request 16822 (backported
// to 3.4 and 3.5); Debian's etcd 3.4.23 predates the fix. The keys of live
// holders are then deleted without their keepalives failing: the holder
// learns it at its next keepalive (within a renewal interval), after the
// next waiter may have been granted. Fencing tokens are the defence; so is
// an etcd with the fix.
//
// # Fencing
//
// Leases are tenace.FencedLease: the token is the entry's create revision,
// a revision of the whole cluster, which strictly increases for the life
// of the cluster — across keys, grants, leader changes and restarts of
// members or of the whole cluster (tested). IsOwner gives the guard on the
// resource side when the resource is in etcd too: a comparison that holds
// in a transaction only while the entry exists with that revision, as
// concurrency.Mutex's IsOwner.
//
// # Errors, the Timeout, and a cluster that does not answer
//
//   - An unreachable cluster is an error at once: before its first
//     request, Acquire checks the client's gRPC connection. One in
//     TRANSIENT_FAILURE (every member's last dial failed) makes Acquire dial
//     every endpoint itself (TCP or a Unix socket, not through gRPC nor a
//     custom dialer of the client's): when every dial fails (refused, no
//     route), Acquire returns at once an error wrapping ErrUnreachable and
//     the first dial's error (errors.Is(err, syscall.ECONNREFUSED));
//     otherwise the connection dials again and gets 500ms (or until a
//     shorter Timeout) to succeed, and Acquire returns an error wrapping
//     ErrUnreachable if it did not. A request sent just as the last member
//     went down, before the client saw its connection close, waits with
//     gRPC's WaitForReady, as every request of the etcd client does: for
//     the Timeout (then an error, as below) or ctx.
//   - A cluster that was reached but does not answer is not a held key:
//     (nil, nil) only ever means that etcd answered that the key is held.
//     The lease grant and the queueing transaction may bring their reply
//     up to 20ms past the Timeout, and that reply decides (the queue headed
//     by another entry: (nil, nil); by the caller's own: a grant). They are
//     two Raft writes, each with a disk sync, slow on a loaded machine: with
//     a Timeout under 250ms, Acquire also asks the member beside the grant,
//     with a serializable read (no Raft round, no disk), who heads the
//     queue (again once, if this process was starved of CPU past the
//     deadline), and another entry there is etcd's answer that the key is
//     held. Without either answer, whatever the Timeout's length, Acquire
//     returns an error wrapping tenace.ErrNoReply (a Lock reports it as
//     lock.failed). Once etcd said the key is held, a waiter's later look
//     at the queue that the Timeout cuts short after 250ms or more without
//     an answer is ErrNoReply too; cut sooner, it is part of the wait:
//     (nil, nil).
//   - The Timeout is a bound: Acquire returns within Timeout + 50ms, etcd
//     stalled or not (tested with the member stopped by SIGSTOP). A ctx
//     that ends returns ctx's error, even when the grant lands at that
//     moment (the lease is then revoked).
//   - etcd's transient failures of the lease grant and of the transaction
//     that queues (codes.Unavailable: no leader, leader changed, a request
//     timed out) are retried for up to 5s or the Timeout (see "A member
//     dies"); other failures return the error at once. Once queued, a waiter's place is kept by its lease, so its
//     read-only look at the queue is retried (every 50ms) through leader
//     changes and restarts for as long as the lease lives, and a watch
//     that ended (a compaction past its start revision, a member
//     restarted) is set up again after a new read (tested: the whole
//     cluster restarted under a waiter, compactions while waiters wait).
//     A waiter whose lease is lost (the cluster down past the margin)
//     returns an error wrapping tenace.ErrLeaseLost.
//   - Release with a ctx that has no deadline is bounded by 5s. A Release
//     that fails can be called again; keepalives have stopped, so the key
//     lapses within one window if no retry gets through.
//
// # A member dies
//
// With the client on every member, the death of any one member — the
// leader or a follower, killed or stalled (SIGSTOP, a partition) — does
// not hold up a caller: an Acquire started at that moment is granted
// within about the election time and 1s (measured on three members with a
// 500ms election timeout: the leader killed, granted 0.6-1.0s after the
// kill, 0.13-0.3s after a new leader was seen; a follower killed, a few
// milliseconds; a follower stalled past the window, a few milliseconds to
// 0.26s, as the balancer's next choice is the stalled member or not). A request to a
// dead member can go unanswered for etcd's whole request timeout (5s and
// two election timeouts: a follower that has not yet seen its leader die
// forwards a proposal to it, where it is lost; a stalled member keeps its
// connection open), so every request that is safe to send twice is
// hedged: unanswered after 250ms (a keepalive: sooner, at least four tries
// before the loss time), it is sent again beside the first, and the
// client's round-robin balancer sends the new try to the next member; the
// first answer wins, and each try asks a member without a leader to say so
// at once (clientv3.WithRequireLeader). The lease grant is safe to send
// twice: a lease granted to a try whose answer is not used has nothing
// attached and lapses within the window. The queueing transaction puts the
// caller's entry only if it is not there yet (else reads its create
// revision), so that a second try of one the first already applied queues
// nothing twice; a late try can still put the entry back after the release,
// so a lease whose queueing or release took more than one try is revoked at
// the release, never a spare. A waiter's looks are reads, keepalives and
// revokes idempotent. A waiter's watch that the member serving it does not
// confirm within 250ms is cancelled and set up again after a new look, and a
// waiter looks at its queue every renewal interval even without events, so
// that a watch on a member that stalls later delays its grant by at most one
// renewal interval. Such looks, prompted by no change, leave etcd's
// last word standing: one that the Timeout cuts short unanswered gives
// (nil, nil), as the watch would have.
//
// Give the client gRPC keepalives (clientv3.Config.DialKeepAliveTime and
// DialKeepAliveTimeout, at least the server's --grpc-keepalive-min-time,
// 5s by default) so that it drops the connection to a stalled member and
// its balancer stops choosing it.
//
// # Deadlocks across processes
//
// The Lock step's detector sees the waits of one process only. A cycle
// across processes — one holds a and waits for b, another holds b and
// waits for a — is not detected on etcd: each waiter waits until its
// Timeout (forever with none), then returns (nil, nil), and its Lock
// reports contention, not a *tenace.DeadlockError. A cycle across
// processes is bounded by the Timeout only: etcd has no deadlock detector,
// where PostgreSQL's sees pglock's nested Locks. Give every Lock that may
// nest inside another a Timeout, or take the keys together as a set
// (LockOptions.Keys), which every process takes in one order, so that sets
// never wait on each other in a cycle.
//
// # Close and the client
//
// The provider does not own the client: close the provider first. Close
// fails waiting callers and later Acquires with an error wrapping
// tenace.ErrProviderClosed, loses the held leases, revokes them, and waits
// for the keepers.
package etcdlock

// Package redislock is a tenace.LockProvider on a Redis server, for locks
// that must hold across processes and machines.
//
//	client := redis.NewClient(&redis.Options{Addr: "localhost:6379", ContextTimeoutEnabled: true})
//	locks := redislock.New(client)
//	defer locks.Close()
//	p := tenace.NewPolicy().WithLock(tenace.LockOptions{Provider: locks, Key: "reports"})
//	err := p.Execute(ctx, buildReport) // ctx of buildReport ends if the lock is lost
//
// ContextTimeoutEnabled matters: without it go-redis ignores ctx deadlines
// while it waits for a reply, so on a stalled server an Acquire returns at
// the client's ReadTimeout (3s by default), not at its Timeout or ctx
// deadline. CheckClient tells, and New logs a warning through WithLogger.
//
// An outage is an error, never contention: Acquire returns (nil, nil) only
// when the server answered that another call holds the key; a server that
// refuses connections fails it at once with the cause
// (errors.Is(err, syscall.ECONNREFUSED)), and one that is reached but
// silent until the Timeout with an error wrapping ErrNoReply (and
// tenace.ErrNoReply), which a Lock reports as lock.failed.
//
// # How it works
//
// Acquire draws a random token (128 bits from crypto/rand) for the call and
// runs one Lua script, as often as it tries: if the key holds this token
// already (an earlier run whose reply was lost), it is granted; if another
// token holds it, not; if it is free, SET key token PX min(window, TTL)
// (the token followed by the grant's owner record: its owner, since and
// fencing token, for Inspect) and a new fencing token, max(the key's
// counter + 1, the server's TIME in µs), stored as the counter. A caller that must wait subscribes to the key's
// release channel first, then tries again, so no release is missed between
// the two; each release publishes on that channel, which wakes the provider's oldest
// waiter of the key to try again at once (one release, one lock: waking
// them all would only make the rest lose). All waiters of a Provider share
// one Pub/Sub connection, open while anyone waits; a channel's SUBSCRIBE and
// UNSUBSCRIBE are sent, by a goroutine of that connection, in the order its
// waiters came and went. Waiters try again when that connection breaks,
// and once it is back (a release may have gone unheard meanwhile). In case
// a message is lost anyway, a waiter also retries after a jittered
// fallback interval, and never waits past the holder's remaining PTTL, its
// own Timeout or its context without trying again. Release runs one script that deletes the key only if it
// still holds this grant's token, and publishes the release.
//
// # Keepalive and the lost signal
//
// A lease is kept on the server for a window (WithWindow, 15s by default),
// not for its whole TTL, and renewed every renewal interval (a third of the
// window by default) by a script that extends the key only if it still
// holds this grant's token. So work can run as long as it needs while its
// holder lives, and a holder that dies — or stops reaching the server —
// frees the key within one window, whatever its TTL. The TTL keeps its
// meaning, the longest time the lock is held: renewals stop at it and the
// lease is lost with tenace.ErrLeaseExpired. Without a TTL (the default) a
// lease is held until Release, or until it is lost.
//
// Leases are tenace.LosableLease: Lost is closed, and Err says why (an
// error wrapping tenace.ErrLeaseLost), when a renewal finds the key gone or
// held by another token, when the TTL is reached, when the provider is
// closed, and when no renewal got through before the last expiry the
// server was told — measured from before that renewal was sent, less a
// safety margin (1% of that expiry's length + 2ms), so the holder hears of
// it before the server can free the key (see Guarantees). The Lock step ends fn's context then, with that cause, and
// emits lock.lost. Renewals are timers, not goroutines: a goroutine exists
// only while a renewal call is on the wire. Release stops them first.
//
// An acquire whose outcome is unknown — the script was sent, then an error
// or the deadline came before the reply — may have taken the key, or may
// still take it when the server runs the queued command. Acquire then
// returns no lease, and the provider voids the token in the background: a
// script that marks the token void for one window, and at least 15s (so
// that its acquire script, if it runs in that time, takes nothing), and
// deletes the key if the token holds it. The voids pending are tried in
// turn, a failed one going to the back, so that one that keeps failing
// holds up no other. Each is retried until it succeeds, or until Close, or
// until retrying is pointless: its first expiry, min(window, TTL), after
// the server first answered it with an error (the key, if the acquire took
// it, has expired by then), or the void marker's life (one window, and at
// least 15s) after the acquire failed if the server never answers. A void
// given up is logged through WithLogger.
//
// # Shared locks and permits
//
// Provider is a tenace.SharedLockProvider: an Acquire with
// LockAcquireOptions.Shared takes one of the key's permits, beside other
// shared holders and never beside an exclusive holder (Shared false, which
// takes the whole key), in every process on the server. With Permits 0 that
// is a read/write lock (readers set Shared, writers do not); with Permits
// N, at most N callers hold the key at once — a keyed bulkhead, "at most 5
// exports per customer across replicas".
//
//	locks.Acquire(ctx, "config:acme", tenace.LockAcquireOptions{Shared: true})             // a reader
//	locks.Acquire(ctx, "config:acme", tenace.LockAcquireOptions{})                         // a writer
//	locks.Acquire(ctx, "export:acme", tenace.LockAcquireOptions{Shared: true, Permits: 5}) // one of 5
//
// The shared holders of a key are a sorted set (its name and ":holders")
// whose members are the grant tokens and scores their expiry, in ms on the
// server's clock; while any holds the key, the lock name holds "shared:N"
// (N the permit count) instead of a token, expiring with the latest holder:
// at that holder's expiry itself, set as an absolute time (SET … PXAT,
// PEXPIREAT; Redis 6.2 or later), so a key whose lock name is gone has no
// live holder, and an exclusive caller that finds it free reads no
// holders.
// Each try's script first drops the holders whose expiry has passed
// (ZREMRANGEBYSCORE by the server's TIME); then it grants a shared caller
// if no exclusive holder holds the key, no writer waits (below), and the
// live holders are fewer than the count (or the count is 0); an exclusive
// caller only if the lock name is free or "shared:N" with no live holder
// left. The count is the first shared holder's, kept in "shared:N" while
// any holds the key: every caller of a key should pass the same Permits (a
// caller passing another gets the key's). Each shared grant gets its own
// fencing token from the key's counter, strictly increasing with every
// grant, shared or not (a resource that fences writes should fence only
// the exclusive holders' writes). A shared grant also writes its token's
// void marker early, with its fencing token in it, so that a copy of its
// acquire that reaches the server again (a go-redis retry) finds its own
// grant and token; its release overwrites it, so a shared grant costs the
// same marker an exclusive one's release does.
//
// A shared lease is kept alive, lost and released as an exclusive one
// (Keepalive, below), per holder: its renewal re-scores only its own
// member, if it is still there and live, and otherwise reports the lease
// lost; Release removes its member, frees the lock name with the last
// holder, and publishes the release, which wakes a waiter, and a waiter
// granted a shared permit wakes the next. A holder that dies gives its
// permit back within one window; the TTL, Close and the loss rules hold as
// for an exclusive lease, and so do the outage rules (ErrNoReply,
// ECONNREFUSED) and the voids of an acquire whose outcome is unknown. A
// shared lease counts as one in Stats' Held. AcquireSet takes its keys
// exclusive only (Shared is refused there with tenace.ErrInvalidOption),
// and sees a key held shared as held.
//
// Versions before shared locks see a key held shared as held (its lock
// name holds "shared:N", never their token) and leave it alone, and every
// version sees their exclusive holders: so processes on the previous
// version and on this one still exclude each other on every key, shared
// ones included, as long as only this version asks for Shared. A key whose
// shared holders died is seen held by the previous version (and by a set)
// until the latest expiry any of them was given, at most one window.
//
// # Fairness between readers and writers
//
// There is no queue on the server: across processes, waiters race for a
// key when it is released (see Guarantees), and a stream of readers, each
// granted while the others still hold the key, could keep a writer out
// for ever. So a waiting writer marks the key: an exclusive caller that
// finds the key held shared, and would wait for it (a Timeout other than
// tenace.NoWait), adds its token to the key's writers waiting (a sorted
// set, the key's name and ":writers", scored by when the mark lapses), and
// every try it makes while it waits and finds the key held shared renews
// its mark. While any live mark
// is there, no shared caller is granted, even if a permit is free: the
// readers that hold the key finish, the writers waiting take it in turn,
// and new readers are granted after them. A writer takes its mark off when
// it is granted, and, in the background, when it gives up (a Timeout, ctx,
// an error). The rule and its limits:
//
//   - Writers first: a stream of writers can keep readers out, as readers
//     alone could keep a writer out without the mark; one waiting writer
//     holds back every new reader of the key, including a process's own
//     readers of a key it holds shared (so never wait for a write to a key
//     you hold for reading: that waits for your own reader, and holds back
//     the readers it would need to finish).
//   - A mark lapses three fallback retry intervals (WithRetryInterval, 3s
//     by default), and at least 250ms, after its writer's last try, since a
//     waiter tries again at least once an interval: a writer whose process
//     dies while it waits holds back new readers that long. A writer whose
//     process is starved of CPU past that loses its mark until its next
//     try: fairness, not safety, is lost.
//   - Among writers, and among the callers of a bulkhead (all shared, so
//     no marks), there is no order across processes; within a process the
//     oldest waiter of a key tries first on a release. A shared waiter woken
//     by a release and refused because a writer waits wakes this process's
//     oldest writer of the key, if one waits here.
//   - A writer waiting for an exclusive holder does not mark (so a key
//     used exclusive only costs no mark): when that holder releases,
//     readers already waiting can win the race, once, and the writer marks
//     on its next try. A mark left by a try whose reply was lost (an
//     outage) is not taken off: it lapses.
//   - AcquireSet does not mark: a set waiting for a key held shared can be
//     kept out by new readers.
//
// # Several keys
//
// AcquireSet (tenace.AcquireAll, and a Lock with LockOptions.Keys) takes a
// set of keys all or none. When their names share a hash slot — always on
// a *redis.Client, standalone or failover; on a Cluster or a Ring when the
// keys share a hash tag (see Names: "acct}7" and "acct}9" share "acct") —
// one Lua script takes every key or none, each with its own token, expiry
// and fencing token exactly as Acquire's script gives them, so sets and
// single callers exclude each other; a set that waits holds no key, which
// makes it deadlock-free against any caller, and subscribes to every key's
// release channel, trying again on any of them. Each key then has a lease
// of its own, renewed and lost as a single one. Keys on different slots
// are taken one at a time in sorted order, with Acquire
// (tenace.AcquireAll's generic path): deadlock-free among sets, holding
// the keys granted while it waits for the next.
//
// # Deadlocks
//
// A Lock that asks for a key its own execution already holds is refused at
// once with a *tenace.DeadlockError, on this provider as on any (the Lock
// step checks it). A cycle through two or more keys is not detected: not
// between processes (each sees only its own waits, and the server keeps
// no record of who waits for whom), and not between executions of one
// process either (tenace's cycle detector sees the waits of a
// tenace.MemoryLockProvider only). Such a cycle is bounded by the
// Timeouts alone: each waiter of it waits until its Timeout (or ctx) ends
// and returns (nil, nil), which a Lock reports as contention
// (*tenace.LockNotAcquiredError); with a Timeout of 0 it waits forever.
// A cycle across processes is bounded by the Timeout only: Redis has no
// deadlock detector, where PostgreSQL's sees pglock's nested Locks.
// Give nested Locks a Timeout, take keys in one order, or take them
// together as a set (AcquireSet, LockOptions.Keys), which on one slot
// never waits while holding a key.
//
// # Names
//
// The lock of key is named prefix + "{" + key + "}"; its fencing counter,
// release channel, void markers, shared holders, writers waiting and
// owner records are that name and a suffix (":fence", ":released",
// ":void:" and the token, ":holders", ":writers", ":owners"), so they
// share its hash tag — key up to its first "}" — and the scripts work on a
// Redis Cluster. The prefix
// must not contain braces. A key that starts with "}" would make that tag
// empty, which Redis ignores (the names would hash to different slots), so
// such a key is named prefix + "}{" + h + "}" + key + "}" instead, and the
// same suffixes, where h is the key's 64-bit FNV-1a hash in 16 hex digits:
// its tag is h. No two keys share a name: every other name has "{" where
// these have "}". (Versions before
// this scheme named a key starting with "}" prefix + "{" + key + "}": a
// process running one of them and one running this version do not exclude
// each other on such keys; on every other key they do.)
//
// # Defaults
//
//	TTL            none: held until Release (WithTTL; per call, tenace.LockOptions.TTL; at least 1ms)
//	window         15s  (WithWindow): how long a dead holder keeps the key
//	renewal        every window/3 (WithRenewInterval): 12 renewals a minute per held lease
//	prefix         "tenace:lock:" (WithPrefix)
//	fallback retry 1s, jittered between half and all of it (WithRetryInterval)
//
// # Guarantees and their limits
//
//   - Mutual exclusion holds while a single Redis primary is the authority:
//     standalone, or the primary of a failover (sentinel) group, or the
//     primary of the key's slot in a cluster.
//   - Failover can lose a lock: Redis replicates asynchronously, so a
//     primary that fails after granting and before replicating hands a
//     replica the role without the key, and a second caller can be granted
//     the same lock. A restart of a server that keeps no data does the same.
//     Fencing tokens are the defence.
//   - Fencing tokens strictly increase per key across grants and clients,
//     and across a restart that lost every key or a failover to a replica
//     without the counter, as long as the (new) server's clock reads later
//     than the last token, in µs since 1970, of the old one: each token is
//     max(counter + 1, the server's TIME in µs). The limit: a server clock
//     stepped back, or a replica's clock behind the old primary's by more
//     than the failover took, can hand out a token below one already used.
//     A token protects a resource that checks it on every access: a read
//     raises the highest token the resource has seen and refuses a lower
//     one, a write refuses a token lower than the highest seen. Checked on
//     writes alone, a read-modify-write still loses updates when a paused or
//     expired holder writes late: its write lands between the new holder's
//     read and its write. FencedGet and FencedSet are that guard for data in
//     Redis (FenceLua, the script, for other clients). The counters are kept (an expiring counter would restart): one small string
//     key, about 70 bytes, per lock key ever used. Tokens are below 2^53.
//   - Expiry: the lease's Lost fires a safety margin before the server can
//     drop the key: each expiry the server is told (the window, or what is
//     left of the TTL, in whole milliseconds as Redis keeps it; a TTL under
//     1ms is refused with tenace.ErrInvalidOption) is measured locally from
//     before the command was sent, and Lost fires 1% of that expiry's
//     length plus 2ms before it (Redlock's allowance for clock drift and
//     late timers: 152ms with the default window). A lease capped by its
//     TTL is lost that margin before the TTL. A server clock that gains
//     more than 1% on this process's, or a process paused or starved
//     longer than the margin (GC, SIGSTOP of the holder, an overloaded
//     machine), can still let the key go before the holder hears of it:
//     fencing tokens cover that.
//   - Renewal never extends a lock that is no longer this grant's (the
//     script checks the token); one that reaches the server after Release
//     finds nothing to extend.
//   - No lock held by nobody: when Acquire returns no lease (an error, ctx's
//     end, the Timeout), the key is not held by this call once the server
//     has answered the void (above) — within about 50ms of the server
//     answering again after a stall, once the voids queued ahead of it have
//     run (one that keeps failing is sent to the back; on a Cluster, one
//     whose node is stalled costs its call's second).
//     Before that, if the provider is closed first, and if the void is
//     given up (a stall longer than the void marker's life, a void the
//     server keeps refusing), such a key can stay held for its first
//     window (or its TTL, if shorter).
//   - An outage is an error, never "held": Acquire returns (nil, nil) only
//     when the server answered that another call holds the key; a refused
//     connection, a failed dial or an error reply is an error at once
//     (wrapping the cause: errors.Is(err, syscall.ECONNREFUSED)), and a
//     server reached but silent until the Timeout is an error wrapping
//     ErrNoReply (and tenace.ErrNoReply), whatever the Timeout's length;
//     a Lock reports both as lock.failed, not lock.rejected. A try in
//     flight at the Timeout has 20ms more for its reply, which then
//     decides; see Provider.Acquire for how a try without one is judged.
//     The refusal is seen at once on a *redis.Client (standalone or
//     failover): a try without a reply after 5ms dials the server itself,
//     bypassing go-redis's dial retries (about 2s with its defaults), with
//     the client's own Dialer (so a TLS handshake, or a failover client's
//     question to its sentinels, per such try). A failed dial is taken as
//     the server's: with a Dialer that fails while the pool's connections
//     still reach the server (sentinels down), a try unanswered for 5ms
//     fails with it; later tries are still sent, and the first answered
//     within 5ms ends that. On a Cluster or a Ring client the refusal comes
//     when go-redis gives up, or, past the Timeout, as ErrNoReply.
//   - Timeout and ctx bound Acquire, Redis calls included, on a client with
//     ContextTimeoutEnabled (the Timeout plus the 20ms a try in flight has
//     for its reply, and this process's scheduling latency), also while the shared Pub/Sub connection is
//     being opened, or re-opened after it broke: a waiter waits for its
//     SUBSCRIBE no longer than its Timeout or ctx, and one that leaves does
//     not wait for its UNSUBSCRIBE (see Provider.Acquire). A ctx that ends
//     during a call returns ctx's error, never the i/o error it caused.
//   - Release deletes the key only if it holds this grant's token; after a
//     loss it returns an error wrapping ErrLeaseLost and never touches
//     another holder's lock. A Release that failed can be called again; once one
//     succeeded, Release returns nil. A retry after a failed call that finds
//     the key no longer this grant's returns nil: the failed call may have
//     deleted it. A release also voids the grant's token for a window, and
//     at least 15s whatever the TTL, so that a call of it that reaches the
//     server twice (a go-redis retry, sent after a read timeout: 3s by
//     default) reports the release, not a loss, and a late copy of the
//     grant's acquire takes nothing — also when the lease had lapsed and
//     the release found the key gone or another's. 15s covers go-redis's retries with its
//     default options (3 retries, each after a 3-s read timeout); with a
//     longer ReadTimeout or more MaxRetries the markers live as long as the
//     client may still send a copy (its sends × ReadTimeout, plus the
//     backoffs), for the clients New can read the options of
//     (*redis.Client, *redis.ClusterClient, *redis.Ring). A copy held up
//     longer than the marker (by the network, or a client whose reads never
//     time out) is not stopped: an acquire copy takes the key for its
//     first expiry, min(window, TTL), as a holder that died would. The
//     markers cost about 190 bytes of server memory per release (and per
//     void) for that long. A Release whose ctx has no deadline (the Lock
//     step's) gives up after one window on a stalled server, when the key
//     lapses anyway.
//   - Not FIFO: waiters in different processes race for the key when it is
//     released; in each process the oldest waiter tries again on the release
//     message, and the first script to run wins. Within one process waiters
//     are woken roughly in arrival order (a newcomer's first try can still
//     take a free key); for strict FIFO inside a process put a Lock on the
//     MemoryLockProvider in front of this one.
//   - Errors: a Redis command that fails returns its error at once
//     (through a Lock, an *tenace.UnexpectedError); the provider retries
//     nothing but the voids (and, once, a first try whose reply this
//     process was too starved of CPU to read in time). go-redis may retry
//     a command on its own (MaxRetries): the scripts are idempotent for
//     their token, so that is safe. On a server that refuses connections
//     go-redis dials up to DialerRetries times (5), DialerRetryTimeout
//     (100ms) apart, for each of a command's MaxRetries+1 sends (4), about
//     2s in all; Acquire does not wait for that on a *redis.Client (see
//     above). Release and the renewals do: a client with DialerRetries: 1,
//     DialerRetryTimeout: 1ms and MaxRetries: -1 reports a refusal to them
//     in about a millisecond (at the cost of go-redis's retries, on a new
//     connection, of a command whose pooled connection had broken).
package redislock

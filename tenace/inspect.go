package tenace

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"strconv"
	"time"
)

// HolderInfo describes one grant of a key, as a provider's Inspect or List
// reports it: who holds the key, how, and since when.
type HolderInfo struct {
	// Owner names the holder: the owner label of the provider value that
	// granted it (see DefaultOwner), followed by the caller's own label
	// when the Lock was given one (LockOptions.Owner), as "owner (label)".
	// "" when the engine keeps no owner for the grant (a grant made by a
	// version of the provider that stored none).
	Owner string
	// Shared is true for a shared grant: a reader of a read/write lock, or
	// one of the permits of a keyed bulkhead.
	Shared bool
	// Permits is the key's permit count for a shared grant (0: any number
	// of shared holders); 0 for an exclusive grant.
	Permits int
	// Token is the grant's fencing token; 0 when the provider has none.
	Token uint64
	// Since is when the key was granted to this holder; the zero Time when
	// the provider does not know.
	Since time.Time
	// Expires is when the grant ends unless it is renewed (a distributed
	// provider's TTL or window); the zero Time when it never expires on
	// its own (MemoryLockProvider, a PostgreSQL session's advisory lock).
	Expires time.Time
}

// WaiterInfo describes one caller waiting for a key, where the engine
// records its waiters.
type WaiterInfo struct {
	// Owner names the waiter as HolderInfo.Owner names a holder; "" when
	// the engine does not know it.
	Owner string
	// Shared is true for a caller that waits to take the key shared.
	Shared bool
	// Since is when it began to wait; the zero Time when unknown.
	Since time.Time
}

// KeyInfo is what a provider knows about one key at one moment: its
// holders and its waiters. A free key with nobody waiting has no holders,
// Waiting 0 and no Waiters.
type KeyInfo struct {
	// Key is the lock key, whole (arbitrary bytes: quote it before showing
	// it to a person).
	Key string
	// Holders are the key's current grants: one for an exclusive lock, up
	// to the permit count for a shared one; none when the key is free.
	Holders []HolderInfo
	// Waiting is the number of callers waiting for the key, as far as the
	// provider can see them: every waiter for MemoryLockProvider; for a
	// distributed provider, the waiters its engine records (see the
	// provider's documentation).
	Waiting int
	// Waiters are the waiters the provider can name, in the order they
	// would be granted when it knows it (oldest first); it may list fewer
	// than Waiting.
	Waiters []WaiterInfo
	// LongestWait is how long the oldest waiter has waited so far; 0 when
	// nobody waits or the provider does not know.
	LongestWait time.Duration
}

// ListOptions select and page the keys a provider's List returns.
type ListOptions struct {
	// Prefix keeps only the keys that begin with it; "" lists every key.
	Prefix string
	// Cursor continues a listing: "" for the first page, then the Next of
	// the page before. A cursor is opaque and belongs to the provider that
	// returned it.
	Cursor string
	// Limit is the most keys a page holds; 0 means 100. A provider may
	// return fewer, even none, on a page that is not the last: only an
	// empty Next ends the listing.
	Limit int
}

// ListPage is one page of a provider's List.
type ListPage struct {
	// Keys are the held keys of this page, each with what Inspect would
	// say of it.
	Keys []KeyInfo
	// Next is the cursor of the next page; "" when this page is the last.
	Next string
}

// Inspector is the optional interface of a provider that can say who holds
// a key, since when, and who waits: the question asked of every stuck lock.
// Every provider of this repository implements it. Both methods only read:
// they never grant, release, queue or renew a lock, and never make a key
// look held or free to an Acquire.
//
// An Inspect of a key reports its holders and waiters at one moment
// (consistent with itself, not with a later call). A List pages through the
// held keys (and, for providers that see them, the keys only waited for)
// with a cost bounded by the page (a scan, an index or a range read, never
// a read of every key at once); a key that changes while a listing runs may
// appear on two pages or on none, as with any paged listing.
//
// An outage is an error here too, as in Acquire: a server that refused,
// failed or did not answer within ctx is an error (wrapping ErrNoReply for
// silence), never an empty answer.
type Inspector interface {
	// Inspect reports the key's holders and waiters.
	Inspect(ctx context.Context, key string) (KeyInfo, error)
	// List returns one page of the keys held (or waited for) whose names
	// begin with opts.Prefix.
	List(ctx context.Context, opts ListOptions) (ListPage, error)
}

// DefaultOwner returns the owner label a provider value uses when none is
// given: the host name, the process id and a short random suffix, as
// "host/pid 4127/3f9c" — distinct for two provider values of one process,
// so a holder can be told from another. Give a provider a label of your own
// (a pod name, a job id) with its owner option (WithOwner for
// MemoryLockProvider; each distributed provider has its own).
func DefaultOwner() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "unknown-host"
	}
	var b [2]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails (Go 1.24+)
	return host + "/pid " + strconv.Itoa(os.Getpid()) + "/" + hex.EncodeToString(b[:])
}

package tenace

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"tenace.dev/tenace/shard"
)

// namedWaiters is the most waiters Inspect and List name per key (KeyInfo
// counts them all in Waiting): the oldest, which are the ones a stuck key
// is about. It bounds what one key costs the shard to answer.
const namedWaiters = 100

// maxListLimit is the most keys a page of List holds, whatever
// ListOptions.Limit asks for.
const maxListLimit = 1000

// Owner returns the provider's owner label (see WithOwner).
func (p *MemoryLockProvider) Owner() string {
	p.mustBeMade("Owner")
	return p.owner
}

// Inspect reports who holds key and who waits for it: its holders (one
// exclusive holder, or every shared one, each with its owner — the
// provider's label and the Lock's, see WithOwner — its fencing token and
// when it was granted), the number of its waiters, the oldest 100 of them
// by name (owner, mode, since when), and how long the oldest has waited.
// A key nobody holds has no holders and no waiters (a key waited for is
// held). Grant and wait times are the system clock's (not a Lock's
// LockOptions.Clock), to the batch of the key's shard that made them.
//
// It is one message to the key's shard, answered in its turn after every
// message sent to it before: read-only, it never grants, releases or
// queues anything, and the answer is the shard's state at one moment. It
// returns ctx's error when ctx ends first (always when it has ended before
// the call), ErrProviderClosed after Close,
// and ErrMissingKey for an empty key.
func (p *MemoryLockProvider) Inspect(ctx context.Context, key string) (KeyInfo, error) {
	p.mustBeMade("Inspect")
	if key == "" {
		return KeyInfo{}, ErrMissingKey
	}
	if p.closed.Load() {
		return KeyInfo{}, ErrProviderClosed
	}
	if err := ctx.Err(); err != nil {
		// The shard could answer before its reply's wait sees ctx done.
		return KeyInfo{}, err
	}
	v, ok, err := p.group.For(key).Inspect(ctx, key, namedWaiters)
	if err != nil {
		return KeyInfo{}, p.inspectError(err)
	}
	if !ok {
		return KeyInfo{Key: key}, nil
	}
	return p.keyInfo(v, time.Now()), nil
}

// List returns a page of the held keys (a key waited for is held) that
// begin with opts.Prefix, each as Inspect reports it, sorted by key within
// the page; page after page, with Next as the next Cursor, until Next is
// "". The order across pages is the provider's own, not sorted.
//
// Each page costs a bounded amount, whatever the provider holds: one
// message to a shard for each shard the page reaches, and each shard
// looks at no more than 4 × Limit + 64 of its keys per page, so a page may
// hold fewer keys than Limit (even none) and still not be the last. When
// no key is taken or freed while the listing runs, it lists every held key
// exactly once; a key taken or freed meanwhile may be listed twice or not
// at all. Limit is at most 1000 (more is taken as 1000); a negative Limit,
// or a Cursor this provider did not return, is an error wrapping
// ErrInvalidOption. Errors are as Inspect's.
func (p *MemoryLockProvider) List(ctx context.Context, opts ListOptions) (ListPage, error) {
	p.mustBeMade("List")
	limit := opts.Limit
	switch {
	case limit < 0:
		return ListPage{}, invalidOption("ListOptions.Limit", limit, "use 0 for 100 keys a page, or N > 0 for at most N")
	case limit == 0:
		limit = 100
	case limit > maxListLimit:
		limit = maxListLimit
	}
	sh, pos, err := p.parseCursor(opts.Cursor)
	if err != nil {
		return ListPage{}, err
	}
	if p.closed.Load() {
		return ListPage{}, ErrProviderClosed
	}
	if err := ctx.Err(); err != nil {
		return ListPage{}, err
	}
	budget := 4*limit + 64
	var page ListPage
	var views []shard.KeyView
	for ; sh < p.group.Shards(); sh, pos = sh+1, 0 {
		keys, next, err := p.group.Shard(sh).List(ctx, opts.Prefix, pos, limit-len(views), budget, namedWaiters)
		if err != nil {
			return ListPage{}, p.inspectError(err)
		}
		views = append(views, keys...)
		if next >= 0 {
			page.Next = strconv.Itoa(sh) + "." + strconv.Itoa(next)
			break
		}
		if len(views) == limit {
			if sh+1 < p.group.Shards() {
				page.Next = strconv.Itoa(sh+1) + ".0"
			}
			break
		}
	}
	now := time.Now()
	page.Keys = make([]KeyInfo, len(views))
	for i, v := range views {
		page.Keys[i] = p.keyInfo(v, now)
	}
	slices.SortFunc(page.Keys, func(a, b KeyInfo) int { return strings.Compare(a.Key, b.Key) })
	return page, nil
}

// parseCursor reads a List cursor: "shard.position" ("" is the start).
func (p *MemoryLockProvider) parseCursor(c string) (sh, pos int, err error) {
	if c == "" {
		return 0, 0, nil
	}
	a, b, ok := strings.Cut(c, ".")
	sh, err1 := strconv.Atoi(a)
	pos, err2 := strconv.Atoi(b)
	if !ok || err1 != nil || err2 != nil || sh < 0 || sh >= p.group.Shards() || pos < 0 {
		return 0, 0, fmt.Errorf("%w: ListOptions.Cursor %q is not a cursor of this MemoryLockProvider's List; use \"\" to start, then each page's Next", ErrInvalidOption, c)
	}
	return sh, pos, nil
}

// inspectError is the error of an Inspect or List the shards did not
// answer.
func (p *MemoryLockProvider) inspectError(err error) error {
	if err == shard.ErrStopped {
		return ErrProviderClosed
	}
	return err
}

// keyInfo turns a shard's view of a key into a KeyInfo, at now.
func (p *MemoryLockProvider) keyInfo(v shard.KeyView, now time.Time) KeyInfo {
	k := KeyInfo{Key: v.Key, Waiting: v.Waiting, Holders: make([]HolderInfo, len(v.Holders))}
	for i, h := range v.Holders {
		k.Holders[i] = p.holder(h)
	}
	if len(v.Waiters) > 0 {
		k.Waiters = make([]WaiterInfo, len(v.Waiters))
		for i, w := range v.Waiters {
			k.Waiters[i] = WaiterInfo{Owner: p.ownerOf(w.Label), Shared: w.Shared, Since: p.group.Time(w.Since)}
		}
		k.LongestWait = max(now.Sub(k.Waiters[0].Since), 0)
	}
	return k
}

// holder is a shard's view of a grant as a HolderInfo.
func (p *MemoryLockProvider) holder(h shard.HolderView) HolderInfo {
	return HolderInfo{Owner: p.ownerOf(h.Label), Shared: h.Shared, Permits: h.Permits, Token: h.Token, Since: p.group.Time(h.Since)}
}

// ownerOf is the owner of a grant or wait whose Lock's label is label.
func (p *MemoryLockProvider) ownerOf(label string) string {
	if label == "" {
		return p.owner
	}
	return p.owner + " (" + label + ")"
}

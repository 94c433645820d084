package redislock

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"tenace.dev/tenace"
	"tenace.dev/tenace/internal/keyfmt"
)

var _ tenace.Inspector = (*Provider)(nil)

// ownersSuffix names the hash, beside a key's lock name, where each shared
// grant records its owner: field the grant's token, value its owner record
// (see parseOwned). The acquire script writes it in the grant's own run,
// adding the grant's field (and sweeping the fields of holders gone once
// they outnumber the live ones). An exclusive grant keeps its record in
// the lock's own value instead, after its token (see holdsLua): one write
// per grant; versions before that wrote it here, and Inspect and a
// refusal still read it here for their grants. Like the fencing counter,
// the hash is kept after the release (it is small), and a record counts
// only while its token holds the key, so Inspect never shows a stale one.
const ownersSuffix = ":owners"

// WithOwner sets the provider's owner label, recorded with every grant it
// makes and shown by Inspect, List and a refusal's holder (a pod name, a
// job id); by default tenace.DefaultOwner(). A Lock's own label
// (tenace.LockOptions.Owner) follows it, as "owner (label)". It panics if
// label is empty.
func WithOwner(label string) Option {
	if label == "" {
		panic("tenace: redislock.WithOwner: the owner label must not be empty")
	}
	return optionFunc(func(p *Provider) { p.owner = label })
}

// Owner returns the provider's owner label (see WithOwner).
func (p *Provider) Owner() string { return p.owner }

// ownerOf is the owner a grant records, boxed for the acquire script's
// arguments: the provider's label (boxed once, by New), and the caller's
// after it when it gave one.
func (p *Provider) ownerOf(label string) any {
	if label == "" {
		return p.ownerArg
	}
	return p.owner + " (" + label + ")"
}

// onHeld calls f with the holder the last refusal named, if it named one.
func (a *attempt) onHeld(f func(tenace.HolderInfo)) {
	rec, ok := a.heldBy.(string)
	if !ok {
		return
	}
	h, ok := parseOwned(rec)
	if !ok {
		return
	}
	if a.heldTTL > 0 {
		h.Expires = time.Now().Add(time.Duration(a.heldTTL) * time.Millisecond)
	}
	f(h)
}

// parseOwned reads an owner record: "x" for an exclusive grant or "s" and
// the key's permit count for a shared one, the grant's time in ms since
// 1970 on the server's clock, its fencing token, and its owner, separated
// by single spaces (the owner last: it may hold spaces).
func parseOwned(rec string) (tenace.HolderInfo, bool) {
	parts := strings.SplitN(rec, " ", 4)
	if len(parts) != 4 || parts[0] == "" {
		return tenace.HolderInfo{}, false
	}
	var h tenace.HolderInfo
	if parts[0][0] == 's' {
		n, err := strconv.Atoi(parts[0][1:])
		if err != nil {
			return tenace.HolderInfo{}, false
		}
		h.Shared, h.Permits = true, n
	} else if parts[0] != "x" {
		return tenace.HolderInfo{}, false
	}
	ms, err1 := strconv.ParseInt(parts[1], 10, 64)
	fence, err2 := strconv.ParseUint(parts[2], 10, 64)
	if err1 != nil || err2 != nil {
		return tenace.HolderInfo{}, false
	}
	h.Since, h.Token, h.Owner = time.UnixMilli(ms), fence, parts[3]
	return h, true
}

// inspectScript reads a key, writing nothing: KEYS[1] the lock, KEYS[2]
// the shared holders, KEYS[3] the writers waiting, KEYS[4] the owners,
// KEYS[5] the fencing counter; ARGV[1] the release channel. It returns the
// server's time in ms, the lock's value (nil: free), its PTTL, the fencing
// counter, the live waiting writers' marks, the subscribers of the release
// channel, then three elements a holder: its token, its expiry in ms (nil
// for the exclusive holder: the PTTL is its), its owner record (nil:
// none). Shared holders past their expiry are left out, as the acquire
// script would prune them.
var inspectScript = redis.NewScript(inspectLua)

// inspectLua is inspectScript's source.
const inspectLua = `
local t = redis.call('TIME')
local ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local v = redis.call('GET', KEYS[1])
local out = {string.format('%.0f', ms), v or false, redis.call('PTTL', KEYS[1]),
	redis.call('GET', KEYS[5]) or false,
	redis.call('ZCOUNT', KEYS[3], '(' .. string.format('%.0f', ms), '+inf'),
	redis.call('PUBSUB', 'NUMSUB', ARGV[1])[2]}
local n = #out
local function add(token, exp)
	out[n + 1] = token
	out[n + 2] = exp
	out[n + 3] = redis.call('HGET', KEYS[4], token)
	n = n + 3
end
if v and string.sub(v, 1, 7) == 'shared:' then
	local h = redis.call('ZRANGEBYSCORE', KEYS[2], '(' .. string.format('%.0f', ms), '+inf', 'WITHSCORES')
	for i = 1, #h, 2 do
		add(h[i], h[i + 1])
	end
elseif v then
	local sp = string.find(v, ' ', 1, true)
	if sp then
		out[n + 1] = string.sub(v, 1, sp - 1)
		out[n + 2] = false
		out[n + 3] = string.sub(v, sp + 1)
	else
		add(v, false)
	end
end
return out
`

// inspectKeys are the names inspectScript takes for key, and its
// argument.
func (p *Provider) inspectKeys(key string) ([]string, string) {
	lock, fence, channel := p.names(key)
	return []string{lock, lock + ":holders", lock + ":writers", lock + ownersSuffix, fence}, channel
}

// Inspect reports key's holders and waiters, in one read-only script run
// (tenace.Inspector): it never changes a lock.
//
// A holder is named by its owner record, which this version of the
// provider writes with every grant (Owner, Since and the fencing Token;
// an exclusive holder without one — a grant of a process running an older
// version — has Owner "" and a zero Since, and the key's last fencing
// token). Expires is the server's expiry
// of the grant: the end of its current window, moved on by each renewal.
// Since and Expires are on the server's clock.
//
// Redis keeps no queue of waiters: a waiter is a subscription to the key's
// release channel, one per process however many of its callers wait. So
// Waiting is the number of processes with a caller waiting (at least the
// exclusive callers that wait for shared holders, which mark the key),
// Waiters is empty and LongestWait 0.
//
// An outage is an error, as in Acquire: a server that refuses connections
// fails at once (the error wraps the dial's, so errors.Is(err,
// syscall.ECONNREFUSED) holds), and one that does not answer before ctx
// ends yields an error wrapping ErrNoReply (and tenace.ErrNoReply). It
// panics on a nil ctx; an empty key is an error wrapping
// tenace.ErrMissingKey.
func (p *Provider) Inspect(ctx context.Context, key string) (tenace.KeyInfo, error) {
	if ctx == nil {
		panic("tenace: redislock.Provider.Inspect: nil context: pass context.Background() or the caller's context")
	}
	if key == "" {
		return tenace.KeyInfo{}, fmt.Errorf("redislock: Inspect: %w", tenace.ErrMissingKey)
	}
	if p.isClosed() {
		return tenace.KeyInfo{}, errClosed
	}
	keys, channel := p.inspectKeys(key)
	var res []any
	err := p.probed(ctx, func(ctx context.Context) error {
		var err error
		res, err = inspectScript.Run(ctx, p.client, keys, channel).Slice()
		return err
	})
	if err != nil {
		return tenace.KeyInfo{}, p.readFailed(ctx, "inspecting "+keyfmt.Quote(key), err)
	}
	return readInspect(key, res)
}

// readFailed is the error of a read (Inspect, List) that failed with err:
// silence until ctx's end wraps ErrNoReply; a refused connection, an
// error reply, ctx's own cancellation are wrapped as they are.
func (p *Provider) readFailed(ctx context.Context, what string, err error) error {
	var reply redis.Error
	if !errors.As(err, &reply) && !isDialFailure(err) && !errors.Is(ctx.Err(), context.Canceled) {
		if down := p.dialNow(); down != nil {
			err = down
		} else if isTimeout(err) || ctx.Err() != nil {
			return fmt.Errorf("redislock: %s: %w before the context ended (%v)", what, ErrNoReply, err)
		}
	}
	return fmt.Errorf("redislock: %s: %w", what, err)
}

// readInspect turns inspectScript's reply into a KeyInfo.
func readInspect(key string, res []any) (tenace.KeyInfo, error) {
	info := tenace.KeyInfo{Key: key}
	if len(res) < 6 || (len(res)-6)%3 != 0 {
		return info, fmt.Errorf("redislock: inspecting %s: unexpected script reply %v", keyfmt.Quote(key), res)
	}
	nowStr, _ := res[0].(string)
	nowMS, _ := strconv.ParseInt(nowStr, 10, 64)
	value, _ := res[1].(string)
	pttl, _ := res[2].(int64)
	fenceStr, _ := res[3].(string)
	lastFence, _ := strconv.ParseUint(fenceStr, 10, 64)
	marks, _ := res[4].(int64)
	subs, _ := res[5].(int64)
	info.Waiting = int(max(marks, subs))
	shared := strings.HasPrefix(value, sharedPrefix)
	permits := 0
	if shared {
		permits, _ = strconv.Atoi(value[len(sharedPrefix):])
	}
	for i := 6; i+2 < len(res); i += 3 {
		h := tenace.HolderInfo{Shared: shared, Permits: permits}
		if rec, ok := res[i+2].(string); ok {
			if got, ok := parseOwned(rec); ok {
				h.Owner, h.Since, h.Token = got.Owner, got.Since, got.Token
			}
		}
		switch exp := res[i+1].(type) {
		case string: // a shared holder's score
			if ms, err := strconv.ParseFloat(exp, 64); err == nil {
				h.Expires = time.UnixMilli(int64(ms))
			}
		default: // the exclusive holder: the lock's PTTL
			if pttl >= 0 {
				h.Expires = time.UnixMilli(nowMS + pttl)
			}
			if h.Token == 0 {
				h.Token = lastFence
			}
		}
		info.Holders = append(info.Holders, h)
	}
	return info, nil
}

// sharedPrefix begins the lock's value of a key held shared (see
// sharedLua).
const sharedPrefix = "shared:"

// List returns one page of the keys held under opts.Prefix
// (tenace.Inspector), each with what Inspect says of it, in two round
// trips: one SCAN of the provider's names (with MATCH on the provider's
// prefix and opts.Prefix; never KEYS), then the inspection of the keys it
// found, pipelined. A page holds at most opts.Limit keys (100 when 0),
// sorted; it may hold none when the names scanned were not held locks, and
// only an empty Next ends the listing. A key held for the whole listing is
// listed at least once (SCAN's guarantee); one that changes meanwhile may
// be listed twice, or not at all.
//
// The SCAN runs on the server the client talks to: on a Redis Cluster,
// List returns an error (list each primary with a client of its own, or
// Inspect the keys). An outage is an error, as for Inspect; so are a
// negative Limit (wrapping tenace.ErrInvalidOption) and a closed provider
// (tenace.ErrProviderClosed), for List and Inspect alike.
func (p *Provider) List(ctx context.Context, opts tenace.ListOptions) (tenace.ListPage, error) {
	if ctx == nil {
		panic("tenace: redislock.Provider.List: nil context: pass context.Background() or the caller's context")
	}
	if opts.Limit < 0 {
		return tenace.ListPage{}, fmt.Errorf("%w: redislock: List: ListOptions.Limit is %d; give 0 for the default page, or a positive count", tenace.ErrInvalidOption, opts.Limit)
	}
	if p.isClosed() {
		return tenace.ListPage{}, errClosed
	}
	if _, ok := p.client.(*redis.ClusterClient); ok {
		return tenace.ListPage{}, errors.New("redislock: List scans one server's keys and cannot list a Redis Cluster's: list each primary with a provider on a client of its own, or Inspect the keys")
	}
	limit := opts.Limit
	if limit <= 0 {
		limit = 100
	}
	cursor, after, err := readCursor(opts.Cursor)
	if err != nil {
		return tenace.ListPage{}, err
	}
	var names []string
	var next uint64
	err = p.probed(ctx, func(ctx context.Context) error {
		var err error
		names, next, err = p.client.Scan(ctx, cursor, p.scanPattern(opts.Prefix), int64(max(limit, 10))).Result()
		return err
	})
	if err != nil {
		return tenace.ListPage{}, p.readFailed(ctx, "listing the keys under "+keyfmt.Quote(opts.Prefix), err)
	}
	var keys []string
	for _, n := range names {
		if k, ok := p.keyOf(n); ok && strings.HasPrefix(k, opts.Prefix) && (after == "" || k > after) {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	keys = slices.Compact(keys)
	var page tenace.ListPage
	if len(keys) > limit {
		// Too many in this batch: the next page scans it again, after the
		// last key of this one (a cursor scanned again returns at least
		// the keys it returned).
		keys = keys[:limit]
		page.Next = writeCursor(cursor, keys[limit-1])
	} else if next != 0 {
		page.Next = writeCursor(next, "")
	}
	if len(keys) == 0 {
		return page, nil
	}
	infos, err := p.inspectAll(ctx, keys)
	if err != nil {
		return tenace.ListPage{}, p.readFailed(ctx, "listing the keys under "+keyfmt.Quote(opts.Prefix), err)
	}
	for _, info := range infos {
		if len(info.Holders) > 0 {
			page.Keys = append(page.Keys, info)
		}
	}
	return page, nil
}

// inspectAll inspects keys in one pipeline.
func (p *Provider) inspectAll(ctx context.Context, keys []string) ([]tenace.KeyInfo, error) {
	run := func(ctx context.Context, load bool) ([]*redis.Cmd, error) {
		pipe := p.client.Pipeline()
		if load {
			pipe.ScriptLoad(ctx, inspectLua)
		}
		cmds := make([]*redis.Cmd, len(keys))
		for i, k := range keys {
			names, channel := p.inspectKeys(k)
			cmds[i] = inspectScript.EvalSha(ctx, pipe, names, channel)
		}
		_, err := pipe.Exec(ctx)
		return cmds, err
	}
	var cmds []*redis.Cmd
	err := p.probed(ctx, func(ctx context.Context) error {
		var err error
		cmds, err = run(ctx, false)
		if err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
			cmds, err = run(ctx, true)
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	infos := make([]tenace.KeyInfo, len(keys))
	for i, c := range cmds {
		res, err := c.Slice()
		if err != nil {
			return nil, err
		}
		if infos[i], err = readInspect(keys[i], res); err != nil {
			return nil, err
		}
	}
	return infos, nil
}

// scanPattern is the MATCH pattern of the lock names of the keys that
// begin with prefix (see Provider.names): every lock name ends with "}",
// and no other name of a key does.
func (p *Provider) scanPattern(prefix string) string {
	base := globEscape(p.prefix)
	switch {
	case prefix == "":
		return base + "*}"
	case strings.HasPrefix(prefix, "}"):
		return base + "}{" + strings.Repeat("?", 16) + "}" + globEscape(prefix) + "*}"
	default:
		return base + "{" + globEscape(prefix) + "*}"
	}
}

// keyOf is the key whose lock name is name, if name is one.
func (p *Provider) keyOf(name string) (string, bool) {
	rest, ok := strings.CutPrefix(name, p.prefix)
	if !ok || !strings.HasSuffix(rest, "}") {
		return "", false
	}
	if len(rest) >= 20 && strings.HasPrefix(rest, "}{") && rest[18] == '}' {
		if _, err := hex.DecodeString(rest[2:18]); err == nil {
			k := rest[19 : len(rest)-1]
			if lock, _, _ := p.names(k); lock == name {
				return k, true
			}
		}
	}
	if strings.HasPrefix(rest, "{") && len(rest) >= 2 {
		k := rest[1 : len(rest)-1]
		if k != "" {
			if lock, _, _ := p.names(k); lock == name {
				return k, true
			}
		}
	}
	return "", false
}

// globEscape escapes the characters MATCH gives a meaning.
func globEscape(s string) string {
	var b strings.Builder
	for i := range len(s) {
		if strings.IndexByte(`*?[]\`, s[i]) >= 0 {
			b.WriteByte('\\')
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// A List cursor is the SCAN cursor in decimal and, after a space, the last
// key listed from the batch that cursor returns, in hex ("" when the
// batch is new).
func writeCursor(scan uint64, after string) string {
	return strconv.FormatUint(scan, 10) + " " + hex.EncodeToString([]byte(after))
}

func readCursor(c string) (uint64, string, error) {
	if c == "" {
		return 0, "", nil
	}
	n, h, ok := strings.Cut(c, " ")
	scan, err := strconv.ParseUint(n, 10, 64)
	after, herr := hex.DecodeString(h)
	if !ok || err != nil || herr != nil {
		return 0, "", fmt.Errorf("%w: redislock: List: the cursor %q is not one this provider returned", tenace.ErrInvalidOption, c)
	}
	return scan, string(after), nil
}

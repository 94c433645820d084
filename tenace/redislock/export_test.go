package redislock

import (
	"context"
	"time"

	"tenace.dev/tenace"
	"tenace.dev/tenace/internal/noreply"
)

// RunReleaseScript runs l's release script once more, as a first attempt
// whose reply was lost did (go-redis then retries the call).
func RunReleaseScript(ctx context.Context, l tenace.LockLease) (int, error) {
	return l.(*lease).releaseCall(ctx)
}

// RunAcquireScript runs the acquire script of l's Acquire once more, as a
// copy of it that reaches the server late would (the call its last try
// sent, to the same script), and returns the first element of its reply:
// 1 granted, 0 held by another token, -1 voided.
func RunAcquireScript(ctx context.Context, l tenace.LockLease) (int64, error) {
	res, err := RunAcquireScriptReply(ctx, l)
	if err != nil {
		return 0, err
	}
	return res[0], nil
}

// RunAcquireScriptReply is RunAcquireScript with the integers the reply
// begins with (the third 0 when the reply has two).
func RunAcquireScriptReply(ctx context.Context, l tenace.LockLease) ([3]int64, error) {
	a := l.(*lease).a
	s := acquireScript
	if a.first {
		s = acquireFirstScript
	}
	return a.send(ctx, s)
}

// OnPubSubBackoff makes p's Pub/Sub receive loops call f with each pause
// they take before reading again after a failed read. Call it before p's
// first wait.
func OnPubSubBackoff(p *Provider, f func(time.Duration)) { p.subs.onBackoff = f }

// VoidLife is how long p's void markers live.
func VoidLife(p *Provider) time.Duration { return time.Duration(p.voidMS) * time.Millisecond }

// PendingVoids reports how many acquires p's janitor still has to undo,
// and whether its goroutine runs.
func PendingVoids(p *Provider) (pending int, running bool) {
	p.voids.mu.Lock()
	defer p.voids.mu.Unlock()
	return len(p.voids.pending), p.voids.running
}

// SetVoidLife sets how long p's void markers live, and so how long its
// janitor tries a void the server never answers. Call it before p's first
// Acquire.
func SetVoidLife(p *Provider, d time.Duration) {
	p.voidMS, p.voidArg = d.Milliseconds(), d.Milliseconds()
}

// LossMargin is how long before the expiry the server was told (px long)
// a lease is reported lost.
func LossMargin(px time.Duration) time.Duration { return lossMargin(px) }

// LateReply is how long after the Timeout a try in flight may bring its
// reply.
const LateReply = noreply.LateReply

// ProbeAfter is how long a try may go without a reply before Acquire dials
// the server itself.
const ProbeAfter = probeAfter

// SharedMember returns the sorted set of l's key's shared holders and l's
// member of it, if l is a shared lease.
func SharedMember(l tenace.LockLease) (holders, member string, ok bool) {
	a := l.(*lease).a
	return a.holdersKey(), a.token, a.shared
}

// MarkLife is how long p's waiting writers' marks last past their last try.
func MarkLife(p *Provider) time.Duration { return p.markLife() }

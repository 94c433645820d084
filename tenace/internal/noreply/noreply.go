// Package noreply tells, for the distributed providers, a server that did
// not answer from a held key: when an Acquire's Timeout cuts a server call
// short, was the server silent long enough to call it an outage (an error:
// a Lock reports lock.failed), or is the cut part of the wait ((nil, nil):
// lock.rejected)?
package noreply

import (
	"context"
	"time"

	"tenace.dev/tenace"
)

// Grace is how long a call may go unanswered when the Timeout cuts it
// short and still count as part of the wait. A healthy server answers in
// well under a millisecond; a loaded machine can hold a goroutine or a
// timer back for about 100ms; and a Timeout shorter than a round trip
// cannot tell a slow answer from none. A call left unanswered this long is
// an outage.
const Grace = 250 * time.Millisecond

// LateReply is how long after the Timeout a call in flight may still
// bring its reply, which then decides (a grant, or (nil, nil) on "held"); a
// call without a reply by then is an outage (an error wrapping
// tenace.ErrNoReply). A healthy server answers in well under a
// millisecond, but on a loaded machine the reply of a call sent just
// before the Timeout can be read a few milliseconds after it; 20ms covers
// a Go scheduler's time slice (10ms) twice, and keeps Acquire within
// Timeout + 50ms on a stalled server, the bound the providers promise,
// with 30ms for the goroutine (and any clean-up call) to run after it.
const LateReply = 20 * time.Millisecond

// StarvedBy is how late, past a call's deadline, this process may see the
// call fail and still take the failure as the server's silence. Later than
// that, the process was starved of CPU (a loaded machine, a GC pause): the
// reply may have come in time and been left unread, since a socket read
// past its deadline fails even with the reply in the buffer. The provider
// then asks once more.
const StarvedBy = 25 * time.Millisecond

// Error is a provider's ErrNoReply: its message is the provider's, and it
// unwraps to tenace.ErrNoReply, so one errors.Is covers every provider.
type Error string

// Error returns the provider's message.
func (e Error) Error() string { return string(e) }

// Unwrap returns tenace.ErrNoReply.
func (Error) Unwrap() error { return tenace.ErrNoReply }

// Unanswered is how long a call sent at sent went without a reply before
// ctx (the calls' context) cut it short: until ctx's deadline if that has
// passed (on the system clock, the Timeout's own), not until now, so that a
// goroutine held back on a loaded machine does not count as the server's
// silence; else (a Timeout on another clock) until now.
func Unanswered(ctx context.Context, sent time.Time) time.Duration {
	now := time.Now()
	if d, ok := ctx.Deadline(); ok && d.Before(now) {
		return d.Sub(sent)
	}
	return now.Sub(sent)
}

// Package noreply tells, for the distributed providers, a server that did
// not answer from a held key: when an Acquire's Timeout cuts a server call
// short, was the server silent long enough to call it an outage (an error:
// a Lock reports lock.failed), or is the cut part of the wait ((nil, nil):
// lock.rejected)?
package noreply

import (
	"context"
	"time"
)

// Grace is how long a call may go unanswered when the Timeout cuts it
// short and still count as part of the wait. A healthy server answers in
// well under a millisecond; a loaded machine can hold a goroutine or a
// timer back for about 100ms; and a Timeout shorter than a round trip
// cannot tell a slow answer from none. A call left unanswered this long is
// an outage.
const Grace = 250 * time.Millisecond

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

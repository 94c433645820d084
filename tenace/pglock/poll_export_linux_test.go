package pglock

import (
	"syscall"

	"tenace.dev/tenace"
)

// leaseOfTest is the *lease behind l (a set's: its first key's).
func leaseOfTest(l tenace.LockLease) *lease { return leaseOf(l) }

// SessionFD is the socket descriptor of l's session.
func SessionFD(l tenace.LockLease) int32 { return leaseOfTest(l).s.fd }

// Registered reports whether l's session is idle and its socket in the
// provider's poller, under that session (so that the poller starts its
// watcher when the socket becomes readable).
func Registered(l tenace.LockLease) bool {
	s := leaseOfTest(l).s
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.polled && s.p.poller != nil && s.p.poller.registered(s.fd, s)
}

// FailPoll makes the next epoll_wait of p's poller fail with errno (its
// reading goroutine then ends).
func FailPoll(p *Provider, errno syscall.Errno) {
	pl := p.poller
	pl.mu.Lock()
	defer pl.mu.Unlock()
	pl.wait = func(int, []syscall.EpollEvent, int) (int, error) { return -1, errno }
}

// ClosePollSet closes the descriptor of p's epoll set under its reading
// goroutine, which then ends. It marks the poller closed first, as close
// does, so that no add or remove reaches a closed (or reused) descriptor.
func ClosePollSet(p *Provider) {
	pl := p.poller
	pl.mu.Lock()
	pl.closed = true
	pl.mu.Unlock()
	_ = pl.ep.Close()
}

package pglock

import (
	"net"
	"os"
	"sync"
	"syscall"
)

// poller tells a provider's idle sessions that their connection has
// something to read (the server's termination message, the socket's end
// or error), through one epoll set per provider: a session given back
// with leases on it registers its socket (an epoll_ctl), and its next
// taker takes it off (another) — no timer, no goroutine, no wake-up of
// another thread on the uncontended path. The session's watcher starts
// only when the socket becomes readable, and reads what ended the
// connection. A lease held for hours costs no goroutine either.
//
// The epoll set's own descriptor waits in the Go runtime's netpoller (an
// epoll descriptor is itself pollable), read by one goroutine that close
// ends. An event is one-shot: the goroutine takes the socket off the set
// before it starts the watcher, under the session's lock.
//
// Linux drops a closed descriptor from every epoll set without an event,
// and gives its number to the next socket opened. So a socket is in the
// set only while its session is idle and its connection open: every path
// that closes an idle session's socket (session.kill) takes it off the set
// first and starts the watcher, which reads the closed socket and ends the
// session, signalling the loss of its leases; a taker, which takes it off
// the set when it takes the session, is the only other closer. sessions
// therefore never holds a descriptor whose socket was closed, and a number
// reused by another socket is never the stale one.
//
// When the reading goroutine ends for any reason (close, or an error of
// epoll_wait), the poller is marked closed and every session still in the
// set starts its watcher: a session's loss is never left unwatched. Later
// sessions are watched on a timer (see session.put).
type poller struct {
	ep   *os.File
	epfd int
	done chan struct{} // closed when the reading goroutine has exited

	mu       sync.Mutex
	closed   bool
	sessions map[int32]*session // by socket descriptor: those in the set
	// wait is epoll_wait (a test makes it fail); read under mu.
	wait func(epfd int, events []syscall.EpollEvent, msec int) (int, error)
}

// newPoller returns a provider's poller, its goroutine started; nil when
// the system refuses one (the sessions then fall back to a timer).
func newPoller() *poller {
	epfd, err := syscall.EpollCreate1(syscall.EPOLL_CLOEXEC)
	if err != nil {
		return nil
	}
	if err := syscall.SetNonblock(epfd, true); err != nil {
		_ = syscall.Close(epfd)
		return nil
	}
	pl := &poller{ep: os.NewFile(uintptr(epfd), "pglock-epoll"), epfd: epfd, done: make(chan struct{}),
		sessions: map[int32]*session{}, wait: syscall.EpollWait}
	rc, err := pl.ep.SyscallConn()
	if err != nil {
		_ = pl.ep.Close()
		return nil
	}
	go pl.run(rc)
	return pl
}

// run reads the epoll set's events until close or an error, and starts
// the watcher of each session whose socket became readable; then every
// session left in the set (see stop).
func (pl *poller) run(rc syscall.RawConn) {
	defer close(pl.done)
	defer pl.stop()
	var events [16]syscall.EpollEvent
	for {
		n := 0
		var werr error
		err := rc.Read(func(fd uintptr) bool {
			pl.mu.Lock()
			wait := pl.wait
			pl.mu.Unlock()
			for {
				n, werr = wait(int(fd), events[:], 0)
				if werr != syscall.EINTR {
					break
				}
			}
			// Nothing ready (0, or EAGAIN): wait for the set's descriptor to
			// become readable again.
			return werr != nil && werr != syscall.EAGAIN || werr == nil && n > 0
		})
		if err != nil || werr != nil || n < 0 {
			return // closed, or epoll_wait failed: stop hands every session to its watcher
		}
		for _, ev := range events[:n] {
			pl.mu.Lock()
			s := pl.sessions[ev.Fd]
			pl.mu.Unlock()
			if s != nil {
				s.readable(ev.Fd)
			}
		}
	}
}

// stop marks the poller closed (add refuses from now on) and starts the
// watcher of every session still in the set, as if its socket had become
// readable: each reads its connection from then on.
func (pl *poller) stop() {
	pl.mu.Lock()
	pl.closed = true
	left := pl.sessions
	pl.sessions = map[int32]*session{}
	pl.mu.Unlock()
	for fd, s := range left {
		s.readable(fd)
	}
}

// add puts s's socket, fd, in the set, called with s.mu held; it reports
// whether it did.
func (pl *poller) add(s *session, fd int32) bool {
	pl.mu.Lock()
	defer pl.mu.Unlock()
	if pl.closed {
		return false
	}
	ev := syscall.EpollEvent{Events: syscall.EPOLLIN | syscall.EPOLLRDHUP | syscall.EPOLLONESHOT, Fd: fd}
	if syscall.EpollCtl(pl.epfd, syscall.EPOLL_CTL_ADD, int(fd), &ev) != nil {
		return false
	}
	pl.sessions[fd] = s
	return true
}

// remove takes the socket fd out of the set, called with its session's
// mu held, before anything closes the socket.
func (pl *poller) remove(fd int32) {
	pl.mu.Lock()
	defer pl.mu.Unlock()
	delete(pl.sessions, fd)
	if !pl.closed {
		_ = syscall.EpollCtl(pl.epfd, syscall.EPOLL_CTL_DEL, int(fd), nil)
	}
}

// registered reports whether fd is in the set, under s (for tests).
func (pl *poller) registered(fd int32, s *session) bool {
	pl.mu.Lock()
	defer pl.mu.Unlock()
	return pl.sessions[fd] == s
}

// close ends the poller's goroutine and closes the set, once every
// session has ended.
func (pl *poller) close() {
	pl.mu.Lock()
	pl.closed = true
	pl.mu.Unlock()
	_ = pl.ep.Close()
	<-pl.done
}

// socketFD returns the descriptor of conn's socket (under TLS, the
// connection's own), or false when it has none.
func socketFD(conn any) (int32, bool) {
	if nc, ok := conn.(interface{ NetConn() net.Conn }); ok {
		conn = nc.NetConn()
	}
	sc, ok := conn.(syscall.Conn)
	if !ok {
		return 0, false
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return 0, false
	}
	fd := int32(-1)
	if err := rc.Control(func(f uintptr) { fd = int32(f) }); err != nil || fd < 0 {
		return 0, false
	}
	return fd, true
}

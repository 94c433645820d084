//go:build !linux

package pglock

// poller is the epoll set of poll_linux.go; elsewhere there is none, and
// an idle session's watcher starts on a timer (see session.put).
type poller struct{}

func newPoller() *poller                        { return nil }
func (*poller) add(*session, int32) bool        { return false }
func (*poller) remove(int32)                    {}
func (*poller) close()                          {}
func (*poller) registered(int32, *session) bool { return false }
func socketFD(any) (int32, bool)                { return 0, false }

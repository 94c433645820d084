package pglock

import (
	"time"

	"tenace.dev/tenace"
)

// BackendPID is the process id of the server backend whose session holds
// l's lock.
func BackendPID(l tenace.LockLease) uint32 {
	if u, ok := l.(unfenced); ok {
		return u.l.pid
	}
	return l.(*lease).pid
}

// ClassID is the first key of the provider's advisory locks.
func (p *Provider) ClassID() int32 { return p.classID }

// SetReleaseTimeout sets the bound of a Release whose ctx has no deadline,
// and returns a func that restores it.
func SetReleaseTimeout(d time.Duration) (restore func()) {
	old := releaseTimeout
	releaseTimeout = d
	return func() { releaseTimeout = old }
}

// SetEndTimeout sets the bound of the unlock of a lease lost to its TTL or
// to Close, and returns a func that restores it.
func SetEndTimeout(d time.Duration) (restore func()) {
	old := endTimeout
	endTimeout = d
	return func() { endTimeout = old }
}

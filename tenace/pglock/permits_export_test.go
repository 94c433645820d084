package pglock

import "time"

// PoolConns is how many connections p's pool has open, idle or in use.
func PoolConns(p *Provider) int32 { return p.pool.Stat().TotalConns() }

// SetPermitRepoll sets how long a bulkhead's waiter waits for a NOTIFY
// before it tries the slots again, and returns a func that restores it.
func SetPermitRepoll(d time.Duration) (restore func()) {
	old := permitRepoll
	permitRepoll = d
	return func() { permitRepoll = old }
}

package tenace

// LockStats is what a provider knows of its locks right now.
type LockStats struct {
	Held         int // keys held (for a distributed provider: leases held through this provider)
	Waiting      int // callers waiting (in this process for a distributed provider)
	LongestQueue int // most callers waiting for one key (0 when not known)
}

// StatsProvider is the optional interface of a provider that reports
// LockStats; Stats must be cheap (atomic loads), safe for concurrent use,
// and never block on the lock manager.
type StatsProvider interface{ Stats() LockStats }

package pglock

// PoolConns is how many connections p's pool has open, idle or in use.
func PoolConns(p *Provider) int32 { return p.pool.Stat().TotalConns() }

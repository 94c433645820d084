package tenace

import "context"

// TokenFrom returns, inside fn (or an inner step), the fencing token of the
// lease held by the nearest enclosing Lock (see LeaseFrom), and true; or 0
// and false when ctx carries no lease, or its lease has no token (it is not
// a FencedLease). The memory, Redis and PostgreSQL providers' leases all
// carry one.
//
// Pass the token with every access to the resource the lock guards, reads
// as well as writes, and let the resource refuse a token lower than the
// highest it has seen, a read raising that highest as a write does: that
// refusal, not the lock alone, is what keeps a holder whose lease was lost
// (a paused process, an expired distributed lock) from overwriting its
// successor's work. Checked on writes alone, a read-modify-write still
// loses updates: the stale holder's write can land between its successor's
// read and write. pglock.Fence and redislock.FencedGet/FencedSet are such
// guards (see FencedLease).
//
//	tok, ok := tenace.TokenFrom(ctx)
//	if !ok {
//		return errors.New("not under a fenced lock")
//	}
//	v, err := store.Read(ctx, tok) // refused if a higher token read or wrote first
//	if err != nil {
//		return err
//	}
//	return store.Write(ctx, tok, v+1) // refused likewise
//
// It costs no allocation.
func TokenFrom(ctx context.Context) (uint64, bool) {
	l, ok := LeaseFrom(ctx)
	if !ok {
		return 0, false
	}
	f, ok := l.(FencedLease)
	if !ok {
		return 0, false
	}
	return f.Token(), true
}

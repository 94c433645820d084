package tenace

import "context"

// TokenFrom returns, inside fn (or an inner step), the fencing token of the
// lease held by the nearest enclosing Lock (see LeaseFrom), and true; or 0
// and false when ctx carries no lease, or its lease has no token (it is not
// a FencedLease). The memory, Redis and PostgreSQL providers' leases all
// carry one.
//
// Pass the token with every write to the resource the lock guards, and let
// the resource refuse a token lower than the highest it has seen: that
// refusal, not the lock alone, is what keeps a holder whose lease was lost
// (a paused process, an expired distributed lock) from overwriting its
// successor's work.
//
//	tok, ok := tenace.TokenFrom(ctx)
//	if !ok {
//		return errors.New("not under a fenced lock")
//	}
//	return store.Write(ctx, tok, data) // refused if a higher token wrote first
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

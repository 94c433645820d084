package main

import (
	"context"

	"github.com/jackc/pgx/v5/pgxpool"

	"tenace.dev/bench/internal/load"
	"tenace.dev/tenace/pglock"
)

// The PostgreSQL peers, on one server:
//
//	tenace-pg          tenace/pglock: exact keys, PostgreSQL's lock queue,
//	                   a durable fencing token, lost-lease watcher
//	tenace-pg-nofence  the same WithoutFencing: the grant writes nothing
//	pg-hand            what services write by hand: a pooled connection per
//	                   call, pg_advisory_lock(hashtextextended(key, 0)) and
//	                   unlock on it (hashed keys that can collide, no
//	                   fencing, no loss signal)
var postgresImpls = []struct {
	name string
	desc string
	make func(ctx context.Context, conn string, maxConns int) (load.Locker, error)
}{
	{"tenace-pg", "tenace/pglock: PostgreSQL's lock queue, exact keys, fencing", func(ctx context.Context, conn string, maxConns int) (load.Locker, error) {
		p, err := pglock.New(ctx, conn, pglock.WithMaxConns(maxConns))
		if err != nil {
			return nil, err
		}
		return &providerLocker{p: p}, nil
	}},
	{"tenace-pg-nofence", "tenace/pglock WithoutFencing: the lock alone, no commit", func(ctx context.Context, conn string, maxConns int) (load.Locker, error) {
		p, err := pglock.New(ctx, conn, pglock.WithMaxConns(maxConns), pglock.WithoutFencing())
		if err != nil {
			return nil, err
		}
		return &providerLocker{p: p}, nil
	}},
	{"pg-hand", "pg_advisory_lock(hashtextextended(key)) on a pooled connection, by hand", func(ctx context.Context, conn string, maxConns int) (load.Locker, error) {
		cfg, err := pgxpool.ParseConfig(conn)
		if err != nil {
			return nil, err
		}
		cfg.MaxConns = int32(maxConns)
		pool, err := pgxpool.NewWithConfig(ctx, cfg)
		if err != nil {
			return nil, err
		}
		return &handPG{pool: pool}, nil
	}},
}

type handPG struct{ pool *pgxpool.Pool }

func (h *handPG) Do(ctx context.Context, key string, fn func(context.Context) error) error {
	c, err := h.pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer c.Release()
	if _, err := c.Exec(ctx, "SELECT pg_advisory_lock(hashtextextended($1, 0))", key); err != nil {
		return err
	}
	_ = fn(ctx)
	_, err = c.Exec(context.WithoutCancel(ctx), "SELECT pg_advisory_unlock(hashtextextended($1, 0))", key)
	return err
}
func (h *handPG) TakesContext() bool { return true }
func (h *handPG) Close()             { h.pool.Close() }

// postgresFamily is the PostgreSQL implementations on one server:
// -postgres CONNSTRING, or a throwaway cluster run as the postgres user.
// Each gets a pool with room for every goroutine of its cell to hold or
// wait.
func postgresFamily() *load.Family {
	f := &load.Family{Name: "postgres", Base: "tenace-pg", Scenarios: "distinct,hot", Goroutines: "1,8",
		AddrFlag: "postgres", AddrUsage: "PostgreSQL connection string for -providers postgres (default: a throwaway cluster)",
		Start: startPostgres}
	for _, i := range postgresImpls {
		f.Impls = append(f.Impls, load.Impl{Name: i.name, Desc: i.desc, Make: func(conn string, goroutines, _ int) (load.Locker, error) {
			return i.make(context.Background(), conn, max(goroutines, 4))
		}})
	}
	return f
}

package main

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5/pgxpool"

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
	make func(ctx context.Context, conn string, maxConns int) (Locker, error)
}{
	{"tenace-pg", "tenace/pglock: PostgreSQL's lock queue, exact keys, fencing", func(ctx context.Context, conn string, maxConns int) (Locker, error) {
		p, err := pglock.New(ctx, conn, pglock.WithMaxConns(maxConns))
		if err != nil {
			return nil, err
		}
		return &providerLocker{p: p}, nil
	}},
	{"tenace-pg-nofence", "tenace/pglock WithoutFencing: the lock alone, no commit", func(ctx context.Context, conn string, maxConns int) (Locker, error) {
		p, err := pglock.New(ctx, conn, pglock.WithMaxConns(maxConns), pglock.WithoutFencing())
		if err != nil {
			return nil, err
		}
		return &providerLocker{p: p}, nil
	}},
	{"pg-hand", "pg_advisory_lock(hashtextextended(key)) on a pooled connection, by hand", func(ctx context.Context, conn string, maxConns int) (Locker, error) {
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

// makePostgresLocker connects the named PostgreSQL peer to conn, with
// enough connections for every goroutine of a cell to hold or wait.
func makePostgresLocker(name, conn string, goroutines int) (Locker, bool, error) {
	for _, i := range postgresImpls {
		if i.name == name {
			l, err := i.make(context.Background(), conn, max(goroutines, 4))
			if err != nil {
				return nil, true, fmt.Errorf("%s: %w", name, err)
			}
			return l, true, nil
		}
	}
	return nil, false, nil
}

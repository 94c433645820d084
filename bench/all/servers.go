package main

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"

	"tenace.dev/internal/etcdtest"
	"tenace.dev/internal/pgtest"
	"tenace.dev/internal/serverproc"
)

// startRedis starts a throwaway redis-server on a free loopback port, with
// no persistence, for a run: the families' Start.
func startRedis() (addr string, stop func(), err error) {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return "", nil, errors.New("redis-server is not installed (apt-get install redis-server)")
	}
	port, err := serverproc.FreePort()
	if err != nil {
		return "", nil, fmt.Errorf("no free loopback port: %w", err)
	}
	dir, err := os.MkdirTemp("", "tenace-bench-redis-")
	if err != nil {
		return "", nil, err
	}
	cmd := exec.Command(bin, "--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--dir", dir,
		"--save", "", "--appendonly", "no", "--daemonize", "no", "--protected-mode", "yes", "--loglevel", "notice")
	out, err := cmd.StdoutPipe()
	if err != nil {
		return "", nil, err
	}
	cmd.Stderr = cmd.Stdout
	if err := cmd.Start(); err != nil {
		_ = os.RemoveAll(dir)
		return "", nil, err
	}
	ready, done := serverproc.Watch(cmd, out, "Ready to accept connections", nil)
	stop = func() {
		_ = cmd.Process.Kill()
		<-done
		_ = os.RemoveAll(dir)
	}
	select {
	case <-ready:
		return net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), stop, nil
	case err := <-done:
		done <- err // for stop
		stop()
		return "", nil, fmt.Errorf("redis-server exited at start: %v", err)
	case <-time.After(10 * time.Second):
		stop()
		return "", nil, errors.New("redis-server was not ready within 10s")
	}
}

// startPostgres starts a throwaway PostgreSQL cluster (internal/pgtest:
// initdb, fsync off, as the postgres user when run as root) on a free
// loopback port for a run.
func startPostgres() (conn string, stop func(), err error) {
	s, err := pgtest.New()
	if err != nil {
		return "", nil, err
	}
	return s.ConnString(), s.Close, nil
}

// startEtcd starts a throwaway one-member etcd (internal/etcdtest: its
// data in a temporary directory, a 50ms heartbeat) on free loopback ports
// for a run, and returns its client URL.
func startEtcd() (endpoints string, stop func(), err error) {
	c, err := etcdtest.New(1)
	if err != nil {
		return "", nil, err
	}
	return strings.Join(c.Endpoints(), ","), c.Close, nil
}

// Package serverproc watches a server process that tests start (redis-server,
// postgres): it reads the process's log until the server says it is ready,
// and reports its exit, so that a test waits for readiness without polling.
package serverproc

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"os/exec"
	"strings"
)

// Watch reads log — the started cmd's output — line by line on a goroutine
// of its own, passing each line to onLine (if not nil). ready is closed at
// the first line that contains readyLine. When log ends, Watch waits for
// cmd to exit and sends its error on done (a buffer of one: the goroutine
// never blocks); if the server never was ready, the error includes what it
// logged, so that a test that fails at start says why.
func Watch(cmd *exec.Cmd, log io.Reader, readyLine string, onLine func(line string)) (ready <-chan struct{}, done chan error) {
	r := make(chan struct{})
	done = make(chan error, 1)
	go func() {
		sc := bufio.NewScanner(log)
		isReady := false
		var lines []string // what it logged before it was ready, for the error
		for sc.Scan() {
			if onLine != nil {
				onLine(sc.Text())
			}
			if !isReady {
				lines = append(lines, sc.Text())
				if strings.Contains(sc.Text(), readyLine) {
					isReady = true
					close(r)
				}
			}
		}
		err := cmd.Wait()
		if !isReady {
			err = fmt.Errorf("%v: %s", err, strings.Join(lines, "\n"))
		}
		done <- err
	}()
	return r, done
}

// FreePort returns a TCP port on the loopback interface that was free a
// moment ago, for a test server to listen on.
func FreePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

package etcdlock_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"

	"tenace.dev/tenace/etcdlock"
)

// Misuse of the options panics with the tenace: prefix; a caller's input
// at run time never does (see TestConformance/BadInput).
func TestOptionMisusePanics(t *testing.T) {
	for name, f := range map[string]func(){
		"nil client":            func() { etcdlock.New(nil) },
		"window under 1s":       func() { etcdlock.WithWindow(500 * time.Millisecond) },
		"TTL not positive":      func() { etcdlock.WithTTL(0) },
		"interval not positive": func() { etcdlock.WithRenewInterval(0) },
		"interval past the margin": func() {
			etcdlock.New(&clientv3.Client{}, etcdlock.WithWindow(2*time.Second), etcdlock.WithRenewInterval(1600*time.Millisecond))
		},
	} {
		t.Run(name, func(t *testing.T) {
			defer func() {
				v := recover()
				require.NotNil(t, v, "no panic")
				require.True(t, strings.HasPrefix(fmt.Sprint(v), "tenace: "), "panic %v", v)
			}()
			f()
		})
	}
	// 1.2s is a window of 2s (etcd keeps whole seconds, rounded up): an
	// interval of 1.4s is below its 1.5s less margin, and accepted.
	p := etcdlock.New(&clientv3.Client{}, etcdlock.WithWindow(1200*time.Millisecond), etcdlock.WithRenewInterval(1400*time.Millisecond))
	require.NoError(t, p.Close())
}

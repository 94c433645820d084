package locktest_test

import (
	"testing"

	"tenace.dev/tenace"
	"tenace.dev/tenace/locktest"
)

// A provider's conformance test: one call, with what the provider promises.
// (An example without output: it shows the code and is compiled, not run.)
func ExampleRun() {
	_ = func(t *testing.T) {
		locktest.Run(t, func(t *testing.T) tenace.LockProvider {
			p := tenace.NewMemoryLockProvider()
			t.Cleanup(func() { _ = p.Close() })
			return p
		}, locktest.Capabilities{Fencing: true})
	}
}

// Package adopter uses tenace the way a module outside the repository does:
// through the published modules, resolved by the Go command with no replace
// line and no go.work.
package adopter

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/failsafe-go/failsafe-go"
	"github.com/failsafe-go/failsafe-go/retrypolicy"
	"github.com/redis/go-redis/v9"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.opentelemetry.io/otel/sdk/metric"

	"tenace.dev/tenace"
	"tenace.dev/tenace/etcdlock"
	"tenace.dev/tenace/failsafelock"
	"tenace.dev/tenace/lockhttp"
	"tenace.dev/tenace/locktest"
	"tenace.dev/tenace/oteltenace"
	"tenace.dev/tenace/pglock"
	"tenace.dev/tenace/redislock"
)

// The memory provider, through a policy, excludes callers of one key:
// while each of 8 callers holds it, a caller that tries once (NoWait) is
// refused, and says so.
func TestALockExcludesFromOutside(t *testing.T) {
	locks := tenace.NewMemoryLockProvider()
	defer locks.Close()
	p := tenace.NewPolicy().WithLock(tenace.LockOptions{Provider: locks, Timeout: time.Minute})
	once := tenace.NewPolicy().WithLock(tenace.LockOptions{Provider: locks, Timeout: tenace.NoWait})

	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			err := p.Execute(context.Background(), func(ctx context.Context) error {
				if _, ok := tenace.TokenFrom(ctx); !ok {
					return errors.New("no fencing token inside fn")
				}
				// Another caller (not this one's ctx: that would be a
				// deadlock) while the key is held.
				err := once.Execute(context.Background(), func(context.Context) error { return nil }, tenace.WithKey("account:1"))
				var rejected *tenace.LockNotAcquiredError
				if !errors.As(err, &rejected) || !strings.Contains(err.Error(), "NoWait") {
					return fmt.Errorf("another caller while the key is held: %v, want a NoWait *tenace.LockNotAcquiredError", err)
				}
				return nil
			}, tenace.WithKey("account:1"))
			if err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
}

// The lock runs inside a failsafe-go pipeline, and a retry outlives contention.
func TestFailsafeGoFromOutside(t *testing.T) {
	locks := tenace.NewMemoryLockProvider()
	defer locks.Close()
	held, err := locks.Acquire(context.Background(), "report", tenace.LockAcquireOptions{})
	if err != nil {
		t.Fatal(err)
	}
	retry := retrypolicy.NewBuilder[string]().
		HandleErrorTypes(&tenace.LockNotAcquiredError{}).
		WithMaxRetries(-1).
		OnRetry(func(failsafe.ExecutionEvent[string]) { held.Release(context.Background()) }).
		Build()
	lock := failsafelock.New[string](tenace.LockOptions{Provider: locks, Key: "report", Timeout: tenace.NoWait})
	got, err := failsafe.With[string](retry, lock).Get(func() (string, error) { return "built", nil })
	if err != nil || got != "built" {
		t.Fatalf("Get = %q, %v; want built, nil", got, err)
	}
}

// The conformance suite runs from outside the repository.
func TestLocktestFromOutside(t *testing.T) {
	locktest.Run(t, func(t *testing.T) tenace.LockProvider {
		p := tenace.NewMemoryLockProvider()
		t.Cleanup(func() { p.Close() })
		return p
	}, locktest.Capabilities{FIFO: true, ExactStats: true, Fencing: true})
}

// OpenTelemetry instruments a policy.
func TestOpenTelemetryFromOutside(t *testing.T) {
	mp := metric.NewMeterProvider()
	defer mp.Shutdown(context.Background())
	p := oteltenace.New(oteltenace.WithMeterProvider(mp)).Instrument(
		tenace.NewPolicy().WithLock(tenace.LockOptions{Key: "reports"}))
	if err := p.Execute(context.Background(), func(context.Context) error { return nil }); err != nil {
		t.Fatal(err)
	}
}

// The distributed providers build, and a server that is not there is an
// error, never a lock that someone else holds.
func TestDistributedProvidersFromOutside(t *testing.T) {
	ctx := context.Background()
	client := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", ContextTimeoutEnabled: true})
	defer client.Close()
	rl := redislock.New(client)
	defer rl.Close()
	p := tenace.NewPolicy().WithLock(tenace.LockOptions{Provider: rl, Key: "k", Timeout: tenace.NoWait})
	err := p.Execute(ctx, func(context.Context) error { return nil })
	var failed *tenace.UnexpectedError
	if !errors.As(err, &failed) {
		t.Fatalf("redislock on a closed port: %v, want *tenace.UnexpectedError", err)
	}

	dctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if _, err := pglock.New(dctx, "postgres://nobody@127.0.0.1:1/none?connect_timeout=2"); err == nil {
		t.Fatal("pglock.New on a closed port succeeded")
	}

	ec, err := clientv3.New(clientv3.Config{Endpoints: []string{"127.0.0.1:1"}, DialTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer ec.Close()
	el := etcdlock.New(ec)
	defer el.Close()
	lease, err := el.Acquire(ctx, "k", tenace.LockAcquireOptions{Timeout: time.Second})
	if err == nil {
		t.Fatalf("etcdlock on a closed port: lease %v, want an error", lease)
	}
}

// The debug page, from its own module: a held key of the memory provider is
// listed, with its owner, in the page's JSON.
func TestTheLockPageFromOutside(t *testing.T) {
	ctx := context.Background()
	locks := tenace.NewMemoryLockProvider(tenace.WithOwner("adopter"))
	defer locks.Close()
	lease, err := locks.Acquire(ctx, "report/7", tenace.LockAcquireOptions{})
	if err != nil || lease == nil {
		t.Fatalf("Acquire: %v, %v", lease, err)
	}
	defer lease.Release(ctx)

	srv := httptest.NewServer(lockhttp.Handler(locks))
	defer srv.Close()
	resp, err := http.Get(srv.URL + "/json")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), "report/7") || !strings.Contains(string(body), "adopter") {
		t.Fatalf("GET /json: %d %s; want the held key and its owner", resp.StatusCode, body)
	}
}

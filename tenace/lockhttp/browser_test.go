package lockhttp_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"

	"tenace.dev/tenace"
	"tenace.dev/tenace/lockhttp"
)

// chromium returns the path of a Chromium to drive, or skips the test
// (fails it when CI is set: there the browser test must run).
func chromium(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if path, err := exec.LookPath(name); err == nil {
			return path
		}
	}
	if os.Getenv("CI") != "" {
		t.Fatal("no chromium on PATH, and CI is set: install Debian's chromium package (apt-get install -y chromium)")
	}
	t.Skip("no chromium on PATH (apt-get install -y chromium); CI=1 makes this a failure")
	return ""
}

// browser starts a headless Chromium for the test, with the flags that
// keep it off the network (this machine's is closed), and returns a
// context of a tab.
func browser(t *testing.T) context.Context {
	t.Helper()
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(chromium(t)),
		chromedp.Flag("headless", true),
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.Flag("disable-quic", true),
		chromedp.NoFirstRun,
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.UserDataDir(t.TempDir()),
	)
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancelTab := chromedp.NewContext(actx)
	ctx, cancelTime := context.WithTimeout(ctx, 2*time.Minute)
	t.Cleanup(func() {
		cancelTime()
		cancelTab()
		cancelAlloc()
	})
	return ctx
}

// rows is the keys table as the browser shows it: each row's cells' text.
const rowsJS = `Array.from(document.querySelectorAll("#keys tbody tr")).map(tr => Array.from(tr.cells).map(td => td.textContent))`

// The page in a real browser: it lists a held key with its owner, renders
// hostile keys as text (no script of theirs runs, no element of theirs is
// made), sorts by a column, and updates after a release without a reload.
func TestPageInABrowser(t *testing.T) {
	ctx := browser(t)
	p := tenace.NewMemoryLockProvider(tenace.WithOwner("api-7f9c/pid 4127"))
	defer p.Close()
	mux := http.NewServeMux()
	mux.Handle("/debug/locks/", http.StripPrefix("/debug/locks", lockhttp.Handler(p, lockhttp.WithRefresh(100*time.Millisecond))))
	srv := httptest.NewServer(mux)
	defer srv.Close()

	orders := hold(t, p, "orders/1", tenace.LockAcquireOptions{Owner: "nightly-report"})
	defer orders.Release(bg)
	hostileKeys := append(hostile, `<img src=x onerror="window.pwned=1">`, `"><svg onload="window.pwned=2">`)
	for _, k := range hostileKeys {
		defer hold(t, p, k, tenace.LockAcquireOptions{Owner: "<b>bold</b>"}).Release(bg)
	}
	// The second with a label that is not UTF-8: shown quoted.
	for k, owner := range map[string]string{"exports/acme": "export", "exports/zeta": "export\xff"} {
		defer hold(t, p, k, tenace.LockAcquireOptions{Shared: true, Permits: 5, Owner: owner}).Release(bg)
	}
	// Two callers wait for orders/1.
	wctx, cancelWaiters := context.WithCancel(bg)
	waiters := make(chan struct{}, 2)
	for range 2 {
		go func() {
			defer func() { waiters <- struct{}{} }()
			_, _ = p.Acquire(wctx, "orders/1", tenace.LockAcquireOptions{Owner: "retry"})
		}()
	}
	stopWaiters := sync.OnceFunc(func() {
		cancelWaiters()
		<-waiters
		<-waiters
	})
	defer stopWaiters()
	require.Eventually(t, func() bool { return p.Stats().Waiting == 2 }, 10*time.Second, time.Millisecond)

	// A dialog would mean a key's script ran: count them (and close them,
	// from another goroutine, as Listen's callback must not call).
	dialogs := make(chan string, 10) // room for more than the test's keys could open
	require.NoError(t, chromedp.Listen(ctx, func(ev any) {
		if d, ok := ev.(*page.EventJavascriptDialogOpening); ok {
			select {
			case dialogs <- d.Message:
			default:
			}
			go func() {
				_, _ = chromedp.Call(ctx, page.HandleJavaScriptDialog, page.HandleJavaScriptDialogParams{Accept: true})
			}()
		}
	}))
	require.NoError(t, chromedp.Do(ctx,
		chromedp.EmulateViewport(1000, 560),
		chromedp.Navigate(srv.URL+"/debug/locks/"),
		// The script has fetched the JSON and drawn the table itself.
		chromedp.WaitVisible(chromedp.CSS(`body[data-refreshed]`)),
	))
	rows, err := chromedp.Run(ctx, chromedp.Evaluate[[][]string](rowsJS))
	require.NoError(t, err)
	byKey := map[string][]string{}
	for _, r := range rows {
		byKey[r[0]] = r
	}
	require.Equal(t, "api-7f9c/pid 4127 (nightly-report)", byKey["orders/1"][1], "the held key, with its owner")
	require.Equal(t, "exclusive", byKey["orders/1"][2])
	require.Equal(t, "2", byKey["orders/1"][4], "two waiting")
	require.Equal(t, "shared (1 of 5)", byKey["exports/acme"][2])
	require.Equal(t, `"api-7f9c/pid 4127 (export\xff)"`, byKey["exports/zeta"][1], "an owner that is not UTF-8, quoted")
	classes, err := chromedp.Run(ctx, chromedp.Evaluate[[]string](`Array.from(document.querySelectorAll("#keys tbody tr")).filter(tr => tr.cells[0].textContent.startsWith("exports/")).map(tr => tr.cells[1].className)`))
	require.NoError(t, err)
	require.Equal(t, []string{"", "quoted"}, classes, "a quoted owner in the colour of quoted text")
	for _, k := range hostileKeys {
		text, _ := lockhttp.Text(k)
		require.Contains(t, byKey, text, "hostile key %q shown as the text %q", k, text)
		require.Equal(t, "api-7f9c/pid 4127 (<b>bold</b>)", byKey[text][1], "an owner is text too")
	}
	require.Contains(t, byKey, `"bad\xff\xfeutf8"`, "invalid UTF-8 shown escaped")

	pwned, err := chromedp.Run(ctx, chromedp.Evaluate[int](`window.pwned || 0`))
	require.NoError(t, err)
	scripts, err := chromedp.Run(ctx, chromedp.Evaluate[int](`document.scripts.length`))
	require.NoError(t, err)
	injected, err := chromedp.Run(ctx, chromedp.Evaluate[int](`document.querySelectorAll("img, svg, b").length`))
	require.NoError(t, err)
	require.Zero(t, pwned, "no handler of a key ran")
	require.Equal(t, 1, scripts, "no script but the page's")
	require.Zero(t, injected, "no element made from a key or an owner")

	// Sorting: by waiting, most first.
	require.NoError(t, chromedp.Do(ctx, chromedp.Click(chromedp.CSS(`th[data-col="waiting"]`))))
	rows, err = chromedp.Run(ctx, chromedp.Evaluate[[][]string](rowsJS))
	require.NoError(t, err)
	require.Equal(t, "orders/1", rows[0][0], "sorted by waiting, most first")
	// Read in one evaluation: a refresh may replace the element between a
	// query for its node and a read of the node's text.
	waits, err := chromedp.Run(ctx, chromedp.Evaluate[string](`document.querySelector("#waits").textContent`))
	require.NoError(t, err)
	require.Contains(t, waits, "orders/1: 2 waiting")

	if path := os.Getenv("LOCKHTTP_SCREENSHOT"); path != "" {
		png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(path, png, 0o644))
		t.Logf("screenshot: %s (%d bytes)", path, len(png))
	}

	// The release: the page drops the key at its next refresh, without a
	// reload (the marker set before stays).
	stopWaiters()
	require.NoError(t, orders.Release(bg))
	_, err = chromedp.Run(ctx, chromedp.Evaluate[int](`window.marker = 1`))
	require.NoError(t, err)
	_, err = chromedp.Run(ctx, chromedp.Poll[chromedp.Void](`!Array.from(document.querySelectorAll("#keys td.key")).some(td => td.textContent === "orders/1")`,
		chromedp.WithPollingTimeout(30*time.Second)))
	require.NoError(t, err, "the page dropped the released key")
	same, err := chromedp.Run(ctx, chromedp.Evaluate[bool](`window.marker === 1`))
	require.NoError(t, err)
	require.True(t, same, "updated in place, not reloaded")
	rows, err = chromedp.Run(ctx, chromedp.Evaluate[[][]string](rowsJS))
	require.NoError(t, err)
	for _, r := range rows {
		require.NotEqual(t, "orders/1", r[0])
	}
	require.Len(t, rows, len(hostileKeys)+2)
	select {
	case msg := <-dialogs:
		t.Fatalf("a dialog opened: %q (a key's script ran)", msg)
	default:
	}
	require.False(t, strings.Contains(strings.Join(rows[0], ""), "\xff"))
}

// switchable is an inspector whose List fails while down is set.
type switchable struct {
	tenace.Inspector
	down atomic.Bool
}

func (s *switchable) List(ctx context.Context, opts tenace.ListOptions) (tenace.ListPage, error) {
	if s.down.Load() {
		return tenace.ListPage{}, errors.New("redislock: List: dial tcp 127.0.0.1:6379: connect: connection refused")
	}
	return s.Inspector.List(ctx, opts)
}

// A provider that stops answering after the page was loaded: the page's
// refresh shows the error and says the keys are unknown, never "no key is
// held"; once the provider answers again, the keys come back.
func TestPageInABrowserOutage(t *testing.T) {
	ctx := browser(t)
	p := tenace.NewMemoryLockProvider(tenace.WithOwner("api-7f9c"))
	defer p.Close()
	in := &switchable{Inspector: p}
	srv := httptest.NewServer(lockhttp.Handler(in, lockhttp.WithRefresh(100*time.Millisecond)))
	defer srv.Close()
	defer hold(t, p, "orders/1", tenace.LockAcquireOptions{}).Release(bg)

	require.NoError(t, chromedp.Do(ctx,
		chromedp.Navigate(srv.URL+"/"),
		chromedp.WaitVisible(chromedp.CSS(`body[data-refreshed]`)),
	))
	in.down.Store(true)
	_, err := chromedp.Run(ctx, chromedp.Poll[chromedp.Void](`document.getElementById("error").textContent.includes("connection refused")`,
		chromedp.WithPollingTimeout(30*time.Second)))
	require.NoError(t, err, "the page shows the provider's error")
	page, err := chromedp.Run(ctx, chromedp.Evaluate[string](`document.body.innerText`))
	require.NoError(t, err)
	require.NotContains(t, page, "no key is held", "an outage is not an empty table")
	require.NotContains(t, page, "0 keys held")
	require.NotContains(t, page, "nobody waits")
	require.NotContains(t, page, "orders/1", "no stale row shown as current")
	require.Contains(t, page, "no answer from the provider")

	in.down.Store(false)
	_, err = chromedp.Run(ctx, chromedp.Poll[chromedp.Void](`Array.from(document.querySelectorAll("#keys td.key")).some(td => td.textContent === "orders/1")`,
		chromedp.WithPollingTimeout(30*time.Second)))
	require.NoError(t, err, "the keys come back when the provider answers")
	msg, err := chromedp.Run(ctx, chromedp.Evaluate[string](`document.getElementById("error").textContent`))
	require.NoError(t, err)
	require.Empty(t, msg)
}

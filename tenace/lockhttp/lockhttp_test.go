package lockhttp_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"tenace.dev/tenace"
	"tenace.dev/tenace/lockhttp"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var bg = context.Background()

// hostile keys: markup, invalid UTF-8, a control character.
var hostile = []string{"<script>alert(1)</script>", "<img src=x onerror=alert(2)>", "bad\xff\xfeutf8", "tab\there"}

func provider(t *testing.T) *tenace.MemoryLockProvider {
	t.Helper()
	p := tenace.NewMemoryLockProvider(tenace.WithOwner("api-7f9c"))
	t.Cleanup(func() { _ = p.Close() })
	return p
}

func hold(t *testing.T, p tenace.LockProvider, key string, opts tenace.LockAcquireOptions) tenace.LockLease {
	t.Helper()
	l, err := p.Acquire(bg, key, opts)
	require.NoError(t, err)
	require.NotNil(t, l)
	return l
}

func get(t *testing.T, h http.Handler, target string) *httptest.ResponseRecorder {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, target, nil))
	return rec
}

func snapshot(t *testing.T, h http.Handler, target string) lockhttp.Snapshot {
	t.Helper()
	rec := get(t, h, target)
	require.Equal(t, http.StatusOK, rec.Code, rec.Body.String())
	require.Equal(t, "application/json; charset=utf-8", rec.Header().Get("Content-Type"))
	var s lockhttp.Snapshot
	require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &s))
	return s
}

// The JSON lists each held key with its holders, waiters and the key's
// exact bytes; /json and ?format=json are the same; ?prefix= selects.
func TestJSON(t *testing.T) {
	p := provider(t)
	h := lockhttp.Handler(p)
	defer hold(t, p, "orders/1", tenace.LockAcquireOptions{Owner: "nightly"}).Release(bg)
	defer hold(t, p, "reports/7", tenace.LockAcquireOptions{Shared: true, Permits: 3}).Release(bg)
	// A waiter for orders/1.
	ctx, cancel := context.WithCancel(bg)
	waited := make(chan struct{})
	go func() {
		defer close(waited)
		_, _ = p.Acquire(ctx, "orders/1", tenace.LockAcquireOptions{Owner: "retry"})
	}()
	defer func() { cancel(); <-waited }()
	require.Eventually(t, func() bool { return p.Stats().Waiting == 1 }, 10*time.Second, time.Millisecond)

	for _, target := range []string{"/debug/locks/json", "/debug/locks/?format=json"} {
		s := snapshot(t, h, target)
		require.Empty(t, s.Error)
		require.False(t, s.Truncated)
		require.Len(t, s.Keys, 2, target)
		o, r := s.Keys[0], s.Keys[1]
		require.Equal(t, "orders/1", o.Key)
		require.Equal(t, base64.StdEncoding.EncodeToString([]byte("orders/1")), o.Base64)
		require.Len(t, o.Holders, 1)
		require.Equal(t, "api-7f9c (nightly)", o.Holders[0].Owner)
		require.False(t, o.Holders[0].Shared)
		require.NotNil(t, o.Holders[0].Since)
		require.Equal(t, 1, o.Waiting)
		require.Equal(t, []string{"api-7f9c (retry)"}, []string{o.Waiters[0].Owner})
		require.Equal(t, "reports/7", r.Key)
		require.True(t, r.Holders[0].Shared)
		require.Equal(t, 3, r.Holders[0].Permits)
	}
	s := snapshot(t, h, "/debug/locks/json?prefix=reports/")
	require.Len(t, s.Keys, 1)
	require.Equal(t, "reports/7", s.Keys[0].Key)
	require.Equal(t, "reports/", s.Prefix)
}

// Hostile keys come back exact in base64, and as inert text: a key that is
// not valid UTF-8 of printable characters quoted as %q does.
func TestJSONHostileKeys(t *testing.T) {
	p := provider(t)
	for _, k := range hostile {
		defer hold(t, p, k, tenace.LockAcquireOptions{}).Release(bg)
	}
	s := snapshot(t, lockhttp.Handler(p), "/json")
	require.Len(t, s.Keys, len(hostile))
	byKey := map[string]lockhttp.Key{}
	for _, k := range s.Keys {
		raw, err := base64.StdEncoding.DecodeString(k.Base64)
		require.NoError(t, err)
		byKey[string(raw)] = k
	}
	for _, k := range hostile {
		got, ok := byKey[k]
		require.True(t, ok, "%q listed byte for byte", k)
		text, quoted := lockhttp.Text(k)
		require.Equal(t, text, got.Key)
		require.Equal(t, quoted, got.Quoted)
	}
	require.Equal(t, `"bad\xff\xfeutf8"`, byKey["bad\xff\xfeutf8"].Key)
	require.Equal(t, `"tab\there"`, byKey["tab\there"].Key)
	require.Equal(t, "<script>alert(1)</script>", byKey["<script>alert(1)</script>"].Key, "valid text is shown as it is, as text")
}

// An owner is text as a key is: quoted when it is not valid UTF-8 of
// printable characters, then also given whole in base64; never U+FFFD.
func TestJSONHostileOwners(t *testing.T) {
	p := tenace.NewMemoryLockProvider(tenace.WithOwner("api\xff"))
	defer p.Close()
	defer hold(t, p, "k", tenace.LockAcquireOptions{Owner: "\x1b[31m"}).Release(bg)
	defer hold(t, p, "plain", tenace.LockAcquireOptions{}).Release(bg)
	rec := get(t, lockhttp.Handler(p), "/json")
	require.NotContains(t, rec.Body.String(), `\ufffd`)
	require.NotContains(t, rec.Body.String(), "\ufffd")
	var s lockhttp.Snapshot
	require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &s))
	require.Len(t, s.Keys, 2)
	h := s.Keys[0].Holders[0]
	require.Equal(t, `"api\xff (\x1b[31m)"`, h.Owner)
	require.True(t, h.OwnerQuoted)
	raw, err := base64.StdEncoding.DecodeString(h.OwnerBase64)
	require.NoError(t, err)
	require.Equal(t, "api\xff (\x1b[31m)", string(raw))
	plain := s.Keys[1].Holders[0]
	require.Equal(t, `"api\xff"`, plain.Owner)
	require.True(t, plain.OwnerQuoted)
	require.NotContains(t, rec.Body.String(), `"owner_quoted": false`, "absent when false")

	// The page shows a quoted owner in the colour of quoted text, as a key.
	html := get(t, lockhttp.Handler(p), "/").Body.String()
	require.Contains(t, html, `<td class="quoted">&#34;api\xff (\x1b[31m)&#34;</td>`)
	require.Contains(t, html, `h.owner_quoted) ? "quoted"`, "and so does its script")
}

// The HTML escapes every key and owner: no markup from a key reaches the
// page, and the page runs only its own script (its CSP says so).
func TestHTMLEscapesKeysAndOwners(t *testing.T) {
	p := tenace.NewMemoryLockProvider(tenace.WithOwner("<b>owner</b>"))
	defer p.Close()
	for _, k := range hostile {
		defer hold(t, p, k, tenace.LockAcquireOptions{Owner: "</td><script>alert(3)</script>"}).Release(bg)
	}
	rec := get(t, lockhttp.Handler(p), "/debug/locks/")
	require.Equal(t, http.StatusOK, rec.Code)
	require.Equal(t, "text/html; charset=utf-8", rec.Header().Get("Content-Type"))
	body := rec.Body.String()
	for _, bad := range []string{"<script>alert", "<img", "<b>owner", "</td><script>", "\xff"} {
		require.NotContains(t, body, bad)
	}
	require.Contains(t, body, "&lt;script&gt;alert(1)&lt;/script&gt;")
	require.Contains(t, body, `&#34;bad\xff\xfeutf8&#34;`)
	require.Contains(t, body, "&lt;b&gt;owner&lt;/b&gt;")
	require.Equal(t, 1, strings.Count(body, "<script"), "one script: the page's own")
	csp := rec.Header().Get("Content-Security-Policy")
	require.Contains(t, csp, "script-src 'nonce-")
	require.Contains(t, csp, "default-src 'none'")
	nonce := strings.TrimSuffix(strings.SplitN(strings.SplitN(csp, "'nonce-", 2)[1], "'", 2)[0], "'")
	require.Contains(t, body, `<script nonce="`+nonce+`">`)
	require.Contains(t, body, "textContent")
	require.NotContains(t, body, "innerHTML")
}

// Only GET and HEAD: the page never changes a lock.
func TestReadOnly(t *testing.T) {
	p := provider(t)
	h := lockhttp.Handler(p)
	for _, m := range []string{http.MethodPost, http.MethodPut, http.MethodDelete, http.MethodPatch} {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(m, "/json", strings.NewReader("{}")))
		require.Equal(t, http.StatusMethodNotAllowed, rec.Code, m)
		require.Equal(t, "GET, HEAD", rec.Header().Get("Allow"))
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodHead, "/", nil))
	require.Equal(t, http.StatusOK, rec.Code)
}

// An outage is an error on the page and in the JSON (503), never an empty
// list.
func TestProviderErrorIsShown(t *testing.T) {
	p := tenace.NewMemoryLockProvider()
	require.NoError(t, p.Close())
	h := lockhttp.Handler(p)
	rec := get(t, h, "/json")
	require.Equal(t, http.StatusServiceUnavailable, rec.Code)
	var s lockhttp.Snapshot
	require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &s))
	require.Contains(t, s.Error, "closed")
	rec = get(t, h, "/")
	require.Equal(t, http.StatusServiceUnavailable, rec.Code)
	require.Contains(t, rec.Body.String(), "closed")
	// The page (before its script) says the listing is unknown, not that
	// nothing is held.
	shown, _, _ := strings.Cut(rec.Body.String(), "<script")
	require.NotContains(t, shown, "no key is held")
	require.NotContains(t, shown, "0 keys held")
	require.NotContains(t, shown, "nobody waits")
	require.Contains(t, shown, "no answer from the provider")

	h = lockhttp.Handler(failing{}, lockhttp.WithTimeout(time.Millisecond))
	rec = get(t, h, "/json")
	require.Equal(t, http.StatusServiceUnavailable, rec.Code)
	require.Contains(t, rec.Body.String(), "deadline")
}

type failing struct{}

func (failing) Inspect(ctx context.Context, key string) (tenace.KeyInfo, error) {
	return tenace.KeyInfo{}, errors.New("unused")
}

func (failing) List(ctx context.Context, opts tenace.ListOptions) (tenace.ListPage, error) {
	<-ctx.Done()
	return tenace.ListPage{}, ctx.Err()
}

// WithLimit caps the answer, and says it is cut.
func TestLimit(t *testing.T) {
	p := provider(t)
	for _, k := range []string{"a", "b", "c", "d", "e"} {
		defer hold(t, p, k, tenace.LockAcquireOptions{}).Release(bg)
	}
	s := snapshot(t, lockhttp.Handler(p, lockhttp.WithLimit(3)), "/json")
	require.True(t, s.Truncated)
	require.Len(t, s.Keys, 3)
	s = snapshot(t, lockhttp.Handler(p, lockhttp.WithLimit(5)), "/json")
	require.False(t, s.Truncated)
	require.Len(t, s.Keys, 5)
	require.Panics(t, func() { lockhttp.WithLimit(0) })
	require.Panics(t, func() { lockhttp.WithRefresh(-1) })
}

// A nil inspector, or a nil pointer of a provider type, is a mistake in the
// program: Handler says so at once, not the first request.
func TestHandlerNilInspector(t *testing.T) {
	require.PanicsWithValue(t,
		"tenace: lockhttp.Handler: nil inspector (<nil>); pass a constructed tenace.Inspector, such as a *tenace.MemoryLockProvider from tenace.NewMemoryLockProvider",
		func() { lockhttp.Handler(nil) })
	var p *tenace.MemoryLockProvider
	require.PanicsWithValue(t,
		"tenace: lockhttp.Handler: nil inspector (*tenace.MemoryLockProvider); pass a constructed tenace.Inspector, such as a *tenace.MemoryLockProvider from tenace.NewMemoryLockProvider",
		func() { lockhttp.Handler(p) })
	var f *failingPtr
	require.Panics(t, func() { lockhttp.Handler(f) })
	// A value type whose zero value is usable is not nil.
	require.NotPanics(t, func() { lockhttp.Handler(failing{}) })
}

type failingPtr struct{ failing }

// Mounted beside net/http/pprof, under a prefix.
func ExampleHandler() {
	p := tenace.NewMemoryLockProvider(tenace.WithOwner("api-7f9c"))
	defer p.Close()
	mux := http.NewServeMux()
	mux.Handle("/debug/locks/", http.StripPrefix("/debug/locks", lockhttp.Handler(p)))
	srv := httptest.NewServer(mux)
	defer srv.Close()

	l, _ := p.Acquire(context.Background(), "invoice:42", tenace.LockAcquireOptions{Owner: "nightly-run"})
	defer l.Release(context.Background())
	resp, err := http.Get(srv.URL + "/debug/locks/json")
	if err != nil {
		panic(err)
	}
	defer resp.Body.Close()
	var s lockhttp.Snapshot
	b, _ := io.ReadAll(resp.Body)
	_ = json.Unmarshal(b, &s)
	for _, k := range s.Keys {
		fmt.Println(k.Key, "held by", k.Holders[0].Owner, k.Mode())
	}
	// Output:
	// invoice:42 held by api-7f9c (nightly-run) exclusive
}

// The same JSON from a listing of one's own: here a provider's List, as a
// page of a tool would take it.
func ExampleNewSnapshot() {
	p := tenace.NewMemoryLockProvider(tenace.WithOwner("api-7f9c"))
	defer p.Close()
	l, _ := p.Acquire(context.Background(), "invoice:\xff", tenace.LockAcquireOptions{})
	defer l.Release(context.Background())

	page, err := p.List(context.Background(), tenace.ListOptions{Prefix: "invoice:"})
	if err != nil {
		panic(err)
	}
	snap := lockhttp.NewSnapshot("invoice:", page.Keys, page.Next != "", time.Now())
	k := snap.Keys[0]
	fmt.Println(k.Key, k.Quoted, k.Base64, k.Holders[0].Owner)
	// Output:
	// "invoice:\xff" true aW52b2ljZTr/ api-7f9c
}

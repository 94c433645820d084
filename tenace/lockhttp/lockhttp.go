// Package lockhttp serves a page of a lock provider's held keys — who
// holds each, since when, who waits — for a service's debug port, beside
// net/http/pprof:
//
//	mux.Handle("/debug/locks/", http.StripPrefix("/debug/locks", lockhttp.Handler(provider)))
//
// The page lists the held keys with their owner, mode, age, waiters and
// longest wait, sortable by any column, with the longest waits first in a
// list of their own; it refreshes itself every few seconds without a full
// reload (a fetch of the JSON). The same data is JSON for scripts: the
// path ending in /json, or ?format=json. Both take ?prefix= to list only
// the keys that begin with it.
//
// It only reads: Handler answers GET and HEAD, refuses every other method
// (405), and asks the provider nothing but tenace.Inspector's List, which
// never changes a lock. Keys are arbitrary bytes, and a page must never run
// what a key holds: every key and owner is written as text (html/template
// on the server, textContent in the page's script, never innerHTML), a key
// that is not valid UTF-8 of printable characters is shown quoted as Go's
// %q quotes it, and the page's Content-Security-Policy runs no script but
// its own. The JSON gives each key whole, as base64, beside that text.
//
// A page lists at most the Limit first keys (default 1000) that List
// returns; it says so when there are more. Give the handler the protection
// the rest of the debug port has: the page names the keys, which can hold
// what your keys hold (customer ids, say).
package lockhttp

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"html/template"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"tenace.dev/tenace"
)

// Option configures Handler.
type Option interface {
	apply(*config)
}

type config struct {
	refresh time.Duration
	limit   int
	timeout time.Duration
}

type optionFunc func(*config)

func (f optionFunc) apply(c *config) { f(c) }

// Defaults of the options.
const (
	DefaultRefresh = 2 * time.Second
	DefaultLimit   = 1000
	DefaultTimeout = 5 * time.Second
)

// WithRefresh sets how often the page fetches the data again; 0 turns the
// refresh off (the page then shows what it was served with). The default
// is DefaultRefresh. It panics if d is negative.
func WithRefresh(d time.Duration) Option {
	if d < 0 {
		panic("tenace: lockhttp.WithRefresh: negative interval")
	}
	return optionFunc(func(c *config) { c.refresh = d })
}

// WithLimit sets the most keys one answer lists (the page and the JSON);
// the default is DefaultLimit. It panics if n < 1.
func WithLimit(n int) Option {
	if n < 1 {
		panic("tenace: lockhttp.WithLimit: the limit must be at least 1")
	}
	return optionFunc(func(c *config) { c.limit = n })
}

// WithTimeout bounds the provider's answer to one request (all the pages
// of List it takes); the default is DefaultTimeout. An answer not ready in
// time is an error on the page, never an empty list. It panics if d is not
// positive.
func WithTimeout(d time.Duration) Option {
	if d <= 0 {
		panic("tenace: lockhttp.WithTimeout: the timeout must be positive")
	}
	return optionFunc(func(c *config) { c.timeout = d })
}

// Handler returns the page and the JSON of inspector's held keys (see the
// package documentation). It panics if inspector is nil.
func Handler(inspector tenace.Inspector, opts ...Option) http.Handler {
	if inspector == nil {
		panic("tenace: lockhttp.Handler: nil inspector; pass a tenace.Inspector, such as a *tenace.MemoryLockProvider")
	}
	cfg := config{refresh: DefaultRefresh, limit: DefaultLimit, timeout: DefaultTimeout}
	for _, o := range opts {
		o.apply(&cfg)
	}
	return &handler{inspector: inspector, cfg: cfg}
}

type handler struct {
	inspector tenace.Inspector
	cfg       config
}

// Snapshot is the JSON the handler serves: the held keys at one moment.
type Snapshot struct {
	// At is when the listing was taken.
	At time.Time `json:"at"`
	// Prefix is the prefix the keys were listed under ("" for all).
	Prefix string `json:"prefix"`
	// Keys are the held keys, sorted by key; at most the handler's limit.
	Keys []Key `json:"keys"`
	// Truncated is true when more keys are held than the answer lists.
	Truncated bool `json:"truncated"`
	// Error is why the provider did not answer; then Keys is empty.
	Error string `json:"error,omitempty"`
}

// Key is one held key of a Snapshot.
type Key struct {
	// Key is the key as text: itself when it is valid UTF-8 of printable
	// characters, else quoted as Go's %q does (and Quoted is true).
	Key    string `json:"key"`
	Quoted bool   `json:"quoted,omitempty"`
	// Base64 is the key whole, byte for byte (standard encoding).
	Base64 string `json:"base64"`
	// Holders are its grants.
	Holders []Holder `json:"holders"`
	// Waiting is the number of callers waiting; Waiters those the provider
	// names (owners as text, as Key is).
	Waiting int      `json:"waiting"`
	Waiters []Waiter `json:"waiters,omitempty"`
	// LongestWaitMS is how long the oldest waiter has waited, in
	// milliseconds.
	LongestWaitMS int64 `json:"longest_wait_ms"`
	// HeldMS is how long its oldest holder has held it, in milliseconds (0
	// when the provider does not know).
	HeldMS int64 `json:"held_ms"`
}

// Holder is one grant of a Key.
type Holder struct {
	Owner   string     `json:"owner"`
	Shared  bool       `json:"shared"`
	Permits int        `json:"permits,omitempty"`
	Token   uint64     `json:"token,omitempty"`
	Since   *time.Time `json:"since,omitempty"`
	Expires *time.Time `json:"expires,omitempty"`
}

// Waiter is one named waiter of a Key.
type Waiter struct {
	Owner  string     `json:"owner"`
	Shared bool       `json:"shared"`
	Since  *time.Time `json:"since,omitempty"`
}

func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		http.Error(w, "tenace: the locks page only reads: use GET or HEAD", http.StatusMethodNotAllowed)
		return
	}
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	snap := h.snapshot(r.Context(), r.URL.Query().Get("prefix"))
	status := http.StatusOK
	if snap.Error != "" {
		status = http.StatusServiceUnavailable
	}
	if strings.HasSuffix(r.URL.Path, "/json") || r.URL.Query().Get("format") == "json" {
		w.Header().Set("Content-Type", "application/json; charset=utf-8")
		w.WriteHeader(status)
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		_ = enc.Encode(snap)
		return
	}
	nonce := newNonce()
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Content-Security-Policy",
		"default-src 'none'; script-src 'nonce-"+nonce+"'; style-src 'nonce-"+nonce+"'; connect-src 'self'; img-src 'none'; base-uri 'none'; form-action 'self'")
	w.WriteHeader(status)
	_ = page.Execute(w, pageData{Snapshot: snap, Nonce: nonce, RefreshMS: h.cfg.refresh.Milliseconds(), Now: snap.At})
}

// snapshot lists the held keys under prefix, page after page, until the
// limit or the last page.
func (h *handler) snapshot(ctx context.Context, prefix string) Snapshot {
	ctx, cancel := context.WithTimeout(ctx, h.cfg.timeout)
	defer cancel()
	snap := Snapshot{Prefix: prefix, Keys: []Key{}}
	var infos []tenace.KeyInfo
	cursor := ""
	for {
		page, err := h.inspector.List(ctx, tenace.ListOptions{Prefix: prefix, Cursor: cursor, Limit: min(h.cfg.limit-len(infos)+1, 1000)})
		if err != nil {
			snap.At = time.Now()
			snap.Error = err.Error()
			return snap
		}
		infos = append(infos, page.Keys...)
		if page.Next == "" {
			break
		}
		if len(infos) > h.cfg.limit {
			break
		}
		cursor = page.Next
	}
	snap.At = time.Now()
	slices.SortFunc(infos, func(a, b tenace.KeyInfo) int { return strings.Compare(a.Key, b.Key) })
	if len(infos) > h.cfg.limit {
		infos, snap.Truncated = infos[:h.cfg.limit], true
	}
	for _, k := range infos {
		snap.Keys = append(snap.Keys, toKey(k, snap.At))
	}
	return snap
}

// toKey turns a provider's KeyInfo into the page's Key, at now.
func toKey(k tenace.KeyInfo, now time.Time) Key {
	text, quoted := Text(k.Key)
	out := Key{Key: text, Quoted: quoted, Base64: base64.StdEncoding.EncodeToString([]byte(k.Key)),
		Holders: []Holder{}, Waiting: k.Waiting, LongestWaitMS: k.LongestWait.Milliseconds()}
	var oldest time.Time
	for _, h := range k.Holders {
		owner, _ := Text(h.Owner)
		out.Holders = append(out.Holders, Holder{Owner: owner, Shared: h.Shared, Permits: h.Permits, Token: h.Token, Since: timePtr(h.Since), Expires: timePtr(h.Expires)})
		if !h.Since.IsZero() && (oldest.IsZero() || h.Since.Before(oldest)) {
			oldest = h.Since
		}
	}
	if !oldest.IsZero() {
		out.HeldMS = max(now.Sub(oldest), 0).Milliseconds()
	}
	for _, w := range k.Waiters {
		owner, _ := Text(w.Owner)
		out.Waiters = append(out.Waiters, Waiter{Owner: owner, Shared: w.Shared, Since: timePtr(w.Since)})
	}
	return out
}

func timePtr(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	return &t
}

// Text returns s as text to show: s itself when it is valid UTF-8 of
// printable characters (spaces included), else s quoted as Go's %q quotes
// it, and quoted true. Either way the result is valid UTF-8; the page then
// writes it as text, never as markup.
func Text(s string) (text string, quoted bool) {
	if utf8.ValidString(s) && !strings.ContainsFunc(s, func(r rune) bool { return !strconv.IsPrint(r) && r != ' ' }) {
		return s, false
	}
	return strconv.Quote(s), true
}

// newNonce returns a fresh nonce for the page's Content-Security-Policy.
func newNonce() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails (Go 1.24+)
	return base64.RawURLEncoding.EncodeToString(b[:])
}

type pageData struct {
	Snapshot
	Nonce     string
	RefreshMS int64
	Now       time.Time
}

// Mode says how a key is held, for the page.
func (k Key) Mode() string {
	if len(k.Holders) == 0 || !k.Holders[0].Shared {
		return "exclusive"
	}
	if p := k.Holders[0].Permits; p > 0 {
		return "shared (" + strconv.Itoa(len(k.Holders)) + " of " + strconv.Itoa(p) + ")"
	}
	return "shared (" + strconv.Itoa(len(k.Holders)) + ")"
}

// Owners joins the holders' owners, for the page.
func (k Key) Owners() string {
	owners := make([]string, len(k.Holders))
	for i, h := range k.Holders {
		owners[i] = h.Owner
	}
	return strings.Join(owners, ", ")
}

// Age is HeldMS as a duration, for the page.
func (k Key) Age() string { return formatMS(k.HeldMS) }

// LongestWait is LongestWaitMS as a duration, for the page.
func (k Key) LongestWait() string { return formatMS(k.LongestWaitMS) }

// formatMS writes milliseconds as the page's script does.
func formatMS(ms int64) string {
	if ms <= 0 {
		return "—"
	}
	d := time.Duration(ms) * time.Millisecond
	if d >= time.Second {
		d = d.Round(time.Second)
	}
	return d.String()
}

// Waits returns the keys with waiters, the longest wait first, at most
// ten, for the page's list of longest waits.
func (s Snapshot) Waits() []Key {
	var ks []Key
	for _, k := range s.Keys {
		if k.Waiting > 0 {
			ks = append(ks, k)
		}
	}
	slices.SortStableFunc(ks, func(a, b Key) int { return int(b.LongestWaitMS - a.LongestWaitMS) })
	return ks[:min(len(ks), 10)]
}

var page = template.Must(template.New("page").Parse(pageHTML))

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
// its own. The JSON gives each key and owner as that text, and its exact
// bytes in base64 (see Snapshot); the tenace command's --json writes the
// same JSON.
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
	"fmt"
	"html/template"
	"net/http"
	"reflect"
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
// package documentation).
//
// It panics if inspector is nil, or is a nil pointer (or other nil value)
// of a type that implements tenace.Inspector, such as a
// (*tenace.MemoryLockProvider)(nil) left by a provider never constructed:
// that is a mistake in the program, said where it is made, as
// http.Handle says it of a nil handler, rather than a panic on the first
// request.
func Handler(inspector tenace.Inspector, opts ...Option) http.Handler {
	if isNil(inspector) {
		panic(fmt.Sprintf("tenace: lockhttp.Handler: nil inspector (%T); pass a constructed tenace.Inspector, such as a *tenace.MemoryLockProvider from tenace.NewMemoryLockProvider", inspector))
	}
	cfg := config{refresh: DefaultRefresh, limit: DefaultLimit, timeout: DefaultTimeout}
	for _, o := range opts {
		o.apply(&cfg)
	}
	return &handler{inspector: inspector, cfg: cfg}
}

// isNil reports whether v is nil, or a nil pointer, map, slice, func or
// channel in an interface.
func isNil(v any) bool {
	if v == nil {
		return true
	}
	switch rv := reflect.ValueOf(v); rv.Kind() {
	case reflect.Pointer, reflect.Map, reflect.Slice, reflect.Func, reflect.Chan, reflect.Interface:
		return rv.IsNil()
	}
	return false
}

type handler struct {
	inspector tenace.Inspector
	cfg       config
}

// Snapshot is the JSON the handler serves: the held keys at one moment.
// The tenace command's locks --json writes the same document, and its
// inspect --json one Key.
//
// Keys and owners are arbitrary bytes, and JSON strings are UTF-8: each
// comes as text, itself when it is valid UTF-8 of printable characters,
// else quoted as Go's %q quotes it (see Text) with a flag that says so
// (Key.Quoted, Holder.OwnerQuoted, Waiter.OwnerQuoted); strconv.Unquote
// of a quoted text gives the bytes back. The exact bytes also come in
// base64 (standard encoding): always for a key (Key.Base64), for an owner
// when its text is quoted (OwnerBase64). No byte is ever replaced by
// U+FFFD.
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

// Key is one held key of a Snapshot; the tenace command's inspect --json
// writes one Key, of a free key too (no holders).
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
	// names (absent when none is named).
	Waiting int      `json:"waiting"`
	Waiters []Waiter `json:"waiters,omitempty"`
	// LongestWaitMS is how long the oldest waiter has waited, in
	// milliseconds.
	LongestWaitMS int64 `json:"longest_wait_ms"`
	// HeldMS is how long its oldest holder has held it, in milliseconds (0
	// when the provider does not know).
	HeldMS int64 `json:"held_ms"`
}

// Holder is one grant of a Key: tenace.HolderInfo as JSON.
type Holder struct {
	// Owner is the holder's owner as text, as Key.Key is the key's: quoted
	// (and OwnerQuoted true) when it is not valid UTF-8 of printable
	// characters; then OwnerBase64 is its exact bytes.
	Owner       string `json:"owner"`
	OwnerQuoted bool   `json:"owner_quoted,omitempty"`
	OwnerBase64 string `json:"owner_base64,omitempty"`
	// Shared, Permits and Token are the grant's mode, permit count (shared
	// grants) and fencing token (absent when 0).
	Shared  bool   `json:"shared"`
	Permits int    `json:"permits,omitempty"`
	Token   uint64 `json:"token,omitempty"`
	// Since is when the key was granted, Expires when the grant ends
	// unless renewed (RFC 3339); absent when unknown or never.
	Since   *time.Time `json:"since,omitempty"`
	Expires *time.Time `json:"expires,omitempty"`
}

// Waiter is one named waiter of a Key: tenace.WaiterInfo as JSON, its
// owner given as Holder gives one.
type Waiter struct {
	// Owner is the waiter's owner as text, quoted (and OwnerQuoted true)
	// as Holder.Owner is; then OwnerBase64 is its exact bytes.
	Owner       string `json:"owner"`
	OwnerQuoted bool   `json:"owner_quoted,omitempty"`
	OwnerBase64 string `json:"owner_base64,omitempty"`
	// Shared is true for a waiter that waits to take the key shared.
	Shared bool `json:"shared"`
	// Since is when it began to wait; absent when unknown.
	Since *time.Time `json:"since,omitempty"`
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
	var infos []tenace.KeyInfo
	cursor := ""
	for {
		page, err := h.inspector.List(ctx, tenace.ListOptions{Prefix: prefix, Cursor: cursor, Limit: min(h.cfg.limit-len(infos)+1, 1000)})
		if err != nil {
			return Snapshot{At: time.Now(), Prefix: prefix, Keys: []Key{}, Error: err.Error()}
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
	slices.SortFunc(infos, byKey)
	if len(infos) > h.cfg.limit {
		return NewSnapshot(prefix, infos[:h.cfg.limit], true, time.Now())
	}
	return NewSnapshot(prefix, infos, false, time.Now())
}

// NewSnapshot returns the Snapshot of keys (sorted by key in it) listed
// under prefix at the moment at; truncated says more keys are held than
// keys holds. It is what the handler serves, for a program of your own
// that lists keys another way and writes the same JSON (the tenace
// command does).
func NewSnapshot(prefix string, keys []tenace.KeyInfo, truncated bool, at time.Time) Snapshot {
	snap := Snapshot{At: at, Prefix: prefix, Keys: make([]Key, 0, len(keys)), Truncated: truncated}
	if !slices.IsSortedFunc(keys, byKey) {
		keys = slices.SortedFunc(slices.Values(keys), byKey)
	}
	for _, k := range keys {
		snap.Keys = append(snap.Keys, NewKey(k, at))
	}
	return snap
}

func byKey(a, b tenace.KeyInfo) int { return strings.Compare(a.Key, b.Key) }

// NewKey returns the Key of a Snapshot that says what k says, at the
// moment now (from which HeldMS is counted).
func NewKey(k tenace.KeyInfo, now time.Time) Key {
	text, quoted := Text(k.Key)
	out := Key{Key: text, Quoted: quoted, Base64: base64.StdEncoding.EncodeToString([]byte(k.Key)),
		Holders: []Holder{}, Waiting: k.Waiting, LongestWaitMS: k.LongestWait.Milliseconds()}
	var oldest time.Time
	for _, h := range k.Holders {
		owner, quoted, raw := ownerText(h.Owner)
		out.Holders = append(out.Holders, Holder{Owner: owner, OwnerQuoted: quoted, OwnerBase64: raw,
			Shared: h.Shared, Permits: h.Permits, Token: h.Token, Since: timePtr(h.Since), Expires: timePtr(h.Expires)})
		if !h.Since.IsZero() && (oldest.IsZero() || h.Since.Before(oldest)) {
			oldest = h.Since
		}
	}
	if !oldest.IsZero() {
		out.HeldMS = max(now.Sub(oldest), 0).Milliseconds()
	}
	for _, w := range k.Waiters {
		owner, quoted, raw := ownerText(w.Owner)
		out.Waiters = append(out.Waiters, Waiter{Owner: owner, OwnerQuoted: quoted, OwnerBase64: raw, Shared: w.Shared, Since: timePtr(w.Since)})
	}
	return out
}

// ownerText is an owner as the JSON gives it: its text, whether the text
// is quoted, and then its exact bytes in base64.
func ownerText(owner string) (text string, quoted bool, b64 string) {
	text, quoted = Text(owner)
	if quoted {
		b64 = base64.StdEncoding.EncodeToString([]byte(owner))
	}
	return text, quoted, b64
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

// OwnersQuoted reports whether an owner of Owners is quoted, for the page
// (which shows quoted text in a colour of its own).
func (k Key) OwnersQuoted() bool {
	return slices.ContainsFunc(k.Holders, func(h Holder) bool { return h.OwnerQuoted })
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

package redislock

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"fmt"
	"slices"

	"github.com/redis/go-redis/v9"
)

// scriptNames names each script of the package by its SHA1, which EVALSHA
// sends (see ScriptName).
var scriptNames = map[string]string{}

// script is a Lua script of the package: redis.Script, its source for
// run's fallback to EVAL, and the start of its EVALSHA call, boxed once.
type script struct {
	*redis.Script
	src  string
	head [2]any // "evalsha" and the SHA1
}

// newScript is redis.NewScript for a script ScriptName calls name.
func newScript(name, src string) *script {
	s := redis.NewScript(src)
	scriptNames[s.Hash()] = name
	return &script{Script: s, src: src, head: [2]any{"evalsha", s.Hash()}}
}

// call returns the EVALSHA command line of s with n keys, room left for
// the keys and args more arguments: a try builds it once and sends it as
// often as it tries, through run.
func (s *script) call(n, args int) []any {
	return append(append(make([]any, 0, 3+n+args), s.head[:]...), keyCounts[n])
}

// keyCounts are the key counts of the scripts' calls, boxed once, as the
// strings go-redis reads to route a call on a Cluster (a number it would
// format anew each time).
var keyCounts = [...]any{"0", "1", "2", "3", "4", "5", "6"}

// run sends argv, a call of s (see call), and, if the server does not have
// s (NOSCRIPT: restarted, or SCRIPT FLUSH), the same by its source, as
// redis.Script.Run does; unlike Run, it boxes no keys and builds no
// command line per call.
func (s *script) run(ctx context.Context, c redis.UniversalClient, argv []any) *redis.Cmd {
	cmd := c.Do(ctx, argv...)
	if err := cmd.Err(); err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
		argv = slices.Clone(argv)
		argv[0], argv[1] = "eval", s.src
		return c.Do(ctx, argv...)
	}
	return cmd
}

// ScriptName names the script of this package that cmd runs, for a client
// hook (redis.Hook) that logs, counts or fails the provider's calls by what
// they do: "acquire" (Acquire's tries; an exclusive caller's first try
// runs a script of its own, and, when shared holders (or a grant of an
// earlier version, whose record is kept apart) hold the key, the
// full one after it, both named "acquire"), "acquireSet" (AcquireSet's on one
// slot), "renew", "release", "void" (the janitor's undoing of an acquire
// whose outcome was unknown), "sharedRenew", "sharedRelease", "sharedVoid"
// (the same for a shared lease), "unmark" (a waiting writer that gave up)
// and "fence" (FencedGet, FencedSet). It returns "" for any other command:
// not an EVAL or EVALSHA, or another script.
func ScriptName(cmd redis.Cmder) string {
	args := cmd.Args()
	if len(args) < 2 {
		return ""
	}
	switch cmd.Name() {
	case "evalsha", "evalsha_ro":
		return scriptNames[fmt.Sprint(args[1])]
	case "eval", "eval_ro":
		sum := sha1.Sum([]byte(fmt.Sprint(args[1])))
		return scriptNames[hex.EncodeToString(sum[:])]
	}
	return ""
}

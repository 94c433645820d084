package redislock

import (
	"crypto/sha1"
	"encoding/hex"
	"fmt"

	"github.com/redis/go-redis/v9"
)

// scriptNames names each script of the package by its SHA1, which EVALSHA
// sends (see ScriptName).
var scriptNames = map[string]string{}

// newScript is redis.NewScript for a script ScriptName calls name.
func newScript(name, src string) *redis.Script {
	s := redis.NewScript(src)
	scriptNames[s.Hash()] = name
	return s
}

// ScriptName names the script of this package that cmd runs, for a client
// hook (redis.Hook) that logs, counts or fails the provider's calls by what
// they do: "acquire" (Acquire's tries), "acquireSet" (AcquireSet's on one
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

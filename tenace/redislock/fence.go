package redislock

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"

	"tenace.dev/tenace"
)

// FenceLua is the guard FencedGet and FencedSet run, for programs that
// reach the same data without them (another language, redis-cli --eval):
// one script for both, on a guarded key that is a hash of two fields,
// "value" (the data) and "fence" (the highest fencing token the key has
// admitted). KEYS[1] is the guarded key; ARGV[1] the holder's token, in
// decimal; ARGV[2] "get" or "set"; ARGV[3] the value to set. A token lower
// than the fence is refused with an error reply starting "STALE"; otherwise
// the token becomes the fence — on a read too — and "get" returns the value
// (nil when unset), "set" stores it and returns OK. Tokens are compared as
// Lua numbers, exact up to 2^53 (redislock's tokens stay below it): a
// larger token, or one that is not plain decimal digits, is an error, as is
// another operation.
const FenceLua = `
local t = ARGV[1]
if not string.match(t, '^[0-9]+$') or #t > 16 or (#t == 16 and t > '9007199254740992') then
	return redis.error_reply('ERR the fence script takes a decimal token no greater than 2^53 as ARGV[1], not ' .. t)
end
if ARGV[2] ~= 'get' and ARGV[2] ~= 'set' then
	return redis.error_reply('ERR the fence script takes "get" or "set" as ARGV[2], not ' .. tostring(ARGV[2]))
end
local fence = tonumber(redis.call('HGET', KEYS[1], 'fence') or '0')
local token = tonumber(ARGV[1])
if token < fence then
	return redis.error_reply('STALE fencing token ' .. ARGV[1] .. ' is below ' .. string.format('%.0f', fence) .. ', admitted from a newer holder of the lock')
end
if ARGV[2] == 'set' then
	redis.call('HSET', KEYS[1], 'fence', ARGV[1], 'value', ARGV[3])
	return redis.status_reply('OK')
end
if token > fence then
	redis.call('HSET', KEYS[1], 'fence', ARGV[1])
end
return redis.call('HGET', KEYS[1], 'value')
`

var fenceScript = newScript("fence", FenceLua)

// ErrStaleToken is what FencedGet and FencedSet return, wrapped, when the
// key has already admitted a higher fencing token than the caller's: a newer
// holder of the lock has read or written it, so the caller's lease is lost
// (errors.Is(err, tenace.ErrLeaseLost) is true). Stop; retrying with the
// same token fails the same way.
var ErrStaleToken = fmt.Errorf("redislock: stale fencing token, the key has admitted a higher one from a newer holder of the lock: %w", tenace.ErrLeaseLost)

// maxFenceToken is the largest token the script compares exactly: Lua's
// numbers are doubles.
const maxFenceToken = 1 << 53

// FencedGet reads the value of the guarded key key (a hash written by
// FencedSet; see FenceLua) for a holder whose lease carries token
// (tenace.FencedLease's Token), in one script run, atomically:
//
//   - the token is admitted when it is at least the highest one the key has
//     admitted before; it becomes the highest. A read raises it, so that a
//     holder whose lock has passed to another cannot write after the new
//     holder has read: its write would land between the new holder's read
//     and write, and one of the two updates would be lost.
//   - a lower token is refused with an error wrapping ErrStaleToken.
//
// It returns redis.Nil, as a GET does, when no value was set. Every read
// and write of the guarded data must go through FencedGet and FencedSet: a
// plain HGET is not fenced, and fenced on writes alone a read-modify-write
// is not safe (both tested with a linearizability checker, the lock key
// deleted under its holder). The key lives on one server (one hash slot on
// a Cluster); it must outlive every holder that may still write, since a
// deleted key admits any token again: give it no TTL, and keep it from
// eviction (a maxmemory-policy of noeviction or volatile-*). A failover
// that loses the primary's last writes (replication is asynchronous) can
// lose a raise of the fence with them, as it can lose the data; WAIT after
// a FencedGet or FencedSet narrows that window. One lock (one provider,
// one key) must guard it: tokens of different locks do not compare. c is a
// *redis.Client, a *redis.ClusterClient, or any other redis.Scripter.
func FencedGet(ctx context.Context, c redis.Scripter, key string, token uint64) (string, error) {
	v, err := runFence(ctx, c, key, token, "get")
	if err != nil {
		return "", err
	}
	s, ok := v.(string)
	if !ok {
		return "", fmt.Errorf("redislock: FencedGet(%q): the script answered %T, not a string; is the key a hash written by FencedSet?", key, v)
	}
	return s, nil
}

// FencedSet writes value to the guarded key key for a holder whose lease
// carries token, in one script run, atomically: it refuses, with an error
// wrapping ErrStaleToken, a token lower than the highest the key has
// admitted (by a read or a write), and otherwise stores value and makes the
// token the highest. Read the key with FencedGet; see it for the rule.
func FencedSet(ctx context.Context, c redis.Scripter, key, value string, token uint64) error {
	_, err := runFence(ctx, c, key, token, "set", value)
	return err
}

func runFence(ctx context.Context, c redis.Scripter, key string, token uint64, args ...any) (any, error) {
	if token > maxFenceToken {
		return nil, fmt.Errorf("redislock: fencing token %d is above 2^53, which the fence script cannot compare exactly; redislock's tokens stay below it", token)
	}
	v, err := fenceScript.Run(ctx, c, []string{key}, append([]any{strconv.FormatUint(token, 10)}, args...)...).Result()
	switch {
	case errors.Is(err, redis.Nil):
		return nil, err
	case err != nil && strings.HasPrefix(err.Error(), "STALE "):
		return nil, fmt.Errorf("%w (key %q: %s)", ErrStaleToken, key, strings.TrimPrefix(err.Error(), "STALE "))
	case err != nil:
		return nil, fmt.Errorf("redislock: fenced %s of %q: %w", args[0], key, err)
	}
	return v, nil
}

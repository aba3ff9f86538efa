// Package script holds what the Redis scripts of quotas/admission and quotas/capacity
// share: the clock every script reads "now" from, and the Lua of a tenant's
// ai_tokens_per_minute bucket, which capacity reserves from directly and admission's
// step reservation takes from in the same atomic call as the period quotas.
package script

import (
	"strconv"
	"time"
)

// Now starts every script that needs the time: ARGV[1] is "now" in ms (tests pass
// a fake clock), or "" to read Redis TIME, one clock for every replica.
const Now = `
local now = tonumber(ARGV[1])
if not now then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
`

// TenantTokens defines the functions of a tenant's ai_tokens_per_minute bucket (a
// hash: level "l", last refill "t", at KEYS[ki]): tpm_load refills it to now and
// returns its level and its rate a millisecond; tpm_save writes a level back, with a
// ttl of the time it takes to fill up again (a full bucket is the same as none).
// Scripts that use it start with Now.
const TenantTokens = `
local tpm_t = {}
local function tpm_load(ki, per_minute, burst)
  local key = KEYS[ki]
  local rate = per_minute / 60000
  local st = redis.call('HMGET', key, 'l', 't')
  local l, t = tonumber(st[1]), tonumber(st[2])
  tpm_t[key] = t or 0
  if not l or not t then return burst, rate end
  if now > t then l = math.min(burst, l + (now - t) * rate) end
  return l, rate
end
local function tpm_save(ki, l, rate, burst)
  local key = KEYS[ki]
  -- the last refill tpm_load read (nothing writes it in between), else read now
  local t = tpm_t[key] or tonumber(redis.call('HGET', key, 't') or '0')
  redis.call('HSET', key, 'l', string.format('%.17g', l), 't', math.max(t, now))
  redis.call('PEXPIRE', key, math.max(1, math.ceil((burst - l) / rate)))
end
`

// Clock is the time the scripts decide by: NowMs, when set, replaces Redis TIME
// (tests); nil reads Redis TIME, one clock for every replica.
type Clock struct {
	NowMs func() int64
}

// Arg is the scripts' ARGV[1]: now in ms, or "" to read Redis TIME.
func (c Clock) Arg() string {
	if c.NowMs == nil {
		return ""
	}
	return strconv.FormatInt(c.NowMs(), 10)
}

// Now is the clock read in Go: the test clock, or this host's.
func (c Clock) Now() time.Time {
	if c.NowMs != nil {
		return time.UnixMilli(c.NowMs())
	}
	return time.Now()
}

// Fake reports whether the clock replaces Redis TIME.
func (c Clock) Fake() bool { return c.NowMs != nil }

// Bool is a flag as the scripts read it: "1" or "0".
func Bool(b bool) string {
	if b {
		return "1"
	}
	return "0"
}

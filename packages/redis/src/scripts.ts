import { createHash } from 'node:crypto';

/**
 * The store's Lua scripts. One Redis string per record (one key, so a Cluster never sees a cross-slot call), in the
 * string layout ("v2"):
 *   in progress  'p' | UUID (36 bytes) | fingerprint                   ('w' instead of 'p': a waiter listens, so
 *                                                                       completion and release PUBLISH the key)
 *   completed    'c' | fingerprint length ':' fingerprint | status ':' headers length ':' headers (JSON) | body
 * The key's own expiry is the lease (in progress) or the TTL (completed): a crashed owner's record disappears by
 * itself, no clock is read (no `TIME`: clock skew between app servers cannot stretch or cut a lease), and a record
 * is one `GET` and one `SET ... PX`. Against the hash layout before it (state, fingerprint, token, lease end,
 * status, headers and body as fields, with `TIME`, `HMGET`, `HSET`, `HDEL` and `PEXPIRE` per call) this costs
 * Redis far less CPU per request (docs/stores/redis.md, "Record layout and rolling deploys").
 *
 * Rolling deploys: records of the hash layout stay readable until they expire. `GET` on a hash fails (WRONGTYPE),
 * so every script reads with `redis.pcall` and takes the hash path only then (`LEGACY_*` below): it answers from
 * the hash as the earlier version did, in the replies of this layout, and writes only this layout. The earlier
 * version cannot read this layout: its scripts fail on these keys (a store error: 503, nothing runs twice).
 * Replies are parsed in one place, `replies.ts`.
 *
 * The store's fencing token is a UUID followed by the fingerprint, so that the in-progress record is 'p' | token and
 * `complete` can build the completed record itself: Redis, which every app server shares, then only compares and
 * writes, rather than joining the record in Lua.
 * A free key or a completed record does not need ACQUIRE: the store sends `SET key 'p'|token PX lockTimeout NX
 * GET`, which writes the very record ACQUIRE would write, or returns the completed one untouched, for less of
 * Redis's CPU than a script. ACQUIRE runs where the SET finds a lease (its reply has the remaining time) or is
 * refused (a hash record's WRONGTYPE, OOM, Redis before 7.0).
 */

// A record of the hash layout ("v1", before the string layout): s state 'p'/'c', f fingerprint, t token, l lease
// end (ms, Redis clock), c status, h headers JSON, b body, w set when a waiter listens.
const LEGACY_NOW = `local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)`;

// A new caller owns only records of this layout (it made them): a hash, a missing key, or another token is not its.
// The store's token is the UUID and the fingerprint, so an in-progress record is its state byte and the token.
const OWNED = `local v = redis.pcall('GET', KEYS[1])
if type(v) ~= 'string' then return 0 end
local s = string.byte(v, 1)
if (s ~= 112 and s ~= 119) or string.sub(v, 2) ~= ARGV[1] then return 0 end`;

/**
 * KEYS: record. ARGV: the new in-progress record ('p' | token), lockTimeoutMs. Replies 1 (acquired), the completed
 * record (a string), or { the in-progress record, its remaining lease in ms }.
 * A lease with this call's own token ('p' or 'w' then the token, a random UUID nobody else has) is this call's: its
 * write already ran once, and the client sent it again after a connection lost the reply (ioredis resends what is
 * in flight when it reconnects; the store's `SET ... NX GET` comes here then too). It is taken as acquired, and its
 * lease renewed by a write, so that a `WAIT` behind this call (`waitForReplicas`) confirms the lease as well.
 */
export const ACQUIRE = `local v = redis.pcall('GET', KEYS[1])
if type(v) == 'string' then
  if string.byte(v, 1) == 99 then return v end
  if string.sub(v, 2) == string.sub(ARGV[1], 2) then
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
    return 1
  end
  return {v, redis.call('PTTL', KEYS[1])}
elseif v then
  ${LEGACY_NOW}
  local r = redis.call('HMGET', KEYS[1], 's', 'f', 'l', 'c', 'h', 'b', 't')
  if r[1] == 'c' then return 'c' .. #r[2] .. ':' .. r[2] .. r[4] .. ':' .. #r[5] .. ':' .. r[5] .. r[6] end
  if r[1] == 'p' and tonumber(r[3]) > now then return {'p' .. r[7] .. r[2], tonumber(r[3]) - now} end
end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return 1`;

/**
 * KEYS: record. ARGV: token, the completed record (built by the caller: the script only checks the token and
 * writes), ttlMs, channel.
 */
export const COMPLETE = `${OWNED}
redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
if s == 119 then redis.call('PUBLISH', ARGV[4], KEYS[1]) end
return 1`;

/** KEYS: record. ARGV: token, channel. */
export const RELEASE = `${OWNED}
redis.call('DEL', KEYS[1])
if s == 119 then redis.call('PUBLISH', ARGV[2], KEYS[1]) end
return 1`;

/**
 * KEYS: record. ARGV: token, the completed record, the TTL left (ms), channel (COMPLETE's). Re-sends a completion its
 * replicas did not confirm (`waitForReplicas`). Where the very same record is there, it only rewrites its first byte
 * (`SETRANGE`, a few bytes to replicate, the TTL untouched): the WAIT behind it needs a write of this connection to
 * confirm (a WAIT confirms a connection's own writes only), not the whole record again. Where this token's lease still
 * holds the key (a replica promoted without the completion) it writes the record, for what is left of its TTL.
 * Replies 1 (written or there), 2 (the key is gone), 0 (another owner's lease or record: the completion is lost).
 */
export const RECOMPLETE = `local v = redis.pcall('GET', KEYS[1])
if not v then return 2 end
if type(v) ~= 'string' then return 0 end
if v == ARGV[2] then
  redis.call('SETRANGE', KEYS[1], 0, 'c')
  return 1
end
local s = string.byte(v, 1)
if (s ~= 112 and s ~= 119) or string.sub(v, 2) ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
if s == 119 then redis.call('PUBLISH', ARGV[4], KEYS[1]) end
return 1`;

/**
 * KEYS: record. ARGV: token, channel (RELEASE's). Re-sends a release its replicas did not confirm: deletes this
 * token's lease where it still holds the key (a replica promoted without the release); where the key is gone, writes
 * and deletes it in one step, so that the WAIT behind it has a write to confirm and a replica that still has the
 * lease drops it. Another owner's lease or a completed record: 0, the key is no longer this owner's.
 */
export const RERELEASE = `local v = redis.pcall('GET', KEYS[1])
if not v then
  redis.call('SET', KEYS[1], 'r', 'PX', 1)
  redis.call('DEL', KEYS[1])
  return 1
end
if type(v) ~= 'string' then return 0 end
local s = string.byte(v, 1)
if (s ~= 112 and s ~= 119) or string.sub(v, 2) ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1])
if s == 119 then redis.call('PUBLISH', ARGV[2], KEYS[1]) end
return 1`;

/** KEYS: record. ARGV: token, lockTimeoutMs. */
export const RENEW = `${OWNED}
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1`;

/** KEYS: record. Marks a live lease as watched; replies 1 if it is, 0 if the key is not held now. */
export const WATCH = `local v = redis.pcall('GET', KEYS[1])
if type(v) == 'string' then
  local s = string.byte(v, 1)
  if s == 112 then redis.call('SETRANGE', KEYS[1], 0, 'w') return 1 end
  if s == 119 then return 1 end
  return 0
elseif v then
  ${LEGACY_NOW}
  local r = redis.call('HMGET', KEYS[1], 's', 'l')
  if r[1] ~= 'p' or tonumber(r[2]) <= now then return 0 end
  redis.call('HSET', KEYS[1], 'w', '1')
  return 1
end
return 0`;

/**
 * KEYS: record. Replies nil, or { the record (a string), its expiry (ms, Redis clock) }, or for a hash-layout record
 * { state, fingerprint, token, lease end, status, headers, body, expiry }.
 */
export const GET = `${LEGACY_NOW}
local v = redis.pcall('GET', KEYS[1])
if not v then return nil end
local expires = now + redis.call('PTTL', KEYS[1])
if type(v) == 'string' then return {v, expires} end
local r = redis.call('HMGET', KEYS[1], 's', 'f', 't', 'l', 'c', 'h', 'b')
return {r[1], r[2], r[3], r[4] or '0', r[5] or '', r[6] or '', r[7] or '', expires}`;

/**
 * KEYS: record. ARGV: the completed record (this layout, built by the caller), ttlMs. Writes a completed record
 * copied from another store (the PostgreSQL outbox relay) unless a completed one is already there; replies 1 if it
 * wrote.
 */
export const PUT_COMPLETED = `local v = redis.pcall('GET', KEYS[1])
if type(v) == 'string' then
  if string.byte(v, 1) == 99 then return 0 end
elseif v and redis.call('HGET', KEYS[1], 's') == 'c' then
  return 0
end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return 1`;

export interface Script {
  readonly lua: string;
  readonly sha: string;
}

function script(lua: string): Script {
  return { lua, sha: createHash('sha1').update(lua).digest('hex') };
}

export const SCRIPTS = {
  acquire: script(ACQUIRE),
  complete: script(COMPLETE),
  release: script(RELEASE),
  recomplete: script(RECOMPLETE),
  rerelease: script(RERELEASE),
  renew: script(RENEW),
  watch: script(WATCH),
  get: script(GET),
  putCompleted: script(PUT_COMPLETED),
} as const;

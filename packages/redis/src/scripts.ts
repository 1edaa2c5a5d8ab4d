import { createHash } from 'node:crypto';

/**
 * The store's Lua scripts. One Redis string per record (one key, so a Cluster never sees a cross-slot call), in the
 * string layout ("v2"):
 *   in progress  'p' | UUID (36 bytes) | fingerprint                   ('w' instead of 'p': a waiter listens, so
 *                                                                       completion and release PUBLISH the key)
 *   completed    'c' | fingerprint length ':' fingerprint | status ':' headers length ':' headers (JSON) | body
 *   with steps   's' | lease end (15 digits) | UUID (36) | steps' expiry (15 digits) | fingerprint length ':'
 *                fingerprint | per step: name length ':' name | value length ':' value       (lengths in bytes)
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
 * A record with steps (`recordStep`) must outlive its lease (released, or run out, it keeps its steps for the next
 * acquire), so its key's expiry is the later of two times the record holds itself, on Redis's clock (`TIME`): the
 * lease end and the steps' expiry (`ttlMs` after the latest step). Both are fixed-width and sit before the steps,
 * with the owner's UUID between them, so that a resume, a renewal, a release and a step rewrite a few bytes
 * (`SETRANGE`, `APPEND`, `PEXPIREAT`) rather than the record, and a lease end of now or before is a released record.
 * Only such records pay for the clock: the others keep the layout and the commands they had. Completion and
 * release of a record with steps always PUBLISH (no 'w' mark: such records are few).
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

/** Redis's clock, in ms: read by the hash layout's paths and a record with steps' only. */
const NOW = `local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)`;

/** A fixed-width time in a record with steps (15 digits: epoch milliseconds for a long while yet). */
const TIME_FORMAT = `'%015d'`;

// In a record with steps (s == 115): its lease end and its steps' expiry, and `mine`, whether ARGV[1] is its token:
// the UUID and the fingerprint the record keeps (a resumed record's owner holds that fingerprint, not its own).
// `undo` (the release behind a failed acquire, ARGV[3]) knows only the acquire's own fingerprint: its UUID suffices.
const STEPS_LEASE = 'tonumber(string.sub(v, 2, 16))';
const STEPS_EXPIRY = 'tonumber(string.sub(v, 53, 67))';
const stepsMine = (undo: boolean) => `local c = string.find(v, ':', 68, true)
local mine = ARGV[1] == string.sub(v, 17, 52) .. string.sub(v, c + 1, c + tonumber(string.sub(v, 68, c - 1)))
${undo ? "if ARGV[3] == 'undo' then mine = string.sub(ARGV[1], 1, 36) == string.sub(v, 17, 52) end" : ''}`;
const stepsOwned = (undo = false) => `${NOW}
${stepsMine(undo)}
if not mine or ${STEPS_LEASE} <= now then return 0 end`;

// A new caller owns only records of this layout (it made them): a hash, a missing key, or another token is not its.
// The store's token is the UUID and the fingerprint, so an in-progress record is its state byte and the token.
// `steps` runs for a record with steps this token owns.
const owned = (steps: string, undo = false) => `local v = redis.pcall('GET', KEYS[1])
if type(v) ~= 'string' then return 0 end
local s = string.byte(v, 1)
if s == 115 then
  ${stepsOwned(undo)}
  ${steps}
end
if (s ~= 112 and s ~= 119) or string.sub(v, 2) ~= ARGV[1] then return 0 end`;

/**
 * KEYS: record. ARGV: the new in-progress record ('p' | token), lockTimeoutMs. Replies 1 (acquired), the completed
 * record (a string), the record with steps it resumed (a string: taken with this call's UUID and lease, keeping its
 * fingerprint and steps), or { the in-progress record, its remaining lease in ms } (for a record with steps held by
 * another, one in the in-progress layout made of its UUID and fingerprint).
 * A lease with this call's own token ('p' or 'w' then the token, a random UUID nobody else has) is this call's: its
 * write already ran once, and the client sent it again after a connection lost the reply (ioredis resends what is
 * in flight when it reconnects; the store's `SET ... NX GET` comes here then too). It is taken as acquired, and its
 * lease renewed by a write, so that a `WAIT` behind this call (`waitForReplicas`) confirms the lease as well.
 */
export const ACQUIRE = `local v = redis.pcall('GET', KEYS[1])
if type(v) == 'string' then
  local s = string.byte(v, 1)
  if s == 99 then return v end
  if s == 115 then
    ${NOW}
    local lease = ${STEPS_LEASE}
    local id = string.sub(ARGV[1], 2, 37)
    if lease > now and string.sub(v, 17, 52) ~= id then
      local c = string.find(v, ':', 68, true)
      return {'p' .. string.sub(v, 17, 52) .. string.sub(v, c + 1, c + tonumber(string.sub(v, 68, c - 1))), lease - now}
    end
    lease = now + tonumber(ARGV[2])
    redis.call('SETRANGE', KEYS[1], 1, string.format(${TIME_FORMAT}, lease) .. id)
    redis.call('PEXPIREAT', KEYS[1], math.max(lease, ${STEPS_EXPIRY}))
    return v
  end
  if string.sub(v, 2) == string.sub(ARGV[1], 2) then
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
    return 1
  end
  return {v, redis.call('PTTL', KEYS[1])}
elseif v then
  ${NOW}
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
export const COMPLETE = `${owned(`redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
  redis.call('PUBLISH', ARGV[4], KEYS[1])
  return 1`)}
redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
if s == 119 then redis.call('PUBLISH', ARGV[4], KEYS[1]) end
return 1`;

// A record with steps is released, not deleted: its lease ends now, and the key lives on until its steps' expiry.
const STEPS_RELEASE = `redis.call('SETRANGE', KEYS[1], 1, string.format(${TIME_FORMAT}, now))
  redis.call('PEXPIREAT', KEYS[1], math.max(now, ${STEPS_EXPIRY}))
  redis.call('PUBLISH', ARGV[2], KEYS[1])
  return 1`;

/** KEYS: record. ARGV: token, channel, and 'undo' for the release behind a failed acquire. */
export const RELEASE = `${owned(STEPS_RELEASE, true)}
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
if s == 115 then
  ${stepsOwned()}
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
  redis.call('PUBLISH', ARGV[4], KEYS[1])
  return 1
end
if (s ~= 112 and s ~= 119) or string.sub(v, 2) ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
if s == 119 then redis.call('PUBLISH', ARGV[4], KEYS[1]) end
return 1`;

/**
 * KEYS: record. ARGV: token, channel, 'undo' (RELEASE's). Re-sends a release its replicas did not confirm: deletes this
 * token's lease where it still holds the key (a replica promoted without the release); where the key is gone, writes
 * and deletes it in one step, so that the WAIT behind it has a write to confirm and a replica that still has the
 * lease drops it. A record with steps under this token's UUID is released where its lease still holds, and otherwise
 * (released already) rewritten in one byte, for the WAIT. Another owner's lease or a completed record: 0, the key is
 * no longer this owner's.
 */
export const RERELEASE = `local v = redis.pcall('GET', KEYS[1])
if not v then
  redis.call('SET', KEYS[1], 'r', 'PX', 1)
  redis.call('DEL', KEYS[1])
  return 1
end
if type(v) ~= 'string' then return 0 end
local s = string.byte(v, 1)
if s == 115 then
  ${stepsMine(true)}
  if not mine then return 0 end
  ${NOW}
  if ${STEPS_LEASE} > now then
    ${STEPS_RELEASE}
  end
  redis.call('SETRANGE', KEYS[1], 0, 's')
  return 1
end
if (s ~= 112 and s ~= 119) or string.sub(v, 2) ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1])
if s == 119 then redis.call('PUBLISH', ARGV[2], KEYS[1]) end
return 1`;

/** KEYS: record. ARGV: token, lockTimeoutMs. */
export const RENEW = `${owned(`local lease = now + tonumber(ARGV[2])
  redis.call('SETRANGE', KEYS[1], 1, string.format(${TIME_FORMAT}, lease))
  redis.call('PEXPIREAT', KEYS[1], math.max(lease, ${STEPS_EXPIRY}))
  return 1`)}
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1`;

/**
 * KEYS: record. Marks a live lease as watched; replies 1 if it is, 0 if the key is not held now. A record with steps
 * needs no mark (its completion and release always PUBLISH).
 */
export const WATCH = `local v = redis.pcall('GET', KEYS[1])
if type(v) == 'string' then
  local s = string.byte(v, 1)
  if s == 115 then
    ${NOW}
    if ${STEPS_LEASE} > now then return 1 end
    return 0
  end
  if s == 112 then redis.call('SETRANGE', KEYS[1], 0, 'w') return 1 end
  if s == 119 then return 1 end
  return 0
elseif v then
  ${NOW}
  local r = redis.call('HMGET', KEYS[1], 's', 'l')
  if r[1] ~= 'p' or tonumber(r[2]) <= now then return 0 end
  redis.call('HSET', KEYS[1], 'w', '1')
  return 1
end
return 0`;

/**
 * KEYS: record. Replies nil, or { the record (a string), its expiry (ms, Redis clock), now (the same clock) }, or for a
 * hash-layout record { state, fingerprint, token, lease end, status, headers, body, expiry }.
 */
export const GET = `${NOW}
local v = redis.pcall('GET', KEYS[1])
if not v then return nil end
local expires = now + redis.call('PTTL', KEYS[1])
if type(v) == 'string' then return {v, expires, now} end
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

/**
 * KEYS: record. ARGV: token, step name, value, ttlMs. Records the step in the token's record, replacing a value under
 * the same name; replies 1, or 0 (not this token's live lease: nothing written). The first step turns the in-progress
 * record into one with steps (its lease end taken from the key's expiry); later ones append (or, for a name already
 * there, rewrite the record without the old entry).
 */
export const RECORD_STEP = `local v = redis.pcall('GET', KEYS[1])
if type(v) ~= 'string' then return 0 end
local s = string.byte(v, 1)
${NOW}
local entry = #ARGV[2] .. ':' .. ARGV[2] .. #ARGV[3] .. ':' .. ARGV[3]
local expires = now + tonumber(ARGV[4])
if s == 112 or s == 119 then
  if string.sub(v, 2) ~= ARGV[1] then return 0 end
  local lease = now + redis.call('PTTL', KEYS[1])
  local fingerprint = string.sub(ARGV[1], 37)
  redis.call('SET', KEYS[1], 's' .. string.format(${TIME_FORMAT}, lease) .. string.sub(ARGV[1], 1, 36) ..
    string.format(${TIME_FORMAT}, expires) .. #fingerprint .. ':' .. fingerprint .. entry)
  redis.call('PEXPIREAT', KEYS[1], math.max(lease, expires))
  return 1
end
if s ~= 115 then return 0 end
local lease = ${STEPS_LEASE}
local c = string.find(v, ':', 68, true)
local p = c + 1 + tonumber(string.sub(v, 68, c - 1))
if ARGV[1] ~= string.sub(v, 17, 52) .. string.sub(v, c + 1, p - 1) or lease <= now then return 0 end
local name = ARGV[2]
while p <= #v do
  c = string.find(v, ':', p, true)
  local n = tonumber(string.sub(v, p, c - 1))
  local q = string.find(v, ':', c + n + 1, true)
  local after = q + 1 + tonumber(string.sub(v, c + n + 1, q - 1))
  if n == #name and string.sub(v, c + 1, c + n) == name then
    redis.call('SET', KEYS[1], string.sub(v, 1, 52) .. string.format(${TIME_FORMAT}, expires) ..
      string.sub(v, 68, p - 1) .. string.sub(v, after) .. entry)
    redis.call('PEXPIREAT', KEYS[1], math.max(lease, expires))
    return 1
  end
  p = after
end
redis.call('SETRANGE', KEYS[1], 52, string.format(${TIME_FORMAT}, expires))
redis.call('APPEND', KEYS[1], entry)
redis.call('PEXPIREAT', KEYS[1], math.max(lease, expires))
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
  recordStep: script(RECORD_STEP),
} as const;

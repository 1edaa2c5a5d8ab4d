import { createHash } from 'node:crypto';

/**
 * The store's Lua scripts. One Redis hash per record (one key, so a Cluster never sees a cross-slot call):
 *   s  state: 'p' (in progress) or 'c' (completed)      f  fingerprint
 *   t  fencing token                                      l  lease end, ms on Redis's clock
 *   c  status code    h  headers (JSON)    b  body (raw bytes)
 *   w  set when a waiter listens: completion and release then PUBLISH the key on the channel (ARGV, last)
 * Every time comes from Redis (`TIME`, `PEXPIRE`), never from the application, so clock skew between app
 * servers cannot stretch or cut a lease. The key's own expiry is the lease (in progress) or the TTL (completed),
 * so a crashed owner's record disappears by itself. Each script is one call; each parses nothing but its own
 * fields. Replies are parsed in one place, `replies.ts`.
 */

const NOW = `local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)`;

// The caller owns the record: in progress, its token, lease not over.
const OWNED = `local r = redis.call('HMGET', KEYS[1], 's', 't', 'l', 'w')
if r[1] ~= 'p' or r[2] ~= ARGV[1] or tonumber(r[3]) <= now then return 0 end`;

/** KEYS: record. ARGV: fingerprint, lockTimeoutMs, new token. */
export const ACQUIRE = `${NOW}
local r = redis.call('HMGET', KEYS[1], 's', 'f', 'l', 'c', 'h', 'b')
if r[1] == 'c' then return {'c', r[2], r[4], r[5], r[6]} end
if r[1] == 'p' and tonumber(r[3]) > now then return {'p', r[2], tonumber(r[3]) - now} end
if r[1] then redis.call('DEL', KEYS[1]) end
redis.call('HSET', KEYS[1], 's', 'p', 'f', ARGV[1], 't', ARGV[3], 'l', now + tonumber(ARGV[2]))
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return {'a'}`;

/** KEYS: record. ARGV: token, status, headers JSON, body, ttlMs, channel. */
export const COMPLETE = `${NOW}
${OWNED}
redis.call('HSET', KEYS[1], 's', 'c', 'c', ARGV[2], 'h', ARGV[3], 'b', ARGV[4])
redis.call('HDEL', KEYS[1], 'l', 'w')
redis.call('PEXPIRE', KEYS[1], ARGV[5])
if r[4] then redis.call('PUBLISH', ARGV[6], KEYS[1]) end
return 1`;

/** KEYS: record. ARGV: token, channel. */
export const RELEASE = `${NOW}
${OWNED}
redis.call('DEL', KEYS[1])
if r[4] then redis.call('PUBLISH', ARGV[2], KEYS[1]) end
return 1`;

/** KEYS: record. ARGV: token, lockTimeoutMs. */
export const RENEW = `${NOW}
${OWNED}
redis.call('HSET', KEYS[1], 'l', now + tonumber(ARGV[2]))
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1`;

/** KEYS: record. Marks a live lease as watched; replies 1 if it is, 0 if the key is not held now. */
export const WATCH = `${NOW}
local r = redis.call('HMGET', KEYS[1], 's', 'l')
if r[1] ~= 'p' or tonumber(r[2]) <= now then return 0 end
redis.call('HSET', KEYS[1], 'w', '1')
return 1`;

/** KEYS: record. Replies { state, fingerprint, token, lease end, status, headers, body, expiresAt } or nil. */
export const GET = `${NOW}
local r = redis.call('HMGET', KEYS[1], 's', 'f', 't', 'l', 'c', 'h', 'b')
if not r[1] then return nil end
local ttl = redis.call('PTTL', KEYS[1])
return {r[1], r[2], r[3], r[4] or '0', r[5] or '', r[6] or '', r[7] or '', now + ttl}`;

/**
 * KEYS: record. ARGV: fingerprint, status, headers JSON, body, ttlMs. Writes a completed record copied from
 * another store (the PostgreSQL outbox relay) unless a completed one is already there; replies 1 if it wrote.
 */
export const PUT_COMPLETED = `if redis.call('HGET', KEYS[1], 's') == 'c' then return 0 end
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], 's', 'c', 'f', ARGV[1], 't', 'copy', 'c', ARGV[2], 'h', ARGV[3], 'b', ARGV[4])
redis.call('PEXPIRE', KEYS[1], ARGV[5])
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
  renew: script(RENEW),
  watch: script(WATCH),
  get: script(GET),
  putCompleted: script(PUT_COMPLETED),
} as const;

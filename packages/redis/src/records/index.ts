/**
 * Where `RedisStore` keeps each record: its key prefix and the Redis key of a store key, for
 * tools that read the store's keys themselves (the `oncely` command's list and stats). An app does not need it.
 *
 * @module @oncely/redis/records
 */
import { createHash } from 'node:crypto';

/** The prefix a store uses when it is given none. */
export const DEFAULT_PREFIX = 'oncely:';

/**
 * Whether a store's keys holding a brace get a digest tag of their own: on a Cluster only, and not when the prefix
 * holds a whole hash tag (`{...}`), which then picks the slot of every key on purpose.
 */
export function usesDigestTags(prefix: string, cluster: boolean): boolean {
  const open = prefix.indexOf('{');
  return cluster && !(open >= 0 && prefix.indexOf('}', open + 1) >= 0);
}

/**
 * The Redis key of a store key: the prefix, then the key. Redis Cluster hashes only what a key's first `{...}`
 * holds, so a client's key such as `{x}1` would pick the slot, and one client could put all its records on one
 * shard. With digest tags (`usesDigestTags`), a key holding a brace (or a `}` after a prefix's open `{`) gets a tag
 * of its own first, a digest of the whole key, which spreads such keys as other keys spread; other keys, every key
 * a well-behaved client sends, keep the layout they had. One-to-one: a tagged key has a `{` right after the prefix,
 * an untagged one none (`storeKeyOf` reverses it).
 */
export function redisKeyOf(prefix: string, storeKey: string, digestTags: boolean): string {
  if (!digestTags || (!storeKey.includes('{') && !(storeKey.includes('}') && prefix.includes('{'))))
    return prefix + storeKey;
  return `${prefix}{${createHash('sha256').update(storeKey).digest('base64url').slice(0, DIGEST_LENGTH)}}${storeKey}`;
}

/** The digest tag's length, in base64url characters. */
const DIGEST_LENGTH = 12;

/** The store key of a Redis key (`redisKeyOf`'s inverse), or undefined for a key outside the prefix. */
export function storeKeyOf(prefix: string, redisKey: string, digestTags: boolean): string | undefined {
  if (!redisKey.startsWith(prefix)) return undefined;
  const rest = redisKey.slice(prefix.length);
  if (digestTags && rest.startsWith('{') && rest[DIGEST_LENGTH + 1] === '}')
    return rest.slice(DIGEST_LENGTH + 2);
  return rest;
}

/** The channel completions and releases are published on (not a key: SCAN never meets it). */
export function channelOf(prefix: string): string {
  return `${prefix}completed`;
}

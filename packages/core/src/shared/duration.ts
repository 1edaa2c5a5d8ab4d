/** The units a duration string may end with: milliseconds, seconds, minutes, hours, days. */
export type DurationUnit = 'ms' | 's' | 'm' | 'h' | 'd';

/**
 * A duration: milliseconds as a number, or a number with a unit such as `'250ms'`, `'30s'`, `'5m'`, `'24h'`,
 * `'1.5 h'`. A string of type `string` (read from configuration) is not a `Duration`: pass `parseDuration(value)`,
 * which throws a `TypeError` naming the value when it is not one.
 */
export type Duration = number | `${number}${DurationUnit}` | `${number} ${DurationUnit}`;

const UNIT_MS: Record<string, number> = { ms: 1, s: 1000, m: 60_000, h: 3_600_000, d: 86_400_000 };
const DURATION = /^(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)$/;

/**
 * Turns a duration into milliseconds. Numbers are milliseconds; strings carry a unit (`ms`, `s`, `m`, `h`, `d`).
 * Throws a `TypeError` for anything else, negative or not finite. Takes any string, so that a value read from
 * configuration can be checked where it is read: `ttl: parseDuration(process.env.TTL ?? '24h')`.
 */
export function parseDuration(value: Duration | string): number {
  if (typeof value === 'number') {
    if (Number.isFinite(value) && value >= 0) return value;
  } else if (typeof value === 'string') {
    const match = DURATION.exec(value.trim());
    if (match) return Math.round(Number(match[1]) * (UNIT_MS[match[2] as string] as number));
  }
  throw new TypeError(
    `Invalid duration ${JSON.stringify(value)}: use a number of milliseconds or a string like '30s', '24h'.`,
  );
}

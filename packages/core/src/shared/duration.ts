import { InvalidValueError } from './errors';
/** The units a duration string may end with: milliseconds, seconds, minutes, hours, days. */
export type DurationUnit = 'ms' | 's' | 'm' | 'h' | 'd';

/**
 * A duration: milliseconds as a number, or a number with a unit such as `'250ms'`, `'30s'`, `'5m'`, `'24h'`,
 * `'1.5 h'`. A string of type `string` (read from configuration) is not a `Duration`: pass `parseDuration(value)`,
 * which throws a `TypeError` naming the value when it is not one. Options declared in a variable before use need
 * `as const` or `satisfies` so that `'24h'` keeps its literal type. The type cannot refuse a negative
 * (`'-5s'`, `-5`): `parseDuration` does, at start-up.
 */
export type Duration = number | `${number}${DurationUnit}` | `${number} ${DurationUnit}`;

const UNIT_MS: Record<string, number> = { ms: 1, s: 1000, m: 60_000, h: 3_600_000, d: 86_400_000 };
// The number part is read as Number() reads it, so that every string the Duration type accepts ('1e3ms', '.5h')
// is accepted here too, negatives excepted.
const DURATION = /^(.*?)\s*(ms|s|m|h|d)$/;

/**
 * Turns a duration into milliseconds. Numbers are milliseconds; strings are a number (as `Number()` reads it:
 * `'1.5h'`, `'.5h'`, `'1e3ms'`) and a unit (`ms`, `s`, `m`, `h`, `d`), optionally a space between them.
 * Throws a `TypeError` for anything else, negative or not finite. Takes any string, so that a value read from
 * configuration can be checked where it is read: `ttl: parseDuration(process.env.TTL ?? '24h')`.
 */
export function parseDuration(value: Duration | string): number {
  if (typeof value === 'number') {
    if (Number.isFinite(value) && value >= 0) return value;
  } else if (typeof value === 'string') {
    const match = DURATION.exec(value.trim());
    const amount = match && match[1] !== '' ? Number(match[1]) : Number.NaN;
    // `|| 0` turns '-0s' into 0.
    if (match && Number.isFinite(amount) && amount >= 0)
      return Math.round(amount * (UNIT_MS[match[2] as string] as number)) || 0;
  }
  throw new InvalidValueError(
    `Invalid duration ${JSON.stringify(value)}: use a number of milliseconds or a string like '30s', '24h'.`,
  );
}

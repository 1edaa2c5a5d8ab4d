// Types for what idempotent()'s default JSON serialiser can store and what it gives back, so that the compiler
// sees what a replay really returns (a Date comes back as a string) and refuses results JSON cannot carry.

/** What JSON leaves out of an object (and turns into `null` in an array). */
type DroppedByJson = undefined | symbol | ((...args: never[]) => unknown);

type IsAny<T> = 0 extends 1 & T ? true : false;

/** Flattens an intersection of object types into one, so that editors show it as one object. */
type Flatten<T> = { [K in keyof T]: T[K] } & {};

/**
 * The type of `JSON.parse(JSON.stringify(value))` for a `value` of type `T`: what `idempotent()` returns with its
 * default serialiser, first call and replays alike. `toJSON()` is honoured (a `Date` becomes a `string`);
 * properties holding `undefined`, a function or a symbol are left out (optional when they may hold one); in arrays
 * those become `null`; symbol keys are dropped. Not expressible here: `NaN` and `Infinity` become `null`.
 */
export type Jsonified<T> =
  IsAny<T> extends true
    ? T
    : T extends { toJSON(...args: never[]): infer J }
      ? Jsonified<J>
      : T extends string | number | boolean | null
        ? T
        : T extends DroppedByJson
          ? undefined
          : T extends bigint | ReadonlyMap<unknown, unknown> | ReadonlySet<unknown>
            ? never
            : T extends readonly unknown[]
              ? { [K in keyof T]: JsonifiedElement<T[K]> }
              : T extends object
                ? JsonifiedObject<T>
                : T;

type JsonifiedElement<E> = IsAny<E> extends true ? E : E extends DroppedByJson ? null : Jsonified<E>;

/** The keys JSON keeps: string keys whose value is not always dropped. */
type KeptKey<T, K extends keyof T> = K extends symbol
  ? never
  : IsAny<T[K]> extends true
    ? K
    : [T[K]] extends [DroppedByJson]
      ? never
      : K;

type JsonifiedObject<T> = Flatten<
  {
    [K in keyof T as KeptKey<T, K> extends never ? never : undefined extends T[K] ? never : K]: Jsonified<
      T[K]
    >;
  } & {
    [K in keyof T as KeptKey<T, K> extends never ? never : undefined extends T[K] ? K : never]?: Jsonified<
      Exclude<T[K], DroppedByJson>
    >;
  }
>;

/**
 * `T` where JSON can store it and give back its contents, or, at each place it cannot, a type whose one property
 * says why: `idempotent()` requires its function's result to be assignable to it (without a `serialize` option),
 * so that a result the default serialiser would refuse at run time (after the function ran) fails to compile.
 * Refused: `undefined` as the whole result (return `null` for "no result"), a BigInt, a symbol, a `Map` or a `Set`
 * anywhere, a function as the whole result. Function-valued properties pass, since the type of a class instance
 * cannot tell its methods (which JSON never sees) from its own properties (which the serialiser refuses at run time).
 */
export type JsonStorable<T> =
  IsAny<T> extends true
    ? T
    : T extends void
      ? { readonly 'oncely: undefined has no JSON form; return null for "no result"': true }
      : JsonStorableValue<T>;

type JsonStorableValue<T> =
  IsAny<T> extends true
    ? T
    : T extends bigint
      ? {
          readonly 'oncely: a BigInt has no JSON form; convert it to a string, or pass a serialize option': true;
        }
      : T extends symbol
        ? { readonly 'oncely: a symbol has no JSON form; pass a serialize option': true }
        : T extends ReadonlyMap<unknown, unknown>
          ? {
              readonly 'oncely: a Map has no JSON form; use an object or an array, or pass a serialize option': true;
            }
          : T extends ReadonlySet<unknown>
            ? { readonly 'oncely: a Set has no JSON form; use an array, or pass a serialize option': true }
            : T extends { toJSON(...args: never[]): unknown }
              ? T
              : T extends (...args: never[]) => unknown
                ? { readonly 'oncely: a function has no JSON form; pass a serialize option': true }
                : T extends object
                  ? { [K in keyof T]: JsonStorableProperty<T[K]> }
                  : T;

type JsonStorableProperty<T> = T extends (...args: never[]) => unknown ? T : JsonStorableValue<T>;

// Types for what idempotent()'s default JSON serialiser can store and what it gives back, so that the compiler
// sees what a replay really returns (a Date comes back as a string) and refuses results JSON cannot carry.

/** What JSON leaves out of an object (and turns into `null` in an array). */
type DroppedByJson = undefined | symbol | ((...args: never[]) => unknown);

type IsAny<T> = 0 extends 1 & T ? true : false;

/**
 * A value JSON carries as it is: `Jsonified` gives it back as written and `JsonStorable` accepts it without
 * looking inside, so that a recursive JSON type (`type Json = string | … | Json[] | { [k: string]: Json }`)
 * compiles as a result type.
 */
export type JsonValue =
  | string
  | number
  | boolean
  | null
  | readonly JsonValue[]
  | { readonly [key: string]: JsonValue | undefined };

/** Typed arrays: JSON writes them as objects keyed by index (`{"0":1,"1":2}`). */
type NumberTypedArray =
  | Int8Array
  | Uint8Array
  | Uint8ClampedArray
  | Int16Array
  | Uint16Array
  | Int32Array
  | Uint32Array
  | Float32Array
  | Float64Array;

/** Flattens an intersection of object types into one, so that editors show it as one object. */
type Flatten<T> = { [K in keyof T]: T[K] } & {};

/**
 * The type of `JSON.parse(JSON.stringify(value))` for a `value` of type `T`: what `idempotent()` returns with its
 * default serialiser, first call and replays alike. `toJSON()` is honoured (a `Date` becomes a `string`);
 * properties holding `undefined`, a function or a symbol are left out (optional when they may hold one); in arrays
 * those become `null`; symbol keys are dropped; arrays come back mutable; a typed array becomes an object keyed by
 * index; an `Error` or a `RegExp` keeps only its own enumerable properties (none, unless a subclass adds some).
 * A type that is already a `JsonValue` comes back as written (readonly arrays and `| undefined` properties
 * included), which is what lets recursive JSON types through. Not expressible here: `NaN` and `Infinity` become
 * `null`, and a getter declared in a class is typed as kept although JSON leaves it out (it lives on the
 * prototype, and types cannot tell it from an own property).
 */
export type Jsonified<T> =
  IsAny<T> extends true
    ? T
    : [T] extends [JsonValue]
      ? T
      : T extends {
            /** The value's own JSON form, which `JSON.stringify` stores in its place. */
            toJSON(...args: never[]): infer J;
          }
        ? Jsonified<J>
        : T extends string | number | boolean | null
          ? T
          : T extends DroppedByJson
            ? undefined
            : T extends
                  | bigint
                  | ReadonlyMap<unknown, unknown>
                  | ReadonlySet<unknown>
                  | BigInt64Array
                  | BigUint64Array
              ? never
              : T extends readonly unknown[]
                ? { -readonly [K in keyof T]: JsonifiedElement<T[K]> }
                : T extends NumberTypedArray
                  ? { [index: string]: number }
                  : T extends Error
                    ? JsonifiedObject<Omit<T, keyof Error>>
                    : T extends RegExp
                      ? JsonifiedObject<Omit<T, keyof RegExp>>
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

/** Whether JSON may leave the property out: its type includes something JSON drops (`any` stays required). */
type MayBeDropped<V> = IsAny<V> extends true ? false : undefined extends V ? true : false;

type JsonifiedObject<T> = Flatten<
  {
    [K in keyof T as KeptKey<T, K> extends never
      ? never
      : MayBeDropped<T[K]> extends true
        ? never
        : K]: Jsonified<T[K]>;
  } & {
    [K in keyof T as KeptKey<T, K> extends never
      ? never
      : MayBeDropped<T[K]> extends true
        ? K
        : never]?: Jsonified<Exclude<T[K], DroppedByJson>>;
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
      ? {
          /** A compile error: the result may be `undefined`, which JSON cannot store. */
          readonly 'oncely: undefined has no JSON form; return null for "no result"': true;
        }
      : JsonStorableValue<T>;

type JsonStorableValue<T> =
  IsAny<T> extends true
    ? T
    : [T] extends [JsonValue]
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

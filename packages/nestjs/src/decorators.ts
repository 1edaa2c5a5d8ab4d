import { createParamDecorator, type ExecutionContext, SetMetadata } from '@nestjs/common';
import { InvalidValueError } from '@oncely/core';
import type { IdempotentOptions } from './options';

/** Metadata key of `@Idempotent()` on a controller class or a handler method. */
export const IDEMPOTENT_METADATA = 'oncely:idempotent';

/** What `@Idempotent()` records: options over the module's (`{}` for the module's own), or `false` to opt out. */
export type IdempotentSetting = IdempotentOptions | false;

/**
 * Covers a controller (every handler whose method is covered) or one handler. Options override the module's for
 * what it marks; a handler's mark wins over its controller's. `@Idempotent(false)` opts out, also of
 * `global: true`.
 */
export function Idempotent(options: IdempotentOptions | false = {}): ClassDecorator & MethodDecorator {
  if (options !== false && (options === null || typeof options !== 'object')) {
    throw new InvalidValueError(
      `@oncely/nestjs: @Idempotent() takes options, or false to opt out; got ${JSON.stringify(options)}. Use @Idempotent() to cover with the module's options.`,
    );
  }
  return SetMetadata<string, IdempotentSetting>(IDEMPOTENT_METADATA, options);
}

/**
 * The Idempotency-Key the request runs under (unquoted), or `undefined` when oncely does not cover the request
 * (no key, a method not covered, a route not marked): `@IdempotencyKey() key: string | undefined`.
 */
export const IdempotencyKey = createParamDecorator(
  (_data: unknown, context: ExecutionContext): string | undefined => {
    const request = context.switchToHttp().getRequest<{ idempotencyKey?: string | undefined }>();
    return request.idempotencyKey ?? undefined;
  },
);

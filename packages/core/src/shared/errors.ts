/** Thrown at construction when an option is wrong; the message names the option and how to fix it. */
export class IdempotencyOptionsError extends TypeError {
  override readonly name = 'IdempotencyOptionsError';
  constructor(
    readonly option: string,
    message: string,
  ) {
    super(`oncely: option "${option}" ${message}`);
  }
}

import { pgSchema, serial, text } from 'drizzle-orm/pg-core';

/** The suite's orders table as Drizzle declares it, in the target's schema. */
export function drizzleOrders(schema: string) {
  return pgSchema(schema).table('orders', { id: serial('id').primaryKey(), key: text('key').notNull() });
}

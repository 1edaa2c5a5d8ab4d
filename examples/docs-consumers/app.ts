// What the examples take from "your app": a shared store, the order type and the side effect to run once.
import { type IdempotencyStore, MemoryStore } from '@oncely/core';

export interface Order {
  id: string;
  amount: number;
}

/** In an app: a RedisStore, PostgresStore or DynamoDBStore every consumer shares. */
export const store: IdempotencyStore = new MemoryStore();

export async function chargeCard(order: Order): Promise<void> {
  if (order.amount <= 0) throw new Error(`order ${order.id}: nothing to charge`);
}

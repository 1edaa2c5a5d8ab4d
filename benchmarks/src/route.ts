// The one route every server answers, byte for byte the same: POST /charges with a ~100-byte JSON body, answered
// 201 with ~100 bytes of JSON built from it.

export const PATH = '/charges';

/** The request body (103 bytes). */
export const REQUEST_BODY = JSON.stringify({
  amount: 1999,
  currency: 'usd',
  customer: 'cus_NffrFeUfNV2Hib',
  description: 'Benchmark charge for order 000123',
});

export interface ChargeRequest {
  amount?: unknown;
  currency?: unknown;
}

/** The response body (~100 bytes), the same in every server. */
export function charge(body: ChargeRequest | undefined): Record<string, unknown> {
  return {
    id: 'ch_3MmlLrLkdIwHu7ix0snN0B15',
    object: 'charge',
    amount: body?.amount,
    currency: body?.currency,
    status: 'succeeded',
    livemode: false,
  };
}

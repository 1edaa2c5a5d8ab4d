/**
 * Fastify requests whose handler chain was entered (the interceptor saw them). oncely takes the key in Fastify's
 * preHandler, before Nest's guards and interceptors: an answer sent without entering (a guard's 401 or 429) is not
 * the handler's, and the module's onSend hook releases the key for it (see `IdempotencyRoutes`).
 */
export const enteredRequests = new WeakSet<object>();

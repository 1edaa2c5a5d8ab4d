/** How the store sees a client that may not have connected yet. */
export interface ConnectingClient {
  /** Connected and taking commands. */
  isReady(): boolean;
  /** Still on its way to a connection (or, with ioredis's `lazyConnect`, not started yet): worth waiting for. */
  isConnecting(): boolean;
  /** Starts a client that connects on demand; a no-op for one that is already on its way. */
  start(): void;
  /** Calls `listener` once, the next time the client is ready; returns what stops it. */
  onceReady(listener: () => void): () => void;
}

/**
 * With the offline queue off (as the docs recommend), a client fails every command sent before its first connection:
 * a request arriving the moment the app starts would get a 503. Until the client has been ready once, commands wait
 * for it, at most `boundMs` (the client's command timeout), then are sent whatever the state, to fail as configured.
 * Later disconnections fail fast as before. Returns a function that runs a command through that gate; once the
 * client has been ready, it calls the command at once, in the caller's turn (commands of one turn stay together).
 */
export function untilFirstConnection(
  client: ConnectingClient,
  boundMs: number,
): <T>(send: () => Promise<T>) => Promise<T> {
  let connected = client.isReady();
  if (!connected)
    client.onceReady(() => {
      connected = true;
    });
  let pending: Promise<void> | undefined;
  const firstConnection = (): Promise<void> => {
    pending ??= new Promise<void>((resolve) => {
      const timer = setTimeout(done, boundMs);
      timer.unref();
      const stop = client.onceReady(done);
      function done() {
        clearTimeout(timer);
        stop();
        pending = undefined;
        resolve();
      }
      client.start();
    });
    return pending;
  };
  return (send) => {
    if (connected || client.isReady() || !client.isConnecting()) return send();
    return firstConnection().then(send);
  };
}

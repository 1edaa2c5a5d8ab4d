import { connect, createServer, type Socket } from 'node:net';

/**
 * A TCP proxy in front of a server that can lose answers: while `drops` is above 0, a connection whose server
 * starts to answer is closed on both sides instead (the request reached the server and its handler ran; the
 * client never hears back), and `drops` goes down by one.
 */
export interface DroppingProxy {
  url: string;
  drops: number;
  /** Answers lost so far. */
  dropped: number;
  close(): Promise<void>;
}

export async function droppingProxy(target: string): Promise<DroppingProxy> {
  const { hostname, port } = new URL(target);
  const sockets = new Set<Socket>();
  const proxy: DroppingProxy = { url: '', drops: 0, dropped: 0, close: async () => {} };
  const server = createServer((client) => {
    const upstream = connect(Number(port), hostname);
    for (const socket of [client, upstream]) {
      sockets.add(socket);
      socket.on('close', () => sockets.delete(socket));
      socket.on('error', () => {
        client.destroy();
        upstream.destroy();
      });
    }
    client.on('data', (chunk) => upstream.write(chunk));
    client.on('end', () => upstream.end());
    let decided = false;
    let drop = false;
    upstream.on('data', (chunk) => {
      if (!decided) {
        decided = true;
        drop = proxy.drops > 0;
        if (drop) {
          proxy.drops--;
          proxy.dropped++;
        }
      }
      if (drop) {
        client.destroy();
        upstream.destroy();
      } else {
        client.write(chunk);
      }
    });
    upstream.on('end', () => client.end());
  });
  server.listen(0, '127.0.0.1');
  await new Promise((resolve) => server.once('listening', resolve));
  const address = server.address();
  proxy.url = `http://127.0.0.1:${typeof address === 'object' && address !== null ? address.port : 0}`;
  proxy.close = () =>
    new Promise<void>((resolve) => {
      for (const socket of sockets) socket.destroy();
      server.close(() => resolve());
    });
  return proxy;
}

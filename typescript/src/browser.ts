/**
 * Callers of agent providers in browsers: the run-loop protocol's client
 * over the global `WebSocket`. It imports nothing outside the package, so
 * a page loads it as an ES module as it is (`<script type="module">`).
 *
 * A browser sends its page's `Origin` with the upgrade: the server serves
 * it only when that origin is on its allow list (`runloop serve
 * --allow-origin`), and never with an empty credential. A browser tells a
 * page nothing of why a WebSocket failed, so a refused origin and a server
 * that is down look alike: `ConnectError` says so.
 */

import { connectWith, type Client, type ConnectOptions } from "./client.js";
import { ConnectError, ConnectTimeout } from "./errors.js";
import type { Dial, Transport } from "./transport.js";

export * from "./api.js";

/** The part of the DOM's `WebSocket` the client uses. */
interface BrowserSocket {
  binaryType: string;
  readyState: number;
  onopen: ((event: unknown) => void) | null;
  onmessage: ((event: { data: unknown }) => void) | null;
  onclose: ((event: { code: number; reason: string; wasClean: boolean }) => void) | null;
  onerror: ((event: unknown) => void) | null;
  send(data: Uint8Array): void;
  close(code?: number): void;
}

type SocketConstructor = new (url: string) => BrowserSocket;

const dial: Dial = (url, timeoutMs, events) =>
  new Promise((resolve, reject) => {
    const Socket = (globalThis as { WebSocket?: SocketConstructor }).WebSocket;
    if (Socket === undefined) {
      reject(new ConnectError("this environment has no global WebSocket"));
      return;
    }
    let ws: BrowserSocket;
    try {
      ws = new Socket(url);
    } catch (error) {
      reject(new ConnectError(`cannot connect to ${url}: ${(error as Error).message}`, { cause: error }));
      return;
    }
    ws.binaryType = "arraybuffer";
    let open = false;
    let failed: Error | null = null;
    const timer =
      timeoutMs === undefined
        ? undefined
        : setTimeout(() => {
            failed = new ConnectTimeout(`connecting to ${url} took longer than ${timeoutMs} ms`);
            ws.close();
          }, timeoutMs);
    ws.onopen = () => {
      open = true;
      clearTimeout(timer);
      const transport: Transport = {
        send: (bytes) => ws.send(bytes),
        close: () => ws.close(1000),
        terminate: () => ws.close(1000),
        pause: () => {},
        resume: () => {},
        canPause: false,
      };
      resolve(transport);
    };
    ws.onmessage = (event) => {
      if (event.data instanceof ArrayBuffer) events.message(new Uint8Array(event.data));
    };
    ws.onclose = (event) => {
      clearTimeout(timer);
      if (!open) {
        reject(
          failed ??
            new ConnectError(
              `cannot connect to ${url}: the server is not there, or refused the upgrade ` +
                "(a browser does not say which: is this page's origin on the server's --allow-origin list?)",
            ),
        );
        return;
      }
      events.closed(event.code === 1005 || event.code === 1006 ? undefined : event.code, event.reason);
    };
  });

/**
 * Connects to the provider server at `url` (`ws://` or `wss://`) and
 * authorizes with `options.token`. Rejects with `ConnectError` when the
 * server cannot be reached or refuses the upgrade (a browser does not say
 * which), `ConnectTimeout` past `connectTimeoutMs`.
 */
export function connect(url: string, options: ConnectOptions = {}): Promise<Client> {
  return connectWith(dial, url, options);
}

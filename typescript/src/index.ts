/**
 * Callers of agent providers in Node (≥ 20): the run-loop protocol's client
 * over the `ws` package.
 *
 * ```ts
 * import { connect, Chunk } from "runloop";
 *
 * const client = await connect("ws://127.0.0.1:7878", { token: process.env.RUNLOOP_TOKEN });
 * const run = await client.start("demo");
 * const stream = run.loop("Count the words in this sentence");
 * for await (const event of stream) {
 *   if (event instanceof Chunk) console.log(event.kind, event.json);
 * }
 * console.log(String(await stream.outcome));
 * await run.stop();
 * await client.close();
 * ```
 *
 * Browsers get `browser.js` instead (the `browser` condition of the
 * package's exports): the same API over the global `WebSocket`.
 */

import WebSocket from "ws";

import { connectWith, MAX_MESSAGE, type Client, type ConnectOptions } from "./client.js";
import { ConnectError, ConnectTimeout } from "./errors.js";
import { useUtf8 } from "./json.js";
import type { Dial, Transport } from "./transport.js";

export * from "./api.js";

// Buffer's decoder is faster than TextDecoder's; it writes U+FFFD for
// bytes that are not UTF-8, and a text with one is checked again, strictly.
useUtf8((bytes, start) => (bytes as Buffer).toString("utf8", start));

/** Opens a WebSocket with `ws`: no compression, the other clients' message limit. */
const dial: Dial = (url, timeoutMs, events) =>
  new Promise((resolve, reject) => {
    let ws: WebSocket;
    try {
      ws = new WebSocket(url, { perMessageDeflate: false, maxPayload: MAX_MESSAGE });
    } catch (error) {
      reject(new ConnectError(`cannot connect to ${url}: ${(error as Error).message}`, { cause: error }));
      return;
    }
    ws.binaryType = "nodebuffer";
    let open = false;
    let failed: Error | null = null;
    const timer =
      timeoutMs === undefined
        ? undefined
        : setTimeout(() => {
            failed = new ConnectTimeout(`connecting to ${url} took longer than ${timeoutMs} ms`);
            ws.terminate();
          }, timeoutMs);
    ws.on("unexpected-response", (_request, response) => {
      const status = response.statusCode ?? 0;
      failed = new ConnectError(
        `the server refused the WebSocket upgrade at ${url}: HTTP ${status} ${response.statusMessage ?? ""}`.trimEnd(),
      );
      ws.terminate();
    });
    ws.on("error", (error) => {
      if (!open && failed === null) {
        failed = new ConnectError(`cannot connect to ${url}: ${error.message}`, { cause: error });
      }
    });
    ws.on("open", () => {
      open = true;
      clearTimeout(timer);
      const transport: Transport = {
        send: (bytes) => ws.send(bytes, { binary: true }),
        close: () => ws.close(1000),
        terminate: () => ws.terminate(),
        pause: () => ws.pause(),
        resume: () => ws.resume(),
        canPause: true,
      };
      resolve(transport);
    });
    ws.on("message", (data, isBinary) => {
      if (isBinary) events.message(data as Buffer);
    });
    ws.on("close", (code, reason) => {
      clearTimeout(timer);
      if (!open) {
        reject(failed ?? new ConnectError(`cannot connect to ${url}: the connection closed (code ${code})`));
        return;
      }
      // 1005: no close frame came with a code; 1006: no close frame at all.
      events.closed(code === 1005 || code === 1006 ? undefined : code, reason.toString());
    });
  });

/**
 * Connects to the provider server at `url` (`ws://` or `wss://`) and
 * authorizes with `options.token`. Rejects with `ConnectError` when the
 * server cannot be reached or refuses the upgrade, `ConnectTimeout` past
 * `connectTimeoutMs`.
 */
export function connect(url: string, options: ConnectOptions = {}): Promise<Client> {
  return connectWith(dial, url, options);
}

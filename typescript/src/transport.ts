/**
 * What the client needs of a WebSocket, so that one client serves Node (the
 * `ws` package, `node.ts`) and browsers (the global `WebSocket`, `web.ts`).
 *
 * Only binary messages reach the client; text messages carry nothing
 * (protocol §1) and each transport drops them.
 */

/** What a transport tells the client. */
export interface TransportEvents {
  /** One binary message from the server. */
  message(bytes: Uint8Array): void;
  /** The connection is over: the server's close code and reason, when it sent a close frame. */
  closed(code: number | undefined, reason: string): void;
}

/** An open WebSocket. */
export interface Transport {
  /** Sends one binary message. */
  send(bytes: Uint8Array): void;
  /** Starts the close handshake. */
  close(): void;
  /** Lets the socket go at once. */
  terminate(): void;
  /**
   * Stops reading from the socket until `resume`: Node's backpressure, so a
   * consumer that stops iterating stops the server's sending. Browsers have
   * no way to stop a `WebSocket`'s reading (`canPause` is false there).
   */
  pause(): void;
  /** Reads again. */
  resume(): void;
  /** Whether `pause` stops the reading. */
  readonly canPause: boolean;
}

/** Opens a WebSocket to `url`; rejects with a `ConnectError` when it cannot. */
export type Dial = (url: string, timeoutMs: number | undefined, events: TransportEvents) => Promise<Transport>;

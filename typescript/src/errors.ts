/**
 * The errors of the package, one hierarchy under `RunloopError`.
 *
 * A loop's own ending is never an error: it is the stream's `outcome`.
 * These are for what keeps a caller from getting a loop at all. (Aborting a
 * loop rejects with the signal's reason, an `AbortError` `DOMException`
 * unless `abort()` was given another, as `fetch` does.)
 */

import type { Json } from "./chunks.js";

/** Base of every error the package throws. */
export class RunloopError extends Error {
  constructor(message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.name = new.target.name;
  }
}

/**
 * The server could not be reached, refused the upgrade, or turned the
 * connection away: a refused credential shows at the first `start`, since
 * the protocol answers one with a closed connection and no frame.
 */
export class ConnectError extends RunloopError {}

/** Connecting took longer than `connectTimeoutMs`. */
export class ConnectTimeout extends ConnectError {}

/** The server refused the run; `error` is its JSON error value. */
export class RunRefused extends RunloopError {
  /** The server's error value, parsed. */
  readonly error: Json;

  constructor(message: string, error: Json) {
    super(message);
    this.error = error;
  }
}

/** The server answered the run with a bare finish: received, not served. */
export class RunNotServed extends RunloopError {}

/** A loop was asked of a run that has ended (stopped, aborted, or its container ended). */
export class RunEnded extends RunloopError {}

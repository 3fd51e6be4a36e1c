/**
 * The caller's sequence machine (protocol §7): a run-loop channel's
 * responses in, chunks and exactly one `Outcome` out.
 *
 * ```text
 *                 chunk (tag 0)
 *                  ┌─────┐
 *                  ▼     │
 *   ──▶ open {chunks: n, last chunk fatal?} ──finish──▶ n = 0: not_served
 *          │       │                                     n > 0: finished {fatal}
 *          │       └── undecodable payload ──▶ broken
 *          │ error (tag 1)
 *          ▼
 *        erred {error, chunks: n} ──finish──▶ n = 0: no_loop (error)
 *          │                                  n > 0: unfinished (error)
 *          └── any response ──▶ broken
 *
 *   in any open state: the connection ends, the run ends ──▶ broken
 * ```
 *
 * It is the Rust reader's machine (`runloop_proto::run_loop::Reader`), state
 * for state and reason for reason, so that the three clients read one
 * sequence the same way; the shared corpus of captured cases holds them to
 * it. Nothing that lacks the finish, and nothing that carried an error, can
 * come out as `finished`.
 */

import { checkChunk, MEMBERS, type ChunkData, type Json } from "./chunks.js";
import { Chunk, LoopError, Outcome } from "./events.js";
import { checkUtf8, looseUtf8, parseJson, quote, repeatsMember } from "./json.js";
import { scanText } from "./scan.js";

/** Why a channel's sequence is broken: the Rust reader's words. */
export const BROKEN = {
  responseAfterError: "a response came after the error",
  connectionEnded: "the connection ended before the channel's finish",
  runEnded: "the run ended before the channel's finish",
} as const;

const CHUNK = 0;
const ERROR = 1;

/** The response payload from `start` of `message`, decoded: a chunk, an error, or why it does not decode. */
export function decodeResponse(message: Uint8Array, start = 0): Chunk | LoopError | string {
  if (message.length <= start) return "agentic loop frame is empty";
  const tag = message[start]!;
  if (tag !== CHUNK && tag !== ERROR) {
    return `unknown agentic loop frame tag ${tag}; the payload was ${quote(message.subarray(start))}`;
  }
  const half = tag === CHUNK ? "chunk" : "error";
  let text: string;
  let value: unknown;
  try {
    text = looseUtf8(message, start + 1);
    if (tag === CHUNK) {
      // The fast path refuses a U+FFFD, so what it reads was UTF-8.
      const plain = scanText(text);
      if (plain !== undefined) return new Chunk(text, plain);
    }
    checkUtf8(text, message, start + 1);
    value = parseJson(text);
  } catch (error) {
    const body = message.subarray(start + 1);
    return `agentic loop ${half} did not parse: ${(error as Error).message}; the payload was ${quote(body)}`;
  }
  if (tag === ERROR) return new LoopError(text, value as Json);
  const why = checkChunk(value) ?? strictness(text, value as ChunkData);
  if (why !== null) {
    return `agentic loop chunk did not parse: ${why}; the payload was ${quote(message.subarray(start + 1))}`;
  }
  return new Chunk(text, value as ChunkData);
}

/** A count written as a float: serde reads `1.0` as no unsigned integer. */
const FLOAT_COUNT = /"(?:completion|prompt|total)_tokens"\s*:\s*-?\d+(?:\.|[eE])/;

/**
 * What the schema cannot say and `JSON.parse` does not see, checked on the
 * text: a member written twice, a token count written as a float.
 */
function strictness(text: string, data: ChunkData): string | null {
  if (repeatsMember(text, data as unknown as { [key: string]: unknown }, MEMBERS[data.type])) {
    return "a member is written twice";
  }
  if (data.type === "usage" && FLOAT_COUNT.test(text)) return "a token count is not an unsigned integer";
  return null;
}

const OPEN = 0;
const ERRED = 1;
const ENDED = 2;

/** Reads one run-loop channel's responses, in order. */
export class Reader {
  private state = OPEN;
  private chunks = 0;
  private lastFatal = false;
  private error: LoopError | null = null;

  /** Whether the reader has given its outcome. */
  get ended(): boolean {
    return this.state === ENDED;
  }

  /**
   * One channel response payload (from `start` of `message`): a chunk or
   * the error to hand out, or the outcome when the sequence broke;
   * undefined once the reader has ended.
   */
  response(message: Uint8Array, start = 0): Chunk | LoopError | Outcome | undefined {
    switch (this.state) {
      case ENDED:
        return undefined;
      case ERRED:
        return this.end(new Outcome("broken", null, false, BROKEN.responseAfterError));
      default: {
        const decoded = decodeResponse(message, start);
        if (decoded instanceof Chunk) {
          this.chunks += 1;
          this.lastFatal = decoded.isFatal;
          return decoded;
        }
        if (decoded instanceof LoopError) {
          this.state = ERRED;
          this.error = decoded;
          return decoded;
        }
        return this.end(new Outcome("broken", null, false, `a response did not decode: ${decoded}`));
      }
    }
  }

  /** The channel response finish: the outcome; undefined once the reader has ended. */
  finish(): Outcome | undefined {
    const { state, chunks, error } = this;
    if (state === ENDED) return undefined;
    this.state = ENDED;
    if (state === OPEN) {
      return chunks === 0 ? new Outcome("not_served") : new Outcome("finished", null, this.lastFatal);
    }
    const value = error?.value ?? null;
    return chunks === 0 ? new Outcome("no_loop", value) : new Outcome("unfinished", value);
  }

  /** The channel cannot end normally any more; undefined once the reader has ended. */
  cut(reason: string): Outcome | undefined {
    if (this.state === ENDED) return undefined;
    return this.end(new Outcome("broken", null, false, reason));
  }

  private end(outcome: Outcome): Outcome {
    this.state = ENDED;
    return outcome;
  }
}

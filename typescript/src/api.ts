/**
 * What both entries export: the client, its events and errors, and the
 * chunk vocabulary's types. Only `connect` differs between Node and browsers.
 */

export { Client, Run, Stream, MAX_MESSAGE, type ConnectOptions, type LoopOptions } from "./client.js";
export { Chunk, LoopError, Outcome, type Event, type OutcomeKind } from "./events.js";
export { ConnectError, ConnectTimeout, RunEnded, RunloopError, RunNotServed, RunRefused } from "./errors.js";
export { UNPINNED, type Image, type Size, type StartOptions } from "./request.js";
export { CHUNK_KINDS } from "./chunks.js";
export type * from "./chunks.js";

/**
 * The caller: one framed connection to a provider server, many runs and
 * loops on it at once (the Rust client's shape, in JavaScript's terms).
 *
 * ```text
 * connect ──▶ client.start(name) ──▶ Run (id) ──▶ run.loop(prompt) ──▶ Stream
 *                                                                     │ for await: Chunk… LoopError?
 *                                                                     │ stream.outcome: one Outcome
 * ```
 *
 * The connection keeps the client's half of the connection table (protocol
 * §2, §3, §6): the scope and channel numbers it has open, chosen from
 * cursors that move past each number taken, so a late frame of a channel
 * that ended is never read as a frame of the next. Each server frame is
 * routed where the table says; a frame naming a scope or channel that is
 * not open is disregarded, a channel the server opens gets a bare finish
 * (the client serves none), and an authorization from the server ends the
 * connection.
 *
 * A loop's responses wait in its own queue and go through the `Reader` as
 * the consumer iterates. On Node, a queue that reaches `maxQueuedResponses`
 * or `maxQueuedBytes` pauses the socket until half of each is read (one
 * read of the socket can bring hundreds of small responses at once, so
 * the bound is well above that, or every read would pause): a consumer that stops
 * iterating stops the reading, and with it (TCP's flow control) the
 * server's sending, as the Rust client does. The protocol has no
 * per-channel flow control, so this holds up every loop of the connection:
 * read the loops you open, or open them on separate connections. Browsers
 * cannot stop a `WebSocket`'s reading: there, a loop nobody reads holds what
 * the server sends (each message at most the server's message limit) until
 * it is read or the connection closes.
 *
 * Cancellation is the protocol's: a loop ends only when its run is stopped
 * (protocol §6). Aborting a loop's signal, or leaving its `for await` early,
 * stops its run at once; the run is then ended here (`run.loop` rejects with
 * `RunEnded`), and the connection goes on serving every other run.
 */

import type { Json } from "./chunks.js";
import { ConnectError, RunEnded, RunloopError, RunNotServed, RunRefused } from "./errors.js";
import { Chunk, LoopError, Outcome, type Event } from "./events.js";
import * as frame from "./frame.js";
import { parseJson, quote, utf8 } from "./json.js";
import { BROKEN, Reader } from "./reader.js";
import { runRequest, type StartOptions } from "./request.js";
import { Transcript } from "./transcript.js";
import type { Dial, Transport } from "./transport.js";

/** How `connect` connects. */
export interface ConnectOptions {
  /** The credential (protocol §3); default: empty. */
  token?: string;
  /** Milliseconds for TCP, TLS and the WebSocket upgrade (default 10 000; 0: no limit). */
  connectTimeoutMs?: number;
  /** Responses a loop may hold unread before the connection stops reading (Node; default 1024). */
  maxQueuedResponses?: number;
  /** Bytes a loop may hold unread before the connection stops reading (Node; default 4 MiB). */
  maxQueuedBytes?: number;
}

/** How `run.loop` asks. */
export interface LoopOptions {
  /** Aborting it stops the loop's run; the iteration rejects with the signal's reason. */
  signal?: AbortSignal;
  /** Keep a coalesced copy of the loop for `transcript()` (default true). */
  transcript?: boolean;
}

/** The most a server message may be: the other clients' limit, 16 MiB, and the header. */
export const MAX_MESSAGE = (16 << 20) + frame.HEADER;

const CLOSE_GRACE_MS = 2000;
const encoder = new TextEncoder();

/** What a loop's queue carries: a channel response (the whole message), or an end. */
type Input = Uint8Array | typeof FINISH | typeof RUN_ENDED | typeof CONNECTION_ENDED;
const FINISH = 0;
const RUN_ENDED = 1;
const CONNECTION_ENDED = 2;

/** What the connection keeps for an open scope: a run, or a run starting. */
interface Scope {
  /** Waiting for the run's first answer; null once it came. */
  starting: { resolve(id: string): void; reject(error: Error): void } | null;
  /** The run, once it started. */
  run: Run | null;
  /** Open loop channels, in the order they were opened. */
  loops: Map<number, Stream>;
  /** Open stop channels: freed with the scope, answered by nothing. */
  stops: Set<number>;
  nextChannel: number;
}

/** The first number from `start` on that `taken` does not claim, wrapping at 2³². */
function freeNumber(start: number, taken: (n: number) => boolean): number {
  let n = start >>> 0;
  while (taken(n)) n = (n + 1) >>> 0;
  return n;
}

/** A connection to a provider server; many runs at once on it. */
export class Client {
  /** @internal */ readonly transport: Transport;
  private readonly scopes = new Map<number, Scope>();
  private nextScope = 0;
  private readonly credential: boolean;
  private answered = false;
  private closedWith: { code: number; reason: string } | null = null;
  private over = false;
  private readonly whenClosed: Promise<void>;
  private markClosed!: () => void;
  /** Loops whose queue is full: the socket is paused while any is. */
  private readonly full = new Set<Stream>();
  /** @internal */ readonly maxQueued: number;
  /** @internal */ readonly maxQueuedBytes: number;

  /** @internal */
  constructor(transport: Transport, credential: boolean, maxQueued: number, maxQueuedBytes: number) {
    this.transport = transport;
    this.credential = credential;
    this.maxQueued = maxQueued;
    this.maxQueuedBytes = maxQueuedBytes;
    this.whenClosed = new Promise((resolve) => (this.markClosed = resolve));
  }

  /** Whether the connection is over. */
  get closed(): boolean {
    return this.over;
  }

  /**
   * Opens a run of the catalog image `name` (default `"demo"`), or of
   * `options.image`, and resolves with it once the server has sent its id.
   * Rejects with `RunRefused` (the server's error value in `.error`),
   * `RunNotServed`, or `ConnectError` when the connection ended first (a
   * refused credential ends it before any answer).
   */
  async start(name?: string, options: StartOptions = {}): Promise<Run> {
    const request = runRequest(name, options);
    if (this.over) throw this.endedError();
    const scope = freeNumber(this.nextScope, (n) => this.scopes.has(n));
    this.nextScope = (scope + 1) >>> 0;
    const answer = new Promise<string>((resolve, reject) => {
      this.scopes.set(scope, {
        starting: { resolve, reject },
        run: null,
        loops: new Map(),
        stops: new Set(),
        nextChannel: 0,
      });
    });
    const payload = encoder.encode("\x00" + request);
    this.send(frame.encode(frame.REQUEST, scope, 0, payload));
    const id = await answer;
    const open = this.scopes.get(scope);
    const run = new Run(this, scope, id);
    if (open) open.run = run;
    else run.markEnded();
    return run;
  }

  /**
   * Closes the connection: every run on it ends (on the server too), every
   * open loop ends `broken`. Resolves when the server has answered the close
   * handshake, or after a grace of 2 s.
   */
  async close(): Promise<void> {
    if (!this.over) {
      this.transport.close();
      const grace = setTimeout(() => this.transport.terminate(), CLOSE_GRACE_MS);
      try {
        await this.whenClosed;
      } finally {
        clearTimeout(grace);
      }
    }
  }

  /** Resolves when the connection is over. */
  waitClosed(): Promise<void> {
    return this.whenClosed;
  }

  /** @internal */
  send(bytes: Uint8Array): void {
    if (!this.over) this.transport.send(bytes);
  }

  /** @internal Opens a run-loop channel on `scope`; null when the scope is not open. */
  openLoop(scope: number, stream: Stream, prompt: string): number | null {
    const open = this.scopes.get(scope);
    if (!open || this.over) return null;
    const channel = this.freeChannel(open);
    open.loops.set(channel, stream);
    const payload = encoder.encode("\x05" + JSON.stringify({ prompt }));
    this.send(frame.encode(frame.CHANNEL_REQUEST, scope, channel, payload));
    return channel;
  }

  /** @internal Opens a stop channel on `scope`, if it is still open; its finish answers it. */
  stop(scope: number): void {
    const open = this.scopes.get(scope);
    if (!open || this.over) return;
    const channel = this.freeChannel(open);
    open.stops.add(channel);
    this.send(frame.encode(frame.CHANNEL_REQUEST, scope, channel, new Uint8Array([0])));
  }

  private freeChannel(open: Scope): number {
    const channel = freeNumber(open.nextChannel, (n) => open.loops.has(n) || open.stops.has(n));
    open.nextChannel = (channel + 1) >>> 0;
    return channel;
  }

  /** @internal A loop's queue filled up, or was read below its bound. */
  queueFull(stream: Stream, full: boolean): void {
    if (!this.transport.canPause) return;
    const before = this.full.size;
    if (full) this.full.add(stream);
    else this.full.delete(stream);
    if (before === 0 && this.full.size > 0) this.transport.pause();
    else if (before > 0 && this.full.size === 0) this.transport.resume();
  }

  /** @internal One message from the server. */
  received(message: Uint8Array): void {
    if (this.over) return;
    // Malformed (short, or a type a server does not send): disregarded (protocol §2).
    if (!frame.isServerFrame(message)) return;
    this.answered = true;
    const type = message[0]!;
    const scope = frame.u32(message, 1);
    const channel = frame.u32(message, 5);
    if (type === frame.AUTHORIZATION) {
      // The client dialled: an authorization from the server is a violation.
      this.end();
      this.transport.close();
      return;
    }
    const open = this.scopes.get(scope);
    if (!open) return; // a scope that is not open: disregarded
    switch (type) {
      case frame.RESPONSE:
        this.mainResponse(scope, open, message.subarray(frame.HEADER));
        return;
      case frame.RESPONSE_FINISH: {
        this.scopes.delete(scope);
        if (open.starting) open.starting.reject(new RunNotServed("the server did not serve the run"));
        open.starting = null;
        open.run?.markEnded();
        for (const stream of open.loops.values()) stream.push(RUN_ENDED);
        return;
      }
      case frame.CHANNEL_REQUEST:
        // The client serves no channels: a bare channel finish.
        this.send(frame.encode(frame.CHANNEL_RESPONSE_FINISH, scope, channel));
        return;
      case frame.CHANNEL_RESPONSE:
        // The whole message is queued; the reader reads its payload in place.
        open.loops.get(channel)?.push(message);
        return;
      case frame.CHANNEL_RESPONSE_FINISH: {
        const stream = open.loops.get(channel);
        if (stream) {
          open.loops.delete(channel);
          stream.push(FINISH);
        }
        return;
      }
    }
  }

  /** A response on a run's main stream: the first says how the run started (protocol §5). */
  private mainResponse(scope: number, open: Scope, payload: Uint8Array): void {
    const starting = open.starting;
    if (!starting) return; // a second main-stream response: disregarded
    open.starting = null;
    const answer = runAnswer(payload);
    if (typeof answer === "string") {
      starting.resolve(answer);
    } else {
      if (!(answer instanceof RunRefused)) this.stop(scope);
      starting.reject(answer);
    }
  }

  /** @internal The socket closed. */
  transportClosed(code: number | undefined, reason: string): void {
    if (code !== undefined && reason !== "" && !this.over) this.closedWith = { code, reason };
    this.end();
    this.full.clear();
    this.markClosed();
  }

  /** The connection is over: every run and loop learns it. */
  private end(): void {
    if (this.over) return;
    this.over = true;
    const error = this.endedError();
    for (const open of this.scopes.values()) {
      open.starting?.reject(error);
      open.run?.markEnded();
      for (const stream of open.loops.values()) stream.push(CONNECTION_ENDED);
    }
    this.scopes.clear();
  }

  /** Why a run cannot start (or did not) on a connection that is over. */
  private endedError(): ConnectError {
    if (this.closedWith) {
      const { code, reason } = this.closedWith;
      return new ConnectError(`the server closed the connection: ${reason} (close code ${code})`);
    }
    if (!this.answered && !this.credential) {
      return new ConnectError(
        "the server closed the connection without answering: it wants a credential, and none was sent",
      );
    }
    if (!this.answered) {
      return new ConnectError("the server closed the connection without answering (is the credential right?)");
    }
    return new ConnectError("the connection ended before the run started");
  }
}

/** A run's first answer: its id, or the error to reject `start` with. */
function runAnswer(payload: Uint8Array): string | RunloopError {
  const broken = (why: string) => new RunloopError(`the server's answer did not decode: ${why}`);
  if (payload.length === 0) return broken("run response is empty");
  const tag = payload[0]!;
  const body = payload.subarray(1);
  let value: unknown;
  try {
    value = parseJson(utf8(body));
  } catch (error) {
    const half = tag === 0 ? "run id" : "run error";
    return tag > 1
      ? broken(`unknown run response tag ${tag}`)
      : broken(`${half} did not parse: ${(error as Error).message}; the payload was ${quote(body)}`);
  }
  if (tag === 1) return new RunRefused(`the run was refused: ${JSON.stringify(value)}`, value as Json);
  if (tag !== 0) return broken(`unknown run response tag ${tag}`);
  const id = typeof value === "object" && value !== null && !Array.isArray(value) ? (value as { id?: unknown }).id : undefined;
  return typeof id === "string" ? id : broken('run id did not parse: expected {"id": "<string>"}');
}

/** A run: a container the server started for this connection. */
export class Run {
  /** The run's id, as the server minted it. */
  readonly id: string;
  private readonly client: Client;
  private readonly scope: number;
  private isEnded = false;
  private abandoned = false;
  private readonly whenEnded: Promise<void>;
  private resolveEnded!: () => void;

  /** @internal */
  constructor(client: Client, scope: number, id: string) {
    this.client = client;
    this.scope = scope;
    this.id = id;
    this.whenEnded = new Promise((resolve) => (this.resolveEnded = resolve));
  }

  /** Whether the run has ended, or has been stopped by this side. */
  get ended(): boolean {
    return this.isEnded || this.abandoned;
  }

  /**
   * Asks for one loop with `prompt`. A proxy serves one loop at a time: run
   * loops of one run one after the other, and open more runs for loops at
   * once. Iterating a loop of a run that has ended rejects with `RunEnded`.
   */
  loop(prompt: string, options: LoopOptions = {}): Stream {
    const stream = new Stream(this.client, this, options);
    if (this.ended) {
      stream.failBefore(new RunEnded(`run ${this.id} has ended: start a new run for another loop`));
      return stream;
    }
    if (this.client.openLoop(this.scope, stream, prompt) === null) {
      stream.failBefore(new RunEnded(`run ${this.id} has ended: start a new run for another loop`));
    }
    return stream;
  }

  /** Stops the run and resolves when the server says it has ended (or the connection has). */
  async stop(): Promise<void> {
    this.abandoned = true;
    if (!this.isEnded) this.client.stop(this.scope);
    await this.whenEnded;
  }

  /** Resolves when the run has ended on the server. */
  waitEnded(): Promise<void> {
    return this.whenEnded;
  }

  /** @internal Sends the stop without waiting: the way out of an aborted loop. */
  abandon(): void {
    if (this.abandoned) return;
    this.abandoned = true;
    if (!this.isEnded) this.client.stop(this.scope);
  }

  /** @internal The run's scope finished, or the connection ended. */
  markEnded(): void {
    this.isEnded = true;
    this.resolveEnded();
  }
}

/**
 * One loop: an async iterable of `Chunk` and `LoopError`, in order, and its
 * `outcome`, which resolves once the stream has been read to its end (or
 * the loop was aborted). Never rejects: a loop's ending is an outcome.
 */
export class Stream implements AsyncIterable<Event> {
  /** How the loop ended; resolves when the stream has been read to its end. */
  readonly outcome: Promise<Outcome>;
  private settle!: (outcome: Outcome) => void;
  private settled: Outcome | null = null;
  private readonly client: Client;
  private readonly run: Run;
  private readonly reader = new Reader();
  private readonly kept: Transcript | null;
  private queue: Input[] = [];
  private head = 0;
  /** Bytes of the responses in the queue. */
  private queuedBytes = 0;
  private isFull = false;
  /** The iteration's consumer, waiting for the next input. */
  private waiting: { resolve(result: IteratorResult<Event>): void; reject(error: unknown): void } | null = null;
  /** A consumer of batches, waiting for the next. */
  private waitingBatch: { resolve(result: IteratorResult<Event[]>): void; reject(error: unknown): void } | null =
    null;
  /** Whether a batch is to be handed out once the current socket read is through. */
  private batchDue = false;
  /** What the next `next()` rejects with, once. */
  private failure: unknown = null;
  private readonly signal: AbortSignal | undefined;
  private readonly onAbort: (() => void) | null = null;

  /** @internal */
  constructor(client: Client, run: Run, options: LoopOptions) {
    this.client = client;
    this.run = run;
    this.kept = options.transcript === false ? null : new Transcript();
    this.outcome = new Promise((resolve) => (this.settle = resolve));
    this.signal = options.signal;
    if (this.signal) {
      if (this.signal.aborted) {
        queueMicrotask(() => this.abort());
      } else {
        this.onAbort = () => this.abort();
        this.signal.addEventListener("abort", this.onAbort, { once: true });
      }
    }
  }

  /** The loop coalesced so far (protocol §11), as chunks. */
  transcript(): Chunk[] {
    return this.kept ? this.kept.chunks() : [];
  }

  [Symbol.asyncIterator](): AsyncIterator<Event> {
    return {
      next: () => this.next(),
      return: () => this.leave(),
    };
  }

  /**
   * The same loop in batches: each step hands out every event that has come
   * and not been read, with one `await` for all of them. The events, the
   * outcome and the cancellation are the iteration's; what it saves is an
   * `await` per event (about 150 ns, as much as reading a small chunk
   * costs), for a consumer that must keep up with a fast loop.
   */
  batches(): AsyncIterable<Event[]> {
    return {
      [Symbol.asyncIterator]: () => ({
        next: () => this.nextBatch(),
        return: async () => {
          await this.leave();
          return { value: undefined, done: true };
        },
      }),
    };
  }

  /** @internal The loop cannot start: its run has ended. */
  failBefore(error: RunEnded): void {
    this.failure = error;
    this.finish(this.reader.cut(BROKEN.runEnded));
  }

  /** @internal One input for the loop, from the connection. */
  push(input: Input): void {
    if (this.settled) return;
    this.queue.push(input);
    if (this.waitingBatch) {
      // Handed out once this read of the socket is through, all of it at once.
      if (!this.batchDue) {
        this.batchDue = true;
        queueMicrotask(() => this.handBatch());
      }
      return;
    }
    const waiting = this.waiting;
    if (waiting) {
      // The consumer waits: hand it the next event at once.
      const next = this.step();
      if (next !== null) {
        this.waiting = null;
        waiting.resolve(next);
      }
      return;
    }
    if (input instanceof Uint8Array) this.queuedBytes += input.length;
    if (
      !this.isFull &&
      (this.queue.length - this.head >= this.client.maxQueued || this.queuedBytes >= this.client.maxQueuedBytes)
    ) {
      this.isFull = true;
      this.client.queueFull(this, true);
    }
  }

  private next(): Promise<IteratorResult<Event>> {
    if (this.failure !== null) {
      const failure = this.failure;
      this.failure = null;
      return Promise.reject(failure);
    }
    if (this.waiting) return Promise.reject(new RunloopError("a loop is read by one consumer at a time"));
    const next = this.step();
    if (next !== null) return Promise.resolve(next);
    return new Promise((resolve, reject) => (this.waiting = { resolve, reject }));
  }

  private nextBatch(): Promise<IteratorResult<Event[]>> {
    if (this.failure !== null) {
      const failure = this.failure;
      this.failure = null;
      return Promise.reject(failure);
    }
    if (this.waiting || this.waitingBatch) {
      return Promise.reject(new RunloopError("a loop is read by one consumer at a time"));
    }
    const batch = this.drain();
    if (batch !== null) return Promise.resolve(batch);
    return new Promise((resolve, reject) => (this.waitingBatch = { resolve, reject }));
  }

  /** Every event the queue holds, the end, or null when it holds none. */
  private drain(): IteratorResult<Event[]> | null {
    const events: Event[] = [];
    for (;;) {
      const next = this.step();
      if (next === null || next.done) break;
      events.push(next.value);
    }
    if (events.length > 0) return { value: events, done: false };
    return this.settled ? { value: undefined, done: true } : null;
  }

  /** Hands the waiting batch consumer what has come. */
  private handBatch(): void {
    this.batchDue = false;
    const waiting = this.waitingBatch;
    if (!waiting) return;
    const batch = this.drain();
    if (batch !== null) {
      this.waitingBatch = null;
      waiting.resolve(batch);
    }
  }

  /** The next event from the queue, the end, or null when the queue is empty. */
  private step(): IteratorResult<Event> | null {
    while (this.head < this.queue.length) {
      if (this.settled) break;
      const input = this.queue[this.head]!;
      this.head += 1;
      if (this.head === this.queue.length) {
        this.queue = [];
        this.head = 0;
      }
      if (input instanceof Uint8Array) this.queuedBytes -= input.length;
      // Read again once half the bounds are read: not at every response,
      // which would pause and resume the socket for each.
      if (
        this.isFull &&
        this.queue.length - this.head <= this.client.maxQueued >> 1 &&
        this.queuedBytes <= this.client.maxQueuedBytes / 2
      ) {
        this.isFull = false;
        this.client.queueFull(this, false);
      }
      if (input instanceof Uint8Array) {
        const step = this.reader.response(input, frame.HEADER);
        if (step instanceof Chunk) {
          this.kept?.push(step);
          return { value: step, done: false };
        }
        if (step instanceof LoopError) return { value: step, done: false };
        this.finish(step);
      } else if (input === FINISH) {
        this.finish(this.reader.finish());
      } else {
        this.finish(this.reader.cut(input === RUN_ENDED ? BROKEN.runEnded : BROKEN.connectionEnded));
      }
    }
    return this.settled ? { value: undefined, done: true } : null;
  }

  /** The loop's outcome is known: nothing more is read. */
  private finish(outcome: Outcome | undefined): void {
    if (this.settled) return;
    this.settled = outcome ?? new Outcome("broken", null, false, BROKEN.connectionEnded);
    this.queue = [];
    this.head = 0;
    this.queuedBytes = 0;
    if (this.isFull) {
      this.isFull = false;
      this.client.queueFull(this, false);
    }
    if (this.onAbort) this.signal?.removeEventListener("abort", this.onAbort);
    this.settle(this.settled);
  }

  /** The signal fired: stop the run, and reject the iteration with its reason. */
  private abort(): void {
    if (this.settled) return;
    this.run.abandon();
    this.finish(this.reader.cut(BROKEN.runEnded));
    const reason: unknown = this.signal?.reason ?? new RunloopError("aborted");
    const waiting = this.waiting ?? this.waitingBatch;
    this.waiting = null;
    this.waitingBatch = null;
    if (waiting) waiting.reject(reason);
    else this.failure = reason;
  }

  /** `for await` left early: the loop can only end with its run, so the run is stopped. */
  private leave(): Promise<IteratorResult<Event>> {
    if (!this.settled) {
      this.run.abandon();
      this.finish(this.reader.cut(BROKEN.runEnded));
    }
    this.failure = null;
    return Promise.resolve({ value: undefined, done: true });
  }
}

/** Connects with `dial` and sends the authorization (protocol §3). */
export async function connectWith(dial: Dial, url: string, options: ConnectOptions = {}): Promise<Client> {
  const token = options.token ?? "";
  const timeout = options.connectTimeoutMs ?? 10_000;
  const maxQueued = options.maxQueuedResponses ?? 1024;
  const maxQueuedBytes = options.maxQueuedBytes ?? 4 << 20;
  if (!Number.isInteger(maxQueued) || maxQueued < 1) {
    throw new RangeError("maxQueuedResponses must be a whole number of at least 1");
  }
  if (!Number.isInteger(maxQueuedBytes) || maxQueuedBytes < 1) {
    throw new RangeError("maxQueuedBytes must be a whole number of at least 1");
  }
  let client: Client | null = null;
  const early: Uint8Array[] = [];
  let closedEarly: [number | undefined, string] | null = null;
  const transport = await dial(url, timeout > 0 ? timeout : undefined, {
    message(bytes) {
      if (client) client.received(bytes);
      else early.push(bytes);
    },
    closed(code, reason) {
      if (client) client.transportClosed(code, reason);
      else closedEarly = [code, reason];
    },
  });
  client = new Client(transport, token !== "", maxQueued, maxQueuedBytes);
  // Authorization first: nothing precedes it.
  client.send(frame.encode(frame.AUTHORIZATION, 0, 0, encoder.encode("\x00" + token)));
  for (const bytes of early) client.received(bytes);
  if (closedEarly) client.transportClosed(...(closedEarly as [number | undefined, string]));
  return client;
}


/**
 * What a loop hands out: its chunks and its error, in order, and how it
 * ended.
 *
 * `Chunk` and `LoopError` are classes so that `instanceof` tells them apart:
 * on the wire only the tag byte does (protocol §7), and an error value may
 * itself be an object with a `type` member, so nothing in the JSON may be
 * used for it. A chunk keeps its JSON text exactly as it came (`json`),
 * beside its parse (`data`), which the reader made anyway to check it.
 */

import type { ChunkData, ChunkKind, Json } from "./chunks.js";

/** One chunk of a loop (protocol §8). */
export class Chunk {
  /** The chunk's `type`: `"assistant_text_content"`, `"tool_response"`, … */
  readonly kind: ChunkKind;
  /** The chunk's JSON text exactly as the server sent it. */
  readonly json: string;
  /** The chunk, parsed; its `type` is `kind`. */
  readonly data: ChunkData;

  /** @internal */
  constructor(json: string, data: ChunkData) {
    this.kind = data.type;
    this.json = json;
    this.data = data;
  }

  /** `text` of a reasoning, text or refusal fragment; else undefined. */
  get text(): string | undefined {
    const data = this.data;
    return "text" in data ? data.text : undefined;
  }

  /** `id` of a tool call or a tool response; else undefined. */
  get id(): string | undefined {
    const data = this.data;
    return data.type === "assistant_tool_call" || data.type === "tool_response" ? data.id : undefined;
  }

  /** `name` of a tool call; else undefined. */
  get name(): string | undefined {
    const data = this.data;
    return data.type === "assistant_tool_call" ? data.name : undefined;
  }

  /** `arguments` of a tool call (a fragment of JSON text); else undefined. */
  get arguments(): string | undefined {
    const data = this.data;
    return data.type === "assistant_tool_call" ? (data.arguments ?? undefined) : undefined;
  }

  /** The tool call whose sub-agent produced the chunk; undefined: the main thread. */
  get parentToolCallId(): string | undefined {
    const data = this.data;
    return "parent_tool_call_id" in data ? (data.parent_tool_call_id ?? undefined) : undefined;
  }

  /** Whether this is a fatal notification: the loop's last word, a failure. */
  get isFatal(): boolean {
    const data = this.data;
    return data.type === "notification" && data.is_fatal;
  }

  /** `message` of a notification (any JSON value); else undefined. */
  get message(): Json | undefined {
    const data = this.data;
    return data.type === "notification" ? data.message : undefined;
  }

  /** `prompt` of a user chunk; else undefined. */
  get prompt(): string | undefined {
    const data = this.data;
    return data.type === "user" ? data.prompt : undefined;
  }

  /** `mimeType` of an image or audio chunk; else undefined. */
  get mimeType(): string | undefined {
    const data = this.data;
    return data.type === "assistant_image_content" || data.type === "assistant_audio_content"
      ? data.mimeType
      : undefined;
  }

  /** The counts of a usage chunk (each a delta: the total is the caller's sum); else undefined. */
  get usage(): { completion: number; prompt: number; total: number } | undefined {
    const data = this.data;
    return data.type === "usage"
      ? { completion: data.completion_tokens, prompt: data.prompt_tokens, total: data.total_tokens }
      : undefined;
  }

  toString(): string {
    return this.json;
  }
}

/** The loop's error (protocol §9): there was no loop, or it did not finish. */
export class LoopError {
  /** The error value, parsed: any JSON value. */
  readonly value: Json;
  /** The error value's JSON text as it came. */
  readonly json: string;

  /** @internal */
  constructor(json: string, value: Json) {
    this.json = json;
    this.value = value;
  }

  toString(): string {
    return this.json;
  }
}

/** What a loop's stream yields, in order. */
export type Event = Chunk | LoopError;

/** How a loop ended: the five endings of protocol §7. */
export type OutcomeKind = "finished" | "unfinished" | "no_loop" | "not_served" | "broken";

/** How a loop ended. */
export class Outcome {
  /** Which of the five endings. */
  readonly kind: OutcomeKind;
  /** The loop's error value (`unfinished`, `no_loop`), parsed; else null. */
  readonly error: Json | null;
  /** Whether the loop finished with a fatal notification as its last chunk. */
  readonly fatal: boolean;
  /** Why the sequence broke (`broken`); else null. */
  readonly reason: string | null;

  /** @internal */
  constructor(kind: OutcomeKind, error: Json | null = null, fatal = false, reason: string | null = null) {
    this.kind = kind;
    this.error = error;
    this.fatal = fatal;
    this.reason = reason;
  }

  /** Whether the loop finished and did not fail. */
  get ok(): boolean {
    return this.kind === "finished" && !this.fatal;
  }

  /** The ending in words, for a person (the words of `runloop run`). */
  toString(): string {
    switch (this.kind) {
      case "finished":
        return this.fatal
          ? "the loop finished, but its last word was a fatal notification"
          : "the loop finished";
      case "unfinished":
        return `the loop ended without finishing (partial result): ${JSON.stringify(this.error)}`;
      case "no_loop":
        return `no loop ran: ${JSON.stringify(this.error)}`;
      case "not_served":
        return "the proxy did not serve the loop";
      case "broken":
        return `broken: ${this.reason ?? ""}`;
    }
  }

  toJSON(): { kind: OutcomeKind; error: Json | null; fatal: boolean; ok: boolean; reason: string | null } {
    return { kind: this.kind, error: this.error, fatal: this.fatal, ok: this.ok, reason: this.reason };
  }
}

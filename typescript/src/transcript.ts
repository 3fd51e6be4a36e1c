/**
 * The transcript: a loop's chunks with their fragments merged (protocol §11).
 *
 * Text, reasoning and refusals merge into the chunk right before them when
 * it is the same kind on the same thread (`text` and `logprobs` appended,
 * the first fragment's other members kept); a tool call's fragments merge
 * into the latest call with the same id on the same thread, wherever it is
 * (only `arguments` is appended); nothing merges across threads; every other
 * kind is appended as it came, usage included (each usage chunk is a delta
 * the caller sums).
 *
 * Each chunk of a transcript is written as the Rust transcript writes it,
 * so that the three clients give the same transcript of the same loop: the
 * members its kind knows, in the schema's order, an optional member that is
 * `null` left out.
 */

import { MEMBERS, REQUIRED, type ChunkData } from "./chunks.js";
import { Chunk } from "./events.js";

type Data = { [key: string]: unknown };

const TEXT_KINDS: ReadonlySet<string> = new Set(["assistant_reasoning", "assistant_text_content", "assistant_refusal"]);

/** The chunk as the Rust transcript writes it. */
function normalized(data: ChunkData): Data {
  const from = data as unknown as Data;
  const required = REQUIRED[data.type];
  const out: Data = {};
  for (const member of MEMBERS[data.type]) {
    const value = from[member];
    if (value === undefined || (value === null && !required.includes(member))) continue;
    out[member] = Array.isArray(value) ? [...(value as unknown[])] : value;
  }
  return out;
}

/** A coalesced loop, built one chunk at a time. */
export class Transcript {
  private readonly merged: Data[] = [];
  /** Where each tool call lives, by thread and id. */
  private readonly calls = new Map<string, number>();

  /** Adds the next chunk; the index of the merged chunk that now holds it. */
  push(chunk: Chunk): number {
    const data = chunk.data as unknown as Data;
    const kind = chunk.kind;
    const thread = (data["parent_tool_call_id"] as string | null | undefined) ?? null;
    if (TEXT_KINDS.has(kind)) {
      const last = this.merged.length - 1;
      const previous = this.merged[last];
      if (
        previous !== undefined &&
        previous["type"] === kind &&
        ((previous["parent_tool_call_id"] as string | undefined) ?? null) === thread
      ) {
        previous["text"] = (previous["text"] as string) + (data["text"] as string);
        const logprobs = data["logprobs"];
        if (Array.isArray(logprobs)) {
          const into = (previous["logprobs"] as unknown[] | undefined) ?? [];
          into.push(...(logprobs as unknown[]));
          previous["logprobs"] = into;
        }
        return last;
      }
    } else if (kind === "assistant_tool_call") {
      const key = JSON.stringify([thread, data["id"]]);
      const at = this.calls.get(key);
      const call = at === undefined ? undefined : this.merged[at];
      if (at !== undefined && call !== undefined) {
        const fragment = data["arguments"];
        if (typeof fragment === "string") {
          call["arguments"] = ((call["arguments"] as string | undefined) ?? "") + fragment;
        }
        return at;
      }
      this.calls.set(key, this.merged.length);
    }
    this.merged.push(normalized(chunk.data));
    return this.merged.length - 1;
  }

  /** The merged chunks so far, in order, each as a `Chunk`. */
  chunks(): Chunk[] {
    return this.merged.map((data) => {
      const copy = JSON.parse(JSON.stringify(data)) as ChunkData;
      return new Chunk(JSON.stringify(data), copy);
    });
  }
}

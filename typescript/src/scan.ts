/**
 * The fast path for the chunks a loop is mostly made of: text, reasoning
 * and refusal fragments, written as every encoder writes them. A reader of
 * such a chunk needs no JSON parser: `{"type":"assistant_text_content",
 * "text":"Hel"}` without a backslash in it is its members' text, each
 * between two quotes. So these are read with a few searches, and the
 * chunk's data built at once, before a full parse is tried.
 *
 * Giving up is its only answer, as the Rust reader's fast path (the
 * module `run_loop::scan` of runloop-proto): on anything else — another
 * kind, a backslash anywhere (an escape), a control character,
 * whitespace, a member other than `text` and `parent_tool_call_id`, a
 * member twice, a missing `text` — it returns undefined and the full path
 * (JSON.parse and the generated checks) decides. What it accepts, the full path accepts too, as the same
 * data; the shared corpus and test/scan.test.ts hold the two together.
 */

import type { ChunkData } from "./chunks.js";

const PREFIX = '{"type":"';
const TEXT = "assistant_text_content";
const REASONING = "assistant_reasoning";
const REFUSAL = "assistant_refusal";
const TEXT_MEMBER = '"text":"';
const THREAD_MEMBER = '"parent_tool_call_id":"';
/**
 * A backslash (an escape), a control character, or U+FFFD (which a fast
 * decoder writes for bytes that are not UTF-8): the full path's.
 */
const UNPLAIN = /[\u0000-\u001f\\\uFFFD]/;
const COMMA = 0x2c;
const CLOSE = 0x7d;

/** Whether `word` is in `text` at `at`. */
function wordAt(text: string, at: number, word: string): boolean {
  return text.slice(at, at + word.length) === word;
}

/** The chunk in `text` when it is a plain text fragment; undefined when the full path must decide. */
export function scanText(text: string): ChunkData | undefined {
  if (!wordAt(text, 0, PREFIX) || UNPLAIN.test(text)) return undefined;
  // No backslash: every quote delimits a string. Names are compared in
  // place, and only the members' values are copied out.
  const kindEnd = text.indexOf('"', PREFIX.length);
  const kind = text.slice(PREFIX.length, kindEnd);
  if (kind !== TEXT && kind !== REASONING && kind !== REFUSAL) return undefined;
  let body: string | undefined;
  let thread: string | undefined;
  let at = kindEnd + 1;
  while (text.charCodeAt(at) === COMMA) {
    let valueStart: number;
    const isText = wordAt(text, at + 1, TEXT_MEMBER);
    if (isText && body === undefined) valueStart = at + 1 + TEXT_MEMBER.length;
    else if (!isText && thread === undefined && wordAt(text, at + 1, THREAD_MEMBER)) {
      valueStart = at + 1 + THREAD_MEMBER.length;
    } else return undefined;
    const valueEnd = text.indexOf('"', valueStart);
    if (valueEnd < 0) return undefined;
    if (isText) body = text.slice(valueStart, valueEnd);
    else thread = text.slice(valueStart, valueEnd);
    at = valueEnd + 1;
  }
  if (body === undefined || at !== text.length - 1 || text.charCodeAt(at) !== CLOSE) return undefined;
  const data = thread === undefined ? { type: kind, text: body } : { type: kind, text: body, parent_tool_call_id: thread };
  return data as ChunkData;
}

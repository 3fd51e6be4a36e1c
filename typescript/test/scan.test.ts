/**
 * The fast path for text fragments (src/scan.ts) against the full path:
 * whatever it accepts, JSON.parse and the generated checks accept too, as
 * the same data; what it gives up on, the full path decides.
 */

import assert from "node:assert/strict";
import { join } from "node:path";
import { test } from "node:test";
import { pathToFileURL } from "node:url";

import { PACKAGE } from "./helpers.js";

type Scan = { scanText(text: string): unknown };
type Checks = { checkChunk(value: unknown): string | null };

const dist = (file: string) => pathToFileURL(join(PACKAGE, "dist", file)).href;

test("what the fast path reads, the full path reads the same", async () => {
  const { scanText } = (await import(dist("scan.js"))) as Scan;
  const { checkChunk } = (await import(dist("chunks.js"))) as Checks;
  const pieces = ["", "Hel", "lo, world", "é ünï 😀", '"quoted"', "back\\slash", "tab\there", "x".repeat(300), "}", ":", ","];
  const kinds = ["assistant_text_content", "assistant_reasoning", "assistant_refusal", "assistant_tool_call", "user"];
  const texts: string[] = [];
  for (const kind of kinds) {
    for (const piece of pieces) {
      const body = JSON.stringify(piece);
      texts.push(
        `{"type":"${kind}","text":${body}}`,
        `{"type":"${kind}","text":${body},"parent_tool_call_id":"call_1"}`,
        `{"type":"${kind}","parent_tool_call_id":"c","text":${body}}`,
        `{"type":"${kind}","text":${body},"text":${body}}`,
        `{"type":"${kind}","text":${body},"extra":1}`,
        `{"type":"${kind}", "text":${body}}`,
        `{"type":"${kind}","text":${body}} `,
        `{"text":${body},"type":"${kind}"}`,
        `{"type":"${kind}"}`,
        `{"type":"${kind}","text":${body}`,
        `{"type":"${kind}","text":${body}}}`,
        `{"type":"${kind}","text":${body},"parent_tool_call_id":null}`,
      );
    }
  }
  let fast = 0;
  for (const text of texts) {
    const read = scanText(text);
    if (read === undefined) continue;
    fast += 1;
    const parsed: unknown = JSON.parse(text);
    assert.deepEqual(read, parsed, text);
    assert.equal(checkChunk(parsed), null, text);
  }
  assert.ok(fast >= 40, `${fast} of ${texts.length} texts took the fast path`);
  // What it must leave to the full path.
  for (const text of [
    '{"type":"assistant_text_content","text":"a","text":"b"}',
    '{"type":"assistant_text_content","text":"\\ud800"}',
    '{"type":"assistant_text_content","text":"\uFFFD"}',
    '{"type":"assistant_text_content","text":"a\u0001"}',
    '{"type":"assistant_thought","text":"a"}',
  ]) {
    assert.equal(scanText(text), undefined, text);
  }
});

/**
 * The shared corpus (corpus/ at the repository's root), read by this
 * package: each capture played by `runloop __replay` over a real socket,
 * and what the package makes of it held to the case's expectations — the
 * same files the Rust client (crates/runloop-cli/tests/it/corpus.rs) and
 * the Python package (python/tests/test_corpus.py) are held to.
 */

import assert from "node:assert/strict";
import { readdirSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { after, before, test } from "node:test";

import { Chunk, connect, LoopError, RunNotServed, RunRefused, type Event } from "runloop";

import { ROOT, start, type Child } from "./helpers.js";

const CORPUS = join(ROOT, "corpus");

interface Expected {
  about: string;
  prompt?: string;
  events?: ({ chunk: string } | { error: unknown })[];
  outcome?: { kind: string; fatal: boolean; error: unknown; reason: string | null };
  transcript?: unknown[];
  start?: { refused?: unknown; not_served?: boolean };
}

/** Object members whose value is null removed, everywhere (an absent optional member and a null one mean the same). */
function withoutNulls(value: unknown): unknown {
  if (Array.isArray(value)) return value.map(withoutNulls);
  if (typeof value === "object" && value !== null) {
    return Object.fromEntries(
      Object.entries(value)
        .filter(([, v]) => v !== null)
        .map(([k, v]) => [k, withoutNulls(v)]),
    );
  }
  return value;
}

let replay: Child;
before(async () => {
  replay = await start(["__replay", CORPUS]);
});
after(async () => {
  await replay.kill();
});

const names = readdirSync(CORPUS)
  .filter((file) => file.endsWith(".json"))
  .map((file) => file.slice(0, -".json".length))
  .sort();

test("the corpus has its cases", () => {
  assert.ok(names.length >= 40, `${names.length} cases`);
});

for (const name of names) {
  const expected = JSON.parse(readFileSync(join(CORPUS, `${name}.json`), "utf8")) as Expected;
  test(`corpus ${name}: ${expected.about}`, async () => {
    const client = await connect(`${replay.url}/${name}`);
    try {
      if (expected.start) {
        await assert.rejects(client.start("demo"), (error: unknown) => {
          if (expected.start!.refused !== undefined) {
            assert.ok(error instanceof RunRefused, String(error));
            assert.deepEqual(error.error, expected.start!.refused);
          } else {
            assert.ok(error instanceof RunNotServed, String(error));
          }
          return true;
        });
        return;
      }
      const run = await client.start("demo");
      const stream = run.loop(expected.prompt ?? "hi");
      const events: Event[] = [];
      for await (const event of stream) events.push(event);
      const outcome = await stream.outcome;
      assert.deepEqual(
        events.map((event) => (event instanceof Chunk ? { chunk: event.json } : { error: event.value })),
        expected.events,
        "the events",
      );
      for (const event of events) {
        if (event instanceof Chunk) assert.deepEqual(event.data, JSON.parse(event.json));
        else assert.ok(event instanceof LoopError);
      }
      const wanted = expected.outcome!;
      assert.equal(outcome.kind, wanted.kind, String(outcome));
      assert.equal(outcome.fatal, wanted.fatal);
      assert.deepEqual(outcome.error, wanted.error);
      assert.equal(outcome.ok, wanted.kind === "finished" && !wanted.fatal);
      if (wanted.reason === null) assert.equal(outcome.reason, null);
      else assert.ok(outcome.reason?.startsWith(wanted.reason), `${outcome.reason} is not ${wanted.reason}…`);
      assert.deepEqual(
        withoutNulls(stream.transcript().map((chunk) => JSON.parse(chunk.json))),
        withoutNulls(expected.transcript),
        "the transcript",
      );
      if (!run.ended) await run.stop();
    } finally {
      await client.close();
    }
  });
}

/**
 * The package against a real `runloop serve`: each of the five outcomes
 * (the demo agent; exec agents that refuse, that crash mid-loop, that send
 * no event; a server killed mid-loop), a refused run, the credential's
 * failures, cancellation by an AbortSignal, and backpressure.
 */

import assert from "node:assert/strict";
import { after, before, test } from "node:test";

import {
  Chunk,
  connect,
  ConnectError,
  LoopError,
  RunEnded,
  RunRefused,
  type Client,
  type Event,
  type Stream,
} from "runloop";

import { serve, testAgent, TOKEN, type Child } from "./helpers.js";

const PROMPT = "Count the words in this sentence";

let server: Child;
before(async () => {
  server = await serve([
    "--agent",
    "demo=builtin:demo",
    "--agent",
    testAgent("refuses", "refuse"),
    "--agent",
    testAgent("crashes", "crash"),
    "--agent",
    testAgent("empty", "empty"),
    "--agent",
    testAgent("slow", "slow"),
  ]);
});
after(async () => {
  await server.stop();
});

async function read(stream: Stream): Promise<Event[]> {
  const events: Event[] = [];
  for await (const event of stream) events.push(event);
  return events;
}

async function oneLoop(image: string, prompt: string) {
  const client = await connect(server.url, { token: TOKEN });
  try {
    const run = await client.start(image, { memory: "64M" });
    const stream = run.loop(prompt);
    const events = await read(stream);
    const outcome = await stream.outcome;
    const transcript = stream.transcript();
    await run.stop();
    assert.ok(run.ended);
    return { events, outcome, transcript };
  } finally {
    await client.close();
  }
}

test("the demo's loop finishes, typed, and coalesces", async () => {
  const { events, outcome, transcript } = await oneLoop("demo", PROMPT);
  assert.equal(outcome.kind, "finished");
  assert.ok(outcome.ok && !outcome.fatal);
  assert.equal(outcome.error, null);
  assert.equal(outcome.reason, null);
  assert.equal(String(outcome), "the loop finished");
  const chunks = events.filter((event): event is Chunk => event instanceof Chunk);
  assert.equal(chunks.length, events.length);
  const kinds = chunks.map((chunk) => chunk.kind);
  assert.ok(kinds.includes("assistant_tool_call") && kinds.at(-1) === "usage");
  const text = chunks.map((chunk) => (chunk.kind === "assistant_text_content" ? chunk.text : "")).join("");
  assert.match(text, /6 words/);
  for (const chunk of chunks) {
    assert.deepEqual(chunk.data, JSON.parse(chunk.json));
    assert.equal(chunk.data.type, chunk.kind);
  }
  const usage = chunks.at(-1)!.usage!;
  assert.equal(usage.total, usage.prompt + usage.completion);
  const coalesced = transcript.map((chunk) => chunk.kind);
  assert.equal(coalesced.filter((kind) => kind === "assistant_text_content").length, 1);
  const call = transcript.find((chunk) => chunk.kind === "assistant_tool_call")!;
  assert.deepEqual(JSON.parse(call.arguments!), { text: PROMPT });
  assert.equal(transcript.find((chunk) => chunk.kind === "assistant_text_content")!.text, text);
});

test("a fatal notification last: finished, but not ok", async () => {
  const { events, outcome } = await oneLoop("demo", "please demo:fatal");
  assert.equal(outcome.kind, "finished");
  assert.ok(outcome.fatal && !outcome.ok);
  const last = events.at(-1);
  assert.ok(last instanceof Chunk && last.isFatal);
});

test("an exec agent that refuses: no loop, its error said by the agent", async () => {
  const { events, outcome, transcript } = await oneLoop("refuses", PROMPT);
  assert.equal(outcome.kind, "no_loop");
  assert.equal(events.length, 1);
  const error = events[0];
  assert.ok(error instanceof LoopError);
  assert.deepEqual(error.value, outcome.error);
  // The agent's own words, in the server's wrapping (protocol §12).
  assert.match(JSON.stringify(outcome.error), /this agent refuses every loop/);
  assert.deepEqual(transcript, []);
});

test("an exec agent that crashes mid-loop: unfinished, the partial result kept", async () => {
  const { events, outcome, transcript } = await oneLoop("crashes", PROMPT);
  assert.equal(outcome.kind, "unfinished", String(outcome));
  assert.ok(events.at(-1) instanceof LoopError);
  assert.match(JSON.stringify(outcome.error), /exit status 3/);
  assert.equal(transcript.length, 1);
  assert.equal(transcript[0]!.text, "about to crash");
});

test("an exec agent whose event stream holds no event: not served", async () => {
  const { events, outcome } = await oneLoop("empty", PROMPT);
  assert.equal(outcome.kind, "not_served");
  assert.deepEqual(events, []);
  assert.equal(String(outcome), "the proxy did not serve the loop");
});

test("a server killed mid-loop: broken, never finished", async () => {
  const own = await serve();
  const client = await connect(own.url, { token: TOKEN });
  const run = await client.start("demo", { memory: "64M" });
  const stream = run.loop(`demo:pace=100 ${PROMPT}`);
  let seen = 0;
  for await (const event of stream) {
    assert.ok(event instanceof Chunk);
    seen += 1;
    if (seen === 1) await own.kill();
  }
  const outcome = await stream.outcome;
  assert.equal(outcome.kind, "broken");
  assert.equal(outcome.reason, "the connection ended before the channel's finish");
  assert.ok(!outcome.ok);
  assert.ok(run.ended && client.closed);
  await assert.rejects(client.start("demo"), ConnectError);
});

test("a refused run rejects with RunRefused and the server's error value", async () => {
  const client = await connect(server.url, { token: TOKEN });
  try {
    await assert.rejects(client.start("nope", { memory: "64M" }), (error: unknown) => {
      assert.ok(error instanceof RunRefused);
      assert.equal((error.error as { kind: string }).kind, "policy");
      assert.match(error.message, /^the run was refused: /);
      return true;
    });
    // The connection goes on.
    const run = await client.start("demo", { memory: "64M" });
    await run.stop();
  } finally {
    await client.close();
  }
});

test("arguments that cannot work are refused before anything is sent", async () => {
  const client = await connect(server.url, { token: TOKEN });
  try {
    await assert.rejects(client.start("Not/A/Name"), RangeError);
    await assert.rejects(client.start("demo", { digest: "md5:00" }), RangeError);
    await assert.rejects(client.start("demo", { memory: "lots" }), RangeError);
    await assert.rejects(client.start("demo", { disk: -1 }), RangeError);
  } finally {
    await client.close();
  }
});

test("a wrong credential, and none, show at the first start", async () => {
  const wrong = await connect(server.url, { token: "not-the-token" });
  await assert.rejects(wrong.start("demo"), (error: unknown) => {
    assert.ok(error instanceof ConnectError);
    assert.match(error.message, /is the credential right\?/);
    return true;
  });
  const none = await connect(server.url);
  await assert.rejects(none.start("demo"), /it wants a credential, and none was sent/);
  await assert.rejects(connect("ws://127.0.0.1:1"), ConnectError);
});

test("aborting a loop stops its run within 2 s, and the connection serves the others", async () => {
  const client: Client = await connect(server.url, { token: TOKEN });
  try {
    const other = await client.start("demo", { memory: "64M" });
    const run = await client.start("slow", { memory: "64M" });
    const controller = new AbortController();
    const stream = run.loop("go", { signal: controller.signal });
    let aborted = 0;
    await assert.rejects(
      (async () => {
        for await (const event of stream) {
          assert.ok(event instanceof Chunk);
          if (aborted === 0) {
            aborted = performance.now();
            controller.abort();
          }
        }
      })(),
      (error: unknown) => (error as Error).name === "AbortError",
    );
    const rejected = performance.now() - aborted;
    await run.waitEnded();
    const ended = performance.now() - aborted;
    assert.ok(ended < 2000, `the run ended ${ended.toFixed(0)} ms after the abort`);
    assert.ok(run.ended);
    const outcome = await stream.outcome;
    assert.equal(outcome.kind, "broken");
    // A later loop of the aborted run rejects with RunEnded.
    await assert.rejects(read(run.loop("again")), RunEnded);
    // The connection goes on: the other run's loop finishes.
    const next = other.loop(PROMPT);
    await read(next);
    assert.equal((await next.outcome).kind, "finished");
    await other.stop();
    console.log(`# abort: iteration rejected in ${rejected.toFixed(1)} ms, run ended in ${ended.toFixed(1)} ms`);
  } finally {
    await client.close();
  }
});

test("leaving a loop's for-await early stops its run", async () => {
  const client = await connect(server.url, { token: TOKEN });
  try {
    const run = await client.start("slow", { memory: "64M" });
    const stream = run.loop("go");
    for await (const event of stream) {
      assert.ok(event instanceof Chunk);
      break;
    }
    await run.waitEnded();
    assert.equal((await stream.outcome).kind, "broken");
  } finally {
    await client.close();
  }
});

test("a consumer that stops iterating stops the reading (Node)", async () => {
  const client = await connect(server.url, { token: TOKEN, maxQueuedResponses: 64 });
  try {
    const run = await client.start("demo", { memory: "64M" });
    const total = 50_000;
    const stream = run.loop(`demo:load=${total}`);
    const iterator = stream[Symbol.asyncIterator]();
    await iterator.next();
    await new Promise((resolve) => setTimeout(resolve, 1000));
    // What waits unread: the queue's bound, and what the socket had
    // already read when it was paused; not the loop.
    const internals = stream as unknown as { queue: unknown[]; head: number };
    const waiting = internals.queue.length - internals.head;
    assert.ok(waiting >= 64 && waiting < 5000, `${waiting} responses wait unread`);
    let count = 1;
    for (;;) {
      const next = await iterator.next();
      if (next.done) break;
      count += 1;
    }
    assert.equal(count, total);
    assert.equal((await stream.outcome).kind, "finished");
    await run.stop();
  } finally {
    await client.close();
  }
});

test("batches() hands out the same loop as the per-event iteration", async () => {
  const client = await connect(server.url, { token: TOKEN });
  try {
    const reads: string[][] = [];
    for (const batched of [false, true]) {
      const run = await client.start("demo", { memory: "64M" });
      const stream = run.loop(PROMPT);
      const events: Event[] = [];
      if (batched) {
        for await (const batch of stream.batches()) {
          assert.ok(batch.length > 0);
          events.push(...batch);
        }
      } else {
        events.push(...(await read(stream)));
      }
      assert.equal((await stream.outcome).kind, "finished");
      reads.push(events.map((event) => event.json));
      await run.stop();
    }
    assert.deepEqual(reads[1], reads[0]);
  } finally {
    await client.close();
  }
});

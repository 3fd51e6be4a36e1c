#!/usr/bin/env node
// Chunks per second of one loop read by this package, against a minimal
// caller of the same protocol written by hand on `ws`.
//
//   node bench.mjs [--chunks N] [--rounds R] [--url ws://…]
//
// The source: without --url, a provider server of this script's own, in a
// child process, that answers the run and the loop with frames built before
// the clock starts and written to the socket a megabyte at a time, so it is
// never what is measured (it sends hundreds of times faster than any
// reader here reads). With --url, a real `runloop serve` in front of the
// bench's synthetic proxy, as python/bench.py measures (release builds:
// `runloop __synthetic-proxy` and `serve --agent bench=proxy:URL`); its
// image is `bench` and the prompt `bench:INDEX:0:CHUNKS:0`.
//
// The hand-written caller does what any caller of the protocol must and no
// more: the authorization, the run request, the loop's channel request;
// per message the header read with readUInt32BE, the tag byte, the chunk's
// JSON parsed (a caller reads its chunks), the finish. It checks nothing
// else. Both use `ws` with compression off and the same message limit.
// Sides take turns, in an order that turns around every round; each figure
// is the median of its rounds, and the ratio the median of per-round
// ratios. Besides chunks per second of the loop's wall time, each side's
// chunks per CPU second of this process (process.cpuUsage): on a shared,
// loaded machine the wall time counts the waits for a core as well, and the
// CPU figure is the steadier measure of what a chunk costs the reader.

import { spawn } from "node:child_process";
import { createHash } from "node:crypto";
import net from "node:net";
import { createInterface } from "node:readline";
import { fileURLToPath } from "node:url";

import WebSocket from "ws";

import { Chunk, connect } from "runloop";

const MAX_MESSAGE = (16 << 20) + 9;
const TOKEN = "bench";
const DIGEST = "sha256:" + "0".repeat(64);

function option(name, fallback) {
  const at = process.argv.indexOf(`--${name}`);
  return at >= 0 ? process.argv[at + 1] : fallback;
}

// --- the source: a provider server whose loop is built before it is asked for ---

/** One server frame: header and payload. */
function frame(type, scope, channel, payload = Buffer.alloc(0)) {
  const out = Buffer.alloc(9 + payload.length);
  out[0] = type;
  out.writeUInt32BE(scope, 1);
  out.writeUInt32BE(channel, 5);
  payload.copy(out, 9);
  return out;
}

/** A WebSocket binary message, unmasked (server to client). */
function wsMessage(payload) {
  const n = payload.length;
  const head = n < 126 ? Buffer.from([0x82, n]) : n < 65536 ? Buffer.from([0x82, 126, n >> 8, n & 255]) : null;
  if (head === null) {
    const long = Buffer.alloc(10);
    long[0] = 0x82;
    long[1] = 127;
    long.writeBigUInt64BE(BigInt(n), 2);
    return Buffer.concat([long, payload]);
  }
  return Buffer.concat([head, payload]);
}

/** The loop's chunks, 20–200 bytes of JSON each, as WebSocket messages. */
function loopBytes(scope, channel, chunks) {
  const parts = [];
  let seed = 7;
  for (let n = 0; n < chunks; n++) {
    seed = (seed * 1103515245 + 12345) & 0x7fffffff;
    const size = 20 + (seed % 181);
    const text = "x".repeat(Math.max(0, size - 44));
    const json = `{"type":"assistant_text_content","text":"${text}"}`;
    parts.push(wsMessage(frame(5, scope, channel, Buffer.concat([Buffer.from([0]), Buffer.from(json)]))));
  }
  parts.push(wsMessage(frame(6, scope, channel)));
  return Buffer.concat(parts);
}

/** Serves runs whose loops are `chunks` chunks; prints its URL. */
function source(chunks) {
  const cache = new Map();
  const server = net.createServer((socket) => {
    socket.setNoDelay(true);
    let buffer = Buffer.alloc(0);
    let upgraded = false;
    const write = async (bytes) => {
      for (let at = 0; at < bytes.length; at += 1 << 20) {
        if (!socket.write(bytes.subarray(at, at + (1 << 20)))) {
          await new Promise((resolve) => socket.once("drain", resolve));
        }
      }
    };
    socket.on("data", async (data) => {
      buffer = Buffer.concat([buffer, data]);
      if (!upgraded) {
        const end = buffer.indexOf("\r\n\r\n");
        if (end < 0) return;
        const key = /sec-websocket-key: *(\S+)/i.exec(buffer.subarray(0, end).toString())[1];
        const accept = createHash("sha1").update(key + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11").digest("base64");
        socket.write(`HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: ${accept}\r\n\r\n`);
        upgraded = true;
        buffer = buffer.subarray(end + 4);
      }
      // Client messages: small, masked, one frame each.
      while (buffer.length >= 2) {
        const opcode = buffer[0] & 15;
        let length = buffer[1] & 127;
        let at = 2;
        if (length === 126) {
          if (buffer.length < 4) return;
          length = buffer.readUInt16BE(2);
          at = 4;
        }
        if (buffer.length < at + 4 + length) return;
        const mask = buffer.subarray(at, at + 4);
        const payload = Buffer.from(buffer.subarray(at + 4, at + 4 + length));
        for (let i = 0; i < payload.length; i++) payload[i] ^= mask[i & 3];
        buffer = buffer.subarray(at + 4 + length);
        if (opcode === 8) {
          socket.end(Buffer.from([0x88, 0]));
          return;
        }
        if (opcode !== 2 || payload.length < 9) continue;
        const type = payload[0];
        const scope = payload.readUInt32BE(1);
        const channel = payload.readUInt32BE(5);
        if (type === 1) {
          await write(wsMessage(frame(2, scope, 0, Buffer.from('\x00{"id":"bench"}'))));
        } else if (type === 4 && payload[9] === 5) {
          const key = `${scope}/${channel}`;
          if (!cache.has(key)) cache.set(key, loopBytes(scope, channel, chunks));
          await write(cache.get(key));
        } else if (type === 4 && payload[9] === 0) {
          await write(wsMessage(frame(3, scope, 0)));
        }
      }
    });
    socket.on("error", () => {});
  });
  server.listen(0, "127.0.0.1", () => console.log(`ws://127.0.0.1:${server.address().port}`));
}

// --- the two callers -------------------------------------------------------------

function request() {
  return JSON.stringify({ image: { server: { name: "bench", digest: DIGEST } }, memory: 1 << 30, disk: 0, agent: {} });
}

/** CPU seconds this process has used (user and system). */
function cpu() {
  const { user, system } = process.cpuUsage();
  return (user + system) / 1e6;
}

/** One loop through this package: [chunks, seconds, CPU seconds]. */
async function packageLoop(url, prompt) {
  const client = await connect(url, { token: TOKEN });
  const run = await client.start("bench", { memory: "1G" });
  const began = performance.now();
  const cpuBegan = cpu();
  let chunks = 0;
  const stream = run.loop(prompt, { transcript: false });
  for await (const event of stream) {
    if (event instanceof Chunk) chunks += 1;
  }
  const took = (performance.now() - began) / 1000;
  const used = cpu() - cpuBegan;
  const outcome = await stream.outcome;
  if (outcome.kind !== "finished") throw new Error(`package: ${outcome}`);
  await run.stop();
  await client.close();
  return [chunks, took, used];
}

/** One loop through this package's batches: [chunks, seconds, CPU seconds]. */
async function packageBatches(url, prompt) {
  const client = await connect(url, { token: TOKEN });
  const run = await client.start("bench", { memory: "1G" });
  const began = performance.now();
  const cpuBegan = cpu();
  let chunks = 0;
  const stream = run.loop(prompt, { transcript: false });
  for await (const batch of stream.batches()) {
    for (const event of batch) if (event instanceof Chunk) chunks += 1;
  }
  const took = (performance.now() - began) / 1000;
  const used = cpu() - cpuBegan;
  const outcome = await stream.outcome;
  if (outcome.kind !== "finished") throw new Error(`package: ${outcome}`);
  await run.stop();
  await client.close();
  return [chunks, took, used];
}

/** One loop through a caller of the same protocol written by hand on `ws`. */
function handLoop(url, prompt) {
  return new Promise((resolve, reject) => {
    const ws = new WebSocket(url, { perMessageDeflate: false, maxPayload: MAX_MESSAGE });
    const header = (type, scope, channel, payload) => frame(type, scope, channel, Buffer.from(payload, "latin1"));
    let began = 0;
    let cpuBegan = 0;
    let chunks = 0;
    let last = null;
    ws.on("open", () => {
      ws.send(header(0, 0, 0, "\x00" + TOKEN));
      ws.send(Buffer.concat([header(1, 1, 0, "\x00"), Buffer.from(request())]));
    });
    ws.on("message", (data) => {
      const scope = data.readUInt32BE(1);
      if (scope !== 1 || data.length < 9) return;
      const type = data[0];
      if (type === 2) {
        began = performance.now();
        cpuBegan = cpu();
        ws.send(Buffer.concat([header(4, 1, 1, "\x05"), Buffer.from(JSON.stringify({ prompt }))]));
      } else if (type === 5 && data.readUInt32BE(5) === 1) {
        if (data[9] !== 0) return reject(new Error("hand-written: the loop's error"));
        last = JSON.parse(data.toString("utf8", 10));
        chunks += 1;
      } else if (type === 6 && data.readUInt32BE(5) === 1) {
        const took = (performance.now() - began) / 1000;
        const used = cpu() - cpuBegan;
        if (last === null) return reject(new Error("hand-written: no chunk"));
        ws.send(header(4, 1, 2, "\x00"));
        ws.once("message", () => {
          ws.close();
          resolve([chunks, took, used]);
        });
      }
    });
    ws.on("error", reject);
  });
}

// --- the measurement -------------------------------------------------------------------

const median = (values) => [...values].sort((a, b) => a - b)[Math.floor(values.length / 2)];

async function main() {
  if (process.argv.includes("--source")) return source(Number(option("chunks", "200000")));
  const chunks = Number(option("chunks", "200000"));
  const rounds = Number(option("rounds", "5"));
  let url = option("url", undefined);
  let child = null;
  if (url === undefined) {
    child = spawn(process.execPath, [fileURLToPath(import.meta.url), "--source", "--chunks", String(chunks)], {
      stdio: ["ignore", "pipe", "inherit"],
    });
    url = await new Promise((resolve) => createInterface({ input: child.stdout }).once("line", resolve));
  }
  const prompt = (index) => `bench:${index}:0:${chunks}:0`;
  const sides = {
    package: (p) => packageLoop(url, p),
    "package, batches()": (p) => packageBatches(url, p),
    "hand-written ws caller": (p) => handLoop(url, p),
  };
  const names = Object.keys(sides);
  const rates = Object.fromEntries(names.map((name) => [name, []]));
  const cpuRates = Object.fromEntries(names.map((name) => [name, []]));
  try {
    for (const name of names) await sides[name](prompt(0)); // warm-up, not counted
    for (let round = 0; round < rounds; round++) {
      for (const name of round % 2 === 0 ? names : [...names].reverse()) {
        const [got, took, used] = await sides[name](prompt(round + 1));
        if (got !== chunks) throw new Error(`${name}: ${got} of ${chunks} chunks`);
        rates[name].push(got / took);
        cpuRates[name].push(got / used);
      }
    }
  } finally {
    child?.kill();
  }
  const base = "hand-written ws caller";
  const ratio = (name, of) => median(of[name].map((rate, i) => rate / of[base][i])).toFixed(2);
  const { version } = await import("ws/package.json", { with: { type: "json" } }).then((m) => m.default);
  console.log(
    `one loop of ${chunks} chunks (20-200 bytes), ${rounds} rounds, ${option("url", undefined) ? url : "the bench's own source"}, ` +
      `Node ${process.versions.node}, ws ${version}`,
  );
  const show = (n) => n.toLocaleString("en-US", { maximumFractionDigits: 0 }).padStart(10);
  for (const name of names) {
    console.log(
      `  ${name.padEnd(24)} ${show(median(rates[name]))} chunks/s   ${show(median(cpuRates[name]))} chunks per CPU second`,
    );
  }
  for (const name of names.filter((name) => name !== base)) {
    console.log(`  ${name}: ${ratio(name, rates)}x the hand-written caller's rate (${ratio(name, cpuRates)}x per CPU second)`);
  }
}

await main();

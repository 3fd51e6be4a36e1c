/**
 * The package as it is installed: its exports map, a browser entry that
 * imports nothing outside the package, chunk types that are `runloop
 * schema`'s (src/chunks.ts regenerated and compared), and the errors'
 * hierarchy.
 */

import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { readFileSync } from "node:fs";
import { dirname, join, resolve } from "node:path";
import { test } from "node:test";
import { fileURLToPath } from "node:url";

import {
  CHUNK_KINDS,
  ConnectError,
  ConnectTimeout,
  RunEnded,
  RunloopError,
  RunNotServed,
  RunRefused,
} from "runloop";

import { PACKAGE, runloopBinary } from "./helpers.js";

const DIST = dirname(fileURLToPath(import.meta.resolve("runloop")));

test("exports: a browser condition, types, and the Node entry", () => {
  const manifest = JSON.parse(readFileSync(join(DIST, "..", "package.json"), "utf8"));
  const root = manifest.exports["."];
  assert.equal(root.browser, "./dist/browser.js");
  assert.equal(root.types, "./dist/index.d.ts");
  assert.equal(root.default, "./dist/index.js");
  assert.equal(manifest.type, "module");
  assert.deepEqual(Object.keys(manifest.dependencies), ["ws"]);
});

test("the browser entry imports nothing outside the package", () => {
  const seen = new Set<string>();
  const visit = (file: string) => {
    if (seen.has(file)) return;
    seen.add(file);
    const text = readFileSync(file, "utf8");
    for (const match of text.matchAll(/(?:^|\n)\s*(?:import|export)\b[^;]*?from\s*"([^"]+)"|import\(\s*"([^"]+)"\s*\)/g)) {
      const specifier = (match[1] ?? match[2])!;
      assert.ok(specifier.startsWith("./"), `${file} imports ${specifier}`);
      visit(resolve(dirname(file), specifier));
    }
  };
  visit(join(DIST, "browser.js"));
  assert.ok(seen.size >= 8, [...seen].join(", "));
  assert.ok(![...seen].some((file) => file.endsWith("index.js")), "the Node entry (ws) is not reached");
});

test("the chunk types are what runloop schema says", () => {
  const check = spawnSync(process.execPath, [join(PACKAGE, "scripts", "generate-chunks.mjs"), "--check"], {
    env: { ...process.env, RUNLOOP_BIN: runloopBinary() },
    encoding: "utf8",
  });
  assert.equal(check.status, 0, check.stderr);
  assert.deepEqual(CHUNK_KINDS, [
    "assistant_reasoning",
    "assistant_text_content",
    "assistant_refusal",
    "assistant_tool_call",
    "assistant_image_content",
    "assistant_audio_content",
    "tool_response",
    "user",
    "usage",
    "notification",
  ]);
});

test("every error is a RunloopError", () => {
  for (const Kind of [ConnectError, ConnectTimeout, RunEnded, RunNotServed]) {
    const error = new Kind("x");
    assert.ok(error instanceof RunloopError && error instanceof Error);
    assert.equal(error.name, Kind.name);
  }
  assert.ok(new ConnectTimeout("x") instanceof ConnectError);
  const refused = new RunRefused("the run was refused", { kind: "policy" });
  assert.ok(refused instanceof RunloopError);
  assert.deepEqual(refused.error, { kind: "policy" });
});

/**
 * The live page in a real headless Chromium (Debian's `chromium`, driven
 * by playwright-core; no browser is downloaded), against a real `runloop
 * serve` started by page/serve.mjs: the package's browser entry, loaded
 * as an ES module by the page, finishes a demo loop; the showcase loop
 * shows its image and audio; a page of another origin, and a page with an
 * empty credential, are refused. `RUNLOOP_SCREENSHOT=FILE` saves the
 * showcase as docs/ shows it (npm run screenshot).
 */

import assert from "node:assert/strict";
import { spawn, type ChildProcess } from "node:child_process";
import { existsSync, mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { createInterface } from "node:readline";
import { after, before, test } from "node:test";
import { fileURLToPath } from "node:url";

import { chromium, type BrowserContext, type Page } from "playwright-core";

import { PACKAGE, runloopBinary } from "./helpers.js";

const CHROMIUM = process.env.RUNLOOP_CHROMIUM ?? "/usr/bin/chromium";

/** The package's dist/ as this test imports it: the tree's, or the installed tarball's. */
const DIST = dirname(fileURLToPath(import.meta.resolve("runloop")));

interface PageServer {
  child: ChildProcess;
  /** The page's URL, its fragment holding the server's URL and token. */
  url: URL;
}

function pageServer(): Promise<PageServer> {
  const child = spawn(
    process.execPath,
    [join(PACKAGE, "page", "serve.mjs"), "--package", DIST, "--runloop", runloopBinary()],
    { stdio: ["ignore", "pipe", "inherit"] },
  );
  return new Promise((resolve, reject) => {
    createInterface({ input: child.stdout! }).on("line", (line) => {
      if (line.startsWith("open ")) resolve({ child, url: new URL(line.slice("open ".length)) });
    });
    child.once("exit", (code) => reject(new Error(`page/serve.mjs exited (${code})`)));
  });
}

/** The page at `server`, with `changes` to its fragment. */
function at(server: PageServer, changes: Record<string, string>): string {
  const fragment = new URLSearchParams(server.url.hash.slice(1));
  for (const [key, value] of Object.entries(changes)) fragment.set(key, value);
  return `${server.url.origin}/#${fragment}`;
}

let servers: PageServer[] = [];
let context: BrowserContext;
let profile: string;
let skipped = false;

before(async () => {
  if (!existsSync(CHROMIUM)) {
    if (process.env.RUNLOOP_REQUIRE_SYSTEM === "1") throw new Error(`needs chromium (${CHROMIUM})`);
    console.log("skipped: needs chromium (apt-get install chromium)");
    skipped = true;
    return;
  }
  servers = [await pageServer(), await pageServer()];
  profile = mkdtempSync(join(tmpdir(), "runloop-chromium-"));
  context = await chromium.launchPersistentContext(profile, {
    executablePath: CHROMIUM,
    headless: true,
    viewport: { width: 900, height: 1000 },
    args: [
      "--no-sandbox",
      "--disable-gpu",
      "--no-first-run",
      "--disable-background-networking",
      "--disable-component-update",
      "--disable-sync",
    ],
  });
});

after(async () => {
  await context?.close();
  for (const server of servers) server.child.kill("SIGTERM");
  if (profile) rmSync(profile, { recursive: true, force: true });
});

/** Starts a run from the page, sends `prompt`, and waits for the outcome's kind. */
async function oneLoop(page: Page, prompt: string): Promise<string> {
  await page.click("#start");
  await page.waitForSelector("#send:not([disabled])", { timeout: 30_000 });
  await page.fill("#prompt", prompt);
  await page.click("#send");
  const outcome = await page.waitForSelector("#outcome[data-kind]", { timeout: 60_000 });
  return (await outcome.getAttribute("data-kind")) ?? "";
}

test("the page finishes a demo loop through the package's browser entry", async (t) => {
  if (skipped) return t.skip("needs chromium");
  const page = await context.newPage();
  const errors: string[] = [];
  page.on("pageerror", (error) => errors.push(String(error)));
  await page.goto(at(servers[0]!, { image: "demo" }));
  assert.equal(await oneLoop(page, "Count the words in this sentence"), "finished");
  assert.equal(await page.textContent("#outcome"), "The loop finished.");
  const text = await page.locator(".block.text").allTextContents();
  assert.ok(text.some((block) => block.includes("6 words")), text.join(" | "));
  assert.match((await page.textContent(".block.tool code")) ?? "", /^word_count\(\{"text":/);
  assert.match((await page.textContent("#usage")) ?? "", /^usage: \d+ tokens/);
  // The module the page runs is the package's browser entry.
  const loaded = await page.evaluate(() => performance.getEntriesByType("resource").map((entry) => entry.name));
  assert.ok(loaded.some((url) => url.endsWith("/runloop/browser.js")), loaded.join(", "));
  assert.deepEqual(errors, []);
  await page.close();
});

test("the showcase loop shows its image, audio, tool response and usage", async (t) => {
  if (skipped) return t.skip("needs chromium");
  const page = await context.newPage();
  await page.goto(at(servers[0]!, { image: "showcase", prompt: "Show me a sunset, with sound" }));
  assert.equal(await oneLoop(page, "Show me a sunset, with sound"), "finished");
  assert.equal(await page.locator(".block.media img").count(), 1);
  assert.equal(await page.locator(".block.media audio").count(), 1);
  assert.equal(await page.locator(".tool .response img").count(), 1);
  const width = await page.locator(".block.media img").evaluate((img) => (img as HTMLImageElement).naturalWidth);
  assert.equal(width, 96, "the PNG decoded");
  assert.match((await page.textContent(".block.reasoning")) ?? "", /I will draw them a sunset/);
  const screenshot = process.env.RUNLOOP_SCREENSHOT;
  if (screenshot) await page.screenshot({ path: screenshot, fullPage: true });
  await page.close();
});

test("a page of another origin is refused, and so is an empty credential", async (t) => {
  if (skipped) return t.skip("needs chromium");
  const page = await context.newPage();
  // The page of server 1's origin, pointed at server 0, which allows only its own page.
  const foreign = new URLSearchParams(servers[0]!.url.hash.slice(1));
  await page.goto(at(servers[1]!, { url: foreign.get("url")!, token: foreign.get("token")!, image: "demo" }));
  await page.click("#start");
  await page.waitForFunction(() => document.getElementById("status")!.textContent!.startsWith("ConnectError"));
  assert.match((await page.textContent("#status")) ?? "", /refused the upgrade|--allow-origin/);
  // Its own origin, with no token.
  await page.goto(at(servers[0]!, { token: "", image: "demo" }));
  await page.reload();
  await page.click("#start");
  await page.waitForFunction(() => document.getElementById("status")!.textContent!.startsWith("ConnectError"));
  assert.match((await page.textContent("#status")) ?? "", /wants a credential, and none was sent/);
  await page.close();
});

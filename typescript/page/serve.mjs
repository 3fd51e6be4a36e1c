#!/usr/bin/env node
// The live page on loopback, in one command: a small static server for the
// page and the package's browser build, and a `runloop serve` that allows
// exactly that page's origin, with a fresh token handed to the page in the
// URL's fragment (which a browser never sends to a server).
//
//   npm --prefix typescript run page [-- --port 8080] [-- --runloop PATH] [-- --package DIST]
//
// It prints the page's URL; open it. Ctrl-C ends both servers.
//
// Why a script of the package and not a flag of `runloop serve`: the server
// stays a WebSocket server with nothing else to harden (no files, no HTTP
// routes), the page is served from wherever a site serves its pages (here,
// beside the package it imports), and the two origins a browser sees — the
// page's and the server's — are set up the way a real deployment sets them
// up: the server allows the page's origin (`--allow-origin`), and the page
// is given a token that is not the operator's.
//
// The server serves the catalog images `demo` (the built-in demo agent) and
// `showcase` (page/showcase-agent.mjs: images, audio and a tool call,
// paced so the loop can be watched).

import { spawn, spawnSync } from "node:child_process";
import { randomBytes } from "node:crypto";
import { existsSync, readFileSync, statSync } from "node:fs";
import http from "node:http";
import { dirname, extname, join, resolve, sep } from "node:path";
import { createInterface } from "node:readline";
import { fileURLToPath } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
const root = resolve(here, "..", "..");

function option(name, fallback) {
  const at = process.argv.indexOf(`--${name}`);
  return at >= 0 ? process.argv[at + 1] : fallback;
}

const port = Number(option("port", process.env.PORT ?? "0"));
const dist = resolve(option("package", join(here, "..", "dist")));

function runloopBinary() {
  const given = option("runloop", process.env.RUNLOOP_BIN);
  if (given) return given;
  const target = process.env.CARGO_TARGET_DIR ?? join(root, "target");
  for (const build of ["release", "debug"]) {
    const binary = join(target, build, "runloop");
    if (existsSync(binary)) return binary;
  }
  console.error("building runloop (cargo build -p runloop-cli) …");
  const built = spawnSync("cargo", ["build", "-p", "runloop-cli"], { cwd: root, stdio: "inherit" });
  if (built.status !== 0) process.exit(built.status ?? 1);
  return join(target, "debug", "runloop");
}

if (!existsSync(join(dist, "browser.js"))) {
  console.error(`${dist}/browser.js is missing: build the package first (npm --prefix typescript ci)`);
  process.exit(1);
}

const TYPES = { ".html": "text/html", ".js": "text/javascript", ".css": "text/css", ".map": "application/json" };

/** A file under `base`, never outside it. */
function fileUnder(base, relative) {
  const path = resolve(base, "." + sep + relative);
  if (path !== base && !path.startsWith(base + sep)) return null;
  return existsSync(path) && statSync(path).isFile() ? path : null;
}

const pages = http.createServer((req, res) => {
  const path = decodeURIComponent(new URL(req.url ?? "/", "http://page").pathname);
  const file = path.startsWith("/runloop/")
    ? fileUnder(dist, path.slice("/runloop/".length))
    : fileUnder(here, path === "/" ? "index.html" : path.slice(1));
  const type = file && TYPES[extname(file)];
  if (!file || !type || file.endsWith(".mjs")) {
    res.writeHead(404, { "Content-Type": "text/plain" }).end("not found\n");
    return;
  }
  res.writeHead(200, { "Content-Type": `${type}; charset=utf-8`, "Cache-Control": "no-store" });
  res.end(readFileSync(file));
});

pages.listen(port, "127.0.0.1", async () => {
  const origin = `http://127.0.0.1:${pages.address().port}`;
  const token = randomBytes(18).toString("base64url");
  const server = spawn(
    runloopBinary(),
    [
      "serve",
      "--listen",
      "127.0.0.1:0",
      "--allow-origin",
      origin,
      "--agent",
      "demo=builtin:demo",
      "--agent",
      `showcase=exec:${process.execPath} ${join(here, "showcase-agent.mjs")}`,
      // The showcase agent writes nothing, and its runs ask for no disk.
      "--exec-disk",
      "unenforced",
    ],
    { env: { ...process.env, RUNLOOP_TOKEN: token, RUST_LOG: process.env.RUST_LOG ?? "warn" }, stdio: ["ignore", "pipe", "inherit"] },
  );
  const stop = () => {
    server.kill("SIGTERM");
    pages.close();
  };
  process.on("SIGINT", stop);
  process.on("SIGTERM", stop);
  server.on("exit", (code) => {
    pages.close();
    process.exitCode = code ?? 0;
  });
  const first = await new Promise((resolve) => createInterface({ input: server.stdout }).once("line", resolve));
  if (!first.startsWith("ws")) {
    console.error(`runloop serve did not start: ${first}`);
    stop();
    return;
  }
  const fragment = new URLSearchParams({ url: first.trim(), token, image: "showcase" });
  console.log(`runloop serve: ${first.trim()}, allowing the origin ${origin}`);
  console.log(`open ${origin}/#${fragment}`);
});

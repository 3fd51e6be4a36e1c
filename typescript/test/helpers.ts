/**
 * What the tests share: where the workspace is, the `runloop` binary, and
 * `runloop serve` / `runloop __replay` started on a free loopback port.
 *
 * The tests import the package by its name ("runloop"), so they run as
 * they are against this tree's build (a package may import itself by name)
 * and, in ci.sh, against the package installed from its `npm pack`
 * tarball into a fresh project. `RUNLOOP_ROOT` names the workspace there;
 * `RUNLOOP_BIN` another `runloop` binary.
 */

import { spawn, type ChildProcess } from "node:child_process";
import { existsSync } from "node:fs";
import { dirname, join, resolve } from "node:path";
import { createInterface } from "node:readline";
import { fileURLToPath } from "node:url";

/** The workspace's root. */
export const ROOT = process.env.RUNLOOP_ROOT ?? resolve(dirname(fileURLToPath(import.meta.url)), "../../..");

/** The package's own directory in the workspace. */
export const PACKAGE = join(ROOT, "typescript");

/** The `runloop` binary the tests run. */
export function runloopBinary(): string {
  if (process.env.RUNLOOP_BIN) return process.env.RUNLOOP_BIN;
  const target = process.env.CARGO_TARGET_DIR ?? join(ROOT, "target");
  const binary = join(target, "debug", "runloop");
  if (!existsSync(binary)) throw new Error(`${binary} is missing: cargo build -p runloop-cli`);
  return binary;
}

/** A child that printed its URL as its first line. */
export class Child {
  constructor(
    readonly process: ChildProcess,
    readonly url: string,
  ) {}

  /** Ends it at once (SIGKILL) and waits. */
  async kill(): Promise<void> {
    await this.signal("SIGKILL");
  }

  /** Ends it (SIGTERM) and waits. */
  async stop(): Promise<void> {
    await this.signal("SIGTERM");
  }

  private signal(signal: NodeJS.Signals): Promise<void> {
    if (this.process.exitCode !== null || this.process.signalCode !== null) return Promise.resolve();
    return new Promise((resolve) => {
      this.process.once("exit", () => resolve());
      this.process.kill(signal);
    });
  }
}

/** Starts `runloop ARGS…` and waits for the URL it prints first. */
export function start(args: string[], env: NodeJS.ProcessEnv = {}): Promise<Child> {
  const child = spawn(runloopBinary(), args, {
    cwd: ROOT,
    env: { ...process.env, RUST_LOG: "warn", ...env },
    stdio: ["ignore", "pipe", "inherit"],
  });
  return new Promise((resolve, reject) => {
    const lines = createInterface({ input: child.stdout! });
    lines.once("line", (line) => {
      if (line.startsWith("ws://")) resolve(new Child(child, line.trim()));
      else reject(new Error(`runloop ${args[0]} did not start: ${line}`));
    });
    child.once("exit", (code) => reject(new Error(`runloop ${args[0]} exited (${code}) before its URL`)));
  });
}

/** The token the tests' servers take. */
export const TOKEN = "typescript-tests-token";

/** `runloop serve` on a free loopback port with the tests' token and `args`. */
export function serve(args: string[] = []): Promise<Child> {
  return start(["serve", "--listen", "127.0.0.1:0", ...args], { RUNLOOP_TOKEN: TOKEN });
}

/** An exec agent of the tests (test/agents/agent.mjs) in `mode`, as a catalog entry. */
export function testAgent(name: string, mode: string): string {
  const script = join(PACKAGE, "test", "agents", "agent.mjs");
  return `${name}=exec:${process.execPath} ${script} ${mode}`;
}

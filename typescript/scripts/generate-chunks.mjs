#!/usr/bin/env node
// Writes src/chunks.ts, the chunk vocabulary's types and checks, from the
// JSON Schema that `runloop schema` prints: the schema is made from the very
// Rust types that decode the wire, so the package's types and what it
// accepts follow them instead of a second copy written by hand.
//
//   node scripts/generate-chunks.mjs            regenerate src/chunks.ts
//   node scripts/generate-chunks.mjs --check    exit 1 when it is out of date
//   ... [--schema FILE]                         read the schema from FILE
//
// Without --schema the schema comes from `runloop schema`, run as
// $RUNLOOP_BIN, else the workspace's target/debug/runloop (built with
// `cargo build -p runloop-cli`).
//
// What it emits, for each definition of the schema: a type, and a check
// that says why a parsed JSON value does not have that shape (null when it
// does), with the Rust reader's rules: required members, types, unsigned
// integers, 32-bit floats, `type`-tagged unions; unknown members tolerated.

import { execFileSync } from "node:child_process";
import { existsSync, readFileSync, writeFileSync } from "node:fs";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
const packageDir = resolve(here, "..");
const root = resolve(packageDir, "..");
const output = join(packageDir, "src", "chunks.ts");

function schemaText(args) {
  const at = args.indexOf("--schema");
  if (at >= 0) return readFileSync(args[at + 1], "utf8");
  const target = process.env.CARGO_TARGET_DIR ?? join(root, "target");
  const binary = process.env.RUNLOOP_BIN ?? join(target, "debug", "runloop");
  if (!existsSync(binary)) {
    throw new Error(`${binary} is missing: cargo build -p runloop-cli (or set RUNLOOP_BIN)`);
  }
  return execFileSync(binary, ["schema"], { encoding: "utf8" });
}

const pascal = (name) => name.split(/[_\-]/).map((w) => w[0].toUpperCase() + w.slice(1)).join("");
// A definition named as a global of TypeScript's would shadow it.
const renamed = { Error: "ErrorValue" };
// The structs behind the kinds (`TextChunk`, …) are their members: the
// kinds' own types (`AssistantReasoningChunk`, …) add `type` to them.
const defName = (name) => renamed[name] ?? name.replace(/Chunk$/, "Fields");
const refName = (ref) => defName(ref.replace("#/$defs/", ""));
// Text inside a template literal of the output.
const tpl = (text) => text.replace(/[`\\]/g, (c) => "\\" + c).replace(/\$\{/g, "\\${");
const key = (name) => (/^[A-Za-z_$][A-Za-z0-9_$]*$/.test(name) ? name : JSON.stringify(name));
const comment = (text, indent = "") =>
  text ? `${indent}/** ${text.replace(/\*\//g, "*\\/").split("\n").join(`\n${indent} * `)} */\n` : "";
const types = (node) => (node.type === undefined ? [] : Array.isArray(node.type) ? node.type : [node.type]);

/** The TypeScript type of a schema node. */
function typeOf(node) {
  if (node.$ref && !node.properties) return refName(node.$ref);
  if (node.const !== undefined) return JSON.stringify(node.const);
  if (node.anyOf) return node.anyOf.map(typeOf).join(" | ");
  if (node.oneOf) return node.oneOf.map(typeOf).join(" | ");
  const t = types(node);
  if (t.length === 0) return "Json";
  return t
    .map((one) => {
      switch (one) {
        case "string":
          return "string";
        case "integer":
        case "number":
          return "number";
        case "boolean":
          return "boolean";
        case "null":
          return "null";
        case "array":
          return `${node.items ? wrap(typeOf(node.items)) : "Json"}[]`;
        case "object":
          return node.properties ? objectType(node, "") : "{ [key: string]: Json }";
        default:
          throw new Error(`unknown type ${one}`);
      }
    })
    .join(" | ");
}

const wrap = (t) => (t.includes("|") ? `(${t})` : t);

function objectType(node, indent) {
  const required = new Set(node.required ?? []);
  const lines = Object.entries(node.properties ?? {}).map(
    ([name, prop]) =>
      `${comment(prop.description, indent + "  ")}${indent}  ${key(name)}${required.has(name) ? "" : "?"}: ${typeOf(prop)};`,
  );
  return `{\n${lines.join("\n")}\n${indent}}`;
}

/** The check of a schema node, as statements that `return` a reason on failure. */
class Checks {
  constructor() {
    this.counter = 0;
  }

  fresh(prefix) {
    this.counter += 1;
    return `${prefix}${this.counter}`;
  }

  /** Statements checking `v` (an expression naming a value) against `node`. */
  node(node, v, what) {
    const out = [];
    if (node.$ref) {
      const e = this.fresh("e");
      out.push(`const ${e} = check${refName(node.$ref)}(${v});`, `if (${e} !== null) return ${e};`);
    }
    if (node.const !== undefined) {
      out.push(
        `if (${v} !== ${JSON.stringify(node.const)}) return \`invalid value: \${show(${v})}, expected ${tpl(JSON.stringify(node.const))} for ${tpl(what)}\`;`,
      );
    }
    const t = types(node);
    if (t.length > 0) out.push(...this.typed(node, t, v, what));
    if (node.anyOf || node.oneOf) out.push(...this.union(node.anyOf ?? node.oneOf, v, what));
    return out;
  }

  typed(node, t, v, what) {
    const out = [];
    const nullable = t.includes("null");
    const tests = [];
    for (const one of t) {
      switch (one) {
        case "string":
          tests.push(`typeof ${v} === "string"`);
          break;
        case "boolean":
          tests.push(`typeof ${v} === "boolean"`);
          break;
        case "number":
          tests.push(`typeof ${v} === "number"`);
          break;
        case "integer":
          tests.push(`typeof ${v} === "number"`);
          break;
        case "array":
          tests.push(`Array.isArray(${v})`);
          break;
        case "object":
          tests.push(`isObject(${v})`);
          break;
        case "null":
          tests.push(`${v} === null`);
          break;
        default:
          throw new Error(`unknown type ${one}`);
      }
    }
    const expected = t.filter((x) => x !== "null").join(" or ") + (nullable ? " or null" : "");
    out.push(`if (!(${tests.join(" || ")})) return \`invalid type: \${show(${v})}, expected ${expected} for ${tpl(what)}\`;`);
    const body = [];
    if (t.includes("integer")) {
      const min = node.minimum;
      const max = node.maximum ?? (node.format === "uint64" ? 18446744073709551616 : undefined);
      const bounds = [`Number.isInteger(${v})`];
      if (min !== undefined) bounds.push(`${v} >= ${min}`);
      if (max !== undefined) bounds.push(`${v} <= ${max}`);
      body.push(
        `if (typeof ${v} === "number" && !(${bounds.join(" && ")})) return \`invalid value: \${show(${v})}, expected ${node.format ?? "an integer"} for ${tpl(what)}\`;`,
      );
    }
    if (t.includes("number") && node.format === "float") {
      body.push(
        `if (typeof ${v} === "number" && Math.abs(${v}) > FLOAT_MAX) return \`${tpl(what)} does not fit a 32-bit float\`;`,
      );
    }
    if (t.includes("array") && node.items) {
      const item = this.fresh("item");
      const inner = this.node(node.items, item, `an item of ${what}`);
      if (inner.length > 0) {
        body.push(`if (Array.isArray(${v})) {`, `  for (const ${item} of ${v} as unknown[]) {`, ...inner.map((s) => "    " + s), "  }", "}");
      }
    }
    if (t.includes("object") && (node.properties || node.required)) {
      const o = this.fresh("o");
      const inner = [`const ${o} = ${v} as { [key: string]: unknown };`];
      for (const name of node.required ?? []) {
        inner.push(`if (!Object.hasOwn(${o}, ${JSON.stringify(name)})) return "missing field \`${name}\`";`);
      }
      for (const [name, prop] of Object.entries(node.properties ?? {})) {
        const p = this.fresh("p");
        const checks = this.node(prop, p, `\`${name}\``);
        if (checks.length === 0) continue;
        inner.push(`const ${p} = ${o}[${JSON.stringify(name)}];`);
        inner.push(`if (${p} !== undefined) {`, ...checks.map((s) => "  " + s), "}");
      }
      body.push(`if (isObject(${v})) {`, ...inner.map((s) => "  " + s), "}");
    }
    return [...out, ...body];
  }

  union(variants, v, what) {
    // `X or null` (an Option): null passes, anything else is checked as X.
    const isNull = (x) => JSON.stringify(x) === '{"type":"null"}';
    if (variants.length === 2 && variants.some(isNull)) {
      const other = variants.find((x) => !isNull(x));
      return [`if (${v} !== null) {`, ...this.node(other, v, what).map((s) => "  " + s), "}"];
    }
    const tags = variants.map((x) => x.properties?.type?.const);
    if (tags.every((tag) => typeof tag === "string")) {
      // A `type`-tagged union: the tag picks the variant.
      const o = this.fresh("o");
      const out = [
        `if (!isObject(${v})) return \`invalid type: \${show(${v})}, expected an object for ${tpl(what)}\`;`,
        `const ${o} = ${v} as { [key: string]: unknown };`,
        `if (!Object.hasOwn(${o}, "type")) return "missing field \`type\`";`,
        `switch (${o}["type"]) {`,
      ];
      variants.forEach((variant, at) => {
        const { properties, required, ...rest } = variant;
        out.push(`  case ${JSON.stringify(tags[at])}: {`, ...this.node(rest, v, what).map((s) => "    " + s), "    break;", "  }");
      });
      const names = tags.map((tag) => `\`${tag}\``).join(", ");
      out.push(
        "  default:",
        `    return typeof ${o}["type"] === "string" ? \`unknown variant \\\`\${${o}["type"]}\\\`, expected one of ${tpl(names)}\` : \`invalid type: \${show(${o}["type"])}, expected a tag string\`;`,
        "}",
      );
      return out;
    }
    // Any variant that fits: each is tried in order, as serde's untagged enums do.
    const fns = variants.map((variant) => {
      const name = this.fresh("variant");
      this.extra.push(`function ${name}(v: unknown): string | null {`, ...this.node(variant, "v", what).map((s) => "  " + s), "  return null;", "}");
      return name;
    });
    const reasons = this.fresh("reasons");
    return [
      `const ${reasons} = [${fns.map((f) => `${f}(${v})`).join(", ")}];`,
      `if (!${reasons}.includes(null)) return ${reasons}[0] ?? "no variant fits";`,
    ];
  }
}

function generate(schema) {
  const checks = new Checks();
  checks.extra = [];
  const defs = schema.$defs;
  const out = [];
  out.push(
    "// Generated by scripts/generate-chunks.mjs from the schema `runloop schema` prints.",
    "// Do not edit: run `npm run generate` (tests fail when it is out of date).",
    "",
    "/** Any JSON value. */",
    "export type Json = null | boolean | number | string | Json[] | { [key: string]: Json };",
    "",
    "const FLOAT_MAX = 3.4028234663852886e38;",
    "",
    "function isObject(v: unknown): boolean {",
    '  return typeof v === "object" && v !== null && !Array.isArray(v);',
    "}",
    "",
    "function show(v: unknown): string {",
    '  if (v === null) return "null";',
    '  if (Array.isArray(v)) return "a sequence";',
    '  if (typeof v === "object") return "a map";',
    '  if (typeof v === "string") return `string ${JSON.stringify(v)}`;',
    "  return `${typeof v} ${String(v)}`;",
    "}",
    "",
  );
  for (const [raw, def] of Object.entries(defs)) {
    const name = defName(raw);
    out.push(comment(def.description).trimEnd());
    if (types(def).includes("object") && def.properties) {
      out.push(`export interface ${name} ${objectType(def, "")}`);
    } else {
      out.push(`export type ${name} = ${typeOf(def)};`);
    }
    out.push("");
  }
  // The chunk kinds: the root's `type`-tagged variants.
  const kinds = schema.oneOf.map((variant) => ({
    tag: variant.properties.type.const,
    def: refName(variant.$ref),
    raw: variant.$ref.replace("#/$defs/", ""),
    description: variant.description,
  }));
  const chunkTypes = [];
  for (const kind of kinds) {
    const name = `${pascal(kind.tag)}Chunk`;
    chunkTypes.push(name);
    out.push(comment(kind.description).trimEnd(), `export type ${name} = { type: ${JSON.stringify(kind.tag)} } & ${kind.def};`, "");
  }
  out.push(
    comment(schema.description).trimEnd(),
    `export type ChunkData =\n  | ${chunkTypes.join("\n  | ")};`,
    "",
    "/** Every chunk kind, by its `type` string, in the order protocol §8 lists them. */",
    `export const CHUNK_KINDS = ${JSON.stringify(kinds.map((k) => k.tag))} as const;`,
    "",
    "/** A chunk's `type`. */",
    "export type ChunkKind = (typeof CHUNK_KINDS)[number];",
    "",
    "/** The members each kind knows, `type` first: what a transcript's merged chunk keeps. */",
    "export const MEMBERS: { readonly [K in ChunkKind]: readonly string[] } = {",
    ...kinds.map((k) => `  ${k.tag}: ${JSON.stringify(["type", ...Object.keys(defs[k.raw].properties)])},`),
    "};",
    "",
    "/** The members each kind requires. */",
    "export const REQUIRED: { readonly [K in ChunkKind]: readonly string[] } = {",
    ...kinds.map((k) => `  ${k.tag}: ${JSON.stringify(["type", ...(defs[k.raw].required ?? [])])},`),
    "};",
    "",
  );
  const root = checks.node({ oneOf: schema.oneOf }, "v", "a chunk");
  const bodies = new Map();
  for (const [raw, def] of Object.entries(defs)) {
    const name = defName(raw);
    bodies.set(name, checks.node(def, "v", name));
  }
  // Only the checks something calls.
  const called = new Set();
  const calls = (lines) => {
    for (const line of lines) {
      for (const match of line.matchAll(/check([A-Za-z]+)\(/g)) {
        if (!called.has(match[1]) && bodies.has(match[1])) {
          called.add(match[1]);
          calls(bodies.get(match[1]));
        }
      }
    }
  };
  calls([...root, ...checks.extra]);
  for (const [name, body] of bodies) {
    if (!called.has(name)) continue;
    out.push(
      `/** Why \`v\` is not a ${name}, or null when it is. */`,
      `function check${name}(v: unknown): string | null {`,
      ...body.map((s) => "  " + s),
      "  return null;",
      "}",
      "",
    );
  }
  out.push(
    "/** Why a parsed chunk is not one of the vocabulary's, or null when it is. */",
    "export function checkChunk(v: unknown): string | null {",
    ...root.map((s) => "  " + s),
    "  return null;",
    "}",
    "",
    ...checks.extra,
    "",
  );
  return out.join("\n").replace(/\n{3,}/g, "\n\n");
}

const args = process.argv.slice(2);
const text = generate(JSON.parse(schemaText(args)));
if (args.includes("--check")) {
  const current = existsSync(output) ? readFileSync(output, "utf8") : "";
  if (current !== text) {
    console.error("src/chunks.ts is out of date with `runloop schema`: run `npm run generate`");
    process.exit(1);
  }
  console.log("src/chunks.ts matches `runloop schema`");
} else {
  writeFileSync(output, text);
  console.log(`wrote ${output}`);
}

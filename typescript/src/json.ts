/**
 * JSON read as the Rust reader reads it (serde_json), not as `JSON.parse`
 * alone would: the bytes must be UTF-8 (no byte-order mark), nesting stops
 * at 127 levels, a number too large for a double is refused rather than
 * read as `Infinity`, and a string holding half of a surrogate pair is
 * refused rather than kept.
 *
 * `JSON.parse` does the reading; the extra rules are checked after it, on
 * the parsed value, whose walk costs its members, not its bytes.
 */

const decoder = new TextDecoder("utf-8", { fatal: true, ignoreBOM: true });

/** The text of `bytes` from `start`. */
export type Utf8 = (bytes: Uint8Array, start: number) => string;

/** The platform's `TextDecoder`, refusing what is not UTF-8 and keeping a byte-order mark. */
const standard: Utf8 = (bytes, start) => decoder.decode(start === 0 ? bytes : bytes.subarray(start));

let decode: Utf8 = standard;
/** Whether `decode` refuses bytes that are not UTF-8 (else it writes U+FFFD for them). */
let strict = true;

/**
 * Puts a faster decoder in place of `TextDecoder`: one that writes U+FFFD
 * for bytes that are not UTF-8 (the Node entry's, over `Buffer`). A text
 * with a U+FFFD in it is then checked again, strictly.
 */
export function useUtf8(faster: Utf8): void {
  decode = faster;
  strict = false;
}

/**
 * The text of UTF-8 bytes from `start`, as fast as the platform decodes:
 * bytes that are not UTF-8 may come out as U+FFFD, which `checkUtf8` then
 * tells from a U+FFFD the bytes hold.
 */
export function looseUtf8(bytes: Uint8Array, start = 0): string {
  try {
    return decode(bytes, start);
  } catch {
    throw new Error("invalid UTF-8");
  }
}

/** Throws unless `text`, read by `looseUtf8` from `bytes` at `start`, was UTF-8. */
export function checkUtf8(text: string, bytes: Uint8Array, start = 0): void {
  if (strict || !text.includes("\uFFFD")) return;
  standard(bytes, start);
}

/** The text of UTF-8 bytes from `start`; throws on bytes that are not UTF-8. */
export function utf8(bytes: Uint8Array, start = 0): string {
  const text = looseUtf8(bytes, start);
  try {
    checkUtf8(text, bytes, start);
  } catch {
    throw new Error("invalid UTF-8");
  }
  return text;
}

/** Nesting serde_json reads; one more level is refused. */
const MAX_DEPTH = 127;


/** Exactly one JSON value; throws an `Error` that says why not. */
export function parseJson(text: string): unknown {
  const value: unknown = JSON.parse(text);
  // The parsed value is walked (its containers and numbers, not its
  // bytes); its strings are looked at only when the text has a \u escape,
  // the one way JSON can write half a surrogate pair.
  const why = check(value, 0, text.includes("\\u"));
  if (why !== null) throw new Error(why);
  return value;
}

function check(value: unknown, depth: number, escapes: boolean): string | null {
  switch (typeof value) {
    case "number":
      return Number.isFinite(value) ? null : "number out of range";
    case "string":
      return !escapes || value.isWellFormed() ? null : "lone surrogate in a string";
    case "object": {
      if (value === null) return null;
      if (depth >= MAX_DEPTH) return "recursion limit exceeded";
      if (Array.isArray(value)) {
        for (const item of value) {
          const why = check(item, depth + 1, escapes);
          if (why !== null) return why;
        }
        return null;
      }
      const object = value as { [key: string]: unknown };
      for (const key in object) {
        if (escapes && !key.isWellFormed()) return "lone surrogate in a member name";
        const why = check(object[key], depth + 1, escapes);
        if (why !== null) return why;
      }
      return null;
    }
    default:
      return null;
  }
}

/** Bytes quoted for a message: printable ASCII as it is, the rest escaped, cut at 64 bytes. */
export function quote(bytes: Uint8Array): string {
  const kept = 64;
  let shown = "";
  for (const byte of bytes.subarray(0, kept)) {
    if (byte === 0x22) shown += '\\"';
    else if (byte === 0x5c) shown += "\\\\";
    else if (byte === 0x0a) shown += "\\n";
    else if (byte === 0x0d) shown += "\\r";
    else if (byte === 0x09) shown += "\\t";
    else if (byte >= 0x20 && byte < 0x7f) shown += String.fromCharCode(byte);
    else shown += "\\x" + byte.toString(16).padStart(2, "0");
  }
  const cut = bytes.length > kept ? "…" : "";
  return `"${shown}${cut}" (${bytes.length} ${bytes.length === 1 ? "byte" : "bytes"})`;
}

const quoted = new WeakMap<readonly string[], readonly string[]>();

/** `members`, each in quotes, made once per list. */
function quotedNames(members: readonly string[]): readonly string[] {
  let names = quoted.get(members);
  if (names === undefined) {
    names = members.map((member) => `"${member}"`);
    quoted.set(members, names);
  }
  return names;
}

/**
 * Whether the object `text` holds names one of `members` twice at its top
 * level: serde refuses a struct member written twice, where `JSON.parse`
 * keeps the last. A quoted name that occurs once in the whole text cannot
 * be twice at the top, so only a text where one does is scanned.
 */
export function repeatsMember(text: string, value: { [key: string]: unknown }, members: readonly string[]): boolean {
  // A member written twice is in the parse (the last one wins), so only
  // the known members the parse has are looked for.
  let suspect = false;
  const names = quotedNames(members);
  for (let at = 0; at < members.length; at++) {
    if (!Object.hasOwn(value, members[at]!)) continue;
    const quoted = names[at]!;
    if (text.indexOf(quoted) !== text.lastIndexOf(quoted)) {
      suspect = true;
      break;
    }
  }
  if (!suspect) return false;
  const seen = new Set<string>();
  let depth = 0;
  let expectKey = false;
  for (let at = 0; at < text.length; at++) {
    const ch = text.charCodeAt(at);
    if (ch === 0x22) {
      // A string: find its end, stepping over escapes.
      let end = at + 1;
      for (;;) {
        end = text.indexOf('"', end);
        if (end < 0) return false;
        let slashes = 0;
        for (let back = end - 1; text.charCodeAt(back) === 0x5c; back--) slashes++;
        if (slashes % 2 === 0) break;
        end += 1;
      }
      if (depth === 1 && expectKey) {
        const name = JSON.parse(text.slice(at, end + 1)) as string;
        if (members.includes(name)) {
          if (seen.has(name)) return true;
          seen.add(name);
        }
        expectKey = false;
      }
      at = end;
    } else if (ch === 0x7b || ch === 0x5b) {
      depth++;
      expectKey = ch === 0x7b && depth === 1;
    } else if (ch === 0x7d || ch === 0x5d) {
      depth--;
    } else if (ch === 0x2c && depth === 1) {
      expectKey = true;
    }
  }
  return false;
}

/**
 * JSON read as the Rust reader reads it (serde_json), not as `JSON.parse`
 * alone would: the bytes must be UTF-8 (no byte-order mark), nesting stops
 * at 127 levels, a number too large for a double is refused rather than
 * read as `Infinity`, and a string holding half of a surrogate pair is
 * refused rather than kept.
 *
 * `JSON.parse` does the reading; the extra rules are checked after it, and
 * only when the text could break one of them (a long text, an exponent of
 * three digits, a `\u` escape of a surrogate), so a chunk of ordinary JSON
 * pays for one parse and three short scans.
 */

const decoder = new TextDecoder("utf-8", { fatal: true, ignoreBOM: true });

/** Nesting serde_json reads; one more level is refused. */
const MAX_DEPTH = 127;

/** The text of UTF-8 bytes; throws on bytes that are not UTF-8. */
export function utf8(bytes: Uint8Array): string {
  try {
    return decoder.decode(bytes);
  } catch {
    throw new Error("invalid UTF-8");
  }
}

const RISKY = /\\u[dD][89a-fA-F]|[eE][+-]?\d{3}|\d{300}/;

/** Exactly one JSON value; throws an `Error` that says why not. */
export function parseJson(text: string): unknown {
  const value: unknown = JSON.parse(text);
  if (text.length >= 2 * MAX_DEPTH || RISKY.test(text)) {
    const why = check(value, 0);
    if (why !== null) throw new Error(why);
  }
  return value;
}

function check(value: unknown, depth: number): string | null {
  switch (typeof value) {
    case "number":
      return Number.isFinite(value) ? null : "number out of range";
    case "string":
      return value.isWellFormed() ? null : "lone surrogate in a string";
    case "object": {
      if (value === null) return null;
      if (depth >= MAX_DEPTH) return "recursion limit exceeded";
      if (Array.isArray(value)) {
        for (const item of value) {
          const why = check(item, depth + 1);
          if (why !== null) return why;
        }
        return null;
      }
      for (const [key, item] of Object.entries(value)) {
        if (!key.isWellFormed()) return "lone surrogate in a member name";
        const why = check(item, depth + 1);
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

/**
 * Whether the object `text` holds names one of `members` twice at its top
 * level: serde refuses a struct member written twice, where `JSON.parse`
 * keeps the last. A quoted name that occurs once in the whole text cannot
 * be twice at the top, so only a text where one does is scanned.
 */
export function repeatsMember(text: string, members: readonly string[]): boolean {
  let suspect = false;
  for (const member of members) {
    const quoted = `"${member}"`;
    const first = text.indexOf(quoted);
    if (first >= 0 && text.indexOf(quoted, first + quoted.length) >= 0) {
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

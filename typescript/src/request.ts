/**
 * The run request (`containers::agents::run`, protocol §5) from `start`'s
 * arguments, checked before anything is sent, as the other clients check
 * it: an image name is a repository path without a host, a digest is
 * `sha256:` and 64 lowercase hex digits, sizes are bytes or strings with
 * K/M/G/T (powers of 1024).
 */

/** Bytes, or a string such as `"512K"`, `"16M"`, `"1G"`. */
export type Size = number | string;

/** The protocol's image object (`{"server": …}`, `{"registry": …}`, `{"client": …}`). */
export type Image =
  | { server: { name: string; digest: string } }
  | { registry: { reference: string } }
  | { client: { name: string; digest: string } };

/** What `start` takes besides the image name. */
export interface StartOptions {
  /** The run's memory limit (default `"1G"`). */
  memory?: Size;
  /** Bytes the container may write to its own filesystem (default 0; a container needs at least `"1M"`). */
  disk?: Size;
  /** The protocol's image object, instead of a catalog name. */
  image?: Image;
  /** The catalog image's manifest digest, when the server pins one. */
  digest?: string;
  /** Handed to the agent's registration as it is (default `{}`). */
  agent?: unknown;
}

/** The digest a request sends when it pins none. */
export const UNPINNED = "sha256:" + "0".repeat(64);

const SCALE: { [suffix: string]: number } = { K: 2 ** 10, M: 2 ** 20, G: 2 ** 30, T: 2 ** 40 };

/** Bytes from a number or a string with an optional K/M/G/T suffix. */
export function size(value: Size, what: string): number {
  if (typeof value === "number") {
    if (!Number.isSafeInteger(value) || value < 0) {
      throw new RangeError(`${what} must be a whole number of bytes, not ${value}`);
    }
    return value;
  }
  if (typeof value === "string") {
    const text = value.trim();
    const scale = SCALE[text.slice(-1).toUpperCase()];
    const digits = scale === undefined ? text : text.slice(0, -1);
    if (/^[0-9]+$/.test(digits)) {
      const bytes = Number(digits) * (scale ?? 1);
      if (Number.isSafeInteger(bytes)) return bytes;
    }
    throw new RangeError(`${what}: ${JSON.stringify(value)} is not a byte count (e.g. 512K, 16M, 1G)`);
  }
  throw new TypeError(`${what} must be a number or a string such as "1G"`);
}

/** Whether `name` is a repository path without a host. */
export function isValidName(name: string): boolean {
  const components = name.split("/");
  if (components.length > 1) {
    const first = components[0]!;
    if (first.includes(".") || first.includes(":") || first === "localhost") return false;
  }
  const component = /^[a-z0-9]+(?:(?:\.|_|__|-+)[a-z0-9]+)*$/;
  return name.length > 0 && name.length <= 255 && components.every((c) => component.test(c));
}

/** Whether `digest` is `sha256:` followed by 64 lowercase hex digits. */
export function isValidDigest(digest: string): boolean {
  return /^sha256:[0-9a-f]{64}$/.test(digest);
}

/** The run request's JSON for `start(name, options)`. */
export function runRequest(name: string | undefined, options: StartOptions): string {
  let image: Image;
  if (options.image !== undefined) {
    if (name !== undefined) throw new TypeError("give an image name or options.image, not both");
    if (options.digest !== undefined) {
      throw new TypeError("digest goes with an image name; put it inside options.image instead");
    }
    image = options.image;
  } else {
    const wanted = name ?? "demo";
    if (!isValidName(wanted)) {
      throw new RangeError(`${JSON.stringify(wanted)} is not an image name (a repository path without a host)`);
    }
    const digest = options.digest ?? UNPINNED;
    if (!isValidDigest(digest)) {
      throw new RangeError(`${JSON.stringify(digest)} is not a digest: sha256: followed by 64 lowercase hex digits`);
    }
    image = { server: { name: wanted, digest } };
  }
  const request = {
    image,
    memory: size(options.memory ?? "1G", "memory"),
    disk: size(options.disk ?? 0, "disk"),
    agent: options.agent === undefined ? {} : options.agent,
  };
  const json = JSON.stringify(request);
  if (json === undefined) throw new TypeError("the agent value is not JSON");
  return json;
}

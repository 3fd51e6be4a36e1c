/**
 * Frames (protocol §2): every binary message is one frame, a fixed 9-byte
 * header and the payload to the end of the message.
 *
 * ```text
 * [type: u8][scope: u32, big-endian][channel: u32, big-endian][payload …]
 * ```
 *
 * A frame's kind is its type and its direction: of the server's frames this
 * side reads 0 and 2 to 6, and anything shorter than the header, a type 1 or
 * a type of 7 or more is malformed, and disregarded.
 */

/** The header's length. */
export const HEADER = 9;

/** Frame types, by their byte. */
export const AUTHORIZATION = 0;
export const REQUEST = 1;
export const RESPONSE = 2;
export const RESPONSE_FINISH = 3;
export const CHANNEL_REQUEST = 4;
export const CHANNEL_RESPONSE = 5;
export const CHANNEL_RESPONSE_FINISH = 6;

/** A frame the client sends: the header, then `payload`. */
export function encode(type: number, scope: number, channel: number, payload?: Uint8Array): Uint8Array {
  const out = new Uint8Array(HEADER + (payload?.length ?? 0));
  out[0] = type;
  const view = new DataView(out.buffer);
  view.setUint32(1, scope >>> 0);
  view.setUint32(5, channel >>> 0);
  if (payload) out.set(payload, HEADER);
  return out;
}

/** The big-endian u32 at `at` of `bytes`. */
export function u32(bytes: Uint8Array, at: number): number {
  return ((bytes[at]! << 24) | (bytes[at + 1]! << 16) | (bytes[at + 2]! << 8) | bytes[at + 3]!) >>> 0;
}

/** Whether a message from the server is a frame of a type a server sends (protocol §2). */
export function isServerFrame(message: Uint8Array): boolean {
  if (message.length < HEADER) return false;
  const type = message[0]!;
  return type !== REQUEST && type <= CHANNEL_RESPONSE_FINISH;
}

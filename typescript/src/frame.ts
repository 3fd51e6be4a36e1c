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

/** A frame from the server, its payload a view of the message (no copy). */
export interface ServerFrame {
  type: number;
  scope: number;
  channel: number;
  payload: Uint8Array;
}

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

/** A frame the server sent, or why it is malformed. */
export function decodeServerFrame(message: Uint8Array): ServerFrame | string {
  if (message.length < HEADER) {
    return `frame is truncated: ${message.length} bytes, the header alone is 9`;
  }
  const type = message[0]!;
  if (type === REQUEST || type > CHANNEL_RESPONSE_FINISH) {
    return `frame type ${type} is not defined for frames sent by a server`;
  }
  const view = new DataView(message.buffer, message.byteOffset, HEADER);
  return {
    type,
    scope: view.getUint32(1),
    channel: view.getUint32(5),
    payload: message.subarray(HEADER),
  };
}

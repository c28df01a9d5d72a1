/**
 * One multipart message in one WebSocket binary message (for a browser viewer behind a bridge):
 * a uint32 little-endian frame count, then for each frame a uint32 little-endian length and the
 * bytes.
 * @module
 */

import { WireError } from "./errors.js";

const utf8 = new TextEncoder();

function bytesOf(frame, i) {
  if (typeof frame === "string") return utf8.encode(frame);
  if (ArrayBuffer.isView(frame)) return new Uint8Array(frame.buffer, frame.byteOffset, frame.byteLength);
  if (frame instanceof ArrayBuffer) return new Uint8Array(frame);
  throw new TypeError(`frame ${i} is not bytes or a string`);
}

/**
 * Pack frames into one buffer (strings are UTF-8 encoded).
 * @param {ArrayLike<Uint8Array | ArrayBuffer | string>} frames
 * @returns {Uint8Array} a fresh buffer (its `.buffer` holds exactly the packed bytes)
 */
export function packFrames(frames) {
  const parts = Array.from(frames, bytesOf);
  const total = parts.reduce((n, p) => n + 4 + p.byteLength, 4);
  const out = new Uint8Array(total);
  const view = new DataView(out.buffer);
  view.setUint32(0, parts.length, true);
  let pos = 4;
  for (const p of parts) {
    view.setUint32(pos, p.byteLength, true);
    out.set(p, pos + 4);
    pos += 4 + p.byteLength;
  }
  return out;
}

/**
 * Split a packed buffer into its frames (views of `data`, no copies). Throws WireError `frames`
 * when the buffer is truncated, has bytes left over, or holds more frames than `maxFrames`
 * (default 2 + 16 parts, what the decoder accepts), and `too_large` over `maxBytes`.
 * @param {ArrayBuffer | Uint8Array} data
 * @param {{maxFrames?: number, maxBytes?: number}} [options]
 * @returns {Uint8Array[]}
 */
export function unpackFrames(data, { maxFrames = 18, maxBytes = 64 * 1024 * 1024 + 4 * 19 } = {}) {
  const bytes = bytesOf(data, 0);
  if (bytes.byteLength > maxBytes) {
    throw new WireError(`packed message of ${bytes.byteLength} bytes exceeds the ${maxBytes}-byte limit`, "too_large");
  }
  if (bytes.byteLength < 4) throw new WireError("packed message shorter than its frame count", "frames");
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  const count = view.getUint32(0, true);
  if (count > maxFrames) throw new WireError(`packed message of ${count} frames; at most ${maxFrames}`, "frames");
  const frames = [];
  let pos = 4;
  for (let i = 0; i < count; i++) {
    if (pos + 4 > bytes.byteLength) throw new WireError(`packed message truncated at frame ${i}`, "frames");
    const length = view.getUint32(pos, true);
    if (length > bytes.byteLength - pos - 4) throw new WireError(`frame ${i} of ${length} bytes is truncated`, "frames");
    frames.push(bytes.subarray(pos + 4, pos + 4 + length));
    pos += 4 + length;
  }
  if (pos !== bytes.byteLength) throw new WireError(`${bytes.byteLength - pos} bytes after the last frame`, "frames");
  return frames;
}

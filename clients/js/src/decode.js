/**
 * The sapiens2-stream wire format (docs/WIRE.md): a pure decoder that treats every message as
 * hostile. Sizes are checked with exact integer arithmetic against the limits before anything
 * is allocated, image sizes are read from the PNG/JPEG header bytes, and every header field the
 * format defines is type-checked, in the order of the Python reference decoder
 * (`sapiens2_client.wire.decode`), with the same refusal reasons.
 *
 * No Node-only API: this module (and what it imports) is the browser build.
 * @module
 */

import { WireError, show } from "./errors.js";
import { checkFrameFields, checkStatusFields, isValidSourceId } from "./fields.js";
import { loadHeader } from "./header.js";
import { toMessage } from "./messages.js";
import { decodePart } from "./parts.js";
import { UINT64_MAX, define, equalsInt, get, has, isInt, toPlain } from "./values.js";

export { REASONS, WireError } from "./errors.js";
export { isValidSourceId } from "./fields.js";
export { ImageHeaderError, jpegInfo, pngInfo } from "./images.js";
export { IMAGE_PART, KEYPOINT3D_PARTS, KEYPOINT_PARTS, Keypoints3D, WORLD_PARTS, membersOf, toMessage } from "./messages.js";
export { RAW_DTYPES } from "./parts.js";
export { packFrames, unpackFrames } from "./framing.js";

export const SCHEMA = "sapiens2.stream";
export const SCHEMA_VERSION = 1;
export const KINDS = Object.freeze(["keypoints", "frame", "seg", "matte", "status", "world"]);
export const IMAGE_KINDS = Object.freeze(["frame", "seg", "matte"]);
export const ENCODINGS = Object.freeze(["raw", "jpeg", "png"]);
export const DEFAULT_MAX_MESSAGE_BYTES = 64 * 1024 * 1024;
/** Where a pipeline publishes by default, and a broker's two sides. */
export const DEFAULT_ENDPOINT = "tcp://127.0.0.1:5555";
export const BROKER_XSUB = "tcp://127.0.0.1:5556";
export const BROKER_XPUB = "tcp://127.0.0.1:5557";

/**
 * What a receiver accepts (Python's `wire.Limits`); every check happens before the allocation it guards.
 * @type {Readonly<import("../index").Limits>}
 */
export const DEFAULT_LIMITS = Object.freeze({
  maxMessageBytes: DEFAULT_MAX_MESSAGE_BYTES, // all frames of one message together
  maxHeaderBytes: 64 * 1024,
  maxParts: 16,
  maxDims: 4,
  maxArrayBytes: 256 * 1024 * 1024, // one decoded part (a PNG decodes to more than it weighs)
  maxPixels: 64 * 1024 * 1024, // one image part: width * height
  maxHeaderDepth: 4, // header -> parts -> part -> shape
});

const ascii = new TextDecoder(); // only ever given bytes < 0x80

/** The defaults with `limits` laid over them. */
export function makeLimits(limits) {
  return limits ? Object.freeze({ ...DEFAULT_LIMITS, ...limits }) : DEFAULT_LIMITS;
}

/** A frame as a plain Uint8Array view (Node Buffers, other views and ArrayBuffers are accepted). */
function asBytes(frame, i) {
  if (ArrayBuffer.isView(frame)) return new Uint8Array(frame.buffer, frame.byteOffset, frame.byteLength);
  if (frame instanceof ArrayBuffer) return new Uint8Array(frame);
  throw new TypeError(`frame ${i} is not bytes (Uint8Array, Buffer or ArrayBuffer)`);
}

/**
 * Validate and decode the multipart frames of one message: `{topic, kind, source_id, header, arrays}`
 * (Python's `wire.decode`). The header is plain JavaScript (integers beyond 2^53 as bigint).
 * Throws WireError, and nothing else for bad bytes (a TypeError when `frames` is not a list of bytes).
 * @param {ArrayLike<Uint8Array | ArrayBuffer>} frames
 * @param {Partial<import("../index").Limits>} [limits]
 * @param {number} [expectedVersion]
 */
export function decode(frames, limits, expectedVersion = SCHEMA_VERSION) {
  const lim = makeLimits(limits);
  if (!frames || typeof frames.length !== "number") throw new TypeError("frames must be an array of bytes");
  const parts = Array.from(frames, asBytes);
  const size = parts.reduce((n, f) => n + f.byteLength, 0);
  if (size > lim.maxMessageBytes) {
    throw new WireError(`message of ${size} bytes exceeds the ${lim.maxMessageBytes}-byte limit`, "too_large");
  }
  if (parts.length < 2) throw new WireError(`expected [topic, header, part...], got ${parts.length} frame(s)`, "frames");
  if (parts.length - 2 > lim.maxParts) {
    throw new WireError(`${parts.length - 2} parts; at most ${lim.maxParts} are accepted`, "frames");
  }
  if (parts[0].some((b) => b > 0x7f)) throw new WireError("topic is not ASCII", "topic");
  const topic = ascii.decode(parts[0]);
  const header = loadHeader(parts[1], lim);
  if (get(header, "schema") !== SCHEMA) {
    throw new WireError(`schema ${show(get(header, "schema"), 40)} is not ${show(SCHEMA)}`, "schema");
  }
  if (!equalsInt(get(header, "version"), expectedVersion)) {
    throw new WireError(`publisher speaks ${SCHEMA} version ${show(get(header, "version"), 20)}, this subscriber `
      + `reads version ${expectedVersion}; install matching sapiens2-stream versions on both ends`, "version");
  }
  const kind = get(header, "kind");
  const sourceId = get(header, "source_id");
  if (!KINDS.includes(kind) || !isValidSourceId(sourceId)) {
    throw new WireError(`bad kind ${show(kind, 40)} or source_id ${show(sourceId)}`, "field");
  }
  if (topic !== `${kind}.${sourceId}`) {
    throw new WireError(`topic ${show(topic)} does not match header kind/source ${kind}/${sourceId}`, "topic");
  }
  if (!isInt(get(header, "publish_ns", 0), 0n, UINT64_MAX)) throw new WireError("publish_ns must be an unsigned integer");
  if (kind === "status") checkStatusFields(header);
  else checkFrameFields(header);
  const descs = get(header, "parts", []);
  if (!Array.isArray(descs) || descs.length !== parts.length - 2) {
    throw new WireError(`header describes ${show(descs)} parts but ${parts.length - 2} were sent`, "parts");
  }
  const arrays = {};
  descs.forEach((desc, i) => {
    const [name, array] = decodePart(desc, parts[i + 2], lim);
    if (has(arrays, name)) throw new WireError(`part ${show(name)} appears twice`, "parts");
    define(arrays, name, array);
  });
  return { topic, kind, source_id: sourceId, header: toPlain(header), arrays };
}

/**
 * Validate and decode one multipart message into its typed record (Python's `decode_message`):
 * a KeypointsMessage, FrameMessage, SegMessage, MatteMessage, StatusMessage or WorldMessage.
 * Throws WireError (with `.reason`) when the message is refused.
 * @param {ArrayLike<Uint8Array | ArrayBuffer>} frames
 * @param {Partial<import("../index").Limits>} [limits]
 */
export function decodeMessage(frames, limits) {
  return toMessage(decode(frames, limits));
}

/** Seconds of a per-frame message's pts (pts × num / den), or null without pts or time_base. */
export function ptsSeconds(meta) {
  if (meta.pts === null || meta.time_base === null) return null;
  return (Number(meta.pts) * meta.time_base[0]) / meta.time_base[1];
}

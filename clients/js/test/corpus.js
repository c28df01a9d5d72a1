// Hand-made hostile (and tricky but valid) messages with the outcome the decoder must give.
// hostile.test.js checks them against this package; parity.test.js against the Python reference
// decoder too: `reason` is the expected refusal ("ok": accepted), `python` the reference's outcome
// where it differs on purpose (see `note`), "crash" when the reference raises something other than
// WireError (a bug there).

import { Ext, F, I, pack } from "./pack.js";

const utf8 = new TextEncoder();
const bytes = (s) => utf8.encode(s);
const CAPTURE_NS = 1764579600123456789n;

const f32 = (n, fill = 1.5) => new Uint8Array(new Float32Array(n).fill(fill).buffer);
const i64 = (n) => new Uint8Array(new BigInt64Array(n).fill(-1n).buffer);

/** The five part descriptors of a keypoints message with N=1, K=2. */
const kpParts = () => [
  { name: "keypoints", encoding: "raw", dtype: "<f4", shape: [1, 2, 2] },
  { name: "keypoint_scores", encoding: "raw", dtype: "<f4", shape: [1, 2] },
  { name: "boxes", encoding: "raw", dtype: "<f4", shape: [1, 4] },
  { name: "box_scores", encoding: "raw", dtype: "<f4", shape: [1] },
  { name: "track_ids", encoding: "raw", dtype: "<i8", shape: [1] },
];
const kpData = () => [f32(4), f32(2), f32(4), f32(1), i64(1)];

/** The header of a valid keypoints message for N=1, K=2. */
export const keypointsHeader = (parts = kpParts()) => ({
  schema: "sapiens2.stream", version: 1, kind: "keypoints", source_id: "cam0", frame_index: 42, pts: 21504,
  time_base: [1, 15360], capture_ns: CAPTURE_NS, latency_ms: { upload: 0.5, pose: 11.5 },
  drops: { source: 3, publish_frame: 1 }, width: 64, height: 48, random_weights: false, session: 1,
  num_persons: 1, num_keypoints: 2, publish_ns: CAPTURE_NS + 40000000n, parts,
});

/** A valid keypoints message for N=1, K=2, with header `over`rides (a value of undefined deletes a key). */
export function keypoints(over = {}, { parts, data, format = "msgpack" } = {}) {
  return message(keypointsHeader(parts), over, data ?? kpData(), format);
}

const i32 = (...values) => new Uint8Array(Int32Array.from(values).buffer);
const u8 = (n, fill = 1) => new Uint8Array(n).fill(fill);

/** The seven part descriptors of a world message with N=1, K=2, C=2 cameras and S=1. */
const worldParts = () => [
  { name: "world_keypoints", encoding: "raw", dtype: "<f4", shape: [1, 2, 3] },
  { name: "world_valid", encoding: "raw", dtype: "|u1", shape: [1, 2] },
  { name: "world_error", encoding: "raw", dtype: "<f4", shape: [1, 2] },
  { name: "world_views", encoding: "raw", dtype: "|u1", shape: [1, 2] },
  { name: "world_ids", encoding: "raw", dtype: "<i8", shape: [1] },
  { name: "world_members", encoding: "raw", dtype: "<i4", shape: [1, 2] },
  { name: "single_view", encoding: "raw", dtype: "<i4", shape: [1, 2] },
];
const worldData = (members = i32(0, -1), single = i32(1, 0)) => [f32(6), u8(2), f32(2), u8(2, 2), i64(1), members,
  single];

/** A valid world message (N=1, K=2, cameras a and b, b's person seen alone) with header `over`rides. */
export function world(over = {}, { parts, data, format = "msgpack" } = {}) {
  const header = {
    schema: "sapiens2.stream", version: 1, kind: "world", source_id: "rig", frame_index: 3, pts: null, time_base: null,
    capture_ns: CAPTURE_NS, latency_ms: { triangulate: new F(0.75) }, drops: { source: 0 }, width: 0, height: 0,
    random_weights: false, session: 0, num_persons: 1, num_keypoints: 2, units: "m", cameras: ["a", "b"],
    camera_frames: { a: 10 }, publish_ns: CAPTURE_NS, parts: parts ?? worldParts(),
  };
  return message(header, over, data ?? worldData(), format);
}

/** A valid status message with header overrides. */
export function status(over = {}, { format = "msgpack" } = {}) {
  const header = {
    schema: "sapiens2.stream", version: 1, kind: "status", source_id: "cam0", fps: new F(29.75), health: "ok",
    frames: 10, last_frame_index: 9, drops: { source: 0 }, sent: { keypoints: 10 }, uptime_s: new F(1.5),
    nominal_fps: new F(30), width: 64, height: 48, live: true, random_weights: true,
    event: { event: "resumed", time_ns: CAPTURE_NS, session: 1 }, publish_ns: CAPTURE_NS, parts: [],
  };
  return message(header, over, [], format);
}

/** An image message (frame/seg/matte) with one part. */
export function image(kind, desc, data, over = {}) {
  const header = {
    schema: "sapiens2.stream", version: 1, kind, source_id: "cam0", frame_index: 7, capture_ns: CAPTURE_NS,
    publish_ns: CAPTURE_NS, parts: [desc],
  };
  return message(header, over, [data]);
}

function message(header, over, data, format = "msgpack") {
  const h = { ...header };
  for (const [k, v] of Object.entries(over)) {
    if (v === undefined) delete h[k];
    else Object.defineProperty(h, k, { value: v, enumerable: true, writable: true, configurable: true });
  }
  const topic = `${h.kind}.${h.source_id}`;
  return [bytes(typeof h.kind === "string" && typeof h.source_id === "string" ? topic : "keypoints.cam0"),
    format === "json" ? bytes(json(h)) : pack(h), ...data];
}

/** JSON text of a header (bigints as digits, F as a float with a fraction or exponent). */
export function json(value) {
  if (value instanceof F) {
    if (Number.isNaN(value.value)) return "NaN";
    if (!Number.isFinite(value.value)) return value.value > 0 ? "Infinity" : "-Infinity";
    const text = String(value.value);
    return /[.eE]/.test(text) ? text : `${text}.0`;
  }
  if (typeof value === "bigint") return value.toString();
  if (Array.isArray(value)) return `[${value.map(json).join(",")}]`;
  if (value !== null && typeof value === "object") {
    return `{${Object.entries(value).map(([k, v]) => `${JSON.stringify(k)}:${json(v)}`).join(",")}}`;
  }
  return JSON.stringify(value);
}

/** A PNG whose IHDR says what we like (the pixel data may be far smaller: an image bomb). */
export function png(width, height, { color = 0, depth = 8, signature = true } = {}) {
  const out = [0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, signature ? 0x0a : 0x00];
  const be32 = (n) => [(n >>> 24) & 0xff, (n >>> 16) & 0xff, (n >>> 8) & 0xff, n & 0xff];
  out.push(...be32(13), ...bytes("IHDR"), ...be32(width), ...be32(height), depth, color, 0, 0, 0, 0, 0, 0, 0);
  out.push(...be32(0), ...bytes("IEND"), 0, 0, 0, 0);
  return Uint8Array.from(out);
}

/** A JPEG made of just the markers given (SOI first). */
export function jpeg(...segments) {
  return Uint8Array.from([0xff, 0xd8, ...segments.flat()]);
}

/** A baseline SOF0 segment for width x height with `components` channels. */
export const sof0 = (width, height, components = 3, precision = 8) => [
  0xff, 0xc0, 0x00, 8 + 3 * components, precision, height >> 8, height & 0xff, width >> 8, width & 0xff, components,
  ...Array.from({ length: components }, (_, i) => [i + 1, 0x11, 0]).flat(),
];

const pngPart = (shape, dtype = "|u1") => ({ name: "classes", encoding: "png", dtype, shape });
const jpegPart = (shape, dtype = "|u1") => ({ name: "image", encoding: "jpeg", dtype, shape, color: "rgb" });
const deep = (levels) => {
  let v = 1;
  for (let i = 0; i < levels; i++) v = [v];
  return v;
};

/** @type {{name: string, frames: Uint8Array[], reason: string, python?: string, note?: string}[]} */
export const CASES = [
  // -- integers versus floats, ranges --------------------------------------------------------
  { name: "valid keypoints", frames: keypoints(), reason: "ok" },
  { name: "valid keypoints, JSON header", frames: keypoints({}, { format: "json" }), reason: "ok" },
  { name: "frame_index a float 42.0", frames: keypoints({ frame_index: new F(42) }), reason: "field" },
  { name: "frame_index a float32 42.0", frames: keypoints({ frame_index: new F(42, 32) }), reason: "field" },
  { name: "frame_index true", frames: keypoints({ frame_index: true }), reason: "field" },
  { name: "frame_index missing", frames: keypoints({ frame_index: undefined }), reason: "field" },
  { name: "frame_index 42 in a uint64", frames: keypoints({ frame_index: new I(42, 0xcf) }), reason: "ok" },
  { name: "frame_index 42 in an int8", frames: keypoints({ frame_index: new I(42, 0xd0) }), reason: "ok" },
  { name: "frame_index 2^63-1", frames: keypoints({ frame_index: 2n ** 63n - 1n }), reason: "ok" },
  { name: "frame_index 2^63", frames: keypoints({ frame_index: 2n ** 63n }), reason: "field" },
  { name: "frame_index -1", frames: keypoints({ frame_index: -1 }), reason: "field" },
  { name: "pts nil", frames: keypoints({ pts: null }), reason: "ok" },
  { name: "pts -2^63", frames: keypoints({ pts: -(2n ** 63n) }), reason: "ok" },
  { name: "pts 1.5", frames: keypoints({ pts: new F(1.5) }), reason: "field" },
  { name: "time_base nil", frames: keypoints({ time_base: null }), reason: "ok" },
  { name: "time_base [1, 2^31]", frames: keypoints({ time_base: [1, 2 ** 31] }), reason: "ok" },
  { name: "time_base [1, 2^31+1]", frames: keypoints({ time_base: [1, 2 ** 31 + 1] }), reason: "field" },
  { name: "time_base [1.0, 2]", frames: keypoints({ time_base: [new F(1), 2] }), reason: "field" },
  { name: "time_base of three", frames: keypoints({ time_base: [1, 2, 3] }), reason: "field" },
  { name: "time_base a string", frames: keypoints({ time_base: "1/30" }), reason: "field" },
  { name: "capture_ns 2^64-1", frames: keypoints({ capture_ns: 2n ** 64n - 1n }), reason: "ok" },
  { name: "capture_ns a float", frames: keypoints({ capture_ns: new F(1e18) }), reason: "field" },
  { name: "session -1", frames: keypoints({ session: -1 }), reason: "field" },
  { name: "latency an int", frames: keypoints({ latency_ms: { pose: 3 } }), reason: "ok" },
  { name: "latency NaN", frames: keypoints({ latency_ms: { pose: new F(NaN) } }), reason: "field" },
  { name: "latency infinite", frames: keypoints({ latency_ms: { pose: new F(Infinity) } }), reason: "field" },
  { name: "latency_ms nil", frames: keypoints({ latency_ms: null }), reason: "field" },
  { name: "latency_ms a list", frames: keypoints({ latency_ms: [1] }), reason: "field" },
  { name: "latency_ms a bool value", frames: keypoints({ latency_ms: { pose: true } }), reason: "field" },
  { name: "latency_ms with a bytes key", frames: keypoints({ latency_ms: new Map([[bytes("pose"), 1]]) }),
    reason: "field" },
  { name: "drops negative", frames: keypoints({ drops: { source: -1 } }), reason: "field" },
  { name: "drops a float", frames: keypoints({ drops: { source: new F(1) } }), reason: "field" },
  { name: "width 2^31", frames: keypoints({ width: 2 ** 31 }), reason: "ok" },
  { name: "width 2^31+1", frames: keypoints({ width: 2 ** 31 + 1 }), reason: "field" },
  { name: "height nil", frames: keypoints({ height: null }), reason: "field" },
  { name: "random_weights 0", frames: keypoints({ random_weights: 0 }), reason: "field" },
  { name: "num_persons a string", frames: keypoints({ num_persons: "1" }), reason: "field" },
  { name: "publish_ns -1", frames: keypoints({ publish_ns: -1 }), reason: "field" },
  { name: "publish_ns nil", frames: keypoints({ publish_ns: null }), reason: "field" },
  { name: "publish_ns absent", frames: keypoints({ publish_ns: undefined }), reason: "ok" },
  { name: "status valid", frames: status(), reason: "ok" },
  { name: "status fps an int", frames: status({ fps: 30 }), reason: "ok" },
  { name: "status fps infinite", frames: status({ fps: new F(Infinity) }), reason: "field" },
  { name: "status fps missing", frames: status({ fps: undefined }), reason: "field" },
  { name: "status health an int", frames: status({ health: 5 }), reason: "field" },
  { name: "status frames a float", frames: status({ frames: new F(10) }), reason: "field" },
  { name: "status last_frame_index -1", frames: status({ last_frame_index: -1 }), reason: "ok" },
  { name: "status last_frame_index -2", frames: status({ last_frame_index: -2 }), reason: "field" },
  { name: "status nominal_fps nil", frames: status({ nominal_fps: null }), reason: "ok" },
  { name: "status uptime_s a string", frames: status({ uptime_s: "1" }), reason: "field" },
  { name: "status sent negative", frames: status({ sent: { keypoints: -1 } }), reason: "field" },
  { name: "status live 1", frames: status({ live: 1 }), reason: "field" },
  { name: "status event not a map", frames: status({ event: "x" }), reason: "field" },
  { name: "status event time_ns a float", frames: status({ event: { event: "stalled", time_ns: new F(1.5) } }),
    reason: "field" },
  { name: "status event time_ns a string", frames: status({ event: { event: "stalled", time_ns: "x" } }),
    reason: "field" },
  { name: "status event without a name", frames: status({ event: { time_ns: 1 } }), reason: "field" },
  { name: "status event holding bytes", frames: status({ event: { event: "x", note: [new TextEncoder().encode("b")] } }),
    reason: "field" },
  { name: "status event ok", frames: status({ event: { event: "resumed", time_ns: 1, outage_s: new F(2.5) } }),
    reason: "ok" },
  { name: "status with a part", frames: [...status({ parts: [] }), new Uint8Array(1)], reason: "parts" },
  // -- schema, version, kind, source, topic ---------------------------------------------------
  { name: "version 1.0", frames: keypoints({ version: new F(1) }), reason: "ok" },
  { name: "version true (Python: True == 1)", frames: keypoints({ version: true }), reason: "ok" },
  { name: "version '1'", frames: keypoints({ version: "1" }), reason: "version" },
  { name: "version missing", frames: keypoints({ version: undefined }), reason: "version" },
  { name: "schema missing", frames: keypoints({ schema: undefined }), reason: "schema" },
  { name: "schema as bytes", frames: keypoints({ schema: bytes("sapiens2.stream") }), reason: "schema" },
  { name: "kind unknown", frames: keypoints({ kind: "other" }), reason: "field" },
  { name: "kind an int", frames: keypoints({ kind: 1 }), reason: "field" },
  { name: "source_id of 64", frames: keypoints({ source_id: "a".repeat(64) }), reason: "ok" },
  { name: "source_id of 65", frames: keypoints({ source_id: "a".repeat(65) }), reason: "field" },
  { name: "source_id empty", frames: keypoints({ source_id: "" }), reason: "field" },
  { name: "source_id with a dot", frames: keypoints({ source_id: "cam.0" }), reason: "field" },
  { name: "source_id with : _ -", frames: keypoints({ source_id: "rtsp:cam_0-a" }), reason: "ok" },
  { name: "source_id ending in a newline", frames: keypoints({ source_id: "cam0\n" }), reason: "field" },
  { name: "topic of another case", frames: [bytes("Keypoints.cam0"), ...keypoints().slice(1)], reason: "topic" },
  { name: "topic with a trailing dot", frames: [bytes("keypoints.cam0."), ...keypoints().slice(1)], reason: "topic" },
  { name: "topic empty", frames: [new Uint8Array(0), ...keypoints().slice(1)], reason: "topic" },
  // -- header bytes ---------------------------------------------------------------------------
  { name: "header empty", frames: [bytes("keypoints.cam0"), new Uint8Array(0)], reason: "header" },
  { name: "header truncated", frames: [bytes("keypoints.cam0"), keypoints()[1].subarray(0, 40)], reason: "header" },
  { name: "header with bytes after it", frames: [bytes("keypoints.cam0"),
    Uint8Array.from([...keypoints()[1], 0xc0]), ...keypoints().slice(2)], reason: "header" },
  { name: "header with a timestamp extension", frames: keypoints({ at: new Ext(-1, new Uint8Array(4)) }),
    reason: "header" },
  { name: "header with an extension", frames: keypoints({ at: new Ext(5, new Uint8Array(1)) }), reason: "header" },
  { name: "header with an int key", frames: [bytes("keypoints.cam0"),
    pack(new Map([["schema", "sapiens2.stream"], [1, 2]]))], reason: "header" },
  { name: "header with a float key", frames: [bytes("keypoints.cam0"), pack(new Map([[new F(1.5), 2]]))],
    reason: "header" },
  { name: "header with a nil key", frames: [bytes("keypoints.cam0"), pack(new Map([[null, 2]]))], reason: "header" },
  { name: "header with a nested bytes key (ignored)", frames: keypoints({ extra: new Map([[bytes("k"), 1]]) }),
    reason: "ok" },
  { name: "header with a bytes key 'schema' (not the str key)", frames: [bytes("keypoints.cam0"),
    pack(new Map([...Object.entries(keypointsHeader()), [bytes("schema"), "x"]])), ...kpData()], reason: "ok" },
  { name: "header with only a bytes key 'schema'", frames: [bytes("keypoints.cam0"),
    pack(new Map([...Object.entries(keypointsHeader()).filter(([k]) => k !== "schema"),
      [bytes("schema"), "sapiens2.stream"]])), ...kpData()], reason: "schema" },
  { name: "header with a __proto__ key", frames: keypoints({ ["__proto__"]: { polluted: 1 } }), reason: "ok" },
  { name: "header with invalid UTF-8", frames: [bytes("keypoints.cam0"),
    Uint8Array.from([0x81, 0xa6, ...bytes("schema"), 0xa2, 0xff, 0xfe])], reason: "header" },
  { name: "header with an encoded surrogate", frames: patch(keypoints({ note: "XYZ" }), "XYZ", [0xed, 0xa0, 0x80]),
    reason: "header" },
  { name: "header with an overlong encoding", frames: patch(keypoints({ note: "XY" }), "XY", [0xc0, 0xaf]),
    reason: "header" },
  { name: "header with a 4-byte character", frames: keypoints({ note: "\u{1F600}" }), reason: "ok" },
  { name: "header string with a BOM", frames: keypoints({ note: "\uFEFFhello" }), reason: "ok" },
  { name: "header a list", frames: [bytes("keypoints.cam0"), pack([1, 2])], reason: "header" },
  { name: "header a string", frames: [bytes("keypoints.cam0"), pack("x")], reason: "header" },
  { name: "header map of 2^32-1 entries", frames: [bytes("keypoints.cam0"),
    Uint8Array.from([0xdf, 0xff, 0xff, 0xff, 0xff])], reason: "header" },
  { name: "header array of 70000", frames: [bytes("keypoints.cam0"),
    Uint8Array.from([0x81, 0xa1, 0x78, 0xdd, 0x00, 0x01, 0x11, 0x70])], reason: "header" },
  { name: "header nested 10000 deep", frames: [bytes("keypoints.cam0"),
    Uint8Array.from([0x81, 0xa1, 0x78, ...new Array(10000).fill(0x91), 0x01])], reason: "header" },
  { name: "header nested 5 deep", frames: keypoints({ x: deep(4) }), reason: "header" },
  { name: "header nested 4 deep", frames: keypoints({ x: deep(3) }), reason: "ok" },
  { name: "header of 64 KiB + 1", frames: sized(65537), reason: "too_large" },
  { name: "header of 64 KiB", frames: sized(65536), reason: "ok" },
  // -- JSON headers ---------------------------------------------------------------------------
  { name: "JSON frame_index 42.0", frames: keypoints({ frame_index: new F(42) }, { format: "json" }), reason: "field" },
  { name: "JSON frame_index 4.2e1", frames: jsonKeypoints(['"frame_index":42', '"frame_index":4.2e1']),
    reason: "field" },
  { name: "JSON frame_index 42e0", frames: jsonKeypoints(['"frame_index":42', '"frame_index":42e0']), reason: "field" },
  { name: "JSON frame_index -0", frames: jsonKeypoints(['"frame_index":42', '"frame_index":-0']), reason: "ok" },
  { name: "JSON version 1.0", frames: keypoints({ version: new F(1) }, { format: "json" }), reason: "ok" },
  { name: "JSON fps NaN", frames: jsonStatus({ fps: new F(NaN) }), reason: "field" },
  { name: "JSON fps Infinity", frames: jsonStatus({ fps: new F(Infinity) }), reason: "field" },
  { name: "JSON fps -Infinity", frames: jsonStatus({ fps: new F(-Infinity) }), reason: "field" },
  { name: "JSON fps 1e400", frames: jsonStatus({}, ["29.75", "1e400"]), reason: "field" },
  { name: "JSON fps 1E1", frames: jsonStatus({}, ["29.75", "1E1"]), reason: "ok" },
  { name: "JSON fps -0", frames: jsonStatus({}, ["29.75", "-0"]), reason: "ok" },
  { name: "JSON fps 01", frames: jsonStatus({}, ["29.75", "01"]), reason: "header" },
  { name: "JSON fps .5", frames: jsonStatus({}, ["29.75", ".5"]), reason: "header" },
  { name: "JSON fps 1.", frames: jsonStatus({}, ["29.75", "1."]), reason: "header" },
  { name: "JSON fps +1", frames: jsonStatus({}, ["29.75", "+1"]), reason: "header" },
  { name: "JSON capture_ns exact", frames: keypoints({ capture_ns: 2n ** 64n - 1n }, { format: "json" }), reason: "ok" },
  { name: "JSON capture_ns 2^64", frames: keypoints({ capture_ns: 2n ** 64n }, { format: "json" }), reason: "field" },
  { name: "JSON an int of 4300 digits", frames: keypoints({ big: BigInt("9".repeat(4300)) }, { format: "json" }),
    reason: "ok" },
  { name: "JSON an int of 4301 digits", frames: keypoints({ big: BigInt("9".repeat(4301)) }, { format: "json" }),
    reason: "header" },
  { name: "JSON fps an int of 400 digits", frames: jsonStatus({ fps: BigInt("9".repeat(400)) }), reason: "field" },
  { name: "JSON a control character in a string", frames: jsonStatus({ health: "o\nk" }, ["o\\nk", "o\nk"]),
    reason: "header" },
  { name: "JSON escapes", frames: jsonStatus({ health: "\"\\/\b\f\n\r\t\u00e9\ud83d\ude00" }), reason: "ok" },
  { name: "JSON \\u escapes", frames: jsonStatus({}, ['"ok"', '"\\u00e9\\ud83d\\ude00\\/\\u0041"']), reason: "ok" },
  { name: "JSON a lone surrogate escape", frames: jsonStatus({}, ['"ok"', '"\\ud800"']), reason: "header" },
  { name: "JSON a bad escape", frames: jsonStatus({}, ['"ok"', '"\\x41"']), reason: "header" },
  { name: "JSON a short \\u escape", frames: jsonStatus({}, ['"ok"', '"\\u41"']), reason: "header" },
  { name: "JSON a trailing comma", frames: jsonStatus({}, ['"parts":[]', '"parts":[],']), reason: "header" },
  { name: "JSON a trailing comma in a list", frames: jsonStatus({}, ['"parts":[]', '"parts":[1,]']), reason: "header" },
  { name: "JSON a non-string key", frames: jsonStatus({}, ['"fps"', '1:2,"fps"']), reason: "header" },
  { name: "JSON single quotes", frames: jsonStatus({}, ['"ok"', "'ok'"]), reason: "header" },
  { name: "JSON duplicate keys: the last wins", frames: jsonStatus({}, ['"fps":29.75', '"fps":"x","fps":29.75']),
    reason: "ok" },
  { name: "JSON a __proto__ key", frames: jsonStatus({}, ['"fps"', '"__proto__":{"a":1},"fps"']), reason: "ok" },
  { name: "JSON invalid UTF-8", frames: jsonStatus({}, ['"ok"', '"\xff"'], true), reason: "header" },
  { name: "JSON nested 10000 deep", frames: jsonStatus({}, ['"ok"', "[".repeat(10000) + "]".repeat(10000)]),
    reason: "header" },
  { name: "JSON with whitespace", frames: jsonStatus({}, [",", " ,\n\t\r"]), reason: "ok" },
  { name: "JSON with extra data", frames: [bytes("status.cam0"), bytes(`${json(statusHeader())} x`)], reason: "header" },
  { name: "JSON true/false/null", frames: jsonStatus({ live: false, nominal_fps: null, random_weights: true }),
    reason: "ok" },
  { name: "JSON a bare word", frames: jsonStatus({}, ["true", "tru"]), reason: "header" },
  // -- parts ----------------------------------------------------------------------------------
  { name: "parts not a list", frames: keypoints({ parts: "x" }, { data: [] }), reason: "parts" },
  { name: "parts absent", frames: keypoints({ parts: undefined }, { data: [] }), reason: "parts" },
  { name: "one part too many sent", frames: [...keypoints(), new Uint8Array(0)], reason: "parts" },
  { name: "19 parts", frames: [...keypoints(), ...new Array(14).fill(new Uint8Array(0))], reason: "frames" },
  { name: "descriptor not a map", frames: keypoints({}, { parts: [1], data: [f32(1)] }), reason: "parts" },
  { name: "descriptor without shape", frames: keypoints({}, { parts: [{ name: "x", encoding: "raw", dtype: "<f4" }],
    data: [f32(1)] }), reason: "parts" },
  { name: "descriptor name an int", frames: keypoints({}, { parts: [{ name: 1, encoding: "raw", dtype: "<f4",
    shape: [1] }], data: [f32(1)] }), reason: "parts" },
  { name: "descriptor encoding nil", frames: keypoints({}, { parts: [{ name: "x", encoding: null, dtype: "<f4",
    shape: [1] }], data: [f32(1)] }), reason: "parts" },
  { name: "shape of 5 dims", frames: raw({ shape: [1, 1, 1, 1, 1] }, f32(1)), reason: "shape" },
  { name: "shape a float", frames: raw({ shape: [new F(1)] }, f32(1)), reason: "shape" },
  { name: "shape a bool", frames: raw({ shape: [true] }, f32(1)), reason: "shape" },
  { name: "shape an int", frames: raw({ shape: 1 }, f32(1)), reason: "shape" },
  { name: "shape 2^31+1", frames: raw({ shape: [2 ** 31 + 1] }, f32(1)), reason: "shape" },
  { name: "shape (2^31)^4: exact size, too large", frames: raw({ shape: [2 ** 31, 2 ** 31, 2 ** 31, 2 ** 31] },
    f32(1)), reason: "too_large" },
  { name: "shape [2^31, 0]: zero bytes", frames: raw({ shape: [2 ** 31, 0] }, new Uint8Array(0)), reason: "parts" },
  { name: "shape over the part limit by one byte", frames: raw({ dtype: "|u1", shape: [256 * 1024 * 1024 + 1] },
    new Uint8Array(0)), reason: "too_large" },
  { name: "dtype with a space", frames: raw({ dtype: "<f4 " }, f32(1)), reason: "dtype" },
  { name: "dtype big-endian", frames: raw({ dtype: ">f4" }, f32(1)), reason: "dtype" },
  { name: "dtype an int", frames: raw({ dtype: 4 }, f32(1)), reason: "dtype" },
  { name: "dtype a list", frames: raw({ dtype: ["<f4"] }, f32(1)), reason: "dtype" },
  { name: "encoding unknown, size checked first", frames: raw({ encoding: "gif", shape: [2 ** 31, 2 ** 31] }, f32(1)),
    reason: "too_large" },
  { name: "raw part one byte short", frames: keypoints({}, { data: [f32(4).subarray(1), f32(2), f32(4), f32(1),
    i64(1)] }), reason: "shape" },
  { name: "a part named twice", frames: keypoints({}, { parts: [
    { name: "boxes", encoding: "raw", dtype: "<f4", shape: [1] }, { name: "boxes", encoding: "raw", dtype: "<f4",
      shape: [1] }], data: [f32(1), f32(1)] }), reason: "parts" },
  { name: "a part named twice, the second malformed", frames: keypoints({}, { parts: [
    { name: "boxes", encoding: "raw", dtype: "<f4", shape: [1] }, { name: "boxes", encoding: "raw", dtype: "<f4",
      shape: [2] }], data: [f32(1), f32(1)] }), reason: "shape" },
  { name: "an extra unknown part", frames: keypoints({}, { parts: [...kpParts(),
    { name: "future", encoding: "raw", dtype: "<u8", shape: [0] }], data: [f32(4), f32(2), f32(4), f32(1), i64(1),
    new Uint8Array(0)] }), reason: "ok" },
  { name: "keypoints with all dtypes as extra parts", frames: keypoints({}, { parts: [...kpParts(),
    ...["|u1", "|i1", "<u2", "<i2", "<u4", "<i4", "<u8", "<i8", "<f2", "<f8"].map((dtype, i) => ({
      name: `x${i}`, encoding: "raw", dtype, shape: [3] }))], data: [f32(4), f32(2), f32(4), f32(1), i64(1),
    ...[1, 1, 2, 2, 4, 4, 8, 8, 2, 8].map((size) => new Uint8Array(3 * size).fill(0x3c))] }), reason: "ok" },
  { name: "keypoints with K disagreeing", frames: keypoints({}, { parts: [
    { name: "keypoints", encoding: "raw", dtype: "<f4", shape: [1, 2, 2] },
    { name: "keypoint_scores", encoding: "raw", dtype: "<f4", shape: [1, 1] },
    { name: "boxes", encoding: "raw", dtype: "<f4", shape: [1, 4] },
    { name: "box_scores", encoding: "raw", dtype: "<f4", shape: [1] },
    { name: "track_ids", encoding: "raw", dtype: "<i8", shape: [1] }], data: [f32(4), f32(1), f32(4), f32(1),
    i64(1)] }), reason: "shape" },
  { name: "keypoints with track_ids as float", frames: keypoints({}, { parts: [...kpParts().slice(0, 4),
    { name: "track_ids", encoding: "raw", dtype: "<f8", shape: [1] }] }), reason: "shape" },
  { name: "keypoints with boxes a scalar", frames: keypoints({}, { parts: [...kpParts().slice(0, 2),
    { name: "boxes", encoding: "raw", dtype: "<f4", shape: [] }, ...kpParts().slice(3)],
  data: [f32(4), f32(2), f32(1), f32(1), i64(1)] }), reason: "shape" },
  { name: "keypoints part as PNG", frames: keypoints({}, { parts: [{ name: "keypoints", encoding: "png",
    dtype: "|u1", shape: [2, 2] }, ...kpParts().slice(1)], data: [png(2, 2), f32(2), f32(4), f32(1),
    i64(1)] }), reason: "shape", python: "image", note: "Python fails on the undecodable pixels first" },
  // -- images ---------------------------------------------------------------------------------
  { name: "png header fine", frames: image("seg", pngPart([3, 2]), png(2, 3)), reason: "ok", python: "image",
    note: "pixels are not decoded by this decoder (decodePixels refuses them); Python decodes them at once" },
  { name: "png width and height swapped", frames: image("seg", pngPart([2, 3]), png(2, 3)), reason: "shape" },
  { name: "a frame whose picture is a PNG", frames: image("frame", { ...pngPart([3, 2]), name: "image" }, png(2, 3)),
    reason: "encoding", python: "image", note: "Python fails on the undecodable pixels first" },
  { name: "a seg map that is a JPEG", frames: image("seg", { ...jpegPart([3, 2, 3]), name: "classes" },
    jpeg(sof0(2, 3))), reason: "encoding", python: "image", note: "Python fails on the undecodable pixels first" },
  { name: "png RGB", frames: image("seg", pngPart([3, 2]), png(2, 3, { color: 2 })), reason: "shape" },
  { name: "png colour type 5", frames: image("seg", pngPart([3, 2]), png(2, 3, { color: 5 })), reason: "image" },
  { name: "png 16-bit", frames: image("seg", pngPart([3, 2]), png(2, 3, { depth: 16 })), reason: "shape" },
  { name: "png bad signature", frames: image("seg", pngPart([3, 2]), png(2, 3, { signature: false })),
    reason: "image" },
  { name: "png truncated header", frames: image("seg", pngPart([3, 2]), png(2, 3).subarray(0, 32)), reason: "image" },
  { name: "png shape of 3", frames: image("seg", pngPart([3, 2, 1]), png(2, 3)), reason: "shape" },
  { name: "png dtype <u2", frames: image("seg", pngPart([3, 2], "<u2"), png(2, 3)), reason: "shape" },
  { name: "png bomb 30000^2 declared", frames: image("seg", pngPart([30000, 30000]), png(30000, 30000)),
    reason: "too_large" },
  { name: "png 9000^2 over the pixel limit", frames: image("matte", { ...pngPart([9000, 9000]), name: "alpha" },
    png(9000, 9000)), reason: "too_large" },
  { name: "png 8192^2 at the pixel limit", frames: image("matte", { ...pngPart([8192, 8192]), name: "alpha" },
    png(8192, 8192)), reason: "ok", python: "image", note: "pixels (none here) are decoded by Python only" },
  { name: "jpeg header fine", frames: image("frame", jpegPart([3, 2, 3]), jpeg(sof0(2, 3), [0xff, 0xd9])),
    reason: "ok", python: "image", note: "pixels are not decoded by this decoder" },
  { name: "jpeg gray", frames: image("frame", jpegPart([3, 2, 3]), jpeg(sof0(2, 3, 1))), reason: "shape" },
  { name: "jpeg 12-bit", frames: image("frame", jpegPart([3, 2, 3]), jpeg(sof0(2, 3, 3, 12))), reason: "shape" },
  { name: "jpeg shape (H, W, 4)", frames: image("frame", jpegPart([3, 2, 4]), jpeg(sof0(2, 3))), reason: "shape" },
  { name: "jpeg shape (H, W)", frames: image("frame", jpegPart([3, 2]), jpeg(sof0(2, 3))), reason: "shape" },
  { name: "jpeg shape (H,)", frames: image("frame", jpegPart([3]), jpeg(sof0(2, 3))), reason: "shape" },
  { name: "jpeg after APP0 and fill bytes", frames: image("frame", jpegPart([3, 2, 3]),
    jpeg([0xff, 0xe0, 0x00, 0x04, 0x00, 0x00, 0xff, 0xff], sof0(2, 3))), reason: "ok", python: "image",
  note: "pixels are not decoded by this decoder" },
  { name: "jpeg progressive SOF2", frames: image("frame", jpegPart([3, 2, 3]),
    jpeg(sof0(2, 3).map((b, i) => (i === 1 ? 0xc2 : b)))), reason: "ok", python: "image",
  note: "pixels are not decoded by this decoder" },
  { name: "jpeg scan before the frame header", frames: image("frame", jpegPart([3, 2, 3]),
    jpeg([0xff, 0xda, 0x00, 0x02], sof0(2, 3))), reason: "image" },
  { name: "jpeg SOF truncated", frames: image("frame", jpegPart([3, 2, 3]), jpeg(sof0(2, 3).slice(0, 10))),
    reason: "image" },
  { name: "jpeg segment length 1", frames: image("frame", jpegPart([3, 2, 3]), jpeg([0xff, 0xe0, 0x00, 0x01, 0, 0])),
    reason: "image" },
  { name: "jpeg garbage between segments", frames: image("frame", jpegPart([3, 2, 3]), jpeg([0x00, 0x00, 0x00, 0x00])),
    reason: "image" },
  { name: "jpeg only SOI", frames: image("frame", jpegPart([3, 2, 3]), jpeg()), reason: "image" },
  { name: "jpeg empty", frames: image("frame", jpegPart([3, 2, 3]), new Uint8Array(0)), reason: "image" },
  { name: "jpeg 65535^2 over the pixel limit", frames: image("frame", jpegPart([65535, 65535, 3]),
    jpeg(sof0(65535, 65535))), reason: "too_large" },
  { name: "frame message without its image", frames: image("frame", { ...pngPart([3, 2]), name: "other" }, png(2, 3)),
    reason: "parts", python: "image", note: "Python fails on the undecodable pixels first" },
  { name: "frame image as raw", frames: image("frame", { name: "image", encoding: "raw", dtype: "|u1",
    shape: [1, 2, 3] }, new Uint8Array(6)), reason: "ok" },
  { name: "matte alpha_scale 0", frames: image("matte", { name: "alpha", encoding: "raw", dtype: "|u1",
    shape: [1, 1] }, new Uint8Array(1), { alpha_scale: 0 }), reason: "field" },
  { name: "matte alpha_scale 0.5", frames: image("matte", { name: "alpha", encoding: "raw", dtype: "|u1",
    shape: [1, 1] }, new Uint8Array(1), { alpha_scale: new F(0.5) }), reason: "ok" },
  // -- world ----------------------------------------------------------------------------------
  { name: "world valid", frames: world(), reason: "ok" },
  { name: "world valid, JSON header", frames: world({}, { format: "json" }), reason: "ok" },
  { name: "world without units", frames: world({ units: undefined }), reason: "ok" },
  { name: "world units empty", frames: world({ units: "" }), reason: "field" },
  { name: "world cameras absent", frames: world({ cameras: undefined }), reason: "field" },
  { name: "world cameras a map", frames: world({ cameras: { a: 1 } }), reason: "field" },
  { name: "world camera as bytes", frames: world({ cameras: ["a", bytes("b")] }), reason: "field" },
  { name: "world camera with a dot", frames: world({ cameras: ["a", "b.c"] }), reason: "field" },
  { name: "world cameras repeated", frames: world({ cameras: ["a", "a"] }), reason: "field" },
  { name: "world camera_frames absent", frames: world({ camera_frames: undefined }), reason: "field" },
  { name: "world camera_frames of a camera not in the rig", frames: world({ camera_frames: { c: 1 } }),
    reason: "field" },
  { name: "world camera_frames with a __proto__ key", frames: world({ camera_frames: { ["__proto__"]: 1 } }),
    reason: "field" },
  { name: "world camera_frames with a bytes key", frames: world({ camera_frames: new Map([[bytes("a"), 1]]) }),
    reason: "field" },
  { name: "world camera_frames a float", frames: world({ camera_frames: { a: new F(1) } }), reason: "field" },
  { name: "world camera_frames 2^63-1", frames: world({ camera_frames: { a: 2n ** 63n - 1n } }), reason: "ok" },
  { name: "world num_persons negative", frames: world({ num_persons: -1 }), reason: "field" },
  { name: "world with a part missing", frames: world({}, { parts: worldParts().slice(0, 6),
    data: worldData().slice(0, 6) }), reason: "parts" },
  { name: "world with one camera more than the members' columns", frames: world({ cameras: ["a", "b", "c"] }),
    reason: "shape" },
  { name: "world member -2", frames: world({}, { data: worldData(i32(0, -2)) }), reason: "shape" },
  { name: "world member 2^31-1", frames: world({}, { data: worldData(i32(2 ** 31 - 1, -1)) }), reason: "ok" },
  { name: "world single_view column C", frames: world({}, { data: worldData(undefined, i32(2, 0)) }),
    reason: "shape" },
  { name: "world single_view column -1", frames: world({}, { data: worldData(undefined, i32(-1, 0)) }),
    reason: "shape" },
  { name: "world single_view person -1", frames: world({}, { data: worldData(undefined, i32(0, -1)) }),
    reason: "shape" },
  { name: "world single_view of three columns", frames: world({}, { parts: [...worldParts().slice(0, 6),
    { name: "single_view", encoding: "raw", dtype: "<i4", shape: [1, 3] }],
  data: [...worldData().slice(0, 6), i32(0, 0, 0)] }), reason: "shape" },
  { name: "world valid as a PNG", frames: world({}, { parts: [worldParts()[0],
    { name: "world_valid", encoding: "png", dtype: "|u1", shape: [1, 2] }, ...worldParts().slice(2)],
  data: [f32(6), png(2, 1), ...worldData().slice(2)] }), reason: "shape", python: "image",
  note: "this decoder reads no pixels: a picture is never a typed part here; Python fails on the undecodable pixels" },
  { name: "frame annotated 1", frames: image("frame", { name: "image", encoding: "raw", dtype: "|u1",
    shape: [1, 1, 3] }, new Uint8Array(3), { annotated: 1 }), reason: "field" },
];

/** Frames with the bytes of `marker` in the header frame replaced by `replacement` (same length). */
function patch(frames, marker, replacement) {
  const header = frames[1].slice();
  const m = bytes(marker);
  const at = header.findIndex((_, i) => m.every((b, k) => header[i + k] === b));
  header.set(replacement, at);
  return [frames[0], header, ...frames.slice(2)];
}

/** A valid keypoints message whose header frame is exactly `size` bytes (padded with an unknown key). */
function sized(size) {
  const base = keypoints({ pad: "" })[1].length; // "pad" key and an empty str: fixstr
  for (let n = size - base - 2; n <= size - base; n++) {
    const frames = keypoints({ pad: "x".repeat(n) });
    if (frames[1].length === size) return frames;
  }
  throw new Error(`corpus: cannot size a header to ${size}`);
}

/** A valid keypoints message with a JSON header whose text gets `replace` [from, to]. */
function jsonKeypoints(replace) {
  const [topic, header, ...data] = keypoints({}, { format: "json" });
  const text = new TextDecoder().decode(header);
  if (!text.includes(replace[0])) throw new Error(`corpus: ${replace[0]} not in ${text}`);
  return [topic, bytes(text.replace(replace[0], replace[1])), ...data];
}

function raw(over, data) {
  return keypoints({}, { parts: [{ name: "x", encoding: "raw", dtype: "<f4", shape: [1], ...over }], data: [data] });
}

function statusHeader(over = {}) {
  const h = {
    schema: "sapiens2.stream", version: 1, kind: "status", source_id: "cam0", fps: new F(29.75), health: "ok",
    frames: 10, last_frame_index: 9, drops: { source: 0 }, sent: { keypoints: 10 }, nominal_fps: new F(30),
    live: true, random_weights: true, publish_ns: CAPTURE_NS, parts: [],
  };
  return { ...h, ...over };
}

/** A JSON status message; `replace` [from, to] edits its text (`asLatin1` writes `to` bytes as latin1). */
function jsonStatus(over, replace, asLatin1 = false) {
  let text = json(statusHeader(over));
  if (replace) {
    if (!text.includes(replace[0])) throw new Error(`corpus: ${replace[0]} not in ${text}`);
    text = text.replace(replace[0], replace[1]);
  }
  const header = asLatin1 ? Uint8Array.from(text, (c) => c.charCodeAt(0)) : bytes(text);
  return [bytes("status.cam0"), header];
}

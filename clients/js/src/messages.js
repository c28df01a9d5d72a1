/**
 * Typed messages (Python's `sapiens2_client.messages`) and the checks that tie their parts
 * together: the five keypoint parts must all be there with agreeing N and K (and the four 3D
 * parts all or none, agreeing too); the seven world parts with agreeing N, K and cameras.
 * @module
 */

import { WireError, show } from "./errors.js";

/** name -> [dtype, shape in terms of N persons and K keypoints] */
export const KEYPOINT_PARTS = Object.freeze({
  keypoints: ["<f4", ["N", "K", 2]],
  keypoint_scores: ["<f4", ["N", "K"]],
  boxes: ["<f4", ["N", 4]],
  box_scores: ["<f4", ["N"]],
  track_ids: ["<i8", ["N"]],
});

/** The optional 3D group (--keypoints3d): all four parts or none. */
export const KEYPOINT3D_PARTS = Object.freeze({
  keypoints3d: ["<f4", ["N", "K", 3]],
  keypoints3d_valid: ["|u1", ["N", "K"]],
  root3d: ["<f4", ["N", 3]],
  root3d_valid: ["|u1", ["N"]],
});

/** A world message's parts: N persons, K keypoints, C cameras (`cameras.length`), S single-view persons. */
export const WORLD_PARTS = Object.freeze({
  world_keypoints: ["<f4", ["N", "K", 3]],
  world_valid: ["|u1", ["N", "K"]],
  world_error: ["<f4", ["N", "K"]],
  world_views: ["|u1", ["N", "K"]],
  world_ids: ["<i8", ["N"]],
  world_members: ["<i4", ["N", "C"]],
  single_view: ["<i4", ["S", 2]],
});

/** The image part of each image kind. */
export const IMAGE_PART = Object.freeze({ frame: "image", seg: "classes", matte: "alpha" });

const own = (obj, key) => Object.prototype.hasOwnProperty.call(obj, key);
const big = (v) => (typeof v === "bigint" ? v : BigInt(v));
const numbers = (map) => Object.fromEntries(Object.entries(map ?? {}).map(([k, v]) => [k, Number(v)]));

/** The five keypoint parts, dtypes and N/K agreeing (Python's `_keypoint_arrays`); WireError otherwise. */
function keypointArrays(arrays) {
  const missing = Object.keys(KEYPOINT_PARTS).filter((name) => !own(arrays, name));
  if (missing.length) throw new WireError(`keypoints message lacks parts ${show(missing)}`, "parts");
  const n = arrays.boxes.shape.length ? arrays.boxes.shape[0] : -1;
  const k = arrays.keypoints.shape.length === 3 ? arrays.keypoints.shape[1] : -1;
  const sizes = { N: n, K: k };
  checkParts(arrays, KEYPOINT_PARTS, sizes);
  const present = Object.keys(KEYPOINT3D_PARTS).filter((name) => own(arrays, name));
  if (present.length && present.length !== Object.keys(KEYPOINT3D_PARTS).length) {
    const lacking = Object.keys(KEYPOINT3D_PARTS).filter((name) => !own(arrays, name));
    throw new WireError(`keypoints message has 3D parts ${show(present)} but lacks ${show(lacking)}`, "parts");
  }
  if (present.length) checkParts(arrays, KEYPOINT3D_PARTS, sizes);
  return { n, k, has3d: present.length > 0 };
}

function checkParts(arrays, table, sizes, kind = "keypoints") {
  for (const [name, [dtype, shape]] of Object.entries(table)) {
    const array = arrays[name];
    const want = shape.map((s) => (typeof s === "string" ? sizes[s] : s));
    // An image part has no typed data here (this decoder reads no pixels): never one of these.
    if (array.encoding !== "raw" || array.dtype !== dtype || array.shape.length !== want.length
      || array.shape.some((s, i) => s !== want[i])) {
      throw new WireError(`${kind} part ${show(name)} is ${show(array.shape)} ${array.dtype}, expected `
        + `${show(want)} ${dtype}`, "shape");
    }
  }
}

/**
 * The seven world parts, dtypes and N/K/S agreeing, C = cameras.length, every index in range
 * (members -1 or more, single-view columns 0..C-1 and persons 0 or more): Python's `_world_arrays`.
 */
function worldArrays(h, arrays) {
  const missing = Object.keys(WORLD_PARTS).filter((name) => !own(arrays, name));
  if (missing.length) throw new WireError(`world message lacks parts ${show(missing)}`, "parts");
  const { world_ids: ids, world_keypoints: xyz, world_members: members, single_view: single } = arrays;
  const sizes = { N: ids.shape.length === 1 ? ids.shape[0] : -1, K: xyz.shape.length === 3 ? xyz.shape[1] : -1,
    C: h.cameras.length, S: single.shape.length === 2 ? single.shape[0] : -1 };
  checkParts(arrays, WORLD_PARTS, sizes, "world");
  const lowest = members.data.reduce((lo, v) => Math.min(lo, v), 0);
  if (lowest < -1) {
    throw new WireError(`world_members holds ${lowest}: an index is -1 (not seen) or more`, "shape");
  }
  for (let i = 0; i < single.data.length; i += 2) {
    if (single.data[i] < 0 || single.data[i] >= sizes.C || single.data[i + 1] < 0) {
      throw new WireError(`single_view holds a camera column outside 0..${sizes.C - 1} or a negative person index`,
        "shape");
    }
  }
  return sizes;
}

/**
 * Camera -> the index of world person `person` in that camera's keypoints message, for the cameras
 * that see them (Python's `WorldMessage.members_of`).
 * @param {{cameras: string[], world_members: Int32Array}} world a WorldMessage
 * @param {number} person
 * @returns {Record<string, number>}
 */
export function membersOf(world, person) {
  const c = world.cameras.length;
  const out = {};
  world.cameras.forEach((camera, j) => {
    const index = world.world_members[person * c + j];
    if (index >= 0) out[camera] = index;
  });
  return out;
}

/**
 * The 3D keypoints of a message (Python's `Keypoints3D`): xyz (N, K, 3), valid (N, K) 0/1 bytes,
 * root (N, 3), root_valid (N,), metric.
 */
export class Keypoints3D {
  constructor(xyz, valid, root, rootValid, metric) {
    this.xyz = xyz;
    this.valid = valid;
    this.root = root;
    this.root_valid = rootValid;
    this.metric = metric;
  }

  /**
   * Root-relative coordinates (N, K, 3), `xyz - root`, and their validity (N, K): 1 where the point
   * and its person's root are both valid, else 0 with coordinates 0 (Python's `relative()`).
   * @returns {{xyz: Float32Array, valid: Uint8Array}}
   */
  relative() {
    const n = this.root_valid.length;
    const k = n ? this.valid.length / n : 0;
    const xyz = new Float32Array(n * k * 3);
    const valid = new Uint8Array(n * k);
    for (let p = 0; p < n; p++) {
      if (!this.root_valid[p]) continue;
      for (let i = p * k; i < (p + 1) * k; i++) {
        if (!this.valid[i]) continue;
        valid[i] = 1;
        for (let c = 0; c < 3; c++) xyz[3 * i + c] = this.xyz[3 * i + c] - this.root[3 * p + c];
      }
    }
    return { xyz, valid };
  }
}

function keypoints3d(h, a) {
  return new Keypoints3D(a.keypoints3d.data, a.keypoints3d_valid.data, a.root3d.data, a.root3d_valid.data,
    h.keypoints3d_metric ?? false);
}

/** The per-frame fields of a validated header (Python's `meta_from_header`). */
export function metaFromHeader(h) {
  return {
    source_id: h.source_id,
    frame_index: Number(h.frame_index),
    pts: h.pts === undefined || h.pts === null ? null : big(h.pts),
    time_base: h.time_base ? [Number(h.time_base[0]), Number(h.time_base[1])] : null,
    capture_ns: big(h.capture_ns ?? 0),
    session: Number(h.session ?? 0),
    latency_ms: numbers(h.latency_ms),
    drops: numbers(h.drops),
    width: Number(h.width ?? 0),
    height: Number(h.height ?? 0),
    random_weights: h.random_weights ?? false,
  };
}

/**
 * Turn a decoded message into its typed record; WireError on missing or inconsistent parts.
 * @param {{topic: string, kind: string, source_id: string, header: object, arrays: object}} d
 */
export function toMessage(d) {
  const h = d.header;
  const base = { kind: d.kind, topic: d.topic, source_id: d.source_id, header: h, arrays: d.arrays,
    publish_ns: big(h.publish_ns ?? 0) };
  if (d.kind === "status") {
    let event;
    if (h.event !== null && typeof h.event === "object" && !Array.isArray(h.event) && !(h.event instanceof Uint8Array)) {
      event = { ...h.event }; // status events are not checked by the wire format: take what is an integer
      if (typeof event.time_ns === "bigint" || Number.isInteger(event.time_ns)) event.time_ns = big(event.time_ns);
      else delete event.time_ns;
    }
    return { ...base, fps: Number(h.fps), health: h.health, frames: Number(h.frames),
      last_frame_index: Number(h.last_frame_index), drops: numbers(h.drops), sent: numbers(h.sent),
      detector: h.detector ?? null, ...(event ? { event } : {}) };
  }
  const meta = metaFromHeader(h);
  const a = d.arrays;
  if (d.kind === "keypoints") {
    const { n, k, has3d } = keypointArrays(a);
    return {
      ...base, meta, num_persons: n, num_keypoints: k,
      keypoints: a.keypoints.data, keypoint_scores: a.keypoint_scores.data, boxes: a.boxes.data,
      box_scores: a.box_scores.data, track_ids: a.track_ids.data,
      keypoints3d: has3d ? keypoints3d(h, a) : null,
      shapes: Object.fromEntries(Object.keys(KEYPOINT_PARTS).map((name) => [name, a[name].shape])),
    };
  }
  if (d.kind === "world") {
    const { N, K, S } = worldArrays(h, a);
    return {
      ...base, meta, num_persons: N, num_keypoints: K, num_single_view: S, units: h.units ?? "m",
      cameras: [...h.cameras], camera_frames: numbers(h.camera_frames),
      ...Object.fromEntries(Object.keys(WORLD_PARTS).map((part) => [part, a[part].data])),
      shapes: Object.fromEntries(Object.keys(WORLD_PARTS).map((part) => [part, a[part].shape])),
    };
  }
  const name = IMAGE_PART[d.kind];
  if (!own(a, name)) throw new WireError(`${d.kind} message lacks its ${show(name)} part`, "parts");
  // A frame's picture is colour (H, W, 3) uint8 (JPEG, or raw), a map (H, W) uint8 (PNG, or raw): as in Python.
  const part = a[name];
  const [encoding, layout] = d.kind === "frame" ? ["jpeg", "H, W, 3"] : ["png", "H, W"];
  const fits = part.dtype === "|u1" && (d.kind === "frame" ? part.shape.length === 3 && part.shape[2] === 3
    : part.shape.length === 2);
  if (![encoding, "raw"].includes(part.encoding) || !fits) {
    throw new WireError(`${d.kind} message: its ${show(name)} part must be ${encoding} or raw (${layout}) |u1, got `
      + `${part.encoding} (${part.shape.join(", ")}) ${part.dtype}`, "encoding");
  }
  if (d.kind === "frame") return { ...base, meta, image: a[name], annotated: h.annotated ?? false };
  if (d.kind === "seg") return { ...base, meta, classes: a[name] };
  return { ...base, meta, alpha: a[name], alpha_scale: Number(h.alpha_scale ?? 255) };
}

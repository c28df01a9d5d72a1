/**
 * Type and range checks of the header fields (Python's `check_frame_fields` /
 * `check_status_fields`, in the same order). They run on the raw tree of values.js and throw
 * WireError `field`.
 * @module
 */

import { WireError, show } from "./errors.js";
import { INT64_MIN, UINT64_MAX, get, has, isInt, isMap, isNumber, isStrKey, toNumber } from "./values.js";

const TWO_31 = 2n ** 31n;
const isBool = (v) => v === true || v === false;

/** A map of string keys to values that pass `check` (absent counts as an empty map). */
function checkMap(header, key, check, what) {
  const value = get(header, key, {});
  if (!isMap(value) || !Object.entries(value).every(([k, v]) => isStrKey(k) && check(v))) {
    throw new WireError(`${key} must be a map of names to ${what}, got ${show(value)}`);
  }
}

/** An optional key: when present, its value must pass `check`. */
function optional(header, key, check, what) {
  if (has(header, key) && !check(header[key])) {
    throw new WireError(`${key} must be ${what}, got ${show(header[key])}`);
  }
}

const dimension = (v) => isInt(v, 0n, TWO_31);
const SOURCE_RE = /^[A-Za-z0-9_:-]{1,64}$/;

/** Whether `sourceId` can be used in a topic: 1-64 of `[A-Za-z0-9_:-]`. */
export function isValidSourceId(sourceId) {
  return typeof sourceId === "string" && SOURCE_RE.test(sourceId);
}

/**
 * Every per-frame field (keypoints, frame, seg, matte, world); throws WireError.
 * @param {object} header raw header map
 */
export function checkFrameFields(header) {
  if (!isInt(get(header, "frame_index"))) {
    throw new WireError(`${show(get(header, "kind"))} header lacks an integer frame_index`);
  }
  optional(header, "pts", (v) => v === null || isInt(v, INT64_MIN), "an integer or nil");
  const tb = get(header, "time_base", null);
  if (tb !== null && !(Array.isArray(tb) && tb.length === 2 && isInt(tb[0], 1n, TWO_31) && isInt(tb[1], 1n, TWO_31))) {
    throw new WireError(`time_base must be nil or [num, den] with positive integers, got ${show(tb)}`);
  }
  optional(header, "capture_ns", (v) => isInt(v, 0n, UINT64_MAX), "an unsigned integer");
  optional(header, "session", (v) => isInt(v), "a non-negative integer");
  checkMap(header, "latency_ms", isNumber, "finite numbers");
  checkMap(header, "drops", (v) => isInt(v), "non-negative integers");
  for (const key of ["width", "height"]) optional(header, key, dimension, "a non-negative integer");
  optional(header, "random_weights", isBool, "a boolean");
  const kind = header.kind;
  if (kind === "keypoints") {
    for (const key of ["num_persons", "num_keypoints"]) optional(header, key, dimension, "a non-negative integer");
    optional(header, "keypoints3d_metric", isBool, "a boolean");
  } else if (kind === "frame") {
    optional(header, "annotated", isBool, "a boolean");
  } else if (kind === "matte") {
    optional(header, "alpha_scale", (v) => isNumber(v) && toNumber(v) > 0, "a positive number");
  } else if (kind === "world") {
    checkWorldFields(header);
  }
}

/**
 * The fields of a world message (Python's `check_world_fields`): its counts, units, the rig's
 * cameras (distinct source ids, the column order of `world_members`) and the frame of each camera
 * used in the step; throws WireError.
 * @param {object} header raw header map
 */
export function checkWorldFields(header) {
  for (const key of ["num_persons", "num_keypoints"]) optional(header, key, dimension, "a non-negative integer");
  optional(header, "units", (v) => typeof v === "string" && [...v].length > 0 && [...v].length <= 16,
    "a short string");
  const cameras = get(header, "cameras");
  if (!(Array.isArray(cameras) && cameras.every(isValidSourceId) && new Set(cameras).size === cameras.length)) {
    throw new WireError(`cameras must be a list of distinct source ids, got ${show(cameras)}`);
  }
  // Marker keys (a bin key, "__proto__": values.js) are no source id, so never one of the cameras.
  const known = new Set(cameras);
  const frames = get(header, "camera_frames");
  if (!(isMap(frames) && Object.entries(frames).every(([k, v]) => known.has(k) && isInt(v)))) {
    throw new WireError(`camera_frames must map cameras to frame indices, got ${show(frames)}`);
  }
}

/**
 * The status fields; throws WireError.
 * @param {object} header raw header map
 */
export function checkStatusFields(header) {
  if (!isNumber(get(header, "fps")) || typeof get(header, "health") !== "string") {
    throw new WireError("status needs a finite number fps and a string health");
  }
  if (!isInt(get(header, "frames")) || !isInt(get(header, "last_frame_index"), -1n)) {
    throw new WireError("status needs integer frames and last_frame_index");
  }
  checkMap(header, "drops", (v) => isInt(v), "non-negative integers");
  checkMap(header, "sent", (v) => isInt(v), "non-negative integers");
  optional(header, "uptime_s", isNumber, "a finite number");
  optional(header, "nominal_fps", (v) => v === null || isNumber(v), "a finite number or nil");
  for (const key of ["width", "height"]) optional(header, key, dimension, "a non-negative integer");
  for (const key of ["live", "random_weights"]) optional(header, key, isBool, "a boolean");
  optional(header, "detector", (v) => typeof v === "string" && [...v].length > 0 && [...v].length <= 64,
    "a short string");
  if (has(header, "event")) checkEvent(header.event);
}

const nonNegative = (v) => isNumber(v) && toNumber(v) >= 0;

/** The fields of a status `event` map and what each must be (Python's `wire._EVENT_FIELDS`). */
const EVENT_FIELDS = {
  event: [(v) => typeof v === "string" && [...v].length > 0 && [...v].length <= 64, "a short string"],
  time_ns: [(v) => isInt(v, 0n, UINT64_MAX), "an unsigned integer"],
  session: [(v) => isInt(v), "a non-negative integer"],
  last_frame: [(v) => isInt(v, -1n), "an integer >= -1"],
  first_frame: [(v) => isInt(v), "a non-negative integer"],
  silent_s: [nonNegative, "a non-negative number"],
  outage_s: [nonNegative, "a non-negative number"],
  reason: [(v) => typeof v === "string", "a string"],
};

/** Plain data with no bytes anywhere, maps keyed by strings (Python's `wire._json_value`). */
function jsonValue(value) {
  const todo = [value];
  while (todo.length) {
    const item = todo.pop();
    if (item instanceof Uint8Array) return false;
    if (Array.isArray(item)) todo.push(...item);
    else if (isMap(item)) {
      for (const [key, child] of Object.entries(item)) {
        if (!isStrKey(key)) return false;
        todo.push(child);
      }
    }
  }
  return true;
}

/** A status `event` map: an event name, every documented field typed, the rest plain data. */
function checkEvent(event) {
  if (!isMap(event) || !has(event, "event")) {
    throw new WireError(`event must be a map with an event name, got ${show(event)}`);
  }
  for (const [key, value] of Object.entries(event)) {
    const [check, what] = Object.prototype.hasOwnProperty.call(EVENT_FIELDS, key) ? EVENT_FIELDS[key]
      : [jsonValue, "plain data (no bytes)"];
    if (!isStrKey(key) || !check(value)) {
      throw new WireError(`event field ${show(key)} must be ${what}, got ${show(value)}`);
    }
  }
}

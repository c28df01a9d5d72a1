/**
 * The "raw" header tree the checks run on, and its conversion to the plain header users get.
 *
 * Python tells 1 from 1.0 (an int field refuses a float) and keeps integers exact; JavaScript
 * numbers do neither. So the header parsers (header.js, json.js) build a raw tree where
 *   - an integer is a `number` (always a safe integer) or a `bigint` (beyond 2^53),
 *   - a float is a {@link WireFloat},
 *   - a string is a `string`, msgpack bin is a `Uint8Array`, nil is `null`,
 *   - a map is a plain object, an array an array.
 * Map keys that a plain object cannot hold faithfully use marker strings that start with a lone
 * surrogate (which valid UTF-8 never produces): `__proto__`, msgpack bin keys, and JSON keys that
 * happen to start with such a surrogate. {@link toPlain} turns markers back.
 * @module
 */

/** A float of the raw header tree (keeps `1.0` apart from the integer `1`). */
export class WireFloat {
  /** @param {number} value */
  constructor(value) {
    this.value = value;
  }
}

export const PROTO_KEY = "\uDC01__proto__"; // the key "__proto__"
export const BYTES_KEY = "\uDC00"; // prefix: a msgpack bin key, its bytes as latin1 after it
export const ESCAPE_KEY = "\uDC02"; // prefix: a JSON key that itself started with one of these markers

export const INT64_MIN = -(2n ** 63n);
export const INT64_MAX = 2n ** 63n - 1n;
export const UINT64_MAX = 2n ** 64n - 1n;

/** Own property of a raw map, or `fallback` (never reaches Object.prototype). */
export function get(map, key, fallback = undefined) {
  return Object.prototype.hasOwnProperty.call(map, key) ? map[key] : fallback;
}

/** Whether a raw map has `key` as its own property. */
export function has(map, key) {
  return Object.prototype.hasOwnProperty.call(map, key);
}

/** A map of the raw tree (a plain object: not an array, bytes or a float). */
export function isMap(value) {
  return value !== null && typeof value === "object" && !Array.isArray(value) && !(value instanceof Uint8Array)
    && !(value instanceof WireFloat);
}

/** Whether a raw map key is a string key (not a msgpack bin key). */
export function isStrKey(key) {
  return !key.startsWith(BYTES_KEY);
}

/** Python's `_is_int(value, lo, hi)`: an integer (never a bool or a float) in [lo, hi]. */
export function isInt(value, lo = 0n, hi = INT64_MAX) {
  let big;
  if (typeof value === "bigint") big = value;
  else if (typeof value === "number" && Number.isSafeInteger(value)) big = BigInt(value);
  else return false;
  return big >= lo && big <= hi;
}

/** Python's `_is_number`: an integer or float (not a bool) that is finite as a double. */
export function isNumber(value) {
  if (value instanceof WireFloat) return Number.isFinite(value.value);
  if (typeof value === "bigint") return Number.isFinite(Number(value));
  return typeof value === "number" && Number.isFinite(value);
}

/** The JavaScript number of a raw int or float. */
export function toNumber(value) {
  return value instanceof WireFloat ? value.value : Number(value);
}

/** An exact integer as a number when safe, else as a bigint. */
export function normInt(value) {
  const big = BigInt(value);
  return big >= -BigInt(Number.MAX_SAFE_INTEGER) && big <= BigInt(Number.MAX_SAFE_INTEGER) ? Number(big) : big;
}

/** Python's `==` against an integer (used for `version`: `1`, `1.0` and `True` all equal 1). */
export function equalsInt(value, n) {
  if (value === true || value === false) return Number(value) === n;
  if (value instanceof WireFloat) return value.value === n;
  if (typeof value === "bigint") return value === BigInt(n);
  return value === n;
}

/** Nesting depth of maps and arrays (a scalar is 0), counted up to `stop`, without recursion. */
export function depth(value, stop) {
  let deepest = 0;
  const todo = [[value, 0]];
  while (todo.length) {
    const [item, level0] = todo.pop();
    const isArray = Array.isArray(item);
    if (!isArray && !isMap(item)) continue;
    const level = level0 + 1;
    deepest = Math.max(deepest, level);
    if (deepest >= stop) return deepest;
    for (const child of isArray ? item : Object.values(item)) todo.push([child, level]);
  }
  return deepest;
}

const LONE_SURROGATE = /[\uD800-\uDBFF](?![\uDC00-\uDFFF])|(?<![\uD800-\uDBFF])[\uDC00-\uDFFF]/;

/** Whether a string cannot be written as UTF-8 (it holds a lone surrogate, as JSON's "\ud800" gives). */
function notUnicode(text) {
  return LONE_SURROGATE.test(text);
}

/**
 * Python's header walk (`wire._depth`): true when a string anywhere (map keys included) is not
 * valid Unicode. Marker keys (values.js) are this module's own and stand for valid keys, except an
 * escaped JSON key, whose original began with a lone surrogate.
 */
export function holdsLoneSurrogate(value) {
  const todo = [value];
  while (todo.length) {
    const item = todo.pop();
    if (typeof item === "string") {
      if (notUnicode(item)) return true;
    } else if (Array.isArray(item)) {
      todo.push(...item);
    } else if (isMap(item)) {
      for (const [key, child] of Object.entries(item)) {
        if (key.startsWith(ESCAPE_KEY) && notUnicode(key.slice(1))) return true;
        if (key !== PROTO_KEY && !key.startsWith(BYTES_KEY) && !key.startsWith(ESCAPE_KEY) && notUnicode(key)) {
          return true;
        }
        todo.push(child);
      }
    }
  }
  return false;
}

/** Set `obj[key] = value` as an own property, also for the key `__proto__`. */
export function define(obj, key, value) {
  Object.defineProperty(obj, key, { value, enumerable: true, writable: true, configurable: true });
}

/** The plain key of a raw key (markers undone; a bin key keeps its marker form). */
export function plainKey(key) {
  if (key === PROTO_KEY) return "__proto__";
  if (key.startsWith(ESCAPE_KEY)) return key.slice(1);
  return key;
}

/**
 * The header users see: floats as numbers, integers as numbers (exact: bigint beyond 2^53),
 * bytes as a copy. Call only on a tree whose depth was checked (it recurses).
 */
export function toPlain(value) {
  if (value instanceof WireFloat) return value.value;
  if (typeof value === "bigint") return normInt(value);
  if (value instanceof Uint8Array) return new Uint8Array(value); // a copy, never a view of the frame
  if (Array.isArray(value)) return value.map(toPlain);
  if (isMap(value)) {
    const out = {};
    for (const [key, child] of Object.entries(value)) define(out, plainKey(key), toPlain(child));
    return out;
  }
  return value;
}

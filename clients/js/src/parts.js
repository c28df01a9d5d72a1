/**
 * Payload parts: raw arrays (copied into typed arrays) and PNG / JPEG images (sizes checked
 * against their header bytes, pixels left encoded). Python's `_decode_part` / `_decode_image`,
 * check for check.
 * @module
 */

import { WireError, show } from "./errors.js";
import { ImageHeaderError, jpegInfo, pngInfo } from "./images.js";
import { get, has, isInt, isMap } from "./values.js";

/** dtype string -> [typed array constructor, item size]. `<f2` comes as the raw 16-bit patterns. */
export const DTYPES = Object.freeze({
  "|u1": [Uint8Array, 1], "|i1": [Int8Array, 1],
  "<u2": [Uint16Array, 2], "<i2": [Int16Array, 2],
  "<u4": [Uint32Array, 4], "<i4": [Int32Array, 4],
  "<u8": [BigUint64Array, 8], "<i8": [BigInt64Array, 8],
  "<f2": [Uint16Array, 2], "<f4": [Float32Array, 4], "<f8": [Float64Array, 8],
});

/** The dtypes that may cross the wire (never object arrays). */
export const RAW_DTYPES = Object.freeze(Object.keys(DTYPES));

const LITTLE_ENDIAN_HOST = new Uint8Array(new Uint16Array([1]).buffer)[0] === 1;
const TWO_31 = 2n ** 31n;

/** The array's shape as numbers, or WireError `shape`. */
function checkShape(name, shape, limits) {
  if (!Array.isArray(shape) || shape.length > limits.maxDims || !shape.every((s) => isInt(s, 0n, TWO_31))) {
    throw new WireError(`part ${show(name)}: bad shape ${show(shape)} (at most ${limits.maxDims} sizes, each 0..2^31)`,
      "shape");
  }
  return shape.map(Number);
}

/** A little-endian raw part as a typed array over a fresh copy of its bytes (so always aligned). */
function typedArray(data, dtype) {
  const [Type, itemSize] = DTYPES[dtype];
  const copy = new Uint8Array(data.byteLength);
  copy.set(data);
  if (!LITTLE_ENDIAN_HOST && itemSize > 1) {
    for (let i = 0; i < copy.length; i += itemSize) copy.subarray(i, i + itemSize).reverse();
  }
  return new Type(copy.buffer, 0, copy.byteLength / itemSize);
}

/**
 * Decode one part; returns [name, array]. Raw parts become `{encoding: "raw", dtype, shape, data}`,
 * images `{encoding: "jpeg"|"png", dtype, shape, bytes, width, height, channels, bit_depth}`.
 * @param {unknown} desc raw part descriptor
 * @param {Uint8Array} data the part's frame
 * @param {object} limits
 */
export function decodePart(desc, data, limits) {
  if (!isMap(desc) || !["name", "encoding", "dtype", "shape"].every((k) => has(desc, k))) {
    throw new WireError(`part descriptor needs name, encoding, dtype, shape: ${show(desc)}`, "parts");
  }
  const name = get(desc, "name");
  const enc = get(desc, "encoding");
  const dtype = get(desc, "dtype");
  if (typeof name !== "string" || typeof enc !== "string") {
    throw new WireError(`part name and encoding must be strings: ${show(desc)}`, "parts");
  }
  const shape = checkShape(name, get(desc, "shape"), limits);
  if (typeof dtype !== "string" || !Object.prototype.hasOwnProperty.call(DTYPES, dtype)) {
    throw new WireError(`part ${show(name)}: dtype ${show(dtype, 40)} not allowed`, "dtype");
  }
  const itemSize = DTYPES[dtype][1];
  const want = shape.reduce((n, s) => n * BigInt(s), 1n) * BigInt(itemSize); // exact: never wraps
  if (want > BigInt(limits.maxArrayBytes)) {
    throw new WireError(`part ${show(name)}: shape ${show(shape)} ${dtype} is ${want} bytes, over the `
      + `${limits.maxArrayBytes}-byte limit`, "too_large");
  }
  if (enc === "raw") {
    if (BigInt(data.byteLength) !== want) {
      throw new WireError(`part ${show(name)}: ${data.byteLength} bytes for shape ${show(shape)} ${dtype} `
        + `(${want} expected)`, "shape");
    }
    return [name, { encoding: "raw", dtype, shape, data: typedArray(data, dtype) }];
  }
  if (enc !== "jpeg" && enc !== "png") {
    throw new WireError(`part ${show(name)}: unknown encoding ${show(enc, 40)}`, "encoding");
  }
  return [name, checkImage(name, enc, dtype, shape, data, limits)];
}

/** An image part: declared (H, W, 3) |u1 for JPEG or (H, W) |u1 for PNG, agreeing with its header. */
function checkImage(name, enc, dtype, shape, data, limits) {
  const jpeg = enc === "jpeg";
  const channels = jpeg ? 3 : 1;
  if (dtype !== "|u1" || shape.length !== (jpeg ? 3 : 2) || (jpeg && shape[2] !== 3)) {
    const what = jpeg ? "(H, W, 3) |u1" : "(H, W) |u1";
    throw new WireError(`part ${show(name)}: a ${enc} part must declare ${what}, got ${show(shape)} ${dtype}`, "shape");
  }
  let info;
  try {
    info = jpeg ? jpegInfo(data) : pngInfo(data);
  } catch (e) {
    if (!(e instanceof ImageHeaderError)) throw e;
    throw new WireError(`part ${show(name)}: ${enc} data does not decode (${e.message})`, "image");
  }
  if (info.height !== shape[0] || info.width !== shape[1] || info.channels !== channels || info.bit_depth !== 8) {
    throw new WireError(`part ${show(name)}: the ${enc} holds ${info.width}x${info.height}x${info.channels} `
      + `(${info.bit_depth}-bit), the header says ${show(shape)}`, "shape");
  }
  if (info.width * info.height > limits.maxPixels) {
    throw new WireError(`part ${show(name)}: ${info.width}x${info.height} pixels exceed the limit of `
      + `${limits.maxPixels}`, "too_large");
  }
  return {
    encoding: enc, dtype, shape, bytes: data, width: info.width, height: info.height, channels,
    bit_depth: info.bit_depth, ...(jpeg ? { color: "rgb" } : {}),
  };
}

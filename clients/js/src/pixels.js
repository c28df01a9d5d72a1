/**
 * Optional pixel decoding of image parts, for Node: JPEG with `jpeg-js`, PNG with `pngjs`
 * (optional dependencies, imported only when first needed; the browser build does not include
 * this module: browsers decode with `createImageBitmap(new Blob([image.bytes]))`).
 * @module
 */

import { WireError } from "./errors.js";

let jpegModule;
let pngModule;

async function load(name) {
  try {
    const mod = await import(name);
    return mod.default ?? mod;
  } catch (e) {
    const err = new Error(`decoding images needs the optional package ${name}: npm install ${name}`);
    err.cause = e;
    throw err;
  }
}

/**
 * @typedef {object} Pixels
 * @property {number} width
 * @property {number} height
 * @property {number} channels 3 (RGB, from JPEG) or 1 (gray, from PNG)
 * @property {number[]} shape [H, W, 3] or [H, W]
 * @property {Uint8Array} data row-major, channels interleaved
 */

/**
 * Decode an image part of a decoded message (`msg.image`, `msg.classes`, `msg.alpha`) to pixels:
 * JPEG to (H, W, 3) RGB, PNG to (H, W) 8-bit gray. Throws WireError `image` when the bytes do not
 * decode to the size and kind their header declared (what Python's decoder checks at once).
 * @param {{encoding: string, bytes: Uint8Array, width: number, height: number}} image
 * @returns {Promise<Pixels>}
 */
export async function decodePixels(image) {
  if (image.encoding === "jpeg") {
    jpegModule ??= await load("jpeg-js");
    return decodeJpeg(jpegModule, image);
  }
  if (image.encoding === "png") {
    pngModule ??= await load("pngjs");
    return decodePng(pngModule, image);
  }
  throw new TypeError(`not an encoded image part (encoding ${image.encoding})`);
}

function refuse(what, cause) {
  return new WireError(`${what} data does not decode${cause ? ` (${cause.message ?? cause})` : ""}`, "image");
}

function decodeJpeg(jpeg, image) {
  let out;
  try {
    // The header check already bounded the size; these caps only repeat it for jpeg-js.
    const megapixels = (image.width * image.height) / 1e6;
    out = jpeg.decode(image.bytes, {
      useTArray: true, formatAsRGBA: false, tolerantDecoding: false,
      maxResolutionInMP: Math.max(1, Math.ceil(megapixels)),
      maxMemoryUsageInMB: Math.max(64, Math.ceil(megapixels * 16)),
    });
  } catch (e) {
    throw refuse("jpeg", e);
  }
  if (out.width !== image.width || out.height !== image.height || out.data.length !== out.width * out.height * 3) {
    throw refuse("jpeg", `got ${out.width}x${out.height}`);
  }
  return { width: out.width, height: out.height, channels: 3, shape: [out.height, out.width, 3],
    data: new Uint8Array(out.data.buffer, out.data.byteOffset, out.data.byteLength) };
}

function decodePng(pngjs, image) {
  let out;
  try {
    const buffer = Buffer.from(image.bytes.buffer, image.bytes.byteOffset, image.bytes.byteLength);
    out = pngjs.PNG.sync.read(buffer, { skipRescale: true });
  } catch (e) {
    throw refuse("png", e);
  }
  // pngjs hands out RGBA; an 8-bit grayscale PNG (colour type 0) has R = G = B = gray.
  if (out.width !== image.width || out.height !== image.height || out.colorType !== 0 || out.depth !== 8) {
    throw refuse("png", `got ${out.width}x${out.height}, colour type ${out.colorType}, depth ${out.depth}`);
  }
  const gray = new Uint8Array(out.width * out.height);
  for (let i = 0; i < gray.length; i++) gray[i] = out.data[i * 4];
  return { width: out.width, height: out.height, channels: 1, shape: [out.height, out.width], data: gray };
}

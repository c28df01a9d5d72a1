/**
 * Image sizes read from PNG / JPEG header bytes, before anything is decoded (a port of Python's
 * `sapiens2_client.images.png_info` / `jpeg_info`). A PNG of a few hundred bytes can declare
 * 30000x30000 pixels: the decoder compares these sizes with the declared shape and the pixel
 * limit first. Plain byte parsing, no dependencies: works in browsers.
 * @module
 */

/** The bytes are not a PNG / JPEG whose header can be read. */
export class ImageHeaderError extends Error {
  constructor(message) {
    super(message);
    this.name = "ImageHeaderError";
  }
}

/**
 * @typedef {object} ImageInfo
 * @property {number} width
 * @property {number} height
 * @property {number} channels
 * @property {number} bit_depth
 */

const PNG_SIGNATURE = [0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a];
const IHDR = [0x49, 0x48, 0x44, 0x52];
// Start-of-frame markers of every JPEG coding process (baseline, progressive, lossless, ...).
const SOF_MARKERS = new Set([0xc0, 0xc1, 0xc2, 0xc3, 0xc5, 0xc6, 0xc7, 0xc9, 0xca, 0xcb, 0xcd, 0xce, 0xcf]);
const PNG_CHANNELS = new Map([[0, 1], [2, 3], [3, 3], [4, 2], [6, 4]]); // colour type -> channels (3: palette)

const u16 = (d, i) => (d[i] << 8) | d[i + 1];
const u32 = (d, i) => d[i] * 0x1000000 + ((d[i + 1] << 16) | (d[i + 2] << 8) | d[i + 3]);
const bytesAt = (d, i, want) => want.every((b, k) => d[i + k] === b);

/**
 * Width, height, channels and bit depth from a PNG's IHDR chunk.
 * @param {Uint8Array} data
 * @returns {ImageInfo}
 */
export function pngInfo(data) {
  if (data.length < 33 || !bytesAt(data, 0, PNG_SIGNATURE) || !bytesAt(data, 12, IHDR)) {
    throw new ImageHeaderError("not a PNG (no signature and IHDR chunk)");
  }
  const color = data[25];
  if (!PNG_CHANNELS.has(color)) throw new ImageHeaderError(`PNG colour type ${color} is not valid`);
  return { width: u32(data, 16), height: u32(data, 20), channels: PNG_CHANNELS.get(color), bit_depth: data[24] };
}

/**
 * Width, height and components from a JPEG's start-of-frame segment (markers walked, nothing decoded).
 * @param {Uint8Array} data
 * @returns {ImageInfo}
 */
export function jpegInfo(data) {
  if (data.length < 2 || data[0] !== 0xff || data[1] !== 0xd8) throw new ImageHeaderError("not a JPEG (no SOI marker)");
  const end = data.length;
  let pos = 2;
  while (pos + 4 <= end) {
    if (data[pos] !== 0xff) throw new ImageHeaderError(`JPEG marker expected at byte ${pos}`);
    const marker = data[pos + 1];
    if (marker === 0xff) { // fill byte
      pos += 1;
      continue;
    }
    if (marker === 0x01 || (marker >= 0xd0 && marker < 0xd8)) { // markers without a length
      pos += 2;
      continue;
    }
    if (marker === 0xd9 || marker === 0xda) break; // end of image / start of scan before any frame header
    const length = u16(data, pos + 2);
    if (length < 2) throw new ImageHeaderError("JPEG segment with a bad length");
    if (SOF_MARKERS.has(marker)) {
      if (pos + 2 + length > end || length < 8) throw new ImageHeaderError("JPEG frame header is truncated");
      return { width: u16(data, pos + 7), height: u16(data, pos + 5), channels: data[pos + 9], bit_depth: data[pos + 4] };
    }
    pos += 2 + length;
  }
  throw new ImageHeaderError("JPEG has no frame header before its image data");
}

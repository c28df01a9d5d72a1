/**
 * Header parsing: msgpack (via @msgpack/msgpack) or JSON (first byte `{`), bounded in size and
 * depth, into the raw tree of values.js. Mirrors Python's `wire.load_header`: msgpack with
 * `raw=False, strict_map_key=True`, every length capped at the header limit, no extension types.
 * @module
 */

import { Decoder } from "@msgpack/msgpack";

import { WireError } from "./errors.js";
import { parseJson } from "./json.js";
import { BYTES_KEY, PROTO_KEY, WireFloat, depth, holdsLoneSurrogate, isMap } from "./values.js";

const strictUtf8 = new TextDecoder("utf-8", { fatal: true, ignoreBOM: true });

/** Map keys as Python's msgpack with strict_map_key=True takes them: str or bytes, nothing else. */
function mapKey(key) {
  if (typeof key === "string") return key;
  if (key instanceof Uint8Array) {
    let text = BYTES_KEY;
    for (let i = 0; i < key.length; i += 4096) text += String.fromCharCode(...key.subarray(i, i + 4096));
    return text;
  }
  throw new TypeError(`map key of type ${key instanceof WireFloat ? "float" : typeof key}`);
}

/**
 * @msgpack/msgpack's Decoder, made to keep what the field checks need: floats stay floats
 * (a {@link WireFloat}), strings are strict UTF-8 as in Python (a BOM is kept, invalid bytes are
 * refused), and the key "__proto__" becomes a marker instead of an error. It overrides three
 * methods of @msgpack/msgpack 3.x; test/hostile.test.js pins this behaviour.
 */
class RawDecoder extends Decoder {
  readF32() {
    return new WireFloat(super.readF32());
  }

  readF64() {
    return new WireFloat(super.readF64());
  }

  decodeUtf8String(byteLength, headerOffset) {
    super.decodeUtf8String(byteLength, headerOffset); // bounds checks, and moves past the string
    const text = strictUtf8.decode(this.bytes.subarray(this.pos - byteLength, this.pos));
    return text === "__proto__" && this.stateIsMapKey() ? PROTO_KEY : text;
  }
}

const decoders = new Map(); // header limit -> decoder (a Decoder is reusable, not re-entrant)

function rawDecoder(maxBytes) {
  let decoder = decoders.get(maxBytes);
  if (!decoder) {
    decoder = new RawDecoder({
      useBigInt64: true, // int64 / uint64 formats as bigint: exact
      maxStrLength: maxBytes,
      maxBinLength: maxBytes,
      maxArrayLength: maxBytes,
      maxMapLength: maxBytes,
      maxExtLength: 0, // Python: max_ext_len=0, so no extension type (not even timestamps)
      mapKeyConverter: mapKey,
    });
    if (decoders.size > 8) decoders.clear();
    decoders.set(maxBytes, decoder);
  }
  return decoder;
}

/**
 * Parse a header frame into a raw map; WireError `too_large` or `header` otherwise.
 * @param {Uint8Array} data
 * @param {{maxHeaderBytes: number, maxHeaderDepth: number}} limits
 */
export function loadHeader(data, limits) {
  if (data.byteLength > limits.maxHeaderBytes) {
    throw new WireError(`header of ${data.byteLength} bytes exceeds the ${limits.maxHeaderBytes}-byte limit`,
      "too_large");
  }
  let header;
  try {
    if (data[0] === 0x7b) {
      header = parseJson(strictUtf8.decode(data), limits.maxHeaderDepth);
    } else {
      header = rawDecoder(limits.maxHeaderBytes).decode(data);
    }
  } catch (e) {
    throw new WireError(`header is neither msgpack nor JSON: ${e && e.message}`, "header");
  }
  if (!isMap(header)) {
    throw new WireError(`header must be a map, got ${Array.isArray(header) ? "an array" : typeof header}`, "header");
  }
  if (depth(header, limits.maxHeaderDepth + 1) > limits.maxHeaderDepth) {
    throw new WireError(`header is nested deeper than ${limits.maxHeaderDepth} levels`, "header");
  }
  if (holdsLoneSurrogate(header)) {
    throw new WireError("header holds a string that is not valid Unicode (a lone surrogate)", "header");
  }
  return header;
}

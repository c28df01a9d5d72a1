// sapiens2-stream-client 0.1.0: browser build of src/decode.js (npm run build; do not edit)
var __defProp = Object.defineProperty;
var __defNormalProp = (obj, key, value) => key in obj ? __defProp(obj, key, { enumerable: true, configurable: true, writable: true, value }) : obj[key] = value;
var __publicField = (obj, key, value) => __defNormalProp(obj, typeof key !== "symbol" ? key + "" : key, value);

// src/values.js
var WireFloat = class {
  /** @param {number} value */
  constructor(value) {
    this.value = value;
  }
};
var PROTO_KEY = "\uDC01__proto__";
var BYTES_KEY = "\uDC00";
var ESCAPE_KEY = "\uDC02";
var INT64_MIN = -(2n ** 63n);
var INT64_MAX = 2n ** 63n - 1n;
var UINT64_MAX = 2n ** 64n - 1n;
function get(map, key, fallback = void 0) {
  return Object.prototype.hasOwnProperty.call(map, key) ? map[key] : fallback;
}
function has(map, key) {
  return Object.prototype.hasOwnProperty.call(map, key);
}
function isMap(value) {
  return value !== null && typeof value === "object" && !Array.isArray(value) && !(value instanceof Uint8Array) && !(value instanceof WireFloat);
}
function isStrKey(key) {
  return !key.startsWith(BYTES_KEY);
}
function isInt(value, lo = 0n, hi = INT64_MAX) {
  let big2;
  if (typeof value === "bigint") big2 = value;
  else if (typeof value === "number" && Number.isSafeInteger(value)) big2 = BigInt(value);
  else return false;
  return big2 >= lo && big2 <= hi;
}
function isNumber(value) {
  if (value instanceof WireFloat) return Number.isFinite(value.value);
  if (typeof value === "bigint") return Number.isFinite(Number(value));
  return typeof value === "number" && Number.isFinite(value);
}
function toNumber(value) {
  return value instanceof WireFloat ? value.value : Number(value);
}
function normInt(value) {
  const big2 = BigInt(value);
  return big2 >= -BigInt(Number.MAX_SAFE_INTEGER) && big2 <= BigInt(Number.MAX_SAFE_INTEGER) ? Number(big2) : big2;
}
function equalsInt(value, n) {
  if (value === true || value === false) return Number(value) === n;
  if (value instanceof WireFloat) return value.value === n;
  if (typeof value === "bigint") return value === BigInt(n);
  return value === n;
}
function depth(value, stop) {
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
var LONE_SURROGATE = /[\uD800-\uDBFF](?![\uDC00-\uDFFF])|(?<![\uD800-\uDBFF])[\uDC00-\uDFFF]/;
function notUnicode(text) {
  return LONE_SURROGATE.test(text);
}
function holdsLoneSurrogate(value) {
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
function define(obj, key, value) {
  Object.defineProperty(obj, key, { value, enumerable: true, writable: true, configurable: true });
}
function plainKey(key) {
  if (key === PROTO_KEY) return "__proto__";
  if (key.startsWith(ESCAPE_KEY)) return key.slice(1);
  return key;
}
function toPlain(value) {
  if (value instanceof WireFloat) return value.value;
  if (typeof value === "bigint") return normInt(value);
  if (value instanceof Uint8Array) return new Uint8Array(value);
  if (Array.isArray(value)) return value.map(toPlain);
  if (isMap(value)) {
    const out = {};
    for (const [key, child] of Object.entries(value)) define(out, plainKey(key), toPlain(child));
    return out;
  }
  return value;
}

// src/errors.js
var REASONS = Object.freeze([
  "too_large",
  "frames",
  "topic",
  "header",
  "schema",
  "version",
  "field",
  "parts",
  "shape",
  "dtype",
  "encoding",
  "image"
]);
var WireError = class extends Error {
  /**
   * @param {string} message what was wrong, for people
   * @param {string} [reason] one of REASONS (default `"field"`, as in the Python reference)
   */
  constructor(message, reason = "field") {
    super(message);
    this.name = "WireError";
    this.reason = reason;
  }
};
function describe(_, v) {
  if (typeof v === "bigint") return `${v}`;
  if (v instanceof Uint8Array) return `<${v.length} bytes>`;
  if (v instanceof WireFloat) return v.value;
  return v;
}
function show(value, max = 80) {
  let text;
  try {
    text = typeof value === "bigint" ? `${value}` : JSON.stringify(value, describe);
  } catch {
    text = String(value);
  }
  if (text === void 0) text = String(value);
  return text.length > max ? `${text.slice(0, max)}...` : text;
}

// src/fields.js
var TWO_31 = 2n ** 31n;
var isBool = (v) => v === true || v === false;
function checkMap(header, key, check, what) {
  const value = get(header, key, {});
  if (!isMap(value) || !Object.entries(value).every(([k, v]) => isStrKey(k) && check(v))) {
    throw new WireError(`${key} must be a map of names to ${what}, got ${show(value)}`);
  }
}
function optional(header, key, check, what) {
  if (has(header, key) && !check(header[key])) {
    throw new WireError(`${key} must be ${what}, got ${show(header[key])}`);
  }
}
var dimension = (v) => isInt(v, 0n, TWO_31);
var SOURCE_RE = /^[A-Za-z0-9_:-]{1,64}$/;
function isValidSourceId(sourceId) {
  return typeof sourceId === "string" && SOURCE_RE.test(sourceId);
}
function checkFrameFields(header) {
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
function checkWorldFields(header) {
  for (const key of ["num_persons", "num_keypoints"]) optional(header, key, dimension, "a non-negative integer");
  optional(
    header,
    "units",
    (v) => typeof v === "string" && [...v].length > 0 && [...v].length <= 16,
    "a short string"
  );
  const cameras = get(header, "cameras");
  if (!(Array.isArray(cameras) && cameras.every(isValidSourceId) && new Set(cameras).size === cameras.length)) {
    throw new WireError(`cameras must be a list of distinct source ids, got ${show(cameras)}`);
  }
  const known = new Set(cameras);
  const frames = get(header, "camera_frames");
  if (!(isMap(frames) && Object.entries(frames).every(([k, v]) => known.has(k) && isInt(v)))) {
    throw new WireError(`camera_frames must map cameras to frame indices, got ${show(frames)}`);
  }
}
function checkStatusFields(header) {
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
  optional(
    header,
    "detector",
    (v) => typeof v === "string" && [...v].length > 0 && [...v].length <= 64,
    "a short string"
  );
  if (has(header, "event")) checkEvent(header.event);
}
var nonNegative = (v) => isNumber(v) && toNumber(v) >= 0;
var EVENT_FIELDS = {
  event: [(v) => typeof v === "string" && [...v].length > 0 && [...v].length <= 64, "a short string"],
  time_ns: [(v) => isInt(v, 0n, UINT64_MAX), "an unsigned integer"],
  session: [(v) => isInt(v), "a non-negative integer"],
  last_frame: [(v) => isInt(v, -1n), "an integer >= -1"],
  first_frame: [(v) => isInt(v), "a non-negative integer"],
  silent_s: [nonNegative, "a non-negative number"],
  outage_s: [nonNegative, "a non-negative number"],
  reason: [(v) => typeof v === "string", "a string"]
};
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
function checkEvent(event) {
  if (!isMap(event) || !has(event, "event")) {
    throw new WireError(`event must be a map with an event name, got ${show(event)}`);
  }
  for (const [key, value] of Object.entries(event)) {
    const [check, what] = Object.prototype.hasOwnProperty.call(EVENT_FIELDS, key) ? EVENT_FIELDS[key] : [jsonValue, "plain data (no bytes)"];
    if (!isStrKey(key) || !check(value)) {
      throw new WireError(`event field ${show(key)} must be ${what}, got ${show(value)}`);
    }
  }
}

// node_modules/@msgpack/msgpack/dist.esm/utils/utf8.mjs
var sharedTextEncoder = new TextEncoder();
var CHUNK_SIZE = 4096;
function utf8DecodeJs(bytes, inputOffset, byteLength) {
  let offset = inputOffset;
  const end = offset + byteLength;
  const units = [];
  let result = "";
  while (offset < end) {
    const byte1 = bytes[offset++];
    if ((byte1 & 128) === 0) {
      units.push(byte1);
    } else if ((byte1 & 224) === 192) {
      const byte2 = bytes[offset++] & 63;
      units.push((byte1 & 31) << 6 | byte2);
    } else if ((byte1 & 240) === 224) {
      const byte2 = bytes[offset++] & 63;
      const byte3 = bytes[offset++] & 63;
      units.push((byte1 & 31) << 12 | byte2 << 6 | byte3);
    } else if ((byte1 & 248) === 240) {
      const byte2 = bytes[offset++] & 63;
      const byte3 = bytes[offset++] & 63;
      const byte4 = bytes[offset++] & 63;
      let unit = (byte1 & 7) << 18 | byte2 << 12 | byte3 << 6 | byte4;
      if (unit > 65535) {
        unit -= 65536;
        units.push(unit >>> 10 & 1023 | 55296);
        unit = 56320 | unit & 1023;
      }
      units.push(unit);
    } else {
      units.push(byte1);
    }
    if (units.length >= CHUNK_SIZE) {
      result += String.fromCharCode(...units);
      units.length = 0;
    }
  }
  if (units.length > 0) {
    result += String.fromCharCode(...units);
  }
  return result;
}
var sharedTextDecoder = new TextDecoder();
var TEXT_DECODER_THRESHOLD = 200;
function utf8DecodeTD(bytes, inputOffset, byteLength) {
  const stringBytes = bytes.subarray(inputOffset, inputOffset + byteLength);
  return sharedTextDecoder.decode(stringBytes);
}
function utf8Decode(bytes, inputOffset, byteLength) {
  if (byteLength > TEXT_DECODER_THRESHOLD) {
    return utf8DecodeTD(bytes, inputOffset, byteLength);
  } else {
    return utf8DecodeJs(bytes, inputOffset, byteLength);
  }
}

// node_modules/@msgpack/msgpack/dist.esm/ExtData.mjs
var ExtData = class {
  constructor(type, data) {
    __publicField(this, "type");
    __publicField(this, "data");
    this.type = type;
    this.data = data;
  }
};

// node_modules/@msgpack/msgpack/dist.esm/DecodeError.mjs
var DecodeError = class _DecodeError extends Error {
  constructor(message) {
    super(message);
    const proto = Object.create(_DecodeError.prototype);
    Object.setPrototypeOf(this, proto);
    Object.defineProperty(this, "name", {
      configurable: true,
      enumerable: false,
      value: _DecodeError.name
    });
  }
};

// node_modules/@msgpack/msgpack/dist.esm/utils/int.mjs
var UINT32_MAX = 4294967295;
function setInt64(view, offset, value) {
  const high = Math.floor(value / 4294967296);
  const low = value;
  view.setUint32(offset, high);
  view.setUint32(offset + 4, low);
}
function getInt64(view, offset) {
  const high = view.getInt32(offset);
  const low = view.getUint32(offset + 4);
  return high * 4294967296 + low;
}
function getUint64(view, offset) {
  const high = view.getUint32(offset);
  const low = view.getUint32(offset + 4);
  return high * 4294967296 + low;
}

// node_modules/@msgpack/msgpack/dist.esm/timestamp.mjs
var EXT_TIMESTAMP = -1;
var TIMESTAMP32_MAX_SEC = 4294967296 - 1;
var TIMESTAMP64_MAX_SEC = 17179869184 - 1;
function encodeTimeSpecToTimestamp({ sec, nsec }) {
  if (sec >= 0 && nsec >= 0 && sec <= TIMESTAMP64_MAX_SEC) {
    if (nsec === 0 && sec <= TIMESTAMP32_MAX_SEC) {
      const rv = new Uint8Array(4);
      const view = new DataView(rv.buffer);
      view.setUint32(0, sec);
      return rv;
    } else {
      const secHigh = sec / 4294967296;
      const secLow = sec & 4294967295;
      const rv = new Uint8Array(8);
      const view = new DataView(rv.buffer);
      view.setUint32(0, nsec << 2 | secHigh & 3);
      view.setUint32(4, secLow);
      return rv;
    }
  } else {
    const rv = new Uint8Array(12);
    const view = new DataView(rv.buffer);
    view.setUint32(0, nsec);
    setInt64(view, 4, sec);
    return rv;
  }
}
function encodeDateToTimeSpec(date) {
  const msec = date.getTime();
  const sec = Math.floor(msec / 1e3);
  const nsec = (msec - sec * 1e3) * 1e6;
  const nsecInSec = Math.floor(nsec / 1e9);
  return {
    sec: sec + nsecInSec,
    nsec: nsec - nsecInSec * 1e9
  };
}
function encodeTimestampExtension(object) {
  if (object instanceof Date) {
    const timeSpec = encodeDateToTimeSpec(object);
    return encodeTimeSpecToTimestamp(timeSpec);
  } else {
    return null;
  }
}
function decodeTimestampToTimeSpec(data) {
  const view = new DataView(data.buffer, data.byteOffset, data.byteLength);
  switch (data.byteLength) {
    case 4: {
      const sec = view.getUint32(0);
      const nsec = 0;
      return { sec, nsec };
    }
    case 8: {
      const nsec30AndSecHigh2 = view.getUint32(0);
      const secLow32 = view.getUint32(4);
      const sec = (nsec30AndSecHigh2 & 3) * 4294967296 + secLow32;
      const nsec = nsec30AndSecHigh2 >>> 2;
      return { sec, nsec };
    }
    case 12: {
      const sec = getInt64(view, 4);
      const nsec = view.getUint32(0);
      return { sec, nsec };
    }
    default:
      throw new DecodeError(`Unrecognized data size for timestamp (expected 4, 8, or 12): ${data.length}`);
  }
}
function decodeTimestampExtension(data) {
  const timeSpec = decodeTimestampToTimeSpec(data);
  return new Date(timeSpec.sec * 1e3 + timeSpec.nsec / 1e6);
}
var timestampExtension = {
  type: EXT_TIMESTAMP,
  encode: encodeTimestampExtension,
  decode: decodeTimestampExtension
};

// node_modules/@msgpack/msgpack/dist.esm/ExtensionCodec.mjs
var _ExtensionCodec = class _ExtensionCodec {
  constructor() {
    // ensures ExtensionCodecType<X> matches ExtensionCodec<X>
    // this will make type errors a lot more clear
    // eslint-disable-next-line @typescript-eslint/naming-convention
    __publicField(this, "__brand");
    // built-in extensions
    __publicField(this, "builtInEncoders", []);
    __publicField(this, "builtInDecoders", []);
    // custom extensions
    __publicField(this, "encoders", []);
    __publicField(this, "decoders", []);
    this.register(timestampExtension);
  }
  register({ type, encode, decode: decode2 }) {
    if (type >= 0) {
      this.encoders[type] = encode;
      this.decoders[type] = decode2;
    } else {
      const index = -1 - type;
      this.builtInEncoders[index] = encode;
      this.builtInDecoders[index] = decode2;
    }
  }
  tryToEncode(object, context) {
    for (let i = 0; i < this.builtInEncoders.length; i++) {
      const encodeExt = this.builtInEncoders[i];
      if (encodeExt != null) {
        const data = encodeExt(object, context);
        if (data != null) {
          const type = -1 - i;
          return new ExtData(type, data);
        }
      }
    }
    for (let i = 0; i < this.encoders.length; i++) {
      const encodeExt = this.encoders[i];
      if (encodeExt != null) {
        const data = encodeExt(object, context);
        if (data != null) {
          const type = i;
          return new ExtData(type, data);
        }
      }
    }
    if (object instanceof ExtData) {
      return object;
    }
    return null;
  }
  decode(data, type, context) {
    const decodeExt = type < 0 ? this.builtInDecoders[-1 - type] : this.decoders[type];
    if (decodeExt) {
      return decodeExt(data, type, context);
    } else {
      return new ExtData(type, data);
    }
  }
};
__publicField(_ExtensionCodec, "defaultCodec", new _ExtensionCodec());
var ExtensionCodec = _ExtensionCodec;

// node_modules/@msgpack/msgpack/dist.esm/utils/typedArrays.mjs
function isArrayBufferLike(buffer) {
  return buffer instanceof ArrayBuffer || typeof SharedArrayBuffer !== "undefined" && buffer instanceof SharedArrayBuffer;
}
function ensureUint8Array(buffer) {
  if (buffer instanceof Uint8Array) {
    return buffer;
  } else if (ArrayBuffer.isView(buffer)) {
    return new Uint8Array(buffer.buffer, buffer.byteOffset, buffer.byteLength);
  } else if (isArrayBufferLike(buffer)) {
    return new Uint8Array(buffer);
  } else {
    return Uint8Array.from(buffer);
  }
}

// node_modules/@msgpack/msgpack/dist.esm/utils/prettyByte.mjs
function prettyByte(byte) {
  return `${byte < 0 ? "-" : ""}0x${Math.abs(byte).toString(16).padStart(2, "0")}`;
}

// node_modules/@msgpack/msgpack/dist.esm/CachedKeyDecoder.mjs
var DEFAULT_MAX_KEY_LENGTH = 16;
var DEFAULT_MAX_LENGTH_PER_KEY = 16;
var CachedKeyDecoder = class {
  constructor(maxKeyLength = DEFAULT_MAX_KEY_LENGTH, maxLengthPerKey = DEFAULT_MAX_LENGTH_PER_KEY) {
    __publicField(this, "hit", 0);
    __publicField(this, "miss", 0);
    __publicField(this, "caches");
    __publicField(this, "maxKeyLength");
    __publicField(this, "maxLengthPerKey");
    this.maxKeyLength = maxKeyLength;
    this.maxLengthPerKey = maxLengthPerKey;
    this.caches = [];
    for (let i = 0; i < this.maxKeyLength; i++) {
      this.caches.push([]);
    }
  }
  canBeCached(byteLength) {
    return byteLength > 0 && byteLength <= this.maxKeyLength;
  }
  find(bytes, inputOffset, byteLength) {
    const records = this.caches[byteLength - 1];
    FIND_CHUNK: for (const record of records) {
      const recordBytes = record.bytes;
      for (let j = 0; j < byteLength; j++) {
        if (recordBytes[j] !== bytes[inputOffset + j]) {
          continue FIND_CHUNK;
        }
      }
      return record.str;
    }
    return null;
  }
  store(bytes, value) {
    const records = this.caches[bytes.length - 1];
    const record = { bytes, str: value };
    if (records.length >= this.maxLengthPerKey) {
      records[Math.random() * records.length | 0] = record;
    } else {
      records.push(record);
    }
  }
  decode(bytes, inputOffset, byteLength) {
    const cachedValue = this.find(bytes, inputOffset, byteLength);
    if (cachedValue != null) {
      this.hit++;
      return cachedValue;
    }
    this.miss++;
    const str = utf8DecodeJs(bytes, inputOffset, byteLength);
    const slicedCopyOfBytes = Uint8Array.prototype.slice.call(bytes, inputOffset, inputOffset + byteLength);
    this.store(slicedCopyOfBytes, str);
    return str;
  }
};

// node_modules/@msgpack/msgpack/dist.esm/Decoder.mjs
var STATE_ARRAY = "array";
var STATE_MAP_KEY = "map_key";
var STATE_MAP_VALUE = "map_value";
var mapKeyConverter = (key) => {
  if (typeof key === "string" || typeof key === "number") {
    return key;
  }
  throw new DecodeError("The type of key must be string or number but " + typeof key);
};
var StackPool = class {
  constructor() {
    __publicField(this, "stack", []);
    __publicField(this, "stackHeadPosition", -1);
  }
  get length() {
    return this.stackHeadPosition + 1;
  }
  top() {
    return this.stack[this.stackHeadPosition];
  }
  pushArrayState(size) {
    const state = this.getUninitializedStateFromPool();
    state.type = STATE_ARRAY;
    state.position = 0;
    state.size = size;
    state.array = new Array(size);
  }
  pushMapState(size) {
    const state = this.getUninitializedStateFromPool();
    state.type = STATE_MAP_KEY;
    state.readCount = 0;
    state.size = size;
    state.map = {};
  }
  getUninitializedStateFromPool() {
    this.stackHeadPosition++;
    if (this.stackHeadPosition === this.stack.length) {
      const partialState = {
        type: void 0,
        size: 0,
        array: void 0,
        position: 0,
        readCount: 0,
        map: void 0,
        key: null
      };
      this.stack.push(partialState);
    }
    return this.stack[this.stackHeadPosition];
  }
  release(state) {
    const topStackState = this.stack[this.stackHeadPosition];
    if (topStackState !== state) {
      throw new Error("Invalid stack state. Released state is not on top of the stack.");
    }
    if (state.type === STATE_ARRAY) {
      const partialState = state;
      partialState.size = 0;
      partialState.array = void 0;
      partialState.position = 0;
      partialState.type = void 0;
    }
    if (state.type === STATE_MAP_KEY || state.type === STATE_MAP_VALUE) {
      const partialState = state;
      partialState.size = 0;
      partialState.map = void 0;
      partialState.readCount = 0;
      partialState.type = void 0;
    }
    this.stackHeadPosition--;
  }
  reset() {
    this.stack.length = 0;
    this.stackHeadPosition = -1;
  }
};
var HEAD_BYTE_REQUIRED = -1;
var EMPTY_VIEW = new DataView(new ArrayBuffer(0));
var EMPTY_BYTES = new Uint8Array(EMPTY_VIEW.buffer);
try {
  EMPTY_VIEW.getInt8(0);
} catch (e) {
  if (!(e instanceof RangeError)) {
    throw new Error("This module is not supported in the current JavaScript engine because DataView does not throw RangeError on out-of-bounds access");
  }
}
var MORE_DATA = new RangeError("Insufficient data");
var sharedCachedKeyDecoder = new CachedKeyDecoder();
var Decoder = class _Decoder {
  constructor(options) {
    __publicField(this, "extensionCodec");
    __publicField(this, "context");
    __publicField(this, "useBigInt64");
    __publicField(this, "rawStrings");
    __publicField(this, "maxStrLength");
    __publicField(this, "maxBinLength");
    __publicField(this, "maxArrayLength");
    __publicField(this, "maxMapLength");
    __publicField(this, "maxExtLength");
    __publicField(this, "keyDecoder");
    __publicField(this, "mapKeyConverter");
    __publicField(this, "totalPos", 0);
    __publicField(this, "pos", 0);
    __publicField(this, "view", EMPTY_VIEW);
    __publicField(this, "bytes", EMPTY_BYTES);
    __publicField(this, "headByte", HEAD_BYTE_REQUIRED);
    __publicField(this, "stack", new StackPool());
    __publicField(this, "entered", false);
    this.extensionCodec = options?.extensionCodec ?? ExtensionCodec.defaultCodec;
    this.context = options?.context;
    this.useBigInt64 = options?.useBigInt64 ?? false;
    this.rawStrings = options?.rawStrings ?? false;
    this.maxStrLength = options?.maxStrLength ?? UINT32_MAX;
    this.maxBinLength = options?.maxBinLength ?? UINT32_MAX;
    this.maxArrayLength = options?.maxArrayLength ?? UINT32_MAX;
    this.maxMapLength = options?.maxMapLength ?? UINT32_MAX;
    this.maxExtLength = options?.maxExtLength ?? UINT32_MAX;
    this.keyDecoder = options?.keyDecoder !== void 0 ? options.keyDecoder : sharedCachedKeyDecoder;
    this.mapKeyConverter = options?.mapKeyConverter ?? mapKeyConverter;
  }
  clone() {
    return new _Decoder({
      extensionCodec: this.extensionCodec,
      context: this.context,
      useBigInt64: this.useBigInt64,
      rawStrings: this.rawStrings,
      maxStrLength: this.maxStrLength,
      maxBinLength: this.maxBinLength,
      maxArrayLength: this.maxArrayLength,
      maxMapLength: this.maxMapLength,
      maxExtLength: this.maxExtLength,
      keyDecoder: this.keyDecoder
    });
  }
  reinitializeState() {
    this.totalPos = 0;
    this.headByte = HEAD_BYTE_REQUIRED;
    this.stack.reset();
  }
  setBuffer(buffer) {
    const bytes = ensureUint8Array(buffer);
    this.bytes = bytes;
    this.view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
    this.pos = 0;
  }
  appendBuffer(buffer) {
    if (this.headByte === HEAD_BYTE_REQUIRED && !this.hasRemaining(1)) {
      this.setBuffer(buffer);
    } else {
      const remainingData = this.bytes.subarray(this.pos);
      const newData = ensureUint8Array(buffer);
      const newBuffer = new Uint8Array(remainingData.length + newData.length);
      newBuffer.set(remainingData);
      newBuffer.set(newData, remainingData.length);
      this.setBuffer(newBuffer);
    }
  }
  hasRemaining(size) {
    return this.view.byteLength - this.pos >= size;
  }
  createExtraByteError(posToShow) {
    const { view, pos } = this;
    return new RangeError(`Extra ${view.byteLength - pos} of ${view.byteLength} byte(s) found at buffer[${posToShow}]`);
  }
  /**
   * @throws {@link DecodeError}
   * @throws {@link RangeError}
   */
  decode(buffer) {
    if (this.entered) {
      const instance = this.clone();
      return instance.decode(buffer);
    }
    try {
      this.entered = true;
      this.reinitializeState();
      this.setBuffer(buffer);
      const object = this.doDecodeSync();
      if (this.hasRemaining(1)) {
        throw this.createExtraByteError(this.pos);
      }
      return object;
    } finally {
      this.entered = false;
    }
  }
  *decodeMulti(buffer) {
    if (this.entered) {
      const instance = this.clone();
      yield* instance.decodeMulti(buffer);
      return;
    }
    try {
      this.entered = true;
      this.reinitializeState();
      this.setBuffer(buffer);
      while (this.hasRemaining(1)) {
        yield this.doDecodeSync();
      }
    } finally {
      this.entered = false;
    }
  }
  async decodeAsync(stream) {
    if (this.entered) {
      const instance = this.clone();
      return instance.decodeAsync(stream);
    }
    try {
      this.entered = true;
      let decoded = false;
      let object;
      for await (const buffer of stream) {
        if (decoded) {
          this.entered = false;
          throw this.createExtraByteError(this.totalPos);
        }
        this.appendBuffer(buffer);
        try {
          object = this.doDecodeSync();
          decoded = true;
        } catch (e) {
          if (!(e instanceof RangeError)) {
            throw e;
          }
        }
        this.totalPos += this.pos;
      }
      if (decoded) {
        if (this.hasRemaining(1)) {
          throw this.createExtraByteError(this.totalPos);
        }
        return object;
      }
      const { headByte, pos, totalPos } = this;
      throw new RangeError(`Insufficient data in parsing ${prettyByte(headByte)} at ${totalPos} (${pos} in the current buffer)`);
    } finally {
      this.entered = false;
    }
  }
  decodeArrayStream(stream) {
    return this.decodeMultiAsync(stream, true);
  }
  decodeStream(stream) {
    return this.decodeMultiAsync(stream, false);
  }
  async *decodeMultiAsync(stream, isArray) {
    if (this.entered) {
      const instance = this.clone();
      yield* instance.decodeMultiAsync(stream, isArray);
      return;
    }
    try {
      this.entered = true;
      let isArrayHeaderRequired = isArray;
      let arrayItemsLeft = -1;
      for await (const buffer of stream) {
        if (isArray && arrayItemsLeft === 0) {
          throw this.createExtraByteError(this.totalPos);
        }
        this.appendBuffer(buffer);
        if (isArrayHeaderRequired) {
          arrayItemsLeft = this.readArraySize();
          isArrayHeaderRequired = false;
          this.complete();
        }
        try {
          while (true) {
            yield this.doDecodeSync();
            if (--arrayItemsLeft === 0) {
              break;
            }
          }
        } catch (e) {
          if (!(e instanceof RangeError)) {
            throw e;
          }
        }
        this.totalPos += this.pos;
      }
    } finally {
      this.entered = false;
    }
  }
  doDecodeSync() {
    DECODE: while (true) {
      const headByte = this.readHeadByte();
      let object;
      if (headByte >= 224) {
        object = headByte - 256;
      } else if (headByte < 192) {
        if (headByte < 128) {
          object = headByte;
        } else if (headByte < 144) {
          const size = headByte - 128;
          if (size !== 0) {
            this.pushMapState(size);
            this.complete();
            continue DECODE;
          } else {
            object = {};
          }
        } else if (headByte < 160) {
          const size = headByte - 144;
          if (size !== 0) {
            this.pushArrayState(size);
            this.complete();
            continue DECODE;
          } else {
            object = [];
          }
        } else {
          const byteLength = headByte - 160;
          object = this.decodeString(byteLength, 0);
        }
      } else if (headByte === 192) {
        object = null;
      } else if (headByte === 194) {
        object = false;
      } else if (headByte === 195) {
        object = true;
      } else if (headByte === 202) {
        object = this.readF32();
      } else if (headByte === 203) {
        object = this.readF64();
      } else if (headByte === 204) {
        object = this.readU8();
      } else if (headByte === 205) {
        object = this.readU16();
      } else if (headByte === 206) {
        object = this.readU32();
      } else if (headByte === 207) {
        if (this.useBigInt64) {
          object = this.readU64AsBigInt();
        } else {
          object = this.readU64();
        }
      } else if (headByte === 208) {
        object = this.readI8();
      } else if (headByte === 209) {
        object = this.readI16();
      } else if (headByte === 210) {
        object = this.readI32();
      } else if (headByte === 211) {
        if (this.useBigInt64) {
          object = this.readI64AsBigInt();
        } else {
          object = this.readI64();
        }
      } else if (headByte === 217) {
        const byteLength = this.lookU8();
        object = this.decodeString(byteLength, 1);
      } else if (headByte === 218) {
        const byteLength = this.lookU16();
        object = this.decodeString(byteLength, 2);
      } else if (headByte === 219) {
        const byteLength = this.lookU32();
        object = this.decodeString(byteLength, 4);
      } else if (headByte === 220) {
        const size = this.readU16();
        if (size !== 0) {
          this.pushArrayState(size);
          this.complete();
          continue DECODE;
        } else {
          object = [];
        }
      } else if (headByte === 221) {
        const size = this.readU32();
        if (size !== 0) {
          this.pushArrayState(size);
          this.complete();
          continue DECODE;
        } else {
          object = [];
        }
      } else if (headByte === 222) {
        const size = this.readU16();
        if (size !== 0) {
          this.pushMapState(size);
          this.complete();
          continue DECODE;
        } else {
          object = {};
        }
      } else if (headByte === 223) {
        const size = this.readU32();
        if (size !== 0) {
          this.pushMapState(size);
          this.complete();
          continue DECODE;
        } else {
          object = {};
        }
      } else if (headByte === 196) {
        const size = this.lookU8();
        object = this.decodeBinary(size, 1);
      } else if (headByte === 197) {
        const size = this.lookU16();
        object = this.decodeBinary(size, 2);
      } else if (headByte === 198) {
        const size = this.lookU32();
        object = this.decodeBinary(size, 4);
      } else if (headByte === 212) {
        object = this.decodeExtension(1, 0);
      } else if (headByte === 213) {
        object = this.decodeExtension(2, 0);
      } else if (headByte === 214) {
        object = this.decodeExtension(4, 0);
      } else if (headByte === 215) {
        object = this.decodeExtension(8, 0);
      } else if (headByte === 216) {
        object = this.decodeExtension(16, 0);
      } else if (headByte === 199) {
        const size = this.lookU8();
        object = this.decodeExtension(size, 1);
      } else if (headByte === 200) {
        const size = this.lookU16();
        object = this.decodeExtension(size, 2);
      } else if (headByte === 201) {
        const size = this.lookU32();
        object = this.decodeExtension(size, 4);
      } else {
        throw new DecodeError(`Unrecognized type byte: ${prettyByte(headByte)}`);
      }
      this.complete();
      const stack = this.stack;
      while (stack.length > 0) {
        const state = stack.top();
        if (state.type === STATE_ARRAY) {
          state.array[state.position] = object;
          state.position++;
          if (state.position === state.size) {
            object = state.array;
            stack.release(state);
          } else {
            continue DECODE;
          }
        } else if (state.type === STATE_MAP_KEY) {
          if (object === "__proto__") {
            throw new DecodeError("The key __proto__ is not allowed");
          }
          state.key = this.mapKeyConverter(object);
          state.type = STATE_MAP_VALUE;
          continue DECODE;
        } else {
          state.map[state.key] = object;
          state.readCount++;
          if (state.readCount === state.size) {
            object = state.map;
            stack.release(state);
          } else {
            state.key = null;
            state.type = STATE_MAP_KEY;
            continue DECODE;
          }
        }
      }
      return object;
    }
  }
  readHeadByte() {
    if (this.headByte === HEAD_BYTE_REQUIRED) {
      this.headByte = this.readU8();
    }
    return this.headByte;
  }
  complete() {
    this.headByte = HEAD_BYTE_REQUIRED;
  }
  readArraySize() {
    const headByte = this.readHeadByte();
    switch (headByte) {
      case 220:
        return this.readU16();
      case 221:
        return this.readU32();
      default: {
        if (headByte < 160) {
          return headByte - 144;
        } else {
          throw new DecodeError(`Unrecognized array type byte: ${prettyByte(headByte)}`);
        }
      }
    }
  }
  pushMapState(size) {
    if (size > this.maxMapLength) {
      throw new DecodeError(`Max length exceeded: map length (${size}) > maxMapLengthLength (${this.maxMapLength})`);
    }
    this.stack.pushMapState(size);
  }
  pushArrayState(size) {
    if (size > this.maxArrayLength) {
      throw new DecodeError(`Max length exceeded: array length (${size}) > maxArrayLength (${this.maxArrayLength})`);
    }
    this.stack.pushArrayState(size);
  }
  decodeString(byteLength, headerOffset) {
    if (!this.rawStrings || this.stateIsMapKey()) {
      return this.decodeUtf8String(byteLength, headerOffset);
    }
    return this.decodeBinary(byteLength, headerOffset);
  }
  /**
   * @throws {@link RangeError}
   */
  decodeUtf8String(byteLength, headerOffset) {
    if (byteLength > this.maxStrLength) {
      throw new DecodeError(`Max length exceeded: UTF-8 byte length (${byteLength}) > maxStrLength (${this.maxStrLength})`);
    }
    if (this.bytes.byteLength < this.pos + headerOffset + byteLength) {
      throw MORE_DATA;
    }
    const offset = this.pos + headerOffset;
    let object;
    if (this.stateIsMapKey() && this.keyDecoder?.canBeCached(byteLength)) {
      object = this.keyDecoder.decode(this.bytes, offset, byteLength);
    } else {
      object = utf8Decode(this.bytes, offset, byteLength);
    }
    this.pos += headerOffset + byteLength;
    return object;
  }
  stateIsMapKey() {
    if (this.stack.length > 0) {
      const state = this.stack.top();
      return state.type === STATE_MAP_KEY;
    }
    return false;
  }
  /**
   * @throws {@link RangeError}
   */
  decodeBinary(byteLength, headOffset) {
    if (byteLength > this.maxBinLength) {
      throw new DecodeError(`Max length exceeded: bin length (${byteLength}) > maxBinLength (${this.maxBinLength})`);
    }
    if (!this.hasRemaining(byteLength + headOffset)) {
      throw MORE_DATA;
    }
    const offset = this.pos + headOffset;
    const object = this.bytes.subarray(offset, offset + byteLength);
    this.pos += headOffset + byteLength;
    return object;
  }
  decodeExtension(size, headOffset) {
    if (size > this.maxExtLength) {
      throw new DecodeError(`Max length exceeded: ext length (${size}) > maxExtLength (${this.maxExtLength})`);
    }
    const extType = this.view.getInt8(this.pos + headOffset);
    const data = this.decodeBinary(
      size,
      headOffset + 1
      /* extType */
    );
    return this.extensionCodec.decode(data, extType, this.context);
  }
  lookU8() {
    return this.view.getUint8(this.pos);
  }
  lookU16() {
    return this.view.getUint16(this.pos);
  }
  lookU32() {
    return this.view.getUint32(this.pos);
  }
  readU8() {
    const value = this.view.getUint8(this.pos);
    this.pos++;
    return value;
  }
  readI8() {
    const value = this.view.getInt8(this.pos);
    this.pos++;
    return value;
  }
  readU16() {
    const value = this.view.getUint16(this.pos);
    this.pos += 2;
    return value;
  }
  readI16() {
    const value = this.view.getInt16(this.pos);
    this.pos += 2;
    return value;
  }
  readU32() {
    const value = this.view.getUint32(this.pos);
    this.pos += 4;
    return value;
  }
  readI32() {
    const value = this.view.getInt32(this.pos);
    this.pos += 4;
    return value;
  }
  readU64() {
    const value = getUint64(this.view, this.pos);
    this.pos += 8;
    return value;
  }
  readI64() {
    const value = getInt64(this.view, this.pos);
    this.pos += 8;
    return value;
  }
  readU64AsBigInt() {
    const value = this.view.getBigUint64(this.pos);
    this.pos += 8;
    return value;
  }
  readI64AsBigInt() {
    const value = this.view.getBigInt64(this.pos);
    this.pos += 8;
    return value;
  }
  readF32() {
    const value = this.view.getFloat32(this.pos);
    this.pos += 4;
    return value;
  }
  readF64() {
    const value = this.view.getFloat64(this.pos);
    this.pos += 8;
    return value;
  }
};

// src/json.js
var MAX_INT_DIGITS = 4300;
var ESCAPES = { '"': '"', "\\": "\\", "/": "/", b: "\b", f: "\f", n: "\n", r: "\r", t: "	" };
var NUMBER_RE = /-?(?:0|[1-9][0-9]*)(\.[0-9]+)?([eE][-+]?[0-9]+)?/y;
var HEX4_RE = /^[0-9a-fA-F]{4}$/;
function parseJson(text, maxDepth) {
  let i = 0;
  const fail = (what) => {
    throw new SyntaxError(`${what} at character ${i}`);
  };
  const skipSpace = () => {
    for (; ; ) {
      const c = text.charCodeAt(i);
      if (c === 32 || c === 9 || c === 10 || c === 13) i++;
      else return;
    }
  };
  const parseString = () => {
    i++;
    let out = "";
    let start = i;
    for (; ; ) {
      if (i >= text.length) fail("unterminated string");
      const c = text.charCodeAt(i);
      if (c === 34) {
        out += text.slice(start, i);
        i++;
        return out;
      }
      if (c < 32) fail("control character in string");
      if (c !== 92) {
        i++;
        continue;
      }
      out += text.slice(start, i);
      const e = text[i + 1];
      if (e === "u") {
        const hex = text.slice(i + 2, i + 6);
        if (!HEX4_RE.test(hex)) fail("bad \\u escape");
        out += String.fromCharCode(parseInt(hex, 16));
        i += 6;
      } else if (e !== void 0 && Object.prototype.hasOwnProperty.call(ESCAPES, e)) {
        out += ESCAPES[e];
        i += 2;
      } else {
        fail("bad escape");
      }
      start = i;
    }
  };
  const parseNumber = () => {
    NUMBER_RE.lastIndex = i;
    const m = NUMBER_RE.exec(text);
    if (!m) fail("unexpected character");
    i = NUMBER_RE.lastIndex;
    if (m[1] === void 0 && m[2] === void 0) {
      const digits = m[0].replace("-", "");
      if (digits.length > MAX_INT_DIGITS) fail("integer with too many digits");
      return normInt(BigInt(m[0]));
    }
    return new WireFloat(Number(m[0]));
  };
  const parseValue = (level) => {
    skipSpace();
    const c = text[i];
    if (c === "{" || c === "[") {
      if (level + 1 > maxDepth) fail("nested too deeply");
      return c === "{" ? parseObject(level + 1) : parseArray(level + 1);
    }
    if (c === '"') return parseString();
    for (const [word, value2] of WORDS) {
      if (text.startsWith(word, i)) {
        i += word.length;
        return typeof value2 === "function" ? value2() : value2;
      }
    }
    return parseNumber();
  };
  const parseArray = (level) => {
    i++;
    const out = [];
    skipSpace();
    if (text[i] === "]") {
      i++;
      return out;
    }
    for (; ; ) {
      out.push(parseValue(level));
      skipSpace();
      if (text[i] === "]") {
        i++;
        return out;
      }
      if (text[i] !== ",") fail("expected ',' or ']'");
      i++;
    }
  };
  const parseObject = (level) => {
    i++;
    const out = {};
    skipSpace();
    if (text[i] === "}") {
      i++;
      return out;
    }
    for (; ; ) {
      skipSpace();
      if (text[i] !== '"') fail("expected a string key");
      const key = rawKey(parseString());
      skipSpace();
      if (text[i] !== ":") fail("expected ':'");
      i++;
      define(out, key, parseValue(level));
      skipSpace();
      if (text[i] === "}") {
        i++;
        return out;
      }
      if (text[i] !== ",") fail("expected ',' or '}'");
      i++;
    }
  };
  const value = parseValue(0);
  skipSpace();
  if (i !== text.length) fail("extra data");
  return value;
}
var WORDS = [
  ["true", true],
  ["false", false],
  ["null", null],
  ["NaN", () => new WireFloat(NaN)],
  ["Infinity", () => new WireFloat(Infinity)],
  ["-Infinity", () => new WireFloat(-Infinity)]
];
function rawKey(key) {
  if (key === "__proto__") return PROTO_KEY;
  const c = key.charCodeAt(0);
  if (c === BYTES_KEY.charCodeAt(0) || c === PROTO_KEY.charCodeAt(0) || c === ESCAPE_KEY.charCodeAt(0)) {
    return ESCAPE_KEY + key;
  }
  return key;
}

// src/header.js
var strictUtf8 = new TextDecoder("utf-8", { fatal: true, ignoreBOM: true });
function mapKey(key) {
  if (typeof key === "string") return key;
  if (key instanceof Uint8Array) {
    let text = BYTES_KEY;
    for (let i = 0; i < key.length; i += 4096) text += String.fromCharCode(...key.subarray(i, i + 4096));
    return text;
  }
  throw new TypeError(`map key of type ${key instanceof WireFloat ? "float" : typeof key}`);
}
var RawDecoder = class extends Decoder {
  readF32() {
    return new WireFloat(super.readF32());
  }
  readF64() {
    return new WireFloat(super.readF64());
  }
  decodeUtf8String(byteLength, headerOffset) {
    super.decodeUtf8String(byteLength, headerOffset);
    const text = strictUtf8.decode(this.bytes.subarray(this.pos - byteLength, this.pos));
    return text === "__proto__" && this.stateIsMapKey() ? PROTO_KEY : text;
  }
};
var decoders = /* @__PURE__ */ new Map();
function rawDecoder(maxBytes) {
  let decoder = decoders.get(maxBytes);
  if (!decoder) {
    decoder = new RawDecoder({
      useBigInt64: true,
      // int64 / uint64 formats as bigint: exact
      maxStrLength: maxBytes,
      maxBinLength: maxBytes,
      maxArrayLength: maxBytes,
      maxMapLength: maxBytes,
      maxExtLength: 0,
      // Python: max_ext_len=0, so no extension type (not even timestamps)
      mapKeyConverter: mapKey
    });
    if (decoders.size > 8) decoders.clear();
    decoders.set(maxBytes, decoder);
  }
  return decoder;
}
function loadHeader(data, limits) {
  if (data.byteLength > limits.maxHeaderBytes) {
    throw new WireError(
      `header of ${data.byteLength} bytes exceeds the ${limits.maxHeaderBytes}-byte limit`,
      "too_large"
    );
  }
  let header;
  try {
    if (data[0] === 123) {
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

// src/messages.js
var KEYPOINT_PARTS = Object.freeze({
  keypoints: ["<f4", ["N", "K", 2]],
  keypoint_scores: ["<f4", ["N", "K"]],
  boxes: ["<f4", ["N", 4]],
  box_scores: ["<f4", ["N"]],
  track_ids: ["<i8", ["N"]]
});
var KEYPOINT3D_PARTS = Object.freeze({
  keypoints3d: ["<f4", ["N", "K", 3]],
  keypoints3d_valid: ["|u1", ["N", "K"]],
  root3d: ["<f4", ["N", 3]],
  root3d_valid: ["|u1", ["N"]]
});
var WORLD_PARTS = Object.freeze({
  world_keypoints: ["<f4", ["N", "K", 3]],
  world_valid: ["|u1", ["N", "K"]],
  world_error: ["<f4", ["N", "K"]],
  world_views: ["|u1", ["N", "K"]],
  world_ids: ["<i8", ["N"]],
  world_members: ["<i4", ["N", "C"]],
  single_view: ["<i4", ["S", 2]]
});
var IMAGE_PART = Object.freeze({ frame: "image", seg: "classes", matte: "alpha" });
var own = (obj, key) => Object.prototype.hasOwnProperty.call(obj, key);
var big = (v) => typeof v === "bigint" ? v : BigInt(v);
var numbers = (map) => Object.fromEntries(Object.entries(map ?? {}).map(([k, v]) => [k, Number(v)]));
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
    const want = shape.map((s) => typeof s === "string" ? sizes[s] : s);
    if (array.encoding !== "raw" || array.dtype !== dtype || array.shape.length !== want.length || array.shape.some((s, i) => s !== want[i])) {
      throw new WireError(`${kind} part ${show(name)} is ${show(array.shape)} ${array.dtype}, expected ${show(want)} ${dtype}`, "shape");
    }
  }
}
function worldArrays(h, arrays) {
  const missing = Object.keys(WORLD_PARTS).filter((name) => !own(arrays, name));
  if (missing.length) throw new WireError(`world message lacks parts ${show(missing)}`, "parts");
  const { world_ids: ids, world_keypoints: xyz, world_members: members, single_view: single } = arrays;
  const sizes = {
    N: ids.shape.length === 1 ? ids.shape[0] : -1,
    K: xyz.shape.length === 3 ? xyz.shape[1] : -1,
    C: h.cameras.length,
    S: single.shape.length === 2 ? single.shape[0] : -1
  };
  checkParts(arrays, WORLD_PARTS, sizes, "world");
  const lowest = members.data.reduce((lo, v) => Math.min(lo, v), 0);
  if (lowest < -1) {
    throw new WireError(`world_members holds ${lowest}: an index is -1 (not seen) or more`, "shape");
  }
  for (let i = 0; i < single.data.length; i += 2) {
    if (single.data[i] < 0 || single.data[i] >= sizes.C || single.data[i + 1] < 0) {
      throw new WireError(
        `single_view holds a camera column outside 0..${sizes.C - 1} or a negative person index`,
        "shape"
      );
    }
  }
  return sizes;
}
function membersOf(world, person) {
  const c = world.cameras.length;
  const out = {};
  world.cameras.forEach((camera, j) => {
    const index = world.world_members[person * c + j];
    if (index >= 0) out[camera] = index;
  });
  return out;
}
var Keypoints3D = class {
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
};
function keypoints3d(h, a) {
  return new Keypoints3D(
    a.keypoints3d.data,
    a.keypoints3d_valid.data,
    a.root3d.data,
    a.root3d_valid.data,
    h.keypoints3d_metric ?? false
  );
}
function metaFromHeader(h) {
  return {
    source_id: h.source_id,
    frame_index: Number(h.frame_index),
    pts: h.pts === void 0 || h.pts === null ? null : big(h.pts),
    time_base: h.time_base ? [Number(h.time_base[0]), Number(h.time_base[1])] : null,
    capture_ns: big(h.capture_ns ?? 0),
    session: Number(h.session ?? 0),
    latency_ms: numbers(h.latency_ms),
    drops: numbers(h.drops),
    width: Number(h.width ?? 0),
    height: Number(h.height ?? 0),
    random_weights: h.random_weights ?? false
  };
}
function toMessage(d) {
  const h = d.header;
  const base = {
    kind: d.kind,
    topic: d.topic,
    source_id: d.source_id,
    header: h,
    arrays: d.arrays,
    publish_ns: big(h.publish_ns ?? 0)
  };
  if (d.kind === "status") {
    let event;
    if (h.event !== null && typeof h.event === "object" && !Array.isArray(h.event) && !(h.event instanceof Uint8Array)) {
      event = { ...h.event };
      if (typeof event.time_ns === "bigint" || Number.isInteger(event.time_ns)) event.time_ns = big(event.time_ns);
      else delete event.time_ns;
    }
    return {
      ...base,
      fps: Number(h.fps),
      health: h.health,
      frames: Number(h.frames),
      last_frame_index: Number(h.last_frame_index),
      drops: numbers(h.drops),
      sent: numbers(h.sent),
      detector: h.detector ?? null,
      ...event ? { event } : {}
    };
  }
  const meta = metaFromHeader(h);
  const a = d.arrays;
  if (d.kind === "keypoints") {
    const { n, k, has3d } = keypointArrays(a);
    return {
      ...base,
      meta,
      num_persons: n,
      num_keypoints: k,
      keypoints: a.keypoints.data,
      keypoint_scores: a.keypoint_scores.data,
      boxes: a.boxes.data,
      box_scores: a.box_scores.data,
      track_ids: a.track_ids.data,
      keypoints3d: has3d ? keypoints3d(h, a) : null,
      shapes: Object.fromEntries(Object.keys(KEYPOINT_PARTS).map((name2) => [name2, a[name2].shape]))
    };
  }
  if (d.kind === "world") {
    const { N, K, S } = worldArrays(h, a);
    return {
      ...base,
      meta,
      num_persons: N,
      num_keypoints: K,
      num_single_view: S,
      units: h.units ?? "m",
      cameras: [...h.cameras],
      camera_frames: numbers(h.camera_frames),
      ...Object.fromEntries(Object.keys(WORLD_PARTS).map((part2) => [part2, a[part2].data])),
      shapes: Object.fromEntries(Object.keys(WORLD_PARTS).map((part2) => [part2, a[part2].shape]))
    };
  }
  const name = IMAGE_PART[d.kind];
  if (!own(a, name)) throw new WireError(`${d.kind} message lacks its ${show(name)} part`, "parts");
  const part = a[name];
  const [encoding, layout] = d.kind === "frame" ? ["jpeg", "H, W, 3"] : ["png", "H, W"];
  const fits = part.dtype === "|u1" && (d.kind === "frame" ? part.shape.length === 3 && part.shape[2] === 3 : part.shape.length === 2);
  if (![encoding, "raw"].includes(part.encoding) || !fits) {
    throw new WireError(`${d.kind} message: its ${show(name)} part must be ${encoding} or raw (${layout}) |u1, got ${part.encoding} (${part.shape.join(", ")}) ${part.dtype}`, "encoding");
  }
  if (d.kind === "frame") return { ...base, meta, image: a[name], annotated: h.annotated ?? false };
  if (d.kind === "seg") return { ...base, meta, classes: a[name] };
  return { ...base, meta, alpha: a[name], alpha_scale: Number(h.alpha_scale ?? 255) };
}

// src/images.js
var ImageHeaderError = class extends Error {
  constructor(message) {
    super(message);
    this.name = "ImageHeaderError";
  }
};
var PNG_SIGNATURE = [137, 80, 78, 71, 13, 10, 26, 10];
var IHDR = [73, 72, 68, 82];
var SOF_MARKERS = /* @__PURE__ */ new Set([192, 193, 194, 195, 197, 198, 199, 201, 202, 203, 205, 206, 207]);
var PNG_CHANNELS = /* @__PURE__ */ new Map([[0, 1], [2, 3], [3, 3], [4, 2], [6, 4]]);
var u16 = (d, i) => d[i] << 8 | d[i + 1];
var u32 = (d, i) => d[i] * 16777216 + (d[i + 1] << 16 | d[i + 2] << 8 | d[i + 3]);
var bytesAt = (d, i, want) => want.every((b, k) => d[i + k] === b);
function pngInfo(data) {
  if (data.length < 33 || !bytesAt(data, 0, PNG_SIGNATURE) || !bytesAt(data, 12, IHDR)) {
    throw new ImageHeaderError("not a PNG (no signature and IHDR chunk)");
  }
  const color = data[25];
  if (!PNG_CHANNELS.has(color)) throw new ImageHeaderError(`PNG colour type ${color} is not valid`);
  return { width: u32(data, 16), height: u32(data, 20), channels: PNG_CHANNELS.get(color), bit_depth: data[24] };
}
function jpegInfo(data) {
  if (data.length < 2 || data[0] !== 255 || data[1] !== 216) throw new ImageHeaderError("not a JPEG (no SOI marker)");
  const end = data.length;
  let pos = 2;
  while (pos + 4 <= end) {
    if (data[pos] !== 255) throw new ImageHeaderError(`JPEG marker expected at byte ${pos}`);
    const marker = data[pos + 1];
    if (marker === 255) {
      pos += 1;
      continue;
    }
    if (marker === 1 || marker >= 208 && marker < 216) {
      pos += 2;
      continue;
    }
    if (marker === 217 || marker === 218) break;
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

// src/parts.js
var DTYPES = Object.freeze({
  "|u1": [Uint8Array, 1],
  "|i1": [Int8Array, 1],
  "<u2": [Uint16Array, 2],
  "<i2": [Int16Array, 2],
  "<u4": [Uint32Array, 4],
  "<i4": [Int32Array, 4],
  "<u8": [BigUint64Array, 8],
  "<i8": [BigInt64Array, 8],
  "<f2": [Uint16Array, 2],
  "<f4": [Float32Array, 4],
  "<f8": [Float64Array, 8]
});
var RAW_DTYPES = Object.freeze(Object.keys(DTYPES));
var LITTLE_ENDIAN_HOST = new Uint8Array(new Uint16Array([1]).buffer)[0] === 1;
var TWO_312 = 2n ** 31n;
function checkShape(name, shape, limits) {
  if (!Array.isArray(shape) || shape.length > limits.maxDims || !shape.every((s) => isInt(s, 0n, TWO_312))) {
    throw new WireError(
      `part ${show(name)}: bad shape ${show(shape)} (at most ${limits.maxDims} sizes, each 0..2^31)`,
      "shape"
    );
  }
  return shape.map(Number);
}
function typedArray(data, dtype) {
  const [Type, itemSize] = DTYPES[dtype];
  const copy = new Uint8Array(data.byteLength);
  copy.set(data);
  if (!LITTLE_ENDIAN_HOST && itemSize > 1) {
    for (let i = 0; i < copy.length; i += itemSize) copy.subarray(i, i + itemSize).reverse();
  }
  return new Type(copy.buffer, 0, copy.byteLength / itemSize);
}
function decodePart(desc, data, limits) {
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
  const want = shape.reduce((n, s) => n * BigInt(s), 1n) * BigInt(itemSize);
  if (want > BigInt(limits.maxArrayBytes)) {
    throw new WireError(`part ${show(name)}: shape ${show(shape)} ${dtype} is ${want} bytes, over the ${limits.maxArrayBytes}-byte limit`, "too_large");
  }
  if (enc === "raw") {
    if (BigInt(data.byteLength) !== want) {
      throw new WireError(`part ${show(name)}: ${data.byteLength} bytes for shape ${show(shape)} ${dtype} (${want} expected)`, "shape");
    }
    return [name, { encoding: "raw", dtype, shape, data: typedArray(data, dtype) }];
  }
  if (enc !== "jpeg" && enc !== "png") {
    throw new WireError(`part ${show(name)}: unknown encoding ${show(enc, 40)}`, "encoding");
  }
  return [name, checkImage(name, enc, dtype, shape, data, limits)];
}
function checkImage(name, enc, dtype, shape, data, limits) {
  const jpeg = enc === "jpeg";
  const channels = jpeg ? 3 : 1;
  if (dtype !== "|u1" || shape.length !== (jpeg ? 3 : 2) || jpeg && shape[2] !== 3) {
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
    throw new WireError(`part ${show(name)}: the ${enc} holds ${info.width}x${info.height}x${info.channels} (${info.bit_depth}-bit), the header says ${show(shape)}`, "shape");
  }
  if (info.width * info.height > limits.maxPixels) {
    throw new WireError(`part ${show(name)}: ${info.width}x${info.height} pixels exceed the limit of ${limits.maxPixels}`, "too_large");
  }
  return {
    encoding: enc,
    dtype,
    shape,
    bytes: data,
    width: info.width,
    height: info.height,
    channels,
    bit_depth: info.bit_depth,
    ...jpeg ? { color: "rgb" } : {}
  };
}

// src/framing.js
var utf8 = new TextEncoder();
function bytesOf(frame, i) {
  if (typeof frame === "string") return utf8.encode(frame);
  if (ArrayBuffer.isView(frame)) return new Uint8Array(frame.buffer, frame.byteOffset, frame.byteLength);
  if (frame instanceof ArrayBuffer) return new Uint8Array(frame);
  throw new TypeError(`frame ${i} is not bytes or a string`);
}
function packFrames(frames) {
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
function unpackFrames(data, { maxFrames = 18, maxBytes = 64 * 1024 * 1024 + 4 * 19 } = {}) {
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

// src/decode.js
var SCHEMA = "sapiens2.stream";
var SCHEMA_VERSION = 1;
var KINDS = Object.freeze(["keypoints", "frame", "seg", "matte", "status", "world"]);
var IMAGE_KINDS = Object.freeze(["frame", "seg", "matte"]);
var ENCODINGS = Object.freeze(["raw", "jpeg", "png"]);
var DEFAULT_MAX_MESSAGE_BYTES = 64 * 1024 * 1024;
var DEFAULT_ENDPOINT = "tcp://127.0.0.1:5555";
var BROKER_XSUB = "tcp://127.0.0.1:5556";
var BROKER_XPUB = "tcp://127.0.0.1:5557";
var DEFAULT_LIMITS = Object.freeze({
  maxMessageBytes: DEFAULT_MAX_MESSAGE_BYTES,
  // all frames of one message together
  maxHeaderBytes: 64 * 1024,
  maxParts: 16,
  maxDims: 4,
  maxArrayBytes: 256 * 1024 * 1024,
  // one decoded part (a PNG decodes to more than it weighs)
  maxPixels: 64 * 1024 * 1024,
  // one image part: width * height
  maxHeaderDepth: 4
  // header -> parts -> part -> shape
});
var ascii = new TextDecoder();
function makeLimits(limits) {
  return limits ? Object.freeze({ ...DEFAULT_LIMITS, ...limits }) : DEFAULT_LIMITS;
}
function asBytes(frame, i) {
  if (ArrayBuffer.isView(frame)) return new Uint8Array(frame.buffer, frame.byteOffset, frame.byteLength);
  if (frame instanceof ArrayBuffer) return new Uint8Array(frame);
  throw new TypeError(`frame ${i} is not bytes (Uint8Array, Buffer or ArrayBuffer)`);
}
function decode(frames, limits, expectedVersion = SCHEMA_VERSION) {
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
  if (parts[0].some((b) => b > 127)) throw new WireError("topic is not ASCII", "topic");
  const topic = ascii.decode(parts[0]);
  const header = loadHeader(parts[1], lim);
  if (get(header, "schema") !== SCHEMA) {
    throw new WireError(`schema ${show(get(header, "schema"), 40)} is not ${show(SCHEMA)}`, "schema");
  }
  if (!equalsInt(get(header, "version"), expectedVersion)) {
    throw new WireError(`publisher speaks ${SCHEMA} version ${show(get(header, "version"), 20)}, this subscriber reads version ${expectedVersion}; install matching sapiens2-stream versions on both ends`, "version");
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
function decodeMessage(frames, limits) {
  return toMessage(decode(frames, limits));
}
function ptsSeconds(meta) {
  if (meta.pts === null || meta.time_base === null) return null;
  return Number(meta.pts) * meta.time_base[0] / meta.time_base[1];
}
export {
  BROKER_XPUB,
  BROKER_XSUB,
  DEFAULT_ENDPOINT,
  DEFAULT_LIMITS,
  DEFAULT_MAX_MESSAGE_BYTES,
  ENCODINGS,
  IMAGE_KINDS,
  IMAGE_PART,
  ImageHeaderError,
  KEYPOINT3D_PARTS,
  KEYPOINT_PARTS,
  KINDS,
  Keypoints3D,
  RAW_DTYPES,
  REASONS,
  SCHEMA,
  SCHEMA_VERSION,
  WORLD_PARTS,
  WireError,
  decode,
  decodeMessage,
  isValidSourceId,
  jpegInfo,
  makeLimits,
  membersOf,
  packFrames,
  pngInfo,
  ptsSeconds,
  toMessage,
  unpackFrames
};

// A small msgpack writer for the tests: it can write what @msgpack/msgpack's encoder will not
// (a float that is integral, 64-bit integers in a chosen width, bytes or integer map keys,
// extension types), so hostile headers can be built byte for byte.

/** A float to write as float64 (or float32 with `bits: 32`), even when it is integral. */
export class F {
  constructor(value, bits = 64) {
    this.value = value;
    this.bits = bits;
  }
}

/** An extension value: type code and data. */
export class Ext {
  constructor(type, data) {
    this.type = type;
    this.data = data;
  }
}

/** An integer written in exactly this msgpack format byte (0xcc..0xd3). */
export class I {
  constructor(value, format) {
    this.value = BigInt(value);
    this.format = format;
  }
}

const utf8 = new TextEncoder();

function head(out, small, base, codes, n) {
  if (small !== null && n < small) out.push(base + n);
  else if (n < 0x100 && codes[0] !== null) out.push(codes[0], n);
  else if (n < 0x10000) out.push(codes[1], n >> 8, n & 0xff);
  else out.push(codes[2], (n >>> 24) & 0xff, (n >>> 16) & 0xff, (n >>> 8) & 0xff, n & 0xff);
}

function int(out, v) {
  const big = BigInt(v);
  if (big >= 0n && big < 128n) return out.push(Number(big));
  if (big < 0n && big >= -32n) return out.push(Number(big) & 0xff);
  const fmt = big >= 0n ? (big < 256n ? 0xcc : big < 65536n ? 0xcd : big < 2n ** 32n ? 0xce : 0xcf)
    : (big >= -128n ? 0xd0 : big >= -32768n ? 0xd1 : big >= -(2n ** 31n) ? 0xd2 : 0xd3);
  fixed(out, big, fmt);
}

function fixed(out, big, fmt) {
  const size = { 0xcc: 1, 0xcd: 2, 0xce: 4, 0xcf: 8, 0xd0: 1, 0xd1: 2, 0xd2: 4, 0xd3: 8 }[fmt];
  const bits = BigInt(size * 8);
  let u = BigInt.asUintN(Number(bits), big);
  const bytes = [];
  for (let i = 0; i < size; i++) {
    bytes.unshift(Number(u & 0xffn));
    u >>= 8n;
  }
  out.push(fmt, ...bytes);
}

function write(out, v) {
  if (v === null || v === undefined) out.push(0xc0);
  else if (v === true) out.push(0xc3);
  else if (v === false) out.push(0xc2);
  else if (v instanceof F) {
    const view = new DataView(new ArrayBuffer(v.bits / 8));
    if (v.bits === 32) view.setFloat32(0, v.value);
    else view.setFloat64(0, v.value);
    out.push(v.bits === 32 ? 0xca : 0xcb, ...new Uint8Array(view.buffer));
  } else if (v instanceof I) fixed(out, v.value, v.format);
  else if (typeof v === "bigint") int(out, v);
  else if (typeof v === "number") {
    if (Number.isInteger(v)) int(out, v);
    else write(out, new F(v));
  } else if (typeof v === "string") {
    const b = utf8.encode(v);
    head(out, 32, 0xa0, [0xd9, 0xda, 0xdb], b.length);
    for (const x of b) out.push(x);
  } else if (v instanceof Uint8Array) {
    head(out, null, 0, [0xc4, 0xc5, 0xc6], v.length);
    for (const x of v) out.push(x);
  } else if (v instanceof Ext) {
    head(out, null, 0, [0xc7, 0xc8, 0xc9], v.data.length);
    out.push(v.type & 0xff);
    for (const x of v.data) out.push(x);
  } else if (Array.isArray(v)) {
    head(out, 16, 0x90, [null, 0xdc, 0xdd], v.length);
    for (const x of v) write(out, x);
  } else {
    const entries = v instanceof Map ? [...v.entries()] : Object.entries(v);
    head(out, 16, 0x80, [null, 0xde, 0xdf], entries.length);
    for (const [k, x] of entries) {
      write(out, k);
      write(out, x);
    }
  }
}

/** msgpack bytes of a value (see F, I, Ext; a Map may have keys of any type). */
export function pack(value) {
  const out = [];
  write(out, value);
  return Uint8Array.from(out);
}

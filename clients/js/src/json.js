/**
 * A JSON parser with the semantics of Python's `json.loads`, producing the raw header tree of
 * values.js: integers stay exact (bigint beyond 2^53) and apart from floats (`1` vs `1.0`),
 * `NaN` / `Infinity` / `-Infinity` are accepted (the field checks then refuse them), control
 * characters inside strings are not (Python's `strict=True`), integers of more than 4300 digits
 * are refused (Python's int conversion limit), and nesting deeper than `maxDepth` is refused
 * while parsing (the stack never grows with hostile input). `JSON.parse` can do none of this.
 * @module
 */

import { BYTES_KEY, ESCAPE_KEY, PROTO_KEY, WireFloat, define, normInt } from "./values.js";

const MAX_INT_DIGITS = 4300; // sys.get_int_max_str_digits() default
const ESCAPES = { '"': '"', "\\": "\\", "/": "/", b: "\b", f: "\f", n: "\n", r: "\r", t: "\t" };
const NUMBER_RE = /-?(?:0|[1-9][0-9]*)(\.[0-9]+)?([eE][-+]?[0-9]+)?/y;
const HEX4_RE = /^[0-9a-fA-F]{4}$/;

/**
 * Parse JSON text into a raw tree; throws SyntaxError for anything Python's json.loads refuses
 * and for nesting deeper than `maxDepth` containers.
 * @param {string} text
 * @param {number} maxDepth
 */
export function parseJson(text, maxDepth) {
  let i = 0;
  const fail = (what) => {
    throw new SyntaxError(`${what} at character ${i}`);
  };
  const skipSpace = () => {
    for (;;) {
      const c = text.charCodeAt(i);
      if (c === 0x20 || c === 0x09 || c === 0x0a || c === 0x0d) i++;
      else return;
    }
  };

  const parseString = () => {
    i++; // opening quote
    let out = "";
    let start = i;
    for (;;) {
      if (i >= text.length) fail("unterminated string");
      const c = text.charCodeAt(i);
      if (c === 0x22) {
        out += text.slice(start, i);
        i++;
        return out;
      }
      if (c < 0x20) fail("control character in string");
      if (c !== 0x5c) {
        i++;
        continue;
      }
      out += text.slice(start, i);
      const e = text[i + 1];
      if (e === "u") {
        const hex = text.slice(i + 2, i + 6);
        if (!HEX4_RE.test(hex)) fail("bad \\u escape");
        out += String.fromCharCode(parseInt(hex, 16)); // surrogate pairs join as JS strings do
        i += 6;
      } else if (e !== undefined && Object.prototype.hasOwnProperty.call(ESCAPES, e)) {
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
    if (m[1] === undefined && m[2] === undefined) {
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
    for (const [word, value] of WORDS) {
      if (text.startsWith(word, i)) {
        i += word.length;
        return typeof value === "function" ? value() : value;
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
    for (;;) {
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
    for (;;) {
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

// Python's scanner also reads these (NaN and the infinities are floats there).
const WORDS = [
  ["true", true], ["false", false], ["null", null],
  ["NaN", () => new WireFloat(NaN)], ["Infinity", () => new WireFloat(Infinity)],
  ["-Infinity", () => new WireFloat(-Infinity)],
];

/** The raw-tree form of a JSON object key (see the markers of values.js). */
function rawKey(key) {
  if (key === "__proto__") return PROTO_KEY;
  const c = key.charCodeAt(0);
  if (c === BYTES_KEY.charCodeAt(0) || c === PROTO_KEY.charCodeAt(0) || c === ESCAPE_KEY.charCodeAt(0)) {
    return ESCAPE_KEY + key;
  }
  return key;
}

/**
 * Refusals of the wire format (docs/WIRE.md, "Hostile input: limits and refusal reasons").
 * @module
 */

import { WireFloat } from "./values.js";

/**
 * Why a message was refused; `Subscriber.stats.skipped` counts by these.
 * @type {readonly string[]}
 */
export const REASONS = Object.freeze([
  "too_large", "frames", "topic", "header", "schema", "version", "field", "parts", "shape", "dtype",
  "encoding", "image",
]);

/**
 * A message does not follow the wire format. `reason` is one of {@link REASONS}.
 * The decoder throws this and nothing else for bad input.
 */
export class WireError extends Error {
  /**
   * @param {string} message what was wrong, for people
   * @param {string} [reason] one of REASONS (default `"field"`, as in the Python reference)
   */
  constructor(message, reason = "field") {
    super(message);
    this.name = "WireError";
    /** @type {string} */
    this.reason = reason;
  }
}

/** JSON.stringify replacer: bigints as digits, bytes as their length, header floats as numbers. */
function describe(_, v) {
  if (typeof v === "bigint") return `${v}`;
  if (v instanceof Uint8Array) return `<${v.length} bytes>`;
  if (v instanceof WireFloat) return v.value;
  return v;
}

/** Shorten a value for an error message (never throws, whatever the value is). */
export function show(value, max = 80) {
  let text;
  try {
    text = typeof value === "bigint" ? `${value}` : JSON.stringify(value, describe);
  } catch {
    text = String(value);
  }
  if (text === undefined) text = String(value);
  return text.length > max ? `${text.slice(0, max)}...` : text;
}

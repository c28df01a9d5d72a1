// Shared helpers of the tests (not part of the package).

import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import { existsSync, readFileSync } from "node:fs";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

export const PACKAGE_DIR = resolve(dirname(fileURLToPath(import.meta.url)), "..");
export const REPO_DIR = resolve(PACKAGE_DIR, "..", "..");
export const VECTORS_FILE = join(REPO_DIR, "clients", "vectors", "vectors.json");

/** The shared test vectors, with `{"$int": "digits"}` turned into bigint. */
export function loadVectors() {
  return JSON.parse(readFileSync(VECTORS_FILE, "utf8"), (_, v) =>
    v !== null && typeof v === "object" && !Array.isArray(v) && Object.keys(v).length === 1 && typeof v.$int === "string"
      ? BigInt(v.$int) : v);
}

/** Base64 frames of a vector case as Node Buffers. */
export const framesOf = (c) => c.frames.map((b) => Buffer.from(b, "base64"));

/** sha256 (hex) of a typed array's bytes. */
export function sha256(typed) {
  return createHash("sha256").update(new Uint8Array(typed.buffer, typed.byteOffset, typed.byteLength)).digest("hex");
}

/** The sapiens2-stream CLI: $SAPIENS2_STREAM_CLI, else the repository's .venv, else /work/main/.venv. */
export function pipelineCli() {
  if (process.env.SAPIENS2_STREAM_CLI) return process.env.SAPIENS2_STREAM_CLI;
  const local = join(REPO_DIR, ".venv", "bin", "sapiens2-stream");
  return existsSync(local) ? local : "/work/main/.venv/bin/sapiens2-stream";
}

/** The reference Python (for the parity test): $SAPIENS2_STREAM_PYTHON, else beside the CLI. */
export function referencePython() {
  return process.env.SAPIENS2_STREAM_PYTHON ?? join(dirname(pipelineCli()), "python");
}

/** Whether this is a CI run (CI=true, which CI services set): there, no test may skip. */
export const CI = /^(?:true|1)$/i.test(process.env.CI ?? "");

/**
 * Options and body of a test (or describe) that needs something: `test(name, ...needs(missing, fn))`,
 * `missing` naming what is lacking, or false when it is there. Outside CI the test is skipped for
 * that reason; under CI it fails instead, naming it (a CI run that skipped it would pass without
 * checking anything).
 * @param {string | false} missing
 * @param {Function} fn
 * @returns {[object, Function]}
 */
export function needs(missing, fn) {
  if (!missing) return [{}, fn];
  if (!CI) return [{ skip: missing }, fn];
  return [{}, () => assert.fail(`CI=true, and this test cannot run: ${missing}`)];
}

/** Seeded PRNG (mulberry32): the same mutants on every run. */
export function rng(seed) {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

/** Random mutations of good messages: byte flips, random bytes, truncation, insertion, deletion. */
export function mutants(bases, count, seed) {
  const rand = rng(seed);
  const pick = (n) => Math.floor(rand() * n);
  const out = [];
  for (let i = 0; i < count; i++) {
    const base = bases[pick(bases.length)];
    const frames = base.frames.map((f) => Uint8Array.from(f));
    // Image pixels are decoded by Python only: mutate the topic and header of image messages.
    const index = base.images ? pick(2) : pick(frames.length);
    let f = frames[index];
    const edits = 1 + pick(3);
    for (let e = 0; e < edits; e++) {
      const at = pick(f.length + 1);
      const op = pick(5);
      if (op === 0 && f.length) f[at % f.length] ^= 1 << pick(8);
      else if (op === 1 && f.length) f[at % f.length] = pick(256);
      else if (op === 2) f = f.subarray(0, at);
      else if (op === 3) f = Uint8Array.from([...f.subarray(0, at), pick(256), ...f.subarray(at)]);
      else f = Uint8Array.from([...f.subarray(0, at), ...f.subarray(at + 1)]);
    }
    frames[index] = f;
    out.push(frames);
  }
  return out;
}

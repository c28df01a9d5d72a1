// Differential test against the Python reference decoder (sapiens2_client.messages.decode_message):
// the hand-made corpus and a few thousand seeded random mutations of the vectors must be refused
// for the same reason (or accepted) by both. Needs the repository's Python environment
// ($SAPIENS2_STREAM_PYTHON, default: the python beside the pipeline CLI); skipped without it, and
// failed without it under CI (CI=true).

import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { existsSync } from "node:fs";
import { join } from "node:path";
import { test } from "node:test";

import { WireError, decodeMessage } from "../src/index.js";
import { CASES, image, keypoints, status, world } from "./corpus.js";
import { F } from "./pack.js";
import { REPO_DIR, framesOf, loadVectors, mutants, needs, referencePython } from "./helpers.js";

const PYTHON = referencePython();
const missing = existsSync(PYTHON) ? false
  : `the reference Python is not found at ${PYTHON} (set SAPIENS2_STREAM_PYTHON)`;

const REFERENCE = `
import base64, json, sys
sys.path.insert(0, ${JSON.stringify(join(REPO_DIR, "clients", "python"))})
from sapiens2_client import wire
from sapiens2_client.messages import decode_message
out = []
for frames in json.load(sys.stdin):
    try:
        decode_message([base64.b64decode(f) for f in frames])
        out.append("ok")
    except wire.WireError as e:
        out.append(e.reason)
    except Exception as e:
        out.append("crash:" + type(e).__name__)
json.dump(out, sys.stdout)
`;

/** The Python reference's outcome for each message: "ok", a reason, or "crash:<exception>". */
function reference(messages) {
  const input = JSON.stringify(messages.map((frames) => frames.map((f) => Buffer.from(f).toString("base64"))));
  const run = spawnSync(PYTHON, ["-c", REFERENCE], { input, encoding: "utf8", maxBuffer: 1 << 28 });
  assert.equal(run.status, 0, run.stderr);
  return JSON.parse(run.stdout);
}

/** This package's outcome: "ok" or a reason (anything but a WireError fails the test). */
function outcome(frames) {
  try {
    decodeMessage(frames);
    return "ok";
  } catch (e) {
    if (e instanceof WireError) return e.reason;
    throw e;
  }
}

test("the corpus: the reference decoder gives the outcomes this package is tested for", ...needs(missing, () => {
  const got = reference(CASES.map((c) => c.frames));
  const wrong = [];
  CASES.forEach((c, i) => {
    const want = c.python === "crash" ? "crash:" : (c.python ?? c.reason);
    const ok = want === "crash:" ? got[i].startsWith("crash:") : got[i] === want;
    if (!ok) wrong.push(`${c.name}: Python ${got[i]}, expected ${want}`);
  });
  assert.deepEqual(wrong, []);
}));

test("seeded mutations of the vectors: same outcome as the reference decoder", ...needs(missing, () => {
  const vectors = loadVectors().cases.filter((c) => c.expect);
  const bases = [
    ...vectors.map((c) => ({ frames: framesOf(c), images: ["frame", "seg", "matte"].includes(c.expect.kind) })),
    ...CASES.filter((c) => c.reason === "ok" && !c.python).map((c) => ({ frames: c.frames, images: false })),
  ];
  const messages = mutants(bases, 3000, 20251201);
  const got = reference(messages);
  const wrong = [];
  let crashes = 0;
  messages.forEach((frames, i) => {
    const mine = outcome(frames);
    if (got[i].startsWith("crash:")) crashes++; // a reference bug; this package still refused or accepted it
    else if (mine !== got[i]) wrong.push(`mutant ${i}: this package ${mine}, Python ${got[i]}`);
  });
  assert.deepEqual(wrong.slice(0, 20), [], `${wrong.length} of ${messages.length} mutants differ`);
  const refused = got.filter((g) => g !== "ok").length;
  assert.ok(refused > messages.length / 4, `the mutants should mostly be refused (${refused})`);
  assert.ok(crashes < messages.length / 100, `reference crashes: ${crashes}`);
}));

test("every header field set to every kind of value: same outcome as the reference decoder", ...needs(missing, () => {
  const values = [
    null, true, false, 0, 1, -1, 2 ** 31, 2 ** 31 + 1, 2n ** 63n - 1n, 2n ** 63n, -(2n ** 63n), 2n ** 64n - 1n,
    new F(0), new F(1), new F(1.5), new F(-1), new F(NaN), new F(Infinity), "", "x", "ok", "sapiens2.stream", "cam0",
    "keypoints", new TextEncoder().encode("x"), [], [1], [1, 1], [1, 0], [0, 1], [1, 2, 3], {}, { a: 1 },
    { a: new F(1.5) }, { a: -1 }, { a: "x" }, [{ name: "x" }], ["a", "b"], ["b", "a"], ["a", "a"], ["a", 1],
    { a: 1, b: 2 }, { c: 1 },
  ];
  const messages = [];
  const bases = [
    ["keypoints", (over, format) => keypoints(over, { format })],
    ["status", (over, format) => status(over, { format })],
    ["matte", (over) => image("matte", { name: "alpha", encoding: "raw", dtype: "|u1", shape: [1, 1] },
      new Uint8Array(1), over)],
    ["frame", (over) => image("frame", { name: "image", encoding: "raw", dtype: "|u1", shape: [1, 1, 3] },
      new Uint8Array(3), over)],
    ["status event", (over, format) => status({ event: { event: "stalled", ...over } }, { format })],
    ["world", (over, format) => world(over, { format })],
    ["world camera_frames", (over, format) => world({ camera_frames: over }, { format })],
  ];
  const keys = ["schema", "version", "kind", "source_id", "publish_ns", "frame_index", "pts", "time_base",
    "capture_ns", "session", "latency_ms", "drops", "width", "height", "random_weights", "num_persons",
    "num_keypoints", "annotated", "alpha_scale", "fps", "health", "frames", "last_frame_index", "sent", "uptime_s",
    "nominal_fps", "live", "event", "parts", "unknown", "time_ns", "last_frame", "reason", "units", "cameras",
    "camera_frames", "a", "b"];
  for (const [, make] of bases) {
    for (const key of keys) {
      for (const value of values) {
        for (const format of ["msgpack", "json"]) {
          if (format === "json" && value instanceof Uint8Array) continue;
          messages.push(make({ [key]: value }, format));
        }
      }
    }
  }
  const got = reference(messages);
  const wrong = [];
  messages.forEach((frames, i) => {
    const mine = outcome(frames);
    if (mine !== got[i]) wrong.push(`${new TextDecoder().decode(frames[1]).slice(0, 200)}: this package ${mine}, Python ${got[i]}`);
  });
  assert.deepEqual(wrong.slice(0, 10), [], `${wrong.length} of ${messages.length} differ`);
}));

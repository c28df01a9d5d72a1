// Keypoints3D.relative(): root-relative 3D keypoints, the same numbers as the Python client's
// Keypoints3D.relative() (by hand on a small case, and against the Python reference on the same
// messages when the repository's Python is there), through src and through the browser build.

import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { existsSync } from "node:fs";
import { join } from "node:path";
import { describe, test } from "node:test";

import * as browser from "../../../pipeline/viewer/static/sapiens2-client.browser.js";
import * as node from "../src/index.js";
import { keypoints } from "./corpus.js";
import { REPO_DIR, framesOf, loadVectors, needs, referencePython } from "./helpers.js";

const PYTHON = referencePython();
const missing = existsSync(PYTHON) ? false
  : `the reference Python is not found at ${PYTHON} (set SAPIENS2_STREAM_PYTHON)`;

const bytesOf = (typed) => new Uint8Array(typed.buffer, typed.byteOffset, typed.byteLength);

/** A keypoints message with N=2, K=2 and 3D parts: person 0 has a root and one invalid point, person 1 no root. */
function twoPersons() {
  const raw = (name, dtype, shape) => ({ name, encoding: "raw", dtype, shape });
  const parts = [
    raw("keypoints", "<f4", [2, 2, 2]), raw("keypoint_scores", "<f4", [2, 2]), raw("boxes", "<f4", [2, 4]),
    raw("box_scores", "<f4", [2]), raw("track_ids", "<i8", [2]), raw("keypoints3d", "<f4", [2, 2, 3]),
    raw("keypoints3d_valid", "|u1", [2, 2]), raw("root3d", "<f4", [2, 3]), raw("root3d_valid", "|u1", [2]),
  ];
  const data = [
    new Float32Array(8), new Float32Array(4), new Float32Array(8), new Float32Array(2), new BigInt64Array(2),
    Float32Array.of(1.5, 2.25, 3.1, 0, 0, 0, 7, 8, 9, 10, 11, 12),
    Uint8Array.of(1, 0, 1, 1),
    Float32Array.of(0.5, 0.25, 1.1, 0, 0, 0),
    Uint8Array.of(1, 0),
  ].map(bytesOf);
  return keypoints({ num_persons: 2, keypoints3d_metric: true }, { parts, data });
}

for (const [label, impl] of [["src", node], ["browser build", browser]]) {
  describe(`Keypoints3D.relative() (${label})`, () => {
    test("subtracts the root where point and root are valid, zeros elsewhere", () => {
      const k3 = impl.decodeMessage(twoPersons()).keypoints3d;
      assert.ok(k3 instanceof impl.Keypoints3D);
      const { xyz, valid } = k3.relative();
      assert.ok(xyz instanceof Float32Array && valid instanceof Uint8Array);
      assert.deepEqual([...valid], [1, 0, 0, 0]); // point 1 invalid; person 1 has no root
      const f = Math.fround;
      assert.deepEqual([...xyz], [f(f(1.5) - f(0.5)), f(f(2.25) - f(0.25)), f(f(3.1) - f(1.1)), 0, 0, 0, 0, 0, 0,
        0, 0, 0]);
      assert.deepEqual([...k3.xyz.subarray(0, 3)], [f(1.5), f(2.25), f(3.1)], "relative() leaves the message as it is");
    });

    test("no persons: empty arrays", () => {
      const k3 = new impl.Keypoints3D(new Float32Array(0), new Uint8Array(0), new Float32Array(0), new Uint8Array(0),
        false);
      const { xyz, valid } = k3.relative();
      assert.equal(xyz.length, 0);
      assert.equal(valid.length, 0);
    });
  });
}

const RELATIVE = `
import base64, json, sys
sys.path.insert(0, ${JSON.stringify(join(REPO_DIR, "clients", "python"))})
from sapiens2_client.messages import decode_message
out = []
for frames in json.load(sys.stdin):
    xyz, ok = decode_message([base64.b64decode(f) for f in frames]).keypoints3d.relative()
    out.append({"xyz": xyz.reshape(-1).tolist(), "valid": ok.reshape(-1).astype(int).tolist()})
json.dump(out, sys.stdout)
`;

test("the same numbers as the Python client's Keypoints3D.relative()", ...needs(missing, () => {
  const messages = [twoPersons(), ...loadVectors().cases.filter((c) => c.expect?.arrays?.keypoints3d).map(framesOf)];
  assert.ok(messages.length >= 2, "the vectors have a keypoints message with 3D parts");
  const input = JSON.stringify(messages.map((frames) => frames.map((f) => Buffer.from(f).toString("base64"))));
  const run = spawnSync(PYTHON, ["-c", RELATIVE], { input, encoding: "utf8" });
  assert.equal(run.status, 0, run.stderr);
  const want = JSON.parse(run.stdout);
  messages.forEach((frames, i) => {
    const { xyz, valid } = node.decodeMessage(frames).keypoints3d.relative();
    assert.deepEqual([...valid], want[i].valid, `message ${i} validity`);
    assert.deepEqual([...xyz], want[i].xyz, `message ${i} coordinates`);
  });
}));

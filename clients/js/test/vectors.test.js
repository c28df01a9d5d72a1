// Every case of clients/vectors/vectors.json, through src/decode.js and through the browser build:
// good cases decode to exactly the expected topic/kind/source/header/arrays, bad ones are refused
// with exactly the expected reason.

import assert from "node:assert/strict";
import { describe, test } from "node:test";

import * as browser from "../../../pipeline/viewer/static/sapiens2-client.browser.js";
import * as node from "../src/index.js";
import { framesOf, loadVectors, sha256 } from "./helpers.js";

const vectors = loadVectors();
const TYPED = {
  "|u1": Uint8Array, "|i1": Int8Array, "<u2": Uint16Array, "<i2": Int16Array, "<u4": Uint32Array,
  "<i4": Int32Array, "<u8": BigUint64Array, "<i8": BigInt64Array, "<f2": Uint16Array, "<f4": Float32Array,
  "<f8": Float64Array,
};

test("the vectors file is the format this client reads", () => {
  assert.equal(vectors.schema, node.SCHEMA);
  assert.equal(vectors.version, node.SCHEMA_VERSION);
  assert.ok(vectors.cases.some((c) => c.expect) && vectors.cases.some((c) => c.error));
});

/** Check one decoded part against its expectation (pixels decoded for images). */
async function checkArray(name, got, want) {
  assert.equal(got.dtype, want.dtype, `${name} dtype`);
  assert.deepEqual(got.shape, want.shape, `${name} shape`);
  if (got.encoding === "raw") {
    assert.ok(got.data instanceof TYPED[want.dtype], `${name} is a ${TYPED[want.dtype].name}`);
    assert.equal(got.data.length, want.shape.reduce((a, b) => a * b, 1));
    assert.equal(sha256(got.data), want.sha256, `${name} sha256`);
    return;
  }
  const pixels = await node.decodePixels(got);
  assert.deepEqual(pixels.shape, want.shape, `${name} decoded shape`);
  if (want.sha256 !== undefined) {
    assert.equal(sha256(pixels.data), want.sha256, `${name} pixel sha256`);
  } else {
    const reference = Buffer.from(want.reference, "base64");
    assert.equal(pixels.data.length, reference.length);
    let sum = 0;
    for (let i = 0; i < reference.length; i++) sum += Math.abs(pixels.data[i] - reference[i]);
    const diff = sum / reference.length;
    assert.ok(diff <= want.max_mean_abs_diff, `${name}: mean abs diff ${diff} > ${want.max_mean_abs_diff}`);
  }
}

/** Typed-message facts every good case must show. */
function checkTyped(msg, expect) {
  assert.equal(msg.kind, expect.kind);
  assert.equal(msg.topic, expect.topic);
  assert.equal(msg.source_id, expect.source_id);
  assert.equal(typeof msg.publish_ns, "bigint");
  assert.equal(msg.publish_ns, BigInt(expect.header.publish_ns));
  if (msg.kind === "status") {
    assert.equal(msg.fps, expect.header.fps);
    assert.equal(msg.health, expect.header.health);
    if (expect.header.event) assert.equal(msg.event.time_ns, BigInt(expect.header.event.time_ns));
    return;
  }
  assert.equal(typeof msg.meta.capture_ns, "bigint");
  assert.equal(msg.meta.capture_ns, BigInt(expect.header.capture_ns));
  assert.equal(msg.meta.frame_index, expect.header.frame_index);
  assert.deepEqual(msg.meta.time_base, expect.header.time_base);
  assert.equal(msg.meta.pts, expect.header.pts === null ? null : BigInt(expect.header.pts));
  if (msg.kind === "world") {
    const [n, k] = expect.arrays.world_valid.shape;
    assert.equal(msg.num_persons, n);
    assert.equal(msg.num_keypoints, k);
    assert.equal(msg.units, "m");
    assert.deepEqual(msg.cameras, expect.header.cameras);
    assert.deepEqual(msg.camera_frames, expect.header.camera_frames);
    assert.deepEqual(msg.shapes.world_members, [n, msg.cameras.length]);
    assert.ok(msg.world_keypoints instanceof Float32Array && msg.world_keypoints.length === n * k * 3);
    assert.ok(msg.world_valid instanceof Uint8Array && msg.world_views instanceof Uint8Array);
    assert.ok(msg.world_ids instanceof BigInt64Array && msg.world_members instanceof Int32Array);
    assert.equal(msg.single_view.length, 2 * msg.num_single_view);
    for (let i = 0; i < n * k; i++) { // invalid points are zeros on the wire, in every part
      if (msg.world_valid[i]) continue;
      assert.ok(msg.world_keypoints.subarray(3 * i, 3 * i + 3).every((v) => v === 0));
      assert.ok(msg.world_error[i] === 0 && msg.world_views[i] === 0);
    }
    for (let p = 0; p < n; p++) {
      const seen = Object.fromEntries(msg.cameras.map((c, j) => [c, msg.world_members[p * msg.cameras.length + j]])
        .filter(([, i]) => i >= 0));
      assert.deepEqual(node.membersOf(msg, p), seen);
    }
  }
  if (msg.kind === "keypoints") {
    const [n, k] = expect.arrays.keypoints.shape;
    assert.equal(msg.num_persons, n);
    assert.equal(msg.num_keypoints, k);
    assert.deepEqual(msg.shapes.keypoints, [n, k, 2]);
    assert.ok(msg.keypoints instanceof Float32Array && msg.track_ids instanceof BigInt64Array);
    if (expect.arrays.keypoints3d) {
      const k3 = msg.keypoints3d;
      assert.ok(k3.xyz instanceof Float32Array && k3.xyz.length === n * k * 3);
      assert.ok(k3.valid instanceof Uint8Array && k3.valid.length === n * k);
      assert.ok(k3.root instanceof Float32Array && k3.root.length === n * 3);
      assert.ok(k3.root_valid instanceof Uint8Array && k3.root_valid.length === n);
      assert.equal(k3.metric, expect.header.keypoints3d_metric);
      for (let i = 0; i < n * k; i++) { // invalid points are zeros on the wire
        if (!k3.valid[i]) assert.ok(k3.xyz.subarray(3 * i, 3 * i + 3).every((v) => v === 0));
      }
    } else {
      assert.equal(msg.keypoints3d, null);
    }
  }
}

for (const [label, impl] of [["src", node], ["browser build", browser]]) {
  describe(`vectors (${label})`, () => {
    for (const c of vectors.cases) {
      if (c.expect) {
        test(c.name, async () => {
          const frames = framesOf(c);
          const d = impl.decode(frames);
          assert.equal(d.topic, c.expect.topic);
          assert.equal(d.kind, c.expect.kind);
          assert.equal(d.source_id, c.expect.source_id);
          assert.deepStrictEqual(d.header, c.expect.header);
          assert.deepEqual(Object.keys(d.arrays).sort(), Object.keys(c.expect.arrays).sort());
          for (const [name, want] of Object.entries(c.expect.arrays)) await checkArray(name, d.arrays[name], want);
          checkTyped(impl.decodeMessage(frames), c.expect);
        });
      } else {
        test(`${c.name} is refused: ${c.error}`, () => {
          assert.throws(() => impl.decodeMessage(framesOf(c)), (e) => {
            assert.ok(e instanceof impl.WireError, `a WireError, got ${e}`);
            assert.equal(e.reason, c.error, e.message);
            return true;
          });
        });
      }
    }
  });
}

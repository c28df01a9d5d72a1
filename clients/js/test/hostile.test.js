// Hostile input: the hand-made corpus (huge shapes, truncated frames, bad headers, int/float
// confusion, image bombs, ...) through src and the browser build, limits, and seeded random
// mutations: the decoder throws WireError with the expected reason, and never anything else.

import assert from "node:assert/strict";
import { describe, test } from "node:test";

import * as browser from "../../../pipeline/viewer/static/sapiens2-client.browser.js";
import * as node from "../src/index.js";
import { CASES, image, keypoints, png, jpeg, sof0, status } from "./corpus.js";
import { framesOf, loadVectors, mutants } from "./helpers.js";

const { WireError, decode, decodeMessage, decodePixels, DEFAULT_LIMITS } = node;

/** "ok" or the WireError reason; any other error fails. */
function outcome(impl, frames, limits) {
  try {
    impl.decodeMessage(frames, limits);
    return "ok";
  } catch (e) {
    if (e instanceof impl.WireError) return e.reason;
    throw e;
  }
}

const refuses = (reason) => (e) => {
  assert.ok(e instanceof WireError, `a WireError, got ${e && e.stack}`);
  assert.equal(e.reason, reason, e.message);
  return true;
};

for (const [label, impl] of [["src", node], ["browser build", browser]]) {
  describe(`corpus (${label})`, () => {
    for (const c of CASES) {
      test(`${c.name}: ${c.reason}`, () => assert.equal(outcome(impl, c.frames), c.reason));
    }
  });
}

describe("limits", () => {
  const kp = keypoints();
  const size = kp.reduce((n, f) => n + f.length, 0);
  test("defaults mirror Python's Limits", () => {
    assert.deepEqual({ ...DEFAULT_LIMITS }, {
      maxMessageBytes: 64 * 1024 * 1024, maxHeaderBytes: 64 * 1024, maxParts: 16, maxDims: 4,
      maxArrayBytes: 256 * 1024 * 1024, maxPixels: 64 * 1024 * 1024, maxHeaderDepth: 4,
    });
    assert.ok(Object.isFrozen(DEFAULT_LIMITS));
  });
  test("message size: at the limit accepted, one byte over refused", () => {
    assert.equal(outcome(node, kp, { maxMessageBytes: size }), "ok");
    assert.equal(outcome(node, kp, { maxMessageBytes: size - 1 }), "too_large");
  });
  test("message size is checked first", () => {
    assert.equal(outcome(node, [new Uint8Array(10)], { maxMessageBytes: 5 }), "too_large");
  });
  test("parts", () => {
    assert.equal(outcome(node, kp, { maxParts: 5 }), "ok");
    assert.equal(outcome(node, kp, { maxParts: 4 }), "frames");
  });
  test("header size and depth", () => {
    assert.equal(outcome(node, kp, { maxHeaderBytes: kp[1].length }), "ok");
    assert.equal(outcome(node, kp, { maxHeaderBytes: kp[1].length - 1 }), "too_large");
    assert.equal(outcome(node, kp, { maxHeaderDepth: 3 }), "header");
  });
  test("dims and array bytes", () => {
    assert.equal(outcome(node, kp, { maxDims: 2 }), "shape");
    assert.equal(outcome(node, kp, { maxArrayBytes: 16 }), "ok");
    assert.equal(outcome(node, kp, { maxArrayBytes: 15 }), "too_large");
  });
  test("pixels", () => {
    const seg = image("seg", { name: "classes", encoding: "png", dtype: "|u1", shape: [3, 2] }, png(2, 3));
    assert.equal(outcome(node, seg, { maxPixels: 6 }), "ok");
    assert.equal(outcome(node, seg, { maxPixels: 5 }), "too_large");
  });
});

describe("decoded values", () => {
  test("64-bit integers are exact bigints; safe ones are numbers", () => {
    const d = decode(keypoints({ capture_ns: 2n ** 64n - 1n, pts: -(2n ** 63n), extra: 2 ** 53 - 1 }));
    assert.equal(d.header.capture_ns, 2n ** 64n - 1n);
    assert.equal(d.header.pts, -(2n ** 63n));
    assert.equal(d.header.extra, 2 ** 53 - 1);
    const m = decodeMessage(keypoints({ capture_ns: 2n ** 64n - 1n, frame_index: new Uint8Array(0).length }));
    assert.equal(m.meta.capture_ns, 2n ** 64n - 1n);
    assert.equal(m.meta.frame_index, 0);
    const small = decodeMessage(keypoints({ capture_ns: 5 }));
    assert.equal(small.meta.capture_ns, 5n);
    assert.equal(small.header.capture_ns, 5);
  });
  test("a JSON header gives the same header as msgpack", () => {
    assert.deepStrictEqual(decode(keypoints({}, { format: "json" })).header, decode(keypoints()).header);
  });
  test("the key __proto__ is an own property and pollutes nothing", () => {
    for (const format of ["msgpack", "json"]) {
      const d = decode(keypoints({ ["__proto__"]: { polluted: 1 } }, { format }));
      assert.ok(Object.prototype.hasOwnProperty.call(d.header, "__proto__"));
      assert.deepEqual(Object.getOwnPropertyDescriptor(d.header, "__proto__").value, { polluted: 1 });
      assert.equal(Object.getPrototypeOf(d.header), Object.prototype);
      assert.equal({}.polluted, undefined);
    }
  });
  test("keys named like Object.prototype members are not taken from it", () => {
    // "constructor" / "toString" as fields must not be found on the prototype of a map.
    const frames = keypoints({ latency_ms: {}, parts: undefined }, { data: [] });
    assert.equal(outcome(node, frames), "parts");
    const m = decodeMessage(keypoints({ latency_ms: { constructor: 1, toString: 2 } }));
    assert.deepEqual(m.meta.latency_ms, { constructor: 1, toString: 2 });
  });
  test("every dtype comes as its typed array, copied and aligned", () => {
    const c = CASES.find((x) => x.name === "keypoints with all dtypes as extra parts");
    const frames = c.frames.map((f) => f.slice());
    const d = decode(frames);
    const want = {
      x0: [Uint8Array, 0x3c], x1: [Int8Array, 0x3c], x2: [Uint16Array, 0x3c3c], x3: [Int16Array, 0x3c3c],
      x4: [Uint32Array, 0x3c3c3c3c], x5: [Int32Array, 0x3c3c3c3c], x6: [BigUint64Array, 0x3c3c3c3c3c3c3c3cn],
      x7: [BigInt64Array, 0x3c3c3c3c3c3c3c3cn], x8: [Uint16Array, 0x3c3c], x9: [Float64Array, null],
    };
    for (const [name, [Type, value]] of Object.entries(want)) {
      const { data } = d.arrays[name];
      assert.ok(data instanceof Type, `${name}: ${data.constructor.name}`);
      assert.equal(data.length, 3);
      assert.equal(data.byteOffset, 0);
      if (value !== null) assert.equal(data[0], value);
    }
    assert.equal(d.arrays.x9.data[0], new Float64Array(new Uint8Array(8).fill(0x3c).buffer)[0]);
    frames[7].fill(0); // the decoded arrays are copies, not views of the frames
    assert.equal(d.arrays.x0.data[0], 0x3c);
  });
  test("keypoint arrays and their shapes", () => {
    const m = decodeMessage(keypoints());
    assert.equal(m.kind, "keypoints");
    assert.deepEqual(m.shapes, { keypoints: [1, 2, 2], keypoint_scores: [1, 2], boxes: [1, 4], box_scores: [1],
      track_ids: [1] });
    assert.deepEqual([...m.keypoints], [1.5, 1.5, 1.5, 1.5]);
    assert.deepEqual([...m.track_ids], [-1n]);
    assert.equal(m.num_persons, 1);
    assert.equal(m.num_keypoints, 2);
    assert.deepEqual(m.meta.time_base, [1, 15360]);
    assert.equal(node.ptsSeconds(m.meta), 21504 / 15360);
  });
  test("status message", () => {
    const m = decodeMessage(status());
    assert.equal(m.kind, "status");
    assert.equal(m.fps, 29.75);
    assert.equal(m.event.time_ns, 1764579600123456789n);
    assert.deepEqual(m.drops, { source: 0 });
  });
  test("frames may be Buffers, Uint8Array views, other views or ArrayBuffers", () => {
    const kp = keypoints();
    const padded = kp.map((f) => {
      const big = new Uint8Array(f.length + 3);
      big.set(f, 3);
      return big.subarray(3); // odd byteOffset: raw parts must still decode aligned
    });
    const want = decode(kp).header;
    assert.deepStrictEqual(decode(padded).header, want);
    assert.deepEqual([...decodeMessage(padded).keypoints], [1.5, 1.5, 1.5, 1.5]);
    assert.deepStrictEqual(decode(kp.map((f) => Buffer.from(f))).header, want);
    assert.deepStrictEqual(decode(kp.map((f) => f.slice().buffer)).header, want);
    assert.deepStrictEqual(decode(kp.map((f) => new DataView(f.slice().buffer))).header, want);
  });
  test("API misuse is a TypeError, not a WireError", () => {
    assert.throws(() => decodeMessage(null), TypeError);
    assert.throws(() => decodeMessage(["keypoints.cam0", "x"]), TypeError);
  });
});

describe("truncated and corrupted messages", () => {
  const vectors = loadVectors().cases.filter((c) => c.expect);
  test("every prefix of every frame of every good vector is decoded or refused with a WireError", () => {
    for (const c of vectors) {
      const frames = framesOf(c);
      frames.forEach((f, i) => {
        const step = Math.max(1, Math.floor(f.length / 200));
        for (let n = 0; n < f.length; n += step) {
          const cut = frames.slice();
          cut[i] = f.subarray(0, n);
          outcome(node, cut);
        }
      });
      for (let n = 0; n < frames.length; n++) outcome(node, frames.slice(0, n));
    }
  });
  test("seeded random mutations: only WireError, and src and the browser build agree", () => {
    const bases = vectors.map((c) => ({ frames: framesOf(c), images: false }));
    for (const frames of mutants(bases, 3000, 7)) {
      assert.equal(outcome(browser, frames), outcome(node, frames));
    }
  });
  test("decodePixels refuses image bytes that do not decode", async () => {
    const seg = decodeMessage(image("seg", { name: "classes", encoding: "png", dtype: "|u1", shape: [3, 2] },
      png(2, 3)));
    await assert.rejects(decodePixels(seg.classes), refuses("image"));
    const frame = decodeMessage(image("frame", { name: "image", encoding: "jpeg", dtype: "|u1", shape: [3, 2, 3] },
      jpeg(sof0(2, 3), [0xff, 0xd9])));
    await assert.rejects(decodePixels(frame.image), refuses("image"));
    const good = loadVectors().cases.find((c) => c.name === "frame_jpeg");
    const bytes = decodeMessage(framesOf(good)).image.bytes.slice(0, 400); // cut inside the scan
    await assert.rejects(decodePixels({ ...decodeMessage(framesOf(good)).image, bytes }), refuses("image"));
  });
});

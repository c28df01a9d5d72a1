// packFrames / unpackFrames: the WebSocket framing (uint32 LE count, then uint32 LE length + bytes).

import assert from "node:assert/strict";
import { test } from "node:test";

import * as browser from "../../../pipeline/viewer/static/sapiens2-client.browser.js";
import { WireError, decode, packFrames, unpackFrames } from "../src/index.js";
import { framesOf, loadVectors, rng } from "./helpers.js";

const refuses = (reason) => (e) => e instanceof WireError && e.reason === reason;

test("round trip of random frames, empty ones included", () => {
  const rand = rng(1);
  for (let n = 0; n < 200; n++) {
    const frames = Array.from({ length: Math.floor(rand() * 8) }, () =>
      Uint8Array.from({ length: Math.floor(rand() * 3) === 0 ? 0 : Math.floor(rand() * 300) }, () => rand() * 256));
    const packed = packFrames(frames);
    assert.equal(packed.byteOffset, 0);
    assert.equal(packed.buffer.byteLength, packed.byteLength);
    const back = unpackFrames(packed.buffer);
    assert.deepEqual(back.map((f) => [...f]), frames.map((f) => [...f]));
  }
});

test("the layout is little-endian count, then length + bytes per frame", () => {
  const packed = packFrames(["ab", new Uint8Array([1, 2, 3]), new Uint8Array(0)]);
  assert.deepEqual([...packed], [3, 0, 0, 0, 2, 0, 0, 0, 97, 98, 3, 0, 0, 0, 1, 2, 3, 0, 0, 0, 0]);
});

test("a vector message survives packing and decodes the same", () => {
  for (const c of loadVectors().cases.filter((x) => x.expect)) {
    const frames = framesOf(c);
    const viaSocket = unpackFrames(packFrames(frames));
    assert.deepStrictEqual(decode(viaSocket).header, decode(frames).header);
  }
});

test("unpack takes a Uint8Array view at any offset (frames are views, no copies)", () => {
  const packed = packFrames([new Uint8Array([9, 8, 7])]);
  const big = new Uint8Array(packed.length + 5);
  big.set(packed, 5);
  const [frame] = unpackFrames(big.subarray(5));
  assert.deepEqual([...frame], [9, 8, 7]);
  assert.equal(frame.buffer, big.buffer);
});

test("hostile packed buffers are refused with WireError, before any allocation", () => {
  const u32 = (...ns) => new Uint8Array(new Uint32Array(ns).buffer);
  for (const impl of [{ unpackFrames }, browser]) {
    assert.throws(() => impl.unpackFrames(new Uint8Array(3)), (e) => e.reason === "frames");
    assert.throws(() => impl.unpackFrames(u32(0xffffffff)), (e) => e.reason === "frames");
    assert.throws(() => impl.unpackFrames(u32(2, 1)), (e) => e.reason === "frames"); // truncated length table
    assert.throws(() => impl.unpackFrames(u32(1, 0xffffffff)), (e) => e.reason === "frames"); // length beyond
    assert.throws(() => impl.unpackFrames(Uint8Array.from([...u32(1, 1), 7, 0])), (e) => e.reason === "frames");
    assert.deepEqual(impl.unpackFrames(u32(0)), []);
  }
  assert.throws(() => unpackFrames(packFrames(new Array(19).fill("x"))), refuses("frames"));
  assert.equal(unpackFrames(packFrames(new Array(19).fill("x")), { maxFrames: 19 }).length, 19);
  assert.throws(() => unpackFrames(packFrames(["xxxx"]), { maxBytes: 11 }), refuses("too_large"));
  assert.throws(() => packFrames([1]), TypeError);
});

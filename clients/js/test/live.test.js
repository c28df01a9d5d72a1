// Live tests against the real pipeline (offline demo clip, tiny random weights, CPU):
//   - this package's Subscriber receives keypoints, a frame and a status and checks them;
//   - the JavaScript example of docs/WIRE.md, extracted and run as-is, prints 3 lines;
//   - the pipeline stops on SIGINT with exit status 0;
//   - with CURVE (keys from `sapiens2-stream keys`), an authorized client receives, others do not.
// The CLI is $SAPIENS2_STREAM_CLI (default: the repository's .venv); SAPIENS2_STREAM_LIVE=0 skips
// them, except under CI (CI=true), where it fails them instead.
// Deadlines are generous and nothing is timed: a slow machine only makes it slower.

import assert from "node:assert/strict";
import { spawn, spawnSync } from "node:child_process";
import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, describe, test } from "node:test";
import { pathToFileURL } from "node:url";

import { ReceiveTimeout, Subscriber, decodePixels, loadCertificate } from "../src/index.js";
import { PACKAGE_DIR, REPO_DIR, needs, pipelineCli } from "./helpers.js";
import { alive, freePort, startPipeline, stopPipeline } from "./pipeline.js";

const missing = process.env.SAPIENS2_STREAM_LIVE === "0" ? "SAPIENS2_STREAM_LIVE=0 turns the live pipeline tests off"
  : false;
const DEADLINE_MS = 120_000;
const TWO_53 = 2n ** 53n;

/**
 * Receive from `sub` until `done(messages)` or the deadline; stops early (with what it has) when the
 * pipeline exited and nothing more arrives. `onMessage` sees each message as it comes.
 */
async function collect(sub, child, done, onMessage = () => {}) {
  const messages = [];
  const deadline = Date.now() + DEADLINE_MS;
  while (!done(messages) && Date.now() < deadline) {
    try {
      const msg = await sub.recv(1000);
      messages.push(msg);
      onMessage(msg, messages);
    } catch (e) {
      if (!(e instanceof ReceiveTimeout)) throw e;
      if (!alive(child)) break;
    }
  }
  return messages;
}

/** The ```js block of docs/WIRE.md's JavaScript example, as a .mjs file inside this package. */
function writeWireExample(dir) {
  const doc = readFileSync(join(REPO_DIR, "docs", "WIRE.md"), "utf8");
  const section = doc.slice(doc.indexOf("## Example client, JavaScript"));
  const match = /```js\n([\s\S]*?)```/.exec(section);
  assert.ok(match, "docs/WIRE.md has a ```js example");
  const file = join(dir, `wire-example-${process.pid}.mjs`);
  writeFileSync(file, match[1]);
  return file;
}

/** Run the example's main(endpoint, 3) in a child node; resolves {code, stdout, stderr}. */
function runWireExample(file, endpoint) {
  const script = `import { main } from ${JSON.stringify(pathToFileURL(file).href)};\n`
    + `await main(${JSON.stringify(endpoint)}, 3);\n`;
  return new Promise((resolve) => {
    const child = spawn(process.execPath, ["--input-type=module", "-e", script], { cwd: PACKAGE_DIR });
    let stdout = "";
    let stderr = "";
    child.stdout.on("data", (d) => (stdout += d));
    child.stderr.on("data", (d) => (stderr += d));
    const timer = setTimeout(() => child.kill("SIGKILL"), DEADLINE_MS);
    child.on("exit", (code, signal) => {
      clearTimeout(timer);
      resolve({ code, signal, stdout, stderr });
    });
  });
}

describe("live pipeline", ...needs(missing, () => {
  let tmp;
  let pipeline;
  let sub;
  let exampleFile;
  let received; // Promise of the messages
  let example; // Promise of the example's run
  let endpoint;

  before(async () => {
    tmp = mkdtempSync(join(tmpdir(), "sapiens2-js-"));
    const tmpInPackage = join(PACKAGE_DIR, ".tmp");
    mkdirSync(tmpInPackage, { recursive: true });
    exampleFile = writeWireExample(tmpInPackage);
    const port = await freePort();
    endpoint = `tcp://127.0.0.1:${port}`;
    sub = new Subscriber({ endpoint, topics: ["keypoints", "status", "frame"] });
    pipeline = startPipeline({ port, cacheDir: join(tmp, "cache") });
    const enough = (ms) => ms.filter((m) => m.kind === "keypoints").length >= 3
      && ms.some((m) => m.kind === "frame") && ms.some((m) => m.kind === "status");
    let exampleStarted = false;
    let startExample;
    example = new Promise((resolve) => (startExample = resolve));
    // The example's first receive times out after 5 s: start it once the pipeline publishes.
    received = collect(sub, pipeline, enough, (msg) => {
      if (msg.kind === "keypoints" && !exampleStarted) {
        exampleStarted = true;
        startExample(runWireExample(exampleFile, endpoint));
      }
    }).finally(() => {
      if (!exampleStarted) startExample(null);
    });
  });

  after(async () => {
    sub?.close();
    await stopPipeline(pipeline);
    if (exampleFile) rmSync(exampleFile, { force: true });
    if (tmp) rmSync(tmp, { recursive: true, force: true });
  });

  test("the Subscriber receives keypoints, a frame and a status, all well-formed", async () => {
    const messages = await received;
    const kinds = messages.map((m) => m.kind);
    const keypoints = messages.filter((m) => m.kind === "keypoints");
    assert.ok(keypoints.length >= 3 && kinds.includes("frame") && kinds.includes("status"),
      `got ${kinds.join(",") || "nothing"}; pipeline output:\n${pipeline.output().slice(-3000)}`);
    for (const m of keypoints) {
      assert.equal(m.topic, "keypoints.cam7");
      assert.equal(m.source_id, "cam7");
      assert.equal(m.meta.source_id, "cam7");
      assert.deepEqual(m.shapes.keypoints, [1, 308, 2]);
      assert.ok(m.keypoints instanceof Float32Array && m.keypoints.length === 616);
      assert.ok(m.keypoints.every(Number.isFinite) && m.keypoint_scores.every(Number.isFinite));
      assert.ok(m.boxes.every(Number.isFinite) && m.box_scores.every(Number.isFinite));
      assert.ok(m.track_ids instanceof BigInt64Array && m.track_ids.length === 1);
      assert.equal(typeof m.meta.capture_ns, "bigint");
      assert.ok(m.meta.capture_ns > TWO_53, `capture_ns ${m.meta.capture_ns}`);
      assert.equal(typeof m.header.capture_ns, "bigint");
      assert.equal(m.meta.random_weights, true);
      assert.equal(m.header.num_keypoints, 308);
    }
    const indices = keypoints.map((m) => m.meta.frame_index);
    assert.ok(indices.every((v, i) => i === 0 || v > indices[i - 1]), `frame_index increases: ${indices}`);
    const frame = messages.find((m) => m.kind === "frame");
    assert.equal(frame.image.encoding, "jpeg");
    assert.equal(frame.image.width, frame.meta.width);
    assert.equal(frame.image.height, frame.meta.height);
    assert.equal(frame.source_id, "cam7");
    const pixels = await decodePixels(frame.image);
    assert.deepEqual(pixels.shape, [frame.meta.height, frame.meta.width, 3]);
    const status = messages.find((m) => m.kind === "status");
    assert.equal(status.source_id, "cam7");
    assert.equal(typeof status.health, "string");
    assert.ok(Number.isFinite(status.fps));
    assert.equal(status.header.random_weights, true);
    assert.deepEqual(sub.stats.skipped, {}, "the real pipeline's messages are never refused");
    assert.equal(sub.stats.received, messages.length);
  });

  test("the JavaScript example of docs/WIRE.md, run as-is, prints 3 lines", async () => {
    const run = await example;
    assert.ok(run, `the pipeline never published keypoints:\n${pipeline.output().slice(-3000)}`);
    assert.equal(run.code, 0, `exit ${run.code} ${run.signal ?? ""}\n${run.stderr}`);
    const lines = run.stdout.trim().split("\n");
    assert.equal(lines.length, 3, run.stdout);
    for (const line of lines) assert.match(line, /^cam7 \d+ \[ 1, 308, 2 \] 616$/);
  });

  test("the pipeline stops on SIGINT with exit status 0", async (t) => {
    await received;
    await example;
    const result = await stopPipeline(pipeline);
    assert.equal(result.signal, null, pipeline.output().slice(-3000));
    assert.equal(result.code, 0, pipeline.output().slice(-3000));
    t.diagnostic(result.interrupted ? "stopped by SIGINT" : "the clip ended before SIGINT");
  });
}));

describe("live pipeline with CURVE", ...needs(missing, () => {
  let tmp;
  let pipeline;
  const subs = [];

  before(() => {
    tmp = mkdtempSync(join(tmpdir(), "sapiens2-js-curve-"));
  });

  after(async () => {
    for (const s of subs) s.close();
    await stopPipeline(pipeline);
    if (tmp) rmSync(tmp, { recursive: true, force: true });
  });

  test("an authorized client receives; an unknown key and a plain client receive nothing", async () => {
    const keys = join(tmp, "keys");
    const other = join(tmp, "other");
    for (const [dir, name] of [[keys, "js"], [other, "rogue"]]) {
      const made = spawnSync(pipelineCli(), ["keys", dir, "--client", name], { encoding: "utf8" });
      assert.equal(made.status, 0, `${made.stdout}${made.stderr}`);
    }
    const port = await freePort();
    const endpoint = `tcp://127.0.0.1:${port}`;
    const authorized = new Subscriber({ endpoint, topics: ["keypoints"], curve: { keysDir: keys, name: "js" } });
    const rogueKeys = loadCertificate(join(other, "clients", "rogue.key_secret"));
    const rogue = new Subscriber({ endpoint, topics: ["keypoints"], curve: {
      publicKey: rogueKeys.publicKey, secretKey: rogueKeys.secretKey,
      serverKey: loadCertificate(join(keys, "server.key")).publicKey } });
    const plain = new Subscriber({ endpoint, topics: ["keypoints"] });
    subs.push(authorized, rogue, plain);
    pipeline = startPipeline({ port, cacheDir: join(tmp, "cache"), extraArgs: ["--curve-dir", keys] });
    const got = await collect(authorized, pipeline, (ms) => ms.length >= 2);
    assert.ok(got.length >= 2, `authorized client got ${got.length}; pipeline output:\n${pipeline.output().slice(-3000)}`);
    assert.ok(got.every((m) => m.kind === "keypoints" && m.source_id === "cam7"));
    for (const s of [rogue, plain]) {
      await assert.rejects(s.recv(1500), ReceiveTimeout);
      assert.equal(s.stats.received, 0);
    }
    const result = await stopPipeline(pipeline);
    assert.equal(result.code, 0, pipeline.output().slice(-3000));
  });
}));

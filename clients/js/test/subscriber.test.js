// The Subscriber against a zeromq Publisher in this process (no pipeline needed): skipped messages
// counted by reason, version skips logged once per topic, frame_index gaps, source filtering,
// latest-only, timeouts, the message size limit, and CURVE with key files in pyzmq's format.

import assert from "node:assert/strict";
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, describe, test } from "node:test";

import * as zmq from "zeromq";

import {
  KeysError, ReceiveTimeout, Subscriber, SubscriberStats, WireError, loadCertificate, loadCurveClientKeys,
} from "../src/index.js";
import { image, keypoints, status } from "./corpus.js";
import { framesOf, loadVectors } from "./helpers.js";
import { freePort } from "./pipeline.js";

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));
const closers = [];
after(() => {
  for (const c of closers) c.close();
});

/** A bound Publisher and its endpoint. */
async function publisher(options = {}) {
  const pub = new zmq.Publisher({ linger: 0, ...options });
  const endpoint = `tcp://127.0.0.1:${await freePort()}`;
  await pub.bind(endpoint);
  closers.push(pub);
  return { pub, endpoint };
}

/** Send status probes until `sub` receives a message (subscriptions take a moment); reset its counts
 * and return that message. */
async function connected(pub, sub, tries = 200) {
  for (let i = 0; i < tries; i++) {
    await pub.send(status({ source_id: "probe" }));
    try {
      const msg = await sub.recv(100);
      const { disconnects } = sub.stats;
      sub.stats = new SubscriberStats();
      sub.stats.disconnects = disconnects;
      return msg;
    } catch (e) {
      if (!(e instanceof ReceiveTimeout)) throw e;
    }
  }
  throw new Error("the subscriber never connected");
}

function subscriber(options) {
  const sub = new Subscriber(options);
  closers.push(sub);
  return sub;
}

/** Receive until a timeout passes; returns the messages. */
async function drain(sub, timeoutMs = 500) {
  const out = [];
  for (;;) {
    try {
      out.push(await sub.recv(timeoutMs));
    } catch (e) {
      if (e instanceof ReceiveTimeout) return out;
      throw e;
    }
  }
}

const frameMsg = (index) => image("frame", { name: "image", encoding: "raw", dtype: "|u1", shape: [1, 1, 3] },
  new Uint8Array(3), { frame_index: index });

describe("Subscriber", () => {
  test("counts refused messages by reason, warns once per topic about versions, counts gaps", async () => {
    const { pub, endpoint } = await publisher();
    const warnings = [];
    const sub = subscriber({ endpoint, topics: [""], logger: { warn: (m) => warnings.push(m) } });
    await connected(pub, sub);
    const errors = loadVectors().cases.filter((c) => c.error);
    for (const c of errors) await pub.send(framesOf(c));
    await pub.send(keypoints({ version: 2 }));
    await pub.send(keypoints({ version: 3 }));
    // 3, 4 missed; 6-8 skipped by the source (drops.source 0 -> 3), so not missed; a leap of 2^40 and back to 0: restarts
    const sent = [[1n, 0], [2n, 0], [5n, 0], [9n, 3], [2n ** 40n, 3], [0n, 3], [1n, 3]];
    for (const [index, skipped] of sent) {
      await pub.send(keypoints({ frame_index: index, drops: { source: skipped } }));
    }
    const got = await drain(sub);
    assert.deepEqual(got.map((m) => String(m.meta.frame_index)), sent.map(([index]) => String(index)));
    const want = {};
    for (const c of errors) want[c.error] = (want[c.error] ?? 0) + 1;
    want.version += 2;
    assert.deepEqual(sub.stats.skipped, want);
    assert.equal(sub.stats.received, sent.length);
    assert.equal(sub.stats.missed, 2);
    assert.equal(sub.stats.restarts, 2);
    assert.equal(sub.stats.oversized, want.too_large);
    assert.equal(sub.stats.malformed, errors.length + 2 - want.too_large);
    assert.equal(warnings.length, 1, warnings.join("\n"));
    assert.match(warnings[0], /keypoints\.cam0.*version 2/);
  });

  test("strictVersion throws the version refusal", async () => {
    const { pub, endpoint } = await publisher();
    const sub = subscriber({ endpoint, topics: ["keypoints"], strictVersion: true });
    await pub.send(status({ source_id: "x" })); // not subscribed: never arrives
    for (let i = 0; i < 200; i++) {
      await pub.send(keypoints({ version: 2 }));
      try {
        await sub.recv(100);
        assert.fail("a version-2 message was handed out");
      } catch (e) {
        if (e instanceof ReceiveTimeout) continue;
        assert.ok(e instanceof WireError && e.reason === "version", String(e));
        return;
      }
    }
    assert.fail("no message arrived");
  });

  test("sources keeps exact source ids (a prefix would also match cam10)", async () => {
    const { pub, endpoint } = await publisher();
    const sub = subscriber({ endpoint, topics: ["keypoints", "status"], sources: ["cam1", "probe"] });
    await connected(pub, sub);
    for (const source of ["cam1", "cam10", "cam2", "cam1"]) await pub.send(keypoints({ source_id: source }));
    const got = await drain(sub);
    assert.deepEqual(got.map((m) => m.source_id), ["cam1", "cam1"]);
    assert.equal(sub.stats.filtered, 1); // cam10 passed the prefix, not the filter; cam2 never arrived
  });

  test("latestOnly keeps the newest image message per topic, and every keypoints message", async () => {
    const { pub, endpoint } = await publisher();
    const sub = subscriber({ endpoint, topics: [""], latestOnly: true });
    await connected(pub, sub);
    for (let i = 1; i <= 3; i++) {
      await pub.send(frameMsg(i));
      await pub.send(keypoints({ frame_index: i }));
    }
    await sleep(500); // let all six arrive before the first receive drains the socket
    const got = await drain(sub);
    assert.deepEqual(got.map((m) => `${m.kind}${m.meta.frame_index}`), ["keypoints1", "keypoints2", "frame3",
      "keypoints3"]);
    assert.equal(sub.stats.superseded, 2);
  });

  test("recv times out with ReceiveTimeout; iterating ends at a timeout", async () => {
    const { pub, endpoint } = await publisher();
    const sub = subscriber({ endpoint, topics: ["keypoints"], timeoutMs: 300 });
    await connected(pub, subscriber({ endpoint, topics: ["status"] })); // the publisher is up
    await assert.rejects(sub.recv(), ReceiveTimeout);
    await assert.rejects(sub.recv(0), ReceiveTimeout);
    const seen = [];
    for await (const m of sub) seen.push(m);
    assert.deepEqual(seen, []);
  });

  test("concurrent recv() calls are served one after the other", async () => {
    const { pub, endpoint } = await publisher();
    const sub = subscriber({ endpoint, topics: [""] });
    await connected(pub, sub);
    const pending = [sub.recv(5000), sub.recv(5000)];
    await pub.send(keypoints({ frame_index: 1 }));
    await pub.send(keypoints({ frame_index: 2 }));
    const got = await Promise.all(pending);
    assert.deepEqual(got.map((m) => m.meta.frame_index), [1, 2]);
  });

  test("close() ends a pending recv with ReceiveTimeout", async () => {
    const { endpoint } = await publisher();
    const sub = subscriber({ endpoint });
    const pending = sub.recv(null);
    await sleep(50);
    sub.close();
    await assert.rejects(pending, ReceiveTimeout);
    assert.ok(sub.closed);
  });

  test("the message size limit is the socket's ZMQ_MAXMSGSIZE: an oversized frame never arrives", async () => {
    const { pub, endpoint } = await publisher();
    const sub = subscriber({ endpoint, topics: [""], limits: { maxMessageBytes: 2000 } });
    assert.equal(sub._sock.maxMessageSize, 2000);
    assert.equal(sub.limits.maxMessageBytes, 2000);
    await connected(pub, sub);
    await pub.send(image("frame", { name: "image", encoding: "raw", dtype: "|u1", shape: [1, 1000, 3] },
      new Uint8Array(3000)));
    // libzmq refuses the frame while it arrives and drops the connection without reconnecting
    // (a protocol error); the subscriber connects again itself, and the decoder never sees it.
    const next = await connected(pub, sub);
    assert.equal(next.kind, "status", "the oversized frame message never arrives");
    assert.equal(next.source_id, "probe");
    assert.ok(sub.stats.disconnects >= 1);
  });

  test("an endpoint that is not one is a clear error", () => {
    assert.throws(() => new Subscriber({ endpoint: "nonsense" }), /cannot connect to nonsense/);
  });
});

describe("CURVE", () => {
  const dir = mkdtempSync(join(tmpdir(), "sapiens2-js-keys-"));
  after(() => rmSync(dir, { recursive: true, force: true }));

  /** A certificate file as pyzmq's zmq.auth.create_certificates writes it. */
  function writeCert(file, publicKey, secretKey) {
    const lines = ["#   ****  Generated on 2025-12-01 10:00:00 by pyzmq  ****",
      `#   ZeroMQ CURVE ${secretKey ? "**Secret** " : "Public "}Certificate`, "", "metadata", "curve",
      `    public-key = "${publicKey}"`];
    if (secretKey) lines.push(`    secret-key = "${secretKey}"`);
    writeFileSync(file, `${lines.join("\n")}\n`);
  }

  const server = zmq.curveKeyPair();
  const client = zmq.curveKeyPair();
  mkdirSync(join(dir, "clients"));
  writeCert(join(dir, "server.key"), server.publicKey);
  writeCert(join(dir, "server.key_secret"), server.publicKey, server.secretKey);
  writeCert(join(dir, "clients", "js.key"), client.publicKey);
  writeCert(join(dir, "clients", "js.key_secret"), client.publicKey, client.secretKey);

  test("key files are read like pyzmq's load_certificate", () => {
    assert.deepEqual(loadCertificate(join(dir, "server.key")), { publicKey: server.publicKey, secretKey: null });
    assert.deepEqual(loadCurveClientKeys(dir, "js"), { publicKey: client.publicKey, secretKey: client.secretKey,
      serverKey: server.publicKey });
    const crlf = join(dir, "crlf.key");
    writeFileSync(crlf, `curve\r\n    public-key = '${client.publicKey}'\r\n`);
    assert.equal(loadCertificate(crlf).publicKey, client.publicKey);
  });

  test("missing or broken key files are a KeysError that says what to do", () => {
    assert.throws(() => loadCurveClientKeys(dir, "nobody"), (e) => e instanceof KeysError
      && /sapiens2-stream keys .* --client nobody/.test(e.message));
    assert.throws(() => loadCurveClientKeys(join(dir, "clients"), "js"), KeysError); // no server.key there
    const bad = join(dir, "bad.key");
    writeFileSync(bad, "curve\n    public-key = \"short\"\n");
    assert.throws(() => loadCertificate(bad), KeysError);
    writeFileSync(bad, "curve\n");
    assert.throws(() => loadCertificate(bad), /no public key/);
    const noSecret = join(dir, "nosecret");
    mkdirSync(join(noSecret, "clients"), { recursive: true });
    writeCert(join(noSecret, "server.key"), server.publicKey);
    writeCert(join(noSecret, "clients", "x.key_secret"), client.publicKey);
    assert.throws(() => loadCurveClientKeys(noSecret, "x"), /holds no secret key/);
  });

  test("a CURVE client receives from a CURVE server; a plain client does not", async () => {
    const { pub, endpoint } = await publisher({ curveServer: true, curveSecretKey: server.secretKey,
      curvePublicKey: server.publicKey });
    const sub = subscriber({ endpoint, topics: ["status"], curve: { keysDir: dir, name: "js" } });
    assert.equal(sub._sock.securityMechanism, "curve");
    await connected(pub, sub);
    const plain = subscriber({ endpoint, topics: ["status"] });
    await pub.send(status());
    await assert.rejects(plain.recv(500), ReceiveTimeout);
    const explicit = subscriber({ endpoint, topics: ["status"], curve: { ...client, serverKey: server.publicKey } });
    await connected(pub, explicit);
    assert.throws(() => new Subscriber({ endpoint, curve: { publicKey: client.publicKey } }), TypeError);
  });
});

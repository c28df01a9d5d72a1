/**
 * Subscriber: receive sapiens2-stream messages as typed records, over zeromq's SUB socket
 * (Node only; Python's `sapiens2_client.subscriber.Subscriber`).
 *
 * A subscriber survives any message. The socket refuses frames larger than the message limit
 * while they arrive (ZMQ_MAXMSGSIZE: libzmq drops the connection and, taking it for a protocol
 * error, never reconnects; so the subscriber watches its socket's events and connects again
 * itself, counted in `stats.disconnects`). Every message that does arrive is validated by
 * `decode` and, when malformed, skipped and counted by reason in `stats.skipped`. A message of another schema version is counted too (`skipped.version`) and
 * logged once per topic. `latestOnly` drains the socket on every receive and keeps only the
 * newest image message (frame/seg/matte) of each topic.
 * @module
 */

import * as zmq from "zeromq";

import { DEFAULT_ENDPOINT, KINDS, WireError, decode, makeLimits, toMessage } from "./decode.js";
import { loadCurveClientKeys } from "./keys.js";

const DRAIN_LIMIT = 10_000; // bounded drain so a flood cannot keep recv() busy forever
const MAX_GAP = 2n ** 20n; // frames missed in one gap at most (over 9 hours at 30 fps); a larger leap is a restart
const IMAGE_KINDS = new Set(["frame", "seg", "matte"]);

/** No message arrived within the receive timeout. */
export class ReceiveTimeout extends Error {
  constructor(message) {
    super(message);
    this.name = "ReceiveTimeout";
  }
}

/** What the subscriber received, skipped and why. */
export class SubscriberStats {
  constructor() {
    /** messages handed out */
    this.received = 0;
    /** @type {Record<string, number>} reason -> messages refused */
    this.skipped = {};
    /** older image messages discarded by latestOnly */
    this.superseded = 0;
    /** other sources, when `sources` is given */
    this.filtered = 0;
    /** frame_index gaps per topic the source's own skips (drops.source) do not explain: publisher or network drops */
    this.missed = 0;
    /** frame_index went backwards or leapt over MAX_GAP: a new baseline, nothing missed */
    this.restarts = 0;
    /** connections lost (an oversized message, a publisher restart) and made again */
    this.disconnects = 0;
  }

  /** Messages refused for any reason but their size. */
  get malformed() {
    return Object.entries(this.skipped).reduce((n, [reason, count]) => n + (reason === "too_large" ? 0 : count), 0);
  }

  /** Messages refused for their size. */
  get oversized() {
    return this.skipped.too_large ?? 0;
  }
}

/** Subscription prefixes: a kind with `sources` becomes one `kind.source` prefix per source. */
function prefixes(topics, sources) {
  const out = [];
  for (const t of topics) {
    if (sources && sources.length && KINDS.includes(t)) out.push(...sources.map((s) => `${t}.${s}`));
    else out.push(t);
  }
  return out;
}

/** The CURVE keys of a `curve` option: `{keysDir, name}` or `{publicKey, secretKey, serverKey}`. */
function curveKeys(curve) {
  if (curve.keysDir !== undefined) return loadCurveClientKeys(curve.keysDir, curve.name ?? "client");
  const { publicKey, secretKey, serverKey } = curve;
  if (!publicKey || !secretKey || !serverKey) {
    throw new TypeError("curve needs {keysDir, name} or {publicKey, secretKey, serverKey}");
  }
  return { publicKey, secretKey, serverKey };
}

/**
 * Connects a SUB socket and yields typed messages.
 *
 * `topics` are prefixes: a kind ("keypoints"), a kind and source ("frame.cam0") or "" for all.
 * `sources`, when given, keeps only those exact source ids (prefix "frame.cam1" also matches
 * "frame.cam10"). `timeoutMs` null waits forever; iterating stops when a timeout passes.
 */
export class Subscriber {
  /**
   * @param {import("../index").SubscriberOptions} [options]
   */
  constructor({
    endpoint = DEFAULT_ENDPOINT, topics = ["keypoints"], sources = null, latestOnly = false, timeoutMs = null,
    limits = undefined, strictVersion = false, receiveHighWaterMark = 100, curve = null, logger = console,
  } = {}) {
    if (typeof topics === "string") topics = [topics];
    this.endpoint = endpoint;
    this.sources = sources ? new Set(sources) : null;
    this.latestOnly = latestOnly;
    this.timeoutMs = timeoutMs;
    this.limits = makeLimits(limits);
    this.strictVersion = strictVersion;
    this.logger = logger;
    this.stats = new SubscriberStats();
    this._pending = [];
    this._lastIndex = new Map(); // topic -> {index, skipped}: the last frame_index and drops.source (bigint)
    this._warnedVersions = new Set();
    this._queue = Promise.resolve(); // recv() calls run one after the other
    this._endpoints = [];
    // Frames over the limit are refused while they arrive (the peer is disconnected), never buffered.
    this._sock = new zmq.Subscriber({
      linger: 0, receiveHighWaterMark, maxMessageSize: this.limits.maxMessageBytes,
    });
    try {
      if (curve) {
        const keys = curveKeys(curve);
        this._sock.curveServerKey = keys.serverKey;
        this._sock.curvePublicKey = keys.publicKey;
        this._sock.curveSecretKey = keys.secretKey;
      }
      for (const prefix of prefixes(topics, sources)) this._sock.subscribe(prefix);
      this._watchConnections();
      this.connect(endpoint);
    } catch (e) {
      this.close();
      throw e;
    }
  }

  /**
   * Receive from another publisher (or broker) too.
   * @param {string} endpoint e.g. tcp://127.0.0.1:5555
   */
  connect(endpoint) {
    try {
      this._sock.connect(endpoint);
    } catch (e) {
      throw new Error(`cannot connect to ${endpoint}: ${e.message}; expected e.g. ${DEFAULT_ENDPOINT}`, { cause: e });
    }
    this._endpoints.push(endpoint);
  }

  /** Connect again where libzmq dropped a connection (it does not after a too-large message). */
  async _watchConnections() {
    try {
      for await (const event of this._sock.events) {
        if (event.type !== "disconnect" || !this._endpoints.includes(event.address)) continue;
        this.stats.disconnects++;
        try {
          this._sock.disconnect(event.address);
        } catch {
          // libzmq may have forgotten it already
        }
        if (!this._sock.closed) this._sock.connect(event.address);
      }
    } catch {
      // the socket was closed
    }
  }

  /** Whether close() was called. */
  get closed() {
    return this._sock.closed;
  }

  /**
   * The next message; rejects with ReceiveTimeout when none arrives in time.
   * @param {number | null} [timeoutMs] overrides the subscriber's timeout (null: forever)
   */
  recv(timeoutMs = this.timeoutMs) {
    const run = this._queue.then(() => this._recv(timeoutMs));
    this._queue = run.catch(() => {});
    return run;
  }

  async _recv(timeoutMs) {
    const deadline = timeoutMs === null || timeoutMs === undefined ? null : Date.now() + timeoutMs;
    for (;;) {
      if (this.latestOnly) await this._drain();
      if (this._pending.length) return this._pending.shift();
      if (this._sock.closed) throw new ReceiveTimeout(`subscriber of ${this.endpoint} is closed`);
      const wait = deadline === null ? -1 : Math.max(0, deadline - Date.now());
      this._sock.receiveTimeout = wait;
      let frames;
      try {
        frames = await this._sock.receive();
      } catch (e) {
        if (e && e.code === "EAGAIN") {
          throw new ReceiveTimeout(this._sock.closed ? `subscriber of ${this.endpoint} is closed`
            : `no message from ${this.endpoint} within ${timeoutMs} ms`);
        }
        throw e;
      }
      this._handle(frames);
    }
  }

  /** Yield messages until a receive timeout passes (forever when timeoutMs is null) or close(). */
  async *[Symbol.asyncIterator]() {
    for (;;) {
      try {
        yield await this.recv();
      } catch (e) {
        if (e instanceof ReceiveTimeout) return;
        throw e;
      }
    }
  }

  /**
   * Close the socket (no linger); a pending recv() then rejects with ReceiveTimeout. Call it when
   * done: an open subscriber keeps Node's event loop alive.
   */
  close() {
    if (!this._sock.closed) this._sock.close();
  }

  /** Validate one received message and queue it, or count why it was skipped. */
  _handle(frames) {
    let msg;
    try {
      msg = toMessage(decode(frames, this.limits));
    } catch (e) {
      if (!(e instanceof WireError)) throw e;
      if (e.reason === "version" && this.strictVersion) throw e;
      this.stats.skipped[e.reason] = (this.stats.skipped[e.reason] ?? 0) + 1;
      if (e.reason === "version") {
        const topic = new TextDecoder().decode(frames[0].subarray(0, 80));
        if (!this._warnedVersions.has(topic)) {
          this._warnedVersions.add(topic);
          this.logger?.warn?.(`skipping ${topic}: ${e.message}`);
        }
      }
      return;
    }
    if (this.sources && !this.sources.has(msg.source_id)) {
      this.stats.filtered++;
      return;
    }
    this.stats.received++;
    if (msg.kind !== "status") {
      // A gap the source's own skips explain (drops.source grew by it) was never published: not missed.
      const index = BigInt(msg.header.frame_index);
      const skipped = BigInt(msg.header.drops?.source ?? 0);
      // An index that goes backwards or leaps over MAX_GAP is a restarted (or hostile) publisher: a new
      // baseline, nothing missed (as the Python Subscriber).
      const last = this._lastIndex.get(msg.topic);
      if (last !== undefined && index !== last.index + 1n) {
        if (index > last.index && index <= last.index + 1n + MAX_GAP) {
          const explained = skipped > last.skipped ? skipped - last.skipped : 0n;
          const gap = index - last.index - 1n;
          if (gap > explained) this.stats.missed += Number(gap - explained);
        } else {
          this.stats.restarts++;
        }
      }
      this._lastIndex.set(msg.topic, { index, skipped });
    }
    this._pending.push(msg);
  }

  /** Take everything already queued, then keep only the newest image message per topic. */
  async _drain() {
    for (let i = 0; i < DRAIN_LIMIT && !this._sock.closed && this._sock.readable; i++) {
      this._sock.receiveTimeout = 0;
      let frames;
      try {
        frames = await this._sock.receive();
      } catch (e) {
        if (e && e.code === "EAGAIN") break;
        throw e;
      }
      this._handle(frames);
    }
    const newest = new Map();
    this._pending.forEach((m, i) => {
      if (IMAGE_KINDS.has(m.kind)) newest.set(m.topic, i);
    });
    if (!newest.size) return;
    const kept = [];
    this._pending.forEach((m, i) => {
      if (IMAGE_KINDS.has(m.kind) && newest.get(m.topic) !== i) this.stats.superseded++;
      else kept.push(m);
    });
    this._pending = kept;
  }
}

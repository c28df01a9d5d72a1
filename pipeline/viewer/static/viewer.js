// The sapiens2-stream live view: wire messages over a WebSocket, decoded here with the JavaScript
// client's browser build, drawn on a canvas. Counters are mirrored on <body data-*> for tests.
import { WireError, decodeMessage, unpackFrames } from "./sapiens2-client.browser.js";

const $ = (id) => document.getElementById(id);
const body = document.body;
const threshold = Number(body.dataset.kptThreshold) || 0.3;
const HISTORY = 120;

const state = {
  meta: null,
  sources: new Map(), // id -> per-source state
  selected: null,
  layers: {},
  drawn: 0,
  messages: 0,
  refused: 0,
  pending: false,
};

function source(id) {
  if (!state.sources.has(id)) {
    state.sources.set(id, { id, frame: null, frameMeta: null, annotated: false, keypoints: new Map(), latest: null,
                            seg: null, matte: null, status: null, history: [] });
    const option = document.createElement("option");
    option.value = option.textContent = id;
    $("source").append(option);
    if (state.selected === null) select(id);
  }
  return state.sources.get(id);
}

function select(id) {
  state.selected = id;
  $("source").value = id;
  body.dataset.source = id;
  schedule();
}

for (const box of document.querySelectorAll("#layers input")) {
  state.layers[box.dataset.layer] = box.checked;
  box.addEventListener("change", () => {
    state.layers[box.dataset.layer] = box.checked;
    body.dataset.layers = Object.keys(state.layers).filter((k) => state.layers[k]).join(",");
    schedule();
  });
}
body.dataset.layers = Object.keys(state.layers).filter((k) => state.layers[k]).join(",");
$("source").addEventListener("change", (e) => select(e.target.value));
$("spaceview").addEventListener("change", () => schedule());

// -- messages ----------------------------------------------------------------------------------
async function handle(msg) {
  const src = source(msg.source_id);
  if (msg.kind === "status") {
    src.status = msg;
  } else if (msg.kind === "keypoints") {
    src.keypoints.set(msg.meta.frame_index, msg);
    src.latest = msg;
    if (src.keypoints.size > 30) src.keypoints.delete(src.keypoints.keys().next().value);
    const age = Number(msg.publish_ns - msg.meta.capture_ns) / 1e6;
    src.history.push(age);
    if (src.history.length > HISTORY) src.history.shift();
  } else if (msg.kind === "frame" && msg.image.encoding === "jpeg") {
    const bitmap = await createImageBitmap(new Blob([msg.image.bytes], { type: "image/jpeg" }));
    if (src.frame) src.frame.close();
    src.frame = bitmap;
    src.frameMeta = msg.meta;
    src.annotated = msg.annotated;
  } else if (msg.kind === "seg" && msg.classes.encoding === "png") {
    src.seg = await overlay(msg.classes.bytes, (v) => segColor(v));
  } else if (msg.kind === "matte" && msg.alpha.encoding === "png") {
    src.matte = await overlay(msg.alpha.bytes, (v) => [0, 0, 0, Math.round((255 - v) * 0.6)]);
  }
  if (src.id === state.selected) schedule();
}

function segColor(v) {
  if (!state.meta || v === state.meta.background_id || v >= state.meta.seg_palette.length) return [0, 0, 0, 0];
  const [r, g, b] = state.meta.seg_palette[v];
  return [r, g, b, 115];
}

/** A gray PNG mapped pixel by pixel to RGBA: an overlay canvas. */
async function overlay(png, color) {
  const bitmap = await createImageBitmap(new Blob([png], { type: "image/png" }));
  const canvas = new OffscreenCanvas(bitmap.width, bitmap.height);
  const ctx = canvas.getContext("2d");
  ctx.drawImage(bitmap, 0, 0);
  bitmap.close();
  const pixels = ctx.getImageData(0, 0, canvas.width, canvas.height);
  const d = pixels.data;
  for (let i = 0; i < d.length; i += 4) {
    const [r, g, b, a] = color(d[i]);
    d[i] = r; d[i + 1] = g; d[i + 2] = b; d[i + 3] = a;
  }
  ctx.putImageData(pixels, 0, 0);
  return canvas;
}

// -- drawing -----------------------------------------------------------------------------------
function schedule() {
  if (state.pending) return;
  state.pending = true;
  requestAnimationFrame(() => { state.pending = false; draw(); });
}

function draw() {
  const src = state.sources.get(state.selected);
  figures(src);
  if (!src || !src.frame) return;
  const canvas = $("view");
  const ctx = canvas.getContext("2d");
  if (canvas.width !== src.frame.width || canvas.height !== src.frame.height) {
    canvas.width = src.frame.width;
    canvas.height = src.frame.height;
  }
  ctx.drawImage(src.frame, 0, 0);
  if (state.layers.matte && src.matte) ctx.drawImage(src.matte, 0, 0, canvas.width, canvas.height);
  if (state.layers.seg && src.seg) ctx.drawImage(src.seg, 0, 0, canvas.width, canvas.height);
  const kp = src.keypoints.get(src.frameMeta.frame_index) || src.latest;
  if (kp) persons(ctx, kp, canvas.width);
  space(kp);
  $("empty").hidden = true;
  $("caption").textContent = `${src.id}: frame ${src.frameMeta.frame_index}, ${src.frame.width}×${src.frame.height}`
    + (src.annotated ? " (the pipeline drew its own overlays on this picture too)" : "");
  state.drawn += 1;
  body.dataset.framesDrawn = String(state.drawn);
  body.dataset.lastFrameIndex = String(src.frameMeta.frame_index);
}

function persons(ctx, kp, width) {
  const [n, k] = kp.shapes.keypoints;
  const drawn = { links: 0, face: 0, boxes: 0 };
  const xy = kp.keypoints, scores = kp.keypoint_scores, meta = state.meta;
  const line = Math.max(1, Math.round(width / 500));
  for (let p = 0; p < n; p++) {
    if (state.layers.boxes) {
      const [x1, y1, x2, y2] = kp.boxes.subarray(4 * p, 4 * p + 4);
      ctx.strokeStyle = "#4aa3ff";
      ctx.lineWidth = line;
      ctx.strokeRect(x1, y1, x2 - x1, y2 - y1);
      drawn.boxes += 1;
    }
    if (state.layers.ids && kp.track_ids[p] >= 0n) {
      const [x1, y1] = kp.boxes.subarray(4 * p, 4 * p + 2);
      ctx.fillStyle = "#4aa3ff";
      ctx.font = `${12 * line}px system-ui`;
      ctx.fillText(`id ${kp.track_ids[p]}`, x1 + 3, Math.max(12 * line, y1 - 4));
    }
    if (!meta || !k) continue;
    const seen = (i) => scores[p * k + i] > threshold;
    const at = (i) => [xy[(p * k + i) * 2], xy[(p * k + i) * 2 + 1]];
    if (state.layers.skeleton || state.layers.hands) {
      meta.links.forEach(([a, b], j) => {
        const hand = meta.hand.has(a) || meta.hand.has(b);
        if ((hand && !state.layers.hands) || (!hand && !state.layers.skeleton) || !seen(a) || !seen(b)) return;
        const [r, g, bl] = meta.link_colors[j];
        ctx.strokeStyle = `rgb(${r},${g},${bl})`;
        ctx.lineWidth = hand ? line : line * 2;
        ctx.beginPath();
        ctx.moveTo(...at(a));
        ctx.lineTo(...at(b));
        ctx.stroke();
        drawn.links += 1;
      });
    }
    if (state.layers.face) {
      ctx.fillStyle = "#f5f5f5";
      for (const i of meta.groups.face) {
        if (!seen(i)) continue;
        const [x, y] = at(i);
        ctx.fillRect(x - line / 2, y - line / 2, line, line);
        drawn.face += 1;
      }
    }
  }
  body.dataset.drawnLinks = String(drawn.links);
  body.dataset.drawnFace = String(drawn.face);
  body.dataset.drawnBoxes = String(drawn.boxes);
}

// The 3D keypoints (the pointmap sampled at each keypoint, --keypoints3d) projected on one plane
// of the camera frame, all persons at one scale on both axes so proportions are true.
const PLANES = { side: [2, 1, 1], top: [0, 2, -1], front: [0, 1, 1] }; // [horizontal axis, vertical axis, vertical sign]

function space(kp) {
  const k3 = kp && kp.keypoints3d;
  $("space").hidden = !k3;
  if (!k3) return;
  const [n, k] = kp.shapes.keypoints;
  const canvas = $("side"), ctx = canvas.getContext("2d");
  ctx.clearRect(0, 0, canvas.width, canvas.height);
  const [h, v, sign] = PLANES[$("spaceview").value] || PLANES.side;
  let lo = [Infinity, Infinity], hi = [-Infinity, -Infinity], count = 0;
  for (let i = 0; i < n * k; i++) {
    if (!k3.valid[i]) continue;
    const a = k3.xyz[3 * i + h], b = sign * k3.xyz[3 * i + v];
    lo = [Math.min(lo[0], a), Math.min(lo[1], b)];
    hi = [Math.max(hi[0], a), Math.max(hi[1], b)];
    count += 1;
  }
  $("spaceunits").textContent = k3.metric ? "camera frame, metric" : "camera frame, canonical (no scale branch)";
  let drawn = 0;
  if (count) {
    const span = Math.max(hi[0] - lo[0], hi[1] - lo[1], 1e-6) * 1.15;
    const px = Math.min(canvas.width, canvas.height) - 16;
    const at = (i) => [(k3.xyz[3 * i + h] - (lo[0] + hi[0]) / 2) / span * px + canvas.width / 2,
                       (sign * k3.xyz[3 * i + v] - (lo[1] + hi[1]) / 2) / span * px + canvas.height / 2];
    const meta = state.meta;
    for (let p = 0; p < n && meta; p++) {
      meta.links.forEach(([a, b], j) => {
        if (!k3.valid[p * k + a] || !k3.valid[p * k + b]) return;
        const [r, g, bl] = meta.link_colors[j];
        ctx.strokeStyle = `rgb(${r},${g},${bl})`;
        ctx.lineWidth = 2;
        ctx.beginPath();
        ctx.moveTo(...at(p * k + a));
        ctx.lineTo(...at(p * k + b));
        ctx.stroke();
        drawn += 1;
      });
    }
  }
  const roots = [];
  for (let p = 0; p < n; p++) {
    if (k3.root_valid[p]) roots.push(`#${p}: ${Array.from(k3.root.subarray(3 * p, 3 * p + 3), (x) => x.toFixed(2)).join(", ")}`);
  }
  $("spaceroot").textContent = roots.length ? `root (mean of the hips) x, y, z: ${roots.join(" · ")}` : "no root this frame";
  body.dataset.drawn3d = String(drawn);
  body.dataset.points3d = String(count);
}

function badge(el, text, kind) {
  el.textContent = text;
  el.className = `badge ${kind}`;
}

function figures(src) {
  body.dataset.messages = String(state.messages);
  body.dataset.refused = String(state.refused);
  if (!src) return;
  const status = src.status;
  const health = status ? status.health : (src.frame ? "ok" : "waiting");
  badge($("health"), health, { ok: "ok", stalled: "bad", reconnecting: "warn", closed: "wait" }[health] || "wait");
  body.dataset.health = health;
  const fps = status ? status.fps : 0;
  body.dataset.fps = fps.toFixed(2);
  $("fps").textContent = status ? fps.toFixed(1) : "–";
  const kp = src.latest;
  const meta = kp ? kp.meta : src.frameMeta;
  $("banner").hidden = !(meta && meta.random_weights);
  if (!meta) return;
  $("frame").textContent = String(meta.frame_index);
  $("persons").textContent = kp ? String(kp.num_persons) : "–";
  const age = src.history[src.history.length - 1];
  $("age").textContent = age === undefined ? "–" : `${age.toFixed(0)} ms`;
  const drops = (status ? status.drops : meta.drops) || {};
  $("drops").textContent = String(drops.source ?? 0);
  $("pubdrops").textContent = String(Object.entries(drops).filter(([key]) => key.startsWith("publish_"))
    .reduce((n, [, v]) => n + Number(v), 0));
  $("reopens").textContent = String(drops.reopens ?? 0);
  $("decode").textContent = String(drops.decode_errors ?? 0);
  const rows = Object.entries(meta.latency_ms).map(([stage, ms]) =>
    `<tr><th>${stage}</th><td>${Number(ms).toFixed(1)}</td></tr>`);
  $("stages").innerHTML = rows.join("");
  plot(src.history);
}

function plot(values) {
  const canvas = $("plot"), ctx = canvas.getContext("2d");
  ctx.clearRect(0, 0, canvas.width, canvas.height);
  if (values.length < 2) return;
  const top = Math.max(...values) * 1.1 || 1;
  ctx.strokeStyle = "#4aa3ff";
  ctx.lineWidth = 1.5;
  ctx.beginPath();
  values.forEach((v, i) => {
    const x = (i / (HISTORY - 1)) * canvas.width;
    const y = canvas.height - (v / top) * (canvas.height - 4) - 2;
    if (i) ctx.lineTo(x, y); else ctx.moveTo(x, y);
  });
  ctx.stroke();
  const sorted = [...values].sort((a, b) => a - b);
  $("plotrange").textContent = `median ${sorted[Math.floor(sorted.length / 2)].toFixed(0)} ms, max ${top / 1.1 | 0} ms`;
}

// -- connection --------------------------------------------------------------------------------
function connect() {
  const token = new URLSearchParams(location.search).get("token");
  const url = new URL("ws", location.href.replace(/^http/, "ws"));
  if (token) url.searchParams.set("token", token);
  const ws = new WebSocket(url);
  ws.binaryType = "arraybuffer";
  ws.onopen = () => badge($("connection"), "connected", "ok");
  ws.onclose = () => {
    badge($("connection"), "disconnected: retrying", "bad");
    setTimeout(connect, 1000);
  };
  ws.onmessage = (event) => {
    state.messages += 1;
    let msg;
    try {
      msg = decodeMessage(unpackFrames(event.data));
    } catch (error) {
      if (!(error instanceof WireError)) throw error;
      state.refused += 1;  // counted, skipped: one bad message never stops the view
      body.dataset.refused = String(state.refused);
      return;
    }
    handle(msg).catch((error) => console.warn("could not show a message", error));
  };
}

async function start() {
  const response = await fetch("metadata.json");
  state.meta = await response.json();
  state.meta.hand = new Set([...state.meta.groups.left_hand, ...state.meta.groups.right_hand]);
  connect();
}
start();

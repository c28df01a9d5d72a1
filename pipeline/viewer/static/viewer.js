// The sapiens2-stream live view: wire messages over a WebSocket, decoded here with the JavaScript
// client's browser build, drawn on a canvas. Counters are mirrored on <body data-*> for tests.
import { IMAGE_PART, WireError, decodeMessage, unpackFrames } from "./sapiens2-client.browser.js";
import { WorldView } from "./world3d.js";

const $ = (id) => document.getElementById(id);
const body = document.body;
const threshold = Number(body.dataset.kptThreshold) || 0.3;
const HISTORY = 120;

const KEYPOINT_BUFFER = 150; // keypoints messages kept per source, to find the ones of the frame shown
const OVERLAY_BUFFER = 30; // encoded seg / matte messages kept per source, likewise
const OVERLAYS = { seg: (v) => segColor(v), matte: (v) => [0, 0, 0, Math.round((255 - v) * 0.6)] };

const state = {
  meta: null,
  sources: new Map(), // id -> per-source state
  selected: null,
  layers: {},
  drawn: 0,
  messages: 0,
  refused: 0,
  pending: false,
  ws: null,
  arrivals: 0,
  world: null, // the WorldView, once the metadata came
  leaving: false, // the page was left: its WebSocket is closed and not made again
};

function source(id) {
  if (!state.sources.has(id)) {
    state.sources.set(id, { id, frame: null, frameMeta: null, frameAge: null, frameSeq: 0, annotated: null,
                            keypoints: new Map(), latest: null, status: null, history: [],
                            png: { seg: new Map(), matte: new Map() }, overlay: { seg: null, matte: null } });
    const option = document.createElement("option");
    option.value = option.textContent = id;
    $("source").append(option);
    if (state.selected === null) select(id);
  }
  return state.sources.get(id);
}

/** Show source `id`: the server then sends the pictures of this source only. */
function select(id) {
  state.selected = id;
  $("source").value = id;
  body.dataset.source = id;
  for (const src of state.sources.values()) {
    if (src.id !== id && src.frame) { src.frame.close(); src.frame = null; } // its pictures stop coming
  }
  tellServer();
  schedule();
}

function tellServer() {
  if (state.ws && state.ws.readyState === WebSocket.OPEN && state.selected !== null) {
    state.ws.send(JSON.stringify({ source: state.selected }));
  }
}

const enabledLayers = () => Object.keys(state.layers).filter((k) => state.layers[k]).join(",");
for (const box of document.querySelectorAll("#layers input")) {
  state.layers[box.dataset.layer] = box.checked;
  box.addEventListener("change", () => {
    state.layers[box.dataset.layer] = box.checked;
    body.dataset.layers = enabledLayers();
    const src = state.sources.get(state.selected);
    if (box.dataset.layer in OVERLAYS && src) prepareOverlay(src, box.dataset.layer).then(schedule);
    schedule();
  });
}
body.dataset.layers = enabledLayers();
$("source").addEventListener("change", (e) => select(e.target.value));
$("spaceview").addEventListener("change", () => schedule());

// -- messages ----------------------------------------------------------------------------------
async function handle(msg) {
  if (msg.kind === "world") { // a rig's step, not a camera: it has its own view, not a place in the picker
    state.world.update(msg);
    return;
  }
  const src = source(msg.source_id);
  if (msg.kind === "status") {
    src.status = msg;
  } else if (msg.kind === "keypoints") {
    src.keypoints.set(msg.meta.frame_index, msg);
    src.latest = msg;
    if (src.keypoints.size > KEYPOINT_BUFFER) src.keypoints.delete(src.keypoints.keys().next().value);
    src.history.push(age(msg));
    if (src.history.length > HISTORY) src.history.shift();
  } else if (msg.kind === "frame" && msg.image.encoding === "jpeg") {
    const seq = ++state.arrivals;
    const bitmap = await createImageBitmap(new Blob([msg.image.bytes], { type: "image/jpeg" }));
    if (seq < src.frameSeq || src.id !== state.selected) { bitmap.close(); return; } // a newer one is shown
    if (!msg.annotated) await Promise.all(Object.keys(OVERLAYS).map((layer) => prepareOverlay(src, layer, msg.meta)));
    if (seq < src.frameSeq) { bitmap.close(); return; }
    if (src.frame) src.frame.close();
    src.frameSeq = seq;
    src.frame = bitmap;
    src.frameMeta = msg.meta;
    src.frameAge = age(msg);
    src.annotated = msg.annotated;
  } else if (msg.kind in OVERLAYS && msg.arrays[IMAGE_PART[msg.kind]].encoding === "png") {
    const pngs = src.png[msg.kind];
    pngs.set(msg.meta.frame_index, msg.arrays[IMAGE_PART[msg.kind]].bytes);
    if (pngs.size > OVERLAY_BUFFER) pngs.delete(pngs.keys().next().value);
    if (src.frameMeta && src.frameMeta.frame_index === msg.meta.frame_index) await prepareOverlay(src, msg.kind);
  }
  if (src.id === state.selected) schedule();
}

const age = (msg) => Number(msg.publish_ns - msg.meta.capture_ns) / 1e6;

/** Decode the `layer` overlay (seg or matte) of the frame `meta` (default: the one shown), if the
 * layer is on, its message came and it is not decoded yet. */
async function prepareOverlay(src, layer, meta = src.frameMeta) {
  if (!meta || !state.layers[layer]) return;
  const index = meta.frame_index;
  const png = src.png[layer].get(index);
  if (!png || (src.overlay[layer] && src.overlay[layer].index === index)) return;
  src.overlay[layer] = { index, canvas: await overlay(png, OVERLAYS[layer]) };
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

/** A picture with the pipeline's overlays drawn in cannot have them toggled: say so, grey the toggles. */
function layerControls(src) {
  const baked = Boolean(src && src.annotated);
  for (const box of document.querySelectorAll("#layers input")) box.disabled = baked;
  $("layers").classList.toggle("baked", baked);
  $("bakednote").hidden = !baked;
  $("layershint").textContent = baked ? "drawn by the pipeline into the picture" : "drawn here, from the keypoint messages";
  body.dataset.annotated = src && src.annotated !== null ? String(baked) : "";
}

function draw() {
  const src = state.sources.get(state.selected);
  layerControls(src);
  const canvas = $("view");
  const ctx = canvas.getContext("2d");
  if (!src || !src.frame) {
    $("empty").hidden = false;
    $("empty").textContent = src ? `Waiting for the first picture of ${src.id}…` : "Waiting for the first frame… (is a pipeline publishing, with frames?)";
    $("caption").textContent = "";
    if (src && !src.frame) ctx.clearRect(0, 0, canvas.width, canvas.height);
    figures(src, src && src.latest, null);
    space(src && src.latest);
    return;
  }
  if (canvas.width !== src.frame.width || canvas.height !== src.frame.height) {
    canvas.width = src.frame.width;
    canvas.height = src.frame.height;
  }
  ctx.drawImage(src.frame, 0, 0);
  const index = src.frameMeta.frame_index;
  const kp = src.keypoints.get(index) || null; // the keypoints of this very frame, or none
  const notes = [];
  const drawn = { links: 0, face: 0, boxes: 0, seg: 0, matte: 0 };
  if (src.annotated) {
    notes.push("overlays drawn by the pipeline");
  } else {
    for (const layer of ["matte", "seg"]) {
      if (!state.layers[layer]) continue;
      const o = src.overlay[layer];
      if (o && o.index === index) {
        ctx.drawImage(o.canvas, 0, 0, canvas.width, canvas.height);
        drawn[layer] = 1;
      } else notes.push(`no ${layer === "seg" ? "segmentation" : "matte"} for this frame`);
    }
    if (kp) persons(ctx, kp, canvas.width, drawn);
  }
  if (!kp) notes.push("keypoints of this frame not received: none drawn");
  else notes.push(`keypoints of this frame (${kp.num_persons} ${kp.num_persons === 1 ? "person" : "persons"})`);
  body.dataset.drawnLinks = String(drawn.links);
  body.dataset.drawnFace = String(drawn.face);
  body.dataset.drawnBoxes = String(drawn.boxes);
  body.dataset.drawnSeg = String(drawn.seg);
  body.dataset.drawnMatte = String(drawn.matte);
  body.dataset.keypointsFrameIndex = kp ? String(kp.meta.frame_index) : "-1";
  space(kp);
  $("empty").hidden = true;
  $("caption").textContent = `${src.id} · frame ${index} · ${src.frame.width}×${src.frame.height} · ${notes.join(" · ")}`;
  figures(src, kp, src.frameMeta);
  state.drawn += 1;
  body.dataset.framesDrawn = String(state.drawn);
  body.dataset.lastFrameIndex = String(index);
}

function persons(ctx, kp, width, drawn) {
  const [n, k] = kp.shapes.keypoints;
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
      const size = Math.max(12, 8 * line);
      ctx.font = `bold ${size}px system-ui`;
      const label = `id ${kp.track_ids[p]}`;
      const x = Math.max(0, x1), y = y1 - size - 4 >= 0 ? y1 - size - 4 : Math.max(0, y1) + 2; // inside when no room above
      ctx.fillStyle = "rgba(0, 0, 0, 0.6)";
      ctx.fillRect(x, y, ctx.measureText(label).width + 8, size + 4);
      ctx.fillStyle = "#8cc4ff";
      ctx.textBaseline = "top";
      ctx.fillText(label, x + 4, y + 3);
      ctx.textBaseline = "alphabetic";
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
  $("spaceunits").textContent = k3.metric
    ? "camera frame, metric (unit not named by the reference: conventionally metres, unverified)"
    : "camera frame, canonical: scale depends on the unknown focal length";
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

/** The figures of the frame `meta` (the one shown, else the latest keypoints) and its keypoints `kp`
 * (null when they did not come), and of the source as its status says. */
function figures(src, kp, shown) {
  body.dataset.messages = String(state.messages);
  body.dataset.refused = String(state.refused);
  if (!src) return;
  const status = src.status;
  const health = status ? status.health : (src.frame ? "ok" : "waiting");
  badge($("health"), health, { ok: "ok", stalled: "bad", failed: "bad", reconnecting: "warn", closed: "wait" }[health] || "wait");
  body.dataset.health = health;
  const fps = status ? status.fps : 0;
  body.dataset.fps = fps.toFixed(2);
  $("fps").textContent = status ? fps.toFixed(1) : "–";
  const meta = shown || (kp ? kp.meta : null);
  $("banner").hidden = !(meta && meta.random_weights);
  if (!meta) return;
  $("framelabel").textContent = shown ? "Frame shown" : "Frame (keypoints, no picture yet)";
  $("frame").textContent = String(meta.frame_index);
  const wholeFrame = status && status.detector === "full-frame";
  $("persons").textContent = kp ? String(kp.num_persons) + (wholeFrame ? " (whole frame)" : "") : "–";
  $("persons").title = wholeFrame ? "no person detector runs: the whole frame is taken as one person" : "";
  $("detectornote").hidden = !wholeFrame;
  // A file is decoded ahead of the models: its frames wait in a queue first (the stage "queue" below),
  // so its figure runs from the frame's read, not from a capture.
  const file = Boolean(status && status.header.live === false);
  $("agelabel").textContent = file ? "Read → publish" : "Capture → publish";
  $("agelabel").title = file ? "from the frame's read from the file to its publication, including its wait in the "
    + "read-ahead queue (the stage queue below): a file is decoded ahead of the models, so its frames queue up"
    : "from the camera's capture of the frame to its publication (the stage queue below: its wait to be taken)";
  $("plotlabel").textContent = file ? "read → publish" : "capture → publish";
  const ms = kp ? age(kp) : src.frameAge;
  $("age").textContent = ms === null || ms === undefined ? "–" : `${ms.toFixed(0)} ms`;
  const drops = (status ? status.drops : meta.drops) || {};
  $("drops").textContent = String(drops.source ?? 0);
  $("pubdrops").textContent = String(Object.entries(drops).filter(([key]) => key.startsWith("publish_"))
    .reduce((n, [, v]) => n + Number(v), 0));
  $("reopens").textContent = String(drops.reopens ?? 0);
  $("decode").textContent = String(drops.decode_errors ?? 0);
  $("stages").replaceChildren(...Object.entries(meta.latency_ms).map(([stage, value]) => {
    const row = document.createElement("tr"), th = document.createElement("th"), td = document.createElement("td");
    th.textContent = stage; // a header's text, never markup
    td.textContent = Number(value).toFixed(1);
    row.append(th, td);
    return row;
  }));
  $("stageshint").textContent = `ms, frame ${meta.frame_index}`;
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
  state.ws = ws;
  ws.onopen = () => { badge($("connection"), "connected", "ok"); tellServer(); };
  ws.onclose = () => {
    if (state.ws !== ws || state.leaving) return; // closed on purpose (the page was left)
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

// A page left for another stays alive in the browser's back/forward cache for minutes, and with it its
// WebSocket: the viewer would go on sending it frames nobody sees. Close it when the page is left,
// connect again if the page is shown from that cache.
window.addEventListener("pagehide", () => {
  state.leaving = true;
  if (state.ws) state.ws.close();
});
window.addEventListener("pageshow", (event) => {
  if (!event.persisted) return;
  state.leaving = false;
  connect();
});

async function start() {
  const response = await fetch("metadata.json");
  state.meta = await response.json();
  state.meta.hand = new Set([...state.meta.groups.left_hand, ...state.meta.groups.right_hand]);
  state.world = new WorldView({ section: $("world"), canvas: $("world3d"), hint: $("worldhint"),
                                picker: $("rigpicker"), select: $("rig") }, state.meta);
  connect();
}
start();

// The world view: the persons a calibrated rig triangulated (world messages, docs/WIRE.md "World
// keypoints") drawn in 3D on a 2D canvas with an orbiting perspective camera. The world frame is
// the calibration's: metres, right-handed, Z up out of the floor. Drag rotates the camera about the
// scene's centre; a double-click resets it. What is drawn is mirrored on <body data-world-*> for tests.

const DEG = Math.PI / 180;
const HOME = { yaw: -35 * DEG, pitch: 20 * DEG }; // a three-quarter view from above
const STALE_MS = 5000; // no world step for this long: the panel hides again (the rig stopped)
const AXIS_M = 0.5;

/** One rotatable 3D view of the newest world message of the rig it shows. */
export class WorldView {
  /**
   * @param {{section: HTMLElement, canvas: HTMLCanvasElement, hint: HTMLElement, picker: HTMLElement,
   *   select: HTMLSelectElement}} els
   * @param {{links: number[][], link_colors: number[][]}} meta the page's /metadata.json
   */
  constructor(els, meta) {
    this.els = els;
    this.meta = meta;
    this.rigs = new Map(); // rig id -> {msg, at (performance.now() of its arrival)}
    this.rig = null;
    this.view = { ...HOME };
    this.pending = false;
    this.drag = null;
    const canvas = els.canvas;
    canvas.addEventListener("pointerdown", (e) => {
      this.drag = { x: e.clientX, y: e.clientY };
      canvas.setPointerCapture(e.pointerId);
    });
    canvas.addEventListener("pointermove", (e) => {
      if (!this.drag) return;
      this.rotate(e.clientX - this.drag.x, e.clientY - this.drag.y);
      this.drag = { x: e.clientX, y: e.clientY };
    });
    const end = () => { this.drag = null; };
    canvas.addEventListener("pointerup", end);
    canvas.addEventListener("pointercancel", end);
    canvas.addEventListener("dblclick", () => { this.view = { ...HOME }; this.schedule(); });
    els.select.addEventListener("change", () => { this.rig = els.select.value; this.schedule(); });
    setInterval(() => this.hideIfStale(), 500);
  }

  /** A decoded WorldMessage arrived: the newest of its rig replaces the one before. */
  update(msg) {
    if (!this.rigs.has(msg.source_id)) {
      const option = document.createElement("option");
      option.value = option.textContent = msg.source_id;
      this.els.select.append(option);
      if (this.rig === null) this.rig = msg.source_id;
    }
    this.rigs.set(msg.source_id, { msg, at: performance.now() });
    this.els.picker.hidden = this.rigs.size < 2; // a picker once there is a second rig
    this.schedule();
  }

  /** Drag by (dx, dy) pixels: yaw about the world's Z, pitch clamped between the floor and straight down. */
  rotate(dx, dy) {
    this.view.yaw -= dx * 0.01;
    this.view.pitch = Math.min(89 * DEG, Math.max(-10 * DEG, this.view.pitch + dy * 0.01));
    this.schedule();
  }

  hideIfStale() {
    const shown = this.rigs.get(this.rig);
    if (shown && performance.now() - shown.at > STALE_MS && !this.els.section.hidden) {
      this.els.section.hidden = true;
      document.body.dataset.worldShown = "false";
    }
  }

  schedule() {
    if (this.pending) return;
    this.pending = true;
    requestAnimationFrame(() => { this.pending = false; this.draw(); });
  }

  draw() {
    const shown = this.rigs.get(this.rig);
    if (!shown) return;
    const { msg } = shown;
    this.els.section.hidden = performance.now() - shown.at > STALE_MS;
    const canvas = this.els.canvas;
    const ctx = canvas.getContext("2d");
    ctx.clearRect(0, 0, canvas.width, canvas.height);
    const { num_persons: n, num_keypoints: k } = msg;
    const xyz = msg.world_keypoints, valid = msg.world_valid;
    const scene = bounds(xyz, valid, n * k);
    const project = camera(this.view, scene, canvas.width, canvas.height);
    grid(ctx, project, scene);
    axes(ctx, project);
    const drawn = this.persons(ctx, project, msg);
    const b = document.body.dataset;
    b.worldShown = String(!this.els.section.hidden);
    b.worldRig = msg.source_id;
    b.worldFrameIndex = String(msg.meta.frame_index);
    b.worldPersons = String(n);
    b.worldIds = Array.from(msg.world_ids, String).join(",");
    b.worldPoints = String(drawn.points);
    b.worldLinks = String(drawn.links);
    b.worldYaw = (this.view.yaw / DEG).toFixed(1);
    b.worldPitch = (this.view.pitch / DEG).toFixed(1);
    const missing = msg.cameras.filter((c) => !(c in msg.camera_frames));
    this.els.hint.textContent = `${msg.source_id} · step ${msg.meta.frame_index} · ${n} ${n === 1 ? "person" : "persons"}`
      + ` · metres, Z up · ${msg.cameras.length - missing.length}/${msg.cameras.length} cameras`
      + (missing.length ? ` (no frame: ${missing.join(", ")})` : "")
      + (msg.num_single_view ? ` · ${msg.num_single_view} seen by one camera only` : "");
  }

  /** The skeleton links between valid points, far ones first, the valid points, and each person's id. */
  persons(ctx, project, msg) {
    const { num_persons: n, num_keypoints: k } = msg;
    const xyz = msg.world_keypoints, valid = msg.world_valid;
    const at = (i) => project(xyz[3 * i], xyz[3 * i + 1], xyz[3 * i + 2]);
    const segments = [];
    for (let p = 0; p < n; p++) {
      this.meta.links.forEach(([a, b], j) => {
        const i = p * k + a, m = p * k + b;
        if (a >= k || b >= k || !valid[i] || !valid[m]) return;
        const [pa, pb] = [at(i), at(m)];
        if (pa && pb) segments.push({ pa, pb, depth: pa[2] + pb[2], color: this.meta.link_colors[j] });
      });
    }
    segments.sort((s, t) => t.depth - s.depth);
    ctx.lineWidth = 2.5;
    ctx.lineCap = "round";
    for (const { pa, pb, color: [r, g, bl] } of segments) {
      ctx.strokeStyle = `rgb(${r},${g},${bl})`;
      ctx.beginPath();
      ctx.moveTo(pa[0], pa[1]);
      ctx.lineTo(pb[0], pb[1]);
      ctx.stroke();
    }
    let points = 0;
    ctx.fillStyle = "#f0f3f5";
    for (let p = 0; p < n; p++) {
      let top = null;
      for (let i = p * k; i < (p + 1) * k; i++) {
        if (!valid[i]) continue; // invalid points are zeros on the wire: never drawn
        const s = at(i);
        if (!s) continue;
        ctx.fillRect(s[0] - 1, s[1] - 1, 2, 2);
        points += 1;
        if (top === null || xyz[3 * i + 2] > xyz[3 * top + 2]) top = i;
      }
      const head = top === null ? null : project(xyz[3 * top], xyz[3 * top + 1], xyz[3 * top + 2] + 0.15);
      if (head) label(ctx, `id ${msg.world_ids[p]}`, head[0], head[1], "#8cc4ff");
    }
    return { points, links: segments.length };
  }
}

/** The floor square the scene stands on (whole metres, the origin and every valid point's foot in
 * it) and the height of its points. */
function bounds(xyz, valid, count) {
  let [x0, x1, y0, y1, z1] = [0, 0, 0, 0, 1.8];
  for (let i = 0; i < count; i++) {
    if (!valid[i]) continue;
    x0 = Math.min(x0, xyz[3 * i]); x1 = Math.max(x1, xyz[3 * i]);
    y0 = Math.min(y0, xyz[3 * i + 1]); y1 = Math.max(y1, xyz[3 * i + 1]);
    z1 = Math.max(z1, xyz[3 * i + 2]);
  }
  [x0, y0] = [Math.floor(x0 - 0.5), Math.floor(y0 - 0.5)];
  [x1, y1] = [Math.ceil(x1 + 0.5), Math.ceil(y1 + 0.5)];
  return { x0, x1, y0, y1, z1, centre: [(x0 + x1) / 2, (y0 + y1) / 2, z1 / 2],
    size: Math.max(x1 - x0, y1 - y0, z1) };
}

/**
 * World -> canvas: an orbit camera about the scene's centre, `yaw` about Z, `pitch` above the floor,
 * far enough to hold the scene. Returns (x, y, z) -> [px, py, depth], or null behind the camera.
 * (Screen right is +X and into the screen +Y at yaw 0: right-handed, nothing mirrored.)
 */
function camera({ yaw, pitch }, scene, width, height) {
  const [cx, cy, cz] = scene.centre;
  const [cosA, sinA, cosE, sinE] = [Math.cos(yaw), Math.sin(yaw), Math.cos(pitch), Math.sin(pitch)];
  const distance = scene.size * 2 + 1;
  const focal = (Math.min(width, height) * distance) / scene.size; // the scene about fills the view
  return (x, y, z) => {
    const [px, py, pz] = [x - cx, y - cy, z - cz];
    const u = cosA * px + sinA * py; // rotated about Z by -yaw
    const v = -sinA * px + cosA * py;
    const depth = v * cosE - pz * sinE + distance; // the camera looks down by `pitch`
    const up = v * sinE + pz * cosE;
    if (depth < 0.05) return null;
    return [width / 2 + (focal * u) / depth, height / 2 - (focal * up) / depth, depth];
  };
}

/** The floor (Z = 0) as a 1 m grid. */
function grid(ctx, project, { x0, x1, y0, y1 }) {
  ctx.strokeStyle = "rgba(147, 160, 171, 0.35)";
  ctx.lineWidth = 1;
  const line = (a, b) => {
    if (!a || !b) return;
    ctx.beginPath();
    ctx.moveTo(a[0], a[1]);
    ctx.lineTo(b[0], b[1]);
    ctx.stroke();
  };
  for (let x = x0; x <= x1; x++) line(project(x, y0, 0), project(x, y1, 0));
  for (let y = y0; y <= y1; y++) line(project(x0, y, 0), project(x1, y, 0));
}

/** X, Y, Z from the world origin (red, green, blue, as most 3D tools draw them), labelled. */
function axes(ctx, project) {
  const origin = project(0, 0, 0);
  if (!origin) return;
  for (const [name, end, color] of [["X", [AXIS_M, 0, 0], "#e8504f"], ["Y", [0, AXIS_M, 0], "#3fbf6f"],
    ["Z", [0, 0, AXIS_M], "#4aa3ff"]]) {
    const tip = project(...end);
    if (!tip) continue;
    ctx.strokeStyle = color;
    ctx.lineWidth = 2;
    ctx.beginPath();
    ctx.moveTo(origin[0], origin[1]);
    ctx.lineTo(tip[0], tip[1]);
    ctx.stroke();
    label(ctx, name, tip[0] + 2, tip[1] - 2, color);
  }
}

function label(ctx, text, x, y, color) {
  ctx.font = "bold 11px system-ui";
  ctx.fillStyle = "rgba(0, 0, 0, 0.55)";
  const w = ctx.measureText(text).width;
  ctx.fillRect(x - w / 2 - 3, y - 13, w + 6, 15);
  ctx.fillStyle = color;
  ctx.textAlign = "center";
  ctx.fillText(text, x, y - 2);
  ctx.textAlign = "start";
}

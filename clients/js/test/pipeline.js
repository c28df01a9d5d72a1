// Running the real pipeline for the live tests: a free port, the offline demo command, and a
// stop that never leaves the process behind.

import { spawn } from "node:child_process";
import { existsSync } from "node:fs";
import { createServer } from "node:net";

import { pipelineCli } from "./helpers.js";

/** A TCP port that was free a moment ago on 127.0.0.1. */
export function freePort() {
  return new Promise((resolve, reject) => {
    const server = createServer();
    server.unref();
    server.on("error", reject);
    server.listen(0, "127.0.0.1", () => {
      const { port } = server.address();
      server.close(() => resolve(port));
    });
  });
}

const running = new Set();
process.on("exit", () => {
  for (const child of running) killGroup(child, "SIGKILL");
});

function killGroup(child, signal) {
  try {
    process.kill(-child.pid, signal); // its process group: it was started detached, as the group leader
  } catch {
    try {
      child.kill(signal);
    } catch {
      // already gone
    }
  }
}

/**
 * Start `sapiens2-stream` on the embedded demo clip (offline, tiny random weights, CPU, realtime),
 * publishing on tcp://127.0.0.1:PORT as source cam7. Returns the child with `.output()` (its
 * stdout+stderr so far) and `.exited` (a promise of {code, signal}).
 */
export function startPipeline({ port, cacheDir, extraArgs = [] }) {
  const cli = pipelineCli();
  if (!existsSync(cli)) {
    throw new Error(`the pipeline CLI ${cli} does not exist: set SAPIENS2_STREAM_CLI, run \`make install\` at the `
      + "repository root, or set SAPIENS2_STREAM_LIVE=0 to skip the live tests");
  }
  const args = ["--source", "demo", "--realtime", "--tasks", "pose,seg", "--detector", "full-frame", "--fallback-tiny",
    "--device", "cpu", "--dtype", "float32", "--no-progress", "--publish", `tcp://127.0.0.1:${port}`,
    "--source-id", "cam7", ...extraArgs];
  const child = spawn(cli, args, {
    env: { ...process.env, HF_HUB_OFFLINE: "1", YOLO_OFFLINE: "1", OMP_NUM_THREADS: "1",
      SAPIENS2_STREAM_CACHE: cacheDir, HF_HOME: `${cacheDir}/hf`, YOLO_CONFIG_DIR: `${cacheDir}/yolo-config` },
    stdio: ["ignore", "pipe", "pipe"],
    detached: true,
  });
  running.add(child);
  let output = "";
  child.stdout.on("data", (d) => (output += d));
  child.stderr.on("data", (d) => (output += d));
  child.output = () => output;
  child.exited = new Promise((resolve) => {
    child.on("exit", (code, signal) => {
      running.delete(child);
      resolve({ code, signal });
    });
    child.on("error", (error) => {
      running.delete(child);
      resolve({ code: null, signal: null, error });
    });
  });
  return child;
}

/** Whether the child is still running. */
export const alive = (child) => child.exitCode === null && child.signalCode === null;

/**
 * Stop a pipeline: SIGINT (a clean stop) when it still runs, SIGKILL to its group after `graceMs`.
 * Returns {code, signal, interrupted} (interrupted: whether SIGINT was sent).
 */
export async function stopPipeline(child, graceMs = 60_000) {
  if (!child) return null;
  let interrupted = false;
  if (alive(child)) {
    child.kill("SIGINT");
    interrupted = true;
  }
  const timer = setTimeout(() => killGroup(child, "SIGKILL"), graceMs);
  const result = await child.exited;
  clearTimeout(timer);
  return { ...result, interrupted };
}

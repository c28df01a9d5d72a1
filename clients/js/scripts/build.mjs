/**
 * The browser build: one ESM file with the decoder and @msgpack/msgpack (no Node API, no zeromq,
 * no pixel decoding), built from src/ by esbuild (pinned, so the output is the same bytes on every
 * machine).
 *
 *   node scripts/build.mjs          writes the one committed copy, the viewer's
 *                                   pipeline/viewer/static/sapiens2-client.browser.js (package data
 *                                   of the pipeline: a pip install needs no npm)
 *   (the npm package's `./browser` export, dist/sapiens2-client.browser.js, is a copy of the committed
 *   one: scripts/dist.mjs, run by `prepare`; dist/ is not committed)
 *   node scripts/build.mjs --out F  writes F (test/bundle.test.js rebuilds into a temporary folder
 *                                   and compares it with the committed copy byte for byte)
 */

import { mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

import * as esbuild from "esbuild";

export const ROOT = join(dirname(fileURLToPath(import.meta.url)), "..");
const NAME = "sapiens2-client.browser.js";
/** The committed copy: the file the viewer serves. */
export const COMMITTED = join(ROOT, "..", "..", "pipeline", "viewer", "static", NAME);

const pkg = JSON.parse(readFileSync(join(ROOT, "package.json"), "utf8"));

/** esbuild options; absWorkingDir pins the paths in the output's comments to this folder. */
export const OPTIONS = {
  absWorkingDir: ROOT,
  entryPoints: ["src/decode.js"],
  bundle: true,
  format: "esm",
  platform: "browser",
  target: ["es2020"],
  charset: "ascii",
  legalComments: "inline",
  banner: { js: `// ${pkg.name} ${pkg.version}: browser build of src/decode.js (npm run build; do not edit)` },
  write: false,
  logLevel: "silent",
};

/** Build in memory; returns the bundle's text (the same wherever it is written). */
export async function buildBundle() {
  const result = await esbuild.build({ ...OPTIONS, outfile: join(ROOT, "dist", NAME) });
  return result.outputFiles[0].text;
}

/** Where a command line asks the bundle to go: --out FILE, else the committed copy. */
function target(args) {
  if (args[0] === "--out" && args.length === 2) return resolve(args[1]);
  if (args.length === 0) return COMMITTED;
  console.error("usage: node scripts/build.mjs [--out FILE]");
  process.exit(2);
}

if (process.argv[1] && fileURLToPath(import.meta.url) === process.argv[1]) {
  const out = target(process.argv.slice(2));
  const text = await buildBundle();
  mkdirSync(dirname(out), { recursive: true });
  writeFileSync(out, text);
  console.error(`wrote ${out}`);
}

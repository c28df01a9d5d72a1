/**
 * The browser build: dist/sapiens2-client.browser.js, one ESM file with the decoder and
 * @msgpack/msgpack (no Node API, no zeromq, no pixel decoding). `npm run build` writes it;
 * test/bundle.test.js checks that a rebuild gives the committed file byte for byte.
 */

import { readFileSync, writeFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

import * as esbuild from "esbuild";

export const ROOT = join(dirname(fileURLToPath(import.meta.url)), "..");
export const OUTFILE = join(ROOT, "dist", "sapiens2-client.browser.js");

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

/** Build in memory; returns the bundle's text. */
export async function buildBundle() {
  const result = await esbuild.build({ ...OPTIONS, outfile: OUTFILE });
  return result.outputFiles[0].text;
}

if (process.argv[1] && fileURLToPath(import.meta.url) === process.argv[1]) {
  writeFileSync(OUTFILE, await buildBundle());
  console.log(`wrote ${OUTFILE}`);
}

// The browser build has one committed copy, pipeline/viewer/static/sapiens2-client.browser.js (the
// viewer's package data), and it is what `npm run build` makes from src/, byte for byte: the test
// rebuilds it into a temporary folder with the build script itself and compares. The npm package's
// `./browser` export is the same bundle, copied when the package is packed (scripts/dist.mjs). And the
// bundle is browser-safe: one self-contained ESM file without Node modules or zeromq.

import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, test } from "node:test";
import { pathToFileURL } from "node:url";

import { COMMITTED, ROOT } from "../scripts/build.mjs";

const tmp = mkdtempSync(join(tmpdir(), "sapiens2-bundle-"));
after(() => rmSync(tmp, { recursive: true, force: true }));

/** Run a command in the package folder; its output on failure. */
function run(command, args) {
  const ran = spawnSync(command, args, { cwd: ROOT, encoding: "utf8", timeout: 120_000 });
  assert.equal(ran.status, 0, `${command} ${args.join(" ")}: ${ran.error ?? ""}${ran.stdout}${ran.stderr}`);
  return ran.stdout;
}

test("the committed bundle is a fresh build of src/ (run `npm run build` in clients/js after changing src/)", () => {
  const out = join(tmp, "rebuilt.js");
  run(process.execPath, ["scripts/build.mjs", "--out", out]);
  const rebuilt = readFileSync(out);
  const committed = readFileSync(COMMITTED);
  assert.ok(rebuilt.length > 10_000, `the build wrote ${rebuilt.length} bytes`);
  assert.ok(committed.equals(rebuilt),
    `${COMMITTED} differs from a fresh build of src/: run \`npm run build\` in clients/js and commit it`);
});

test("the browser build imports nothing and uses no Node API", () => {
  const text = readFileSync(COMMITTED, "utf8");
  assert.doesNotMatch(text, /^\s*import\s/m);
  assert.doesNotMatch(text, /\brequire\(/);
  assert.doesNotMatch(text, /\b(?:Buffer|process)\./);
  assert.doesNotMatch(text, /zeromq|node:/);
});

test("the browser build exports the decoder API", async () => {
  const mod = await import(pathToFileURL(COMMITTED).href);
  for (const name of ["decodeMessage", "decode", "toMessage", "WireError", "REASONS", "DEFAULT_LIMITS", "packFrames",
    "unpackFrames", "jpegInfo", "pngInfo", "SCHEMA", "SCHEMA_VERSION", "KINDS"]) {
    assert.ok(name in mod, name);
  }
  assert.ok(!("Subscriber" in mod));
});

test("the packed npm package's `./browser` export is the same bundle (copied by prepare)", async () => {
  const [{ filename }] = JSON.parse(run("npm", ["pack", "--json", "--pack-destination", tmp, "--loglevel=error"]));
  run("tar", ["-xzf", join(tmp, filename), "-C", tmp]);
  const pkg = JSON.parse(readFileSync(join(tmp, "package", "package.json"), "utf8"));
  const exported = join(tmp, "package", pkg.exports["./browser"].default);
  assert.ok(readFileSync(exported).equals(readFileSync(COMMITTED)), `${pkg.exports["./browser"].default} in the `
    + "package differs from the committed bundle");
  const mod = await import(pathToFileURL(exported).href);
  assert.equal(typeof mod.decodeMessage, "function");
});

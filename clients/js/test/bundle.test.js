// The committed browser build is what `npm run build` makes from the sources, byte for byte, and
// it is browser-safe: one self-contained ESM file without Node modules or zeromq.

import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { test } from "node:test";

import { OUTFILE, buildBundle } from "../scripts/build.mjs";

test("dist/sapiens2-client.browser.js is up to date (run `npm run build` after changing src/)", async () => {
  const committed = readFileSync(OUTFILE, "utf8");
  const rebuilt = await buildBundle();
  assert.ok(committed === rebuilt, "the committed browser build differs from a fresh build: run `npm run build`");
});

test("the browser build imports nothing and uses no Node API", () => {
  const text = readFileSync(OUTFILE, "utf8");
  assert.doesNotMatch(text, /^\s*import\s/m);
  assert.doesNotMatch(text, /\brequire\(/);
  assert.doesNotMatch(text, /\b(?:Buffer|process)\./);
  assert.doesNotMatch(text, /zeromq|node:/);
});

test("the browser build exports the decoder API", async () => {
  const mod = await import("../dist/sapiens2-client.browser.js");
  for (const name of ["decodeMessage", "decode", "toMessage", "WireError", "REASONS", "DEFAULT_LIMITS", "packFrames",
    "unpackFrames", "jpegInfo", "pngInfo", "SCHEMA", "SCHEMA_VERSION", "KINDS"]) {
    assert.ok(name in mod, name);
  }
  assert.ok(!("Subscriber" in mod));
});

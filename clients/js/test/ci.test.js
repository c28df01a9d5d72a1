// Under CI (CI=true) no test skips for what it needs: the parity tests without the reference Python,
// and the live tests turned off with SAPIENS2_STREAM_LIVE=0, fail instead, naming what is missing.
// Outside CI the same runs skip. Each case runs one test file in a child `node --test`.

import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { join } from "node:path";
import { test } from "node:test";

import { PACKAGE_DIR } from "./helpers.js";

/** `node --test FILE` with `env` over this process's environment: exit status and output. */
function runFile(file, env) {
  const childEnv = { ...process.env, ...env };
  delete childEnv.NODE_TEST_CONTEXT; // set by the runner of this file: a child with it would not run its tests
  const ran = spawnSync(process.execPath, ["--test", "--test-reporter=tap", join("test", file)], {
    cwd: PACKAGE_DIR, encoding: "utf8", timeout: 120_000, env: childEnv });
  assert.equal(ran.error, undefined, String(ran.error));
  return { status: ran.status, output: `${ran.stdout}${ran.stderr}` };
}

const NO_PYTHON = { SAPIENS2_STREAM_PYTHON: join(PACKAGE_DIR, ".tmp", "no-such-python") };
const LIVE_OFF = { SAPIENS2_STREAM_LIVE: "0" };

for (const [file, env, named] of [
  ["parity.test.js", NO_PYTHON, "the reference Python is not found"],
  ["relative.test.js", NO_PYTHON, "the reference Python is not found"],
  ["live.test.js", LIVE_OFF, "SAPIENS2_STREAM_LIVE=0"],
]) {
  test(`${file}: under CI=true, missing what it needs fails, naming it`, () => {
    const { status, output } = runFile(file, { ...env, CI: "true" });
    assert.notEqual(status, 0, output);
    assert.match(output, /^not ok /m, output);
    assert.ok(output.includes(`CI=true, and this test cannot run: ${named}`), output);
    assert.doesNotMatch(output, /# SKIP/, output);
  });

  test(`${file}: outside CI, missing what it needs skips`, () => {
    const { status, output } = runFile(file, { ...env, CI: "" });
    assert.equal(status, 0, output);
    assert.ok(output.includes(`# SKIP ${named}`), output);
  });
}

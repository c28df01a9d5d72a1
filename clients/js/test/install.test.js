// The READMEs' install line for this package, run as written in a clean folder (a user's project) against a
// copy of the package as a fresh clone has it (git's files: no node_modules, no dist/), then the README's
// example and the `./browser` export there. A bare `npm install ./clients/js` makes a link whose target
// has no node_modules: the example then failed with ERR_MODULE_NOT_FOUND: Cannot find package 'zeromq'.

import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { copyFileSync, existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { after, test } from "node:test";

import { PACKAGE_DIR, REPO_DIR } from "./helpers.js";

const tmp = mkdtempSync(join(tmpdir(), "sapiens2-install-"));
after(() => rmSync(tmp, { recursive: true, force: true }));

/** The `npm install ... clients/js` lines of a README's code blocks, comments cut. */
function installLines(readme) {
  const blocks = [...readFileSync(readme, "utf8").matchAll(/```\w*\n([\s\S]*?)```/g)].map((m) => m[1]);
  return blocks.flatMap((b) => b.split("\n")).map((l) => l.split("#")[0].trim())
    .filter((l) => l.startsWith("npm install") && l.includes("clients/js"));
}

/** The README's first js code block after `## Example`. */
function example() {
  const text = readFileSync(join(PACKAGE_DIR, "README.md"), "utf8");
  return text.slice(text.indexOf("## Example")).match(/```js\n([\s\S]*?)```/)[1];
}

function run(command, args, cwd, timeout = 180_000) {
  const ran = spawnSync(command, args, { cwd, encoding: "utf8", timeout });
  assert.equal(ran.status, 0, `${command} ${args.join(" ")} in ${cwd}: ${ran.error ?? ""}\n${ran.stdout}\n${ran.stderr}`);
  return ran.stdout;
}

/** A loopback port nothing listens on (the example then waits its 5 s out and ends). */
async function closedPort() {
  const server = createServer().listen(0, "127.0.0.1");
  await new Promise((ok) => server.once("listening", ok));
  const { port } = server.address();
  await new Promise((ok) => server.close(ok));
  return port;
}

test("the README's npm install line, run in a clean folder against a fresh clone, gives a working package",
  { timeout: 300_000 }, async () => {
    const lines = [...installLines(join(REPO_DIR, "README.md")), ...installLines(join(PACKAGE_DIR, "README.md"))];
    assert.ok(lines.length >= 2, `no npm install line for clients/js in the READMEs: ${lines}`);
    assert.equal(new Set(lines).size, 1, `the READMEs disagree: ${lines.join(" | ")}`);
    const clone = join(tmp, "sapiens2-stream");
    const files = run("git", ["ls-files", "-z", "clients/js", "pipeline/viewer/static"], REPO_DIR).split("\0");
    for (const file of files.filter(Boolean)) {
      mkdirSync(dirname(join(clone, file)), { recursive: true });
      copyFileSync(join(REPO_DIR, file), join(clone, file));
    }
    assert.ok(!existsSync(join(clone, "clients", "js", "node_modules")));
    const project = join(tmp, "my-project");
    mkdirSync(project);
    // As written, with the clone where it says; the cache `npm ci` filled serves the dependencies first.
    const [npm, ...args] = lines[0].replaceAll("/path/to/sapiens2-stream", clone).split(/\s+/);
    run(npm, [...args, "--prefer-offline", "--no-audit", "--no-fund", "--loglevel=error"], project);

    const port = await closedPort();
    writeFileSync(join(project, "example.mjs"), example().replace("tcp://127.0.0.1:5555", `tcp://127.0.0.1:${port}`));
    const out = run(process.execPath, ["example.mjs"], project, 60_000);
    assert.match(out, /received: 0/, out); // the example's last line: its stats after 5 s of nothing

    const browser = "import('sapiens2-stream-client/browser').then((m) => console.log(typeof m.decodeMessage))";
    assert.equal(run(process.execPath, ["--input-type=module", "-e", browser], project).trim(), "function");
  });

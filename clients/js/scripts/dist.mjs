/**
 * dist/sapiens2-client.browser.js, the npm package's `./browser` export: a copy of the committed
 * bundle (pipeline/viewer/static/sapiens2-client.browser.js, which test/bundle.test.js checks is
 * `npm run build`'s output from src/, byte for byte). A copy needs no esbuild, so `prepare` can run it
 * where the devDependencies are not installed: `npm install --install-links PATH/clients/js` runs it
 * in a fresh clone before it packs the folder (and `npm pack` runs it too).
 */

import { copyFileSync, existsSync, mkdirSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const ROOT = join(dirname(fileURLToPath(import.meta.url)), "..");
const NAME = "sapiens2-client.browser.js";
const COMMITTED = join(ROOT, "..", "..", "pipeline", "viewer", "static", NAME);
const DIST = join(ROOT, "dist", NAME);

if (existsSync(COMMITTED)) {
  mkdirSync(dirname(DIST), { recursive: true });
  copyFileSync(COMMITTED, DIST);
} else { // this folder without the repository around it: the Node part works, `./browser` is missing
  console.error(`note: ${COMMITTED} is not here, so the package has no ./browser export (dist/${NAME})`);
}

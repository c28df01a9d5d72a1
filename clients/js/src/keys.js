/**
 * CURVE keys made by `sapiens2-stream keys DIR` (ZeroMQ `zmq_cert` files, as pyzmq's
 * `zmq.auth.create_certificates` writes them): `public-key = "..."` / `secret-key = "..."`
 * Z85 strings under a `curve` section. Node only.
 * @module
 */

import { existsSync, readFileSync, statSync } from "node:fs";
import { join } from "node:path";

const Z85_KEY = /^[0-9a-zA-Z.\-:+=^!/*?&<>()[\]{}@%$#]{40}$/;

/** A key folder or file that cannot be used; the message says what to do. */
export class KeysError extends Error {
  constructor(message) {
    super(message);
    this.name = "KeysError";
  }
}

/**
 * Read a certificate file like pyzmq's `zmq.auth.load_certificate`.
 * @param {string} path
 * @returns {{publicKey: string, secretKey: string | null}} Z85 keys (40 characters each)
 */
export function loadCertificate(path) {
  let publicKey = null;
  let secretKey = null;
  for (const raw of readFileSync(path, "latin1").split("\n")) {
    const line = raw.trim();
    if (line.startsWith("#")) continue;
    const value = () => line.slice(line.indexOf("=") + 1).replace(/^[ \t'"]+|[ \t'"]+$/g, "");
    if (line.startsWith("public-key") && line.includes("=")) publicKey = value();
    if (line.startsWith("secret-key") && line.includes("=")) secretKey = value();
    if (publicKey && secretKey) break;
  }
  if (!publicKey) throw new KeysError(`no public key found in ${path}`);
  for (const key of [publicKey, secretKey]) {
    if (key !== null && !Z85_KEY.test(key)) throw new KeysError(`${path} holds a key that is not 40 Z85 characters`);
  }
  return { publicKey, secretKey };
}

/**
 * A client's CURVE pair and the server's public key, from `clients/<name>.key_secret` and
 * `server.key` of a folder made by `sapiens2-stream keys DIR --client NAME`.
 * @param {string} keysDir
 * @param {string} [name]
 * @returns {{publicKey: string, secretKey: string, serverKey: string}}
 */
export function loadCurveClientKeys(keysDir, name = "client") {
  const secretFile = join(keysDir, "clients", `${name}.key_secret`);
  const serverFile = join(keysDir, "server.key");
  for (const f of [secretFile, serverFile]) {
    if (!existsSync(f) || !statSync(f).isFile()) {
      throw new KeysError(`${f} not found; create keys with \`sapiens2-stream keys ${keysDir} --client ${name}\``);
    }
  }
  const { publicKey, secretKey } = loadCertificate(secretFile);
  if (!secretKey) throw new KeysError(`${secretFile} holds no secret key`);
  return { publicKey, secretKey, serverKey: loadCertificate(serverFile).publicKey };
}

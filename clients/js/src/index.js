/**
 * sapiens2-stream-client for Node.js: the wire decoder (also in the browser build), the zeromq
 * Subscriber, CURVE key loading and optional pixel decoding of image parts.
 * @module
 */

export * from "./decode.js";
export { decodePixels } from "./pixels.js";
export { KeysError, loadCertificate, loadCurveClientKeys } from "./keys.js";
export { ReceiveTimeout, Subscriber, SubscriberStats } from "./subscriber.js";

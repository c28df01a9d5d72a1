// TypeScript declarations of sapiens2-stream-client (Node entry "." and browser entry "./browser";
// the browser build has everything below except Subscriber, ReceiveTimeout, SubscriberStats,
// decodePixels and the CURVE key loaders). Wire format: docs/WIRE.md. Timestamps are bigint.

/** Why a message was refused (docs/WIRE.md, "Hostile input"). */
export type Reason =
  | "too_large" | "frames" | "topic" | "header" | "schema" | "version" | "field" | "parts" | "shape" | "dtype"
  | "encoding" | "image";

export type Kind = "keypoints" | "frame" | "seg" | "matte" | "status" | "world";
export type Dtype = "|u1" | "|i1" | "<u2" | "<i2" | "<u4" | "<i4" | "<u8" | "<i8" | "<f2" | "<f4" | "<f8";

export const REASONS: readonly Reason[];
export const KINDS: readonly Kind[];
export const IMAGE_KINDS: readonly ("frame" | "seg" | "matte")[];
export const ENCODINGS: readonly ("raw" | "jpeg" | "png")[];
export const RAW_DTYPES: readonly Dtype[];
export const SCHEMA: "sapiens2.stream";
export const SCHEMA_VERSION: 1;
export const DEFAULT_MAX_MESSAGE_BYTES: number;
export const DEFAULT_ENDPOINT: string;
export const BROKER_XSUB: string;
export const BROKER_XPUB: string;
/** name -> [dtype, shape in terms of N persons and K keypoints] */
export const KEYPOINT_PARTS: Readonly<Record<string, readonly [Dtype, readonly (string | number)[]]>>;
/** The optional 3D group of a keypoints message: keypoints3d, keypoints3d_valid, root3d, root3d_valid. */
export const KEYPOINT3D_PARTS: Readonly<Record<string, readonly [Dtype, readonly (string | number)[]]>>;
export const IMAGE_PART: Readonly<{ frame: "image"; seg: "classes"; matte: "alpha" }>;
/** The seven parts of a world message: name -> [dtype, shape in terms of N, K, C cameras, S single-view persons]. */
export const WORLD_PARTS: Readonly<Record<string, readonly [Dtype, readonly (string | number)[]]>>;

/** A message does not follow the wire format; the decoder throws this and nothing else for bad bytes. */
export class WireError extends Error {
  constructor(message: string, reason?: Reason);
  readonly reason: Reason;
}

/** The bytes are not a PNG / JPEG whose header can be read. */
export class ImageHeaderError extends Error {}

/** What a receiver accepts; every check happens before the allocation it guards. */
export interface Limits {
  /** all frames of one message together (default 64 MiB; the Subscriber's ZMQ_MAXMSGSIZE) */
  maxMessageBytes: number;
  /** default 64 KiB */
  maxHeaderBytes: number;
  /** payload parts (default 16) */
  maxParts: number;
  /** sizes per shape (default 4) */
  maxDims: number;
  /** one decoded part (default 256 MiB) */
  maxArrayBytes: number;
  /** one image part: width * height (default 64 Mi) */
  maxPixels: number;
  /** header -> parts -> part -> shape (default 4) */
  maxHeaderDepth: number;
}
export const DEFAULT_LIMITS: Readonly<Limits>;
export function makeLimits(limits?: Partial<Limits>): Readonly<Limits>;

/** Header values: integers are numbers, or bigint beyond 2^53 (exact); floats are numbers. */
export type HeaderValue =
  | null | boolean | number | bigint | string | Uint8Array | HeaderValue[] | { [key: string]: HeaderValue };
export type Header = { [key: string]: HeaderValue };

export type TypedArray =
  | Uint8Array | Int8Array | Uint16Array | Int16Array | Uint32Array | Int32Array | BigUint64Array | BigInt64Array
  | Float32Array | Float64Array;

/** A raw part: little-endian C-order values copied into their typed array (`<f2`: the 16-bit patterns). */
export interface RawArray {
  encoding: "raw";
  dtype: Dtype;
  shape: number[];
  data: TypedArray;
}

/** An image part, still encoded; its size was read from its own header and checked. */
export interface EncodedImage {
  encoding: "jpeg" | "png";
  dtype: "|u1";
  /** [H, W, 3] for JPEG (RGB), [H, W] for PNG (8-bit gray) */
  shape: number[];
  /** the encoded bytes (a view of the received frame) */
  bytes: Uint8Array;
  width: number;
  height: number;
  channels: number;
  bit_depth: number;
  /** JPEG: the channel order of the decoded pixels */
  color?: "rgb";
}

export type Part = RawArray | EncodedImage;

/** A validated message: Python's `wire.Decoded`. */
export interface Decoded {
  topic: string;
  kind: Kind;
  source_id: string;
  header: Header;
  arrays: Record<string, Part>;
}

/** Per-frame fields shared by keypoints, frame, seg, matte and world messages (the exact values stay in `header`). */
export interface FrameMeta {
  source_id: string;
  /** exact below 2^53 */
  frame_index: number;
  /** in units of time_base; null when the source has none */
  pts: bigint | null;
  /** [numerator, denominator]: seconds = pts * num / den */
  time_base: [number, number] | null;
  /** wall clock (Unix epoch, ns) when the frame was captured or decoded */
  capture_ns: bigint;
  session: number;
  latency_ms: Record<string, number>;
  drops: Record<string, number>;
  width: number;
  height: number;
  random_weights: boolean;
}

interface MessageBase {
  topic: string;
  source_id: string;
  header: Header;
  arrays: Record<string, Part>;
  /** wall clock (Unix epoch, ns) when the message was built */
  publish_ns: bigint;
}

/** keypoints (N, K, 2) float32 pixels; keypoint_scores (N, K); boxes (N, 4) xyxy; box_scores (N,); track_ids (N,). */
export interface KeypointsMessage extends MessageBase {
  kind: "keypoints";
  meta: FrameMeta;
  /** N */
  num_persons: number;
  /** K: 308 for Sapiens2 whole-body, 0 when keypoints were not computed */
  num_keypoints: number;
  keypoints: Float32Array;
  keypoint_scores: Float32Array;
  boxes: Float32Array;
  box_scores: Float32Array;
  /** -1 when untracked */
  track_ids: BigInt64Array;
  /** 3D keypoints when the publisher lifts them (--keypoints3d), else null. */
  keypoints3d: Keypoints3D | null;
  shapes: {
    keypoints: [number, number, 2];
    keypoint_scores: [number, number];
    boxes: [number, 4];
    box_scores: [number];
    track_ids: [number];
  };
}

/**
 * The persons' keypoints in the camera's 3D frame (docs/WIRE.md, "3D keypoints"): xyz (N, K, 3)
 * float32, zeros where not valid; valid (N, K) 1/0; root (N, 3), the mean of the valid hips;
 * root_valid (N,) 1/0; metric: metric values (the model's scale branch), else canonical.
 */
export class Keypoints3D {
  constructor(xyz: Float32Array, valid: Uint8Array, root: Float32Array, rootValid: Uint8Array, metric: boolean);
  xyz: Float32Array;
  valid: Uint8Array;
  root: Float32Array;
  root_valid: Uint8Array;
  metric: boolean;
  /**
   * Root-relative coordinates (N, K, 3), `xyz - root`, and their validity (N, K): 1 where the point
   * and its person's root are both valid, else 0 with coordinates 0 (Python's `Keypoints3D.relative()`).
   */
  relative(): { xyz: Float32Array; valid: Uint8Array };
}

/** The annotated picture (a JPEG, RGB). */
export interface FrameMessage extends MessageBase {
  kind: "frame";
  meta: FrameMeta;
  image: EncodedImage | RawArray;
  /** overlays are drawn on the picture */
  annotated: boolean;
}

/** Class map: 8-bit grayscale PNG of class ids 0..28. */
export interface SegMessage extends MessageBase {
  kind: "seg";
  meta: FrameMeta;
  classes: EncodedImage | RawArray;
}

/** Alpha matte: 8-bit grayscale PNG, alpha = value / alpha_scale. */
export interface MatteMessage extends MessageBase {
  kind: "matte";
  meta: FrameMeta;
  alpha: EncodedImage | RawArray;
  alpha_scale: number;
}

/** The health change that made a status message. */
export interface StatusEvent {
  event?: "stalled" | "reconnecting" | "resumed" | string;
  time_ns?: bigint;
  session?: number;
  [key: string]: HeaderValue | undefined;
}

/** Periodic health of one source. */
export interface StatusMessage extends MessageBase {
  kind: "status";
  fps: number;
  /** ok, stalled, reconnecting, closed */
  health: string;
  frames: number;
  /** -1 before the first frame */
  last_frame_index: number;
  drops: Record<string, number>;
  sent: Record<string, number>;
  /** how persons are found: "yolo", or "full-frame" (no detector: the whole frame is one person); null when not said */
  detector: string | null;
  event?: StatusEvent;
}

/**
 * One step of a calibrated rig (docs/WIRE.md, "World keypoints"): N persons triangulated into the
 * calibration's world frame (right-handed, metres), K keypoints each, from C cameras. Row-major arrays.
 */
export interface WorldMessage extends MessageBase {
  kind: "world";
  /** frame_index: the world step of this run, consecutive from 0; capture_ns: the step's reference capture time */
  meta: FrameMeta;
  /** N */
  num_persons: number;
  /** K: 308 for Sapiens2 */
  num_keypoints: number;
  /** S: persons seen by one camera only */
  num_single_view: number;
  /** "m": metres */
  units: string;
  /** C camera names (source ids): the column order of world_members */
  cameras: string[];
  /** camera -> the frame_index of its frame used in this step (absent: no frame in the step's window) */
  camera_frames: Record<string, number>;
  /** (N, K, 3) X, Y, Z; exactly 0 where not valid */
  world_keypoints: Float32Array;
  /** (N, K) 1 where triangulated from at least two good views, else 0 */
  world_valid: Uint8Array;
  /** (N, K) RMS reprojection error in pixels over the views used (0 where not valid) */
  world_error: Float32Array;
  /** (N, K) camera views used (0 where not valid) */
  world_views: Uint8Array;
  /** (N,) world person ids, stable over time */
  world_ids: BigInt64Array;
  /** (N, C) the person's index in the keypoints message of camera c's frame camera_frames[cameras[c]], -1 where unseen */
  world_members: Int32Array;
  /** (S, 2) (camera column, person index) of persons one camera alone sees: not triangulated */
  single_view: Int32Array;
  shapes: {
    world_keypoints: [number, number, 3];
    world_valid: [number, number];
    world_error: [number, number];
    world_views: [number, number];
    world_ids: [number];
    world_members: [number, number];
    single_view: [number, 2];
  };
}

/** Camera -> the index of world person `person` in that camera's keypoints message, for the cameras that see them. */
export function membersOf(world: WorldMessage, person: number): Record<string, number>;

export type Message = KeypointsMessage | FrameMessage | SegMessage | MatteMessage | StatusMessage | WorldMessage;

/** Bytes of one frame: Node Buffers are Uint8Arrays. */
export type Bytes = Uint8Array | ArrayBuffer | ArrayBufferView;

/** Validate and decode one message `[topic, header, part...]`; throws WireError when it is refused. */
export function decodeMessage(frames: ArrayLike<Bytes>, limits?: Partial<Limits>): Message;
/** Validate and decode without building the typed record (Python's `wire.decode`). */
export function decode(frames: ArrayLike<Bytes>, limits?: Partial<Limits>, expectedVersion?: number): Decoded;
/** The typed record of a decoded message; WireError on missing or inconsistent parts. */
export function toMessage(decoded: Decoded): Message;
/** Whether a string can be a source id (1-64 of [A-Za-z0-9_:-]). */
export function isValidSourceId(sourceId: unknown): boolean;
/** Seconds of pts (pts * num / den), or null. */
export function ptsSeconds(meta: FrameMeta): number | null;

export interface ImageInfo {
  width: number;
  height: number;
  channels: number;
  bit_depth: number;
}
/** Size of a PNG from its IHDR chunk; throws ImageHeaderError. */
export function pngInfo(data: Uint8Array): ImageInfo;
/** Size of a JPEG from its start-of-frame segment; throws ImageHeaderError. */
export function jpegInfo(data: Uint8Array): ImageInfo;

/** One WebSocket binary message: uint32 LE frame count, then per frame a uint32 LE length and the bytes. */
export function packFrames(frames: ArrayLike<Bytes | string>): Uint8Array;
/** The frames of a packed buffer (views, no copies); WireError "frames" / "too_large" when malformed. */
export function unpackFrames(data: ArrayBuffer | Uint8Array, options?: { maxFrames?: number; maxBytes?: number }): Uint8Array[];

// -- Node only ---------------------------------------------------------------------------------

export interface Pixels {
  width: number;
  height: number;
  /** 3 (RGB, from JPEG) or 1 (gray, from PNG) */
  channels: number;
  shape: number[];
  data: Uint8Array;
}
/** Decode an image part to pixels with the optional jpeg-js / pngjs; rejects with WireError "image". */
export function decodePixels(image: EncodedImage): Promise<Pixels>;

/** A CURVE key folder or file that cannot be used. */
export class KeysError extends Error {}
/** Z85 keys of a zmq_cert file (pyzmq's load_certificate). */
export function loadCertificate(path: string): { publicKey: string; secretKey: string | null };
/** `clients/<name>.key_secret` and `server.key` of a folder made by `sapiens2-stream keys`. */
export function loadCurveClientKeys(keysDir: string, name?: string): {
  publicKey: string;
  secretKey: string;
  serverKey: string;
};

export type CurveOption =
  | { keysDir: string; name?: string }
  | { publicKey: string; secretKey: string; serverKey: string };

export interface SubscriberOptions {
  /** default tcp://127.0.0.1:5555 */
  endpoint?: string;
  /** prefixes: a kind ("keypoints"), a kind and source ("frame.cam0"), "" for all; default ["keypoints"] */
  topics?: string[] | string;
  /** keep only these exact source ids */
  sources?: string[] | null;
  /** drain on every receive and keep only the newest image message of each topic */
  latestOnly?: boolean;
  /** receive timeout; null (default) waits forever */
  timeoutMs?: number | null;
  limits?: Partial<Limits>;
  /** throw the version WireError instead of skipping such messages */
  strictVersion?: boolean;
  /** ZMQ_RCVHWM, default 100 */
  receiveHighWaterMark?: number;
  curve?: CurveOption | null;
  /** where the once-per-topic version warning goes (default console) */
  logger?: { warn?: (message: string) => void } | null;
}

/** No message arrived within the receive timeout (or the subscriber was closed). */
export class ReceiveTimeout extends Error {}

export class SubscriberStats {
  received: number;
  /** reason -> messages refused */
  skipped: Partial<Record<Reason, number>>;
  /** older image messages discarded by latestOnly */
  superseded: number;
  /** other sources, when `sources` is given */
  filtered: number;
  /** frame_index gaps per topic the source's own skips (drops.source) do not explain: publisher or network drops */
  missed: number;
  /** frame_index went backwards or leapt over 2^20 frames: a new baseline, nothing missed */
  restarts: number;
  /** connections lost (an oversized message, a publisher restart) and made again */
  disconnects: number;
  readonly malformed: number;
  readonly oversized: number;
}

/** A zeromq SUB socket that yields typed messages and survives any message. */
export class Subscriber implements AsyncIterable<Message> {
  constructor(options?: SubscriberOptions);
  readonly endpoint: string;
  readonly limits: Readonly<Limits>;
  stats: SubscriberStats;
  readonly closed: boolean;
  /** The next message; rejects with ReceiveTimeout (timeoutMs null: wait forever). */
  recv(timeoutMs?: number | null): Promise<Message>;
  /** Receive from another publisher (or broker) too. */
  connect(endpoint: string): void;
  /** Messages until a receive timeout passes or close(). */
  [Symbol.asyncIterator](): AsyncIterator<Message>;
  /** Close the socket; an open subscriber keeps Node's event loop alive. */
  close(): void;
}

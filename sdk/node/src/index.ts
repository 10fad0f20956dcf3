/**
 * @fastpoll/client: the Node SDK of fastpoll's private write API (docs/api.md, "Node SDK"), for
 * the site's backend. The same surface and behaviour as the Python SDK (sdk/python):
 *
 *   const fp = new Client({ baseUrl: "http://127.0.0.1:8000", token });
 *   const msg = await fp.publish(42, "hi");   // retried safely: one Idempotency-Key per call
 *   const url = await fp.pollUrl(42);         // the user's signed poll URL, for the browser
 *   await fp.markRead(42, msg.id);
 *
 * Retries: a 503 (the app's Retry-After honoured, bounded, with jitter) and a connection that
 * could not be made are retried on every call; a publish sends an Idempotency-Key (a new
 * crypto.randomUUID() per call unless given), so every failure of one (a timeout, a connection
 * broken after the request was sent) is retried too and still stores the message once. A batch
 * has no key: it is retried only when nothing can have been stored (a 503, or no connection made).
 * No runtime dependencies: Node's global fetch, AbortSignal.timeout and crypto.randomUUID.
 */

/** A longer Retry-After is waited this long at most (ms). */
export const MAX_RETRY_AFTER_MS = 30_000;

/** Any failure of a call; `status` is the HTTP status (null: no answer). */
export class FastpollError extends Error {
  readonly status: number | null;
  /** The app's reason (its `error`), without the status. */
  readonly reason: string;

  constructor(message: string, status: number | null = null, options?: { cause?: unknown }) {
    super(status === null ? message : `${status}: ${message}`, options);
    this.name = new.target.name;
    this.reason = message;
    this.status = status;
  }
}

/** 401: the bearer token is missing or not the app's. */
export class Unauthorized extends FastpollError {}

/** The app refused the request as sent (400, 413, 415); `reason` is its reason. */
export class BadRequest extends FastpollError {}

/** 404: no such route (a channel name holding '/'). */
export class NotFound extends FastpollError {}

/** 409: the Idempotency-Key was used for another message's text or data. */
export class Conflict extends FastpollError {}

/** 503, or no connection, after the retries; `retryAfter` is the app's last hint (s). */
export class Unavailable extends FastpollError {
  readonly retryAfter: number | null;

  constructor(
    message: string,
    status: number | null = null,
    retryAfter: number | null = null,
    options?: { cause?: unknown },
  ) {
    super(message, status, options);
    this.retryAfter = retryAfter;
  }
}

type ErrorClass = new (message: string, status: number | null) => FastpollError;

/** The Python SDK's mapping exactly; 503 is Unavailable, any other status FastpollError. */
const ERRORS: ReadonlyMap<number, ErrorClass> = new Map<number, ErrorClass>([
  [400, BadRequest],
  [401, Unauthorized],
  [404, NotFound],
  [409, Conflict],
  [413, BadRequest],
  [415, BadRequest],
]);

/** Any JSON value: a message's data (at most 8,192 bytes as compact JSON; docs/api.md, "Data"). */
export type JsonValue = null | boolean | number | string | JsonValue[] | { [key: string]: JsonValue };

/** What a publish sends besides its target: its text, its data, or both. */
export interface PublishOptions {
  idempotencyKey?: string;
  /** The message's data (null or absent: none). */
  data?: JsonValue;
}

/**
 * A user's stored message. `cachePublish`: "ok", "pending" (the outbox rewrites the poll key)
 * or null on a replay (`replayed`: an earlier call with this key stored it). `text` is "" for
 * a message of data alone; `data` is there only when the message has data.
 */
export interface Message {
  id: number;
  userId: number;
  text: string;
  data?: JsonValue;
  created: number;
  read: boolean;
  replayed: boolean;
  cachePublish: string | null;
}

export interface ChannelMessage {
  id: number;
  channel: string;
  text: string;
  data?: JsonValue;
  created: number;
  replayed: boolean;
  cachePublish: string | null;
}

/**
 * One message of a batch: to a user (`userId`) or to a channel (`channel`), exactly one; its
 * text, its data or both.
 */
export type BatchItem = ({ userId: number } | { channel: string }) & {
  text?: string;
  data?: JsonValue;
};

export interface MarkRead {
  userId: number;
  markedRead: number;
  cachePublish: string | null;
}

/** A signed poll URL; `expires` is Unix time (null: URLs are not signed). */
export interface PollUrl {
  userId: number;
  url: string;
  expires: number | null;
  channels: string[];
}

export interface ClientOptions {
  /** The app's own listener, e.g. http://app-host:8000 (never the public edge). */
  baseUrl: string;
  /** The API token (run/api.token). */
  token: string;
  /** Per attempt (keep it above 3 s: the app answers 503 after a user's order stayed taken 3 s). */
  timeoutMs?: number;
  /** Attempts after the first. */
  retries?: number;
  /** The public edge's base (https://poll.example.com): pollUrl() then returns absolute URLs. */
  publicUrl?: string;
  /** The full-jitter back-off's base (ms): 0 to backoffMs × 2^attempt, at most 5 s. */
  backoffMs?: number;
}

/** Error codes of a connection never made: nothing can have been stored. */
const NOT_CONNECTED = new Set([
  "ECONNREFUSED",
  "ENOTFOUND",
  "EAI_AGAIN",
  "EHOSTUNREACH",
  "ENETUNREACH",
  "EADDRNOTAVAIL",
  "UND_ERR_CONNECT_TIMEOUT",
]);

export class Client {
  readonly baseUrl: string;
  readonly timeoutMs: number;
  readonly retries: number;
  readonly backoffMs: number;
  readonly publicUrl: string | null;
  readonly #token: string;

  constructor(options: ClientOptions) {
    const { baseUrl, token, timeoutMs = 10_000, retries = 3, publicUrl, backoffMs = 200 } = options;
    if (!Number.isInteger(retries) || retries < 0) throw new RangeError("retries must be >= 0");
    this.baseUrl = baseUrl.replace(/\/+$/, "");
    this.#token = token;
    this.timeoutMs = timeoutMs;
    this.retries = retries;
    this.backoffMs = backoffMs;
    this.publicUrl = publicUrl ? publicUrl.replace(/\/+$/, "") : null;
  }

  // ---- the API ----------------------------------------------------------------------------

  /**
   * Store a message for the user (201: durable): `text`, `options.data` or both (text null:
   * data alone); retried safely with its key.
   */
  async publish(userId: number, text: string | null, options: PublishOptions = {}): Promise<Message> {
    const body = { user_id: userId, ...payloadJson(text, options.data) };
    const [d, headers] = await this.#publish("/api/messages", body, options);
    const { id, user_id, created, read } = d;
    return { id, userId: user_id, ...storedPayload(d), created, read, ...headers };
  }

  /** Store a message in a channel (room), as publish(); retried safely with its key. */
  async publishChannel(
    name: string,
    text: string | null,
    options: PublishOptions = {},
  ): Promise<ChannelMessage> {
    if (name.includes("/")) throw new BadRequest("a channel name is 1-64 bytes of A-Z a-z 0-9 _ . -");
    const body = payloadJson(text, options.data);
    const [d, headers] = await this.#publish(`/api/channels/${name}/messages`, body, options);
    return { id: d.id, channel: d.channel, ...storedPayload(d), created: d.created, ...headers };
  }

  /** One keyed publish: the stored message's JSON and what its headers say. */
  async #publish(
    path: string,
    body: Record<string, unknown>,
    options: PublishOptions,
  ): Promise<[StoredJson, PublishHeaders]> {
    const r = await this.#call(path, body, options.idempotencyKey || crypto.randomUUID());
    const headers = {
      replayed: r.headers.get("idempotent-replayed") === "true",
      cachePublish: r.headers.get("x-cache-publish"),
    };
    return [(await r.json()) as StoredJson, headers];
  }

  /**
   * Store many messages in one transaction; their ids, in the items' order. Retried only when
   * nothing can have been stored (a 503, or no connection).
   */
  async publishBatch(items: Iterable<BatchItem>): Promise<number[]> {
    const body = Array.from(items, batchItemJson);
    const r = await this.#call("/api/messages/batch", { items: body }, null, false);
    const d = (await r.json()) as { ids: unknown[] };
    return d.ids.map(Number);
  }

  /** Mark the user's messages with id <= upToId read (the newest id the user saw). */
  async markRead(userId: number, upToId: number): Promise<MarkRead> {
    const r = await this.#call("/api/messages/read", { user_id: userId, up_to_id: upToId });
    const d = (await r.json()) as Record<string, unknown>;
    return {
      userId: d.user_id as number,
      markedRead: d.marked_read as number,
      cachePublish: r.headers.get("x-cache-publish"),
    };
  }

  /** The user's signed poll URL (with `channels`, one URL for the user and the rooms). */
  async pollUrl(userId: number, options: { channels?: Iterable<string> } = {}): Promise<string> {
    const { url } = await this.pollUrlInfo(userId, options);
    return this.publicUrl ? this.publicUrl + url : url;
  }

  /** pollUrl() with its expiry: ask again before `expires`, or when a poll gets 403. */
  async pollUrlInfo(
    userId: number,
    options: { channels?: Iterable<string> } = {},
  ): Promise<PollUrl> {
    const body: Record<string, unknown> = { user_id: userId };
    if (options.channels !== undefined) body.channels = Array.from(options.channels);
    const d = (await (await this.#call("/api/poll-url", body)).json()) as Record<string, unknown>;
    return {
      userId: d.user_id as number,
      url: d.url as string,
      expires: (d.expires ?? null) as number | null,
      channels: (d.channels ?? []) as string[],
    };
  }

  // ---- one call, with its retries -----------------------------------------------------------

  /**
   * POST the body; `safe`: a repeat cannot store anything twice (idempotent, or keyed), so an
   * attempt that may have reached the app is retried too.
   */
  async #call(
    path: string,
    body: Record<string, unknown>,
    idempotencyKey: string | null = null,
    safe = true,
  ): Promise<Response> {
    const headers: Record<string, string> = {
      Authorization: `Bearer ${this.#token}`,
      "Content-Type": "application/json",
    };
    if (idempotencyKey) headers["Idempotency-Key"] = idempotencyKey;
    const payload = JSON.stringify(body);
    for (let attempt = 0; ; attempt++) {
      let delay: number;
      let r: Response;
      try {
        r = await fetch(this.baseUrl + path, {
          method: "POST",
          headers,
          body: payload,
          signal: AbortSignal.timeout(this.timeoutMs),
        });
      } catch (exc) {
        // A connection never made stored nothing; anything else may have.
        if (attempt >= this.retries || !(safe || notConnected(exc))) {
          throw new Unavailable(`${path}: ${describe(exc)}`, null, null, { cause: exc });
        }
        await sleep(this.#backoff(attempt));
        continue;
      }
      if (r.status < 400) return r;
      const message = await errorMessage(r);
      if (r.status !== 503) throw new (ERRORS.get(r.status) ?? FastpollError)(message, r.status);
      const hint = retryAfter(r);
      if (attempt >= this.retries) throw new Unavailable(message, 503, hint);
      delay = hint === null ? this.#backoff(attempt) : hint * 1000;
      delay = Math.min(delay, MAX_RETRY_AFTER_MS) * (1 + Math.random() * 0.25); // spread retries
      await sleep(delay);
    }
  }

  /** Full jitter: 0 to backoffMs × 2^attempt, at most 5 s. */
  #backoff(attempt: number): number {
    return Math.random() * Math.min(5000, this.backoffMs * 2 ** attempt);
  }
}

function batchItemJson(item: BatchItem): Record<string, unknown> {
  const i = item as { text?: string; data?: JsonValue; userId?: number; channel?: string };
  if ((i.userId === undefined) === (i.channel === undefined)) {
    throw new TypeError("a batch item names exactly one of userId and channel");
  }
  const target = i.channel === undefined ? { user_id: i.userId } : { channel: i.channel };
  return { ...target, ...payloadJson(i.text, i.data) };
}

/** A message's fields in a request: its text, its data (null or absent: none), at least one. */
function payloadJson(text: string | null | undefined, data: JsonValue | undefined) {
  const doc: { text?: string; data?: JsonValue } = {};
  if (text !== null && text !== undefined) doc.text = text;
  if (data !== null && data !== undefined) doc.data = data;
  if (Object.keys(doc).length === 0) throw new TypeError("a message has text, data or both");
  return doc;
}

/** A stored message's text, and its data only when it has data. */
function storedPayload(d: StoredJson): { text: string; data?: JsonValue } {
  return d.data === undefined ? { text: d.text } : { text: d.text, data: d.data };
}

/** A stored message as the app answers it (a channel's has channel, a user's user_id and read). */
interface StoredJson {
  id: number;
  user_id: number;
  channel: string;
  text: string;
  data?: JsonValue;
  created: number;
  read: boolean;
}

interface PublishHeaders {
  replayed: boolean;
  cachePublish: string | null;
}

async function errorMessage(r: Response): Promise<string> {
  const text = await r.text();
  let doc: unknown;
  try {
    doc = JSON.parse(text);
  } catch {
    return text.slice(0, 200) || r.statusText;
  }
  if (doc !== null && typeof doc === "object" && !Array.isArray(doc)) {
    const error = (doc as Record<string, unknown>).error;
    return error === undefined ? JSON.stringify(doc) : String(error);
  }
  return String(doc);
}

function retryAfter(r: Response): number | null {
  const value = r.headers.get("retry-after") ?? "";
  return /^[0-9]+$/.test(value) ? Number(value) : null;
}

function errorCode(exc: unknown): string | undefined {
  for (let e: unknown = exc; e instanceof Error; e = e.cause) {
    const code = (e as { code?: unknown }).code;
    if (typeof code === "string") return code;
  }
  return undefined;
}

function notConnected(exc: unknown): boolean {
  const code = errorCode(exc);
  return code !== undefined && NOT_CONNECTED.has(code);
}

function describe(exc: unknown): string {
  if (!(exc instanceof Error)) return String(exc);
  const code = errorCode(exc);
  const cause = exc.cause instanceof Error ? `: ${exc.cause.message}` : "";
  return `${exc.name}: ${exc.message}${cause}${code && !cause.includes(code) ? ` (${code})` : ""}`;
}

function sleep(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms));
}

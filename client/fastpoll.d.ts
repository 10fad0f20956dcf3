// Types of @fastpoll/browser (fastpoll.js): the browser client of fastpoll's poll URLs.

/** Any JSON value. */
export type JsonValue = null | boolean | number | string | JsonValue[] | { [key: string]: JsonValue };

/** A message as an answer lists it (and the history read returns it). */
export interface Message {
  id: number;
  /** "" for a message published with data alone. */
  text: string;
  /** The message's data as published (any JSON value); absent when it has none. */
  data?: JsonValue;
  [field: string]: unknown;
}

/** A user's poll answer (a plain poll URL's whole answer; a composed answer's `user`). */
export interface UserAnswer {
  /** How many messages are unread. */
  unread: number;
  /** The newest unread message. */
  newest: Message;
  /** The newest unread messages, ascending by id (at most the app's answer_messages). */
  messages: Message[];
  /** Present when unread messages were left out: the id of the newest of those. */
  before?: number;
}

/** A room's part of a composed answer. */
export interface RoomAnswer {
  /** The room's newest messages, ascending by id. */
  messages: Message[];
  /** Present when older messages were left out: the id of the newest of those. */
  before?: number;
}

/** The answer of a URL with channels (ch=...): the user's part and each room's. */
export interface ComposedAnswer {
  user: UserAnswer | null;
  channels: Record<string, RoomAnswer | null>;
}

/** Any answer: null when there is nothing (an empty body). */
export type Answer = UserAnswer | ComposedAnswer | null;

/** What parts() returns for either kind of answer. */
export interface Parts {
  user: UserAnswer | null;
  channels: Record<string, RoomAnswer | null>;
}

export interface AnswerInfo {
  status: 200;
  /** X-Poll-Source: "cache", "app", ... (null without the header); "tab": the leading tab's last answer, handed to a tab that opened; "stream": an event of the stream. */
  source: string | null;
}

export interface StatusInfo {
  /** The HTTP status of an answer that was not a 200; 0 while the browser is offline. */
  status: number;
  /** X-Poll-Source, "history" for a failed history read, "offline" while offline. */
  source: string | null;
}

/** The part of sessionStorage the client uses. */
export interface IdStorage {
  getItem(key: string): string | null;
  setItem(key: string, value: string): void;
}

/** How a poller asks: an event stream (EventSource) or long polls. */
export type Transport = "auto" | "stream" | "poll";

export interface PollOptions {
  /** The user's signed poll URL (POST /api/poll-url on the app), same origin as the page. */
  url: string;
  /** Seconds a poll may be held (wait=); default 25. */
  wait?: number;
  /** ms between polls when an answer names no Poll-Interval-Ms; default 1000. */
  interval?: number;
  /** Extra 0..jitter of the own interval; default 0.2. */
  jitter?: number;
  /** ms, the first retry after an error (full jitter, doubling); default 500. */
  backoffBase?: number;
  /** ms, the longest back-off; default 30000. */
  backoffMax?: number;
  /** History reads (100 messages each) at most per gap; default 20. */
  gapPages?: number;
  /** Where the last handed-over ids live; default sessionStorage, null for memory only. */
  storage?: IdStorage | null;
  /** The key of those ids; default the URL without exp=, sig= and wait=. */
  storageKey?: string;
  /** Whose onLine is read; default globalThis.navigator, null to ignore it. */
  navigator?: { readonly onLine: boolean } | null;
  /** Where "online"/"offline" are listened to; default globalThis (the window). */
  events?: EventTarget | null;
  /**
   * One poll for all this origin's tabs of the same URL (true: the URL without exp=, sig= and
   * wait= names it; a string: that name): a leader elected with navigator.locks polls and
   * shares each answer on a BroadcastChannel. Each tab polls on its own where either is missing.
   * Default false.
   */
  shared?: boolean | string;
  /**
   * How the tab (with shared, the leader) polls: "stream", an EventSource on the same URL (each
   * event an answer, its id the tag); "poll", long polls; "auto" (the default), a stream where
   * EventSource exists. A stream that fails (a non-200, not an event stream) is followed by one
   * long poll (a 403 asks refreshUrl, a 503 waits its Retry-After), then a stream again; after
   * streamFailures failed streams in a row, long polls for a jittered while.
   */
  transport?: Transport;
  /** Failed streams in a row before long polls for a while; default 3. */
  streamFailures?: number;
  /** Every 200 answer, as it came (before onMessages); with shared, the leader's too. */
  onAnswer?: (answer: Answer, info: AnswerInfo) => void;
  /** The user's new messages, ascending by id, each exactly once. */
  onMessages?: (messages: Message[]) => void;
  /** A room's new messages, ascending by id, each exactly once. */
  onChannelMessages?: (name: string, messages: Message[]) => void;
  /** Every answer that was not a 200 (304, 429, 503, ...) and each offline wait. */
  onStatus?: (info: StatusInfo) => void;
  /** A network error, a bad body, or the reason the loop ended (400, 403, 404). */
  onError?: (error: unknown) => void;
  /** Called on 403 (the signed URL expired): a new signed URL. Without it, 403 stops. */
  refreshUrl?: () => Promise<string>;
}

export interface Poller {
  /** Cancels the request in flight and the pause; resolves when the loop has ended. */
  stop(): Promise<void>;
  /** Resolves when the loop has ended (stop(), or a 400/403/404). */
  readonly done: Promise<void>;
  /** Answers this tab's own requests received (any status); 0 for a tab that follows. */
  readonly polls: number;
  /** True while this tab polls (always without shared; with it, while it holds the lead). */
  readonly leader: boolean;
  /** The ETag sent as If-None-Match on the next poll. */
  readonly etag: string | null;
  /** True while the browser is offline and the poller waits for "online". */
  readonly offline: boolean;
  /** The transport in use now: "stream" (an EventSource) or "poll" (long polls). */
  readonly transport: "stream" | "poll";
}

/** Starts polling `options.url`; throws TypeError without a url. */
export function startPolling(options: PollOptions): Poller;

/** {user, channels} of any answer: a plain poll's answer is its user part, with no channels. */
export function parts(answer: Answer): Parts;

/** The messages of room `name` in an answer, ascending by id; [] if it has none. */
export function channelMessages(answer: Answer, name: string): Message[];

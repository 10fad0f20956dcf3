// fastpoll's browser client: an ES module, no framework (docs/api.md, "Conditional and long
// polls"). It polls one poll URL with If-None-Match and wait=, waits what each answer asks
// (Poll-Interval-Ms, or Retry-After on a 429/503), backs off with full jitter on errors, and
// stops at once on stop() (an AbortController cancels the request in flight and the pause).
//
//   import { startPolling } from "/fastpoll-client/fastpoll.js";
//   const poller = startPolling({
//     url: signedPollUrl,                      // from the site's backend (POST /api/poll-url)
//     onAnswer: (answer, info) => { ... },     // answer: {unread, newest} or null (nothing unread)
//     refreshUrl: async () => newSignedUrl,    // called on 403 (the signed URL expired)
//   });
//   ...
//   await poller.stop();
//
// Channels (docs/channels.md): a URL the backend issued with channels (POST /api/poll-url
// {"user_id": N, "channels": ["room.a"]}) carries ch=room.a and is polled the same way; its answer
// is {"user": U, "channels": {"room.a": A}}, U as a plain poll's answer, each A
// {"messages": [{id, text}, ...]} (the room's newest, ascending) or null. parts(answer) gives
// {user, channels} for either kind of URL; channelMessages(answer, name) a room's messages.

const DEFAULTS = {
  wait: 25, // seconds a poll may be held (the server clamps it to its [poll] max_wait)
  interval: 1000, // ms between polls when an answer names no pace (a poll server without it)
  jitter: 0.2, // our own interval gets 0..20% more, so tabs opened together drift apart
  backoffBase: 500, // ms, the first retry after an error; doubles up to backoffMax
  backoffMax: 30000,
};

// What to wait after an answer, from its headers; null if it names nothing usable.
function pacedMs(res) {
  const pace = res.headers.get("Poll-Interval-Ms");
  if (pace !== null && /^[0-9]{1,9}$/.test(pace.trim())) return Number(pace.trim());
  return null;
}

// Retry-After: delay-seconds or an HTTP-date (RFC 9110 10.2.3); null if absent or bad.
function retryAfterMs(res) {
  const value = res.headers.get("Retry-After");
  if (value === null) return null;
  if (/^[0-9]{1,9}$/.test(value.trim())) return Number(value.trim()) * 1000;
  const when = Date.parse(value);
  return Number.isNaN(when) ? null : Math.max(0, when - Date.now());
}

// Sleeps ms, or less if signal aborts (then it resolves false).
function pause(ms, signal) {
  return new Promise((resolve) => {
    if (signal.aborted) return resolve(false);
    const done = () => {
      clearTimeout(timer);
      signal.removeEventListener("abort", done);
      resolve(!signal.aborted);
    };
    const timer = setTimeout(done, ms);
    signal.addEventListener("abort", done, { once: true });
  });
}

// The URL with wait= appended as text: re-serialising the query (URLSearchParams) could
// re-encode other parameters and change the cache key or break the signature.
function withWait(url, wait) {
  if (!(wait > 0)) return url;
  return url + (url.includes("?") ? "&" : "?") + "wait=" + Math.floor(wait);
}

function parseAnswer(text) {
  return text === "" ? null : JSON.parse(text);
}

// {user, channels} of any answer: a plain poll's answer is its user part, with no channels.
export function parts(answer) {
  if (answer !== null && typeof answer === "object" && "channels" in answer && "user" in answer) {
    return { user: answer.user, channels: answer.channels ?? {} };
  }
  return { user: answer, channels: {} };
}

// The messages of channel `name` in an answer, ascending by id; [] if it has none.
export function channelMessages(answer, name) {
  return parts(answer).channels[name]?.messages ?? [];
}

export function startPolling(options) {
  const opt = { ...DEFAULTS, ...options };
  if (typeof opt.url !== "string" || opt.url === "") throw new TypeError("url is required");
  const controller = new AbortController();
  const { signal } = controller;
  const state = { url: opt.url, etag: null, failures: 0, polls: 0, lastAnswer: undefined };

  const backoff = () => {
    const cap = Math.min(opt.backoffMax, opt.backoffBase * 2 ** Math.min(state.failures, 16));
    return Math.random() * cap; // full jitter: failed clients do not come back in step
  };
  const ownInterval = () => opt.interval * (1 + Math.random() * opt.jitter);

  async function once() {
    const headers = state.etag ? { "If-None-Match": state.etag } : {};
    let res;
    try {
      res = await fetch(withWait(state.url, opt.wait), {
        headers,
        signal,
        cache: "no-store", // our own If-None-Match; the browser's cache stays out of it
        credentials: "same-origin",
      });
      state.polls += 1;
      if (res.status === 200) {
        const text = await res.text();
        state.etag = res.headers.get("ETag"); // null from a server without ETags: no condition
        state.failures = 0;
        const answer = parseAnswer(text);
        state.lastAnswer = answer;
        opt.onAnswer?.(answer, { status: 200, source: res.headers.get("X-Poll-Source") });
        return pacedMs(res) ?? ownInterval();
      }
      if (res.status === 304) {
        state.failures = 0;
        opt.onStatus?.({ status: 304, source: res.headers.get("X-Poll-Source") });
        return pacedMs(res) ?? ownInterval();
      }
      await res.body?.cancel();
      opt.onStatus?.({ status: res.status, source: res.headers.get("X-Poll-Source") });
      if (res.status === 403 && opt.refreshUrl) {
        // The signed URL expired (or was rotated): ask the site for a new one.
        state.failures += 1;
        state.url = await opt.refreshUrl();
        state.etag = null;
        return state.failures > 1 ? backoff() : 0;
      }
      if (res.status === 403 || res.status === 400 || res.status === 404) {
        throw new Error(`poll refused with ${res.status}: not retried`);
      }
      state.failures += 1;
      return retryAfterMs(res) ?? backoff(); // 429/503 shed by nginx carry Retry-After
    } catch (err) {
      if (signal.aborted) return 0;
      if (err instanceof Error && err.message.startsWith("poll refused")) throw err;
      state.failures += 1; // the network, a reset, a bad body
      opt.onError?.(err);
      return backoff();
    }
  }

  const done = (async () => {
    while (!signal.aborted) {
      let delay;
      try {
        delay = await once();
      } catch (err) {
        opt.onError?.(err);
        break;
      }
      if (!(await pause(delay, signal))) break;
    }
  })();

  return {
    // Resolves when the loop has ended (no request in flight, no timer left).
    stop() {
      controller.abort();
      return done;
    },
    done,
    get polls() {
      return state.polls;
    },
    get etag() {
      return state.etag;
    },
  };
}

// fastpoll's browser client: an ES module, no framework (docs/api.md, "Conditional and long
// polls"). It polls one poll URL with If-None-Match and wait=, waits what each answer asks
// (Poll-Interval-Ms, or Retry-After on a 429/503), backs off with full jitter on errors, and
// stops at once on stop() (an AbortController cancels the request in flight and the pause).
// Offline (navigator.onLine false, the window's "offline" event) it sends nothing: the request
// in flight is cancelled and the loop waits; on "online" it polls at once, with no back-off
// left over, and continues from the last id it handed over (a gap is read as after a reload).
//
//   import { startPolling } from "/fastpoll-client/fastpoll.js";
//   const poller = startPolling({
//     url: signedPollUrl,                      // from the site's backend (POST /api/poll-url)
//     onAnswer: (answer, info) => { ... },     // answer: {unread, newest, messages} or null
//     onMessages: (list) => { ... },           // the user's new messages, ascending, each once
//     onChannelMessages: (name, list) => { ... }, // a room's new messages, ascending, each once
//     refreshUrl: async () => newSignedUrl,    // called on 403 (the signed URL expired)
//     shared: true,                            // one poll for all tabs of this URL
//     transport: "auto",                       // "stream" | "poll"; auto: EventSource if any
//   });
//   ...
//   await poller.stop();
//
// Messages by id (docs/api.md, "The poll answer" and "The history read"): the client keeps the
// last id it handed over per URL and part (the user, each room) in sessionStorage, under the
// URL without exp= and sig= (a re-signed URL keeps it). Each answer's messages newer than that
// id go to onMessages/onChannelMessages in ascending order, exactly once, across page reloads
// too. When an answer's "before" is newer than that id, messages were left out of it: the
// client reads them first (the same URL plus &after=ID, and &of=NAME for a room), so nothing is
// skipped. A history read that fails hands nothing over: the next poll asks again (no tag).
// The first answer of a URL never seen in this tab hands over what it lists (older messages
// are not fetched).
//
// Channels (docs/channels.md): a URL the backend issued with channels (POST /api/poll-url
// {"user_id": N, "channels": ["room.a"]}) carries ch=room.a and is polled the same way; its answer
// is {"user": U, "channels": {"room.a": A}}, U as a plain poll's answer, each A
// {"messages": [{id, text}, ...]} (the room's newest, ascending) or null. parts(answer) gives
// {user, channels} for either kind of URL; channelMessages(answer, name) a room's messages. A
// message published with data has it too, {id, text, data}, in every answer and history read:
// handed over as it came.
//
// Streams (transport, below streamOnce): an EventSource on the same URL, each event an answer
// (its id the tag), handed over by message id like a poll's; a failed stream gives way to a
// long poll from the last tag, and to long polls for a while after repeated failures.

const DEFAULTS = {
  wait: 25, // seconds a poll may be held (the server clamps it to its [poll] max_wait)
  interval: 1000, // ms between polls when an answer names no pace (a poll server without it)
  jitter: 0.2, // our own interval gets 0..20% more, so tabs opened together drift apart
  backoffBase: 500, // ms, the first retry after an error; doubles up to backoffMax
  backoffMax: 30000,
  gapPages: 20, // history reads (100 messages each) at most per gap
  transport: "auto", // "stream" (EventSource), "poll" (long polls), "auto": stream if it can
  streamFailures: 3, // streams failed in a row before long polls for a while
};

// Where the last handed-over ids of a URL are kept: the URL without its signature (exp=,
// sig=) and wait=, so a refreshed URL continues from the same ids.
function stableUrl(url) {
  const at = url.indexOf("?");
  if (at < 0) return url;
  const keep = url
    .slice(at + 1)
    .split("&")
    .filter((p) => !/^(exp|sig|wait)(=|$)/i.test(p));
  return url.slice(0, at) + "?" + keep.join("&");
}

function loadIds(storage, key) {
  try {
    const doc = JSON.parse(storage?.getItem(key) ?? "{}");
    return doc !== null && typeof doc === "object" ? doc : {};
  } catch {
    return {}; // no storage (a sandboxed frame) or a bad value: start afresh
  }
}

function saveIds(storage, key, ids) {
  try {
    storage?.setItem(key, JSON.stringify(ids));
  } catch {
    // quota or no storage: the ids live in memory for this page
  }
}

// A part's listed messages: its "messages", or (an answer from before they were listed) its
// newest alone.
function listedOf(part) {
  if (part === null || typeof part !== "object") return [];
  if (Array.isArray(part.messages)) return part.messages;
  return part.newest ? [part.newest] : [];
}

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

// Sleeps ms, or less if signal aborts (then it resolves false) or wake() is called (then it
// resolves true at once): hooks.wake is set for the length of the sleep.
function pause(ms, signal, hooks) {
  return new Promise((resolve) => {
    if (signal.aborted) return resolve(false);
    const done = () => {
      clearTimeout(timer);
      signal.removeEventListener("abort", done);
      if (hooks.wake === done) hooks.wake = null;
      resolve(!signal.aborted);
    };
    const timer = Number.isFinite(ms) ? setTimeout(done, ms) : undefined;
    signal.addEventListener("abort", done, { once: true });
    hooks.wake = done;
  });
}

// The URL with wait= appended as text: re-serialising the query (URLSearchParams) could
// re-encode other parameters and change the cache key or break the signature.
function withWait(url, wait) {
  if (!(wait > 0)) return url;
  return url + (url.includes("?") ? "&" : "?") + "wait=" + Math.floor(wait);
}

// The empty answer (nothing unread) is "" in a poll and "\n" in a stream's event.
function parseAnswer(text) {
  return text.trim() === "" ? null : JSON.parse(text);
}

// The long-poll transport: one conditional poll (If-None-Match, wait=) and its answer as
// {status, answer (a 200's), etag, source, pace (ms or null), retry (ms or null)}. The poll
// loop and the sharing across tabs see only this shape, whatever made the request.
async function longPoll(url, etag, wait, signal) {
  const res = await fetch(withWait(url, wait), {
    headers: etag ? { "If-None-Match": etag } : {},
    signal,
    cache: "no-store", // our own If-None-Match; the browser's cache stays out of it
    credentials: "same-origin",
  });
  const h = (name) => res.headers.get(name);
  const out = { status: res.status, etag: h("ETag"), source: h("X-Poll-Source") };
  out.pace = pacedMs(res);
  out.retry = retryAfterMs(res);
  if (res.status === 200) out.answer = parseAnswer(await res.text());
  else await res.body?.cancel();
  return out;
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
  const transport = longPoll;
  const ES = globalThis.EventSource;
  const canStream = opt.transport !== "poll" && typeof ES === "function";
  if (typeof opt.url !== "string" || opt.url === "") throw new TypeError("url is required");
  const controller = new AbortController();
  const mainSignal = controller.signal;
  const state = {
    url: opt.url,
    etag: null,
    failures: 0,
    polls: 0,
    lastAnswer: undefined,
    offline: false,
    using: canStream ? "stream" : "poll",
    streamFails: 0,
    pollUntil: 0, // ms (Date.now()): long polls until then after repeated stream failures
  };
  const storage = "storage" in opt ? opt.storage : globalThis.sessionStorage;
  const idsKey = "fastpoll:" + (opt.storageKey ?? stableUrl(opt.url));
  const lastIds = loadIds(storage, idsKey); // {"user": id, "ch:room.a": id}

  // Online/offline: the browser's own view (navigator.onLine, its "online"/"offline" events on
  // the window). hooks.wake ends the pause in progress; hooks.request cancels the request in
  // flight (its own AbortController, also aborted by stop()).
  const nav = "navigator" in opt ? opt.navigator : globalThis.navigator;
  const events = "events" in opt ? opt.events : globalThis;
  const isOffline = () => nav?.onLine === false || state.offline;
  const hooks = { wake: null, request: null };
  const onOffline = () => {
    state.offline = true;
    hooks.request?.abort(); // a held poll would hang on a dead network: send nothing now
    hooks.wake?.();
  };
  const onOnline = () => {
    state.offline = false;
    state.failures = 0; // the errors were the network's: no back-off carried over
    hooks.wake?.();
  };
  const listen = typeof events?.addEventListener === "function";
  if (listen) {
    events.addEventListener("offline", onOffline);
    events.addEventListener("online", onOnline);
  }

  // The messages of a part (the user: name null; or room `name`) after id `after` and before
  // id `until`, through the history read; null if a read failed.
  async function readGap(name, after, until, signal) {
    const out = [];
    let from = after;
    for (let page = 0; page < opt.gapPages; page += 1) {
      const url = state.url + "&after=" + from + (name === null ? "" : "&of=" + name);
      const res = await fetch(url, { signal, cache: "no-store", credentials: "same-origin" });
      if (res.status !== 200) {
        await res.body?.cancel();
        opt.onStatus?.({ status: res.status, source: "history" });
        return null;
      }
      const doc = await res.json();
      const got = Array.isArray(doc.messages) ? doc.messages : [];
      for (const m of got) if (m.id < until) out.push(m);
      if (!doc.more || got.length === 0 || got[got.length - 1].id >= until) return out;
      from = got[got.length - 1].id;
    }
    return out;
  }

  // Hands over a part's messages newer than its last id, the gap read first; false if the
  // gap could not be read (nothing handed over, the id unchanged).
  async function deliverPart(slot, name, part, signal) {
    const listed = listedOf(part);
    const last = lastIds[slot];
    let fresh;
    if (typeof last !== "number") {
      fresh = listed; // a URL this tab never polled: what the answer lists
    } else {
      fresh = listed.filter((m) => m.id > last);
      if (typeof part?.before === "number" && part.before > last) {
        const until = listed.length ? listed[0].id : Number.MAX_SAFE_INTEGER;
        const gap = await readGap(name, last, until, signal);
        if (gap === null) return false;
        fresh = gap.filter((m) => m.id > last).concat(fresh);
      }
    }
    if (fresh.length) {
      if (name === null) opt.onMessages?.(fresh);
      else opt.onChannelMessages?.(name, fresh);
      lastIds[slot] = fresh[fresh.length - 1].id;
    } else if (typeof last !== "number") {
      lastIds[slot] = 0; // nothing yet: every message from now on is new
    }
    saveIds(storage, idsKey, lastIds);
    return true;
  }

  async function deliver(answer, signal) {
    const { user, channels } = parts(answer);
    if (!(await deliverPart("user", null, user, signal))) return false;
    for (const [name, part] of Object.entries(channels)) {
      if (!(await deliverPart("ch:" + name, name, part, signal))) return false;
    }
    return true;
  }

  const backoff = (n = state.failures) => {
    const cap = Math.min(opt.backoffMax, opt.backoffBase * 2 ** Math.min(n, 16));
    return Math.random() * cap; // full jitter: failed clients do not come back in step
  };
  const ownInterval = () => opt.interval * (1 + Math.random() * opt.jitter);

  async function once(signal0) {
    // This request's own controller: stop(), going offline and losing the lead cancel it.
    const request = new AbortController();
    const signal = request.signal;
    const cancel = () => request.abort();
    signal0.addEventListener("abort", cancel, { once: true });
    hooks.request = request;
    try {
      const r = await transport(state.url, state.etag, opt.wait, signal);
      state.polls += 1;
      if (r.status === 200) {
        state.failures = 0;
        share({ t: "a", answer: r.answer, etag: r.etag, source: r.source });
        if (!(await take(r.answer, r.etag, r.source, signal))) {
          if (signal.aborted) return 0; // stopped or offline during the gap's read
          // The gap could not be read: poll again without the tag (the answer at once), later.
          state.etag = null;
          state.failures += 1;
          return backoff();
        }
        return r.pace ?? ownInterval();
      }
      share({ t: "s", status: r.status, source: r.source });
      opt.onStatus?.({ status: r.status, source: r.source });
      if (r.status === 304) {
        state.failures = 0;
        return r.pace ?? ownInterval();
      }
      if (r.status === 403 && opt.refreshUrl) {
        // The signed URL expired (or was rotated): ask the site for a new one.
        state.failures += 1;
        state.url = await opt.refreshUrl();
        state.etag = null;
        return state.failures > 1 ? backoff() : 0;
      }
      if (r.status === 403 || r.status === 400 || r.status === 404) {
        throw new Error(`poll refused with ${r.status}: not retried`);
      }
      state.failures += 1;
      return r.retry ?? backoff(); // 429/503 shed by nginx carry Retry-After
    } catch (err) {
      if (signal.aborted) return 0; // stop(), offline, the lead lost: no error, no back-off
      if (err instanceof Error && err.message.startsWith("poll refused")) throw err;
      state.failures += 1; // the network, a reset, a bad body
      opt.onError?.(err);
      return isOffline() ? 0 : backoff(); // offline: the loop waits for "online" instead
    } finally {
      signal0.removeEventListener("abort", cancel);
      if (hooks.request === request) hooks.request = null;
    }
  }

  // The stream transport: an EventSource on the poll URL, held until it fails for good (an
  // error with readyState CLOSED: a non-200 or not an event stream), `signal` aborts, or an
  // answer's gap could not be read. An event is a poll's 200 (its id the tag); a stream the
  // server ends is reopened by the EventSource itself with Last-Event-ID. Resolves what to
  // wait before the next round, and whether the stream failed.
  function streamOnce(signal0) {
    return new Promise((resolve) => {
      const request = new AbortController();
      hooks.request = request;
      const es = new ES(state.url);
      let got = false;
      const end = (delay, failed) => {
        es.close();
        signal0.removeEventListener("abort", abort);
        request.signal.removeEventListener("abort", abort);
        if (hooks.request === request) hooks.request = null;
        resolve({ delay, failed, got });
      };
      const abort = () => end(0, false);
      signal0.addEventListener("abort", abort, { once: true });
      request.signal.addEventListener("abort", abort, { once: true });
      es.onmessage = (ev) => {
        let answer;
        try {
          answer = parseAnswer(ev.data);
        } catch (err) {
          opt.onError?.(err);
          return end(backoff(), true);
        }
        got = true;
        state.polls += 1;
        state.failures = 0;
        const etag = ev.lastEventId || null;
        share({ t: "a", answer, etag, source: "stream" });
        take(answer, etag, "stream", request.signal).then((ok) => {
          if (ok || request.signal.aborted) return;
          state.etag = null; // the gap could not be read: the answer at once, later
          state.failures += 1;
          end(backoff(), false);
        });
      };
      es.onerror = () => {
        if (es.readyState === ES.CLOSED) end(0, true); // refused: a long poll tells why
      };
    });
  }

  // One round of the loop by the transport in use: a stream (while streams work; a failed one
  // is followed by one long poll, which refreshes a 403's URL or waits out a 503's
  // Retry-After, then the stream again; after opt.streamFailures in a row, long polls for a
  // while) or a long poll.
  async function round(signal) {
    if (state.using !== "stream") {
      const delay = await once(signal);
      if (canStream && Date.now() >= state.pollUntil) state.using = "stream";
      return delay;
    }
    const r = await streamOnce(signal);
    if (!r.failed) {
      if (r.got) state.streamFails = 0;
      return r.delay;
    }
    state.streamFails = r.got ? 1 : state.streamFails + 1;
    state.using = "poll"; // the next round is a long poll (from the last tag)
    state.pollUntil =
      state.streamFails >= opt.streamFailures
        ? Date.now() + backoff(state.streamFails + 4)
        : 0; // one long poll
    return r.delay;
  }

  // A 200 answer, this tab's own or the leading tab's: onAnswer, then the messages newer than
  // this tab's last ids (a gap read first); the tag is kept once they are handed over.
  // Answers are taken one after the other, in the order they came.
  let taking = Promise.resolve(true);
  function take(answer, etag, source, signal) {
    taking = taking.then(async () => {
      state.lastAnswer = answer;
      opt.onAnswer?.(answer, { status: 200, source });
      const ok = await deliver(answer, signal);
      if (ok) state.etag = etag;
      return ok;
    });
    return taking;
  }

  // The poll loop, while `signal` is not aborted (stop(), or this tab's lead ended).
  const loop = async (signal) => {
    while (!signal.aborted) {
      if (isOffline()) {
        // Offline: nothing is sent until the browser is back online ("online" wakes this; with
        // no events to listen to, navigator.onLine is looked at every interval).
        opt.onStatus?.({ status: 0, source: "offline" });
        if (!(await pause(listen ? Infinity : opt.interval, signal, hooks))) break;
        continue;
      }
      let delay;
      try {
        delay = await round(signal);
      } catch (err) {
        opt.onError?.(err);
        refused = true;
        share({ t: "x" });
        break;
      }
      if (isOffline()) continue; // gone offline meanwhile: wait above, then poll at once
      if (!(await pause(delay, signal, hooks))) break;
    }
  };

  // Shared across tabs (options.shared): the tabs of one origin polling the same URL (its
  // identity: without exp=, sig= and wait=) elect one leader with a Web Lock; only it polls,
  // and it posts each answer (with its tag) and status on a BroadcastChannel. Every tab hands
  // the answer's messages over by its own last ids, so a tab that takes the lead over (the
  // leader closed, or frozen: it lets the lock go) polls on from the last tag it got, and no
  // message is lost or handed over twice. A tab that opens asks the leader for its last answer.
  // Without navigator.locks or BroadcastChannel each tab polls on its own.
  const locks = nav?.locks;
  const shared = opt.shared && locks && typeof BroadcastChannel === "function";
  const channel = shared
    ? new BroadcastChannel("fastpoll:" + (typeof opt.shared === "string" ? opt.shared : idsKey))
    : null;
  const me = Math.random().toString(36).slice(2);
  let refused = false;
  let term = null; // the lead's AbortController while this tab leads
  function share(msg) {
    if (term) channel?.postMessage(msg);
  }
  let done;
  if (!channel) {
    done = loop(mainSignal);
  } else {
    channel.onmessage = ({ data: m }) => {
      if (m.t === "q" && term && state.lastAnswer !== undefined) {
        const a = state.lastAnswer;
        channel.postMessage({ t: "a", to: m.from, answer: a, etag: state.etag, source: "tab" });
      } else if (term || (m.to && m.to !== me)) {
        // the leader's own answers only reach the others
      } else if (m.t === "a") take(m.answer, m.etag, m.source, mainSignal);
      else if (m.t === "s") opt.onStatus?.({ status: m.status, source: m.source });
      else if (m.t === "x") {
        refused = true;
        controller.abort();
      }
    };
    // Leads while it holds the lock: until stop(), or the page is frozen (then it lets go,
    // and asks again when it resumes).
    const lead = () =>
      locks
        .request(channel.name, { signal: mainSignal }, async () => {
          if (mainSignal.aborted || refused) return;
          term = new AbortController();
          const end = () => term.abort();
          mainSignal.addEventListener("abort", end, { once: true });
          hooks.end = end;
          try {
            await loop(term.signal);
          } finally {
            mainSignal.removeEventListener("abort", end);
            term = hooks.end = null;
          }
        })
        .catch(() => {}); // stop() before the lock came: AbortError
    let leading = lead();
    const onFreeze = () => hooks.end?.();
    const ask = () => channel.postMessage({ t: "q", from: me });
    const onResume = () => {
      if (mainSignal.aborted) return;
      leading = leading.then(lead);
      ask(); // what the leader answered meanwhile
    };
    const doc = globalThis.document;
    doc?.addEventListener("freeze", onFreeze);
    doc?.addEventListener("resume", onResume);
    ask();
    done = new Promise((resolve) => {
      if (mainSignal.aborted) resolve();
      mainSignal.addEventListener("abort", resolve, { once: true });
    })
      .then(() => leading)
      .then(() => taking)
      .finally(() => {
        doc?.removeEventListener("freeze", onFreeze);
        doc?.removeEventListener("resume", onResume);
        channel.close();
      });
  }
  done = done.then(() => {}).finally(() => {
    if (listen) {
      events.removeEventListener("offline", onOffline);
      events.removeEventListener("online", onOnline);
    }
  });

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
    // True while the browser is offline and the poller waits for it to come back.
    get offline() {
      return isOffline();
    },
    // "stream" (an EventSource) or "poll" (long polls): the transport of this tab's polls.
    get transport() {
      return state.using;
    },
    // True while this tab polls for the others (always, unless shared).
    get leader() {
      return !channel || term !== null;
    },
  };
}

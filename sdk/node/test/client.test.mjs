// @fastpoll/client against a real stack (nginx, a poll server, memcached, the app on SQLite),
// started by tests/test_node_sdk.py (fastpoll_testkit's Stack), which runs `npm test` with:
//   FASTPOLL_APP_URL     the app's own listener     FASTPOLL_TOKEN     its API token
//   FASTPOLL_PUBLIC_URL  nginx (the public edge)    FASTPOLL_DEAD_URL  a port nothing listens on
// What the SDK writes, polls through nginx with the URL the SDK got, show; its errors are the app's.
import assert from "node:assert/strict";
import { randomInt } from "node:crypto";
import { test } from "node:test";

import {
  BadRequest,
  Client,
  Conflict,
  FastpollError,
  Unauthorized,
  Unavailable,
} from "../dist/index.js";

const env = (name) => {
  const value = process.env[name];
  assert.ok(value, `${name} is not set: run this suite through sdk/node/tests/test_node_sdk.py`);
  return value;
};
const APP = env("FASTPOLL_APP_URL");
const TOKEN = env("FASTPOLL_TOKEN");
const PUBLIC = env("FASTPOLL_PUBLIC_URL");
const DEAD = env("FASTPOLL_DEAD_URL");

const fp = new Client({ baseUrl: APP, token: TOKEN, publicUrl: PUBLIC });
let lastUid = randomInt(1_000_000, 2 ** 40);
const newUid = () => ++lastUid; // a user no other test touched: no shared cache keys
const newRoom = (tag) => `room.${tag}${randomInt(2 ** 40).toString(16)}`;

/** The poll answer through nginx (null: nothing unread). */
async function poll(url) {
  const r = await fetch(url, { signal: AbortSignal.timeout(10_000) });
  const body = await r.text();
  assert.equal(r.status, 200, body);
  return body ? JSON.parse(body) : null;
}

test("publish, then a poll through nginx with the URL from pollUrl shows it", async () => {
  const uid = newUid();
  const url = await fp.pollUrl(uid);
  assert.ok(url.startsWith(`${PUBLIC}/Poll/`) && url.includes("&sig="), url);
  assert.equal(await poll(url), null);
  const msg = await fp.publish(uid, "hi ☃");
  assert.deepEqual(
    [msg.userId, msg.text, msg.read, msg.replayed, msg.cachePublish],
    [uid, "hi ☃", false, false, "ok"],
  );
  assert.ok(Number.isInteger(msg.id) && typeof msg.created === "number");
  const one = { id: msg.id, text: "hi ☃" };
  assert.deepEqual(await poll(url), { unread: 1, newest: one, messages: [one] });
  const info = await fp.pollUrlInfo(uid);
  assert.equal(info.userId, uid);
  assert.ok(info.expires > Date.now() / 1000 && info.url.startsWith("/Poll/"), info);
});

test("markRead", async () => {
  const uid = newUid();
  const first = await fp.publish(uid, "one");
  const second = await fp.publish(uid, "two");
  const done = await fp.markRead(uid, first.id);
  assert.deepEqual(done, { userId: uid, markedRead: 1, cachePublish: "ok" });
  const two = { id: second.id, text: "two" };
  assert.deepEqual(await poll(await fp.pollUrl(uid)), { unread: 1, newest: two, messages: [two] });
  assert.equal((await fp.markRead(uid, second.id)).markedRead, 1);
  assert.equal(await poll(await fp.pollUrl(uid)), null);
});

test("publishBatch", async () => {
  const uid = newUid();
  const room = newRoom("b");
  const ids = await fp.publishBatch([
    { userId: uid, text: "b1" },
    { channel: room, text: "to the room" },
    { userId: uid, text: "b3" },
  ]);
  assert.equal(ids.length, 3);
  assert.deepEqual(ids, [...ids].sort((a, b) => a - b));
  const b1 = { id: ids[0], text: "b1" };
  const b3 = { id: ids[2], text: "b3" };
  assert.deepEqual(await poll(await fp.pollUrl(uid)), { unread: 2, newest: b3, messages: [b1, b3] });
  const answer = await poll(await fp.pollUrl(uid, { channels: [room] }));
  assert.ok(JSON.stringify(answer.channels).includes("to the room"), JSON.stringify(answer));
  await assert.rejects(fp.publishBatch([{ userId: uid, channel: room, text: "x" }]), TypeError);
  await assert.rejects(fp.publishBatch([{ channel: "bad name!", text: "x" }]), (e) => {
    assert.ok(e instanceof BadRequest && e.status === 400, String(e));
    return true;
  });
});

test("publishChannel", async () => {
  const uid = newUid();
  const room = newRoom("c");
  const url = await fp.pollUrl(uid, { channels: [room] });
  assert.ok(url.includes(`ch=${room}`), url);
  const msg = await fp.publishChannel(room, "hello room");
  assert.deepEqual([msg.channel, msg.text, msg.cachePublish], [room, "hello room", "ok"]);
  const answer = await poll(url);
  assert.equal(answer.user, null);
  const channels = JSON.stringify(answer.channels);
  assert.ok(channels.includes(String(msg.id)) && channels.includes("hello room"), channels);
  await assert.rejects(fp.publishChannel("bad name!", "x"), (e) => {
    assert.ok(e instanceof BadRequest && e.status === 400 && /channel name/.test(e.reason), String(e));
    return true;
  });
});

test("data travels with every publish (docs/api.md, Data)", async () => {
  const uid = newUid();
  const room = newRoom("d");
  const data = { order: 991, tags: ["parcel", "☃"], paid: true };
  const both = await fp.publish(uid, "shipped", { data });
  const key = `d-${uid}`;
  const only = await fp.publish(uid, null, { data: [1, 2], idempotencyKey: key });
  assert.deepEqual([both.text, both.data, only.text, only.data], ["shipped", data, "", [1, 2]]);
  assert.equal((await fp.publish(uid, null, { data: [1, 2], idempotencyKey: key })).replayed, true);
  await assert.rejects(fp.publish(uid, null, { data: [1, 3], idempotencyKey: key }), Conflict);
  const plain = await fp.publish(uid, "plain");
  assert.ok(!("data" in plain), JSON.stringify(plain));
  const ids = await fp.publishBatch([
    { userId: uid, data: { b: 1 } },
    { channel: room, text: "t" },
  ]);
  const listed = [
    { id: both.id, text: "shipped", data },
    { id: only.id, text: "", data: [1, 2] },
    { id: plain.id, text: "plain" },
    { id: ids[0], text: "", data: { b: 1 } },
  ];
  const url = await fp.pollUrl(uid, { channels: [room] });
  const answer = await poll(url);
  assert.deepEqual(answer.user, { unread: 4, newest: listed[3], messages: listed });
  const msg = await fp.publishChannel(room, null, { data: { k: [null] } });
  assert.deepEqual([msg.channel, msg.text, msg.data], [room, "", { k: [null] }]);
  assert.deepEqual((await poll(url)).channels[room], {
    messages: [
      { id: ids[1], text: "t" },
      { id: msg.id, text: "", data: { k: [null] } },
    ],
  });
  await assert.rejects(fp.publish(uid, null), TypeError);
  await assert.rejects(fp.publishBatch([{ userId: uid }]), TypeError);
  await assert.rejects(fp.publish(uid, null, { data: "x".repeat(9000) }), (e) => {
    assert.ok(e instanceof BadRequest && e.status === 400 && /^data: /.test(e.reason), String(e));
    return true;
  });
});

test("a replayed Idempotency-Key stores one message", async () => {
  const uid = newUid();
  const key = `k-${uid}`;
  const first = await fp.publish(uid, "once", { idempotencyKey: key });
  const again = await fp.publish(uid, "once", { idempotencyKey: key });
  assert.equal(again.id, first.id);
  assert.equal(again.replayed, true);
  assert.equal(again.cachePublish, null);
  const once = { id: first.id, text: "once" };
  assert.deepEqual(await poll(await fp.pollUrl(uid)), { unread: 1, newest: once, messages: [once] });
  await assert.rejects(fp.publish(uid, "another text", { idempotencyKey: key }), (e) => {
    assert.ok(e instanceof Conflict && e.status === 409, String(e));
    return true;
  });
  // Without a key given, each call has its own: two calls, two messages.
  const [a, b] = [await fp.publish(uid, "twice"), await fp.publish(uid, "twice")];
  assert.notEqual(a.id, b.id);
});

test("errors carry the app's answer: a bad token is Unauthorized", async () => {
  const bad = new Client({ baseUrl: APP, token: "not-the-token" });
  await assert.rejects(bad.publish(newUid(), "x"), (e) => {
    assert.ok(e instanceof Unauthorized && e instanceof FastpollError, String(e));
    assert.equal(e.status, 401);
    assert.match(e.reason, /bearer token/);
    assert.equal(e.message, `401: ${e.reason}`);
    return true;
  });
  await assert.rejects(fp.publish(newUid(), "   "), (e) => {
    assert.ok(e instanceof BadRequest, String(e));
    assert.equal(e.status, 400);
    assert.equal(e.reason, "text: Value error, must not be only whitespace");
    return true;
  });
  await assert.rejects(fp.publish(newUid(), "x".repeat(2001)), BadRequest);
});

test("an unreachable port is Unavailable, after the retries", async () => {
  const nobody = new Client({ baseUrl: DEAD, token: "t", retries: 1, backoffMs: 10 });
  for (const call of [() => nobody.publish(1, "x"), () => nobody.publishBatch([{ userId: 1, text: "x" }])]) {
    await assert.rejects(call(), (e) => {
      assert.ok(e instanceof Unavailable, String(e));
      assert.equal(e.status, null);
      assert.equal(e.retryAfter, null);
      assert.match(e.message, /ECONNREFUSED/);
      return true;
    });
  }
});

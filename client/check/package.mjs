// npm test, after the type check: the built minified copy exports what fastpoll.js exports and
// answers parts()/channelMessages() as it does, and `npm pack --dry-run` lists exactly the
// package's files (no demo page, no checks, no node_modules).
import { execFileSync } from "node:child_process";
import assert from "node:assert/strict";
import * as src from "@fastpoll/browser";
import * as min from "@fastpoll/browser/min";

assert.deepEqual(Object.keys(min).sort(), Object.keys(src).sort());
assert.deepEqual(Object.keys(src).sort(), ["channelMessages", "parts", "startPolling"]);
const composed = { user: null, channels: { "room.a": { messages: [{ id: 1, text: "x" }] } } };
for (const m of [src, min]) {
  assert.deepEqual(m.channelMessages(composed, "room.a"), [{ id: 1, text: "x" }]);
  assert.deepEqual(m.parts({ unread: 0 }), { user: { unread: 0 }, channels: {} });
  assert.throws(() => m.startPolling({}), TypeError);
}

const [pack] = JSON.parse(
  execFileSync("npm", ["pack", "--dry-run", "--json", "--ignore-scripts"], { encoding: "utf8" }),
);
const listed = pack.files.map((f) => f.path).sort();
const want = ["CHANGELOG.md", "dist/fastpoll.min.js", "fastpoll.d.ts", "fastpoll.js", "package.json"];
assert.deepEqual(listed, want, `npm pack lists ${listed.join(", ")}`);
console.log(`${pack.id}: ${listed.join(", ")} (${pack.size} bytes packed)`);

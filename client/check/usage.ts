// A type check of fastpoll.d.ts (npm run check: tsc --noEmit): the package as a page uses it,
// through its own name (package.json "exports"), and uses it wrongly where marked.
import {
  channelMessages,
  parts,
  startPolling,
  type Answer,
  type ComposedAnswer,
  type JsonValue,
  type Message,
  type Poller,
  type UserAnswer,
} from "@fastpoll/browser";
import { startPolling as startMin } from "@fastpoll/browser/min";

const seen: Message[] = [];
const poller: Poller = startPolling({
  url: "/Poll/getMessages?user_id=1&exp=1&sig=x",
  wait: 25,
  interval: 1000,
  storage: null,
  onAnswer(answer: Answer, info) {
    const { user, channels } = parts(answer);
    const unread: number = user?.unread ?? 0;
    const before: number | undefined = user?.before;
    for (const [name, room] of Object.entries(channels)) {
      const ids: number[] = (room?.messages ?? []).map((m) => m.id);
      const same: Message[] = channelMessages(answer, name);
      void [ids, same, room?.before];
    }
    const source: string | null = info.source;
    void [unread, before, source];
  },
  onMessages(list) {
    seen.push(...list);
  },
  onChannelMessages(name: string, list: Message[]) {
    void [name.length, list[0]?.text];
  },
  onStatus({ status, source }) {
    void [status + 1, source];
  },
  onError(err: unknown) {
    void err;
  },
  refreshUrl: async () => "/Poll/getMessages?user_id=1&exp=2&sig=y",
});

const user: UserAnswer = { unread: 1, newest: { id: 3, text: "c" }, messages: [], before: 2 };
const composed: ComposedAnswer = { user, channels: { "room.a": { messages: [] }, "room.b": null } };
const texts: string[] = channelMessages(composed, "room.a").map((m) => m.text);
const withData: Message = { id: 4, text: "", data: { order: 991, tags: ["a"], paid: true } };
const data: JsonValue | undefined = withData.data;
const offline: boolean = poller.offline;
const polls: number = poller.polls;
const etag: string | null = poller.etag;
const stopped: Promise<void> = poller.stop();
const done: Promise<void> = startMin({ url: "/Poll/x" }).done;
const leader: boolean = startPolling({ url: "/Poll/x", shared: true }).leader;
const named: Poller = startPolling({ url: "/Poll/x", shared: "inbox" });
const using: "stream" | "poll" = startPolling({ url: "/Poll/x", transport: "auto" }).transport;
const polled: Poller = startPolling({ url: "/Poll/x", transport: "poll", streamFailures: 2 });
void [texts, data, offline, polls, etag, stopped, done, leader, named, using, polled];

// Wrong uses the declarations must refuse (tsc fails if one is accepted).
// @ts-expect-error url is required
startPolling({ wait: 25 });
// @ts-expect-error onMessages gets a list of messages, not a string
startPolling({ url: "/p", onMessages: (list: string) => list });
// @ts-expect-error a room answer has no unread count
const wrong: number = composed.channels["room.a"]!.unread;
// @ts-expect-error stop() returns a promise, not a number
const n: number = poller.stop();
// @ts-expect-error transport is "auto", "stream" or "poll"
startPolling({ url: "/p", transport: "sse" });
// @ts-expect-error shared is a flag or a name, not a number
startPolling({ url: "/p", shared: 1 });
// @ts-expect-error a message's data is JSON: no function
const badData: Message = { id: 5, text: "", data: () => 1 };
void [wrong, n, badData];

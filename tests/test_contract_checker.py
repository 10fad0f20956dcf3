"""The contract checker's rules on hand-made histories (no processes): each rule finds what it must
and passes what the contract allows (fastpoll_testkit/contract/checker.py, docs/api.md "The
contract, as checked")."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from fastpoll_testkit.contract.checker import Params, check, render
from fastpoll_testkit.contract.history import (
    ANNOUNCE,
    APP,
    APP_PATH,
    APPS_DOWN,
    CACHE,
    CACHE_DELAY,
    CACHE_DOWN,
    CACHE_SLOW,
    CH_OVER_MAX,
    DB,
    DB_READ_ONLY,
    POLLER,
    USER_LOCK,
    Fault,
    History,
    Op,
)
from fastpoll_testkit.contract.run import (
    CONFIGS,
    HELD_WAITS,
    HOSTILE,
    OVERHEAD_S,
    SETTLE_S,
    SLOW_READS,
    Run,
    Settings,
)

ONE = '{"unread":1,"newest":{"id":1,"text":"one"}}'
TWO = '{"unread":1,"newest":{"id":2,"text":"two"}}'


def writes() -> list[Op]:
    """User 1: publish "one" [1.0, 1.1], mark it read [2.0, 2.1], publish "two" [3.0, 3.1]."""
    return [
        Op("publish", 1, 1.0, 1.1, 201, ONE, index=1),
        Op("read", 1, 2.0, 2.1, 200, "", index=2),
        Op("publish", 1, 3.0, 3.1, 201, TWO, index=3),
    ]


def history(*ops: Op, faults: list[Fault] | None = None) -> History:
    return History(seed=7, config="test", ops=[*writes(), *ops], faults=faults or [])


def violations(h: History, rule: str) -> int:
    return len(check(h).rules[rule].violations)


def test_a_stale_read_is_found() -> None:
    # Sent at 2.5, after the mark-read returned (2.1): "one" unread is older.
    h = history(Op("poll", 1, 2.5, 2.51, 200, ONE, source="cache"))
    rep = check(h)
    assert len(rep.rules["1-no-stale"].violations) == 1
    text = render(rep)
    assert "seed 7" in text and "shows state 1, sent after write 2 returned" in text


def test_a_read_overlapping_the_write_may_show_either() -> None:
    # Sent during the mark-read (2.0-2.1): the old or the new state.
    old = Op("poll", 1, 2.05, 2.2, 200, ONE)
    new = Op("poll", 1, 2.05, 2.2, 200, "")
    assert violations(history(old, new), "1-no-stale") == 0


def test_a_read_cannot_show_a_write_not_yet_invoked() -> None:
    # "two" is published at 3.0; a poll answered at 2.5 cannot have seen it.
    assert violations(history(Op("poll", 1, 2.4, 2.5, 200, TWO)), "1-no-stale") == 1


def test_a_304_shows_the_state_of_its_tag() -> None:
    # The tag was "one"'s; a 304 at 2.5 says "one" is current, after the mark-read returned.
    h = history(Op("cond", 1, 2.5, 2.51, 304, ONE, inm_body=ONE))
    assert violations(h, "1-no-stale") == 1
    h = history(Op("cond", 1, 2.5, 2.51, 304, "", inm_body=""))
    assert violations(h, "1-no-stale") == 0


def test_an_answer_no_write_made_is_found() -> None:
    h = history(Op("poll", 1, 3.5, 3.6, 200, '{"unread":3}'))
    rep = check(h)
    assert "no write made" in rep.rules["1-no-stale"].violations[0].what


def test_a_user_with_a_write_of_unknown_outcome_is_not_judged_after_it() -> None:
    unknown = Op("publish", 1, 4.0, 64.0, 0, None, index=-1)
    h = history(unknown, Op("poll", 1, 65.0, 65.1, 200, "whatever"))
    rep = check(h)
    assert rep.rules["1-no-stale"].violations == []
    assert rep.rules["1-no-stale"].excluded == 1


def test_final_answers_must_be_the_last_state() -> None:
    ok = [Op("final-nginx", 1, 9.0, 9.1, 200, TWO), Op("final-app", 1, 9.0, 9.1, 200, TWO)]
    assert violations(history(*ok), "2-nothing-lost") == 0
    # A late write left "one" in the cache (defect 2's shape): lost.
    lost = Op("final-nginx", 1, 9.0, 9.1, 200, ONE)
    assert violations(history(lost), "2-nothing-lost") == 1
    undrained = Op("drain", 0, 8.0, 9.0, 0, note="outbox backlog [3.0]")
    assert violations(history(undrained), "2-nothing-lost") == 1


def test_a_held_poll_answered_late_is_found() -> None:
    # Held from 2.5 on the empty answer's tag; "two" returned at 3.1; answered at 5.0.
    late = Op("held", 1, 2.5, 5.0, 200, TWO, inm_body="", wait=5)
    rep = check(history(late))
    assert len(rep.rules["3-held-bound"].violations) == 1
    assert "1900 ms after write 3 returned" in rep.rules["3-held-bound"].violations[0].what
    on_time = Op("held", 1, 2.5, 3.3, 200, TWO, inm_body="", wait=5)
    assert violations(history(on_time), "3-held-bound") == 0


def test_a_held_poll_bound_grows_with_an_injected_read_delay() -> None:
    held = Op("held", 1, 2.5, 3.45, 200, TWO, inm_body="", wait=5)
    assert violations(history(held), "3-held-bound") == 1
    delay = Fault("cache-delay-reads", "memcached-0", 2.0, 4.0, [CACHE_DELAY], delay_s=0.05)
    assert violations(history(held, faults=[delay]), "3-held-bound") == 0


def test_a_held_poll_bound_grows_with_the_machine_s_own_stall() -> None:
    # Answered 600 ms after "two" returned (3.1): late, unless the box itself was stalled then,
    # which a plain cache hit overlapping that time shows (500 ms for a request waiting on nothing).
    held = Op("held", 1, 2.5, 3.7, 200, TWO, inm_body="", wait=5)
    assert violations(history(held), "3-held-bound") == 1
    slow_hit = Op("poll", 2, 3.15, 3.65, 200, "", source="cache")
    assert violations(history(held, slow_hit), "3-held-bound") == 0
    # A slow answer from the app, or a hit outside [3.1, 3.7], says nothing about the box then.
    from_app = Op("poll", 2, 3.15, 3.65, 200, "", source="app")
    earlier = Op("poll", 2, 2.0, 2.9, 200, "", source="cache")
    assert violations(history(held, from_app, earlier), "3-held-bound") == 1
    # A stall shorter than the lateness does not excuse it.
    short = Op("poll", 2, 3.2, 3.3, 200, "", source="cache")
    assert violations(history(held, short), "3-held-bound") == 1


def test_a_held_poll_bound_grows_with_the_client_s_own_pause() -> None:
    # The same poll, 600 ms after "two" returned, with no request in flight to show a stall: the
    # client's pulse thread woke 480 ms late at 3.6 (its process did not run), so the answer may
    # have come then and been recorded late. A shorter pause, or one outside the wait, does not.
    held = Op("held", 1, 2.5, 3.7, 200, TWO, inm_body="", wait=5)
    paused = history(held)
    paused.stalls = [(3.12, 3.6)]
    assert violations(paused, "3-held-bound") == 0
    short = history(held)
    short.stalls = [(3.2, 3.3)]
    assert violations(short, "3-held-bound") == 1
    before = history(held)
    before.stalls = [(2.0, 2.9)]
    assert violations(before, "3-held-bound") == 1


def test_a_held_poll_the_app_answered_may_take_the_app_s_own_time() -> None:
    # A room over the item size misses, so its held poll's answer is composed by the app: 600 ms
    # after "two" returned is on time if a plain poll the app answered then took 500 ms; a plain
    # poll the app answered says nothing about a held poll the cache answered.
    held = Op("held", 1, 2.5, 3.7, 200, TWO, inm_body="", wait=5, source="app")
    assert violations(history(held), "3-held-bound") == 1
    app_poll = Op("poll", 2, 3.15, 3.65, 200, "", source="app")
    assert violations(history(held, app_poll), "3-held-bound") == 0
    from_cache = replace(held, source="cache")
    assert violations(history(from_cache, app_poll), "3-held-bound") == 1


def test_the_client_s_pauses_are_kept_in_the_history(tmp_path: Path) -> None:
    h = history()
    h.add_stall(3.12, 3.6)
    h.write(tmp_path / "history.jsonl")
    assert History.read(tmp_path / "history.jsonl").stalls == [(3.12, 3.6)]


def test_a_held_poll_waits_for_the_outbox_after_a_pending_write() -> None:
    # "two" (3.0-3.1) returned pending: the outbox writes and announces it within 3 s.
    pending = Op("publish", 1, 3.0, 3.1, 201, TWO, index=3, headers={"x-cache-publish": "pending"})
    h = history(Op("held", 1, 2.5, 5.0, 200, TWO, inm_body="", wait=5))
    h.ops = [pending if o.kind == "publish" and o.index == 3 else o for o in h.ops]
    assert violations(h, "3-held-bound") == 0
    h.ops = [
        o if o.kind != "held" else Op("held", 1, 2.5, 6.6, 200, TWO, inm_body="", wait=8)
        for o in h.ops
    ]
    assert violations(h, "3-held-bound") == 1


def test_a_read_delay_counts_until_its_answers_have_arrived() -> None:
    # Answered 320 ms after "two" returned (3.1): over the 250 ms bound, within 250 + 2 x 50.
    held = Op("held", 1, 2.5, 3.42, 200, TWO, inm_body="", wait=5)

    def delay_until(end: float) -> Fault:
        return Fault("cache-delay-reads", "redis", 1.0, end, [CACHE_DELAY], delay_s=0.05)

    # Ended as the poll was sent, or just before: its answers still arrive up to 50 ms late.
    for end in (2.5, 2.45, 2.41):
        assert violations(history(held, faults=[delay_until(end)]), "3-held-bound") == 0, end
    # Ended longer ago than its delay and the margin (50 + 50 ms): no allowance.
    assert violations(history(held, faults=[delay_until(2.39)]), "3-held-bound") == 1
    assert Params().delay_margin_s == 0.05


def test_a_held_poll_is_not_judged_while_the_announcement_path_is_faulty() -> None:
    late = Op("held", 1, 2.5, 5.0, 200, TWO, inm_body="", wait=5)
    for paths in ([ANNOUNCE], [CACHE], [POLLER + "0"]):
        cut = Fault("x", "y", 2.6, 2.8, paths)
        rep = check(history(late, faults=[cut]))
        assert rep.rules["3-held-bound"].violations == [] and rep.rules["3-held-bound"].excluded
    # ...nor just after it, while the subscriber reconnects (announce_settle_s).
    cut = Fault("announce-cut", "announce", 0.0, 1.0, [ANNOUNCE])
    assert violations(history(late, faults=[cut]), "3-held-bound") == 0
    old = Fault("announce-cut", "announce", -20.0, -19.0, [ANNOUNCE])
    assert violations(history(late, faults=[old]), "3-held-bound") == 1


def test_a_held_poll_whose_tag_became_current_again_is_not_judged() -> None:
    # Held on the empty tag from 1.05: "one" returned at 1.1 but the mark-read started at
    # 1.3, within the bound: the poller may have read "" again. "two" (3.1) is the one judged.
    ops = [
        Op("publish", 1, 1.0, 1.1, 201, ONE, index=1),
        Op("read", 1, 1.3, 1.35, 200, "", index=2),
        Op("publish", 1, 3.0, 3.1, 201, TWO, index=3),
    ]
    held = Op("held", 1, 1.05, 3.2, 200, TWO, inm_body="", wait=5)
    assert len(check(History(ops=[*ops, held])).rules["3-held-bound"].violations) == 0


def test_5xx_only_where_documented() -> None:
    poll_503 = Op("poll", 1, 5.0, 5.1, 503, source="")
    assert violations(history(poll_503), "4-5xx") == 1
    app_down = Fault("app-restart", "app", 4.0, 6.0, [APP + "0", APPS_DOWN])
    assert violations(history(poll_503, faults=[app_down]), "4-5xx") == 0
    api_500 = Op("api", 1, 5.0, 5.1, 500, target="0", note="publish")
    pg = Fault("pg-restart", "postgres", 4.0, 6.0, [DB])
    assert violations(history(api_500, faults=[pg]), "4-5xx") == 1
    api_503 = Op("api", 1, 5.0, 5.1, 503, target="0", note="publish")
    assert violations(history(api_503), "4-5xx") == 1
    assert violations(history(api_503, faults=[pg]), "4-5xx") == 0
    # The user's order held by a write stuck on a held cache write (api.md: 503).
    hold = Fault("cache-hold-writes", "memcached-0", 1.0, 2.0, [CACHE])
    assert violations(history(api_503, faults=[hold]), "4-5xx") == 0
    old_hold = Fault("cache-hold-writes", "memcached-0", -5.0, -4.0, [CACHE])
    assert violations(history(api_503, faults=[old_hold]), "4-5xx") == 1
    refused = Op("api", 1, 5.0, 5.1, 0, target="1", note="publish")
    assert violations(history(refused), "4-5xx") == 1
    restart = Fault("app-restart", "app-1", 4.0, 6.0, [APP + "1"])
    assert violations(history(refused, faults=[restart]), "4-5xx") == 0


def test_a_poll_5xx_while_no_app_answers_only_if_it_needed_the_app() -> None:
    # Hits are still served while the app is down (operations.md): a 5xx is documented for a
    # poll only if its key may have been missing or the cache path failing.
    poll_503 = Op("poll", 1, 5.0, 5.1, 503, source="")
    app_down = Fault("app-restart", "app", 4.0, 6.0, [APP + "0", APPS_DOWN])
    pg = Fault("pg-restart", "postgres", 4.0, 6.0, [DB])
    hit = Op("cond", 1, 3.5, 3.51, 304, ONE, inm_body=ONE, source="cache")
    for down in (app_down, pg):
        # Never seen in the cache: the poll may have been a miss.
        assert violations(history(poll_503, faults=[down]), "4-5xx") == 0
        # Its key was served from the cache at 3.5 and nothing touched the cache since.
        rep = check(history(poll_503, hit, faults=[down]))
        assert len(rep.rules["4-5xx"].violations) == 1
        assert "its key was in the cache" in rep.rules["4-5xx"].violations[0].what
        # A cache node killed after it was seen: lost.
        kill = Fault("cache-kill", "memcached-0", 3.8, 4.2, [CACHE, CACHE_DOWN])
        assert violations(history(poll_503, hit, faults=[down, kill]), "4-5xx") == 0
        # Reads slowed during the poll (a read may time out): the app answers then.
        delay = Fault("cache-delay-reads", "redis", 4.5, 5.5, [CACHE_DELAY], delay_s=0.05)
        assert violations(history(poll_503, hit, faults=[down, delay]), "4-5xx") == 0
    # A write answered X-Cache-Publish: ok put the key in the cache too.
    written = history(poll_503, faults=[app_down])
    written.ops[2].headers = {"x-cache-publish": "ok"}
    assert violations(written, "4-5xx") == 1


def test_a_url_signed_for_more_rooms_than_the_poll_servers_hold_needs_the_app() -> None:
    # The poll servers answer it 404 whatever the cache holds, so nginx sends it to the app:
    # with no app answering, its 503 is documented even though the user's key was cached.
    over = Op("hostile", 1, 5.0, 5.1, 503, source="", note=f"GET {CH_OVER_MAX} If-None-Match None")
    other = Op("hostile", 1, 5.0, 5.1, 503, source="", note="GET &wait= If-None-Match None")
    app_down = Fault("app-restart", "app", 4.0, 6.0, [APP + "0", APPS_DOWN])
    hit = Op("cond", 1, 3.5, 3.51, 304, ONE, inm_body=ONE, source="cache")
    assert violations(history(over, hit, faults=[app_down]), "4-5xx") == 0
    assert violations(history(other, hit, faults=[app_down]), "4-5xx") == 1
    assert violations(history(over, hit), "4-5xx") == 1  # an app was there to answer


def test_a_cache_get_counted_as_timed_out_may_be_the_polls() -> None:
    # No fault on the cache, but a poll server counted a get that timed out (a loaded machine):
    # that poll went to the app, and with none answering its 503 is documented. Only while the
    # poll ran (a sample counts the period before it), and only for rule 4.
    poll_503 = Op("poll", 1, 5.0, 5.1, 503, source="")
    app_down = Fault("app-restart", "app", 4.0, 6.0, [APP + "0", APPS_DOWN])
    hit = Op("cond", 1, 3.5, 3.51, 304, ONE, inm_body=ONE, source="cache")
    h = history(poll_503, hit, faults=[app_down])
    assert violations(h, "4-5xx") == 1
    for t, found in ((5.05, 0), (5.7, 0), (5.9, 1), (4.3, 1)):
        h.cache_timeouts = [{"t": t, "poller": 0, "n": 1}]
        assert violations(h, "4-5xx") == found, t
    # A late held poll is not excused by it (rule 3 excuses faults, and this is none).
    late = Op("held", 1, 2.5, 4.0, 200, TWO, inm_body="", wait=5, source="cache")
    h = history(late, faults=[])
    h.cache_timeouts = [{"t": 3.5, "poller": 0, "n": 1}]
    assert violations(h, "3-held-bound") == 1


def test_cache_timeout_samples_round_trip(tmp_path: Path) -> None:
    h = history()
    h.cache_timeouts = [{"t": 1.5, "poller": 1, "n": 3}]
    h.write(tmp_path / "h.jsonl")
    assert History.read(tmp_path / "h.jsonl").cache_timeouts == h.cache_timeouts


def test_5xx_windows_are_the_documented_ones() -> None:
    poll_503 = Op("poll", 1, 5.0, 5.1, 503, source="")
    # No app process could answer until 4.0: 0.5 s of slack, not the database's 3 s of grace.
    app_down = Fault("app-restart", "app", 2.0, 4.0, [APP + "0", APPS_DOWN])
    assert violations(history(poll_503, faults=[app_down]), "4-5xx") == 1
    app_down.end = 4.6
    assert violations(history(poll_503, faults=[app_down]), "4-5xx") == 0
    pg = Fault("pg-restart", "postgres", 0.0, 1.6, [DB])
    assert violations(history(poll_503, faults=[pg]), "4-5xx") == 0  # 3 s after, + 0.5 s
    pg.end = 1.4
    assert violations(history(poll_503, faults=[pg]), "4-5xx") == 1
    # nginx's shed 503: during a cache fault and 3 s after (+ 0.5 s).
    shed = Op("poll", 1, 5.0, 5.1, 503, source="shed")
    hold = Fault("cache-hold-writes", "memcached-0", 0.0, 1.6, [CACHE])
    assert violations(history(shed, faults=[hold]), "4-5xx") == 0
    hold.end = 1.4
    assert violations(history(shed, faults=[hold]), "4-5xx") == 1


def test_nginx_marking_a_poller_failed_is_found_outside_its_faults() -> None:
    h = history()
    h.nginx_errors = [{"t": 20.0, "poller": 1, "msg": "upstream timed out ... poller-1.sock"}]
    assert violations(h, "5-nginx-poller") == 1
    h.faults = [Fault("poller-restart", "poller-1", 18.0, 18.5, [POLLER + "1"])]
    assert violations(h, "5-nginx-poller") == 0
    h.faults = [Fault("poller-restart", "poller-0", 18.0, 18.5, [POLLER + "0"])]
    assert violations(h, "5-nginx-poller") == 1
    h.faults = [Fault("cache-hang", "memcached-0", 18.0, 19.0, [CACHE, CACHE_DOWN])]
    assert violations(h, "5-nginx-poller") == 0
    # A cache write held is no reason for a poller to be marked failed.
    h.faults = [Fault("cache-hold-writes", "memcached-0", 18.0, 19.0, [CACHE])]
    assert violations(h, "5-nginx-poller") == 1


def test_hostile_requests_get_the_documented_answer() -> None:
    refused = Op("hostile", 1, 5.0, 5.01, 400, expect=[400], wait=4, note="&WAIT=0&wait=30")
    assert violations(history(refused), "6-hostile") == 0
    held = Op("hostile", 1, 5.0, 15.0, 200, ONE, expect=[400], wait=4, note="&WAIT=0&wait=30")
    assert violations(history(held), "6-hostile") == 1
    slow = Op("hostile", 1, 5.0, 10.0, 400, expect=[400], wait=4)
    assert violations(history(slow), "6-hostile") == 1
    # The app's refusal (a URL signed for 17 rooms) while an app process restarted: its time is
    # the restart's; its status is still judged, and the poll server's own refusals keep the bound.
    restart = Fault("app-restart", "app", 4.0, 12.0, [APP])
    by_app = replace(slow, source="app")
    assert violations(history(by_app, faults=[restart]), "6-hostile") == 0
    assert violations(history(replace(by_app, status=200), faults=[restart]), "6-hostile") == 1
    assert violations(history(slow, faults=[restart]), "6-hostile") == 1
    assert violations(history(by_app), "6-hostile") == 1


def test_the_history_round_trips_through_json_lines(tmp_path: Path) -> None:
    h = history(
        Op("held", 1, 2.5, 5.0, 200, TWO, inm_body="", wait=5, headers={"etag": '"x"'}),
        faults=[Fault("cache-hold-writes", "memcached-0", 1.0, 2.0, [CACHE], params={"a": 1})],
    )
    h.nginx_errors = [{"t": 3.0, "poller": 0, "msg": "m"}]
    h.write(tmp_path / "h.jsonl")
    again = History.read(tmp_path / "h.jsonl")
    assert again.ops == sorted(h.ops, key=lambda o: o.start)
    assert again.faults == h.faults and again.nginx_errors == h.nginx_errors
    assert render(check(again)) == render(check(h))


def test_the_schedule_is_a_function_of_the_seed(tmp_path: Path) -> None:
    from fastpoll_testkit.contract.__main__ import SHORT_SECONDS
    from fastpoll_testkit.contract.run import CONFIGS

    def plan(seed: int) -> list[tuple[float, str, dict[str, object]]]:
        run = Run(CONFIGS["mc3-pg"], Settings(seed, SHORT_SECONDS), tmp_path)
        run.proxy_names = ["memcached-0", "memcached-1", "memcached-2", "announce"]
        run.stack.poller_ports = [1, 2]
        return run.schedule()

    assert plan(5) == plan(5) and plan(5) != plan(6)
    kinds = [k for _, k, _ in plan(5)]
    # The first deck has every kind once: a short run meets each (the new ones included).
    assert set(kinds) == set(Run(CONFIGS["mc3-pg"], Settings(5, 1.0), tmp_path).kinds())
    assert {"cache-read-stall", "cache-slow-reads", "db-read-only", "user-lock"} <= set(kinds)
    # The first deck begins with the slow and stalled reads; later ones start once every poll
    # held then was sent after the faults before had settled: rule 8 judges their held polls
    # (it excuses those that met an earlier cache or announcement fault's settle time).
    for seed in (5, 874623):
        schedule = plan(seed)
        assert {k for _, k, _ in schedule[:2]} == set(SLOW_READS)
        settled = 0.0
        for t, kind, params in schedule:
            if kind in SLOW_READS:
                assert t >= settled, (seed, t, kind, settled)
            end = t + float(str(params["length"])) + OVERHEAD_S.get(kind, 0.0)
            if kind in SETTLE_S:
                settled = max(settled, end + SETTLE_S[kind] + max(HELD_WAITS) + Params().pad_s)
    assert SETTLE_S["cache-hang"] == Params().cache_settle_s
    assert len(HOSTILE) > 5 and Params().held_bound_s == 0.25


def test_a_pending_write_may_be_missed_while_only_the_apps_path_fails() -> None:
    """design.md, "Where the rule holds, and where not": the app's writes held, the poll servers
    reading the node: the older answer until the outbox rewrites the key (3 s at most)."""
    ops = writes()
    ops[1].headers = {"x-cache-publish": "pending"}  # the mark-read [2.0, 2.1]
    stale = Op("poll", 1, 2.5, 2.51, 200, ONE)
    hold = Fault("cache-hold-writes", "memcached-0", 1.5, 2.3, [CACHE, APP_PATH])
    rep = check(History(ops=[*ops, stale], faults=[hold]))
    assert rep.rules["1-no-stale"].violations == [] and rep.rules["1-no-stale"].excluded == 1
    # Not 3 s after the fault ended (the outbox should have rewritten it) ...
    late = Op("poll", 1, 2.9, 2.91, 200, ONE)
    early = Fault("cache-hold-writes", "memcached-0", 1.5, 2.05, [CACHE, APP_PATH])
    h = History(ops=[*ops, late], faults=[early])
    assert len(check(h, Params(outbox_s=0.5)).rules["1-no-stale"].violations) == 1
    # ... nor for a write that returned ok (the late-write defect: the mark-read wrote nothing).
    ops[1].headers = {"x-cache-publish": "ok"}
    assert violations(History(ops=[*ops, stale], faults=[hold]), "1-no-stale") == 1
    # ... nor when the poll servers could see the failure (a hung memcached node).
    ops[1].headers = {"x-cache-publish": "pending"}
    hang = Fault("cache-hang", "memcached-0", 1.5, 2.3, [CACHE, CACHE_DOWN])
    assert violations(History(ops=[*ops, stale], faults=[hang]), "1-no-stale") == 1
    # ... unless a poll server was restarted after the hang began: it saw no failure and may
    # read the node at once, until the outbox rewrites the key (design.md, the same list).
    restart = Fault("poller-restart", "poller-0", 2.0, 2.4, [])
    h = History(ops=[*ops, stale], faults=[hang, restart])
    assert violations(h, "1-no-stale") == 0
    before = Fault("poller-restart", "poller-0", 0.5, 0.9, [])
    assert violations(History(ops=[*ops, stale], faults=[hang, before]), "1-no-stale") == 1


def bad(status: int, body: str, took: float = 0.1) -> Op:
    return Op("bad-api", 1, 5.0, 5.0 + took, status, body, expect=[400], wait=5, note="POST bad")


def test_bad_input_refused_with_a_json_error_passes() -> None:
    assert violations(history(bad(400, '{"error": "user_id: not an integer"}')), "7-bad-input") == 0


def test_bad_input_taken_or_refused_badly_is_found() -> None:
    for op in (
        bad(201, '{"id": 9}'),  # taken
        bad(400, "Bad Request"),  # not the documented body
        bad(400, '{"detail": "x"}'),
        bad(400, '{"error": "x"}', took=6.0),  # too late
    ):
        assert violations(history(op), "7-bad-input") == 1, op


def test_bad_input_answered_500_is_rule_4s() -> None:
    h = history(bad(500, "Internal Server Error"))
    assert violations(h, "7-bad-input") == 0
    assert violations(h, "4-5xx") == 1


def test_a_user_body_counts_the_unread_and_lists_the_newest() -> None:
    from fastpoll_testkit.contract.run import _room_body, _user_body

    assert _user_body([]) == ""
    assert _user_body([(5, "b", None), (3, "a", None)]) == (
        '{"unread":2,"newest":{"id":5,"text":"b"},'
        '"messages":[{"id":3,"text":"a"},{"id":5,"text":"b"}]}'
    )
    assert _user_body([(3, "a", None), (5, "b", [1]), (8, "c", None)], bound=2) == (
        '{"unread":3,"newest":{"id":8,"text":"c"},'
        '"messages":[{"id":5,"text":"b","data":[1]},{"id":8,"text":"c"}],"before":3}'
    )
    room: list[tuple[int, str, object]] = [(i, f"m{i}", None) for i in range(1, 8)]
    assert _room_body(room).endswith('{"id":7,"text":"m7"}],"before":2}')
    room[-1] = (7, "", {"n": 7})
    assert _room_body(room).endswith('{"id":7,"text":"","data":{"n":7}}],"before":2}')


def test_the_room_is_numbered_by_its_messages_ids(tmp_path: Path) -> None:
    run = Run(CONFIGS["mc1-sqlite"], Settings(seed=1, seconds=1), tmp_path)
    ops = [
        Op("publish", 0, 1.0, 1.2, 201, index=0, ids=[12], text="b"),
        Op("publish", 0, 1.1, 1.3, 201, index=0, ids=[11], text="a"),
        Op("publish", 0, 1.4, 1.5, 0, index=-1),
    ]
    run.history.ops = ops
    run.renumber_room()
    assert [o.index for o in ops] == [2, 1, -1]
    assert ops[1].body == '{"messages":[{"id":11,"text":"a"}]}'
    assert ops[0].body == '{"messages":[{"id":11,"text":"a"},{"id":12,"text":"b"}]}'


def slow_reads(start: float = 2.8, end: float = 8.0) -> Fault:
    return Fault("cache-slow-reads", "memcached-0", start, end, [CACHE_SLOW], delay_s=0.2)


def test_a_held_poll_waiting_out_slow_cache_reads_is_found() -> None:
    # "two" returned at 3.1 while every cache read was 200 ms late (over timeout_ms): the poll
    # waited for its re-check, not the app. Rule 3 leaves it to rule 8.
    late = Op("held", 1, 2.9, 7.9, 304, "", inm_body="", wait=5)
    h = history(late, faults=[slow_reads()])
    assert violations(h, "3-held-bound") == 0
    assert violations(h, "8-held-stall") == 1
    on_time = Op("held", 1, 2.9, 4.5, 200, TWO, inm_body="", wait=5)
    assert violations(history(on_time, faults=[slow_reads()]), "8-held-stall") == 0


def test_a_stall_judges_held_polls_unless_another_fault_meets_them() -> None:
    stall = Fault("cache-stall", "memcached", 3.0, 3.6, [CACHE, CACHE_DOWN, CACHE_SLOW])
    late = Op("held", 1, 2.9, 7.9, 304, "", inm_body="", wait=5)
    assert violations(history(late, faults=[stall]), "8-held-stall") == 1
    cut = Fault("announce-cut", "announce", 2.0, 4.0, [ANNOUNCE])
    h = history(late, faults=[stall, cut])
    assert violations(h, "8-held-stall") == 0
    assert check(h).rules["8-held-stall"].excluded == 1


def test_a_held_poll_the_app_answered_during_an_app_restart_is_not_judged() -> None:
    # "two" returned at 3.1; the poll's re-read missed and nginx asked an app process that was
    # being restarted: answered by the other at 3.7, late for the poll server's bound.
    late = Op("held", 1, 2.9, 3.7, 200, TWO, inm_body="", wait=5, source="app")
    restart = Fault("app-restart", "app-0", 2.5, 4.0, [APP + "0"])
    h = history(late, faults=[restart])
    assert violations(h, "3-held-bound") == 0
    assert check(h).rules["3-held-bound"].excluded == 1
    from_cache = replace(late, source="cache")
    assert violations(history(from_cache, faults=[restart]), "3-held-bound") == 1


def test_a_held_poll_the_app_answered_while_its_pool_recovered_is_not_judged() -> None:
    # The same late answer from the app, its database read-only until 1.0 (db_grace_s 3 s: the
    # pool still replacing the sessions that were ended); from the cache it is the poll server's.
    late = Op("held", 1, 2.9, 3.7, 200, TWO, inm_body="", wait=5, source="app")
    for paths in ([DB_READ_ONLY], [DB]):
        db = Fault("db-read-only", "postgres", 0.0, 1.0, paths)
        assert violations(history(late, faults=[db]), "3-held-bound") == 0
        assert violations(history(replace(late, source="cache"), faults=[db]), "3-held-bound") == 1
    long_ago = Fault("db-read-only", "postgres", -5.0, -4.0, [DB_READ_ONLY])
    assert violations(history(late, faults=[long_ago]), "3-held-bound") == 1


def test_a_held_poll_the_app_answered_may_wait_for_its_users_held_order() -> None:
    # User 1's held poll went to the app at 3.2 (a room over the item size misses), while user
    # 1's order was held from outside: the app's fill waits order_wait_s (3 s) for it, then
    # answers without it. Within the bound plus that wait it is on time; past it, late; from
    # the cache, or with another user's order held, the poll server's bound alone.
    held_order = Fault("user-lock", "user 1", 2.0, 8.0, [USER_LOCK], params={"users": [1]})
    waited = Op("held", 1, 2.9, 6.2, 200, TWO, inm_body="", wait=5, source="app")
    assert violations(history(waited, faults=[held_order]), "3-held-bound") == 0
    too_late = replace(waited, end=6.6)
    assert violations(history(too_late, faults=[held_order]), "3-held-bound") == 1
    from_cache = replace(waited, source="cache")
    assert violations(history(from_cache, faults=[held_order]), "3-held-bound") == 1
    other = Fault("user-lock", "user 4", 2.0, 8.0, [USER_LOCK], params={"users": [4]})
    assert violations(history(waited, faults=[other]), "3-held-bound") == 1
    # A room poll waits for its URL's user's order too.
    room = Op("held", 1, 2.9, 6.2, 200, TWO, inm_body="", wait=5, source="app",
              note="room poll of user 4", ids=[4])  # fmt: skip
    assert violations(history(room, faults=[other]), "3-held-bound") == 0


def test_held_polls_without_slow_reads_are_not_rule_8s() -> None:
    late = Op("held", 1, 2.5, 5.0, 200, TWO, inm_body="", wait=5)
    rep = check(history(late))
    assert rep.rules["8-held-stall"].checked == 0


def user_lock(uid: int = 2, start: float = 10.0, end: float = 14.0) -> Fault:
    return Fault("user-lock", f"user {uid}", start, end, [USER_LOCK], params={"user": uid})


def test_another_user_slowed_by_a_held_lock_is_found() -> None:
    slow = Op("api", 3, 11.0, 14.0, 200, note="publish")
    fast = Op("api", 3, 12.0, 12.1, 201, note="publish")
    assert violations(history(slow, fast, faults=[user_lock()]), "9-isolation") == 1
    failed = Op("api", 4, 11.0, 11.2, 503, note="read", headers={"retry-after": "1"})
    h = history(failed, faults=[user_lock()])
    assert violations(h, "9-isolation") == 1
    assert violations(h, "4-5xx") == 1  # another user's 503: not the held order's


def test_the_locked_user_and_its_batches_may_wait_and_get_503() -> None:
    own = Op("api", 2, 11.0, 14.0, 503, note="publish", headers={"retry-after": "1"})
    batch = Op("api", 7, 11.0, 14.0, 503, note="batch 3 [7, 2]", ids=[7, 2])
    h = history(own, batch, faults=[user_lock()])
    assert violations(h, "9-isolation") == 0
    assert violations(h, "4-5xx") == 0


def test_a_room_poll_waits_for_its_users_order() -> None:
    # User 2's URL with the room: a miss is composed at the app with user 2's own key.
    room = Op("poll", 0, 11.0, 13.8, 200, "", source="app", note="room poll of user 2", ids=[2])
    assert violations(history(room, faults=[user_lock()]), "9-isolation") == 0
    other = replace(room, note="room poll of user 3", ids=[3])
    assert violations(history(other, faults=[user_lock()]), "9-isolation") == 1


def test_a_lock_of_two_users_holds_both() -> None:
    both = Fault("user-lock", "users 2+5", 10.0, 14.0, [USER_LOCK], params={"users": [2, 5]})
    waited = [Op("api", u, 11.0, 14.0, 503, note="publish") for u in (2, 5)]
    h = history(*waited, faults=[both])
    assert violations(h, "9-isolation") == 0
    assert violations(h, "4-5xx") == 0


def test_an_order_an_idle_session_still_holds_after_the_run_is_found() -> None:
    leaked = Op("idle-orders", 0, 30.0, 30.1, 409, note="1 advisory lock(s) held by idle ...")
    assert violations(history(leaked), "9-isolation") == 1
    none = Op("idle-orders", 0, 30.0, 30.1, 200, note="0 advisory lock(s)")
    assert violations(history(none), "9-isolation") == 0
    unread = Op("idle-orders", 0, 30.0, 30.1, 0, note="cannot read pg_locks: ...")
    assert violations(history(unread), "9-isolation") == 1


PLACEMENT = {
    "0": ["memcached-2", "memcached-0"],
    "1": ["memcached-0", "memcached-1"],
    "3": ["memcached-1", "memcached-2"],
}


def test_a_user_slowed_by_a_hung_node_without_its_key_is_found() -> None:
    """Rule 9 for the cache's nodes: memcached-0 hung slows user 1 (a copy of its key there),
    not user 3, nor user 3's room poll (the room's key has a copy there)."""
    hang = Fault("cache-hang", "memcached-0", 10.0, 12.0, [CACHE, CACHE_DOWN])
    slow = Op("api", 3, 10.5, 13.0, 201, note="publish")
    own = Op("api", 1, 10.5, 13.0, 201, note="publish")
    room = Op("poll", 3, 10.5, 13.0, 200, "", source="app", note="room poll of user 3", ids=[3])
    fast = Op("poll", 3, 11.0, 11.1, 200, "", source="cache")
    h = history(slow, own, room, fast, faults=[hang])
    h.placement = PLACEMENT
    res = check(h).rules["9-isolation"]
    assert [v.ops[0] for v in res.violations] == [slow] and res.checked == 2
    # A single node (no placement): everyone's key is on it, nothing is judged.
    h.placement = {}
    assert violations(h, "9-isolation") == 0
    # Another fault at the same time: not judged.
    h.placement = PLACEMENT
    h.faults.append(Fault("poller-restart", "poller-0", 12.5, 12.6, [POLLER + "0"]))
    assert violations(h, "9-isolation") == 0


def test_isolation_is_not_judged_during_another_fault() -> None:
    slow = Op("poll", 3, 11.0, 14.0, 200, "", source="app")
    pg = Fault("pg-restart", "postgres", 10.5, 12.0, [DB])
    h = history(slow, faults=[user_lock(), pg])
    assert violations(h, "9-isolation") == 0
    assert check(h).rules["9-isolation"].excluded == 1


def test_a_read_only_database_answers_writes_503_with_retry_after() -> None:
    ro = Fault("db-read-only", "postgres", 20.0, 23.0, [DB_READ_ONLY])
    ok = Op("api", 1, 21.0, 21.1, 503, note="publish", headers={"retry-after": "1"})
    bare = Op("api", 1, 21.5, 21.6, 503, note="publish")
    five = Op("api", 1, 22.0, 22.1, 500, note="publish", headers={"retry-after": "1"})
    res = check(history(ok, bare, five, faults=[ro])).rules["4-5xx"]
    assert [v.ops[0] for v in res.violations] == [bare, five]


def test_answers_are_compared_on_the_state_they_show() -> None:
    from fastpoll_testkit.contract.checker import canonical

    listed = '{"unread":1,"newest":{"id":1,"text":"one"},"messages":[{"id":1,"text":"one"}]}'
    assert canonical(listed) == ONE
    room = '{"messages":[{"id":3,"text":"x"}],"before":2}'
    assert canonical(room) == '{"messages":[{"id":3,"text":"x"}]}'
    assert canonical('{"error":"bad"}') == '{"error":"bad"}' and canonical("") == ""
    # A poll showing the listed form of "one" after the mark-read is still stale.
    assert violations(history(Op("poll", 1, 2.5, 2.51, 200, listed)), "1-no-stale") == 1


def test_a_later_fault_on_the_app_s_path_excuses_no_earlier_stale_answer() -> None:
    # "two" returned pending at 3.1; a poll at 3.5 still shows the mark-read's empty answer.
    # Held cache writes from 20 s on excuse it no more than no fault at all.
    ops = [*writes()]
    ops[2] = Op("publish", 1, 3.0, 3.1, 201, TWO, index=3, headers={"x-cache-publish": "pending"})
    stale = Op("poll", 1, 3.5, 3.51, 200, "", source="cache")
    later = Fault("cache-hold-writes", "memcached-0", 20.0, 24.0, [CACHE, APP_PATH])
    h = History(seed=7, config="test", ops=[*ops, stale], faults=[later])
    assert violations(h, "1-no-stale") == 1
    during = Fault("cache-hold-writes", "memcached-0", 2.9, 3.3, [CACHE, APP_PATH])
    h = History(seed=7, config="test", ops=[*ops, stale], faults=[during])
    assert violations(h, "1-no-stale") == 0


def messages_history(*ops: Op) -> History:
    """User 1's publishes 11 "a" [1.0, 1.1], 12 "b" [2.0, 2.1], 13 "c" [3.0, 3.1]; a mark-read up
    to 11 [4.0, 4.1]; then the given ops."""
    writes = [
        Op("publish", 1, 1.0 + n, 1.1 + n, 201, f"body{n}", index=n + 1, ids=[11 + n], text=t)
        for n, t in enumerate("abc")
    ]
    writes.append(Op("read", 1, 4.0, 4.1, 200, "", index=4, note="up_to 11"))
    return History(seed=7, config="test", ops=[*writes, *ops])


def read_after(
    after: int, listed: list[tuple[int, str]], more: bool = False, at: float = 5.0
) -> Op:
    body = json.dumps({"messages": [{"id": i, "text": t} for i, t in listed], "more": more})
    return Op("history", 1, at, at + 0.05, 200, body, ids=[after], note=f"&after={after}")


def test_a_history_read_listing_every_unread_message_after_its_id_passes() -> None:
    ok = [read_after(0, [(12, "b"), (13, "c")]), read_after(12, [(13, "c")])]
    cut = read_after(0, [(12, "b")], more=True)  # limit=1: `more` says so
    early = read_after(0, [(11, "a"), (12, "b")], at=2.5)  # before the mark-read; "c" not sent
    rep = check(messages_history(*ok, cut, early)).rules["10-no-skip"]
    assert rep.checked == 4 and not rep.violations


def test_a_history_read_that_skips_an_acknowledged_message_is_found() -> None:
    skipped = read_after(0, [(13, "c")])
    cut_silently = read_after(0, [(12, "b")])  # "c" left out, but `more` is false
    for op in (skipped, cut_silently):
        assert violations(messages_history(op), "10-no-skip") == 1, op


def test_a_history_read_listing_what_it_must_not_is_found() -> None:
    for listed in (
        [(11, "a"), (12, "b"), (13, "c")],  # 11 was marked read before the read was sent
        [(12, "b"), (13, "x")],  # not the text its publish made
        [(13, "c"), (12, "b")],  # not ascending
        [(12, "b"), (13, "c"), (14, "d")],  # no publish made it
    ):
        assert violations(messages_history(read_after(0, listed)), "10-no-skip") == 1, listed
    assert violations(messages_history(read_after(12, [(12, "b"), (13, "c")])), "10-no-skip") == 1


def test_a_message_being_marked_read_may_be_left_out() -> None:
    marking = Op("read", 1, 5.0, 5.2, 200, "", index=5, note="up_to 13")
    h = messages_history(marking, read_after(0, [], at=5.1))
    assert violations(h, "10-no-skip") == 0


def payload_history(*ops: Op) -> History:
    """User 1's publishes 21 "t" with data {"n": 21, "tags": ["x"]} and 22 "u" without data,
    then the given ops (answers that list them)."""
    data = {"n": 21, "tags": ["x"]}
    writes = [
        Op("publish", 1, 1.0, 1.1, 201, "b1", index=1, ids=[21], text="t", data=data),
        Op("publish", 1, 2.0, 2.1, 201, "b2", index=2, ids=[22], text="u"),
    ]
    return History(seed=7, config="test", ops=[*writes, *ops])


def listing(kind: str, doc: object) -> Op:
    return Op(kind, 1, 3.0, 3.05, 200, json.dumps(doc), note=kind)


GOOD = [{"id": 21, "text": "t", "data": {"n": 21, "tags": ["x"]}}, {"id": 22, "text": "u"}]


def test_answers_listing_each_message_as_its_publish_sent_it_pass() -> None:
    ops = [
        listing("poll", {"unread": 2, "newest": GOOD[1], "messages": GOOD}),
        listing("stream", {"user": {"unread": 2, "newest": GOOD[1]}, "channels": {"r": None}}),
        listing("poll", {"messages": GOOD}),  # a room's part
        listing("history", {"messages": GOOD, "more": False}),
        listing("poll", {"messages": [{"id": 99, "text": "?"}]}),  # no publish: rule 1's
    ]
    rep = check(payload_history(*ops)).rules["12-payload"]
    assert rep.checked == 8 and not rep.violations  # 3 + 1 + 2 + 2 listed messages


def test_a_listed_message_with_other_data_or_text_is_found() -> None:
    wrong = [
        [{"id": 21, "text": "t", "data": {"n": 22, "tags": ["x"]}}],  # another marker
        [{"id": 21, "text": "t", "data": {"tags": ["x"], "n": 21}}],  # reordered keys
        [{"id": 21, "text": "t"}],  # the data dropped
        [{"id": 22, "text": "u", "data": None}],  # data on a message that had none
        [{"id": 22, "text": "u", "data": {}}],
        [{"id": 21, "text": "", "data": {"n": 21, "tags": ["x"]}}],  # the text dropped
    ]
    for listed in wrong:
        for kind, doc in (
            ("history", {"messages": listed, "more": False}),
            ("stream", {"user": {"unread": 1, "newest": listed[0]}, "channels": {}}),
            ("poll", {"messages": listed}),
        ):
            h = payload_history(listing(kind, doc))
            assert violations(h, "12-payload") == 1, (kind, listed)
    rep = check(payload_history(listing("history", {"messages": wrong[2], "more": False})))
    assert "lists 21 with text 't' data None" in render(rep)


def test_a_share_of_the_workloads_publishes_carry_data() -> None:
    from fastpoll_testkit.contract.run import payload_data

    texts = [f"u1 n{i} {i * 7919:08x}" for i in range(300)]
    with_data = [t for t in texts if payload_data(t) is not None]
    assert 60 < len(with_data) < 140
    data = payload_data(with_data[0])
    assert data == payload_data(with_data[0])  # the same on every run
    assert isinstance(data, dict) and set(data) == {"n", "tags"}


def test_a_503_while_nginx_still_skips_every_app_is_excused() -> None:
    """Two apps: app 0 back 0.2 s before app 1 restarts. nginx skips app 0 for its
    fail_timeout (2 s) after it refused, so a miss then is 503: excused; not 3 s later."""
    back = Fault("app-restart", "app", 10.0, 12.0, [APP + "0"])
    other = Fault("app-restart", "app-1", 12.2, 15.0, [APP + "1"])
    early = Op("history", 3, 13.0, 13.01, 503, note="&after=0")
    h = history(early, faults=[back, other])
    h.apps = 2
    assert violations(h, "4-5xx") == 0
    late = Op("history", 3, 15.6, 15.61, 503, note="&after=0")
    h = history(late, faults=[back, other])
    h.apps = 2
    assert violations(h, "4-5xx") == 1
    h.apps = 0  # not recorded: nothing is excused
    assert violations(history(early, faults=[back, other]), "4-5xx") == 1


def test_a_fault_the_nemesis_could_not_heal_voids_the_run() -> None:
    # memcached-0 did not start again after its kill: what followed is the harness's doing.
    ok = [Op("final-nginx", 1, 9.0, 9.1, 200, TWO), Op("final-app", 1, 9.0, 9.1, 200, TWO)]
    error = "RuntimeError('memcached-0 exited with status 71')"
    failed = Fault("cache-kill", "", 4.0, 4.5, params={"node": "memcached-0", "error": error})
    rep = check(history(*ok, faults=[failed]))
    assert not rep.ok and not any(r.violations for r in rep.rules.values())
    assert rep.void == [f"cache-kill on memcached-0 at 3.000 s: {error}"]
    text = render(rep)
    assert "VOID (seed 7, config test): the nemesis failed: cache-kill on memcached-0" in text
    healed = replace(failed, params={"node": "memcached-0"})
    assert check(history(*ok, faults=[healed])).ok


def test_a_pending_write_just_after_the_app_s_path_failed_may_be_missed() -> None:
    """The app's memcached client skips a node that timed out for 1 s (retry_timeout) and fails
    fast while operations still hang on it: a write started 0.6 s after a hold's release may
    return pending because of the hold, and the older answer is served until the outbox rewrites
    the key. Seen under load: the hold ended at 30.356, a repair timed out at 30.53, the next
    publish failed fast at 30.938."""
    ops = writes()
    ops[1].headers = {"x-cache-publish": "pending"}  # the mark-read [2.0, 2.1]
    stale = Op("poll", 1, 2.5, 2.51, 200, ONE)
    hold = Fault("cache-hold-writes", "memcached-0", 0.5, 1.4, [CACHE, APP_PATH])  # 0.6 s before
    rep = check(History(ops=[*ops, stale], faults=[hold]))
    assert rep.rules["1-no-stale"].violations == [] and rep.rules["1-no-stale"].excluded == 1
    # Longer after the fault than the app's skip and the scheduling slack: nothing excuses it.
    long_before = Fault("cache-hold-writes", "memcached-0", 0.1, 0.3, [CACHE, APP_PATH])
    assert violations(History(ops=[*ops, stale], faults=[long_before]), "1-no-stale") == 1


def stream_ops(event_at: float) -> list[Op]:
    """User 1's stream, open over [2.0, 6.0]: the empty answer's event at 2.3, "two" at event_at."""
    note = "stream of user 1"
    return [
        Op("stream-conn", 1, 2.0, 6.0, 200, source="cache", target="nginx", note=note),
        Op(
            "stream",
            1,
            2.0,
            2.3,
            200,
            "",
            source="cache",
            target="nginx",
            note=f"{note}, connection 1",
        ),
        Op(
            "stream",
            1,
            2.0,
            event_at,
            200,
            TWO,
            source="cache",
            target="nginx",
            note=f"{note}, connection 1",
        ),
    ]


def test_a_write_reaching_an_open_stream_late_is_found() -> None:
    # "two" returned at 3.1: its event is due by 3.35 (the held bound, no cache hit to widen it).
    assert violations(history(*stream_ops(3.3)), "11-stream") == 0
    rep = check(history(*stream_ops(3.5)))
    assert len(rep.rules["11-stream"].violations) == 1
    assert "400 ms after it returned" in rep.rules["11-stream"].violations[0].what


def test_a_stream_bound_grows_with_an_injected_read_delay() -> None:
    # An event is a watch's read, as a held poll's answer is: twice the delay, as rule 3 allows.
    delay = Fault("cache-delay-reads", "memcached-0", 2.0, 4.0, [CACHE_DELAY], delay_s=0.1)
    assert violations(history(*stream_ops(3.5), faults=[delay]), "11-stream") == 0
    assert violations(history(*stream_ops(3.6), faults=[delay]), "11-stream") == 1

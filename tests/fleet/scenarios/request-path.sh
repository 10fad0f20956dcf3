# shellcheck shell=bash disable=SC2154  # seed_user: set by run.sh
# The fleet test's request-path scenario: hits, misses, signatures and POST bodies through each
# poller, long polls, the instances under systemd, fp-solo. Sourced by tests/fleet/run.sh (which
# runs sc_request_path as the row request-path); it uses lib.sh's helpers and the variables of the
# run.

sc_request_path() {
# ---- 6. the request path through each poller --------------------------------------------------

# Messages API through poller 1 (location / -> app); the poll of that user is then a cache hit
# on both pollers (the app wrote the key with ketama over the same two memcached nodes).
expect "$(publish fp-data1 "$seed_user" "hello fleet")" 201 "publish"
for n in "${POLLERS[@]}"; do
    expect "$(http GET "$n" "/Poll/getMessages?user_id=$seed_user")" "200 cache" "$n: hit after publish"
    grep -q 'hello fleet' "$RUN/body" || die "$n: hit body lacks the message: $(cat "$RUN/body")"
done
say "hit: user $seed_user published through fp-poll1, answered from cache by both pollers"

for n in "${POLLERS[@]}"; do
    u=$((RANDOM % 9000 + 20000))
    expect "$(http GET "$n" "/Poll/getMessages?user_id=$u&_=$RANDOM")" "200 app" "$n: first poll of user $u (miss -> fallback)"
    expect "$(http GET "$n" "/Poll/getMessages?user_id=$u")" "200 cache" "$n: second poll of user $u (hit)"
    # Signed URLs are enforced: a missing or forged signature is 403, cached answer or not.
    expect "$(http GET "$n" "/Poll/getMessages?user_id=$u&sig=")" "403 -" "$n: unsigned poll"
    forged=$(signed "/Poll/getMessages?user_id=$((u + 1))")
    expect "$(http GET "$n" "/Poll/getMessages?user_id=$u&${forged#*\?user_id=$((u + 1))&}")" "403 -" \
        "$n: another user's signature"
    # POST through the fallback with its body intact (the app echoes the body's length and hash).
    u=$((u + 10000))
    printf 'fleet-post-body-%s' "$n" > "$RUN/post"
    want=$(sha256sum < "$RUN/post" | cut -d' ' -f1)
    expect "$(http POST "$n" "/Poll/getMessages?user_id=$u" --data-binary "@$RUN/post")" "200 app" "$n: POST miss"
    got=$(tr -d '\r' < "$RUN/headers" | awk -F': ' 'tolower($1)=="x-request-body-sha256"{print $2}')
    expect "$got" "$want" "$n: POST body reached the app intact"
done
say "miss -> fallback -> hit, and a POST through the fallback: ok on ${POLLERS[*]}"

# Long polls through the edge. The rendered config first: the [server] long-poll keys,
# [poll] and [announce] (the fleet's Redis, with the memcached backend) in fp-poll1's ini, and
# nginx's held-poll read timeout from the same max_wait (30 + 10 s).
on fp-poll1 bash -s "${IP[fp-data1]}" <<'EOF' || die "fp-poll1: long-poll config check failed"
set -euo pipefail
ini=/etc/fastpoll/fastpoll.ini
sect() { awk -v s="[$1]" '$0 == s {f=1; next} /^\[/ {f=0} f && /^[a-z_]+ = / {print}' "$ini" | tr '\n' ';'; }
want="max_held = 16000;recheck_ms = 2000;recheck_subscribed_ms = 10000;"
[[ "$(sect server)" == *"$want" ]] || { echo "[server] is '$(sect server)', want it to end in '$want'"; exit 1; }
want="interval_ms = 1000;fallback_interval_ms = 3000;jitter_pct = 20;max_wait = 30;"
[ "$(sect poll)" = "$want" ] || { echo "[poll] is '$(sect poll)', want '$want'"; exit 1; }
want="server = $1:6379;password_file = /etc/fastpoll/redis.pass;username = fastpoll;channel = fastpoll:announce;"
[ "$(sect announce)" = "$want" ] || { echo "[announce] is '$(sect announce)', want '$want'"; exit 1; }
t=$(awk '/location @poll_held/ {f=1} f && $1 == "proxy_read_timeout" {print $2; exit}' /etc/nginx/sites-enabled/fastpoll.conf)
[ "$t" = "40s;" ] || { echo "@poll_held proxy_read_timeout is '$t', want 40s"; exit 1; }
# Every instance subscribed to the announcements (within 10 s).
for admin in 9101 9102; do
    for _ in $(seq 1 20); do
        curl -fsS "http://127.0.0.1:$admin/metrics" | grep -qx 'fastpoll_announce_subscribed 1' && continue 2
        sleep 0.5
    done
    echo "admin $admin: not subscribed to the announcements"; exit 1
done
EOF
# Then, through fp-poll1's nginx: a poll with the current ETag and no wait gets 304; with wait=20
# it is held until a publish through the app wakes it, by its announcement (not the re-check),
# and its answer (200 from the cache, the new message, a new ETag) arrives within 1 s of the
# publish's answer.
lp_user=$((RANDOM % 9000 + 50000))
expect "$(publish fp-data1 "$lp_user" "before the hold")" 201 "long poll: first publish"
lp_path=$(signed "/Poll/getMessages?user_id=$lp_user")
ann_before=$(wakeups announcement)
assert_route "${IP[fp-poll1]}"
assert_route "${IP[fp-data1]}"
lp=$("$REPO/.venv/bin/python" - "${IP[fp-poll1]}" "$lp_path" "${IP[fp-data1]}:8000" "$RUN/api.token" "$lp_user" <<'PY'
import http.client
import json
import sys
import threading
import time

edge, path, app, token_file, user = sys.argv[1:6]
with open(token_file) as f:
    token = f.read().strip()


def fail(msg: str) -> None:
    print(msg)
    sys.exit(1)


def get(target: str, headers: dict[str, str], timeout: float) -> tuple[int, str, str, bytes]:
    c = http.client.HTTPConnection(edge, timeout=timeout)
    c.request("GET", target, headers=headers)
    r = c.getresponse()
    body = r.read()
    c.close()
    return r.status, r.getheader("ETag") or "", r.getheader("X-Poll-Source") or "", body


status, tag, src, _ = get(path, {}, 10)
if (status, src) != (200, "cache") or not tag:
    fail(f"first poll: {status} {src} ETag {tag!r}, want 200 cache with an ETag")
status, tag2, src, body = get(path, {"If-None-Match": tag}, 10)
if status != 304 or body or tag2 != tag:
    fail(f"poll with the current ETag: {status} ETag {tag2!r}, {len(body)} bytes; want 304, {tag}, no body")
held: dict[str, object] = {}


def hold() -> None:
    try:
        held["answer"] = get(path + "&wait=20", {"If-None-Match": tag}, 25)
    except OSError as exc:
        held["answer"] = exc
    held["at"] = time.monotonic()


t = threading.Thread(target=hold)
t.start()
time.sleep(1.0)
if "answer" in held:
    fail(f"the wait=20 poll was answered before any publish (not held): {held['answer']!r}")
c = http.client.HTTPConnection(app, timeout=10)
sent = time.monotonic()
c.request("POST", "/api/messages", body=json.dumps({"user_id": int(user), "text": "wakes the hold"}),
          headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
pub = c.getresponse()
pub.read()
published = time.monotonic()
if pub.status != 201:
    fail(f"publish: {pub.status}")
t.join(25)
answer = held.get("answer")
at = held.get("at")
if not isinstance(answer, tuple) or not isinstance(at, float):
    fail(f"held poll: {answer!r}")
status, tag3, src, body = answer
if (status, src) != (200, "cache") or b"wakes the hold" not in body or not tag3 or tag3 == tag:
    fail(f"held poll woke with {status} {src} ETag {tag3!r} (was {tag}): {body[:200]!r}")
if at - published > 1.0:
    fail(f"held poll answered {at - published:.3f} s after the publish's answer (want <= 1 s)")
print(f"{(at - sent) * 1000:.0f} ms after the publish was sent ({(published - sent) * 1000:.0f} ms to its answer)")
PY
) || die "long poll through fp-poll1's nginx: $lp"
ann_after=$(wakeups announcement)
[ "$ann_after" -gt "$ann_before" ] \
    || die "long poll: answered, but not woken by an announcement (announcement wake-ups $ann_before -> $ann_after)"
say "long poll via fp-poll1's nginx: the current ETag gets 304; wait=20 held, woken by the announcement, answered $lp"

# ---- 7. instances under systemd ---------------------------------------------------------------
check_instances 2

# fp-solo, the one-host layout: one instance per vCPU, everything on loopback behind nginx.
u=$((RANDOM % 9000 + 60000))
expect "$(publish fp-solo "$u" "hello solo")" 201 "fp-solo: publish"
expect "$(http GET fp-solo "/Poll/getMessages?user_id=$u")" "200 cache" "fp-solo: hit after publish"
expect "$(http GET fp-solo "/Poll/getMessages?user_id=$((u + 1))")" "200 app" "fp-solo: miss"
expect "$(http GET fp-solo "/Poll/getMessages?user_id=$((u + 1))")" "200 cache" "fp-solo: hit after the fill"
check_instances "$(on fp-solo nproc --all)" fp-solo
# fp-solo's plain HTTP (nginx_http_mode: redirect, the default): a 301 to the same target over
# https, except the load balancer's GET /healthz.
assert_route "${IP[fp-solo]}"
path=$(signed "/Poll/getMessages?user_id=$u")
v=$(curl -sS -m 10 -o /dev/null -w '%{http_code} %{redirect_url}' "http://${IP[fp-solo]}$path") || die "fp-solo: plain HTTP request failed"
expect "$v" "301 https://${IP[fp-solo]}$path" "fp-solo: plain HTTP poll (redirect mode)"
v=$(curl -sS -m 10 -o /dev/null -w '%{http_code}' "http://${IP[fp-solo]}/healthz") || die "fp-solo: plain /healthz failed"
expect "$v" 200 "fp-solo: plain HTTP /healthz (redirect mode)"
phase "request path and instances checked (fleet and fp-solo); fp-solo redirects plain HTTP to https"
}

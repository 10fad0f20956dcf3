# shellcheck shell=bash
# The fleet test's app-hosts scenario: two app hosts on PostgreSQL; one stops under fresh-user
# misses: 0 errors. Sourced by tests/fleet/run.sh (which runs sc_app_hosts as the row app-hosts); it
# uses lib.sh's helpers and the variables of the run.

sc_app_hosts() {
# ---- 11. two app hosts on PostgreSQL ------------------------------------------------------------
u=$((RANDOM % 9000 + 70000))
expect "$(publish fp-data1 "$u" "hello from app1")" 201 "publish through fp-data1"
assert_route "${IP[fp-app2]}"
body=$(curl -sS -m 10 "http://${IP[fp-app2]}:8000$(poll_url fp-app2 "$u")") || die "poll through fp-app2 failed"
case "$body" in *"hello from app1"*) ;; *) die "fp-app2 does not see fp-data1's message: $body";; esac
# One app host stops under load: misses of fresh users (each one goes to an app) through a poller.
# 3,000 fresh users (more than the run polls), signed in one go.
"$REPO/.venv/bin/python" - "$RUN/signing.key" "$((u + 1000))" > "$RUN/miss-urls" <<'PY'
import sys, time
from fastpoll_app.keys import derive_key
from fastpoll_app.signing import load_secrets, signed_query
secret = load_secrets(sys.argv[1])[0]
for uid in range(int(sys.argv[2]), int(sys.argv[2]) + 3000):
    target = b"/Poll/getMessages?user_id=%d" % uid
    q = signed_query(secret, derive_key(b"/Poll", target[len(b"/Poll"):], [b"user_id"]), int(time.time()) + 3600)
    print((target + b"&" + q).decode())
PY
printf '%s\n' "local urls = {}" "for l in io.lines(\"$RUN/miss-urls\") do table.insert(urls, l) end" "local i = 0" \
    "request = function() i = i + 1; return wrk.format(\"GET\", urls[(i % #urls) + 1]) end" > "$RUN/miss.lua"
assert_route "${IP[fp-poll1]}"
( sleep 1; on fp-app2 systemctl stop fastpoll-app ) &
stopper=$!
wrk -t1 -c8 -d6s --timeout 5s -s "$RUN/miss.lua" "http://${IP[fp-poll1]}" > "$RUN/wrk-app.txt" 2>&1 || die "wrk failed"
wait "$stopper"
if grep -q "Socket errors\|Non-2xx" "$RUN/wrk-app.txt"; then cat "$RUN/wrk-app.txt"; die "requests failed while fp-app2 stopped"; fi
reqs=$(awk '/requests in/{print $1}' "$RUN/wrk-app.txt")
on fp-app2 systemctl start fastpoll-app
app_up
phase "two app hosts on PostgreSQL: published through one, seen by the other; $reqs requests while one stopped, 0 failed"
}

# shellcheck shell=bash disable=SC2154  # run_no: lib.sh's count of playbook runs
# The fleet test's membership scenario: a memcached node added through the three-step rollout under
# tests/fleet/membership_check.py: 0 stale answers, 0 failed polls. Sourced by tests/fleet/run.sh
# (which runs sc_membership as the row membership); it uses lib.sh's helpers and the variables of
# the run.

# mc_step TEXT: the membership drill's step, which membership_check.py reads with every poll and
# keeps with any violation.
mc_step() { printf '%s\n' "$1" > "$RUN/mc-step.tmp" && mv "$RUN/mc-step.tmp" "$RUN/mc-step"; }
# step_watch STEP LOG: every 0.5 s, STEP with the play or task LOG is at and its last host result,
# until $RUN/mc-watch-stop exists. Stopped by that file, not killed: a killed watcher's mv could
# outlive it and take the next step's temporary file.
step_watch() {
    local task host
    for _ in $(seq 1 3600); do
        kill -0 "$$" 2>/dev/null || return 0
        [ -e "$RUN/mc-watch-stop" ] && return 0
        task=$(grep -E '^(PLAY|TASK|RUNNING HANDLER) \[' "$2" 2>/dev/null | tail -1) || true
        host=$(grep -E '^(ok|changed|skipping|fatal|failed): \[' "$2" 2>/dev/null | tail -1 | cut -c1-60) || true
        mc_step "$1 | ${task%% \**} | $host" 2>/dev/null || return 0
        sleep 0.5
    done
}
# mc_playbook STEP LABEL [args...]: playbook LABEL [args...] with the step file following it.
mc_playbook() {
    local step=$1 label=$2 w; shift 2
    rm -f "$RUN/mc-watch-stop"
    step_watch "$step" "$LOGS/ansible-$((run_no + 1))-$label.log" &
    w=$!
    playbook "$label" "$@"
    touch "$RUN/mc-watch-stop"
    wait "$w" 2>/dev/null || true
    mc_step "$step: done"
}

sc_membership() {
# ---- 11b. a memcached node added through the rollout, under a consistency checker -------------------
# docs/deploy.md, "Adding or removing a memcached node": (a) the new node and the app hosts, which
# write both placements (previous_servers = the old list), then the joining node emptied
# (site.yml's join play, once every app host writes both); (b) the pollers, one instance at a
# time; (c) once every poller runs the new list, previous_servers dropped on the app hosts.
# Meanwhile tests/fleet/membership_check.py publishes through the app hosts and polls through both
# pollers: 0 stale answers and 0 failed polls, the evidence of any violation kept; it reports the
# hit ratio. (a) runs as two limited runs, one app host each, so the test holds the moment between
# them: a probe user whose key moves to the new node is published through the switched app host
# (both placements) and then through the other one (the old placement only), which leaves the new
# node an older answer than the old one. Unless that node is emptied before (b), the pollers
# serve the older answer once they read the new list.
old_servers=$(ini_list fp-poll1 servers)
expect "$old_servers" "${IP[fp-data1]}:11211,${IP[fp-poll2]}:11211" "memcached list before the change"
prev_json="{\"fastpoll_memcached_previous_servers\": [\"${old_servers//,/\", \"}\"]}"
new_servers="${IP[fp-data1]}:11211,${IP[fp-db1]}:11211,${IP[fp-poll2]}:11211"
mc_u=$((RANDOM % 600 + 96000))
# The probe: a user (not one of the checker's) whose key moves to fp-db1 on the new list.
probe_u=$("$REPO/.venv/bin/python" - "$old_servers" "$new_servers" "${IP[fp-db1]}:11211" <<'PY'
import sys
from fastpoll_app.cache import Placement
from fastpoll_app.keys import derive_key
old, new = Placement(sys.argv[1].split(","), 0), Placement(sys.argv[2].split(","), 0)
for u in range(97000, 98000):
    k = derive_key(b"/Poll", b"/getMessages?user_id=%d" % u, [b"user_id"])
    if new.nodes(k) == (sys.argv[3],) and sys.argv[3] not in old.nodes(k):
        print(u)
        break
PY
)
[ -n "$probe_u" ] || die "no probe user moves to fp-db1"
expect "$(publish fp-data1 "$probe_u" "probe 1")" 201 "probe: publish before the change"
rm -f "$RUN/mc-stop"
mc_step "before (a)"
assert_all_routes
"$REPO/.venv/bin/python" "$HERE/membership_check.py" "$RUN/signing.key" "$RUN/api.token" \
    "${IP[fp-data1]},${IP[fp-app2]}" "${IP[fp-poll1]},${IP[fp-poll2]}" "$mc_u" 300 "$RUN/mc-stop" "$RUN/mc.json" \
    "$RUN/mc-step" > "$LOGS/membership-check.log" 2>&1 &
mc_pid=$!
# Every user published once (cached on the old placement) before the change starts.
for _ in $(seq 1 120); do [ -e "$RUN/mc.json.ready" ] && break; kill -0 "$mc_pid" 2>/dev/null || break; sleep 0.5; done
[ -e "$RUN/mc.json.ready" ] || { cat "$LOGS/membership-check.log"; die "the consistency checker did not get ready"; }
sleep 2
# fp-db1 joins the memcached group (sorted by name: fp-data1, fp-db1, fp-poll2).
python3 - "$RUN/inventory.yml" <<'PY' || die "could not add fp-db1 to the memcached group"
import sys
p, old = sys.argv[1], "    memcached:\n      hosts:\n"
t = open(p).read()
if t.count(old) != 1:
    sys.exit(1)
open(p, "w").write(t.replace(old, old + "        fp-db1:\n"))
PY
mc_playbook "(a) fp-db1 and fp-data1" mc-a1-data1 --limit 'fp-db1:fp-data1' --tags config,memcached,app -e "$prev_json"
grep -q 'Empty the joining node.*' "$LAST_LOG" && grep -A1 'Empty the joining node' "$LAST_LOG" | grep -q '^changed:' \
    && die "(a) emptied fp-db1 before every app host wrote both placements"
expect "$(ini_list fp-data1 servers)" "$new_servers" "fp-data1: servers in (a)"
expect "$(ini_list fp-app2 servers)" "$old_servers" "fp-app2: servers before its turn in (a)"
mc_step "(a) between the app hosts: fp-data1 writes both placements, fp-app2 the old one"
expect "$(publish fp-data1 "$probe_u" "probe 2")" 201 "probe: publish through the switched app host"
expect "$(publish fp-app2 "$probe_u" "probe 3")" 201 "probe: publish through the app host not yet switched"
mc_playbook "(a) fp-db1 and fp-app2" mc-a2-app2 --limit 'fp-db1:fp-app2' --tags config,memcached,app -e "$prev_json"
grep -A1 'Empty the joining node' "$LAST_LOG" | grep -q '^changed: \[fp-db1\]' \
    || die "(a) did not empty fp-db1 once every app host wrote both placements"
mc_step "(a) done: checks"
for n in "${APPS[@]}"; do
    expect "$(ini_list "$n" servers)" "$new_servers" "$n: servers in (a)"
    expect "$(ini_list "$n" previous_servers)" "$old_servers" "$n: previous_servers in (a)"
done
expect "$(ini_list fp-poll1 servers)" "$old_servers" "fp-poll1: servers in (a)"
mc_playbook "(b) pollers" mc-b-pollers --limit pollers --tags config,pollers
mc_step "(b) done: checks"
for n in "${POLLERS[@]}"; do
    out=$(on "$n" /usr/local/libexec/fastpoll-stale --config /etc/fastpoll/fastpoll.ini \
        fastpoll-poller@8101.service=http://127.0.0.1:9101/metrics fastpoll-poller@8102.service=http://127.0.0.1:9102/metrics)
    if echo "$out" | grep -qv ' ok$'; then die "$n: a poller does not run the new list: $out"; fi
    expect "$(ini_list "$n" servers)" "$new_servers" "$n: servers in (b)"
    up=$(on "$n" curl -fsS http://127.0.0.1:9101/metrics | grep -c '^fastpoll_backend_up{.* 1$' || true)
    expect "$up" 3 "$n: memcached nodes up on instance 8101 after (b)"
    # The probe, through each instance in turn (nginx spreads them): probe 3, never probe 2.
    for _ in 1 2 3 4; do
        expect "$(http GET "$n" "/Poll/getMessages?user_id=$probe_u" | cut -d' ' -f1)" 200 "$n: probe poll"
        grep -q '"probe 3"' "$RUN/body" || die "$n: the probe user's answer after (b) is older than its last publish (probe 3): $(cat "$RUN/body"); fp-db1 holds: $(on fp-poll1 bash -s "${IP[fp-db1]}" "$probe_u" <<'EOF'
exec 3<>"/dev/tcp/$1/11211"; printf 'get /Poll/getMessages?user_id=%s\r\n' "$2" >&3; timeout 2 head -c 400 <&3 | tr '\r\n' '  '
EOF
)"
    done
done
mc_playbook "(c) previous_servers dropped" mc-c-drop --limit app --tags config,app
mc_step "(c) done"
for n in "${APPS[@]}"; do
    if on "$n" grep -q '^previous_servers' /etc/fastpoll/fastpoll.ini; then die "$n: previous_servers left after (c)"; fi
done
sleep 3
touch "$RUN/mc-stop"
wait "$mc_pid" || { cat "$LOGS/membership-check.log"; die "the consistency checker failed"; }
cp "$RUN/mc.json" "$LOGS/membership-check.json"
read -r mc_polls mc_failed mc_stale mc_pub mc_ratio mc_min mc_under <<<"$("$REPO/.venv/bin/python" -c '
import json, sys
r = json.load(open(sys.argv[1])); c = r["counts"]
print(c.get("polls", 0), c.get("failed", 0), c.get("stale", 0), c.get("publishes", 0), r["hit_ratio"], r["hit_ratio_min_per_2s"], r["buckets_under_95pct"])
' "$RUN/mc.json")"
if [ "$mc_stale" != 0 ] || [ "$mc_failed" != 0 ]; then
    # The evidence: which instance answered is in the pollers' access logs (ua=), flushed every
    # second here (fastpoll_access_log_flush_seconds).
    sleep 2
    for n in "${POLLERS[@]}"; do
        on "$n" cat "/var/log/nginx/fastpoll.access.log" > "$LOGS/access-$n.log" 2>/dev/null || true
    done
    "$REPO/.venv/bin/python" "$HERE/membership_check.py" --annotate "$LOGS/membership-check.json" \
        "${IP[fp-poll1]}=$LOGS/access-fp-poll1.log" "${IP[fp-poll2]}=$LOGS/access-fp-poll2.log" \
        >> "$LOGS/membership-check.log" 2>&1 || true
    "$REPO/.venv/bin/python" -c 'import json, sys; r = json.load(open(sys.argv[1])); print(json.dumps({k: r[k] for k in ("counts", "violations", "publish_retries")}, indent=1))' \
        "$LOGS/membership-check.json" || cat "$LOGS/membership-check.json"
    die "membership change: $mc_stale stale answers, $mc_failed failed polls (evidence above and in $LOGS/membership-check.json; ansible step times in $LOGS/ansible-timed.log)"
fi
[ "$mc_polls" -ge 500 ] || die "the consistency checker made only $mc_polls polls"
phase "memcached node added (fp-db1) through the rollout: $mc_polls polls and $mc_pub publishes, 0 stale, 0 failed; hit ratio $mc_ratio (lowest 2 s: $mc_min, $mc_under buckets under 95%); the probe moved to fp-db1 answered with its last publish"
}

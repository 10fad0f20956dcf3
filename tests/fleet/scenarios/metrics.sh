# shellcheck shell=bash disable=SC2154  # seed_user: set by run.sh
# The fleet test's metrics scenario: the admin listeners and stub_status on loopback only, the
# status command, fastpoll_backend_up following a memcached node. Sourced by tests/fleet/run.sh
# (which runs sc_metrics as the row metrics); it uses lib.sh's helpers and the variables of the run.

sc_metrics() {
# Metrics: every instance's admin listener and nginx's stub_status answer on the host's loopback,
# and nothing of them is reachable from another host.
for n in "${POLLERS[@]}"; do
    on "$n" bash -s "${IP[fp-data1]}" <<'EOF' || die "$n: metrics check failed"
set -euo pipefail
for admin in 9101 9102; do
    [ "$(curl -fsS "http://127.0.0.1:$admin/healthz")" = ok ] || { echo "admin $admin: /healthz not ok"; exit 1; }
    m=$(curl -fsS "http://127.0.0.1:$admin/metrics")
    echo "$m" | grep -q '^fastpoll_build_info' || { echo "admin $admin: no fastpoll_build_info"; exit 1; }
    up=$(echo "$m" | grep '^fastpoll_backend_up{' || true)
    [ "$(echo "$up" | grep -c ' 1$')" = 2 ] || { echo "admin $admin: backends not all up: $up"; exit 1; }
done
curl -fsS http://127.0.0.1:8090/nginx_status | grep -q '^Active connections' || { echo "no stub_status"; exit 1; }
EOF
    for port in 9101 8090; do
        assert_route "${IP[$n]}"
        rc=0; curl -sS -m 3 -o /dev/null "http://${IP[$n]}:$port/" 2>/dev/null || rc=$?
        # Refused (loopback listener) or dropped (the host firewall): never an answer.
        [ "$rc" = 7 ] || [ "$rc" = 28 ] || die "$n:$port answered (curl rc $rc) from another host; want no connection"
    done
    expect "$(http GET "$n" /metrics | cut -d' ' -f1)" 404 "$n: /metrics through the public server"
done
# The status command (testkit/fastpoll_testkit/status.py) reads each host's endpoints.json over ssh.
if [ -f "$REPO/testkit/fastpoll_testkit/status.py" ]; then
    assert_all_routes
    via="ssh -i $RUN/id_ed25519 -o UserKnownHostsFile=$RUN/known_hosts -o StrictHostKeyChecking=yes"
    via="$via -o BatchMode=yes -o ConnectTimeout=5 -o LogLevel=ERROR root@{host} python3 -"
    python3 "$REPO/testkit/fastpoll_testkit/status.py" --hosts "${IP[fp-poll1]},${IP[fp-poll2]},${IP[fp-data1]},${IP[fp-app2]},${IP[fp-solo]}" \
        --via "$via" > "$LOGS/status.txt" 2>&1 || { cat "$LOGS/status.txt"; die "the status command says not all up"; }
    say "status command: $(tail -1 "$LOGS/status.txt") on 5 hosts"
fi
# A memcached node going down shows on every instance's metrics, and comes back.
# expect_backend_up WANT TRIES WHAT: every poller's fastpoll_backend_up for fp-data1's memcached
# reaches WANT within TRIES half-second polls.
expect_backend_up() {
    local n v
    for n in "${POLLERS[@]}"; do
        for _ in $(seq 1 "$2"); do
            v=$(on "$n" curl -fsS http://127.0.0.1:9101/metrics | awk -v s="${IP[fp-data1]}:11211" 'index($0, "fastpoll_backend_up{") == 1 && index($0, s) {print $NF}')
            [ "$v" = "$1" ] && break; sleep 0.5
        done
        expect "$v" "$1" "$n: fastpoll_backend_up $3"
    done
}
on fp-data1 systemctl stop memcached
expect_backend_up 0 20 "of the stopped memcached"
on fp-data1 systemctl start memcached
expect_backend_up 1 40 "after memcached is back"
# The restart emptied that node: publish again so the seeded key is a hit wherever it lives.
# The app's client may still hold the node as failed for a moment (its publish is then
# "pending" and repaired later, and a miss fills it): poll until the answer comes from the cache.
expect "$(publish fp-app2 "$seed_user" "hello again")" 201 "publish again"
for _ in $(seq 1 40); do
    got=$(http GET fp-poll1 "/Poll/getMessages?user_id=$seed_user")
    [ "$got" = "200 cache" ] && break; sleep 0.5
done
expect "$got" "200 cache" "hit within 20 s after memcached came back"
phase "metrics: admin /healthz and /metrics per instance, stub_status, loopback only; backend_up follows memcached"
}

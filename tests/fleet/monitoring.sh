# shellcheck shell=bash
# Monitoring checks of the fleet test (issue 14), sourced by tests/fleet/run.sh after the deploy,
# which then calls fleet_monitoring_checks. It uses run.sh's helpers (on, assert_route, expect,
# say, die) and arrays (IP, FLEET, POLLERS, APPS), and the inventory settings run.sh gives the
# fleet for this: fastpoll_prometheus_clients (the control node may query Prometheus), a 2 s scrape
# and evaluation interval, and PollerDown's `for` at 10 s (monitoring_alert_for).
#
#   1. Prometheus on fp-mon1 answers on its private address, and every target of every job is up:
#      each poll server instance (through its relay), the apps, node_exporter on every fleet host,
#      nginx exporter and mtail on the pollers, the Redis and PostgreSQL exporters.
#   2. The poll servers' admin listeners are still loopback-only; what Prometheus scrapes (the
#      relays, the exporters) answers fp-mon1 and nobody else: not the control node, not another
#      fleet host (the host firewall).
#   3. The data is real: the edge SLI counts polls on both pollers, memcached's stats arrive through
#      node_exporter, Redis and PostgreSQL are up.
#   4. One poll server instance stopped: PollerDown fires within its `for` window (not before it),
#      and clears after the instance is started again.

MON_HOST=fp-mon1
MON_PORT=9090

# prom_api PATH [curl args]: GET Prometheus's HTTP API from the control node, on the test network.
prom_api() {
    local path=$1; shift
    assert_route "${IP[$MON_HOST]}"
    curl -sS -m 10 -G "$@" "http://${IP[$MON_HOST]}:$MON_PORT$path"
}

# prom_query EXPR: the instant vector, one line per series: "label=value,... value".
prom_query() {
    prom_api /api/v1/query --data-urlencode "query=$1" | python3 -c '
import json, sys
d = json.load(sys.stdin)
if d.get("status") != "success":
    sys.exit("query failed: %s" % d)
for r in d["data"]["result"]:
    labels = ",".join("%s=%s" % kv for kv in sorted(r["metric"].items()))
    print(labels, r["value"][1])
'
}

# The targets as "job host poller health" lines, and how many there are.
prom_targets() {
    prom_api /api/v1/targets --data-urlencode state=active | python3 -c '
import json, sys
for t in json.load(sys.stdin)["data"]["activeTargets"]:
    l = t["labels"]
    print(l.get("job"), l.get("host", "-"), l.get("poller", "-"), t["health"], t["scrapeUrl"], (t.get("lastError") or "").replace(" ", "_"))
' | sort
}

# no_answer FROM ADDR PORT: FROM (a fleet host, or "control") gets no HTTP answer from ADDR:PORT.
no_answer() {
    local from=$1 addr=$2 port=$3 rc=0
    if [ "$from" = control ]; then
        assert_route "$addr"
        curl -sS -m 2 -o /dev/null "http://$addr:$port/metrics" 2>/dev/null || rc=$?
    else
        on "$from" "curl -sS -m 2 -o /dev/null http://$addr:$port/metrics" 2>/dev/null || rc=$?
    fi
    # 7: refused, 28: no answer in time (dropped by the firewall). Anything else answered.
    [ "$rc" = 7 ] || [ "$rc" = 28 ] || die "$from reached $addr:$port (curl rc $rc); want no connection"
}

fleet_monitoring_checks() {
    local t n port want got i line fired since stop_at for_s

    # ---- 1. every target up ------------------------------------------------------------------
    # 6 node (every fleet host), 4 poll server instances, 2 nginx, 2 mtail, 2 apps, redis,
    # postgres, Prometheus itself and its Alertmanager.
    want=20
    for i in $(seq 1 60); do
        prom_targets > "$RUN/targets.txt" || true
        got=$(grep -c ' up ' "$RUN/targets.txt" || true)
        [ "$got" = "$want" ] && [ "$(wc -l < "$RUN/targets.txt")" = "$want" ] && break
        sleep 1
    done
    cp "$RUN/targets.txt" "$LOGS/monitoring-targets.txt"
    [ "$got" = "$want" ] && [ "$(wc -l < "$RUN/targets.txt")" = "$want" ] \
        || { cat "$RUN/targets.txt"; die "Prometheus: $got of $(wc -l < "$RUN/targets.txt") targets up, want $want all up"; }
    for n in "${FLEET[@]}"; do
        grep -q "^node $n - up " "$RUN/targets.txt" || die "no node_exporter target up for $n"
    done
    for n in "${POLLERS[@]}"; do
        for port in 8101 8102; do
            grep -q "^fastpoll_poller $n $port up " "$RUN/targets.txt" || die "poll server $n:$port is not an up target"
        done
        for t in nginx mtail; do grep -q "^$t $n - up " "$RUN/targets.txt" || die "no $t target up for $n"; done
    done
    for n in "${APPS[@]}"; do grep -q "^fastpoll_app $n - up " "$RUN/targets.txt" || die "app $n is not an up target"; done
    grep -q '^redis fp-data1 - up ' "$RUN/targets.txt" || die "no redis exporter target up"
    grep -q '^postgres fp-db1 - up ' "$RUN/targets.txt" || die "no postgres exporter target up"
    grep -q '^alertmanager .* up ' "$RUN/targets.txt" || die "no Alertmanager target (role alertmanager)"
    say "Prometheus on $MON_HOST: all $want targets up"

    # ---- 2. who reaches what -----------------------------------------------------------------
    for n in "${POLLERS[@]}"; do
        # The relay serves the instance's metrics to the monitoring host...
        on "$MON_HOST" "curl -fsS -m 5 http://${IP[$n]}:9201/metrics" | grep -q '^fastpoll_build_info' \
            || die "$MON_HOST cannot read $n's poll server metrics through its relay"
        # ...and nothing it scrapes answers the control node or a host outside the monitoring group.
        for port in 9201 9100 9113 3903; do
            no_answer control "${IP[$n]}" "$port"
        done
        no_answer fp-data1 "${IP[$n]}" 9201
        # The admin listener itself stays on loopback (run.sh checks it from the control node too).
        no_answer "$MON_HOST" "${IP[$n]}" 9101
    done
    no_answer control "${IP[fp-data1]}" 9121
    no_answer fp-poll1 "${IP[fp-db1]}" 9187
    say "relays and exporters: reachable from $MON_HOST only; admin listeners on loopback"

    # ---- 3. the data is there -----------------------------------------------------------------
    got=$(prom_query 'sum by (host) (fastpoll_edge_requests_total{route="poll"}) > 0' | wc -l)
    expect "$got" "${#POLLERS[@]}" "pollers whose edge SLI (mtail) counted polls"
    got=$(prom_query 'memcached_up == 1' | wc -l)
    expect "$got" 2 "memcached nodes up in their stats (textfile collector)"
    expect "$(prom_query 'redis_up' | awk '{print $NF}')" 1 "redis_up"
    expect "$(prom_query 'pg_up' | awk '{print $NF}')" 1 "pg_up"
    expect "$(prom_query 'count(fastpoll_app_repair_pending)' | awk '{print $NF}')" "${#APPS[@]}" "apps reporting the outbox backlog"

    # ---- 4. PollerDown -----------------------------------------------------------------------
    for_s=$(prom_api /api/v1/rules --data-urlencode type=alert | python3 -c '
import json, sys
for g in json.load(sys.stdin)["data"]["groups"]:
    for r in g["rules"]:
        if r["name"] == "PollerDown":
            print(int(r["duration"]))
')
    [ -n "$for_s" ] || die "Prometheus has no PollerDown rule"
    [ -z "$(prom_query 'ALERTS{alertname=~"PollerDown|PollerHostDown"}')" ] || die "PollerDown already pending or firing"
    on fp-poll1 systemctl stop fastpoll-poller@8102.service
    stop_at=$(date +%s)
    fired=""
    # The alert may take `for` + a scrape + an evaluation (2 s each) + the scrape timeout.
    for i in $(seq 1 $(( (for_s + 20) * 2 ))); do
        line=$(prom_query 'ALERTS{alertname="PollerDown",alertstate="firing"}')
        if [ -n "$line" ]; then fired=$line; break; fi
        sleep 0.5
    done
    since=$(( $(date +%s) - stop_at ))
    on fp-poll1 systemctl start fastpoll-poller@8102.service
    [ -n "$fired" ] || die "PollerDown did not fire within $((for_s + 20)) s of stopping fp-poll1:8102"
    case "$fired" in *host=fp-poll1*poller=8102*) ;; *) die "PollerDown fired for the wrong instance: $fired";; esac
    [ "$since" -ge "$for_s" ] || die "PollerDown fired after $since s, before its for window ($for_s s)"
    [ -z "$(prom_query 'ALERTS{alertname="PollerHostDown"}')" ] || die "PollerHostDown fired with one instance of two down"
    say "PollerDown fired $since s after fp-poll1:8102 stopped (for: ${for_s}s)"
    for i in $(seq 1 60); do
        [ -z "$(prom_query 'ALERTS{alertname="PollerDown"}')" ] && break
        sleep 0.5
    done
    [ -z "$(prom_query 'ALERTS{alertname="PollerDown"}')" ] || die "PollerDown still active 30 s after the instance came back"
    expect "$(prom_query 'up{job="fastpoll_poller",host="fp-poll1",poller="8102"}' | awk '{print $NF}')" 1 "fp-poll1:8102 up again"
    say "PollerDown cleared after the restart"
}

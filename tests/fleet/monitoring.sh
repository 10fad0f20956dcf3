# shellcheck shell=bash disable=SC2154  # seed_user: set by run.sh
# Monitoring checks of the fleet test, sourced by tests/fleet/run.sh after the deploy,
# which then calls fleet_monitoring_checks. It uses lib.sh's helpers (on, assert_route, expect,
# say, die) and arrays (IP, FLEET, POLLERS, APPS), and the inventory settings lib.sh gives the
# fleet for this: fastpoll_prometheus_clients (the control node may query Prometheus), a 2 s scrape
# and evaluation interval (scenarios/monitoring.sh's sc_monitoring plays the monitoring hosts with it first; the
# inventory's 10 s holds until then), and PollerDown's `for` at 10 s (monitoring_alert_for).
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
#   5. Paging drills (docs/operations.md, "Alerting"), against a webhook receiver on the
#      control node (fastpoll_testkit.webhook, on the bridge address; lib.sh's inventory points
#      Alertmanager's page and ticket webhooks at it, runs the SLO rules 30 times faster,
#      monitoring_slo_time_divisor, and shortens the cache alerts' `for` and Alertmanager's
#      group_wait and group_interval), under plain poll load from the control node (ab):
#      a. a memcached node stopped while the fleet keeps replicas: the CacheServerDownCovered
#         ticket arrives, no page does (held until a page would have arrived), every poll 2xx;
#      b. a fleet-wide outage (every poll server instance and every app stopped: nginx answers 503
#         to every poll): exactly one page notification arrives, ErrorBudgetBurn
#         {slo="poll-availability"}, one alert without a host label, none repeated; the cause
#         alerts (PollerDown of each instance) are inhibited in Alertmanager and no ticket of
#         theirs goes out after the page; then everything is started again, polls are answered,
#         and the page's resolved notification arrives.
#      The test's certificate is made for 2 days (lib.sh), so CertificateExpiresSoon's page
#      (under 2 days, for 10 min) is silenced first, as an operator silences a known cause.

# MON_HOST, MON_PORT, prom_api and prom_query: lib.sh.

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

# ---- the paging drills' tools -------------------------------------------------------------------
AM_PORT=9093
# The receiver's record: one JSON line per notification (kept with the logs).
WEBHOOK_OUT=$LOGS/webhook-notifications.jsonl
WEBHOOK_PID=""

webhook() { "$REPO/.venv/bin/python" -m fastpoll_testkit.webhook "$@"; }
now() { date +%s.%N; }
# secs_since T: seconds (one decimal) from T to now.
secs_since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }

# webhook_start: the receiver on the address the inventory's alertmanager_page_webhook_url names
# (the bridge address, a port lib.sh's inventory_head picked), until webhook_stop or the end of this run. Then
# fp-mon1 must reach it: its firewall (role firewall) filters inbound traffic only.
webhook_start() {
    local url listen i
    url=$(sed -n 's/^ *alertmanager_page_webhook_url: *//p' "$RUN/inventory.yml" | head -1)
    listen=${url#http://}; listen=${listen%%/*}
    [ "${listen%:*}" = "$BRIDGE_ADDR" ] \
        || die "alertmanager_page_webhook_url ('$url') is not a receiver on $BRIDGE_ADDR (lib.sh's inventory_head sets it)"
    rm -f "$RUN/webhook.pid" "$WEBHOOK_OUT"
    "$REPO/.venv/bin/python" -m fastpoll_testkit.webhook serve --listen "$listen" --out "$WEBHOOK_OUT" \
        --pid-file "$RUN/webhook.pid" --while-pid $$ --max-seconds 1800 2> "$LOGS/webhook.log" &
    WEBHOOK_PID=$!
    for i in $(seq 1 100); do
        [ -s "$RUN/webhook.pid" ] && break
        kill -0 "$WEBHOOK_PID" 2>/dev/null || { cat "$LOGS/webhook.log"; die "the webhook receiver exited"; }
        sleep 0.1
    done
    expect "$(cat "$RUN/webhook.pid" 2>/dev/null)" "$WEBHOOK_PID" "the webhook receiver's pid file (written once it listens)"
    on "$MON_HOST" "curl -fsS -m 5 -o /dev/null http://$listen/-/healthy" \
        || die "$MON_HOST cannot reach the webhook receiver on $listen"
}
webhook_stop() {
    [ -n "$WEBHOOK_PID" ] || return 0
    kill "$WEBHOOK_PID" 2>/dev/null || true
    wait "$WEBHOOK_PID" 2>/dev/null || true
    WEBHOOK_PID=""
}
# notes PATH STATUS SINCE [--alerts]: the receiver's notifications on PATH (/page, /ticket) with
# STATUS (firing, resolved) since SINCE, one line each: "time path status alerts names group".
notes() { webhook show "$WEBHOOK_OUT" --path "$1" --status "$2" --since "$3" "${@:4}"; }

# am_alerts: Alertmanager's alerts, one line each: "alertname severity state inhibited_by
# silenced_by labels" (state: active, suppressed; the counts of inhibiting alerts and silences).
am_alerts() {
    on "$MON_HOST" "curl -fsS -m 5 http://${IP[$MON_HOST]}:$AM_PORT/api/v2/alerts" | python3 -c '
import json, sys
for a in json.load(sys.stdin):
    l, s = a["labels"], a["status"]
    print(l.get("alertname"), l.get("severity", "-"), s["state"], len(s.get("inhibitedBy") or []),
          len(s.get("silencedBy") or []), ",".join("%s=%s" % kv for kv in sorted(l.items())))
'
}
# rule_for NAME: the `for` of alert rule NAME in Prometheus, in seconds (the first such rule).
rule_for() {
    prom_api /api/v1/rules --data-urlencode type=alert | python3 -c '
import json, sys
d = [int(r["duration"]) for g in json.load(sys.stdin)["data"]["groups"] for r in g["rules"] if r["name"] == sys.argv[1]]
print(d[0] if d else "")
' "$1"
}

# load_start TAG: plain polls through both pollers' nginx from the control node, rounds of
# `ab -n 200 -c 2` on the drill users' signed URLs (DRILL_URLS) until load_stop; each round's
# "time complete non-2xx failed" in $LOGS/load-TAG.txt.
load_start() {
    local tag=$1
    : > "$LOGS/load-$tag.txt"
    rm -f "$RUN/load.stop"
    (
        i=0
        while [ ! -e "$RUN/load.stop" ]; do
            n=${POLLERS[$((i % ${#POLLERS[@]}))]}
            url=${DRILL_URLS[$((i / ${#POLLERS[@]} % ${#DRILL_URLS[@]}))]}
            assert_route "${IP[$n]}"
            ab -q -n 200 -c 2 -s 5 "http://${IP[$n]}$url" > "$RUN/ab-load.txt" 2>&1 || true
            awk -v t="$(now)" '/^Complete requests:/ {c = $3} /^Failed requests:/ {f = $3}
                /^Non-2xx responses:/ {x = $3} END {print t, c + 0, x + 0, f + 0}' "$RUN/ab-load.txt" >> "$LOGS/load-$tag.txt"
            i=$((i + 1))
            sleep 0.1
        done
    ) &
    LOAD_PID=$!
}
# load_stop TAG: ends the load (not in a subshell: it waits for its own child); LOAD_POLLS,
# LOAD_BAD and LOAD_FAILED: complete, non-2xx and failed requests over its rounds.
load_stop() {
    touch "$RUN/load.stop"
    wait "$LOAD_PID" || die "the poll load ($1) stopped on an error"
    read -r LOAD_POLLS LOAD_BAD LOAD_FAILED < <(awk '{c += $2; x += $3; f += $4} END {print c + 0, x + 0, f + 0}' "$LOGS/load-$1.txt")
}

# before T LIMIT: true while fewer than LIMIT seconds have passed since T.
before() { awk -v a="$1" -v b="$(now)" -v l="$2" 'BEGIN { exit !(b - a < l) }'; }
# pages_out: the page alerts Alertmanager would notify now (active: neither silenced nor inhibited).
pages_out() { am_alerts | awk '$2 == "page" && $3 == "active"'; }
# no_page_yet SINCE WHAT: dies if a page notification arrived since SINCE, or Alertmanager holds
# a page it would send.
no_page_yet() {
    local got
    got=$(notes /page firing "$1")
    [ -z "$got" ] || die "$2: a page arrived: $(notes /page firing "$1" --alerts | tr '\n' ';')"
    got=$(pages_out)
    [ -z "$got" ] || die "$2: Alertmanager has a page to send: $got"
}

# Drill a: a memcached node lost while every key has a replica on another node.
drill_covered_node() {
    local servers replicas mc_host=fp-data1 server for_s hold_s t_stop ticket="" t_ticket
    servers=$(ini_list fp-poll1 servers)
    replicas=$(ini_list fp-poll1 replicas)
    server="${IP[$mc_host]}:11211"
    case ",$servers," in *",$server,"*) ;; *) die "$server is not in the pollers' memcached servers ($servers)";; esac
    # [memcached] replicas: 1, or unset with two servers or more (the default).
    if [ "$replicas" != 1 ] && { [ -n "$replicas" ] || [ "$(tr ',' '\n' <<<"$servers" | grep -c .)" -lt 2 ]; }; then
        die "the fleet keeps no memcached replicas (servers $servers, replicas '${replicas:-default}')"
    fi
    expect "$(prom_query 'fastpoll:cache_replicas' | awk '{print $NF}')" 1 "fastpoll:cache_replicas (monitoring_cache_replicas)"
    for_s=$(rule_for CacheServerUnreachable)
    [ -n "$for_s" ] && [ "$for_s" = "$(rule_for CacheServerDownCovered)" ] \
        || die "CacheServerUnreachable's for ($for_s s) differs from CacheServerDownCovered's"
    # Held down until a page would have arrived: the alert's for, a scrape and two evaluations
    # (2 s each), the group's wait (alertmanager_group_wait, 5 s) and a margin.
    hold_s=$((for_s + 6 + 5 + 3))

    load_start a
    sleep 3
    on "$mc_host" systemctl stop memcached
    t_stop=$(now)
    while before "$t_stop" $((hold_s + 40)); do
        no_page_yet "$t_stop" "memcached on $mc_host stopped (covered by replicas)"
        if [ -z "$ticket" ]; then
            ticket=$(notes /ticket firing "$t_stop" --alerts \
                | awk -v s="server=$server" '$4 == "firing" && $5 == "CacheServerDownCovered" && index($6, s)' | head -1)
            [ -z "$ticket" ] || t_ticket=$(secs_since "$t_stop")
        fi
        [ -n "$ticket" ] && ! before "$t_stop" "$hold_s" && break
        sleep 1
    done
    no_page_yet "$t_stop" "memcached on $mc_host stopped (covered by replicas)"
    on "$mc_host" systemctl start memcached
    load_stop a
    [ -n "$ticket" ] || die "no CacheServerDownCovered ticket for $server within $((hold_s + 40)) s of stopping it"
    [ "$LOAD_POLLS" -gt 0 ] && [ "$LOAD_BAD" = 0 ] && [ "$LOAD_FAILED" = 0 ] \
        || die "polls while $server was down: $LOAD_POLLS, $LOAD_BAD non-2xx, $LOAD_FAILED failed (want all 2xx: its keys are on their replicas)"
    say "drill a: memcached on $mc_host stopped under load ($LOAD_POLLS polls, all 2xx): CacheServerDownCovered ticket after $t_ticket s, no page in $(secs_since "$t_stop") s (for: ${for_s}s)"
}

# Drill b: every poll fails, fleet-wide.
drill_fleet_outage() {
    local n a t0 got held page="" t_page
    local -a units
    declare -gA DRILL_UNITS=()
    for n in "${POLLERS[@]}"; do
        DRILL_UNITS[$n]=$(on "$n" "systemctl list-units --state=active --plain --no-legend 'fastpoll-poller@*.service'" | awk '{print $1}' | paste -sd' ')
        [ -n "${DRILL_UNITS[$n]}" ] || die "$n: no poll server instance active before the outage"
    done
    load_start b
    sleep 2
    t0=$(now)
    for n in "${POLLERS[@]}"; do read -ra units <<<"${DRILL_UNITS[$n]}"; on "$n" systemctl stop "${units[@]}"; done
    for a in "${APPS[@]}"; do on "$a" systemctl stop fastpoll-app; done
    DRILL_T_OUT=$(now)
    while before "$DRILL_T_OUT" 60; do
        page=$(notes /page firing "$t0")
        if [ -n "$page" ]; then t_page=$(secs_since "$DRILL_T_OUT"); break; fi
        sleep 0.5
    done
    [ -n "$page" ] || { am_alerts > "$LOGS/alertmanager-alerts.txt"; die "no page within 60 s of the fleet-wide outage (Alertmanager's alerts: $LOGS/alertmanager-alerts.txt)"; }
    # One notification: ErrorBudgetBurn, availability, one alert for the fleet (no host label).
    got=$(notes /page firing "$t0" --alerts)
    expect "$(grep -c . <<<"$got")" 1 "alerts in the page ($got)"
    case "$got" in *" firing ErrorBudgetBurn "*slo=poll-availability*) ;; *) die "the page is not ErrorBudgetBurn{slo=poll-availability}: $got";; esac
    case "$got" in *host=*) die "the page names a host: $got";; esac
    # Out for a changed group's interval (10 s) and more: no second page, the causes held back,
    # and no ticket sent once the page was out.
    sleep 14
    got=$(notes /page firing "$t0")
    expect "$(grep -c . <<<"$got")" 1 "page notifications during the outage ($got)"
    am_alerts > "$LOGS/alertmanager-alerts.txt"
    grep -q '^PollerDown [a-z]* suppressed [1-9]' "$LOGS/alertmanager-alerts.txt" \
        || { cat "$LOGS/alertmanager-alerts.txt"; die "no PollerDown inhibited in Alertmanager during the outage"; }
    # The poll path's tickets are held back (the role's alertmanager_slo_inhibited_alerts); a
    # ticket off that path (a failed unit, a disk) and every page still go out.
    held=$("$REPO/.venv/bin/python" -c 'import sys, yaml; print("|".join(yaml.safe_load(open(sys.argv[1]))["alertmanager_slo_inhibited_alerts"]))' \
        "$REPO/ansible/roles/alertmanager/defaults/main.yml")
    got=$(awk -v held="^($held)\$" '$1 ~ held && $3 == "active"' "$LOGS/alertmanager-alerts.txt")
    [ -z "$got" ] || die "poll-path alerts not held back while the fleet-wide page is out: $got"
    got=$(notes /ticket firing "${page%% *}" --alerts | awk -v held="^($held)\$" '$5 ~ held')
    [ -z "$got" ] || die "poll-path tickets sent after the page: $got"
    DRILL_CAUSES=$(grep -c '^PollerDown ' "$LOGS/alertmanager-alerts.txt")
    DRILL_EARLY=$(notes /ticket firing "$t0" | grep -c . || true)

    # Everything back; polls answered again.
    for a in "${APPS[@]}"; do on "$a" systemctl start fastpoll-app; done
    for n in "${POLLERS[@]}"; do read -ra units <<<"${DRILL_UNITS[$n]}"; on "$n" systemctl start "${units[@]}"; done
    DRILL_T_BACK=$(now)
    app_up
    for n in "${POLLERS[@]}"; do
        for _ in $(seq 1 40); do
            got=$(http GET "$n" "/Poll/getMessages?user_id=$DRILL_U")
            [ "${got%% *}" = 200 ] && break
            sleep 0.5
        done
        expect "${got%% *}" 200 "$n: a poll after the outage"
    done
    load_stop b
    # Every instance scraped again and its PollerDown over (section 4 starts from none).
    for _ in $(seq 1 30); do
        [ -z "$(prom_query 'up{job=~"fastpoll_poller|fastpoll_app"} == 0 or ALERTS{alertname=~"PollerDown|PollerHostDown|AppDown"}')" ] && break
        sleep 1
    done
    got=$(prom_query 'up{job=~"fastpoll_poller|fastpoll_app"} == 0 or ALERTS{alertname=~"PollerDown|PollerHostDown|AppDown"}')
    [ -z "$got" ] || die "30 s after the restart: $got"
    say "drill b: fleet-wide outage (every poll server instance and app stopped; $LOAD_POLLS polls, $LOAD_BAD non-2xx): 1 page (ErrorBudgetBurn poll-availability, one alert, no host) $t_page s after, none more in 14 s; $DRILL_CAUSES PollerDown inhibited, $DRILL_EARLY ticket(s) before the page, none of the poll path's after; polls answered $(secs_since "$DRILL_T_BACK") s after the restart"
}

fleet_monitoring_checks() {
    local t n port want got i line fired since stop_at for_s t_drills url

    # ---- 1. every target up ------------------------------------------------------------------
    # 6 node (every fleet host), 4 poll server instances, 2 nginx, 2 mtail, 2 apps, redis,
    # 2 postgres and 2 patroni (the Patroni pair), 3 etcd, Prometheus itself and its Alertmanager.
    want=26
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
    for n in fp-db1 fp-app2; do
        grep -q "^postgres $n - up " "$RUN/targets.txt" || die "postgres exporter on $n is not an up target"
        grep -q "^patroni $n - up " "$RUN/targets.txt" || die "Patroni on $n is not an up target"
    done
    for n in fp-db1 fp-app2 fp-mon1; do
        grep -q "^etcd $n - up " "$RUN/targets.txt" || die "etcd on $n is not an up target"
    done
    grep -q '^alertmanager .* up ' "$RUN/targets.txt" || die "no Alertmanager target (role alertmanager)"
    say "Prometheus on $MON_HOST: all $want targets up"

    # ---- 2. who reaches what -----------------------------------------------------------------
    for n in "${POLLERS[@]}"; do
        # The relay serves the instance's metrics to the monitoring host...
        # (read whole, then searched: grep -q ending a pipe early fails it with SIGPIPE)
        local relay_out
        relay_out=$(on "$MON_HOST" "curl -fsS -m 5 http://${IP[$n]}:9201/metrics") && grep -q '^fastpoll_build_info' <<< "$relay_out" \
            || die "$MON_HOST cannot read $n's poll server metrics through its relay"
        # ...and nothing it scrapes answers the control node or a host outside the monitoring group.
        for port in 9201 9100 9113 3903; do
            no_answer control "${IP[$n]}" "$port"
        done
        no_answer fp-data1 "${IP[$n]}" 9201
        # The admin listener itself stays on loopback (the metrics scenario checks it from the control node too).
        no_answer "$MON_HOST" "${IP[$n]}" 9101
    done
    no_answer control "${IP[fp-data1]}" 9121
    no_answer fp-poll1 "${IP[fp-db1]}" 9187
    # etcd's metrics listener answers the monitoring host, its client API only members and Patroni.
    expect "$(on "$MON_HOST" "curl -s -m 5 -o /dev/null -w '%{http_code}' http://${IP[fp-db1]}:2381/health")" 200 "etcd's metrics listener from $MON_HOST"
    no_answer fp-poll1 "${IP[fp-db1]}" 2381
    no_answer fp-poll1 "${IP[fp-db1]}" 2379
    no_answer control "${IP[fp-db1]}" 8008
    # Patroni's REST API: a read from the monitoring host, never a change (allowlist: the members).
    expect "$(on "$MON_HOST" "curl -s -m 5 -o /dev/null -w '%{http_code}' -X POST -d '{}' http://${IP[fp-db1]}:8008/restart")" 403 \
        "a restart sent to Patroni from $MON_HOST"
    say "relays and exporters: reachable from $MON_HOST only; admin listeners on loopback"

    # ---- 3. the data is there -----------------------------------------------------------------
    # A few plain polls through each poller (mtail starts after the pollers' play: the deploy's
    # own polls are not in its count), then their count within a few scrapes.
    url=$(signed "/Poll/getMessages?user_id=$seed_user")
    for n in "${POLLERS[@]}"; do
        assert_route "${IP[$n]}"
        ab -q -n 20 -c 2 -s 5 "http://${IP[$n]}$url" > "$RUN/ab-sli.txt" 2>&1 || { cat "$RUN/ab-sli.txt"; die "ab to $n failed"; }
    done
    for i in $(seq 1 20); do
        got=$(prom_query 'sum by (host) (fastpoll_edge_requests_total{route="poll"}) > 0' | wc -l)
        [ "$got" = "${#POLLERS[@]}" ] && break
        sleep 1
    done
    expect "$got" "${#POLLERS[@]}" "pollers whose edge SLI (mtail) counted polls"
    got=$(prom_query 'memcached_up == 1' | wc -l)
    expect "$got" 2 "memcached nodes up in their stats (textfile collector)"
    expect "$(prom_query 'redis_up' | awk '{print $NF}')" 1 "redis_up"
    # Both members of the Patroni pair: the exporter reaches its PostgreSQL on each.
    expect "$(prom_query 'min(pg_up) * count(pg_up)' | awk '{print $NF}')" 2 "pg_up on both PostgreSQL hosts (min x count)"
    expect "$(prom_query 'count(fastpoll_app_repair_pending)' | awk '{print $NF}')" "${#APPS[@]}" "apps reporting the outbox backlog"
    # The engines' own metrics: one Patroni primary, every etcd member with a leader.
    expect "$(prom_query 'sum(patroni_primary)' | awk '{print $NF}')" 1 "Patroni primaries (patroni_primary)"
    expect "$(prom_query 'min(etcd_server_has_leader) * count(etcd_server_has_leader)' | awk '{print $NF}')" 3 \
        "etcd members with a leader (min x count)"
    # The restore drill on the backup host, then every metric the rules read that the stack of
    # tests/test_monitoring.py cannot export (fastpoll_testkit.monitoring.KNOWN_ELSEWHERE).
    on "$MON_HOST" systemctl start fastpoll-pg-restore-drill.service \
        || { on "$MON_HOST" journalctl -u fastpoll-pg-restore-drill --no-pager | tail -20; die "the restore drill failed on $MON_HOST"; }
    for i in $(seq 1 20); do
        [ "$(prom_query 'fastpoll_restore_drill_success' | awk '{print $NF}')" = 1 ] && break
        sleep 1
    done
    expect "$(prom_query 'fastpoll_restore_drill_success' | awk '{print $NF}')" 1 "fastpoll_restore_drill_success after the drill"
    for name in $("$REPO/.venv/bin/python" -c 'from fastpoll_testkit.monitoring import KNOWN_ELSEWHERE; print(*sorted(KNOWN_ELSEWHERE))'); do
        [ -n "$(prom_query "count($name)")" ] || die "Prometheus on $MON_HOST has no series of $name (read by the rules)"
    done
    say "Patroni, etcd, the archiver, the backup and restore drill jobs: every metric the rules read is in Prometheus"

    # ---- 5. paging drills, a and b (4 runs while b's page resolves) ----------------------------
    t_drills=$(now)
    DRILL_U=$((RANDOM % 9000 + 60000))
    DRILL_URLS=()
    for i in 0 1 2 3 4 5 6 7; do DRILL_URLS+=("$(signed "/Poll/getMessages?user_id=$((DRILL_U + i))")"); done
    on "$MON_HOST" "amtool --alertmanager.url=http://${IP[$MON_HOST]}:$AM_PORT silence add alertname=CertificateExpiresSoon \
        path=/etc/ssl/fastpoll-test.pem --duration=2h --author=fleet-test --comment='the test certificate is made for 2 days'" > /dev/null \
        || die "amtool could not silence CertificateExpiresSoon"
    webhook_start
    # Nothing pages before the drills (a page from an earlier scenario is over within a minute).
    while before "$t_drills" 60 && [ -n "$(pages_out)" ]; do sleep 2; done
    [ -z "$(pages_out)" ] || die "pages out before the drills: $(pages_out)"
    drill_covered_node
    drill_fleet_outage

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

    # ---- 5. the end of drill b: the page resolved, the fleet whole ----------------------------
    # Resolved once the SLO's short windows (10 s, and 1 min for the 6x burn) hold no error,
    # notified at Alertmanager's next group interval.
    got=""
    while before "$DRILL_T_BACK" 120; do
        got=$(notes /page resolved "$DRILL_T_OUT" --alerts | awk '$5 == "ErrorBudgetBurn"')
        [ -n "$got" ] && break
        sleep 1
    done
    [ -n "$got" ] || die "no resolved notification of the page within 120 s of the restart"
    say "drill b: the page's resolved notification $(awk -v a="$DRILL_T_BACK" '{ printf "%.1f", $1 - a; exit }' <<<"$got") s after the restart"
    webhook_stop
    expect "$(notes /page firing 0 | grep -c . || true)" 1 "page notifications in all the drills"
    # Every target up again, every memcached node in use, the apps answering.
    for i in $(seq 1 30); do
        [ "$(prom_targets | grep -c ' up ')" = "$want" ] && break
        sleep 1
    done
    expect "$(prom_targets | grep -c ' up ')" "$want" "targets up after the drills"
    expect "$(prom_query 'min(fastpoll_backend_up)' | awk '{print $NF}')" 1 "every poll server instance's memcached nodes up after the drills"
    app_up
    say "paging drills: $(secs_since "$t_drills") s in all; $(notes /ticket firing 0 | grep -c . || true) ticket notification(s), 1 page"
}

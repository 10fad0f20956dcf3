# shellcheck shell=bash disable=SC2154  # redis_pass: set by run.sh
# Redis behind Sentinel in the fleet test: the scenario redis-sentinel, sc_redis_sentinel,
# for tests/fleet/run.sh to source and list last in SCENARIOS (it leaves Redis failed over). It uses
# lib.sh's helpers (on, assert_route, playbook, recap_changed, signed, publish, expect, say, die,
# phase) and arrays (IP, POLLERS, APPS).
#
#   1. Deploy (its own inventory, lib.sh's plus): Redis on fp-data1 (the master on the first run)
#      and fp-app2 (a replica), three sentinels on fp-data1, fp-app2 and fp-db1, the Redis backend;
#      fastpoll.ini then names the sentinels, the master's name and the sentinels' password file, no
#      Redis server and no announcement server (the announcements go to the master too). The
#      sentinels refuse a client without the password.
#   2. Under poll and publish load from the control node (tests/fleet/sentinel_load.py: plain polls
#      on both pollers, publishes through both app hosts, held polls woken by those publishes), the
#      master's redis-server is killed (SIGKILL, the unit masked so systemd does not restart it).
#      The sentinels promote fp-app2; the poll servers and the apps follow without a restart, the
#      poll servers' announcement subscribers too (every instance subscribed again, on fp-app2).
#      Then fp-data1's Redis is started again: the sentinels make it a replica of the new master.
#   3. Checked: no poll answered 5xx, polls are cache hits again after the failover, publishes answer
#      201 throughout and write the cache again (X-Cache-Publish: ok) soon after the failover, held
#      polls are woken by the announcements after the failover (median under 1 s: the re-check
#      while subscribed is 10 s); the figures are printed. Then a run of the redis plays
#      changes nothing (Ansible's redis.conf is not rewritten by the failover, the sentinels'
#      source is unchanged).
#   4. The memcached backend with the announcements through the sentinels, and the Redis password
#      rotated with them (docs/runbook.md's two phases): the first play switches the backend and
#      gives Redis and the sentinels the new password beside the old one, the pollers and the
#      apps restart onto the new one; the second drops the old one. The sentinels then refuse
#      the old password and take the new one, every poll server is subscribed again.
#   5. The master (now fp-app2) killed under the same load: the sentinels promote fp-data1. With
#      memcached holding the answers, polls are cache hits throughout; the held polls are woken
#      by the announcements again after the failover (the same checks as 3).
#   Monitoring: after the deploy (and a run of the exporters play on the Redis and sentinel hosts),
#   after each failover and after the rotation, Prometheus on fp-mon1 scrapes the Sentinel
#   exporter of all three sentinels (job sentinel, every target up and reaching its sentinel), the
#   three name the same master, the one expected, each sees the 3 sentinels with the quorum
#   reachable, and no Sentinel alert fires (sentinel_watched). The rotation's first play has the
#   exporters tag, as docs/runbook.md says: the exporter then takes the new password.

# The sentinels take the Redis password ($pass, set by sc_redis_sentinel).
sentinel_cli() { on "$1" "REDISCLI_AUTH='$pass' redis-cli --no-auth-warning -h ${IP[$1]} -p 26379 --raw ${*:2}"; }
# Every poll server instance of every poller subscribed to the announcements, within 15 s.
sentinel_subscribed() {
    local n
    for n in "${POLLERS[@]}"; do
        on "$n" bash -s <<'EOF' || { echo "$n: not subscribed to the announcements"; return 1; }
for admin in 9101 9102; do
    for _ in $(seq 1 60); do
        m=$(curl -fsS "http://127.0.0.1:$admin/metrics") && grep -qx 'fastpoll_announce_subscribed 1' <<< "$m" && continue 2
        sleep 0.25
    done
    echo "admin $admin: not subscribed"; exit 1
done
EOF
    done
}

# sentinel_prom EXPR: Prometheus on fp-mon1 (the control node is one of fastpoll_prometheus_clients),
# the instant vector, one line per series: "label=value,... value".
sentinel_prom() {
    assert_route "${IP[fp-mon1]}"
    curl -sS -m 10 -G "http://${IP[fp-mon1]}:9090/api/v1/query" --data-urlencode "query=$1" | python3 -c '
import json, sys
d = json.load(sys.stdin)
if d.get("status") != "success":
    sys.exit("query failed: %s" % d)
for r in d["data"]["result"]:
    print(",".join("%s=%s" % kv for kv in sorted(r["metric"].items())), r["value"][1])
'
}
# sentinel_watched MASTER WHEN: within 120 s, Prometheus sees the Sentinel exporter of each of the
# three sentinel hosts up and reaching its sentinel (redis_up 1), all three naming MASTER's Redis as
# the master, each seeing 3 sentinels with CKQUORUM passing, and no Sentinel alert firing.
sentinel_watched() {
    local master=$1 when=$2 t0 i got want
    t0=$(date +%s)
    want="fp-app2 fp-data1 fp-db1|fp-app2 fp-data1 fp-db1|3|master_address=${IP[$master]}:6379 3|3|1|"
    # A query that fails (Prometheus restarting, a timeout) counts as not yet.
    for i in $(seq 1 120); do
        got="$(sentinel_prom 'up{job="sentinel"} == 1' | sed 's/.*host=\([^, ]*\).*/\1/' | sort | paste -sd' ' || true)"
        got+="|$(sentinel_prom 'redis_up{job="sentinel"} == 1' | sed 's/.*host=\([^, ]*\).*/\1/' | sort | paste -sd' ' || true)"
        got+="|$(sentinel_prom 'count(up{job="sentinel"})' | awk '{print $NF}' || true)"
        got+="|$(sentinel_prom 'count by (master_address) (redis_sentinel_master_ok_sentinels{job="sentinel",master_name="fastpoll"})' | paste -sd' ' || true)"
        got+="|$(sentinel_prom 'min(redis_sentinel_master_ok_sentinels{job="sentinel",master_name="fastpoll"})' | awk '{print $NF}' || true)"
        got+="|$(sentinel_prom 'min(max without (message) (redis_sentinel_master_ckquorum_status{job="sentinel",master_name="fastpoll"}))' | awk '{print $NF}' || true)"
        got+="|$(sentinel_prom 'ALERTS{alertname=~"Sentinel.*",alertstate="firing"}' | paste -sd' ' || true)"
        [ "$got" = "$want" ] && break
        [ "$i" -lt 120 ] || die "Prometheus's view of the sentinels $when: got '$got', want '$want' (up hosts|reaching hosts|targets|master_address count|min ok sentinels|min ckquorum|firing Sentinel alerts)"
        sleep 1
    done
    say "Prometheus $when: 3 of 3 sentinel targets up and reaching their sentinel, all three name ${IP[$master]}:6379 ($master), 3 sentinels each, quorum reachable, no Sentinel alert firing ($(( $(date +%s) - t0 )) s)"
}

sc_redis_sentinel() {
    local inv=$RUN/sentinel.yml pass role i line
    local pass_args=()
    # The inventory: the fleet's (lib.sh), with a replica and the sentinels.
    "$REPO/.venv/bin/python" - "$RUN/inventory.yml" "$inv" <<'PY' || die "cannot write the Sentinel inventory"
import sys
import yaml
with open(sys.argv[1]) as f:
    inv = yaml.safe_load(f)
children = inv["all"]["children"]
children["redis"] = {"hosts": {"fp-data1": None, "fp-app2": None}}
children["redis_sentinel"] = {"hosts": {"fp-data1": None, "fp-app2": None, "fp-db1": None}}
with open(sys.argv[2], "w") as f:
    yaml.safe_dump(inv, f, default_flow_style=False, sort_keys=False)
PY
    # After the Redis password rotation scenario the new password is the one Redis takes.
    pass=$redis_pass
    if [ -f "$RUN/secrets-redis.yml" ]; then
        pass_args=(-e "@$RUN/secrets-redis.yml")
        pass=$(sed -n 's/^fastpoll_redis_password: "\(.*\)"$/\1/p' "$RUN/secrets-redis.yml")
    fi
    INVENTORY=$inv playbook sentinel "${pass_args[@]}" -e fastpoll_cache_backend=redis -e fastpoll_cache_ttl=299 \
        --limit 'pollers:app:redis:redis_sentinel' --tags config,redis,app,pollers
    for n in "${POLLERS[@]}" "${APPS[@]}"; do
        line=$(on "$n" "sed -n 's/^sentinels = //p' /etc/fastpoll/fastpoll.ini")
        expect "$line" "${IP[fp-data1]}:26379 ${IP[fp-app2]}:26379 ${IP[fp-db1]}:26379" "$n: [redis] sentinels"
        ! on "$n" "sed -n '/^\[redis\]/,/^\[/p' /etc/fastpoll/fastpoll.ini" | grep -q '^server =' \
            || die "$n: [redis] still has a server with sentinels"
        line=$(on "$n" "sed -n 's/^sentinel_password_file = //p' /etc/fastpoll/fastpoll.ini")
        expect "$line" /etc/fastpoll/redis.pass "$n: [redis] sentinel_password_file"
        ! on "$n" "sed -n '/^\[announce\]/,/^\[/p' /etc/fastpoll/fastpoll.ini" | grep -q '^server =' \
            || die "$n: [announce] has a server with sentinels"
    done
    line=$(on fp-db1 "redis-cli -h ${IP[fp-db1]} -p 26379 --raw SENTINEL get-master-addr-by-name fastpoll" 2>&1 | head -1)
    case "$line" in NOAUTH*) ;; *) die "fp-db1's sentinel answered without the password: $line" ;; esac
    for n in fp-data1 fp-app2 fp-db1; do
        expect "$(sentinel_cli "$n" SENTINEL get-master-addr-by-name fastpoll | paste -sd' ')" \
            "${IP[fp-data1]} 6379" "$n: the sentinel's master"
    done
    role=$(on fp-app2 "REDISCLI_AUTH='$pass' redis-cli -h ${IP[fp-app2]} --user fastpoll --no-auth-warning --raw ROLE" | head -3 | paste -sd' ')
    expect "$role" "slave ${IP[fp-data1]} 6379" "fp-app2's Redis role"
    # Three sentinels know each other and the replica (their hello messages take a few seconds).
    for i in $(seq 1 60); do
        line=$(sentinel_cli fp-db1 SENTINEL master fastpoll | paste -sd' ')
        case "$line" in *"num-other-sentinels 2 "*"quorum 2"*) break ;; esac
        [ "$i" -lt 60 ] || die "fp-db1's sentinel does not see the other two: $line"
        sleep 0.5
    done
    sentinel_subscribed || die "the poll servers are not subscribed through the sentinels"
    # The exporters on the hosts that became Redis and sentinel hosts: the Sentinel exporter on
    # each sentinel, the Redis exporter on fp-app2; each writes its targets on fp-mon1.
    INVENTORY=$inv playbook sentinel-exporters "${pass_args[@]}" -e fastpoll_cache_backend=redis -e fastpoll_cache_ttl=299 \
        --limit 'redis:redis_sentinel' --tags exporters
    for n in fp-data1 fp-app2 fp-db1; do
        expect "$(on "$n" systemctl is-active fastpoll-sentinel-exporter.service)" active "$n: fastpoll-sentinel-exporter"
    done
    [ "$(on fp-db1 'systemctl is-active prometheus-redis-exporter.service' || true)" != active ] \
        || die "fp-db1 (a sentinel host without Redis) still runs the package's own Redis exporter"
    no_answer_sentinel_exporter
    sentinel_watched fp-data1 "after the deploy"
    phase "Sentinel deployed: Redis master fp-data1, replica fp-app2, 3 sentinels (password required); the Redis backend and the announcements through them; Prometheus watches the 3 sentinels"

    # ---- the failover, under load ----
    sentinel_failover fp-data1 fp-app2 redis
    # No restart of a poll server or an app: their config did not change and nothing restarted
    # them; the idempotency run below changes nothing.
    INVENTORY=$inv playbook sentinel-rerun "${pass_args[@]}" -e fastpoll_cache_backend=redis -e fastpoll_cache_ttl=299 \
        --limit 'redis:redis_sentinel' --tags redis,exporters
    expect "$(recap_changed)" 0 "changes by the redis and exporters plays after the failover"
    sentinel_watched fp-app2 "after the failover to fp-app2"
    phase "Redis master fp-data1 killed under load (Redis backend): $(head -1 "$RUN/sentinel-verdict.txt"); the redis and exporters plays then change nothing; Prometheus sees the sentinels agree on fp-app2"

    # ---- the memcached backend, the announcements through the sentinels, the password rotated ----
    local old_pass=$pass new_pass
    new_pass=$(head -c 24 /dev/urandom | base64 | tr -d '/+=')
    grep -v '^fastpoll_redis_password' "$RUN/secrets.yml" > "$RUN/secrets-sentinel.yml"
    printf 'fastpoll_redis_password: "%s"\n' "$new_pass" >> "$RUN/secrets-sentinel.yml"
    printf 'fastpoll_redis_previous_passwords: ["%s"]\n' "$old_pass" > "$RUN/sentinel-prev.yml"
    INVENTORY=$inv playbook sentinel-rotate-1 -e "@$RUN/secrets-sentinel.yml" -e "@$RUN/sentinel-prev.yml" \
        -e fastpoll_cache_backend=memcached -e fastpoll_cache_ttl=299 \
        --limit 'pollers:app:redis:redis_sentinel' --tags config,redis,app,pollers,exporters
    for n in "${POLLERS[@]}" "${APPS[@]}"; do
        line=$(on "$n" "sed -n '/^\[cache\]/,/^\[/s/^backend = //p' /etc/fastpoll/fastpoll.ini")
        expect "$line" memcached "$n: [cache] backend"
        line=$(on "$n" "sed -n 's/^sentinels = //p' /etc/fastpoll/fastpoll.ini")
        expect "$line" "${IP[fp-data1]}:26379 ${IP[fp-app2]}:26379 ${IP[fp-db1]}:26379" "$n: [redis] sentinels"
    done
    for n in fp-data1 fp-app2 fp-db1; do
        pass=$old_pass
        expect "$(sentinel_cli "$n" SENTINEL get-master-addr-by-name fastpoll | paste -sd' ')" \
            "${IP[fp-app2]} 6379" "$n's sentinel with the old password during the rotation"
        pass=$new_pass
        expect "$(sentinel_cli "$n" SENTINEL get-master-addr-by-name fastpoll | paste -sd' ')" \
            "${IP[fp-app2]} 6379" "$n's sentinel with the new password during the rotation"
    done
    INVENTORY=$inv playbook sentinel-rotate-2 -e "@$RUN/secrets-sentinel.yml" \
        -e fastpoll_cache_backend=memcached -e fastpoll_cache_ttl=299 --limit 'redis:redis_sentinel' --tags redis
    for n in fp-data1 fp-app2 fp-db1; do
        pass=$old_pass
        line=$(sentinel_cli "$n" SENTINEL get-master-addr-by-name fastpoll 2>&1 | head -1)
        case "$line" in *WRONGPASS*|*NOAUTH*|*invalid*) ;; *) die "$n's sentinel still takes the old password: $line" ;; esac
        pass=$new_pass
        expect "$(sentinel_cli "$n" SENTINEL get-master-addr-by-name fastpoll | paste -sd' ')" \
            "${IP[fp-app2]} 6379" "$n's sentinel with the new password"
    done
    role=$(on fp-data1 "REDISCLI_AUTH='$pass' redis-cli -h ${IP[fp-data1]} --user fastpoll --no-auth-warning --raw ROLE" | head -3 | paste -sd' ')
    expect "$role" "slave ${IP[fp-app2]} 6379" "fp-data1's Redis role after the rotation"
    sentinel_subscribed || die "the poll servers are not subscribed through the sentinels after the rotation"
    sentinel_watched fp-app2 "after the password rotation"
    phase "memcached backend, announcements through the sentinels; Redis password rotated (both, then the new one only): the sentinels refuse the old one, every poll server subscribed, the Sentinel exporters on the new one"

    # ---- the master (fp-app2 now) killed under load, the memcached backend ----
    sentinel_failover fp-app2 fp-data1 memcached
    sentinel_watched fp-data1 "after the failover to fp-data1"
    phase "Redis master fp-app2 killed under load (memcached backend, announcements): $(head -1 "$RUN/sentinel-verdict.txt"); Prometheus sees the sentinels agree on fp-data1"
}

# The Sentinel exporter answers the monitoring host only (the host firewall: fastpoll_monitoring_ports).
no_answer_sentinel_exporter() {
    local rc=0 out
    out=$(on fp-mon1 "curl -fsS -m 5 http://${IP[fp-db1]}:9355/metrics") && grep -q '^redis_sentinel_master_ok_sentinels' <<< "$out" \
        || die "fp-mon1 cannot read fp-db1's Sentinel exporter"
    assert_route "${IP[fp-db1]}"
    curl -sS -m 2 -o /dev/null "http://${IP[fp-db1]}:9355/metrics" 2>/dev/null || rc=$?
    # 7: refused, 28: no answer in time (dropped by the firewall). Anything else answered.
    [ "$rc" = 7 ] || [ "$rc" = 28 ] || die "the control node reached fp-db1's Sentinel exporter (curl rc $rc); want no connection"
}

# sentinel_failover MASTER REPLICA BACKEND: under sentinel_load.py's load, MASTER's Redis killed;
# the sentinels promote REPLICA, every poll server subscribes on it, MASTER comes back as its
# replica; sentinel_load.py --check judges the run (its verdict in $RUN/sentinel-verdict.txt).
sentinel_failover() {
    local master=$1 replica=$2 backend=$3 t_kill t_promoted t_back role i u
    local users=() paths=()
    for i in 0 1 2 3 4; do
        u=$((RANDOM % 9000 + 70000 + i * 10000))
        expect "$(publish fp-data1 "$u" "before the failover")" 201 "publish before the failover"
        users+=("$u")
        paths+=("$(signed "/Poll/getMessages?user_id=$u")")
    done
    local tag=sentinel-$backend
    drill_load sentinel_load.py "$tag" 150 "$(IFS=,; echo "${users[*]}")" "$(printf '%s\n' "${paths[@]}" | paste -sd'|')"
    sleep 6
    kill -0 "$DRILL_PID" 2>/dev/null || { cat "$LOGS/$tag-load.log"; die "the load generator ended early"; }
    t_kill=$(date +%s.%N)
    echo "kill $t_kill" >> "$RUN/$tag-events"
    # Masked first, so systemd's Restart= does not bring an empty master back before the sentinels
    # see it gone (it would be the master again, and its replica would copy it empty).
    # SIGKILL to the main pid: systemctl kill also signals the unit's other processes, which
    # fails inside the test's containers (EIO).
    on "$master" 'systemctl mask --runtime --quiet redis-server && pid=$(systemctl show -p MainPID --value redis-server) && [ "$pid" -gt 0 ] && kill -9 "$pid"' \
        || die "cannot kill $master's Redis"
    for i in $(seq 1 120); do
        [ "$(sentinel_cli fp-db1 SENTINEL get-master-addr-by-name fastpoll | head -1)" = "${IP[$replica]}" ] && break
        [ "$i" -lt 120 ] || die "no failover to $replica within 60 s"
        sleep 0.5
    done
    t_promoted=$(date +%s.%N)
    echo "promoted $t_promoted" >> "$RUN/$tag-events"
    sentinel_subscribed || die "the poll servers did not subscribe on the new master"
    echo "subscribed $(date +%s.%N)" >> "$RUN/$tag-events"
    sleep 8
    on "$master" 'systemctl unmask --runtime --quiet redis-server && systemctl start redis-server' \
        || die "cannot start $master's Redis again"
    echo "restarted $(date +%s.%N)" >> "$RUN/$tag-events"
    for i in $(seq 1 120); do
        role=$(on "$master" "REDISCLI_AUTH='$pass' redis-cli -h ${IP[$master]} --user fastpoll --no-auth-warning --raw ROLE" 2>/dev/null \
            | head -4 | paste -sd' ') || true
        case "$role" in "slave ${IP[$replica]} 6379 connected") break ;; esac
        [ "$i" -lt 120 ] || die "$master's Redis is not a replica of $replica within 60 s of its start: $role"
        sleep 0.5
    done
    t_back=$(date +%s.%N)
    echo "replica $t_back" >> "$RUN/$tag-events"
    sleep 5
    drill_stop "$tag"
    "$REPO/.venv/bin/python" "$HERE/sentinel_load.py" --check "$RUN/$tag-load.json" --events "$RUN/$tag-events" \
        > "$RUN/sentinel-verdict.txt" 2>&1 || { cat "$RUN/sentinel-verdict.txt"; die "Redis failover under load ($backend backend)"; }
    sed 's/^/  /' "$RUN/sentinel-verdict.txt"
}

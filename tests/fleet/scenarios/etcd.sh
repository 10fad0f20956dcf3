# shellcheck shell=bash
# The fleet test's etcd scenario: the quorum Patroni keeps its leader key in (role etcd; members
# fp-db1, fp-app2 and fp-mon1). Sourced by tests/fleet/run.sh, which runs sc_etcd as the row etcd;
# it uses lib.sh's helpers and postgres-ha.sh's pg_primary.
#
#   0. etcd speaks TLS only (plain HTTP and a client without its CA get nothing), answers no read
#      without a login, and user patroni may read Patroni's keys but write nothing else.
#   1. A config change rolled under publish load (tests/fleet/pg_ha_load.py through both app hosts
#      and both pollers): the etcd plays with another heartbeat and election timeout (kept: the
#      scenario is the last), one member at a time: the primary keeps its role and every publish
#      attempt is answered 201.
#   2. Two of the three members killed under the same load: no quorum; Patroni's failsafe mode
#      keeps the primary (every Patroni member answers it): the primary keeps its role, every
#      publish attempt is answered 201. The members started again: every member healthy.
#   3. A member replaced: fp-mon1 removed from the cluster (`member remove`), its data and config
#      deleted, added again as a new member (`member add`); the etcd plays make it join: three
#      started members, all healthy, fp-mon1 with a new ID.

ETCD_AT=fp-db1
# Step 1's change, kept by step 3's run (only the new member's config is written then).
ETCD_CHANGED=(-e etcd_heartbeat_ms=300 -e etcd_election_ms=3000)
# etcd_post HOST PATH JSON [TOKEN]: a POST to etcd's client API on $ETCD_AT from HOST, over TLS
# checked against etcd's CA; prints the body.
etcd_post() {
    on "$1" curl -sS -m 5 --cacert /etc/etcd-ca.crt ${4:+-H "'Authorization: $4'"} -X POST -d "'$3'" \
        "https://${IP[$ETCD_AT]}:2379$2"
}
b64() { printf '%s' "$1" | base64 -w0; }
# etcd_password USER: root's and patroni's passwords, derived from fastpoll_db_password (role etcd).
etcd_password() {
    printf '%s' "$(sed -n 's/^fastpoll_db_password: "\(.*\)"$/\1/p' "$RUN/secrets.yml"):etcd-$1" | sha256sum | cut -d' ' -f1
}
# etcd_login USER: a token for USER.
etcd_login() {
    etcd_post "$ETCD_AT" /v3/auth/authenticate "{\"name\": \"$1\", \"password\": \"$(etcd_password "$1")\"}" \
        | python3 -c 'import json, sys; print(json.load(sys.stdin)["token"])'
}
# etcd_members: "NAME ID" of each started member (one with a name), one per line.
etcd_members() {
    etcd_post "$ETCD_AT" /v3/cluster/member/list '{}' \
        | python3 -c 'import json, sys; [print(m["name"], m["ID"]) for m in json.load(sys.stdin)["members"] if m.get("name")]'
}
# etcd_healthy: every member the cluster lists answers healthy over TLS (within 60 s).
etcd_healthy() {
    local n out i
    for n in fp-db1 fp-app2 fp-mon1; do
        for i in $(seq 1 60); do
            out=$(on "$ETCD_AT" curl -sS -m 3 --cacert /etc/etcd-ca.crt "https://${IP[$n]}:2379/health" 2>/dev/null) || out=""
            [[ "$out" == *'"health":"true"'* ]] && break
            [ "$i" -lt 60 ] || die "etcd member $n is not healthy within 60 s: '$out'"
            sleep 1
        done
    done
    expect "$(etcd_members | wc -l)" 3 "etcd's started members"
}
# etcd_drill TAG: publish and poll load for a disruption (pg_ha_load.py); its `disrupt` event now.
etcd_drill() {
    local users=() paths=() u i
    for i in 0 1 2 3; do users+=($((RANDOM % 9000 + 61000 + i * 10000))); done
    for i in 0 1; do
        u=$((RANDOM % 9000 + 20000 + i * 10000))
        expect "$(publish fp-data1 "$u" "polled while etcd changes")" 201 "publish before the etcd drill"
        paths+=("$(signed "/Poll/getMessages?user_id=$u")")
    done
    ETCD_USERS=$(IFS=,; echo "${users[*]}")
    drill_load pg_ha_load.py "$1" 300 "$ETCD_USERS" "$(printf '%s\n' "${paths[@]}" | paste -sd'|')"
    sleep 3
    kill -0 "$DRILL_PID" 2>/dev/null || { cat "$LOGS/$1-load.log"; die "the load generator ended early"; }
    echo "disrupt $(date +%s.%N)" >> "$RUN/$1-events"
}
# etcd_drill_end TAG PRIMARY: the load stopped and judged: every attempt 201, none lost; PRIMARY
# still the primary.
etcd_drill_end() {
    sleep 2
    drill_stop "$1"
    expect "$(pg_primary)" "$2" "the PostgreSQL primary after the etcd drill $1"
    pg_sql "$2" "SELECT user_id, text FROM messages WHERE user_id IN ($ETCD_USERS)" | tr '|' '\t' > "$RUN/$1-stored.tsv" \
        || die "cannot read the messages back from $2"
    "$REPO/.venv/bin/python" "$HERE/pg_ha_load.py" --check "$RUN/$1-load.json" --events "$RUN/$1-events" \
        --stored "$RUN/$1-stored.tsv" --max-gap 5 --max-failed 0 > "$RUN/$1-verdict.txt" 2>&1 \
        || { cat "$RUN/$1-verdict.txt"; die "publishes during the etcd drill $1"; }
}

sc_etcd() {
    local out token primary old_id new_id n i
    # ---- 0. TLS only, logins, patroni's reach ----
    out=$(on fp-app2 curl -sS -m 5 --cacert /etc/etcd-ca.crt "https://${IP[fp-db1]}:2379/health")
    [[ "$out" == *'"health":"true"'* ]] || die "etcd over TLS from fp-app2: $out"
    out=$(on fp-app2 curl -s -m 5 "http://${IP[fp-db1]}:2379/health") || true
    [[ "$out" != *'"health"'* ]] || die "etcd answered plain HTTP: $out"
    expect "$(on fp-app2 curl -s -m 5 -o /dev/null -w '%{http_code}' "https://${IP[fp-db1]}:2379/health")" 000 \
        "etcd's certificate checked without its CA"
    out=$(etcd_post fp-app2 /v3/kv/range "{\"key\": \"$(b64 /service/fastpoll/leader)\"}")
    [[ "$out" == *'user name is empty'* ]] || die "etcd read without a login: $out"
    token=$(etcd_login patroni) || die "etcd login as patroni"
    out=$(etcd_post fp-app2 /v3/kv/range "{\"key\": \"$(b64 /service/fastpoll/leader)\"}" "$token")
    [[ "$out" == *'"count":"1"'* ]] || die "Patroni's leader key, read as patroni: $out"
    out=$(etcd_post fp-app2 /v3/kv/put "{\"key\": \"$(b64 /elsewhere)\", \"value\": \"$(b64 x)\"}" "$token")
    [[ "$out" == *'permission denied'* ]] || die "etcd let patroni write outside its prefix: $out"
    for n in fp-db1 fp-app2; do
        on "$n" grep -q "'^  protocol: https$'" /etc/patroni/config.yml || die "Patroni on $n does not reach etcd over TLS"
    done
    phase "etcd: TLS only (plain HTTP and an unknown CA refused), no read without a login, patroni at /service/ only"

    primary=$(pg_primary)
    [ "$primary" != - ] || die "no PostgreSQL primary"

    # ---- 1. a config change rolled under load ----
    etcd_drill etcdcfg
    playbook etcd-config --tags etcd --limit 'etcd:postgresql_dcs' "${ETCD_CHANGED[@]}"
    for n in fp-db1 fp-app2 fp-mon1; do
        on "$n" grep -qx ETCD_HEARTBEAT_INTERVAL=300 /etc/default/etcd || die "$n: the new heartbeat is not in its config"
    done
    etcd_drill_end etcdcfg "$primary"
    phase "etcd config change rolled under load, one member at a time: $primary kept its role; $(head -1 "$RUN/etcdcfg-verdict.txt")"

    # ---- 2. two members of three killed under load ----
    etcd_drill etcdq
    for n in fp-mon1 fp-app2; do
        on "$n" 'systemctl mask --runtime --quiet etcd.service && kill -KILL $(pgrep -x etcd)' || die "cannot kill etcd on $n"
    done
    for i in $(seq 1 60); do
        out=$(on "$primary" "curl -s -m 2 http://${IP[$primary]}:8008/metrics" | awk '/^patroni_failsafe_mode_is_active/{print $2}') || out=""
        [ "$out" = 1 ] && break
        [ "$i" -lt 60 ] || die "Patroni on $primary not in failsafe mode within 30 s of etcd's quorum lost (got '$out')"
        sleep 0.5
    done
    sleep 10
    expect "$(pg_primary)" "$primary" "the primary while etcd has no quorum"
    for n in fp-mon1 fp-app2; do
        on "$n" 'systemctl unmask --runtime --quiet etcd.service && systemctl start etcd.service' || die "cannot start etcd on $n"
    done
    etcd_healthy
    etcd_drill_end etcdq "$primary"
    phase "two etcd members killed under load: failsafe mode, $primary kept its role; $(head -1 "$RUN/etcdq-verdict.txt")"

    # ---- 3. a member replaced ----
    old_id=$(etcd_members | awk '$1 == "fp-mon1" {print $2}')
    [ -n "$old_id" ] || die "fp-mon1 is not an etcd member"
    token=$(etcd_login root) || die "etcd login as root"
    out=$(etcd_post "$ETCD_AT" /v3/cluster/member/remove "{\"ID\": \"$old_id\"}" "$token")
    [[ "$out" == *'"members"'* ]] || die "member remove: $out"
    on fp-mon1 'systemctl stop etcd.service && rm -rf /var/lib/etcd/fastpoll /etc/default/etcd' || die "cannot clear fp-mon1's etcd"
    out=$(etcd_post "$ETCD_AT" /v3/cluster/member/add "{\"peerURLs\": [\"https://${IP[fp-mon1]}:2380\"]}" "$token")
    [[ "$out" == *'"member"'* ]] || die "member add: $out"
    playbook etcd-replace --tags etcd --limit 'etcd:postgresql_dcs' "${ETCD_CHANGED[@]}"
    on fp-mon1 grep -qx ETCD_INITIAL_CLUSTER_STATE=existing /etc/default/etcd || die "fp-mon1 did not join as an existing cluster's member"
    etcd_healthy
    new_id=$(etcd_members | awk '$1 == "fp-mon1" {print $2}')
    [ -n "$new_id" ] && [ "$new_id" != "$old_id" ] || die "fp-mon1's member ID after the replacement: '$new_id' (was $old_id)"
    phase "etcd member fp-mon1 replaced (ID $old_id -> $new_id): three members healthy"
}

#!/bin/bash
# The fleet test: a real Ansible deployment of fastpoll to Debian 12 hosts booted here with
# systemd-nspawn (a fleet of three, plus one single-host deployment), then checks of what the
# issue asks (docs/deploy.md, "The fleet test").
#
#   tests/fleet/run.sh [NAME[,NAME...]|all|--list]   (as root; `make test-deploy [SCENARIO=NAME]`)
#
# Named scenarios share one boot and one first deploy (SCENARIOS below, in the order `all`, the
# default, plays them); any one runs alone, after the ones it needs (NEEDS). At the end, pass or
# fail, a table: each phase (the boot's, the first deploy, every scenario run), its seconds and
# PASS/FAIL.
#
# Hosts (each its own overlay of one cached debootstrap image, its own network namespace on the
# bridge fpbr0, 10.77.0.1/24 on this side; no route, NAT or forwarding to anything else):
#   fp-poll1 10.77.0.11  pollers
#   fp-poll2 10.77.0.12  pollers, memcached
#   fp-data1 10.77.0.21  memcached, redis, app
#   fp-app2  10.77.0.22  app (a second app host: both on PostgreSQL)
#   fp-db1   10.77.0.23  postgresql (with fp-app2: a Patroni pair; etcd on fp-db1, fp-app2, fp-mon1)
#   fp-mon1  10.77.0.24  monitoring (tests/fleet/monitoring.sh, if present, checks it), backup (pgBackRest)
# and, deployed alongside with its own inventory (the single-host example's layout):
#   fp-solo  10.77.0.31  every group, services on loopback
#
# Network safety: the bridge and its address exist before any packet is sent, and every ssh, curl
# and ab to a test address is preceded by `ip route get` proving it leaves through fpbr0.
# Everything created here (containers by pid, mounts, the bridge, veths, the run directory) is
# torn down by name in an EXIT trap, also when a check fails.
#
# Environment: FLEET_ANSIBLE_BIN (dir with ansible-playbook and ansible-lint, default .venv/bin),
# FLEET_KEEP=1 (leave the hosts up at the end, pass or fail, for debugging),
# FLEET_TEARDOWN_ONLY=1 (tear down what a FLEET_KEEP run left), FLEET_CACHE (image cache dir,
# default /var/cache/fastpoll-fleet), FLEET_POLL_SERVER_BIN (deploy this binary instead of
# building poll_server/).
set -euo pipefail
# The whole script is one block, read in full before it starts: bash reads a script as it runs
# it, so an edit of this file during a run would otherwise change what the run does next.
{

T0=$(date +%s)
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
ANSIBLE_BIN=${FLEET_ANSIBLE_BIN:-$REPO/.venv/bin}
BRIDGE=fpbr0
NET=10.77.0
BRIDGE_ADDR=$NET.1
STATE=/var/tmp/fastpoll-fleet
RUN=$STATE/run
LOGS=$STATE/logs
NAMES=(fp-poll1 fp-poll2 fp-data1 fp-app2 fp-db1 fp-mon1 fp-solo)
declare -A IP=([fp-poll1]=$NET.11 [fp-poll2]=$NET.12 [fp-data1]=$NET.21 [fp-app2]=$NET.22 [fp-db1]=$NET.23
               [fp-mon1]=$NET.24 [fp-solo]=$NET.31)
FLEET=(fp-poll1 fp-poll2 fp-data1 fp-app2 fp-db1 fp-mon1)
APPS=(fp-data1 fp-app2)
POLLERS=(fp-poll1 fp-poll2)
declare -A PID=()

phase_t=$T0
say() { echo "fleet: $*"; }
phase() {
    local now; now=$(date +%s)
    say "-- $* (+$((now - phase_t))s, total $((now - T0))s)"
    phase_t=$now
}
die() { echo "fleet: FAIL: $*" >&2; exit 1; }

# ---- scenarios: which ones run, and the table of times -----------------------------------------
# In the order a full run plays them, all on one boot and one first deploy. Any one runs alone
# (`tests/fleet/run.sh NAME[,NAME...]`, `make test-deploy SCENARIO=NAME`), after what it needs.
SCENARIOS=(lint converge budgets data-host request-path metrics scaling upgrade gated-release edge app-hosts
           membership interrupted signing-rotation rollback postgres-ha monitoring redis-backend redis-rotation
           redis-sentinel)
# What a scenario needs to have run before it on the same fleet.
declare -A NEEDS=([rollback]=upgrade [gated-release]=upgrade [redis-rotation]=redis-backend)
# Scenarios kept in their own files.
# shellcheck source=tests/fleet/gate.sh
. "$(dirname "$0")/gate.sh"
# shellcheck source=tests/fleet/sentinel.sh
. "$(dirname "$0")/sentinel.sh"
# shellcheck source=tests/fleet/postgres_ha.sh
. "$(dirname "$0")/postgres_ha.sh"
declare -A WANT=()
select_scenarios() {
    local s known
    for s in ${1//,/ }; do
        known=0
        for k in "${SCENARIOS[@]}"; do [ "$k" = "$s" ] && known=1; done
        [ "$known" = 1 ] || die "unknown scenario '$s' (scenarios: ${SCENARIOS[*]})"
        WANT[$s]=1
        [ -z "${NEEDS[$s]:-}" ] || select_scenarios "${NEEDS[$s]}"
    done
}
case "${1:-all}" in
    all) for s in "${SCENARIOS[@]}"; do WANT[$s]=1; done ;;
    --list) printf '%s\n' "${SCENARIOS[@]}"; exit 0 ;;
    *) select_scenarios "$1" ;;
esac
want() { [ -n "${WANT[$1]:-}" ]; }
TABLE=()
STEP_NAME="" STEP_T=0
# step NAME FUNCTION: runs FUNCTION as the row NAME of the table (FAIL if the run ends in it).
step() {
    STEP_NAME=$1 STEP_T=$(date +%s)
    say "== $1"
    "$2"
    TABLE+=("$1 $(( $(date +%s) - STEP_T )) PASS")
    STEP_NAME=""
}
# mark NAME: the boot's rows: ends the current one (PASS) and starts NAME ("" ends only).
mark() {
    [ -z "$STEP_NAME" ] || TABLE+=("$STEP_NAME $(( $(date +%s) - STEP_T )) PASS")
    STEP_NAME=$1 STEP_T=$(date +%s)
}
print_table() {
    local row name secs res
    [ -n "$STEP_NAME" ] && TABLE+=("$STEP_NAME $(( $(date +%s) - STEP_T )) FAIL")
    STEP_NAME=""
    [ "${#TABLE[@]}" -gt 0 ] || return 0
    printf 'fleet: %-18s %7s  %s\n' phase seconds result
    for row in "${TABLE[@]}"; do
        read -r name secs res <<<"$row"
        printf 'fleet: %-18s %7s  %s\n' "$name" "$secs" "$res"
    done
    printf 'fleet: %-18s %7s\n' total "$(( $(date +%s) - T0 ))"
}

# ---- preconditions ----------------------------------------------------------------------------
[ "$(id -u)" = 0 ] || die "must run as root (debootstrap, nspawn, bridge)"
for c in debootstrap systemd-nspawn ip ssh ssh-keygen curl ab flock mount python3; do
    command -v "$c" >/dev/null || die "missing command: $c"
done

mkdir -p "$STATE"
exec 8>"$STATE/.run.lock"
flock -n 8 || die "another fleet test is running (lock $STATE/.run.lock)"

# ---- teardown (by name and pid, never by pattern) ---------------------------------------------
# A pid read back from a file (FLEET_TEARDOWN_ONLY, or a leftover run) counts only while it is
# still the nspawn of that host's root: after a reboot the number may belong to anything.
adopt_pid() {
    local n=$1 p f=$RUN/$1/nspawn.pid
    [ -f "$f" ] || return 0
    p=$(cat "$f")
    [[ $p =~ ^[0-9]+$ ]] || return 0
    [ -r "/proc/$p/cmdline" ] || return 0
    if tr '\0' ' ' 2>/dev/null < "/proc/$p/cmdline" | grep -qF -- "--directory=$RUN/$n/root"; then
        PID[$n]=$p
    fi
    return 0
}

# Power off the hosts we started, then remove mounts, links and the run directory we made.
release_hosts() {
    for n in "${NAMES[@]}"; do
        p=${PID[$n]:-}
        [ -n "$p" ] || continue
        # The container's systemd takes SIGRTMIN+14 for an immediate poweroff: every process
        # killed, no unit stopped in turn (nothing on these hosts outlives the test; an orderly
        # poweroff, nspawn's answer to SIGTERM, took 38 s). nspawn exits with its init.
        c=$(cat "/proc/$p/task/$p/children" 2>/dev/null) || c=""
        if [[ $c =~ ^[0-9]+\ ?$ ]]; then
            kill -s SIGRTMIN+14 "${c% }" 2>/dev/null || kill -TERM "$p" 2>/dev/null
        else
            kill -TERM "$p" 2>/dev/null
        fi
    done
    for n in "${NAMES[@]}"; do
        p=${PID[$n]:-}
        [ -n "$p" ] || continue
        for _ in $(seq 1 60); do kill -0 "$p" 2>/dev/null || break; sleep 0.5; done
        if kill -0 "$p" 2>/dev/null; then
            say "teardown: $n (nspawn pid $p) did not power off in 30s; killing it"
            # The container's init first: its death ends every process of its pid namespace,
            # which killing nspawn alone would leave running.
            for c in $(cat "/proc/$p/task/$p/children" 2>/dev/null); do kill -KILL "$c" 2>/dev/null; done
            kill -KILL "$p" 2>/dev/null
            for _ in $(seq 1 20); do kill -0 "$p" 2>/dev/null || break; sleep 0.5; done
        fi
    done
    for n in "${NAMES[@]}"; do
        mountpoint -q "$RUN/$n/root" && { umount "$RUN/$n/root" || umount -l "$RUN/$n/root"; }
        ip link show "vb-$n" >/dev/null 2>&1 && ip link del "vb-$n"
    done
    ip link show "$BRIDGE" >/dev/null 2>&1 && ip link del "$BRIDGE"
    [ -d "$RUN" ] && rm -rf --one-file-system "$RUN"
    PID=()
    return 0
}

teardown() {
    local rc=$?
    set +e
    trap - EXIT INT TERM
    # Whoever reads our output may be gone (make test stops its whole process group): a write
    # must not end the teardown half-way (hosts down, their mounts and the bridge left).
    trap '' PIPE
    print_table
    if [ "${FLEET_KEEP:-0}" = 1 ]; then
        touch "$RUN/.keep" 2>/dev/null
        say "FLEET_KEEP=1: fleet left running (rc $rc); tear down with: FLEET_TEARDOWN_ONLY=1 $0"
        exit "$rc"
    fi
    # A lint still running beside a failed deploy: its processes, by parent pid.
    if [ -n "${LINT_PID:-}" ] && kill -0 "$LINT_PID" 2>/dev/null; then
        pkill -TERM -P "$LINT_PID"; kill -TERM "$LINT_PID" 2>/dev/null
    fi
    # A drill's load generator still running after a failed check (drill_load).
    if [ -n "${DRILL_PID:-}" ]; then kill -TERM "$DRILL_PID" 2>/dev/null; fi
    release_hosts
    if [ "${FLEET_TEARDOWN_ONLY:-0}" = 1 ]; then
        say "torn down"
    elif [ "$rc" = 0 ]; then
        say "PASS in $(( $(date +%s) - T0 ))s"
    else
        say "FAILED (rc $rc) after $(( $(date +%s) - T0 ))s; logs in $LOGS"
    fi
    exit "$rc"
}

# Refuse to start if the names or the subnet are taken: they might be someone else's.
preflight_network() {
    ip link show "$BRIDGE" >/dev/null 2>&1 && die "$BRIDGE exists (a leftover? check, then: ip link del $BRIDGE)"
    for n in "${NAMES[@]}"; do
        ip link show "vb-$n" >/dev/null 2>&1 && die "vb-$n exists"
    done
    if ip -4 addr show | grep -q "inet $NET\."; then die "$NET.0/24 is already on an interface here"; fi
    [ -z "$(ip -4 route show "$NET.0/24")" ] || die "a route to $NET.0/24 exists already"
    [ "$(cat /proc/sys/net/ipv4/ip_forward)" = 0 ] || say "note: ip_forward is on here; the hosts still have no route out"
    return 0
}

if [ "${FLEET_TEARDOWN_ONLY:-0}" = 1 ]; then
    for n in "${NAMES[@]}"; do adopt_pid "$n"; done
    trap teardown EXIT
    exit 0
fi
[ -x "$ANSIBLE_BIN/ansible-playbook" ] || die "no ansible-playbook in $ANSIBLE_BIN (make venv)"
# We hold the run lock, so a run directory here belongs to a run that died without its EXIT
# trap (killed, or the machine restarted). FLEET_KEEP leaves one on purpose: keep that.
if [ -e "$RUN" ]; then
    [ -e "$RUN/.keep" ] && die "$RUN was kept by FLEET_KEEP=1; tear it down first: FLEET_TEARDOWN_ONLY=1 $0"
    say "$RUN is left from a run that did not finish; tearing it down first"
    for n in "${NAMES[@]}"; do adopt_pid "$n"; done
    release_hosts
fi
preflight_network
trap teardown EXIT
trap 'exit 130' INT TERM

# Before any packet to a test address: it must route through our bridge, nowhere else.
assert_route() {
    local addr=$1 out
    out=$(ip route get "$addr" 2>&1) || die "ip route get $addr failed: $out"
    case "$out" in
        *" dev $BRIDGE "*) ;;
        *) die "NETWORK SAFETY: $addr does not route via $BRIDGE ($out); nothing sent" ;;
    esac
}
assert_all_routes() { for n in "${NAMES[@]}"; do assert_route "${IP[$n]}"; done; }

mark network+image
# ---- 1. the test network, first ---------------------------------------------------------------
ip link add "$BRIDGE" type bridge
echo 1 > "/proc/sys/net/ipv6/conf/$BRIDGE/disable_ipv6"
ip addr add "$BRIDGE_ADDR/24" dev "$BRIDGE"
ip link set "$BRIDGE" up
assert_all_routes
mkdir -p "$RUN" "$LOGS"
rm -rf --one-file-system "${LOGS:?}"/*
phase "network: $BRIDGE $BRIDGE_ADDR/24"

# ---- 2. image and artifacts -------------------------------------------------------------------
ROOTFS=$("$HERE/image.sh")
phase "image: $ROOTFS"

mark artifacts
# Releases (ansible/build.sh) in a build directory of the fleet test's own, kept between runs so
# the wheelhouse is rebuilt only when fallback_app/ changed.
export FASTPOLL_BUILD_DIR=$STATE/build
if [ -n "${FLEET_POLL_SERVER_BIN:-}" ]; then
    POLL_SERVER_BIN=$FLEET_POLL_SERVER_BIN
else
    make -s -C "$REPO/poll_server" > "$LOGS/build-poll_server.log" 2>&1 || { cat "$LOGS/build-poll_server.log"; die "poll_server build failed"; }
    # A snapshot: a rebuild in the work tree during the test must not look like a new version.
    cp "$REPO/poll_server/build/poll_server" "$RUN/poll_server"
    POLL_SERVER_BIN=$RUN/poll_server
fi
FASTPOLL_POLL_SERVER_BIN=$POLL_SERVER_BIN "$REPO/ansible/build.sh" > "$LOGS/build.log" 2>&1 \
    || { cat "$LOGS/build.log"; die "ansible/build.sh failed"; }
RELEASE_A=$(cat "$FASTPOLL_BUILD_DIR/current/RELEASE")
phase "artifacts: release $RELEASE_A in $FASTPOLL_BUILD_DIR"

mark hosts
# ---- 3. boot the hosts ------------------------------------------------------------------------
ssh-keygen -q -N '' -t ed25519 -C fastpoll-fleet-test -f "$RUN/id_ed25519"
: > "$RUN/known_hosts"
for n in "${NAMES[@]}"; do
    d=$RUN/$n
    mkdir -p "$d/upper" "$d/work" "$d/root"
    mount -t overlay "overlay-$n" -o "lowerdir=$ROOTFS,upperdir=$d/upper,workdir=$d/work" "$d/root"
    r=$d/root
    echo "$n" > "$r/etc/hostname"
    printf '127.0.0.1 localhost\n127.0.1.1 %s\n' "$n" > "$r/etc/hosts"
    for m in "${NAMES[@]}"; do echo "${IP[$m]} $m" >> "$r/etc/hosts"; done
    # Static address, no gateway, no IPv6: the host can reach the test subnet and nothing else.
    mkdir -p "$r/etc/systemd/network"
    cat > "$r/etc/systemd/network/10-host0.network" <<EOF
[Match]
Name=host0

[Network]
Address=${IP[$n]}/24
LinkLocalAddressing=no
IPv6AcceptRA=no
EOF
    ln -sf /lib/systemd/system/systemd-networkd.service \
        "$r/etc/systemd/system/multi-user.target.wants/systemd-networkd.service"
    # Quick, bounded shutdown at teardown; no per-user systemd for ssh sessions.
    mkdir -p "$r/etc/systemd/system.conf.d"
    printf '[Manager]\nDefaultTimeoutStopSec=15s\n' > "$r/etc/systemd/system.conf.d/10-fleet-test.conf"
    ln -sf /dev/null "$r/etc/systemd/system/user@.service"
    # Per-run keys: our client key, and a host key pinned in known_hosts (strict checking).
    install -d -m 0700 "$r/root/.ssh"
    install -m 0600 "$RUN/id_ed25519.pub" "$r/root/.ssh/authorized_keys"
    ssh-keygen -q -N '' -t ed25519 -C "$n" -f "$r/etc/ssh/ssh_host_ed25519_key"
    echo "${IP[$n]} $(cut -d' ' -f1,2 "$r/etc/ssh/ssh_host_ed25519_key.pub")" >> "$RUN/known_hosts"
    systemd-nspawn --boot --keep-unit --register=no --machine="$n" --directory="$r" \
        --network-bridge="$BRIDGE" --resolv-conf=off --timezone=off \
        > "$LOGS/$n.console.log" 2>&1 < /dev/null 8>&- &
    PID[$n]=$!
    echo "${PID[$n]}" > "$d/nspawn.pid"
done

SSH=(ssh -i "$RUN/id_ed25519" -o UserKnownHostsFile="$RUN/known_hosts" -o StrictHostKeyChecking=yes
     -o BatchMode=yes -o ConnectTimeout=3 -o LogLevel=ERROR)
on() { local n=$1; shift; assert_route "${IP[$n]}"; "${SSH[@]}" "root@${IP[$n]}" "$@"; }

for n in "${NAMES[@]}"; do
    ok=0
    for _ in $(seq 1 60); do
        kill -0 "${PID[$n]}" 2>/dev/null || { tail -30 "$LOGS/$n.console.log"; die "$n: nspawn exited"; }
        if on "$n" true 2>/dev/null; then ok=1; break; fi
        sleep 1
    done
    [ "$ok" = 1 ] || { tail -30 "$LOGS/$n.console.log"; die "$n: no ssh after 60s"; }
    # The hosts' only route is the test subnet.
    routes=$(on "$n" ip -4 route show)
    [ "$routes" = "$NET.0/24 dev host0 proto kernel scope link src ${IP[$n]} " ] \
        || [ "$routes" = "$NET.0/24 dev host0 proto kernel scope link src ${IP[$n]}" ] \
        || die "$n: unexpected routes: $routes"
done
phase "hosts up: ${NAMES[*]}"

# ---- 4. inventories and ansible -----------------------------------------------------------------
# inventory_head FILE: the settings every test host shares.
inventory_head() {
    # The paging drills' webhook receiver (tests/fleet/monitoring.sh starts it on the control
    # node): a port free now on the bridge address, below the ephemeral range.
    [ -n "${WEBHOOK_PORT:-}" ] || WEBHOOK_PORT=$("$REPO/.venv/bin/python" -m fastpoll_testkit.webhook free-port "$BRIDGE_ADDR") \
        || die "no free port on $BRIDGE_ADDR for the webhook receiver"
    cat > "$1" <<EOF
all:
  vars:
    ansible_user: root
    ansible_ssh_private_key_file: $RUN/id_ed25519
    ansible_ssh_common_args: >-
      -o UserKnownHostsFile=$RUN/known_hosts -o StrictHostKeyChecking=yes -o ConnectTimeout=5
    # The hosts cannot reach a mirror; everything is in the image.
    fastpoll_apt_cache_valid_time: 0
    # This machine caps open files at 20000 per process. Held long polls stay below it (checked).
    poll_server_limit_nofile: 20000
    fastpoll_server_max_held: 16000
    fallback_app_limit_nofile: 20000
    nginx_worker_rlimit_nofile: 20000
    nginx_worker_connections: 4096
    # TLS with the test's own certificate (put on the pollers before the deploy). The fleet
    # serves plain HTTP too, so the checks below can use it; fp-solo redirects it (the default),
    # later refuses it (nginx_http_mode).
    nginx_tls_certificate: /etc/ssl/fastpoll-test.pem
    nginx_tls_certificate_key: /etc/ssl/private/fastpoll-test.key
    # The control node plays the site's backend: it calls the app's write API.
    firewall_api_clients: ["$BRIDGE_ADDR"]
    # Monitoring (tests/fleet/monitoring.sh): the control node queries Prometheus's API. A 10 s
    # scrape until the monitoring scenario, which plays the monitoring hosts again with 2 s
    # (MONITORING_FAST) so that its alerts fire within seconds: at 2 s all along, Prometheus and
    # the exporters took about an eighth of make test's CPU time.
    fastpoll_prometheus_clients: ["$BRIDGE_ADDR"]
    monitoring_scrape_interval: 10s
    monitoring_scrape_timeout: 5s
    monitoring_evaluation_interval: 10s
    monitoring_alert_for: {PollerDown: 10s, CacheServerDownCovered: 10s, CacheServerUnreachable: 10s}
    # The paging drills: Alertmanager's pages and tickets go to the test's receiver; the SLO
    # alerts run 30 times faster (windows of 10 s to 144 min, ErrorBudgetBurn's for: 4 s), and a
    # group's first notification waits 5 s, a changed one 10 s.
    alertmanager_page_webhook_url: http://$BRIDGE_ADDR:$WEBHOOK_PORT/page
    alertmanager_ticket_webhook_url: http://$BRIDGE_ADDR:$WEBHOOK_PORT/ticket
    alertmanager_group_wait: 5s
    alertmanager_group_interval: 10s
    monitoring_slo_time_divisor: 30
    fallback_app_workers: 2
    # The rollout gate watches 3 s after a batch, not 15 (the checks' load is hundreds of polls a
    # second, and every batch pays the window and the log's flush after it).
    rollout_gate_seconds: 3
    # nginx flushes the access log every second, so the gate waits 2 s for a window's lines, not 6.
    fastpoll_access_log_flush_seconds: 1
    # Checks poll keys published minutes earlier (the seeded user after scaling): on a loaded
    # machine more than the default 300 s passed in between (505 s in one run) and the key
    # had expired. The runs that change the config later pass fastpoll_cache_ttl=299.
    fastpoll_cache_ttl: 3600
    memcached_memory_mb: 32
    redis_maxmemory: 32mb
    # Clients authenticate as this Redis ACL user (Redis's default user is off).
    fastpoll_redis_username: fastpoll
EOF
}
inventory_head "$RUN/inventory.yml"
cat >> "$RUN/inventory.yml" <<EOF
    poll_server_instances: 2
    nginx_http_mode: serve
  hosts:
EOF
for n in "${FLEET[@]}"; do
    printf '    %s:\n      ansible_host: %s\n      fastpoll_private_ip: %s\n' "$n" "${IP[$n]}" "${IP[$n]}" \
        >> "$RUN/inventory.yml"
done
cat >> "$RUN/inventory.yml" <<EOF
  children:
    pollers:
      hosts:
        fp-poll1:
        fp-poll2:
    memcached:
      hosts:
        fp-poll2:
        fp-data1:
    redis:
      hosts:
        fp-data1:
    app:
      hosts:
        fp-data1:
        fp-app2:
    postgresql:
      hosts:
        fp-db1:
        fp-app2:
    postgresql_dcs:
      hosts:
        fp-db1:
        fp-app2:
        fp-mon1:
    backup:
      hosts:
        fp-mon1:
    monitoring:
      hosts:
        fp-mon1:
EOF
# The one-host layout of ansible/inventories/single: everything on loopback, one instance per
# vCPU (poll_server_instances unset).
inventory_head "$RUN/solo.yml"
cat >> "$RUN/solo.yml" <<EOF
  hosts:
    fp-solo:
      ansible_host: ${IP[fp-solo]}
      fastpoll_private_ip: 127.0.0.1
  children:
    pollers: {hosts: {fp-solo: }}
    memcached: {hosts: {fp-solo: }}
    redis: {hosts: {fp-solo: }}
    app: {hosts: {fp-solo: }}
EOF
# The Redis password: per run, never in the repository (as a vault file would be in production).
( umask 077; printf 'fastpoll_redis_password: "%s"\n' "$(head -c 24 /dev/urandom | base64 | tr -d '/+=')" \
    > "$RUN/secrets.yml"
  # The signing secret, also per run; the control node keeps a copy to sign the test's poll URLs.
  "$REPO/.venv/bin/python" -c 'import secrets; print(secrets.token_hex(32))' > "$RUN/signing.key"
  printf 'fastpoll_signing_secrets: ["%s"]\n' "$(cat "$RUN/signing.key")" >> "$RUN/secrets.yml"
  head -c 24 /dev/urandom | base64 | tr -d '/+=' > "$RUN/api.token"
  printf 'fastpoll_api_token: "%s"\n' "$(cat "$RUN/api.token")" >> "$RUN/secrets.yml"
  printf 'fastpoll_db_password: "%s"\n' "$(head -c 24 /dev/urandom | base64 | tr -d '/+=')" >> "$RUN/secrets.yml" )
# The TLS certificate: self-signed, made here, for the pollers' names and addresses.
openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=fastpoll-fleet-test \
    -addext "subjectAltName=DNS:fp-poll1,DNS:fp-poll2,DNS:fp-solo,IP:${IP[fp-poll1]},IP:${IP[fp-poll2]},IP:${IP[fp-solo]}" \
    -keyout "$RUN/tls.key" -out "$RUN/tls.pem" 2>/dev/null || die "openssl req failed"
for n in fp-poll1 fp-poll2 fp-solo; do
    on "$n" 'cat > /etc/ssl/fastpoll-test.pem' < "$RUN/tls.pem"
    on "$n" 'umask 077; cat > /etc/ssl/private/fastpoll-test.key' < "$RUN/tls.key"
done

export ANSIBLE_CONFIG=$REPO/ansible/ansible.cfg ANSIBLE_NOCOLOR=1 ANSIBLE_FORCE_COLOR=0
export ANSIBLE_HOME=$RUN/ansible-home ANSIBLE_LOCAL_TEMP=$RUN/ansible-tmp
export ANSIBLE_SSH_CONTROL_PATH_DIR=$RUN/cp
# Every run's output once more, each line with its time and the run's pid: where a slow run went.
export ANSIBLE_LOG_PATH=$LOGS/ansible-timed.log
# Facts (the hardware subset) once per host per test, not once per run: they do not change here.
export ANSIBLE_CACHE_PLUGIN=jsonfile ANSIBLE_CACHE_PLUGIN_CONNECTION=$RUN/facts ANSIBLE_CACHE_PLUGIN_TIMEOUT=86400
EXTRA=(-e "@$RUN/secrets.yml" -e "fastpoll_release_dir=$FASTPOLL_BUILD_DIR/current")
# The fleet's runs use Mitogen's strategy (docs/deploy.md, "Faster runs"): about half the time of a
# run here. fp-solo's runs (solo below: --check on a fresh host, the deploy, the second run) keep
# Ansible's default, so both are tested.
MITOGEN_DIR=$("$ANSIBLE_BIN/python" -c 'import ansible_mitogen, os; print(os.path.dirname(ansible_mitogen.__file__))') \
    || die "no Mitogen in $ANSIBLE_BIN's Python (make .venv/.ansible)"
export ANSIBLE_STRATEGY_PLUGINS=$MITOGEN_DIR/plugins/strategy ANSIBLE_STRATEGY=mitogen_linear

run_no=0
# playbook LABEL [args...]: runs site.yml on the fleet, keeps the log, fails the test if ansible
# fails. INVENTORY=... selects another inventory.
playbook() {
    local label=$1; shift
    run_no=$((run_no + 1))
    local log=$LOGS/ansible-$run_no-$label.log
    assert_all_routes
    if ! "$ANSIBLE_BIN/ansible-playbook" -i "${INVENTORY:-$RUN/inventory.yml}" "$REPO/ansible/site.yml" \
            "${EXTRA[@]}" "$@" > "$log" 2>&1; then
        tail -60 "$log"
        die "ansible-playbook ($label) failed; log: $log"
    fi
    LAST_LOG=$log
}
# Sum of changed= over the PLAY RECAP of a log (default: the last run).
recap_changed() { awk '/PLAY RECAP/{r=1; next} r && /changed=/{ for(i=1;i<=NF;i++) if ($i ~ /^changed=/) { split($i,a,"="); s+=a[2] } } END{print s+0}' "${1:-$LAST_LOG}"; }
# solo LABEL [--check-first] [args...]: the same for the one-host inventory, in the background
# (SOLO_PID, SOLO_LOG); --check-first runs it with --check before.
solo() {
    local label=$1; shift
    SOLO_LOG=$LOGS/ansible-solo-$label.log
    assert_all_routes
    ( INVENTORY=$RUN/solo.yml; run_no=0; LOGS=$LOGS/solo-$label; mkdir -p "$LOGS"
      unset ANSIBLE_STRATEGY
      if [ "${1:-}" = --check-first ]; then
          shift
          playbook fresh-check --check > "$SOLO_LOG" 2>&1
      fi
      playbook "$label" "$@" >> "$SOLO_LOG" 2>&1; cp "$LAST_LOG" "$SOLO_LOG.ansible" ) &
    SOLO_PID=$!
}
solo_wait() {
    wait "$SOLO_PID" || { cat "$SOLO_LOG"; die "fp-solo: $1 failed"; }
}

mark ""
# ---- helpers of the checks ---------------------------------------------------------------------
# http METHOD HOST PATH [curl args]: a request to HOST's nginx; prints "STATUS X-Poll-Source"
# and leaves the body and headers in $RUN/body and $RUN/headers.
# Poll URLs are signed (docs/security.md): sign a /Poll/ target with this run's secret, exactly
# as the app's POST /api/poll-url would. A target that already has a sig= is sent as it is.
signed() {
    case $1 in
    /Poll/*sig=*|/[!P]*) echo "$1"; return ;;
    esac
    "$REPO/.venv/bin/python" - "$RUN/signing.key" "$1" <<'PY'
import sys, time
from fastpoll_app.keys import derive_key
from fastpoll_app.signing import load_secrets, signed_query
target = sys.argv[2].encode()
key = derive_key(b"/Poll", target[len(b"/Poll"):], [b"user_id"])
query = signed_query(load_secrets(sys.argv[1])[0], key, int(time.time()) + 3600)
print(target.decode() + ("&" if b"?" in target else "?") + query.decode())
PY
}

# fp-solo redirects plain HTTP (nginx_http_mode: redirect): it is asked over TLS.
declare -A SCHEME=([fp-solo]=https)
http() {
    local method=$1 n=$2 path; path=$(signed "$3"); shift 3
    assert_route "${IP[$n]}"
    curl -sS -m 10 -X "$method" -o "$RUN/body" -D "$RUN/headers" --cacert "$RUN/tls.pem" "$@" \
        "${SCHEME[$n]:-http}://${IP[$n]}$path" >/dev/null \
        || die "curl $method $n $path failed"
    local status source
    status=$(awk 'NR==1{print $2}' "$RUN/headers")
    source=$(tr -d '\r' < "$RUN/headers" | awk -F': ' 'tolower($1)=="x-poll-source"{print $2}')
    echo "$status ${source:--}"
}
expect() { [ "$1" = "$2" ] || die "$3: got '$1', want '$2'"; }
# publish APPHOST USER TEXT: POST /api/messages to an app host's private listener with the write
# API's bearer token (the public edge has no write API); prints the status.
publish() {
    local n=$1 body="{\"user_id\": $2, \"text\": \"$3\"}"
    if [ "$n" = fp-solo ]; then
        on fp-solo curl -sS -m 10 -o /dev/null -w '%{http_code}' -X POST -H "'Authorization: Bearer $(cat "$RUN/api.token")'" \
            -H "'Content-Type: application/json'" --data "'$body'" http://127.0.0.1:8000/api/messages
        return
    fi
    assert_route "${IP[$n]}"
    curl -sS -m 10 -o /dev/null -w '%{http_code}' -X POST -H "Authorization: Bearer $(cat "$RUN/api.token")" \
        -H 'Content-Type: application/json' --data "$body" "http://${IP[$n]}:8000/api/messages"
}
# drill_load SCRIPT TAG MAX_SECONDS USERS PATHS: a failover drill's load generator (tests/fleet/SCRIPT,
# fastpoll_testkit.drill's options) against both pollers and both app hosts from the control node,
# in the background (DRILL_PID): USERS comma-separated, PATHS signed poll paths |-separated; the
# events in $RUN/TAG-events (emptied here), the record in $RUN/TAG-load.json, its output in
# $LOGS/TAG-load.log.
drill_load() {
    local script=$1 tag=$2 max=$3 users=$4 paths=$5 n
    for n in "${POLLERS[@]}" "${APPS[@]}"; do assert_route "${IP[$n]}"; done
    : > "$RUN/$tag-events"
    "$REPO/.venv/bin/python" "$HERE/$script" --pollers "${IP[fp-poll1]},${IP[fp-poll2]}" \
        --apps "${IP[fp-data1]}:8000,${IP[fp-app2]}:8000" --token-file "$RUN/api.token" \
        --users "$users" --paths "$paths" --events "$RUN/$tag-events" --out "$RUN/$tag-load.json" \
        --max-seconds "$max" > "$LOGS/$tag-load.log" 2>&1 8>&- &
    DRILL_PID=$!
}
# drill_stop TAG: the drill's `stop` event, then its load generator's end and output.
drill_stop() {
    echo "stop $(date +%s.%N)" >> "$RUN/$1-events"
    wait "$DRILL_PID" || { cat "$LOGS/$1-load.log"; DRILL_PID=""; die "the load generator failed"; }
    DRILL_PID=""
    cat "$LOGS/$1-load.log"
}
# poll_url APPHOST USER: a poll URL issued by the app (POST /api/poll-url), path and query. While
# that app host restarts (a rollout), the other app host issues it.
poll_url() {
    local n=$1 try url
    for try in $(seq 1 20); do
        assert_route "${IP[$n]}"
        url=$(curl -sS -m 5 -X POST -H "Authorization: Bearer $(cat "$RUN/api.token")" -H 'Content-Type: application/json' \
            --data "{\"user_id\": $2}" "http://${IP[$n]}:8000/api/poll-url" 2>/dev/null \
            | python3 -c 'import json,sys; print(json.load(sys.stdin)["url"])' 2>/dev/null) && [ -n "$url" ] && { echo "$url"; return; }
        if [ "$n" = "${APPS[0]}" ]; then n=${APPS[1]}; else n=${APPS[0]}; fi
        sleep 0.5
    done
    die "no app host issues a poll URL for user $2"
}
redis_pass=$(sed -n 's/^fastpoll_redis_password: "\(.*\)"$/\1/p' "$RUN/secrets.yml")

# check_instances N [HOST...]: N active instances on every poller (or HOST), each pinned to its
# own CPU, nginx's upstream listing exactly them, and no other instance enabled.
check_instances() {
    local want=$1 n hosts
    if [ $# -gt 1 ]; then hosts=("${@:2}"); else hosts=("${POLLERS[@]}"); fi
    for n in "${hosts[@]}"; do
        on "$n" bash -s "$want" <<'EOF' || die "$n: instance check failed (want $1)"
set -euo pipefail
want=$1
cpus=$(nproc --all)
active=$(systemctl list-units --state=active --plain --no-legend 'fastpoll-poller@*.service' | awk '{print $1}' | sort)
count=$(echo "$active" | grep -c . || true)
[ "$count" = "$want" ] || { echo "active instances: $count, want $want: $active"; exit 1; }
i=0
for port in $(seq 8101 $((8100 + want))); do
    u=fastpoll-poller@$port.service
    echo "$active" | grep -qx "$u" || { echo "$u not active"; exit 1; }
    [ "$(systemctl is-enabled "$u")" = enabled ] || { echo "$u not enabled"; exit 1; }
    aff=$(systemctl show -p CPUAffinity --value "$u")
    pid=$(systemctl show -p MainPID --value "$u")
    real=$(awk '/^Cpus_allowed_list/{print $2}' "/proc/$pid/status")
    expect=$((i % cpus))
    [ "$aff" = "$expect" ] && [ "$real" = "$expect" ] || { echo "$u: CPUAffinity=$aff, process on $real, want $expect"; exit 1; }
    # nginx reaches it through its unix socket: 0660, group www-data (nginx's workers) only.
    sock=/run/fastpoll-poller/$port.sock
    grep -q "server unix:$sock " /etc/nginx/sites-enabled/fastpoll.conf || { echo "$sock not in nginx upstream"; exit 1; }
    [ -S "$sock" ] && [ "$(stat -c '%a %U %G' "$sock")" = "660 fastpoll-poller www-data" ] \
        || { echo "$sock: $(stat -c '%F %a %U %G' "$sock" 2>&1)"; exit 1; }
    echo "  $u active, enabled, CPUAffinity=$aff (pid $pid on cpu $real)"
    i=$((i + 1))
done
extra=$(awk '/^upstream fastpoll_pollers/{f=1} f && $1 == "server" {c++} f && /}/{f=0} END{print c+0}' /etc/nginx/sites-enabled/fastpoll.conf)
[ "$extra" = "$want" ] || { echo "nginx upstream lists $extra pollers, want $want"; exit 1; }
for u in $(systemctl list-units --all --plain --no-legend 'fastpoll-poller@*.service' | awk '{print $1}'); do
    port=${u#fastpoll-poller@}; port=${port%.service}
    if [ "$port" -gt $((8100 + want)) ]; then
        [ "$(systemctl is-active "$u")" != active ] || { echo "surplus $u still active"; exit 1; }
        [ "$(systemctl is-enabled "$u" 2>/dev/null)" != enabled ] || { echo "surplus $u still enabled"; exit 1; }
    fi
done
EOF
        say "$n: $want instances"
    done
}
# wakeups CAUSE: fp-poll1's held polls answered for CAUSE, summed over its instances.
wakeups() {
    on fp-poll1 "for a in 9101 9102; do curl -fsS http://127.0.0.1:\$a/metrics; done" \
        | awk -v c="fastpoll_held_wakeups_total{cause=\"$1\"}" '$1 == c {s += $2} END {print s + 0}'
}
app_up() {
    local a
    for a in "${APPS[@]}"; do
        for _ in $(seq 1 60); do on "$a" curl -fsS -m 2 -o /dev/null "http://${IP[$a]}:8000/healthz" 2>/dev/null && break; sleep 1; done
    done
}
port_open() { on "$1" timeout 3 bash -c "'</dev/tcp/$2/$3'" 2>/dev/null; }
# check_converged: on every poller and app host, each running instance reports the sha256 of the
# fastpoll.ini on its host (fastpoll_config_info), and nothing on disk is newer than it.
check_converged() {
    local n out
    for n in "${POLLERS[@]}" "${APPS[@]}"; do
        out=$(on "$n" /usr/local/libexec/fastpoll-stale --config /etc/fastpoll/fastpoll.ini \
            fastpoll-poller@8101.service=http://127.0.0.1:9101/metrics fastpoll-poller@8102.service=http://127.0.0.1:9102/metrics \
            "fastpoll-app.service=http://${IP[$n]}:8000/metrics")
        echo "$out" | sed "s/^/  $n: /"
        if echo "$out" | grep -q ' stale '; then die "$n runs an old config after the re-run"; fi
        if echo "$out" | grep -q ' unknown '; then
            # Only a poll server built before fastpoll_config_info (the C side's part) may say so.
            if echo "$out" | grep ' unknown ' | grep -qv '^fastpoll-poller@' \
                    || on "$n" grep -qa fastpoll_config_info /usr/local/bin/poll_server 2>/dev/null; then
                die "$n: a service reports no config hash"
            fi
            say "$n: this poll server has no fastpoll_config_info yet: its instances are not checked"
        fi
    done
}
# ab_rounds PID WHAT: bounded ab rounds (at most 400 per phase, 1 s apart) against both pollers
# until PID ends, each on a URL an app host issues right then for user $rot_u and on $first_url:
# every answer 2xx. At least one round must overlap each phase.
ab_rounds() {
    local pid=$1 what=$2 url n mine=0
    while kill -0 "$pid" 2>/dev/null && [ "$mine" -lt 400 ]; do
        n=${POLLERS[$((rounds % 2))]}
        for url in "$(poll_url "${APPS[$((rounds % 2))]}" "$rot_u")" "$first_url"; do
            assert_route "${IP[$n]}"
            ab -q -n 300 -c 5 -s 10 "http://${IP[$n]}$url" > "$RUN/ab.txt" 2>&1 || { cat "$RUN/ab.txt"; die "ab failed"; }
            if [ "$(awk '/^Failed requests:/{print $3}' "$RUN/ab.txt")" != 0 ] || grep -q '^Non-2xx' "$RUN/ab.txt"; then
                cat "$RUN/ab.txt"; die "$what: a valid URL failed on $n (round $rounds): $url"
            fi
        done
        rounds=$((rounds + 1)); mine=$((mine + 1))
        # The pause leaves the play CPU (two cores); load still overlaps every restart.
        sleep 1
    done
    [ "$mine" -ge 1 ] || die "no ab round overlapped this rotation phase"
    per_phase="$per_phase $mine"
}
redis_cli() { on fp-data1 redis-cli -h "${IP[fp-data1]}" --user fastpoll --no-auth-warning "$@"; }

# ini_list HOST KEY: the values of KEY's lines in HOST's fastpoll.ini, comma-separated.
ini_list() { on "$1" "sed -n 's/^$2 = //p' /etc/fastpoll/fastpoll.ini" | paste -sd, -; }
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

# The first deploy (every scenario's starting point), and a seeded user whose answer is cached:
# later scenarios poll it (scaling, the upgrade's ab rounds, TLS, the rollback).
seed_user=$((RANDOM % 9000 + 1000))
first_deploy() {
# fp-solo is a fresh host: `--check` on it first (nothing installed yet, so every task must cope
# with what is not there), then its deploy, both beside the fleet's.
solo deploy --check-first
playbook deploy
solo_wait "first deploy"
phase "first deploy ($(recap_changed) changes; fp-solo $(recap_changed "$SOLO_LOG.ansible"))"
expect "$(publish fp-data1 "$seed_user" "hello fleet")" 201 "publish the seeded user"
}

# ==== scenarios ===================================================================================

# The lint scenario starts before the first deploy and runs beside it (LINT_PID; a CPU the
# deploy's waits leave free); sc_lint, after the deploy, takes its verdict.
lint_start() {
    ( "$ANSIBLE_BIN/ansible-playbook" -i "$RUN/inventory.yml" "$REPO/ansible/site.yml" --syntax-check \
          > "$LOGS/syntax.log" 2>&1 || { echo "--syntax-check failed" > "$RUN/lint.verdict"; exit 1; }
      if [ -x "$ANSIBLE_BIN/ansible-lint" ]; then
          (cd "$REPO/ansible" && PATH="$ANSIBLE_BIN:$PATH" ansible-lint --profile production --nocolor -q) \
              > "$LOGS/lint.log" 2>&1 || { echo "ansible-lint (production profile) failed" > "$RUN/lint.verdict"; exit 1; }
          echo "ansible-lint production: clean, --syntax-check: ok" > "$RUN/lint.verdict"
      else
          echo "(no ansible-lint in $ANSIBLE_BIN), --syntax-check: ok" > "$RUN/lint.verdict"
      fi ) &
    LINT_PID=$!
}
sc_lint() {
local verdict
wait "$LINT_PID" || { verdict=$(cat "$RUN/lint.verdict" 2>/dev/null); cat "$LOGS/syntax.log" "$LOGS/lint.log" 2>/dev/null; die "${verdict:-lint failed}"; }
phase "$(cat "$RUN/lint.verdict") (beside the first deploy)"
}

sc_converge() {
# The second run and --check --diff on the converged fleet at the same time (neither changes
# anything when the first run converged; the second run's changed=0 proves it).
assert_all_routes
"$ANSIBLE_BIN/ansible-playbook" -i "$RUN/inventory.yml" "$REPO/ansible/site.yml" "${EXTRA[@]}" --check --diff \
    > "$LOGS/ansible-check-diff.log" 2>&1 &
check_pid=$!
solo second-run
playbook second-run
changed=$(recap_changed)
[ "$changed" = 0 ] || { grep -E '^(changed|TASK)' "$LAST_LOG" | grep -B1 '^changed' ; die "second run changed $changed things (want 0)"; }
solo_wait "second run"
changed=$(recap_changed "$SOLO_LOG.ansible")
[ "$changed" = 0 ] || { grep -B1 '^changed' "$SOLO_LOG.ansible"; die "fp-solo: second run changed $changed things (want 0)"; }
wait "$check_pid" || { tail -60 "$LOGS/ansible-check-diff.log"; die "--check --diff failed"; }
phase "second run: changed=0 (fleet and fp-solo); --check --diff on the deployed fleet: ok"
}

sc_data_host() {
# ---- 5. the data host: private binds, the Redis password, one memcached list everywhere --------
on fp-data1 bash -s "${IP[fp-data1]}" "$redis_pass" <<'EOF' || die "fp-data1: service check failed"
set -euo pipefail
ip=$1 pass=$2
listen=$(ss -ltnH | awk '{print $4}')
for port in 11211 6379 8000; do
    got=$(echo "$listen" | grep ":$port\$" | sort | tr '\n' ' ')
    [ "$got" = "$ip:$port " ] || { echo "port $port listens on '$got', want only $ip:$port"; exit 1; }
done
out=$(redis-cli -h "$ip" PING 2>&1)
case "$out" in *NOAUTH*) ;; *) echo "redis answered without the password: $out"; exit 1;; esac
[ "$(redis-cli -h "$ip" --user fastpoll --no-auth-warning -a "$pass" PING)" = PONG ] || { echo "redis refuses the password"; exit 1; }
[ "$(stat -c '%a %U %G' /etc/fastpoll/redis.pass)" = "640 root fastpoll" ] || { echo "redis.pass mode/owner wrong"; exit 1; }
EOF
servers=""
for n in "${FLEET[@]}"; do
    line=$(on "$n" grep '^servers' /etc/fastpoll/fastpoll.ini | tr '\n' ' ')
    [ -z "$servers" ] || [ "$line" = "$servers" ] || die "$n: memcached list differs: '$line' vs '$servers'"
    servers=$line
done
# Sorted by inventory name: fp-data1 before fp-poll2.
expect "$servers" "servers = ${IP[fp-data1]}:11211 servers = ${IP[fp-poll2]}:11211 " "memcached list"
say "memcached, redis and the app listen on the private address only; redis wants its password; one list: $servers"
}

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

# Long polls through the edge (issue 12). The rendered config first: the [server] long-poll keys,
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

sc_scaling() {
# ---- 8. scaling 2 -> 1 -> 2 ---------------------------------------------------------------------
# Meanwhile fp-solo switches to nginx_http_mode: refuse (its nginx only: tags config,pollers).
solo refuse -e nginx_http_mode=refuse --tags config,pollers
playbook scale-down --limit pollers -e poll_server_instances=1
check_instances 1
expect "$(http GET fp-poll1 "/Poll/getMessages?user_id=$seed_user")" "200 cache" "hit after scaling down"
playbook scale-up --limit pollers -e poll_server_instances=2
check_instances 2
expect "$(http GET fp-poll2 "/Poll/getMessages?user_id=$seed_user")" "200 cache" "hit after scaling up"
solo_wait "the switch to nginx_http_mode: refuse"
# refuse: no plain-HTTP listener at all (connection refused), TLS as before.
assert_route "${IP[fp-solo]}"
rc=0; curl -sS -m 5 -o /dev/null "http://${IP[fp-solo]}/healthz" 2>/dev/null || rc=$?
expect "$rc" 7 "fp-solo: curl's exit code for plain HTTP in refuse mode (7: connection refused)"
expect "$(http GET fp-solo /healthz | cut -d' ' -f1)" 200 "fp-solo: /healthz over TLS in refuse mode"
phase "scaling 2 -> 1 -> 2; meanwhile fp-solo refuses plain HTTP (TLS still answers)"
}

sc_upgrade() {
# ---- 9. rolling upgrade under load ------------------------------------------------------------
# A new version: the same source with another version string, built on the control node.
if [ -n "${FLEET_POLL_SERVER_BIN:-}" ]; then
    cp "$POLL_SERVER_BIN" "$RUN/poll_server-v2"
    printf '\n# v2\n' >> "$RUN/poll_server-v2"
    NEW_BIN=$RUN/poll_server-v2
else
    mkdir -p "$RUN/v2"
    cp -r "$REPO/poll_server/Makefile" "$REPO/poll_server/src" "$RUN/v2/"
    sed -i 's/#define FP_VERSION "\(.*\)"/#define FP_VERSION "\1+fleet-upgrade"/' "$RUN/v2/src/version.h"
    grep -q 'fleet-upgrade' "$RUN/v2/src/version.h" || die "could not set a new version string"
    make -s -C "$RUN/v2" build/poll_server > "$LOGS/build-v2.log" 2>&1 || { cat "$LOGS/build-v2.log"; die "v2 build failed"; }
    NEW_BIN=$RUN/v2/build/poll_server
fi
new_sum=$(sha256sum < "$NEW_BIN" | cut -d' ' -f1)
declare -A OLDPID=()
for n in "${POLLERS[@]}"; do
    for port in 8101 8102; do
        OLDPID[$n:$port]=$(on "$n" systemctl show -p MainPID --value "fastpoll-poller@$port.service")
    done
done

# The upgrade runs in the background; ab runs bounded rounds (1000 requests, 5 concurrent, 10 s
# timeout each, 0.5 s apart) against both pollers, alternating, until it is done. Every round must have 0
# failed and 0 non-2xx requests.
# Release B: the new binary with the same wheelhouse; build/current now names it.
FASTPOLL_POLL_SERVER_BIN=$NEW_BIN "$REPO/ansible/build.sh" > "$LOGS/build-v2.log" 2>&1 \
    || { cat "$LOGS/build-v2.log"; die "build.sh (release B) failed"; }
RELEASE_B=$(cat "$FASTPOLL_BUILD_DIR/current/RELEASE")
[ "$RELEASE_B" != "$RELEASE_A" ] || die "release B has the id of release A"
assert_all_routes
"$ANSIBLE_BIN/ansible-playbook" -i "$RUN/inventory.yml" "$REPO/ansible/site.yml" "${EXTRA[@]}" --limit pollers \
    > "$LOGS/ansible-upgrade.log" 2>&1 &
upgrade_pid=$!
rounds=0 total=0
ab_path=$(signed "/Poll/getMessages?user_id=$seed_user")
while kill -0 "$upgrade_pid" 2>/dev/null && [ "$rounds" -lt 300 ]; do
    n=${POLLERS[$((rounds % 2))]}
    assert_route "${IP[$n]}"
    ab -q -n 1000 -c 5 -s 10 "http://${IP[$n]}$ab_path" > "$RUN/ab.txt" 2>&1 \
        || { cat "$RUN/ab.txt"; die "ab against $n failed"; }
    failed=$(awk '/^Failed requests:/{print $3}' "$RUN/ab.txt")
    complete=$(awk '/^Complete requests:/{print $3}' "$RUN/ab.txt")
    non2xx=$(awk '/^Non-2xx responses:/{print $3}' "$RUN/ab.txt")
    [ "$failed" = 0 ] && [ -z "$non2xx" ] && [ "$complete" = 1000 ] \
        || { cat "$RUN/ab.txt"; die "ab round $rounds against $n during the upgrade: failed=$failed non-2xx=${non2xx:-0}"; }
    rounds=$((rounds + 1)); total=$((total + complete))
    # A pause between rounds leaves the play CPU (two cores): load still overlaps every restart.
    sleep 0.5
done
wait "$upgrade_pid" || { tail -60 "$LOGS/ansible-upgrade.log"; die "the upgrade playbook failed"; }
[ "$rounds" -ge 2 ] || die "only $rounds ab rounds overlapped the upgrade"
for n in "${POLLERS[@]}"; do
    sum=$(on "$n" sha256sum /usr/local/bin/poll_server | cut -d' ' -f1)
    expect "$sum" "$new_sum" "$n: binary after the upgrade"
    for port in 8101 8102; do
        p=$(on "$n" systemctl show -p MainPID --value "fastpoll-poller@$port.service")
        [ "$p" != "${OLDPID[$n:$port]}" ] && [ "$p" != 0 ] || die "$n:$port was not restarted (pid $p)"
    done
done
check_instances 2
phase "rolling upgrade: $total requests in $rounds ab rounds, 0 failed, every instance restarted"
}

sc_edge() {
# ---- 10. the edge: TLS, the LB health check, the firewall ------------------------------------------
for n in "${POLLERS[@]}"; do
    assert_route "${IP[$n]}"
    v=$(curl -sS -m 10 --cacert "$RUN/tls.pem" --http2 -o "$RUN/body" -w '%{http_code} %{http_version}' \
        "https://${IP[$n]}$(signed "/Poll/getMessages?user_id=$seed_user")") || die "$n: TLS request failed"
    expect "$v" "200 2" "$n: a poll over TLS with the test certificate, HTTP/2"
    grep -q 'hello' "$RUN/body" || die "$n: TLS answer lacks the message"
    v=$(curl -sS -m 10 --cacert "$RUN/tls.pem" -D- -o /dev/null "https://${IP[$n]}/healthz" \
        | tr -d '\r' | grep -i '^strict-transport-security:') || v=""
    expect "$v" "strict-transport-security: max-age=63072000" "$n: HSTS over TLS"
    v=$(curl -sS -m 10 -D- -o /dev/null "http://${IP[$n]}/healthz" | tr -d '\r' | grep -ic '^strict-transport-security:') || v=0
    expect "$v" 0 "$n: no HSTS over plain HTTP"
done
# /healthz follows this host's pollers: healthy with every app down, 503 with its pollers down.
for a in "${APPS[@]}"; do on "$a" systemctl stop fastpoll-app; done
expect "$(http GET fp-poll1 /healthz | cut -d' ' -f1)" 200 "fp-poll1: /healthz with every app host down"
for a in "${APPS[@]}"; do on "$a" systemctl start fastpoll-app; done
on fp-poll1 systemctl stop fastpoll-poller@8101 fastpoll-poller@8102
expect "$(http GET fp-poll1 /healthz | cut -d' ' -f1)" 503 "fp-poll1: /healthz with its pollers down"
expect "$(http GET fp-poll2 /healthz | cut -d' ' -f1)" 200 "fp-poll2: /healthz while fp-poll1's pollers are down"
on fp-poll1 systemctl start fastpoll-poller@8101 fastpoll-poller@8102
for _ in $(seq 1 20); do [ "$(http GET fp-poll1 /healthz | cut -d' ' -f1)" = 200 ] && break; sleep 0.5; done
expect "$(http GET fp-poll1 /healthz | cut -d' ' -f1)" 200 "fp-poll1: /healthz with its pollers back"
app_up
# Log rotation: logrotate runs hourly (the size limit); a forced rotation makes nginx reopen its
# access log, and the next answer is logged in the new file (nginx flushes it within 5 s).
on fp-poll1 systemctl show -p TimersCalendar logrotate.timer | grep -q '\*:00:00' || die "fp-poll1: logrotate is not hourly"
on fp-poll1 logrotate -f /etc/logrotate.d/nginx || die "fp-poll1: logrotate failed"
on fp-poll1 test -e /var/log/nginx/fastpoll.access.log.1 || die "fp-poll1: the access log was not rotated"
expect "$(http GET fp-poll1 "/Poll/getMessages?user_id=$seed_user" | cut -d' ' -f1)" 200 "a poll after the rotation"
for _ in $(seq 1 16); do on fp-poll1 test -s /var/log/nginx/fastpoll.access.log && break; sleep 0.5; done
on fp-poll1 grep -q "user_id=$seed_user" /var/log/nginx/fastpoll.access.log || die "fp-poll1: nginx did not reopen its access log"
# The firewall (from inside the test network only): PostgreSQL answers app hosts, not a poller;
# memcached answers a poller, not the database host.
port_open fp-data1 "${IP[fp-db1]}" 5432 || die "fp-data1 (app) cannot reach PostgreSQL"
if port_open fp-poll1 "${IP[fp-db1]}" 5432; then die "fp-poll1 (not an app host) reaches PostgreSQL through the firewall"; fi
port_open fp-poll1 "${IP[fp-data1]}" 11211 || die "fp-poll1 cannot reach memcached on fp-data1"
if port_open fp-db1 "${IP[fp-data1]}" 11211; then die "fp-db1 reaches memcached through the firewall"; fi
phase "edge: TLS + HTTP/2 with the test certificate, HSTS over TLS only, access log rotated and reopened, /healthz follows the pollers, firewall closes 5432 and 11211 to outsiders"
}

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

sc_interrupted() {
# ---- 12. an interrupted run, then a re-run: every instance runs the new config -------------------
assert_all_routes
"$ANSIBLE_BIN/ansible-playbook" -i "$RUN/inventory.yml" "$REPO/ansible/site.yml" "${EXTRA[@]}" \
    -e fastpoll_cache_ttl=299 > "$LOGS/ansible-interrupted.log" 2>&1 &
ip_pid=$!
# Interrupted once the config files are written everywhere and the first app host is being handled.
for _ in $(seq 1 400); do grep -q 'PLAY \[Fallback app' "$LOGS/ansible-interrupted.log" && break; sleep 0.5; done
kill -INT "$ip_pid" 2>/dev/null || true
sleep 2
kill -TERM "$ip_pid" 2>/dev/null || true
wait "$ip_pid" || true
if grep -q 'PLAY \[Poll servers' "$LOGS/ansible-interrupted.log"; then die "the interrupted run got to the pollers: interrupt earlier"; fi
left=$(on fp-poll1 /usr/local/libexec/fastpoll-stale --config /etc/fastpoll/fastpoll.ini \
    fastpoll-poller@8101.service=http://127.0.0.1:9101/metrics)
say "after the interrupted run, fp-poll1: $left"
# The re-run on the hosts whose services read fastpoll.ini, through the plays that restart them.
playbook rerun -e fastpoll_cache_ttl=299 --limit 'pollers:app' --tags config,app,pollers
check_converged
phase "interrupted run + re-run: every instance runs the new config"
}

sc_signing_rotation() {
# ---- 13. signing-key rotation in two phases under load -------------------------------------------
new_key=$("$REPO/.venv/bin/python" -c 'import secrets; print(secrets.token_hex(32))')
old_key=$(cat "$RUN/signing.key")
grep -v '^fastpoll_signing_secrets' "$RUN/secrets.yml" > "$RUN/secrets-rot.yml"
rot_u=$((RANDOM % 9000 + 80000))
expect "$(publish fp-data1 "$rot_u" "rotation")" 201 "publish before the rotation"
rounds=0 per_phase=""
first_url=$(poll_url fp-data1 "$rot_u")
for rot_phase in 1 2; do
    # 1: every poller accepts the new key (the app still signs with the old one, listed first);
    # 2: the app signs with the new one.
    printf 'fastpoll_signing_secrets: ["%s", "%s"]\nfastpoll_signing_current: %s\n' "$old_key" "$new_key" \
        "$((rot_phase - 1))" > "$RUN/rot.yml"
    assert_all_routes
    "$ANSIBLE_BIN/ansible-playbook" -i "$RUN/inventory.yml" "$REPO/ansible/site.yml" -e "@$RUN/secrets-rot.yml" \
        -e "@$RUN/rot.yml" -e "fastpoll_release_dir=$FASTPOLL_BUILD_DIR/current" -e fastpoll_cache_ttl=299 \
        --limit 'pollers:app' --tags config,app,pollers > "$LOGS/ansible-rotation-$rot_phase.log" 2>&1 &
    rot_pid=$!
    ab_rounds "$rot_pid" "signing-key rotation"
    wait "$rot_pid" || { tail -40 "$LOGS/ansible-rotation-$rot_phase.log"; die "rotation phase $rot_phase failed"; }
    first_url=$(poll_url fp-app2 "$rot_u")
done
# The app now signs with the new key: a URL it issues verifies under the new key alone.
"$REPO/.venv/bin/python" - "$new_key" "$first_url" <<'PY' || die "a URL issued after phase 2 is not signed with the new key"
import sys, time
from fastpoll_app.keys import derive_key
from fastpoll_app.signing import verify
key, url = sys.argv[1].encode(), sys.argv[2].encode()
path, query = url.split(b"?", 1)
uid = query.split(b"&")[0]
k = derive_key(b"/Poll", path[len(b"/Poll"):] + b"?" + uid, [b"user_id"])
sys.exit(0 if verify([key], k, query, time.time()) else 1)
PY
# 3, after the longest URL lifetime in production: the old key is dropped.
echo "$new_key" > "$RUN/signing.key"
{ cat "$RUN/secrets-rot.yml"; printf 'fastpoll_signing_secrets: ["%s"]\n' "$new_key"; } > "$RUN/secrets.yml"
assert_all_routes
"$ANSIBLE_BIN/ansible-playbook" -i "$RUN/inventory.yml" "$REPO/ansible/site.yml" "${EXTRA[@]}" -e fastpoll_cache_ttl=299 \
    --limit 'pollers:app' --tags config,app,pollers > "$LOGS/ansible-rotation-3.log" 2>&1 &
rot_pid=$!
ab_rounds "$rot_pid" "signing-key rotation"
wait "$rot_pid" || { tail -40 "$LOGS/ansible-rotation-3.log"; die "rotation phase 3 failed"; }
expect "$(http GET fp-poll1 "/Poll/getMessages?user_id=$rot_u" | cut -d' ' -f1)" 200 "a URL signed with the new key"
phase "signing-key rotation (accept the new, sign with it, drop the old) under load: $rounds ab rounds (per phase:$per_phase), 0 non-2xx"
}

sc_rollback() {
# ---- 14. rollback to the previous release --------------------------------------------------------
assert_all_routes
# Only the pollers and the app hosts run a release's artifacts (and only their plays install them).
(cd "$REPO/ansible" && PATH="$ANSIBLE_BIN:$PATH" ./rollback.sh -i "$RUN/inventory.yml" -e "@$RUN/secrets.yml" \
    -e fastpoll_cache_ttl=299 --limit 'pollers:app' --tags config,app,pollers) > "$LOGS/ansible-rollback.log" 2>&1 \
    || { tail -40 "$LOGS/ansible-rollback.log"; die "rollback.sh failed"; }
old_sum=$(sha256sum < "$POLL_SERVER_BIN" | cut -d' ' -f1)
for n in "${POLLERS[@]}"; do
    expect "$(on "$n" sha256sum /usr/local/bin/poll_server | cut -d' ' -f1)" "$old_sum" "$n: binary after the rollback"
    expect "$(on "$n" cat /etc/fastpoll/installed/poll_server)" "$RELEASE_A" "$n: release after the rollback"
done
check_converged
expect "$(http GET fp-poll1 "/Poll/getMessages?user_id=$seed_user" | cut -d' ' -f1)" 200 "a poll after the rollback"
phase "rollback: $RELEASE_B -> $RELEASE_A with ansible/rollback.sh, every instance on the old binary"
}

MONITORING_FAST=(-e monitoring_scrape_interval=2s -e monitoring_scrape_timeout=2s -e monitoring_evaluation_interval=2s)
sc_monitoring() {
if [ -f "$HERE/monitoring.sh" ]; then
    # The drills time alerts in seconds: Prometheus scrapes and evaluates every 2 s from here on.
    playbook monitoring-fast --limit monitoring --tags monitoring "${MONITORING_FAST[@]}"
    # shellcheck source=/dev/null
    . "$HERE/monitoring.sh"
    fleet_monitoring_checks
    phase "monitoring checks (tests/fleet/monitoring.sh)"
fi
}

sc_redis_backend() {
# ---- 16. switch the cache backend to Redis ------------------------------------------------------
# fastpoll.ini changes: the app restarts, the pollers restart one by one (only they read it).
playbook redis-backend -e fastpoll_cache_backend=redis -e fastpoll_cache_ttl=299 --limit 'pollers:app' --tags config,app,pollers
u=$((RANDOM % 9000 + 40000))
expect "$(publish fp-data1 "$u" "hello redis")" 201 "publish (redis)"
for n in "${POLLERS[@]}"; do
    expect "$(http GET "$n" "/Poll/getMessages?user_id=$u")" "200 cache" "$n: hit from Redis"
    grep -q 'hello redis' "$RUN/body" || die "$n: Redis hit lacks the message"
done
val=$(on fp-data1 redis-cli -h "${IP[fp-data1]}" --user fastpoll --no-auth-warning -a "$redis_pass" GET "'/Poll/getMessages?user_id=$u'")
case "$val" in *"hello redis"*) ;; *) die "the key is not in Redis: '$val'";; esac
u=$((u + 1))
expect "$(http GET fp-poll1 "/Poll/getMessages?user_id=$u")" "200 app" "miss with Redis"
expect "$(http GET fp-poll2 "/Poll/getMessages?user_id=$u")" "200 cache" "hit with Redis after the fill"
phase "Redis backend: publish -> hit on both pollers, miss -> fill -> hit"
}

sc_redis_rotation() {
# ---- 17. Redis password rotation under load, the cache kept ------------------------------------------
# docs/runbook.md: (1) Redis takes the new password and the old one (an ACL LOAD, no restart), the
# pollers and the app restart onto the new one; (2) the old one is dropped (ACL LOAD). ab rounds
# through both pollers overlap both phases: 0 failed. A key written before the rotation and not
# polled during it is still a hit after, and Redis kept its run_id (never restarted).
new_pass=$(head -c 24 /dev/urandom | base64 | tr -d '/+=')
kept_u=$((u + 1))
expect "$(publish fp-data1 "$kept_u" "kept through the rotation")" 201 "publish before the Redis rotation"
rot_u=$((u + 2))
expect "$(publish fp-data1 "$rot_u" "polled through the rotation")" 201 "publish before the Redis rotation"
run_id=$(redis_cli -a "$redis_pass" INFO server | tr -d '\r' | sed -n 's/^run_id://p')
[ -n "$run_id" ] || die "no run_id from Redis"
grep -v '^fastpoll_redis_password' "$RUN/secrets.yml" > "$RUN/secrets-redis.yml"
printf 'fastpoll_redis_password: "%s"\n' "$new_pass" >> "$RUN/secrets-redis.yml"
printf 'fastpoll_redis_previous_passwords: ["%s"]\n' "$redis_pass" > "$RUN/redis-prev.yml"
rounds=0 per_phase=""
first_url=$(poll_url fp-data1 "$rot_u")
assert_all_routes
"$ANSIBLE_BIN/ansible-playbook" -i "$RUN/inventory.yml" "$REPO/ansible/site.yml" -e "@$RUN/secrets-redis.yml" \
    -e "@$RUN/redis-prev.yml" -e "fastpoll_release_dir=$FASTPOLL_BUILD_DIR/current" -e fastpoll_cache_ttl=299 \
    -e fastpoll_cache_backend=redis --limit 'pollers:app:redis' --tags config,redis,app,pollers,exporters \
    > "$LOGS/ansible-redis-rotation-1.log" 2>&1 &
rot_pid=$!
ab_rounds "$rot_pid" "Redis password rotation"
wait "$rot_pid" || { tail -40 "$LOGS/ansible-redis-rotation-1.log"; die "Redis rotation phase 1 failed"; }
expect "$(redis_cli -a "$redis_pass" PING)" PONG "the old Redis password during the rotation"
"$ANSIBLE_BIN/ansible-playbook" -i "$RUN/inventory.yml" "$REPO/ansible/site.yml" -e "@$RUN/secrets-redis.yml" \
    -e "fastpoll_release_dir=$FASTPOLL_BUILD_DIR/current" -e fastpoll_cache_ttl=299 -e fastpoll_cache_backend=redis \
    --limit redis --tags redis > "$LOGS/ansible-redis-rotation-2.log" 2>&1 &
rot_pid=$!
ab_rounds "$rot_pid" "Redis password rotation"
wait "$rot_pid" || { tail -40 "$LOGS/ansible-redis-rotation-2.log"; die "Redis rotation phase 2 failed"; }
expect "$(redis_cli -a "$new_pass" PING)" PONG "the new Redis password"
case "$(redis_cli -a "$redis_pass" PING 2>&1)" in *WRONGPASS*|*NOAUTH*|*invalid*) ;; *) die "Redis still takes the old password";; esac
expect "$(redis_cli -a "$new_pass" INFO server | tr -d '\r' | sed -n 's/^run_id://p')" "$run_id" "Redis run_id (not restarted)"
expect "$(http GET fp-poll1 "/Poll/getMessages?user_id=$kept_u")" "200 cache" "a key written before the rotation"
grep -q 'kept through the rotation' "$RUN/body" || die "the kept key's answer lacks its message"
expect "$(http GET fp-poll2 "/Poll/getMessages?user_id=$((u + 3))")" "200 app" "a miss after the rotation"
expect "$(http GET fp-poll1 "/Poll/getMessages?user_id=$((u + 3))")" "200 cache" "filled with the new password"
phase "Redis password rotation (both, then the new one only) under load: $rounds ab rounds (per phase:$per_phase), 0 failed; cache kept (same run_id, an old key still a hit)"
}

# ==== the run: one boot and one first deploy, then the selected scenarios in order ================
if want lint; then lint_start; fi
step deploy first_deploy
for s in "${SCENARIOS[@]}"; do
    if want "$s"; then step "$s" "sc_${s//-/_}"; fi
done
say "all checks passed"
exit 0
}

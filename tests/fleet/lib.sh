# shellcheck shell=bash disable=SC2154  # set by run.sh (seed_user) and the rotation scenarios (rot_u, first_url)
# The fleet test's shared part, sourced by tests/fleet/run.sh before anything runs (run.sh sets
# T0 and HERE first): the fleet (its hosts, addresses, paths), the table of phases, the teardown,
# the network safety checks, the boot (boot_network, boot_artifacts, boot_hosts, boot_inventories,
# boot_ansible_env, in that order), the first deploy, and the helpers the scenarios
# (scenarios/NAME.sh) and tests/fleet/monitoring.sh call. It defines functions and variables only.

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
# The reason is also kept in $LOGS/failure.txt (teardown repeats it last, after the table).
die() {
    echo "fleet: FAIL: $*" >&2
    [ -d "$LOGS" ] && echo "fleet: FAIL: $*" >> "$LOGS/failure.txt"
    exit 1
}

# ---- the table of phases -------------------------------------------------------------------
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
    [ "$rc" = 0 ] || [ "${FLEET_TEARDOWN_ONLY:-0}" = 1 ] || save_evidence
    release_hosts
    if [ "${FLEET_TEARDOWN_ONLY:-0}" = 1 ]; then
        say "torn down"
    elif [ "$rc" = 0 ]; then
        say "PASS in $(( $(date +%s) - T0 ))s"
    else
        say "FAILED (rc $rc) after $(( $(date +%s) - T0 ))s; logs in $LOGS"
        # Last, where a reader of only the end of the output (CI) sees it.
        [ -s "$LOGS/failure.txt" ] && tail -3 "$LOGS/failure.txt"
    fi
    exit "$rc"
}

# What a failed run leaves for its reader before the hosts go: the last request files and each
# host's journal since its boot (bounded: 2,000 lines, 10 s a host).
save_evidence() {
    local n f
    for f in ab.txt body headers; do [ -f "$RUN/$f" ] && cp "$RUN/$f" "$LOGS/last-$f"; done
    for n in "${NAMES[@]}"; do
        [ -n "${PID[$n]:-}" ] && kill -0 "${PID[$n]}" 2>/dev/null || continue
        # assert_route's check, without its exit: the teardown goes on whatever happens here.
        case "$(ip route get "${IP[$n]}" 2>&1)" in *" dev $BRIDGE "*) ;; *) continue ;; esac
        timeout 10 "${SSH[@]}" "root@${IP[$n]}" journalctl -b --no-pager -o short-precise -n 2000 \
            > "$LOGS/journal-$n.log" 2>&1 < /dev/null
    done
    return 0
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

# on HOST CMD...: CMD on HOST over ssh (the per-run key, the pinned host key), after its route check.
SSH=(ssh -i "$RUN/id_ed25519" -o UserKnownHostsFile="$RUN/known_hosts" -o StrictHostKeyChecking=yes
     -o BatchMode=yes -o ConnectTimeout=3 -o LogLevel=ERROR)
on() { local n=$1; shift; assert_route "${IP[$n]}"; "${SSH[@]}" "root@${IP[$n]}" "$@"; }

# ---- the boot: run.sh calls these in order, once -----------------------------------------------
boot_network() {
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
}

boot_artifacts() {
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
}

boot_hosts() {
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
}

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
    alertmanager_watchdog_webhook_url: http://$BRIDGE_ADDR:$WEBHOOK_PORT/watchdog
    alertmanager_group_wait: 5s
    alertmanager_group_interval: 10s
    monitoring_slo_time_divisor: 30
    fallback_app_workers: 2
    # The fleet gate (role slo_gate) bakes each batch and asks Prometheus: off for the
    # scenarios' rollouts (each batch would pay its bake), on in the slo-gate scenario.
    slo_gate_enabled: false
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
# The inventories (the fleet's and fp-solo's), the per-run secrets, the TLS certificate.
boot_inventories() {
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
        fp-data1:
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
  printf 'fastpoll_db_password: "%s"\n' "$(head -c 24 /dev/urandom | base64 | tr -d '/+=')" >> "$RUN/secrets.yml"
  # The second pgBackRest repository's passphrase (fp-data1's, encrypted).
  printf 'pgbackrest_repo2_cipher_pass: "%s"\n' "$(head -c 36 /dev/urandom | base64 | tr -d '/+=')" >> "$RUN/secrets.yml" )
# The TLS certificate: self-signed, made here, for the pollers' names and addresses.
openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=fastpoll-fleet-test \
    -addext "subjectAltName=DNS:fp-poll1,DNS:fp-poll2,DNS:fp-solo,IP:${IP[fp-poll1]},IP:${IP[fp-poll2]},IP:${IP[fp-solo]}" \
    -keyout "$RUN/tls.key" -out "$RUN/tls.pem" 2>/dev/null || die "openssl req failed"
for n in fp-poll1 fp-poll2 fp-solo; do
    on "$n" 'cat > /etc/ssl/fastpoll-test.pem' < "$RUN/tls.pem"
    on "$n" 'umask 077; cat > /etc/ssl/private/fastpoll-test.key' < "$RUN/tls.key"
done
}

# Ansible's environment for every run of the test.
boot_ansible_env() {
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
}

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
    local n=$1 url
    for _ in $(seq 1 20); do
        assert_route "${IP[$n]}"
        url=$(curl -sS -m 5 -X POST -H "Authorization: Bearer $(cat "$RUN/api.token")" -H 'Content-Type: application/json' \
            --data "{\"user_id\": $2}" "http://${IP[$n]}:8000/api/poll-url" 2>/dev/null \
            | python3 -c 'import json,sys; print(json.load(sys.stdin)["url"])' 2>/dev/null) && [ -n "$url" ] && { echo "$url"; return; }
        if [ "$n" = "${APPS[0]}" ]; then n=${APPS[1]}; else n=${APPS[0]}; fi
        sleep 0.5
    done
    die "no app host issues a poll URL for user $2"
}

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
# ab_failures: what the last ab run counted as failed, on one line (for the FAIL line CI shows).
ab_failures() {
    grep -E '^(Complete requests|Failed requests|Non-2xx responses):|\(Connect:' "$RUN/ab.txt" \
        | tr -s ' ' | paste -sd';' -
}
# ab_evidence HOST: the answers nginx on HOST logged (status, source, upstream) and its error
# log's end, into $LOGS, after the access log's flush interval.
ab_evidence() {
    sleep 6
    on "$1" "tail -n 700 /var/log/nginx/fastpoll.access.log; echo '---- error.log'; tail -n 60 /var/log/nginx/error.log" \
        > "$LOGS/ab-failed-$1.log" 2>&1 || true
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
                cat "$RUN/ab.txt"; ab_evidence "$n"
                die "$what: a valid URL failed on $n (round $rounds): $url ($(ab_failures))"
            fi
        done
        rounds=$((rounds + 1)); mine=$((mine + 1))
        # The pause leaves the play CPU (two cores); load still overlaps every restart.
        sleep 1
    done
    [ "$mine" -ge 1 ] || die "no ab round overlapped this rotation phase"
    per_phase="$per_phase $mine"
}
# Prometheus on the monitoring host, asked from the control node (monitoring.sh, postgres-ha).
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

redis_cli() { on fp-data1 redis-cli -h "${IP[fp-data1]}" --user fastpoll --no-auth-warning "$@"; }

# ini_list HOST KEY: the values of KEY's lines in HOST's fastpoll.ini, comma-separated.
ini_list() { on "$1" "sed -n 's/^$2 = //p' /etc/fastpoll/fastpoll.ini" | paste -sd, -; }

# The first deploy, every scenario's starting point (run.sh's row "deploy"); it publishes to the
# seeded user (seed_user, set by run.sh), whose answer later scenarios poll.
first_deploy() {
# fp-solo is a fresh host: `--check` on it first (nothing installed yet, so every task must cope
# with what is not there), then its deploy, both beside the fleet's.
solo deploy --check-first
local deploy_args=()
read -ra deploy_args <<< "${FLEET_DEPLOY_ARGS:-}"
playbook deploy "${deploy_args[@]}"
solo_wait "first deploy"
phase "first deploy ($(recap_changed) changes; fp-solo $(recap_changed "$SOLO_LOG.ansible"))"
expect "$(publish fp-data1 "$seed_user" "hello fleet")" 201 "publish the seeded user"
}

#!/bin/bash
# The fleet test: a real Ansible deployment of fastpoll to Debian 12 hosts booted here with
# systemd-nspawn (a fleet of three, plus one single-host deployment), then checks of what the
# issue asks (docs/deploy.md, "The fleet test").
#
#   tests/fleet/run.sh            (as root; `make test-deploy` runs it)
#
# Hosts (each its own overlay of one cached debootstrap image, its own network namespace on the
# bridge fpbr0, 10.77.0.1/24 on this side; no route, NAT or forwarding to anything else):
#   fp-poll1 10.77.0.11  pollers
#   fp-poll2 10.77.0.12  pollers, memcached
#   fp-data1 10.77.0.21  memcached, redis, app
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
NAMES=(fp-poll1 fp-poll2 fp-data1 fp-solo)
declare -A IP=([fp-poll1]=$NET.11 [fp-poll2]=$NET.12 [fp-data1]=$NET.21 [fp-solo]=$NET.31)
FLEET=(fp-poll1 fp-poll2 fp-data1)
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

# ---- preconditions ----------------------------------------------------------------------------
[ "$(id -u)" = 0 ] || die "must run as root (debootstrap, nspawn, bridge)"
for c in debootstrap systemd-nspawn ip ssh ssh-keygen curl ab flock mount python3; do
    command -v "$c" >/dev/null || die "missing command: $c"
done

mkdir -p "$STATE"
exec 8>"$STATE/.run.lock"
flock -n 8 || die "another fleet test is running (lock $STATE/.run.lock)"

# ---- teardown (by name and pid, never by pattern) ---------------------------------------------
teardown() {
    local rc=$?
    set +e
    trap - EXIT INT TERM
    if [ "${FLEET_KEEP:-0}" = 1 ]; then
        say "FLEET_KEEP=1: fleet left running (rc $rc); tear down with: FLEET_TEARDOWN_ONLY=1 $0"
        exit "$rc"
    fi
    for n in "${NAMES[@]}"; do
        p=${PID[$n]:-}
        [ -n "$p" ] || continue
        # nspawn turns SIGTERM into an orderly poweroff of the container.
        kill -TERM "$p" 2>/dev/null
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
    for n in "${NAMES[@]}"; do
        f=$RUN/$n/nspawn.pid
        [ -f "$f" ] && PID[$n]=$(cat "$f")
    done
    trap teardown EXIT
    exit 0
fi
[ -x "$ANSIBLE_BIN/ansible-playbook" ] || die "no ansible-playbook in $ANSIBLE_BIN (make venv)"
[ -e "$RUN" ] && die "$RUN exists (a leftover run? FLEET_TEARDOWN_ONLY=1 $0 cleans it)"
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

if [ -n "${FLEET_POLL_SERVER_BIN:-}" ]; then
    POLL_SERVER_BIN=$FLEET_POLL_SERVER_BIN
    FASTPOLL_BUILD_POLL_SERVER=0 "$REPO/ansible/build.sh" > "$LOGS/build.log" 2>&1 \
        || { cat "$LOGS/build.log"; die "ansible/build.sh failed"; }
else
    "$REPO/ansible/build.sh" > "$LOGS/build.log" 2>&1 || { cat "$LOGS/build.log"; die "ansible/build.sh failed"; }
    # A snapshot: a rebuild in the work tree during the test must not look like a new version.
    cp "$REPO/poll_server/build/poll_server" "$RUN/poll_server"
    POLL_SERVER_BIN=$RUN/poll_server
fi
phase "artifacts: $POLL_SERVER_BIN and ansible/build/wheelhouse"

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
    cat > "$1" <<EOF
all:
  vars:
    ansible_user: root
    ansible_ssh_private_key_file: $RUN/id_ed25519
    ansible_ssh_common_args: >-
      -o UserKnownHostsFile=$RUN/known_hosts -o StrictHostKeyChecking=yes -o ConnectTimeout=5
    # The hosts cannot reach a mirror; everything is in the image.
    fastpoll_apt_cache_valid_time: 0
    # This machine caps open files at 20000 per process.
    poll_server_limit_nofile: 20000
    fallback_app_limit_nofile: 20000
    nginx_worker_rlimit_nofile: 20000
    nginx_worker_connections: 4096
    fallback_app_workers: 2
    memcached_memory_mb: 32
    redis_maxmemory: 32mb
EOF
}
inventory_head "$RUN/inventory.yml"
cat >> "$RUN/inventory.yml" <<EOF
    poll_server_instances: 2
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
  printf 'fastpoll_signing_secrets: ["%s"]\n' "$(cat "$RUN/signing.key")" >> "$RUN/secrets.yml" )

export ANSIBLE_CONFIG=$REPO/ansible/ansible.cfg ANSIBLE_NOCOLOR=1 ANSIBLE_FORCE_COLOR=0
export ANSIBLE_HOME=$RUN/ansible-home ANSIBLE_LOCAL_TEMP=$RUN/ansible-tmp
export ANSIBLE_SSH_CONTROL_PATH_DIR=$RUN/cp
EXTRA=(-e "@$RUN/secrets.yml" -e "poll_server_binary_src=$POLL_SERVER_BIN")

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
# solo LABEL [args...]: the same for the one-host inventory, in the background (SOLO_PID, SOLO_LOG).
solo() {
    local label=$1; shift
    SOLO_LOG=$LOGS/ansible-solo-$label.log
    assert_all_routes
    ( INVENTORY=$RUN/solo.yml; run_no=0; LOGS=$LOGS/solo-$label; mkdir -p "$LOGS"
      playbook "$label" "$@" > "$SOLO_LOG" 2>&1; cp "$LAST_LOG" "$SOLO_LOG.ansible" ) &
    SOLO_PID=$!
}
solo_wait() {
    wait "$SOLO_PID" || { cat "$SOLO_LOG"; die "fp-solo: $1 failed"; }
}

"$ANSIBLE_BIN/ansible-playbook" -i "$RUN/inventory.yml" "$REPO/ansible/site.yml" --syntax-check > "$LOGS/syntax.log" 2>&1 \
    || { cat "$LOGS/syntax.log"; die "--syntax-check failed"; }
if [ -x "$ANSIBLE_BIN/ansible-lint" ]; then
    (cd "$REPO/ansible" && PATH="$ANSIBLE_BIN:$PATH" ansible-lint --profile production --nocolor -q) > "$LOGS/lint.log" 2>&1 \
        || { cat "$LOGS/lint.log"; die "ansible-lint (production profile) failed"; }
    lint="ansible-lint production: clean, "
else
    lint="(no ansible-lint in $ANSIBLE_BIN), "
fi
phase "${lint}--syntax-check: ok"

solo deploy
playbook deploy
solo_wait "first deploy"
phase "first deploy ($(recap_changed) changes; fp-solo $(recap_changed "$SOLO_LOG.ansible"))"

solo second-run
playbook second-run
changed=$(recap_changed)
[ "$changed" = 0 ] || { grep -E '^(changed|TASK)' "$LAST_LOG" | grep -B1 '^changed' ; die "second run changed $changed things (want 0)"; }
solo_wait "second run"
changed=$(recap_changed "$SOLO_LOG.ansible")
[ "$changed" = 0 ] || { grep -B1 '^changed' "$SOLO_LOG.ansible"; die "fp-solo: second run changed $changed things (want 0)"; }
phase "second run: changed=0 (fleet and fp-solo)"

playbook check-diff --check --diff
phase "--check --diff on the deployed fleet: ok"

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

http() {
    local method=$1 n=$2 path; path=$(signed "$3"); shift 3
    assert_route "${IP[$n]}"
    curl -sS -m 10 -X "$method" -o "$RUN/body" -D "$RUN/headers" "$@" "http://${IP[$n]}$path" >/dev/null \
        || die "curl $method $n $path failed"
    local status source
    status=$(awk 'NR==1{print $2}' "$RUN/headers")
    source=$(tr -d '\r' < "$RUN/headers" | awk -F': ' 'tolower($1)=="x-poll-source"{print $2}')
    echo "$status ${source:--}"
}
expect() { [ "$1" = "$2" ] || die "$3: got '$1', want '$2'"; }

# ---- 5. the data host: private binds, the Redis password, one memcached list everywhere --------
redis_pass=$(sed -n 's/^fastpoll_redis_password: "\(.*\)"$/\1/p' "$RUN/secrets.yml")
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
[ "$(redis-cli -h "$ip" --no-auth-warning -a "$pass" PING)" = PONG ] || { echo "redis refuses the password"; exit 1; }
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

# ---- 6. the request path through each poller --------------------------------------------------

# Messages API through poller 1 (location / -> app); the poll of that user is then a cache hit
# on both pollers (the app wrote the key with ketama over the same two memcached nodes).
seed_user=$((RANDOM % 9000 + 1000))
expect "$(http POST fp-poll1 /api/messages -H 'Content-Type: application/json' \
    --data "{\"user_id\": $seed_user, \"text\": \"hello fleet\"}" | cut -d' ' -f1)" 201 "publish"
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

# ---- 7. instances under systemd ---------------------------------------------------------------
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
check_instances 2

# fp-solo, the one-host layout: one instance per vCPU, everything on loopback behind nginx.
u=$((RANDOM % 9000 + 60000))
expect "$(http POST fp-solo /api/messages -H 'Content-Type: application/json' \
    --data "{\"user_id\": $u, \"text\": \"hello solo\"}" | cut -d' ' -f1)" 201 "fp-solo: publish"
expect "$(http GET fp-solo "/Poll/getMessages?user_id=$u")" "200 cache" "fp-solo: hit after publish"
expect "$(http GET fp-solo "/Poll/getMessages?user_id=$((u + 1))")" "200 app" "fp-solo: miss"
expect "$(http GET fp-solo "/Poll/getMessages?user_id=$((u + 1))")" "200 cache" "fp-solo: hit after the fill"
check_instances "$(on fp-solo nproc --all)" fp-solo
phase "request path and instances checked (fleet and fp-solo)"

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
        rc=0; curl -sS -m 5 -o /dev/null "http://${IP[$n]}:$port/" 2>/dev/null || rc=$?
        [ "$rc" = 7 ] || die "$n:$port answered (or timed out, curl rc $rc) from another host; want connection refused"
    done
    expect "$(http GET "$n" /metrics | cut -d' ' -f1)" 404 "$n: /metrics through the public server"
done
# The status command (tools/fastpoll_status.py) reads each host's endpoints.json over ssh.
if [ -f "$REPO/tools/fastpoll_status.py" ]; then
    assert_all_routes
    via="ssh -i $RUN/id_ed25519 -o UserKnownHostsFile=$RUN/known_hosts -o StrictHostKeyChecking=yes"
    via="$via -o BatchMode=yes -o ConnectTimeout=5 -o LogLevel=ERROR root@{host} python3 -"
    python3 "$REPO/tools/fastpoll_status.py" --hosts "${IP[fp-poll1]},${IP[fp-poll2]},${IP[fp-data1]},${IP[fp-solo]}" \
        --via "$via" > "$LOGS/status.txt" 2>&1 || { cat "$LOGS/status.txt"; die "the status command says not all up"; }
    say "status command: $(tail -1 "$LOGS/status.txt") on 4 hosts"
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
expect "$(http POST fp-poll2 /api/messages -H 'Content-Type: application/json' \
    --data "{\"user_id\": $seed_user, \"text\": \"hello again\"}" | cut -d' ' -f1)" 201 "publish again"
for _ in $(seq 1 40); do
    got=$(http GET fp-poll1 "/Poll/getMessages?user_id=$seed_user")
    [ "$got" = "200 cache" ] && break; sleep 0.5
done
expect "$got" "200 cache" "hit within 20 s after memcached came back"
phase "metrics: admin /healthz and /metrics per instance, stub_status, loopback only; backend_up follows memcached"

# ---- 8. scaling 2 -> 1 -> 2 ---------------------------------------------------------------------
playbook scale-down --limit pollers -e poll_server_instances=1
check_instances 1
expect "$(http GET fp-poll1 "/Poll/getMessages?user_id=$seed_user")" "200 cache" "hit after scaling down"
playbook scale-up --limit pollers -e poll_server_instances=2
check_instances 2
expect "$(http GET fp-poll2 "/Poll/getMessages?user_id=$seed_user")" "200 cache" "hit after scaling up"
phase "scaling 2 -> 1 -> 2"

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

# The upgrade runs in the background; ab runs bounded rounds (2000 requests, 10 concurrent, 10 s
# timeout each) against both pollers, alternating, until it is done. Every round must have 0
# failed and 0 non-2xx requests.
EXTRA=(-e "@$RUN/secrets.yml" -e "poll_server_binary_src=$NEW_BIN")
assert_all_routes
"$ANSIBLE_BIN/ansible-playbook" -i "$RUN/inventory.yml" "$REPO/ansible/site.yml" "${EXTRA[@]}" --limit pollers \
    > "$LOGS/ansible-upgrade.log" 2>&1 &
upgrade_pid=$!
rounds=0 total=0
ab_path=$(signed "/Poll/getMessages?user_id=$seed_user")
while kill -0 "$upgrade_pid" 2>/dev/null && [ "$rounds" -lt 300 ]; do
    n=${POLLERS[$((rounds % 2))]}
    assert_route "${IP[$n]}"
    ab -q -n 2000 -c 10 -s 10 "http://${IP[$n]}$ab_path" > "$RUN/ab.txt" 2>&1 \
        || { cat "$RUN/ab.txt"; die "ab against $n failed"; }
    failed=$(awk '/^Failed requests:/{print $3}' "$RUN/ab.txt")
    complete=$(awk '/^Complete requests:/{print $3}' "$RUN/ab.txt")
    non2xx=$(awk '/^Non-2xx responses:/{print $3}' "$RUN/ab.txt")
    [ "$failed" = 0 ] && [ -z "$non2xx" ] && [ "$complete" = 2000 ] \
        || { cat "$RUN/ab.txt"; die "ab round $rounds against $n during the upgrade: failed=$failed non-2xx=${non2xx:-0}"; }
    rounds=$((rounds + 1)); total=$((total + complete))
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

# ---- 10. switch the cache backend to Redis ------------------------------------------------------
# fastpoll.ini changes on every host: the app restarts, the pollers restart one by one.
playbook redis-backend -e fastpoll_cache_backend=redis
u=$((RANDOM % 9000 + 40000))
expect "$(http POST fp-poll2 /api/messages -H 'Content-Type: application/json' \
    --data "{\"user_id\": $u, \"text\": \"hello redis\"}" | cut -d' ' -f1)" 201 "publish (redis)"
for n in "${POLLERS[@]}"; do
    expect "$(http GET "$n" "/Poll/getMessages?user_id=$u")" "200 cache" "$n: hit from Redis"
    grep -q 'hello redis' "$RUN/body" || die "$n: Redis hit lacks the message"
done
val=$(on fp-data1 redis-cli -h "${IP[fp-data1]}" --no-auth-warning -a "$redis_pass" GET "'/Poll/getMessages?user_id=$u'")
case "$val" in *"hello redis"*) ;; *) die "the key is not in Redis: '$val'";; esac
u=$((u + 1))
expect "$(http GET fp-poll1 "/Poll/getMessages?user_id=$u")" "200 app" "miss with Redis"
expect "$(http GET fp-poll2 "/Poll/getMessages?user_id=$u")" "200 cache" "hit with Redis after the fill"
phase "Redis backend: publish -> hit on both pollers, miss -> fill -> hit"

say "all checks passed"

#!/bin/bash
# The fleet test: a real Ansible deployment of fastpoll to Debian 12 hosts booted here with
# systemd-nspawn (a fleet of three, plus one single-host deployment), then checks of what a
# deployment must do (docs/deploy.md, "The fleet test").
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
#   (fp-data1 is the second backup host too: the encrypted repository)
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
# FLEET_TEARDOWN_ONLY=1 (tear down what a FLEET_KEEP run left), FLEET_DEPLOY_ARGS (more
# ansible-playbook arguments for the fleet's first deploy only, e.g. "-e fastpoll_etcd_tls=false"
# to try a later run's move from an older layout), FLEET_CACHE (image cache dir,
# default /var/cache/fastpoll-fleet), FLEET_POLL_SERVER_BIN (deploy this binary instead of
# building poll_server/).
#
# Files: lib.sh (the fleet, the boot, the teardown, the helpers the checks share), one file per
# scenario, scenarios/NAME.sh (sc_NAME with dashes as underscores, and what only it uses), and
# monitoring.sh (sourced by the monitoring scenario when present).
set -euo pipefail
# The whole script is one block, read in full before it starts: bash reads a script as it runs
# it, so an edit of this file during a run would otherwise change what the run does next. For the
# same reason lib.sh and every scenario file are sourced (read in full) before the run starts.
{

T0=$(date +%s)
HERE=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=tests/fleet/lib.sh
. "$HERE/lib.sh"

# ---- scenarios: which ones run, and the table of times -----------------------------------------
# In the order a full run plays them, all on one boot and one first deploy. Any one runs alone
# (`tests/fleet/run.sh NAME[,NAME...]`, `make test-deploy SCENARIO=NAME`), after what it needs.
SCENARIOS=(lint converge budgets data-host request-path metrics scaling upgrade gated-release slo-gate edge app-hosts
           membership interrupted signing-rotation rollback postgres-ha monitoring redis-backend redis-rotation
           redis-sentinel etcd)
# What a scenario needs to have run before it on the same fleet.
declare -A NEEDS=([rollback]=upgrade [gated-release]=upgrade [slo-gate]=upgrade [redis-rotation]=redis-backend)
# One file per scenario, scenarios/NAME.sh, each defining sc_NAME (dashes as underscores).
for s in "${SCENARIOS[@]}"; do
    # shellcheck source=/dev/null
    . "$HERE/scenarios/$s.sh"
    declare -F "sc_${s//-/_}" >/dev/null || die "scenarios/$s.sh defines no sc_${s//-/_}"
done
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

# ---- preconditions ----------------------------------------------------------------------------
[ "$(id -u)" = 0 ] || die "must run as root (debootstrap, nspawn, bridge)"
for c in debootstrap systemd-nspawn ip ssh ssh-keygen curl ab flock mount python3; do
    command -v "$c" >/dev/null || die "missing command: $c"
done

mkdir -p "$STATE"
exec 8>"$STATE/.run.lock"
flock -n 8 || die "another fleet test is running (lock $STATE/.run.lock)"

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

mark network+image
boot_network
mark artifacts
boot_artifacts
mark hosts
boot_hosts
boot_inventories
boot_ansible_env
mark ""
# shellcheck disable=SC2034  # read by the scenarios (data-host, redis-backend, redis-sentinel)
redis_pass=$(sed -n 's/^fastpoll_redis_password: "\(.*\)"$/\1/p' "$RUN/secrets.yml")
# The seeded user, whose answer is cached by the first deploy: later scenarios poll it (scaling,
# the upgrade's ab rounds, TLS, the rollback).
seed_user=$((RANDOM % 9000 + 1000))

# ==== the run: one boot and one first deploy, then the selected scenarios in order ================
if want lint; then lint_start; fi
step deploy first_deploy
for s in "${SCENARIOS[@]}"; do
    if want "$s"; then step "$s" "sc_${s//-/_}"; fi
done
say "all checks passed"
exit 0
}

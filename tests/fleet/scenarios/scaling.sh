# shellcheck shell=bash disable=SC2154  # seed_user: set by run.sh
# The fleet test's scaling scenario: 2 -> 1 -> 2 poll server instances; fp-solo switches to
# nginx_http_mode: refuse. Sourced by tests/fleet/run.sh (which runs sc_scaling as the row scaling);
# it uses lib.sh's helpers and the variables of the run.

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

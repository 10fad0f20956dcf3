# shellcheck shell=bash
# The fleet test's budgets scenario: an inventory of 6,000 poll server instances is refused by the
# connection budget check (role budgets) before any host changes, with the numbers in its message,
# and so is one that fits only the inventory's PostgreSQL limit, not the running servers'.
# Sourced by tests/fleet/run.sh (which runs sc_budgets as the row budgets); it uses lib.sh's
# helpers and the variables of the run.

sc_budgets() {
# ---- connection budgets: an inventory whose clients would overrun memcached is refused ----------
# before any host changes (role budgets, the first play of site.yml).
local out rc=0
"$ANSIBLE_BIN/ansible-playbook" -i "$RUN/inventory.yml" "$REPO/ansible/site.yml" "${EXTRA[@]}" \
    -e poll_server_instances=3000 > "$LOGS/ansible-budgets.log" 2>&1 || rc=$?
[ "$rc" != 0 ] || die "an inventory with 6,000 poll server instances was deployed"
out=$(grep -o '[0-9]* poll server instances on [0-9]* pollers[^(]*(6000 x 1 + [^)]*)' "$LOGS/ansible-budgets.log" | head -1)
case "$out" in
    "6000 poll server instances on 2 pollers"*"need 6"*"connections per memcached node (6000 x 1 +"*"memcached_max_connections 4096)") ;;
    *) tail -30 "$LOGS/ansible-budgets.log"; die "the refusal does not name the numbers: $out" ;;
esac
grep -q 'changed=[1-9]' "$LOGS/ansible-budgets.log" && die "the refused run changed a host"
grep -q '^TASK \[fastpoll_config' "$LOGS/ansible-budgets.log" && die "the refused run went past the budget check"
say "$out"
# PostgreSQL's limit is what the running servers enforce: under Patroni the inventory's
# max_connections is only the bootstrap's, so raising it there does not make 5 workers per app host
# (2 x 5 x 20 pooled + 8 = 208) fit the 200 that fp-db1 and fp-app2 run with.
rc=0
"$ANSIBLE_BIN/ansible-playbook" -i "$RUN/inventory.yml" "$REPO/ansible/site.yml" "${EXTRA[@]}" \
    -e postgresql_max_connections=100000 -e fallback_app_workers=5 > "$LOGS/ansible-budgets-live.log" 2>&1 || rc=$?
[ "$rc" != 0 ] || die "10 app workers were deployed against PostgreSQL's live max_connections of 200"
out=$(tr -s ' \n' ' ' < "$LOGS/ansible-budgets-live.log" | grep -o '208 on PostgreSQL ([^)]*)' | head -1)
case "$out" in
    *"postgresql_max_connections 200, the running servers' max_connections: "*"fp-db1 200"*) ;;
    *) tail -30 "$LOGS/ansible-budgets-live.log"; die "the refusal does not name the live limit: $out" ;;
esac
grep -q 'changed=[1-9]' "$LOGS/ansible-budgets-live.log" && die "the refused run changed a host"
say "$out"
phase "budgets: 6,000 poll server instances refused before any change, with the numbers; PostgreSQL judged by its running max_connections"
}

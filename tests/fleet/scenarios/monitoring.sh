# shellcheck shell=bash
# The fleet test's monitoring scenario: tests/fleet/monitoring.sh's checks and paging drills, if
# that file exists. Sourced by tests/fleet/run.sh (which runs sc_monitoring as the row monitoring);
# it uses lib.sh's helpers and the variables of the run.

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

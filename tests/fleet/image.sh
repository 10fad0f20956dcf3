#!/bin/bash
# Build (or reuse) the Debian 12 root filesystem the fleet test boots its hosts from.
#
# The image is cached under $FLEET_CACHE (default /var/cache/fastpoll-fleet), keyed by a hash of
# everything that shapes it (suite, mirror, package list, this script), so a changed package list
# builds a new image and an unchanged one is reused. The hosts never reach the internet: every
# package the Ansible roles install is put into the image here.
#
# Usage: tests/fleet/image.sh        prints the path of the ready rootfs on stdout
set -euo pipefail

FLEET_CACHE=${FLEET_CACHE:-/var/cache/fastpoll-fleet}
MIRROR=${FLEET_MIRROR:-http://deb.debian.org/debian}
SUITE=bookworm

# Everything the roles apt-install (ansible/roles/*/defaults: *_packages) plus what a host needs to
# boot and be managed: systemd, dbus, sshd, python3 (+apt bindings for the apt module, acl for
# become_user), networking tools, and the client tools the test uses inside.
PACKAGES=(
    systemd systemd-sysv dbus openssh-server sudo python3 python3-apt python3-venv acl
    iproute2 netbase procps curl apache2-utils ca-certificates
    nginx logrotate memcached redis-server
    libevent-2.1-7 libmemcached11 libhiredis0.14 libinih1
    redis-sentinel nftables ssl-cert openssl libpq5
    postgresql python3-psycopg2 patroni python3-etcd etcd-server pgbackrest
    prometheus prometheus-node-exporter prometheus-nginx-exporter prometheus-redis-exporter
    prometheus-postgres-exporter prometheus-node-exporter-collectors mtail prometheus-alertmanager
)

here=$(cd "$(dirname "$0")" && pwd)
key=$( { echo "$SUITE $MIRROR"; printf '%s\n' "${PACKAGES[@]}" | sort; cat "$here/image.sh"; } \
       | sha256sum | cut -c1-16)
rootfs=$FLEET_CACHE/rootfs-$key

if [ -f "$rootfs/.fastpoll-image-ok" ]; then
    echo "$rootfs"
    exit 0
fi

mkdir -p "$FLEET_CACHE"
exec 9>"$FLEET_CACHE/.build.lock"
flock 9
# Another run may have built it while we waited for the lock.
if [ -f "$rootfs/.fastpoll-image-ok" ]; then
    echo "$rootfs"
    exit 0
fi

tmp=$FLEET_CACHE/.build-$key.$$
cleanup() { rm -rf --one-file-system "$tmp"; }
trap cleanup EXIT
rm -rf --one-file-system "$tmp"

start=$(date +%s)
echo "fleet image: building $rootfs with debootstrap (first run on this machine only)" >&2
include=$(IFS=,; echo "${PACKAGES[*]}")
debootstrap --variant=minbase --include="$include" "$SUITE" "$tmp" "$MIRROR" >&2 \
    || { echo "fleet image: debootstrap failed (log: $tmp/debootstrap/debootstrap.log)" >&2; \
         tail -20 "$tmp/debootstrap/debootstrap.log" >&2 || true; exit 1; }

# Trim and neutralise what a container does not need. Debian's own services stay installed and
# enabled: the roles reconfigure them, as they would on a real host.
rm -rf "$tmp"/var/cache/apt/archives/*.deb "$tmp"/var/lib/apt/lists/*
# Per-host identity is written at boot time by the test: no shared host keys or machine-id.
rm -f "$tmp"/etc/ssh/ssh_host_*
: > "$tmp/etc/machine-id"
# Units that make no sense in a container without hardware or a real clock.
for unit in systemd-timesyncd.service apt-daily.timer apt-daily-upgrade.timer e2scrub_all.timer \
            fstrim.timer man-db.timer; do
    ln -sf /dev/null "$tmp/etc/systemd/system/$unit"
done
# Packages whose service starts at install in a default setup the roles replace: etcd (a
# single-node cluster), pgBackRest's TLS server (no certificate yet). Their roles enable them.
rm -f "$tmp"/etc/systemd/system/multi-user.target.wants/etcd.service "$tmp"/etc/systemd/system/etcd2.service \
      "$tmp"/etc/systemd/system/multi-user.target.wants/pgbackrest.service
# No package manager source can be reached from the test network; keep apt from trying.
echo "deb $MIRROR $SUITE main" > "$tmp/etc/apt/sources.list"

touch "$tmp/.fastpoll-image-ok"
mv "$tmp" "$rootfs"
trap - EXIT
echo "fleet image: built in $(( $(date +%s) - start ))s" >&2
echo "$rootfs"

#!/usr/bin/env bash
# Make sure the base image (default debian:bookworm-slim) exists on the local engine.
# Order: already present -> pull -> debootstrap a minbase rootfs and `docker import` it.
# The last step is what air-gapped hosts (and machines with no registry) rely on.
# What is fetched is verified: debootstrap checks the suite's Release file against Debian's
# archive keyring (never --no-check-gpg), and every package against the signed Release; the
# imported image carries a label saying where it came from. Pin it with a snapshot mirror:
#   MIRROR=http://snapshot.debian.org/archive/debian/20240601T000000Z sandbox images build
set -euo pipefail

TAG="${1:-debian:bookworm-slim}"
SUITE="${SUITE:-bookworm}"
MIRROR="${MIRROR:-http://deb.debian.org/debian}"
OFFLINE="${OFFLINE:-0}"
KEYRING="${KEYRING:-/usr/share/keyrings/debian-archive-keyring.gpg}"

# one build at a time on this host: a second caller (a test worker, the demo) waits for the
# first and then finds the image present, instead of racing it for apt's lock and the tag
# (the lock is in this user's own folder, as sandbox/runtime/docker/images.py's: nobody else can
# plant a link there or hold it)
lockdir="${XDG_CACHE_HOME:-$HOME/.cache}/agent-sandbox"
mkdir -p -m 700 "$lockdir"
if [ -L "$lockdir" ] || [ "$(stat -c %u "$lockdir")" != "$(id -u)" ]; then
  echo "base: $lockdir is not a folder of this user's own; the build lock cannot live there" >&2
  exit 1
fi
exec 9>"$lockdir/base.lock"
if ! flock -w 1800 9; then
  echo "base: another base build has held $lockdir/base.lock for 30 minutes; if none runs, remove it" >&2
  exit 1
fi
if docker image inspect "$TAG" >/dev/null 2>&1; then
  echo "base: $TAG present"
  exit 0
fi
if [ "$OFFLINE" != 1 ] && timeout 60 docker pull "$TAG" >/dev/null 2>&1; then
  echo "base: pulled $TAG"
  exit 0
fi
echo "base: $TAG absent and not pullable; building it with debootstrap ($SUITE from $MIRROR)"
if ! command -v debootstrap >/dev/null 2>&1 || [ ! -s "$KEYRING" ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    # another apt on this host (unattended upgrades, a provisioning step) holds its lock for a
    # while: wait for it rather than fail
    apt=(apt-get -qq -o DPkg::Lock::Timeout=300)
    if ! { "${apt[@]}" update && DEBIAN_FRONTEND=noninteractive "${apt[@]}" install -y debootstrap debian-archive-keyring >/dev/null; }; then
      echo "base: installing debootstrap and debian-archive-keyring with apt-get failed (see above)" >&2
      exit 1
    fi
  else
    echo "base: debootstrap or $KEYRING is missing; install them (apt-get install debootstrap debian-archive-keyring) and retry" >&2
    exit 1
  fi
fi
if [ ! -s "$KEYRING" ]; then
  echo "base: no keyring at $KEYRING; refusing to fetch an unverified base" >&2
  exit 1
fi
if [ "$(id -u)" != 0 ]; then
  echo "base: debootstrap needs root" >&2
  exit 1
fi
root=$(mktemp -d /tmp/sandbox-base.XXXXXX)
trap 'rm -rf "$root"' EXIT
debootstrap --variant=minbase --keyring="$KEYRING" "$SUITE" "$root" "$MIRROR" >/tmp/sandbox-debootstrap.log 2>&1 || {
  echo "base: debootstrap failed; see /tmp/sandbox-debootstrap.log" >&2; tail -20 /tmp/sandbox-debootstrap.log >&2; exit 1; }
# Slim it the way the official -slim image is: no apt lists, docs or caches.
rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/*.bin "$root"/usr/share/doc/* "$root"/usr/share/man/* "$root"/usr/share/info/*
keyring_sha=$(sha256sum "$KEYRING" | cut -c1-16)
tar -C "$root" -c . | docker import \
  --change 'CMD ["bash"]' \
  --change "LABEL io.agent-sandbox.base-source=\"debootstrap $SUITE minbase from $MIRROR, Release verified with $KEYRING (sha256 $keyring_sha...)\"" \
  --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  - "$TAG" >/dev/null
echo "base: imported $TAG from debootstrap"

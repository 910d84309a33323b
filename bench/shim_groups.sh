#!/usr/bin/env bash
# Benchmark (evidence for issue 29's density goal): what Docker's per-container shim costs, and
# what grouping containers under one shim would save, measured on the engine's own containerd.
#
# Docker starts one `containerd-shim-runc-v2` per container (2.35 MiB of the 12.2 MiB an idle
# sandbox with its agent costs here, bench/scale.py). containerd's runc v2 shim serves every
# container whose OCI spec carries the same `io.containerd.runc.v2.group` annotation from one
# process (Kubernetes' pods use this). Docker Engine passes OCI annotations only from 24.0 (API
# 1.43, HostConfig.Annotations); this machine's engine (Debian's 20.10, API 1.41) cannot, so this
# script asks containerd directly with `ctr`: N idle containers (`sleep`, a read-only Debian
# rootfs exported from debian:bookworm-slim) with a shim each, then N grouped under one, and the
# shims' processes, RSS and PSS (PSS shares the pages the shims have in common fairly).
#
# Run: sudo bash bench/shim_groups.sh [N]    (needs the engine's containerd socket and ctr; it
# makes and removes only its own containers, in containerd namespace `sbx-shim-bench`, and one
# temporary docker container to export the rootfs)
set -euo pipefail
N=${1:-20}
SOCK=${CONTAINERD_SOCK:-/var/run/docker/containerd/containerd.sock}
NS=sbx-shim-bench
CTR=(ctr --address "$SOCK" -n "$NS")
ROOT=$(mktemp -d)
SRC="sbx-shim-bench-src-$$"
cleanup() {
  for id in $("${CTR[@]}" container ls -q 2>/dev/null); do
    "${CTR[@]}" task kill -s KILL "$id" >/dev/null 2>&1 || true
  done
  sleep 1
  for id in $("${CTR[@]}" container ls -q 2>/dev/null); do
    "${CTR[@]}" task delete "$id" >/dev/null 2>&1 || true
    "${CTR[@]}" container delete "$id" >/dev/null 2>&1 || true
  done
  ctr --address "$SOCK" namespaces remove "$NS" >/dev/null 2>&1 || true
  docker rm -f "$SRC" >/dev/null 2>&1 || true
  rm -rf "$ROOT"
}
trap cleanup EXIT

docker create --name "$SRC" debian:bookworm-slim >/dev/null
docker export "$SRC" | tar -x -C "$ROOT"
docker rm "$SRC" >/dev/null

measure() {  # prints: shims rss_kib pss_kib
  local n=0 rss=0 pss=0
  for p in $(pgrep -f "containerd-shim-runc-v2 -namespace $NS" || true); do
    n=$((n + 1))
    rss=$((rss + $(awk '/^VmRSS/ {print $2}' "/proc/$p/status")))
    pss=$((pss + $(awk '/^Pss:/ {s += $2} END {print s + 0}' "/proc/$p/smaps_rollup")))
  done
  echo "$n $rss $pss"
}

run() {  # $1 label, then extra `ctr run` flags
  local label=$1
  shift
  for i in $(seq 1 "$N"); do
    "${CTR[@]}" run -d --read-only "$@" --rootfs "$ROOT" "$label-$i" /bin/sleep infinity >/dev/null
  done
  sleep 2
  measure
  cleanup_run "$label"
}

cleanup_run() {
  for i in $(seq 1 "$N"); do "${CTR[@]}" task kill -s KILL "$1-$i" >/dev/null 2>&1 || true; done
  sleep 1
  for i in $(seq 1 "$N"); do
    "${CTR[@]}" task delete "$1-$i" >/dev/null 2>&1 || true
    "${CTR[@]}" container delete "$1-$i" >/dev/null 2>&1 || true
  done
}

read -r own_n own_rss own_pss < <(run own)
read -r grp_n grp_rss grp_pss < <(run grouped --annotation io.containerd.runc.v2.group=bench-tenant)

echo "$N idle containers on containerd $(ctr --address "$SOCK" version 2>/dev/null | awk '/Version/ {print $2; exit}')"
echo
awk -v n="$N" -v on="$own_n" -v gn="$grp_n" -v orss="$own_rss" -v grss="$grp_rss" -v opss="$own_pss" -v gpss="$grp_pss" 'BEGIN {
  printf "%-44s %10s %10s %7s\n", "shims", "own each", "grouped", "ratio"
  printf "%-44s %10d %10d %7.2f\n", "shim processes", on, gn, gn / on
  printf "%-44s %10.2f %10.2f %7.2f\n", "shim RSS per container (MiB)", orss / n / 1024, grss / n / 1024, grss / orss
  printf "%-44s %10.2f %10.2f %7.2f\n", "shim PSS per container (MiB)", opss / n / 1024, gpss / n / 1024, gpss / opss
}'

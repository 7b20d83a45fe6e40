#!/usr/bin/env bash
# Install the Debian packages the tests need, when missing. Needs root (or sudo) and apt.
set -euo pipefail
need=()
command -v kcat >/dev/null 2>&1 || need+=(kcat)
# Debian's ZooKeeper server jars (and a JRE), for the cluster tests and `make run-cluster`.
[ -f /usr/share/java/zookeeper.jar ] || need+=(zookeeper)
[ ${#need[@]} -eq 0 ] && exit 0
SUDO=""
[ "$(id -u)" -ne 0 ] && command -v sudo >/dev/null 2>&1 && SUDO="sudo -n"
if ! command -v apt-get >/dev/null 2>&1; then
  echo "system-deps: apt-get not available; missing: ${need[*]} (tests needing them will skip)" >&2
  exit 0
fi
echo "system-deps: installing ${need[*]}" >&2
$SUDO apt-get update -qq >/dev/null 2>&1 || true
$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null 2>&1 \
  || echo "system-deps: could not install ${need[*]} (tests needing them will skip)" >&2

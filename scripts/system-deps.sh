#!/usr/bin/env bash
# Install the Debian packages the tests need, when missing. Needs root (or sudo) and apt.
set -euo pipefail
# With "build": only what building the virtualenv needs (`make venv`, before the others).
need=()
# python-gssapi (the GSSAPI listeners' Kerberos binding) has no Linux wheel: it builds against
# MIT Kerberos's headers (krb5-config) with a C compiler.
command -v krb5-config >/dev/null 2>&1 || need+=(libkrb5-dev)
command -v gcc >/dev/null 2>&1 || need+=(gcc)
if [ "${1:-}" != build ]; then
  command -v kcat >/dev/null 2>&1 || need+=(kcat)
  # Debian's ZooKeeper server jars (and a JRE), for the cluster tests and `make run-cluster`.
  [ -f /usr/share/java/zookeeper.jar ] || need+=(zookeeper)
  # MIT Kerberos for the GSSAPI tests: a KDC of their own (krb5kdc, kdb5_util, kadmin.local),
  # the client tools, and Cyrus SASL's GSSAPI plugin, through which kcat's librdkafka logs in.
  [ -x /usr/sbin/krb5kdc ] || need+=(krb5-kdc)
  [ -x /usr/sbin/kadmin.local ] || need+=(krb5-admin-server)
  command -v kinit >/dev/null 2>&1 || need+=(krb5-user)
  ls /usr/lib/*/sasl2/libgssapiv2.so* >/dev/null 2>&1 || need+=(libsasl2-modules-gssapi-mit)
fi
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

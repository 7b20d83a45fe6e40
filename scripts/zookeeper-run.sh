#!/usr/bin/env bash
# Run one standalone ZooKeeper server in the foreground from Debian's `zookeeper` package
# (installed by scripts/system-deps.sh), without its init scripts:
#   scripts/zookeeper-run.sh PORT DIR [TICK_MS] [ADDRESS]
# writes DIR/zoo.cfg, keeps its data in DIR/data and serves on ADDRESS:PORT (127.0.0.1).
# ZOOKEEPER_EXTRA_CFG (lines appended to zoo.cfg) and ZOOKEEPER_JVM_FLAGS (e.g. a JAAS file's
# -Djava.security.auth.login.config) configure SASL or a TLS port.
# A 500 ms tick allows sessions of 1 s (2 ticks) up to 60 s (Kafka's default is 18 s).
set -euo pipefail
port=${1:?usage: zookeeper-run.sh PORT DIR [TICK_MS] [ADDRESS]}
dir=${2:?usage: zookeeper-run.sh PORT DIR [TICK_MS] [ADDRESS]}
tick=${3:-500}
address=${4:-127.0.0.1}
jar=/usr/share/java/zookeeper.jar
if [ ! -f "$jar" ] || ! command -v java >/dev/null 2>&1; then
  echo "zookeeper-run: needs $jar and java (install with: bash scripts/system-deps.sh)" >&2
  exit 3
fi
mkdir -p "$dir/data"
dir=$(cd "$dir" && pwd)
cat > "$dir/zoo.cfg" <<CFG
tickTime=$tick
dataDir=$dir/data
clientPort=$port
clientPortAddress=$address
maxSessionTimeout=60000
admin.enableServer=false
4lw.commands.whitelist=ruok,srvr,stat,mntr
CFG
if [ -n "${ZOOKEEPER_EXTRA_CFG:-}" ]; then printf '%s\n' "$ZOOKEEPER_EXTRA_CFG" >> "$dir/zoo.cfg"; fi
# zookeeper.jar's manifest names its dependencies; slf4j-simple (when present) logs to stderr.
cp=$jar
[ -f /usr/share/java/slf4j-simple.jar ] && cp="$cp:/usr/share/java/slf4j-simple.jar"
# The Netty connection factory (a TLS port) needs netty-codec, which the manifest leaves out.
[ -f /usr/share/java/netty-codec.jar ] && cp="$cp:/usr/share/java/netty-codec.jar"
# shellcheck disable=SC2086  # the flags are words
exec java -Xmx256m -XX:+UseSerialGC ${ZOOKEEPER_JVM_FLAGS:-} -cp "$cp" \
  org.apache.zookeeper.server.ZooKeeperServerMain "$dir/zoo.cfg"

#!/usr/bin/env bash
# Run a local Strata cluster in the foreground: one ZooKeeper (scripts/zookeeper-run.sh) and
# one broker per port in BROKER_PORTS (node ids 1..N), all from CONFIG with per-broker overrides.
#   ZK_PORT        ZooKeeper's port (2181); data in data/cluster/zookeeper
#   BROKER_PORTS   the brokers' ports ("9092 9093 9094"); broker N keeps its log dir in
#                  data/cluster/broker-N and writes its output to data/cluster/broker-N.log
#   CONFIG         server.properties for every broker (config/server.properties)
# The brokers share one filesystem remote tier, data/cluster/remote-storage (tiering as CONFIG says).
# Ctrl-C or SIGTERM stops the brokers (SIGTERM), then ZooKeeper.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
zk_port=${ZK_PORT:-2181}
read -r -a ports <<< "${BROKER_PORTS:-9092 9093 9094}"
config=${CONFIG:-config/server.properties}
data=$root/data/cluster
python=$root/.venv/bin/python
chroot=/strata
start_timeout=60

[ -x "$python" ] || { echo "run-cluster: $python missing (run: make venv)" >&2; exit 1; }
[ -f "$config" ] || { echo "run-cluster: config $config not found" >&2; exit 1; }

# The value of KEY in $config (last uncommented line), or nothing.
prop() { sed -n "s/^[[:space:]]*$1[[:space:]]*=[[:space:]]*//p" "$config" | tail -n 1; }

listening() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

zk_ok() {
  local answer=""
  { exec 3<>"/dev/tcp/127.0.0.1/$zk_port" && printf ruok >&3 && read -r -t 2 -n 4 answer <&3
    exec 3<&-; } 2>/dev/null || true
  [ "$answer" = imok ]
}

for port in "$zk_port" "${ports[@]}"; do
  if listening "$port"; then
    echo "run-cluster: 127.0.0.1:$port is already in use (is \`make run\` or another cluster running?)" >&2
    exit 1
  fi
done

zk_pid=""
broker_pids=()
stopping=0
stop_all() {
  [ "$stopping" = 1 ] && return
  stopping=1
  trap '' INT TERM
  local pid
  for pid in "${broker_pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${broker_pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  if [ -n "$zk_pid" ]; then
    kill -TERM "$zk_pid" 2>/dev/null || true
    wait "$zk_pid" 2>/dev/null || true
  fi
  echo "run-cluster: stopped" >&2
}
trap 'stop_all; exit 130' INT
trap 'stop_all; exit 143' TERM
trap 'stop_all' EXIT

# wait_up NAME PID LOG CHECK...: until CHECK succeeds; exits with LOG's tail if PID dies first
wait_up() {
  local name=$1 pid=$2 logfile=$3
  shift 3
  until "$@"; do
    if ! kill -0 "$pid" 2>/dev/null; then
      echo "run-cluster: $name exited; $logfile:" >&2
      tail -n 20 "$logfile" >&2
      exit 1
    fi
    [ "$SECONDS" -lt "$deadline" ] || { echo "run-cluster: $name not up after ${start_timeout}s" >&2; exit 1; }
    sleep 0.2
  done
}

mkdir -p "$data"
# setsid: the children get no terminal Ctrl-C of their own; this script stops them in order.
setsid bash scripts/zookeeper-run.sh "$zk_port" "$data/zookeeper" >"$data/zookeeper.log" 2>&1 &
zk_pid=$!
deadline=$((SECONDS + start_timeout))
wait_up ZooKeeper "$zk_pid" "$data/zookeeper.log" zk_ok
echo "run-cluster: ZooKeeper on 127.0.0.1:$zk_port (log $data/zookeeper.log)" >&2

# One remote tier for the whole cluster: the leader of each partition tiers into it.
mkdir -p "$data/remote-storage"
shared_tier=(--override "rsm.config.storage.url=file://$data/remote-storage")
metrics=$(prop strata.metrics.listener)

bootstrap=""
for i in "${!ports[@]}"; do
  node=$((i + 1))
  port=${ports[$i]}
  args=(--override "node.id=$node"
        --override "zookeeper.connect=127.0.0.1:$zk_port$chroot"
        --override "listeners=PLAINTEXT://127.0.0.1:$port"
        --override "advertised.listeners=PLAINTEXT://127.0.0.1:$port"
        --override "log.dirs=$data/broker-$node"
        "${shared_tier[@]}")
  if [ -n "$metrics" ]; then  # each broker its own metrics port: the configured one + i
    args+=(--override "strata.metrics.listener=${metrics%:*}:$((${metrics##*:} + i))")
  fi
  PYTHONUNBUFFERED=1 setsid "$python" -m strata.cli.main serve --config "$config" "${args[@]}" \
    >>"$data/broker-$node.log" 2>&1 &
  broker_pids+=($!)
  bootstrap+="${bootstrap:+,}127.0.0.1:$port"
done

for i in "${!ports[@]}"; do
  wait_up "broker $((i + 1))" "${broker_pids[$i]}" "$data/broker-$((i + 1)).log" listening "${ports[$i]}"
done
echo "run-cluster: ${#ports[@]} brokers up (logs $data/broker-N.log); Ctrl-C stops the cluster" >&2
echo "$bootstrap"

# Wait while any broker runs (one may be stopped by hand to watch the others).
live=("${broker_pids[@]}")
while [ ${#live[@]} -gt 0 ]; do
  wait -n "${live[@]}" 2>/dev/null || true
  still=()
  for pid in "${live[@]}"; do
    if kill -0 "$pid" 2>/dev/null; then
      still+=("$pid")
    else
      for i in "${!broker_pids[@]}"; do
        if [ "${broker_pids[$i]}" = "$pid" ]; then
          echo "run-cluster: broker $((i + 1)) (pid $pid) exited; see $data/broker-$((i + 1)).log" >&2
        fi
      done
    fi
  done
  live=("${still[@]}")
done
echo "run-cluster: every broker has exited" >&2
exit 1

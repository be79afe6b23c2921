#!/usr/bin/env bash
# CPU time and voluntary context switches per request of the service and of the bare-axum
# ceiling under the same wrk load (docs/BENCHMARKS.md): a release rebate-query on the embedded
# default with the default config, warmed over the 999 keys of scripts/wrk-hot999.lua, and
# `rebate-loadgen ceiling` answering the same quote's bytes; wrk (one thread, 64 connections,
# 8 s) against each in turn, ROUNDS times. User and system time come from /proc/PID/stat, context
# switches from every thread's voluntary_ctxt_switches (a worker that parks and is woken again);
# this machine's virtual CPUs expose no hardware counters to `perf stat`. Loopback only;
# everything it starts is stopped at the end.
#
#   scripts/cpu-per-request.sh                         # 2 rounds
#   ROUNDS=3 REBATE_QUERY_BIN=/tmp/other/rebate-query scripts/cpu-per-request.sh
set -euo pipefail
cd "$(dirname "$0")/.."
command -v wrk >/dev/null || { echo "needs wrk (Debian: apt-get install wrk)" >&2; exit 1; }
rounds=${ROUNDS:-2}
[[ $rounds =~ ^[0-9]+$ && $rounds -ge 1 && $rounds -le 10 ]] || { echo "ROUNDS: 1–10" >&2; exit 2; }
service_bin=${REBATE_QUERY_BIN:-target/release/rebate-query}
loadgen_bin=${REBATE_LOADGEN_BIN:-target/release/rebate-loadgen}
work=$(mktemp -d)
service_pid=
ceiling_pid=
trap 'kill $service_pid $ceiling_pid 2>/dev/null; wait 2>/dev/null; rm -rf "$work"' EXIT
source scripts/bench-service.sh
start_service 20 "$service_bin"
wrk -t1 -c16 -d3s -s scripts/wrk-hot999.lua "http://$api" >/dev/null
wrk -t1 -c16 -d3s -s scripts/wrk-hot999.lua "http://$api" >/dev/null
"$loadgen_bin" ceiling --listen 127.0.0.1:18095 --like "http://$api/api/v1/items/taobao/100001/rebate" \
  --seconds $(( rounds * 40 + 60 )) >"$work/ceiling.log" 2>&1 &
ceiling_pid=$!
for _ in $(seq 100); do
  curl -sf -o /dev/null http://127.0.0.1:18095/ && break
  sleep 0.1
done
# Clock ticks of user and system time of a process, all its threads.
ticks() { awk '{print $14, $15}' "/proc/$1/stat"; }
switches() { awk '/^voluntary_ctxt_switches/ {s += $2} END {print s}' /proc/"$1"/task/*/status; }
hz=$(getconf CLK_TCK)
printf '%-8s %10s %14s %14s %18s\n' target req/s 'user µs/req' 'sys µs/req' 'vol. switches/req'
for _ in $(seq "$rounds"); do
  for target in service ceiling; do
    if [[ $target == service ]]; then pid=$service_pid url=http://$api; else pid=$ceiling_pid url=http://127.0.0.1:18095; fi
    read -r user0 sys0 < <(ticks "$pid")
    switches0=$(switches "$pid")
    wrk -t1 -c64 -d8s -s scripts/wrk-hot999.lua "$url" >"$work/wrk.txt"
    read -r user1 sys1 < <(ticks "$pid")
    switches1=$(switches "$pid")
    requests=$(awk '/requests in/ {print $1}' "$work/wrk.txt")
    rps=$(awk '/^Requests\/sec/ {print $2}' "$work/wrk.txt")
    awk -v t="$target" -v n="$requests" -v r="$rps" -v hz="$hz" -v u=$((user1 - user0)) \
      -v s=$((sys1 - sys0)) -v c=$((switches1 - switches0)) \
      'BEGIN {printf "%-8s %10.0f %14.2f %14.2f %18.3f\n", t, r, u * 1e6 / hz / n, s * 1e6 / hz / n, c / n}'
  done
done

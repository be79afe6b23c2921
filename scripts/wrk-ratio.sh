#!/usr/bin/env bash
# The hot path against the bare-axum ceiling with wrk, in one run (docs/BENCHMARKS.md, "Hot
# path against the ceiling with wrk"): starts a release rebate-query on the embedded default
# (default config: logs at info, metrics, per-client limit and shedding on), warms the 999 keys
# of scripts/wrk-hot999.lua, starts `rebate-loadgen ceiling` answering the same quote's bytes,
# then runs wrk against each in turn, ROUNDS times (ceiling first in odd rounds, service first in
# even ones), and prints each run's req/s, non-2xx answers and wrk's CPU share, and each round's
# ratio. Loopback only; everything it starts is stopped at the end.
#
#   scripts/wrk-ratio.sh                 # 3 rounds of 8 s, wrk -t1 -c64
#   ROUNDS=5 SECONDS_EACH=10 CONNECTIONS=128 WRK_THREADS=2 scripts/wrk-ratio.sh
#
# REBATE_QUERY_BIN / REBATE_LOADGEN_BIN (default target/release/…) pick the binaries, WRK_SCRIPT
# the load (default scripts/wrk-hot999.lua; scripts/wrk-hot300.lua is the harness's key count);
# REBATE__* variables set by the caller reach the service (e.g. the harness's hot-path settings).
set -euo pipefail
cd "$(dirname "$0")/.."
command -v wrk >/dev/null || { echo "needs wrk (Debian: apt-get install wrk)" >&2; exit 1; }
rounds=${ROUNDS:-3}
seconds=${SECONDS_EACH:-8}
connections=${CONNECTIONS:-64}
wrk_threads=${WRK_THREADS:-1}
[[ $wrk_threads =~ ^[1-4]$ ]] || { echo "WRK_THREADS: 1–4" >&2; exit 2; }
service_bin=${REBATE_QUERY_BIN:-target/release/rebate-query}
loadgen_bin=${REBATE_LOADGEN_BIN:-target/release/rebate-loadgen}
script=${WRK_SCRIPT:-scripts/wrk-hot999.lua}
[[ -f $script ]] || { echo "WRK_SCRIPT: no such file: $script" >&2; exit 2; }
[[ $rounds =~ ^[0-9]+$ && $rounds -ge 1 && $rounds -le 20 ]] || { echo "ROUNDS: 1–20" >&2; exit 2; }
[[ $seconds =~ ^[0-9]+$ && $seconds -ge 1 && $seconds -le 60 ]] || { echo "SECONDS_EACH: 1–60" >&2; exit 2; }
work=$(mktemp -d)
pids=()
service_pid=
trap 'kill ${service_pid} "${pids[@]}" 2>/dev/null; wait 2>/dev/null; rm -rf "$work"' EXIT
source scripts/bench-service.sh
start_service 20 "$service_bin"
# Warm: every key loaded into L1 (and the rendered quotes), twice over.
wrk -t1 -c16 -d3s -s "$script" "http://$api" >/dev/null
wrk -t1 -c16 -d3s -s "$script" "http://$api" >/dev/null
"$loadgen_bin" ceiling --listen 127.0.0.1:18095 --like "http://$api/api/v1/items/taobao/100001/rebate" \
  --seconds $(( rounds * seconds * 2 + 120 )) >"$work/ceiling.log" 2>&1 &
pids+=($!)
for _ in $(seq 100); do
  curl -sf -o /dev/null http://127.0.0.1:18095/ && break
  sleep 0.1
done
# One wrk run: prints "req/s non2xx wrk_cpu_share".
measure() {
  local url=$1 out=$work/wrk.txt
  /usr/bin/time -f "%U %S %e" -o "$work/time.txt" \
    wrk -t"$wrk_threads" -c"$connections" -d"${seconds}s" -s "$script" "$url" >"$out"
  local rps non2xx cpu
  rps=$(awk '/^Requests\/sec/ {print $2}' "$out")
  non2xx=$(awk '/Non-2xx or 3xx responses/ {print $5}' "$out")
  cpu=$(awk '{printf "%.2f", ($1 + $2) / $3}' "$work/time.txt")
  echo "$rps ${non2xx:-0} $cpu"
}
printf '%-6s %-8s %12s %8s %9s\n' round target req/s non-2xx wrk-cores
for round in $(seq "$rounds"); do
  if (( round % 2 )); then order="ceiling service"; else order="service ceiling"; fi
  for target in $order; do
    if [[ $target == ceiling ]]; then url=http://127.0.0.1:18095; else url=http://$api; fi
    read -r rps non2xx cpu < <(measure "$url")
    printf '%-6s %-8s %12s %8s %9s\n' "$round" "$target" "$rps" "$non2xx" "$cpu"
    eval "${target}_$round=$rps"
  done
  service_rps=service_$round ceiling_rps=ceiling_$round
  awk -v s="${!service_rps}" -v c="${!ceiling_rps}" -v r="$round" \
    'BEGIN {printf "round %s: service / ceiling = %.3f\n", r, s / c}'
done

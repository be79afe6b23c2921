#!/usr/bin/env bash
# The harness's hot-path figures against wrk's on the same build, alternating (docs/BENCHMARKS.md,
# "The harness against wrk"): ROUNDS times, `rebate-loadgen run --scenario hot-path` (closed-loop
# maximum of the service and of the ceiling, 64 connections, its default 2 generator threads),
# then scripts/wrk-ratio.sh for one round with the service configured as the harness configures it
# (client limit off, no per-address connection cap, logs at warn) and the harness's key count
# (300 hot keys), with wrk on WRK_THREADS threads. Prints each pair side by side; the harness's
# reports are kept under OUT (default target/loadgen/harness-vs-wrk-<time>/).
#
#   scripts/harness-vs-wrk.sh                  # 3 rounds, wrk -t1
#   ROUNDS=2 WRK_THREADS=2 scripts/harness-vs-wrk.sh
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${ROUNDS:-3}
[[ $rounds =~ ^[0-9]+$ && $rounds -ge 1 && $rounds -le 10 ]] || { echo "ROUNDS: 1–10" >&2; exit 2; }
threads=${WRK_THREADS:-1}
[[ $threads =~ ^[1-4]$ ]] || { echo "WRK_THREADS: 1–4" >&2; exit 2; }
out=${OUT:-target/loadgen/harness-vs-wrk-$(date -u +%Y%m%dT%H%M%SZ)}
mkdir -p "$out"
loadgen_bin=${REBATE_LOADGEN_BIN:-target/release/rebate-loadgen}
printf '%-5s %-8s %14s %14s %8s\n' round target harness wrk "wrk/harness"
for n in $(seq "$rounds"); do
  # The in-flight bound below the harness's default: the ceiling shares the harness's process,
  # and 2 × 10,000 connections would take all of its 20,000 file descriptors.
  "$loadgen_bin" run --scenario hot-path --no-build --max-in-flight 4000 --out "$out/harness-$n" \
    >"$out/harness-$n.log" 2>&1 || true
  series() {
    jq -r --arg want "$1" '[.scenarios[0].series[] | select(.label == $want) | .achieved_rps][0] // 0' \
      "$out/harness-$n/report.json"
  }
  harness_service=$(series "service max")
  harness_ceiling=$(series "ceiling max")
  REBATE__RESILIENCE__CLIENT_LIMIT__ENABLED=false REBATE__HTTP__MAX_CONNECTIONS_PER_PEER=0 \
    REBATE__LOG__FILTER=warn WRK_SCRIPT=scripts/wrk-hot300.lua WRK_THREADS=$threads ROUNDS=1 \
    SECONDS_EACH=10 scripts/wrk-ratio.sh >"$out/wrk-$n.txt" 2>&1
  wrk_service=$(awk '$2 == "service" {print $3}' "$out/wrk-$n.txt")
  wrk_ceiling=$(awk '$2 == "ceiling" {print $3}' "$out/wrk-$n.txt")
  for target in service ceiling; do
    h=harness_$target w=wrk_$target
    awk -v n="$n" -v t="$target" -v h="${!h}" -v w="${!w}" \
      'BEGIN {printf "%-5s %-8s %14.0f %14.0f %8s\n", n, t, h, w, (h > 0 ? sprintf("%.3f", w / h) : "–")}'
  done
done

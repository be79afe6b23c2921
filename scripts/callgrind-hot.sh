#!/usr/bin/env bash
# Instructions per hot-path request, counted by callgrind (docs/BENCHMARKS.md): a release
# rebate-query on the embedded default with the default config runs under valgrind; after a
# warm-up, its counters are zeroed, wrk sends the 999-key load (scripts/wrk-hot999.lua) for
# SECONDS_EACH seconds, and the counters are dumped; then zeroed again for the same time idle.
# Prints (load − idle instructions) ÷ requests: the service's own instructions per request
# (the kernel's are not counted). Instruction counts repeat where times do not.
#
# TARGET=ceiling counts the bare-axum ceiling (`rebate-loadgen ceiling`, answering the same
# quote's bytes) under valgrind instead, with the same load: the reference for the service's count.
#
#   scripts/callgrind-hot.sh                       # target/release/rebate-query, 10 s each
#   REBATE_QUERY_BIN=/tmp/other/rebate-query SECONDS_EACH=20 scripts/callgrind-hot.sh
#   TARGET=ceiling scripts/callgrind-hot.sh
set -euo pipefail
cd "$(dirname "$0")/.."
for tool in wrk valgrind callgrind_control; do
  command -v $tool >/dev/null || { echo "needs $tool (Debian: wrk, valgrind)" >&2; exit 1; }
done
seconds=${SECONDS_EACH:-10}
[[ $seconds =~ ^[0-9]+$ && $seconds -ge 1 && $seconds -le 120 ]] || { echo "SECONDS_EACH: 1–120" >&2; exit 2; }
service_bin=${REBATE_QUERY_BIN:-target/release/rebate-query}
loadgen_bin=${REBATE_LOADGEN_BIN:-target/release/rebate-loadgen}
target=${TARGET:-service}
[[ $target == service || $target == ceiling ]] || { echo "TARGET: service or ceiling" >&2; exit 2; }
work=$(mktemp -d)
service_pid=
trap '[[ -n $service_pid ]] && kill $service_pid 2>/dev/null; wait 2>/dev/null; rm -rf "$work"' EXIT
source scripts/bench-service.sh
valgrind=(valgrind --tool=callgrind --callgrind-out-file="$work/cg.%p")
if [[ $target == service ]]; then
  start_service 120 "${valgrind[@]}" "$service_bin"
  # Warm every key (slowly: the service runs ~50× slower under valgrind).
  wrk -t1 -c8 -d20s -s scripts/wrk-hot999.lua "http://$api" >/dev/null
else
  # The service only gives the ceiling its quote's bytes, then stops.
  start_service 20 "$service_bin"
  "${valgrind[@]}" "$loadgen_bin" ceiling --listen 127.0.0.1:18095 \
    --like "http://$api/api/v1/items/taobao/100001/rebate" --seconds $(( seconds * 3 + 240 )) \
    >"$work/ceiling.log" 2>&1 &
  ceiling_pid=$!
  for _ in $(seq 600); do
    curl -sf -o /dev/null http://127.0.0.1:18095/ && break
    sleep 0.2
  done
  kill "$service_pid"
  wait "$service_pid" 2>/dev/null || true
  service_pid=$ceiling_pid api=127.0.0.1:18095
  wrk -t1 -c8 -d10s -s scripts/wrk-hot999.lua "http://$api" >/dev/null
fi
# Instructions of the last dump since the counters were zeroed.
counted() {
  local last
  last=$(ls -t "$work"/cg.* | head -1)
  awk '/^summary:/ {print $2}' "$last"
}
callgrind_control --zero "$service_pid" >/dev/null
wrk -t1 -c8 -d"${seconds}s" -s scripts/wrk-hot999.lua "http://$api" >"$work/wrk.txt"
callgrind_control --dump=load "$service_pid" >/dev/null
sleep 1
loaded=$(counted)
requests=$(awk '/requests in/ {print $1}' "$work/wrk.txt")
non2xx=$(awk '/Non-2xx or 3xx responses/ {print $5}' "$work/wrk.txt")
callgrind_control --zero "$service_pid" >/dev/null
sleep "$seconds"
callgrind_control --dump=idle "$service_pid" >/dev/null
sleep 1
idle=$(counted)
echo "$target ($([[ $target == service ]] && echo "$service_bin" || echo "$loadgen_bin")): $requests requests (non-2xx ${non2xx:-0}) in ${seconds} s"
echo "instructions: loaded $loaded, idle $idle"
awk -v l="$loaded" -v i="$idle" -v n="$requests" \
  'BEGIN {printf "instructions per request: %.0f\n", (l - i) / n}'

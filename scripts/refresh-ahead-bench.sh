#!/usr/bin/env bash
# Refresh ahead at a short TTL (docs/BENCHMARKS.md, "Refresh ahead"): starts a release
# rebate-query with every part fresh for 10 s ± 10 % and the given refresh lead, warms the 300 hot
# keys with wrk for 5 s, runs wrk for 30 s, and prints each part's L1 misses and refreshes in
# those 30 s and wrk's latency. Loopback only; the service is killed at the end.
#
#   scripts/refresh-ahead-bench.sh 500    # lead 500 ms
#   scripts/refresh-ahead-bench.sh 0      # refresh ahead off
#
# REBATE_QUERY_BIN (default target/release/rebate-query) picks the binary.
set -euo pipefail
lead=${1:?usage: refresh-ahead-bench.sh LEAD_MS}
cd "$(dirname "$0")/.."
command -v wrk >/dev/null || { echo "needs wrk (Debian: apt-get install wrk)" >&2; exit 1; }
binary=${REBATE_QUERY_BIN:-target/release/rebate-query}
work=$(mktemp -d)
token=refresh-bench-token-0123456789
export REBATE__HTTP__LISTEN=127.0.0.1:18080 REBATE__ADMIN__LISTEN=127.0.0.1:18090
export REBATE__ADMIN__TOKEN=$token REBATE__STORE__SQLITE__PATH=$work/demo.sqlite
export REBATE__RESILIENCE__CLIENT_LIMIT__ENABLED=false REBATE__LOG__FILTER=warn
for part in PRODUCT RATE COUPONS EXTRAS; do
  export "REBATE__PARTS__${part}__FRESH_SECS=10" "REBATE__PARTS__${part}__REFRESH_AHEAD_MS=$lead"
done
"$binary" >"$work/service.log" 2>&1 &
service=$!
trap 'kill $service 2>/dev/null; rm -rf "$work"' EXIT
for _ in $(seq 100); do
  curl -sf -o /dev/null http://127.0.0.1:18090/readyz && break
  sleep 0.1
done
status() { curl -sf -H "authorization: Bearer $token" http://127.0.0.1:18090/admin/v1/status; }
wrk -t1 -c32 -d5s -s scripts/wrk-hot300.lua http://127.0.0.1:18080 >/dev/null
status >"$work/before.json"
wrk -t1 -c32 -d30s --latency -s scripts/wrk-hot300.lua http://127.0.0.1:18080 >"$work/wrk.txt"
status >"$work/after.json"
python3 - "$work/before.json" "$work/after.json" <<'PY'
import json, sys
before, after = (json.load(open(path)) for path in sys.argv[1:3])
for part in ["product", "rate", "coupons", "extras"]:
    delta = {key: after["caches"][part][key] - before["caches"][part][key]
             for key in ["misses", "refreshes", "load_failures"]}
    print(part, delta)
refused = {dependency["name"]: dependency["quota"]["refused"]
           for dependency in after["protection"]["dependencies"] if dependency["quota"]}
print("quota refusals since start:", refused)
PY
grep -E "Requests/sec|^ +(50|99)%" "$work/wrk.txt"

#!/usr/bin/env bash
# The operator dashboard end to end in headless Chromium (tests/browser/dashboard.test.mjs):
# starts the debug binary on free loopback ports in a scratch directory with the embedded
# simulator on a port of its own, makes the coupon API answer in 400 ms so that one query is a
# genuinely slow request (over observability.slow_request_ms = 300, within the coupons' 500 ms
# timeout), takes its trace id from x-trace-id, then has the browser open /dashboard, enter the
# token, find that request, open its stages and take a screenshot it checks is not blank.
# Installs what is missing: Debian's chromium, and playwright-core (tests/browser, `npm ci`).
#
#   scripts/dashboard-test.sh     # REBATE_QUERY_BIN defaults to target/debug/rebate-query
#
# Leaves the screenshot, the page's figures and the service's log in target/dashboard-test/.
set -euo pipefail
cd "$(dirname "$0")/.."

log() { printf '[dashboard-test] %s\n' "$*"; }

service_bin=${REBATE_QUERY_BIN:-target/debug/rebate-query}
chromium_bin=${CHROMIUM_BIN:-/usr/bin/chromium}
out_dir=$PWD/target/dashboard-test

source scripts/browser-env.sh
ensure_browser_env "$service_bin" "$chromium_bin"

rm -rf "$out_dir"
mkdir -p "$out_dir"
scratch=$(mktemp -d)
service_pid=
cleanup() {
  if [[ -n $service_pid ]]; then
    kill "$service_pid" 2>/dev/null || true
    wait "$service_pid" 2>/dev/null || true
  fi
  rm -rf "$scratch"
}
trap cleanup EXIT

read -r api_port admin_port sim_port < <(free_ports 3)
REBATE__STORE__SQLITE__PATH="$scratch/catalogue.sqlite" \
  REBATE__ADMIN__TOKEN_FILE="$scratch/admin-token" \
  REBATE__UPSTREAMS__SIMULATOR_LISTEN="127.0.0.1:$sim_port" \
  REBATE__OBSERVABILITY__SLOW_REQUEST_MS=300 \
  "$service_bin" --listen "127.0.0.1:$api_port" --admin-listen "127.0.0.1:$admin_port" \
  >"$out_dir/service.log" 2>&1 &
service_pid=$!

admin=http://127.0.0.1:$admin_port
ready=
for _ in $(seq 1 150); do
  if curl -fsS --max-time 2 "$admin/readyz" >/dev/null 2>&1; then
    ready=yes
    break
  fi
  if ! kill -0 "$service_pid" 2>/dev/null; then
    break
  fi
  sleep 0.2
done
if [[ -z $ready ]]; then
  tail -n 40 "$out_dir/service.log" >&2
  echo "the service did not become ready within 30 s" >&2
  exit 1
fi
token=$(cat "$scratch/admin-token")

# One slow request: an item outside the warm-up's hot list (so its coupons are not cached), its
# coupon call held 400 ms by the simulator.
sim=http://127.0.0.1:$sim_port
curl -fsS --max-time 5 -X PUT -H 'content-type: application/json' -d '{"latency_ms":400}' \
  "$sim/_sim/faults/coupons" >/dev/null
curl -fsS --max-time 10 -D "$scratch/headers" -o /dev/null \
  "http://127.0.0.1:$api_port/api/v1/items/jd/100777/rebate"
curl -fsS --max-time 5 -X DELETE "$sim/_sim/faults" >/dev/null
trace_id=$(tr -d '\r' <"$scratch/headers" | awk -F': ' 'tolower($1) == "x-trace-id" { print $2 }')
if [[ ! $trace_id =~ ^[0-9a-f]{32}$ ]]; then
  echo "the slow request's answer has no x-trace-id" >&2
  exit 1
fi
# It is recorded as slow (else the browser would wait for a row that never comes).
curl -fsS --max-time 5 -H "authorization: Bearer $token" "$admin/admin/v1/slow-requests/$trace_id" |
  python3 -c '
import json, sys
record = json.load(sys.stdin)
assert "slow" in record["reasons"], record
print("[dashboard-test] provoked a slow request: %.0f ms, trace id %s" % (record["latency_ms"], record["trace_id"]))'

DASHBOARD_URL=$admin ADMIN_TOKEN=$token TRACE_ID=$trace_id OUT_DIR=$out_dir CHROMIUM_BIN=$chromium_bin \
  timeout 180 node tests/browser/dashboard.test.mjs
log "passed; screenshot: $out_dir/dashboard.png"

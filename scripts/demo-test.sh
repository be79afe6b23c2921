#!/usr/bin/env bash
# The H5 demo page (clients/h5/demo) and the reference client end to end in headless Chromium
# (tests/browser/demo.test.mjs): starts the debug binary on free loopback ports with the page's
# origin in http.cors.allowed_origins and strict cache-only serving (engine.cache_only_loads = 0,
# so a pinned cache_only level answers 503 for an item with nothing cached), serves clients/h5
# with python's http.server on a port of its own, and runs the browser test. Installs what is
# missing (scripts/browser-env.sh).
#
#   scripts/demo-test.sh     # REBATE_QUERY_BIN defaults to target/debug/rebate-query
#
# Leaves the screenshots and the service's log in target/demo-test/.
set -euo pipefail
cd "$(dirname "$0")/.."

log() { printf '[demo-test] %s\n' "$*"; }

service_bin=${REBATE_QUERY_BIN:-target/debug/rebate-query}
chromium_bin=${CHROMIUM_BIN:-/usr/bin/chromium}
out_dir=$PWD/target/demo-test

source scripts/browser-env.sh
ensure_browser_env "$service_bin" "$chromium_bin"

rm -rf "$out_dir"
mkdir -p "$out_dir"
scratch=$(mktemp -d)
service_pid=
static_pid=
cleanup() {
  for pid in $service_pid $static_pid; do
    kill "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  done
  rm -rf "$scratch"
}
trap cleanup EXIT

read -r api_port admin_port sim_port static_port < <(free_ports 4)
origin=http://127.0.0.1:$static_port
python3 -m http.server "$static_port" --bind 127.0.0.1 --directory clients/h5 \
  >"$out_dir/static.log" 2>&1 &
static_pid=$!
REBATE__STORE__SQLITE__PATH="$scratch/catalogue.sqlite" \
  REBATE__ADMIN__TOKEN_FILE="$scratch/admin-token" \
  REBATE__UPSTREAMS__SIMULATOR_LISTEN="127.0.0.1:$sim_port" \
  REBATE__HTTP__CORS__ALLOWED_ORIGINS="[\"$origin\"]" \
  REBATE__ENGINE__CACHE_ONLY_LOADS=0 \
  "$service_bin" --listen "127.0.0.1:$api_port" --admin-listen "127.0.0.1:$admin_port" \
  >"$out_dir/service.log" 2>&1 &
service_pid=$!

admin=http://127.0.0.1:$admin_port
ready=
for _ in $(seq 1 150); do
  if curl -fsS --max-time 2 "$admin/readyz" >/dev/null 2>&1 &&
    curl -fsS --max-time 2 -o /dev/null "$origin/demo/index.html" 2>/dev/null; then
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
  echo "the service or the static server did not come up within 30 s" >&2
  exit 1
fi

# An item outside the warm-up's hot list, so that only the page's own request caches it.
api=http://127.0.0.1:$api_port
PAGE_URL="$origin/demo/index.html?api=$api&platform=jd&item=100777&seed=7" \
  API_URL=$api ADMIN_URL=$admin ADMIN_TOKEN=$(cat "$scratch/admin-token") \
  OUT_DIR=$out_dir CHROMIUM_BIN=$chromium_bin \
  timeout 180 node tests/browser/demo.test.mjs
log "passed; screenshots: $out_dir/*.png"

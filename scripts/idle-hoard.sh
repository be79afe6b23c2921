#!/usr/bin/env bash
# Idle keep-alive connections against a listener (issue #40), on the release binary:
#   1. embedded default: 49 addresses (127.0.0.2–50) × 205 idle connections (10,045 for 10,000
#      slots), then a new client on 127.0.0.60, one new connection per request, twice a second
#      for 30 s (the issue's "60 times out of 60"); then the same with the hoarders reopening
#      every connection the server closes;
#   2. the admin listener of the same instance: 70 idle connections, then /readyz and /healthz
#      16 times each on new connections; then 64 heads trickling in and 8 times each more;
#   3. production profile as the chaos suite starts it (MariaDB, a private redis-server as L2)
#      with config/production.toml's per-address cap of 0: 10,000 idle connections from
#      127.0.0.2 alone, then the new client as in 1.
# Prints one JSON line per phase (scripts/idle_hoard.py) with the connection counts and closes,
# and the server's own counters. About 4 minutes; every process it starts is stopped on exit.
#
#   cargo build --release -p query-api && scripts/idle-hoard.sh [BINARY]
set -euo pipefail
cd "$(dirname "$0")/.."

binary=$(realpath "${1:-target/release/rebate-query}")
mysql_url=${MYSQL_URL:-mysql://root@127.0.0.1:3306}
work=$(mktemp -d)
pids=()
database=""
failed=0

log() { printf '[idle-hoard] %s\n' "$*" >&2; }

cleanup() {
  for pid in "${pids[@]}"; do
    kill "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  done
  if [[ -n $database ]]; then
    mysql -h 127.0.0.1 -u root -e "DROP DATABASE IF EXISTS \`$database\`" || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT

# The service holds 10,000 connections and the client as many: each needs that many descriptors.
ulimit -n "$(ulimit -Hn)"
if (($(ulimit -n) < 12000)); then
  log "ulimit -n is $(ulimit -n); 10,000 connections need at least 12000"
  exit 1
fi

free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

wait_ready() {
  local admin=$1 deadline=$((SECONDS + 60))
  until curl -fs "http://$admin/healthz" >/dev/null; do
    if ((SECONDS > deadline)); then
      log "the service did not answer /healthz on $admin within 60 s"
      return 1
    fi
    sleep 0.5
  done
}

# start NAME ENV...: the service with the embedded defaults and ENV; sets $api and $admin.
start() {
  local name=$1
  shift
  api=127.0.0.1:$(free_port)
  admin=127.0.0.1:$(free_port)
  (cd "$work" && exec env "$@" REBATE__HTTP__LISTEN="$api" REBATE__ADMIN__LISTEN="$admin" \
    REBATE__ADMIN__TOKEN_FILE="$work/$name-token" REBATE__LOG__FILTER=warn \
    REBATE__UPSTREAMS__SIMULATOR_LISTEN="127.0.0.1:$(free_port)" \
    "$binary" >"$work/$name.log" 2>&1) &
  pids+=($!)
  wait_ready "$admin"
  log "$name: serving on $api, admin $admin ($(git rev-parse --short HEAD), $binary)"
}

stop_last() {
  local pid=${pids[-1]}
  kill "$pid"
  wait "$pid" 2>/dev/null || true
  unset 'pids[-1]'
}

log "embedded default"
start embedded REBATE__STORE__SQLITE__PATH="$work/demo.sqlite"
log "49 addresses × 205 idle connections, then a new client for 30 s"
timeout 180 python3 scripts/idle_hoard.py api --target "$api" --admin "$admin" \
  --sources 2-50 --per-source 205 || failed=1
log "the same, the hoarders reopening every connection the server closes"
timeout 180 python3 scripts/idle_hoard.py api --target "$api" --admin "$admin" \
  --sources 2-50 --per-source 205 --reconnect || failed=1
log "admin listener: 70 idle connections, then 64 trickling heads"
timeout 120 python3 scripts/idle_hoard.py admin --admin "$admin" --idle 70 --rounds 16 ||
  failed=1
stop_last

log "production profile (MariaDB, a private Redis), no per-address cap"
database=rebate_hoard_$(date +%s)_$$
mysql -h 127.0.0.1 -u root -e "CREATE DATABASE \`$database\`"
redis_port=$(free_port)
redis-server --port "$redis_port" --bind 127.0.0.1 --save "" --appendonly no \
  >"$work/redis.log" 2>&1 &
pids+=($!)
production=(
  REBATE__STORE__BACKEND=mysql DATABASE_URL="$mysql_url/$database"
  REBATE__REDIS__ENABLED=true REDIS_URL="redis://127.0.0.1:$redis_port"
  REBATE__HTTP__MAX_CONNECTIONS_PER_PEER=0
)
(cd "$work" && env "${production[@]}" REBATE__LOG__FILTER=warn "$binary" seed) >"$work/seed.log" 2>&1
start production "${production[@]}"
log "10,000 idle connections from 127.0.0.2, then a new client for 30 s"
timeout 180 python3 scripts/idle_hoard.py api --target "$api" --admin "$admin" \
  --sources 2-2 --per-source 10000 || failed=1
exit "$failed"

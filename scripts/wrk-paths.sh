#!/usr/bin/env bash
# The paths other than the hot single item, each against the bare-axum ceiling with wrk in the
# same run (docs/BENCHMARKS.md, "The other paths against the ceiling"):
#
#   batch  POST /api/v1/items:batch with 50 hot-list keys, every one warm: the embedded default
#          with the default config.
#   l2     GET of a single item whose four parts all come from Redis: the production profile
#          (MariaDB, Redis) with kept renderings off and one L1 entry per part, so that every
#          request misses L1 and reads L2; quotas raised so that the warm-up fills L2 completely.
#   cold   GET of an item never asked for before: the production profile with the default config
#          (quotas included), a fresh instance and Redis prefix per round, warm-up off; wrk walks
#          the catalogue, a new key every request.
#
# Each round runs wrk (one thread, CONNECTIONS connections) against the path and against
# `rebate-loadgen ceiling` answering the same bytes (for batch, the batch's answer to a POST of
# the same body), alternating which goes first, and prints req/s, non-2xx, wrk's CPU share, the
# ratio, and what the service's counters say the run did (answers by outcome, cache lookups by
# tier). Loopback only; the database and Redis keys it creates are removed at the end.
#
#   scripts/wrk-paths.sh                    # all three, 3 rounds each
#   PATHS="batch l2" ROUNDS=2 scripts/wrk-paths.sh
#
# SECONDS_EACH (8; cold runs at most 4 s: the catalogue has ~30,000 items), CONNECTIONS (64),
# REBATE_QUERY_BIN, REBATE_LOADGEN_BIN, MYSQL_URL (mysql://root@127.0.0.1:3306), REDIS_URL
# (redis://127.0.0.1:6379).
set -euo pipefail
cd "$(dirname "$0")/.."
for tool in wrk curl mysql redis-cli; do
  command -v $tool >/dev/null || { echo "needs $tool" >&2; exit 1; }
done
paths=${PATHS:-batch l2 cold}
rounds=${ROUNDS:-3}
seconds=${SECONDS_EACH:-8}
connections=${CONNECTIONS:-64}
service_bin=${REBATE_QUERY_BIN:-target/release/rebate-query}
loadgen_bin=${REBATE_LOADGEN_BIN:-target/release/rebate-loadgen}
mysql_url=${MYSQL_URL:-mysql://root@127.0.0.1:3306}
redis_url=${REDIS_URL:-redis://127.0.0.1:6379}
[[ $rounds =~ ^[0-9]+$ && $rounds -ge 1 && $rounds -le 10 ]] || { echo "ROUNDS: 1–10" >&2; exit 2; }
[[ $seconds =~ ^[0-9]+$ && $seconds -ge 1 && $seconds -le 60 ]] || { echo "SECONDS_EACH: 1–60" >&2; exit 2; }
for path in $paths; do
  [[ $path == batch || $path == l2 || $path == cold ]] || { echo "PATHS: batch, l2, cold" >&2; exit 2; }
done
work=$(mktemp -d)
database=rebate_paths_$$
redis_prefix=rebate-paths-$$
pids=()
service_pid=
cleanup() {
  kill ${service_pid} "${pids[@]}" 2>/dev/null || true
  wait 2>/dev/null || true
  mysql -h 127.0.0.1 -u root -e "DROP DATABASE IF EXISTS $database" 2>/dev/null || true
  redis-cli -u "$redis_url" --scan --pattern "$redis_prefix*" 2>/dev/null \
    | xargs -r -n 500 redis-cli -u "$redis_url" DEL >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT
source scripts/bench-service.sh

stop_service() {
  kill "$service_pid" 2>/dev/null || true
  wait "$service_pid" 2>/dev/null || true
  service_pid=
}

ceiling_port=18095
start_ceiling() { # like-URL [post-body-file]
  local extra=()
  [[ -n ${2:-} ]] && extra=(--post-body "$2")
  "$loadgen_bin" ceiling --listen 127.0.0.1:$ceiling_port --like "$1" "${extra[@]}" \
    --seconds 900 >"$work/ceiling.log" 2>&1 &
  ceiling_pid=$!
  pids+=("$ceiling_pid")
  for _ in $(seq 100); do
    curl -sf -o /dev/null "http://127.0.0.1:$ceiling_port/" && return 0
    sleep 0.1
  done
  cat "$work/ceiling.log" >&2
  exit 1
}
stop_ceiling() {
  kill "$ceiling_pid" 2>/dev/null || true
  wait "$ceiling_pid" 2>/dev/null || true
}

# The service's answer and cache counters, one "name value" per line.
counters() {
  curl -sf -H "authorization: Bearer $(cat "$work/admin-token")" http://127.0.0.1:18091/metrics |
    awk '/^rebate_answers_total|^rebate_cache_lookups_total|^rebate_quota_refused_total|^rebate_hot_item_refused_total|^rebate_dependency_call_duration_seconds_count/ {print $1, $2}'
}
# What changed between two counter dumps, non-zero only, on one line.
counter_delta() {
  awk 'NR == FNR {before[$1] = $2; next}
       {d = $2 - before[$1]; if (d > 0) {
          name = $1; gsub(/rebate_|_total|part=|tier=|result=|outcome=|"/, "", name); printf "%s=%d ", name, d}}
       END {print ""}' "$1" "$2"
}

# One wrk run: prints "req/s non2xx wrk_cores".
measure() { # url script seconds [script args…]
  local url=$1 script=$2 secs=$3
  shift 3
  /usr/bin/time -f "%U %S %e" -o "$work/time.txt" \
    wrk -t1 -c"$connections" -d"${secs}s" -s "$script" "$url" -- "$@" >"$work/wrk.txt"
  local rps non2xx cpu
  rps=$(awk '/^Requests\/sec/ {print $2}' "$work/wrk.txt")
  non2xx=$(awk '/Non-2xx or 3xx responses/ {print $5}' "$work/wrk.txt")
  cpu=$(awk '{printf "%.2f", ($1 + $2) / $3}' "$work/time.txt")
  echo "$rps ${non2xx:-0} $cpu"
}

# A round: the path and the ceiling, in the order given; prints both and the ratio.
round() { # path round-number order service-url script seconds [script args…]
  local path=$1 n=$2 order=$3 url=$4 script=$5 secs=$6
  shift 6
  local service_rps ceiling_rps
  for target in $order; do
    if [[ $target == ceiling ]]; then
      read -r rps non2xx cpu < <(measure "http://127.0.0.1:$ceiling_port" "$script" "$secs" "$@")
      ceiling_rps=$rps
      printf '%-6s %-5s %-8s %12s %8s %9s\n' "$path" "$n" ceiling "$rps" "$non2xx" "$cpu"
    else
      counters >"$work/before.txt"
      read -r rps non2xx cpu < <(measure "$url" "$script" "$secs" "$@")
      counters >"$work/after.txt"
      service_rps=$rps
      printf '%-6s %-5s %-8s %12s %8s %9s   %s\n' "$path" "$n" service "$rps" "$non2xx" "$cpu" \
        "$(counter_delta "$work/before.txt" "$work/after.txt")"
    fi
  done
  awk -v s="$service_rps" -v c="$ceiling_rps" -v p="$path" -v r="$n" \
    'BEGIN {printf "%s round %s: service / ceiling = %.3f\n", p, r, s / c}'
}

order_of() { if (( $1 % 2 )); then echo "ceiling service"; else echo "service ceiling"; fi; }

# 50 distinct hot-list keys, the body of every batch request.
batch_body=$work/batch.json
{
  printf '{"items":['
  for i in $(seq 0 49); do
    (( i > 0 )) && printf ','
    printf '{"platform":"taobao","item_id":"%d"}' $(( 100001 + i ))
  done
  printf ']}'
} >"$batch_body"

# The production profile's environment for one Redis prefix, as `env` arguments.
production_env() { # redis-prefix
  echo REBATE__STORE__BACKEND=mysql "DATABASE_URL=$mysql_url/$database" \
    REBATE__REDIS__ENABLED=true "REDIS_URL=$redis_url" "REBATE__REDIS__PREFIX=$1"
}

printf '%-6s %-5s %-8s %12s %8s %9s   %s\n' path round target req/s non-2xx wrk-cores \
  "service counters during the run"
for path in $paths; do
  case $path in
    batch)
      start_service 20 "$service_bin"
      # Warm the 50 keys (and their renderings).
      for _ in 1 2 3; do
        curl -sf -X POST -H 'content-type: application/json' --data-binary @"$batch_body" \
          "http://$api/api/v1/items:batch" -o /dev/null
      done
      wrk -t1 -c8 -d2s -s scripts/wrk-batch.lua "http://$api" -- "$batch_body" >/dev/null
      start_ceiling "http://$api/api/v1/items:batch" "$batch_body"
      echo "batch: the answer is $(curl -sf -X POST -H 'content-type: application/json' \
        --data-binary @"$batch_body" "http://$api/api/v1/items:batch" | wc -c) bytes"
      for n in $(seq "$rounds"); do
        round batch "$n" "$(order_of "$n")" "http://$api" scripts/wrk-batch.lua "$seconds" \
          "$batch_body"
      done
      stop_ceiling
      stop_service
      ;;
    l2 | cold)
      if [[ ! -f $work/seeded ]]; then
        mysql -h 127.0.0.1 -u root -e "CREATE DATABASE $database"
        # shellcheck disable=SC2046 # production_env prints separate words on purpose
        env $(production_env "$redis_prefix-seed") "$service_bin" seed >"$work/seed.log" 2>&1 ||
          { cat "$work/seed.log" >&2; exit 1; }
        touch "$work/seeded"
      fi
      if [[ $path == l2 ]]; then
        l2_env=(REBATE__ENGINE__RENDERED_MAX_BYTES=0 REBATE__WARMUP__ENABLED=false)
        for part in PRODUCT RATE COUPONS EXTRAS; do
          l2_env+=("REBATE__PARTS__${part}__L1_MAX_ENTRIES=1")
        done
        for upstream in COUPONS EXTRAS; do
          l2_env+=("REBATE__RESILIENCE__${upstream}__QUOTA_PER_SEC=100000"
            "REBATE__RESILIENCE__${upstream}__QUOTA_BURST=100000")
        done
        # shellcheck disable=SC2046
        start_service 30 env $(production_env "$redis_prefix-l2") "${l2_env[@]}" "$service_bin"
        # Fill L2: every key loaded once (and again, for what the first pass degraded).
        wrk -t1 -c8 -d4s -s scripts/wrk-hot999.lua "http://$api" >/dev/null
        wrk -t1 -c8 -d4s -s scripts/wrk-hot999.lua "http://$api" >/dev/null
        start_ceiling "http://$api/api/v1/items/taobao/100001/rebate"
        for n in $(seq "$rounds"); do
          round l2 "$n" "$(order_of "$n")" "http://$api" scripts/wrk-hot999.lua "$seconds"
        done
        stop_ceiling
        stop_service
      else
        cold_seconds=$(( seconds < 4 ? seconds : 4 ))
        for n in $(seq "$rounds"); do
          # A fresh instance and Redis prefix: every key of the walk is cold in L1 and L2.
          # shellcheck disable=SC2046
          start_service 30 env $(production_env "$redis_prefix-cold-$n") \
            REBATE__WARMUP__ENABLED=false "$service_bin"
          # The ceiling answers a quote of the same size (that key is past the walk's end).
          start_ceiling "http://$api/api/v1/items/jd/109999/rebate"
          round cold "$n" "$(order_of "$n")" "http://$api" scripts/wrk-cold.lua "$cold_seconds"
          stop_ceiling
          stop_service
        done
      fi
      ;;
  esac
done

#!/usr/bin/env bash
# The shipped nginx in front of the service, on loopback: Debian's nginx runs
# docker/nginx/nginx.conf with only what must change rewritten (the upstream servers → the
# service's port, the listen port → a free one, logs, pid and temp paths → a scratch directory);
# the proxy headers and timeouts are the ones that ship. The debug binary gets the client-limit
# settings the compose stack gives its replicas (read from docker/compose.yaml: one trusted hop)
# and a small limit: 2 requests, then one every 10 s. Requests carry no x-client-id, so each
# client is keyed by its address. The test shows, with curl from two loopback source addresses:
# - client A (127.0.0.2) spends its burst and gets 429 while client B (127.0.0.3) gets 200, and
#   B is then limited on its own: two clients limited separately, not one bucket for nginx;
# - A with spoofed X-Forwarded-For values is still limited as itself (nginx overwrites them);
# - straight to the service, bypassing nginx, the header picks the bucket: the control that
#   shows why only the proxy may reach the replicas.
# Installs Debian's nginx when missing; without it the test fails under CI and is skipped
# elsewhere.
#
#   scripts/nginx-test.sh     # REBATE_QUERY_BIN defaults to target/debug/rebate-query
#
# Leaves the rewritten configuration and the logs in target/nginx-test/.
set -euo pipefail
cd "$(dirname "$0")/.."

log() { printf '[nginx-test] %s\n' "$*"; }

service_bin=${REBATE_QUERY_BIN:-target/debug/rebate-query}
nginx_bin=${NGINX_BIN:-/usr/sbin/nginx}
shipped_conf=docker/nginx/nginx.conf
out_dir=$PWD/target/nginx-test
client_a=127.0.0.2
client_b=127.0.0.3
# Two requests at once, then one every 10 s: the test's requests take about a second, so no
# token comes back while it runs and every status below is exact.
per_sec=0.1
burst=2
item_path=/api/v1/items/jd/100002/rebate

source scripts/browser-env.sh # free_ports

if [[ ! -x $nginx_bin ]]; then
  log "installing Debian's nginx"
  if ! DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nginx >/dev/null; then
    apt-get update -qq || true
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nginx >/dev/null || true
  fi
fi
if [[ ! -x $nginx_bin ]]; then
  if [[ -n ${CI:-} ]]; then
    log "FAILED: $nginx_bin is missing and could not be installed"
    exit 1
  fi
  log "SKIPPED: $nginx_bin is missing and could not be installed (under CI this fails)"
  exit 0
fi
if [[ ! -x $service_bin ]]; then
  log "building $service_bin"
  cargo build --locked --quiet -p query-api
fi

rm -rf "$out_dir"
mkdir -p "$out_dir"
scratch=$(mktemp -d)
# nginx's own files: its workers drop root for nobody and must reach the temp paths.
nginx_dir=$(mktemp -d)
chmod 0755 "$nginx_dir"
service_pid=
nginx_pid=
# TERM, then at most 5 s for the process to go, then KILL.
stop() {
  local pid=$1
  [[ -n $pid ]] || return 0
  kill "$pid" 2>/dev/null || return 0
  for _ in $(seq 1 50); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  kill -KILL "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
}
cleanup() {
  stop "$nginx_pid"
  stop "$service_pid"
  rm -rf "$scratch" "$nginx_dir"
}
trap cleanup EXIT

fail() {
  log "FAILED: $*"
  for file in "$out_dir/service.log" "$out_dir/error.log"; do
    if [[ -f $file ]]; then
      printf -- '--- last lines of %s\n' "$file" >&2
      tail -n 30 "$file" >&2
    fi
  done
  exit 1
}

# The compose stack's client-limit settings for its replicas, as written there.
mapfile -t shipped_env < <(python3 - docker/compose.yaml <<'PY'
import sys, yaml
with open(sys.argv[1]) as compose:
    environment = yaml.safe_load(compose)["x-rebate-query"]["environment"]
for key, value in environment.items():
    if key.startswith("REBATE__RESILIENCE__CLIENT_LIMIT__"):
        print(f"{key}={value}")
PY
)
if [[ " ${shipped_env[*]} " != *" REBATE__RESILIENCE__CLIENT_LIMIT__TRUSTED_PROXY_HOPS=1 "* ]]; then
  fail "docker/compose.yaml does not give its replicas trusted_proxy_hops = 1 (it sets: ${shipped_env[*]:-nothing})"
fi
log "compose's client-limit settings: ${shipped_env[*]}"

read -r api_port admin_port sim_port proxy_port < <(free_ports 4)

# The shipped configuration with the addresses and paths rewritten, nothing else.
conf=$out_dir/nginx.conf
sed -E \
  -e "s/^([[:space:]]*server )rebate-query-[0-9]+:8080 /\1127.0.0.1:$api_port /" \
  -e "s/^([[:space:]]*listen )8080;/\1127.0.0.1:$proxy_port;/" \
  -e "/^http \{/a\\
  access_log $out_dir/access.log;\\
  client_body_temp_path $nginx_dir/client_body;\\
  proxy_temp_path $nginx_dir/proxy;\\
  fastcgi_temp_path $nginx_dir/fastcgi;\\
  uwsgi_temp_path $nginx_dir/uwsgi;\\
  scgi_temp_path $nginx_dir/scgi;" \
  "$shipped_conf" >"$conf"
changed=$(diff "$shipped_conf" "$conf" | grep -c '^<' || true)
if [[ $changed -ne 3 ]] || grep -q 'rebate-query-' "$conf" ||
  ! grep -q "listen 127.0.0.1:$proxy_port;" "$conf"; then
  diff "$shipped_conf" "$conf" >&2 || true
  fail "rewriting $shipped_conf changed $changed of its lines, not the 3 expected (two upstream servers, the listen port)"
fi
log "nginx: $shipped_conf with its 2 upstream servers and its listen port rewritten, 6 path lines added"

REBATE__STORE__SQLITE__PATH="$scratch/catalogue.sqlite" \
  REBATE__ADMIN__TOKEN_FILE="$scratch/admin-token" \
  REBATE__UPSTREAMS__SIMULATOR_LISTEN="127.0.0.1:$sim_port" \
  env "${shipped_env[@]}" \
  REBATE__RESILIENCE__CLIENT_LIMIT__ENABLED=true \
  REBATE__RESILIENCE__CLIENT_LIMIT__PER_SEC=$per_sec \
  REBATE__RESILIENCE__CLIENT_LIMIT__BURST=$burst \
  "$service_bin" --listen "127.0.0.1:$api_port" --admin-listen "127.0.0.1:$admin_port" \
  >"$out_dir/service.log" 2>&1 &
service_pid=$!

nginx_args=(-p "$nginx_dir/" -c "$conf" -e "$out_dir/error.log"
  -g "daemon off; pid $nginx_dir/nginx.pid; error_log $out_dir/error.log notice;")
"$nginx_bin" -t -q "${nginx_args[@]}" 2>>"$out_dir/error.log" ||
  fail "nginx -t refused the rewritten configuration"
"$nginx_bin" "${nginx_args[@]}" 2>>"$out_dir/error.log" &
nginx_pid=$!

proxy=http://127.0.0.1:$proxy_port
service=http://127.0.0.1:$api_port
# The probe through nginx names itself (x-client-id), so it spends no address's tokens.
ready=
for _ in $(seq 1 150); do
  if curl -fsS --max-time 2 -o /dev/null "http://127.0.0.1:$admin_port/readyz" 2>/dev/null &&
    curl -sS --max-time 2 -o /dev/null -H 'x-client-id: nginx-test-probe' "$proxy/" 2>/dev/null; then
    ready=yes
    break
  fi
  kill -0 "$service_pid" 2>/dev/null || fail "the service exited at start"
  kill -0 "$nginx_pid" 2>/dev/null || fail "nginx exited at start"
  sleep 0.2
done
[[ -n $ready ]] || fail "the service or nginx did not come up within 30 s"

# Statuses of $1 requests to $2 from source address $3 (the rest: curl arguments), on one line.
statuses() {
  local count=$1 base=$2 source=$3 codes=()
  shift 3
  for _ in $(seq 1 "$count"); do
    codes+=("$(curl -sS -o /dev/null -w '%{http_code}' --max-time 5 --interface "$source" "$@" \
      "$base$item_path")")
  done
  echo "${codes[*]}"
}

expect() {
  local what=$1 want=$2 got=$3
  if [[ $got != "$want" ]]; then
    fail "$what: expected $want, got $got"
  fi
  log "ok: $what: $got"
}

started=$SECONDS
spent="200 200 429" # the burst, then a refusal
expect "client A ($client_a) through nginx, 3 requests" "$spent" \
  "$(statuses 3 "$proxy" "$client_a")"
expect "client B ($client_b) through nginx right after, 3 requests (limited apart from A)" "$spent" \
  "$(statuses 3 "$proxy" "$client_b")"
spoofed=()
for value in 10.9.9.9 10.9.9.10 "198.51.100.1, 10.9.9.11" 2001:db8::1; do
  spoofed+=("$(curl -sS -o /dev/null -w '%{http_code}' --max-time 5 --interface "$client_a" \
    -H "X-Forwarded-For: $value" "$proxy$item_path")")
done
spoofed+=("$(curl -sS -o /dev/null -w '%{http_code}' --max-time 5 --interface "$client_a" \
  -H 'X-Forwarded-For: 10.9.9.12' -H 'X-Forwarded-For: 10.9.9.13' "$proxy$item_path")")
expect "client A through nginx with 5 spoofed X-Forwarded-For values (ignored)" \
  "429 429 429 429 429" "${spoofed[*]}"
# The control: the service does key on the header, so the header nginx sets is what matters.
expect "control, straight to the service from 127.0.0.1 with X-Forwarded-For: $client_a" "429" \
  "$(statuses 1 "$service" 127.0.0.1 -H "X-Forwarded-For: $client_a")"
expect "control, straight to the service from 127.0.0.1 with X-Forwarded-For: 10.9.9.9" "200" \
  "$(statuses 1 "$service" 127.0.0.1 -H 'X-Forwarded-For: 10.9.9.9')"
if ((SECONDS - started >= 10)); then
  fail "the checks took $((SECONDS - started)) s: a token may have come back (one every 10 s)"
fi
log "passed: behind the shipped nginx, clients are limited by their own address and a spoofed X-Forwarded-For is ignored"

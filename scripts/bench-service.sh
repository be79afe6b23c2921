# Sourced by the benchmark scripts: starts a rebate-query on the embedded default with the
# default config on 127.0.0.1:18080 (admin 18091), its database and admin token in $work.
#
#   start_service WAIT_SECONDS COMMAND…   # COMMAND: the binary, or a wrapper and the binary
#
# Sets $api and $service_pid; waits (bounded) for /readyz; on failure prints the log and exits.
start_service() {
  local wait_s=$1
  shift
  api=127.0.0.1:18080
  REBATE__HTTP__LISTEN=$api REBATE__ADMIN__LISTEN=127.0.0.1:18091 \
    REBATE__ADMIN__TOKEN_FILE=$work/admin-token REBATE__STORE__SQLITE__PATH=$work/demo.sqlite \
    "$@" >"$work/service.log" 2>&1 &
  service_pid=$!
  for _ in $(seq $(( wait_s * 10 ))); do
    curl -sf -o /dev/null http://127.0.0.1:18091/readyz && return 0
    sleep 0.1
  done
  tail -20 "$work/service.log" >&2
  exit 1
}

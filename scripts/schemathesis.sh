#!/usr/bin/env bash
# Property-based checks of the public and admin APIs against their OpenAPI document
# (docs/openapi.json, served by the admin listener as /openapi.json): schemathesis generates
# valid and invalid requests for every operation and checks every answer — status documented,
# content type, body schema, required headers, valid data accepted, invalid data refused, 405
# with `Allow` for undeclared methods, no 5xx — with every check on. The only operations left
# out are those that write live rules (a new version, promote, abort, rollback): a generated
# rule set would change the timeouts, limits and shed level the rest of the run is checked
# under, and no schema can say which documents the config file accepts. Their reads are fuzzed;
# the writes are covered by the rules' own tests.
#
# The service is the embedded default debug binary on free loopback ports, in a scratch
# directory. The run is bounded: each API gets --max-examples per operation and a hard
# `timeout`, about two minutes in all. The per-client limit is raised out of reach for the run
# (per_sec and burst), not turned off: every generated request comes from one address, and a
# limit that answers 429 would hide the answers under test, while turning it off would also
# turn off the `x-client-id` check the document promises (429 itself is documented and covered
# by the edge's own tests).
#
#   scripts/schemathesis.sh                 # REBATE_QUERY_BIN defaults to target/debug/rebate-query
set -euo pipefail
cd "$(dirname "$0")/.."
version=4.32.5
if ! schemathesis --version 2>/dev/null | grep -qx "schemathesis, version $version"; then
  echo "installing schemathesis $version"
  python3 -m pip install --quiet --disable-pip-version-check "schemathesis==$version"
fi

service_bin=${REBATE_QUERY_BIN:-target/debug/rebate-query}
scratch=$(mktemp -d)
free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
api_port=$(free_port)
admin_port=$(free_port)
REBATE__STORE__SQLITE__PATH="$scratch/catalogue.sqlite" REBATE__ADMIN__TOKEN_FILE="$scratch/admin-token" \
  REBATE__RESILIENCE__CLIENT_LIMIT__PER_SEC=1000000 REBATE__RESILIENCE__CLIENT_LIMIT__BURST=1000000 \
  "$service_bin" --listen "127.0.0.1:$api_port" --admin-listen "127.0.0.1:$admin_port" \
  >"$scratch/service.log" 2>&1 &
service_pid=$!
trap 'kill $service_pid 2>/dev/null; wait $service_pid 2>/dev/null; rm -rf "$scratch"' EXIT
for _ in $(seq 1 150); do
  curl -fsS "http://127.0.0.1:$admin_port/readyz" >/dev/null 2>&1 && break
  sleep 0.2
done
curl -fsS "http://127.0.0.1:$admin_port/readyz" >/dev/null || {
  tail -n 40 "$scratch/service.log"
  echo "the service did not become ready" >&2
  exit 1
}
# What the listener serves is the committed document (the unit test holds the code to it).
curl -fsS "http://127.0.0.1:$admin_port/openapi.json" | cmp -s - docs/openapi.json || {
  echo "/openapi.json differs from docs/openapi.json" >&2
  exit 1
}

# A generated request the edge refuses for its size (413, 414, 431) is refused all the same:
# schemathesis's default list of refusals lacks those, so a long generated query string (a list
# for a scalar parameter, say) would count as invalid data accepted.
cat >"$scratch/schemathesis.toml" <<'TOML'
[checks.negative_data_rejection]
expected-statuses = [400, 401, 403, 404, 405, 406, 409, 413, 414, 415, 422, 428, 429, 431, "5xx"]
TOML

run() {
  local name=$1 url=$2 tag=$3 seconds=$4
  shift 4
  echo "schemathesis: the $name API at $url"
  # --seed: the same requests on every run, so a failure is reproducible. --workers 1: with two
  # worker threads, hypothesis's ast.parse on this machine's CPython 3.11.7 failed one CI run
  # with "SystemError: AST constructor recursion depth mismatch" on no fault of the service: the
  # AST builder's depth counter is one per interpreter, not per thread (see CPython gh-106905).
  # One worker takes about 35 s for both APIs. Run from the scratch directory: schemathesis keeps its cache
  # (.schemathesis/) in the working directory.
  (cd "$scratch" && timeout --kill-after=10 "$seconds" schemathesis --config-file schemathesis.toml run \
    "$OLDPWD/docs/openapi.json" --url "$url" \
    --include-tag "$tag" --checks all --max-examples 100 --seed 17 --workers 1 \
    --request-timeout 10 --no-color "$@")
}
status=0
run public "http://127.0.0.1:$api_port" public 60 || status=$?
# The admin API after the public one: its generated drills (forced shed levels, events) must
# not change what the public run sees.
run admin "http://127.0.0.1:$admin_port" admin 60 \
  --header "Authorization: Bearer $(cat "$scratch/admin-token")" \
  --exclude-operation-id create_rule_set --exclude-operation-id promote_rule_set \
  --exclude-operation-id abort_rule_set --exclude-operation-id roll_back_to_rule_set || status=$?
if ((status != 0)); then
  echo "schemathesis failed (status $status); the service's log:" >&2
  tail -n 40 "$scratch/service.log" >&2
fi
exit "$status"

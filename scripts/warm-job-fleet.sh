#!/usr/bin/env bash
# A warm job on a two-instance fleet, one instance killed mid-job (docs/BENCHMARKS.md, issue
# #18): a fresh MariaDB database seeded with the demo catalogue (30,000 items), the machine's
# Redis under a fresh prefix, two release rebate-query instances sharing both (simulated
# upstreams, in-process bus: warm jobs need neither a broker nor real APIs). `rebatectl warm
# --file` submits KEYS keys (a third per platform, ids from 100001 up: the first 10,000 of each
# platform exist, the rest are unknown) through instance A and follows the job; once a third of
# its chunks are done, instance B is killed with SIGKILL, holding whatever chunk it had. The job
# must still end with every key counted exactly once (loaded + not found + failed = KEYS, failed
# 0) and every loaded key's product in L2; the instances' warm-job counters show A's claims.
#
#   scripts/warm-job-fleet.sh                     # 100,000 keys
#   KEYS=20000 scripts/warm-job-fleet.sh
#
# Loopback only; the database, the Redis prefix and everything started are removed at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
for tool in mysql redis-cli curl python3; do
  command -v $tool >/dev/null || { echo "needs $tool" >&2; exit 1; }
done
keys=${KEYS:-100000}
[[ $keys =~ ^[0-9]+$ && $keys -ge 3000 && $keys -le 200000 ]] || { echo "KEYS: 3000–200000" >&2; exit 2; }
service_bin=${REBATE_QUERY_BIN:-target/release/rebate-query}
rebatectl_bin=${REBATECTL_BIN:-target/release/rebatectl}
work=$(mktemp -d)
name=warmfleet_$(date +%s)_$$
pids=()
cleanup() {
  kill "${pids[@]}" 2>/dev/null || true
  wait 2>/dev/null || true
  mysql -uroot -h127.0.0.1 -e "DROP DATABASE IF EXISTS $name" || true
  redis-cli --scan --pattern "*$name*" | xargs -r redis-cli del >/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

mysql -uroot -h127.0.0.1 -e "CREATE DATABASE $name"
token=$(python3 -c 'import secrets; print(secrets.token_hex(24))')
export DATABASE_URL="mysql://root@127.0.0.1:3306/$name" REDIS_URL=redis://127.0.0.1:6379
export REBATE__STORE__BACKEND=mysql REBATE__REDIS__ENABLED=true REBATE__REDIS__PREFIX=$name
export REBATE__ADMIN__TOKEN=$token REBATE__LOG__FILTER=warn
# Fast enough to finish in a couple of minutes, and a short claim time so that B's chunk is
# taken over within seconds of its death.
export REBATE__WARM_JOBS__RATE_PER_SEC=${RATE_PER_SEC:-1000} REBATE__WARM_JOBS__CLAIM_IDLE_MS=5000
"$service_bin" seed >"$work/seed.log" 2>&1

start() { # name api-port admin-port
  REBATE__OBSERVABILITY__INSTANCE_ID=$1 "$service_bin" --listen "127.0.0.1:$2" \
    --admin-listen "127.0.0.1:$3" >"$work/$1.log" 2>&1 &
  pids+=($!)
  for _ in $(seq 150); do
    curl -sf -o /dev/null "http://127.0.0.1:$3/readyz" && return 0
    sleep 0.2
  done
  tail -20 "$work/$1.log" >&2
  exit 1
}
start a 18180 18191
pid_a=${pids[-1]}
start b 18280 18291
pid_b=${pids[-1]}

python3 - "$keys" >"$work/ids.txt" <<'EOF'
import sys
platforms = ["taobao", "jd", "pdd"]
for index in range(int(sys.argv[1])):
    print(f"{platforms[index % 3]}:{100001 + index // 3}")
EOF
status() { curl -sf -H "Authorization: Bearer $token" "http://127.0.0.1:$1/admin/v1/status"; }
REBATE_ADMIN_TOKEN=$token "$rebatectl_bin" --admin http://127.0.0.1:18191 warm --file "$work/ids.txt" \
  >"$work/rebatectl.log" 2>&1 &
rebatectl_pid=$!
started=$SECONDS
job=
until [[ -n $job ]]; do
  # rebatectl names the job only when it ends: its hash in Redis names it from the start.
  job=$(redis-cli --scan --pattern "{$name:warm}:job:*" | head -1 | sed 's/.*://')
  ((SECONDS - started < 60)) || { cat "$work/rebatectl.log" >&2; exit 1; }
  sleep 0.5
done
progress() { curl -sf -H "Authorization: Bearer $token" "http://127.0.0.1:18191/admin/v1/warm-jobs/$job"; }
chunks=$(progress | python3 -c 'import json, sys; print(json.load(sys.stdin)["total_chunks"])')
until (( $(progress | python3 -c 'import json, sys; print(json.load(sys.stdin)["done_chunks"])') * 3 >= chunks )); do
  ((SECONDS - started < 600)) || { echo "no third of the job done in 10 minutes" >&2; exit 1; }
  sleep 0.5
done
status 18291 >"$work/b-status.json"
kill -9 "$pid_b"
wait "$pid_b" 2>/dev/null || true
echo "killed instance b at $(progress | python3 -c 'import json, sys; p = json.load(sys.stdin); print(p["done_chunks"], "of", p["total_chunks"], "chunks done")')"
wait "$rebatectl_pid" && rebatectl_status=0 || rebatectl_status=$?
echo "rebatectl (exit $rebatectl_status), in $((SECONDS - started)) s:"
tr '\r' '\n' <"$work/rebatectl.log" | grep -E '^(progress|warm job)' | sed -n '1p;$p'
progress >"$work/progress.json"
status 18191 >"$work/a-status.json"
in_l2=$(redis-cli --scan --pattern "*$name*product*" | wc -l)
python3 - "$work" "$keys" "$in_l2" <<'EOF'
import json, sys
work, keys, in_l2 = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
progress = json.load(open(f"{work}/progress.json"))
a = json.load(open(f"{work}/a-status.json"))
b = json.load(open(f"{work}/b-status.json"))
print("job:", json.dumps(progress))
print("instance a warm jobs:", json.dumps(a.get("warm_jobs")))
print("instance b warm jobs (just before its kill):", json.dumps(b.get("warm_jobs")))
print("product keys in L2:", in_l2)
counted = progress["loaded"] + progress["not_found"] + progress["failed"]
checks = {
    "the job is done": progress["state"] == "done",
    "every chunk done": progress["done_chunks"] == progress["total_chunks"],
    "every key counted once": counted == keys,
    "no key failed": progress["failed"] == 0,
    "every loaded key's product in L2": in_l2 >= progress["loaded"],
}
for check, ok in checks.items():
    print(("ok  " if ok else "FAIL"), check)
sys.exit(0 if all(checks.values()) else 1)
EOF

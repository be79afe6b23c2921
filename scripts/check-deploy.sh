#!/usr/bin/env bash
# Static checks of the deployment files (no cluster, no Docker engine needed):
# - every Kubernetes manifest under deploy/k8s validates against the Kubernetes 1.30 schemas
#   (kubernetes-validate from PyPI, installed when missing), strictly (unknown fields fail);
# - the validator itself fails on a manifest broken on purpose (so a pass means something);
# - the ConfigMap's config.toml is a configuration the service starts with
#   (`rebate-query check-config`), and every REBATE__* variable the Deployment sets is a key;
# - docker/compose.yaml parses and checks (`docker-compose config`, Debian's docker-compose,
#   which needs no engine), as does the production config the image carries with the
#   replicas' REBATE__* settings from compose;
# - the stacks' promises: MariaDB 10.11 in compose, trusted_proxy_hops = 1 in compose and the
#   ConfigMap, the Dockerfile's default target built without the simulator and a `simulator`
#   target for compose's upstream-sim;
# - Prometheus's configuration and alert rules (`promtool`, Debian's prometheus package);
# - every metric and label the Grafana dashboard and the rules query is in /metrics of a
#   running instance (scripts/check-metrics-queries.py).
# Debian packages and the PyPI tool are installed when missing.
#
#   scripts/check-deploy.sh                 # REBATE_QUERY_BIN defaults to target/debug/rebate-query
set -euo pipefail
cd "$(dirname "$0")/.."
k8s_version=1.30.0
validator_version=1.37.0
if ! kubernetes-validate --version 2>/dev/null | grep -qx "$validator_version"; then
  echo "installing kubernetes-validate $validator_version"
  python3 -m pip install --quiet --disable-pip-version-check "kubernetes-validate==$validator_version"
fi
manifests=(deploy/k8s/*.yaml deploy/k8s/examples/*.yaml)
kubernetes-validate --strict --quiet -k "$k8s_version" "${manifests[@]}"
echo "kubernetes: ${#manifests[@]} files valid against $k8s_version"

scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
sed 's/containerPort: 8080/containerPort: "eighty"/' deploy/k8s/deployment.yaml >"$scratch/broken.yaml"
if kubernetes-validate --strict --quiet -k "$k8s_version" "$scratch/broken.yaml" >/dev/null 2>&1; then
  echo "kubernetes-validate passed a broken manifest: the check above proves nothing" >&2
  exit 1
fi

service_bin=${REBATE_QUERY_BIN:-target/debug/rebate-query}
python3 - deploy/k8s/configmap.yaml "$scratch/config.toml" <<'PY'
import sys, yaml
with open(sys.argv[1]) as manifest:
    config = yaml.safe_load(manifest)["data"]["config.toml"]
with open(sys.argv[2], "w") as out:
    out.write(config)
PY
# The Secret's values, as placeholders of the right shape.
DATABASE_URL=mysql://rebate:x@mariadb:3306/rebate REDIS_URL=redis://redis:6379 \
  AMQP_URL=amqp://rebate:x@rabbitmq:5672/%2f \
  REBATE__EVENTS__SIGNING_KEY=0123456789abcdef0123456789abcdef \
  REBATE__ADMIN__TOKEN=0123456789abcdef0123456789abcdef \
  "$service_bin" --config "$scratch/config.toml" check-config
for variable in $(grep -Eo 'REBATE__[A-Z0-9_]+' deploy/k8s/deployment.yaml | sort -u); do
  if ! grep -q "\`$variable\`" docs/CONFIGURATION.md; then
    echo "deploy/k8s/deployment.yaml sets $variable, which is no configuration key" >&2
    exit 1
  fi
done
echo "kubernetes: the ConfigMap's configuration is valid; the Deployment's variables are keys"

for tool in docker-compose promtool; do
  if ! command -v "$tool" >/dev/null; then
    echo "installing Debian's docker-compose and prometheus (for promtool)"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker-compose prometheus >/dev/null
    break
  fi
done
REBATE_ADMIN_TOKEN=check REBATE_SIGNING_KEY=check docker-compose -f docker/compose.yaml config -q
# The replicas' REBATE__* settings in compose (those without a ${…} placeholder), on top of the
# image's configuration.
mapfile -t compose_env < <(python3 - docker/compose.yaml <<'PY'
import sys, yaml
with open(sys.argv[1]) as compose:
    environment = yaml.safe_load(compose)["x-rebate-query"]["environment"]
for key, value in environment.items():
    if key.startswith("REBATE__") and "${" not in str(value):
        print(f"{key}={value}")
PY
)
DATABASE_URL=mysql://rebate:x@mariadb:3306/rebate REDIS_URL=redis://redis:6379 \
  AMQP_URL=amqp://rebate:x@rabbitmq:5672/%2f \
  REBATE__EVENTS__SIGNING_KEY=0123456789abcdef0123456789abcdef \
  env "${compose_env[@]}" "$service_bin" --config config/production.toml check-config >/dev/null
echo "compose: docker/compose.yaml and the image's config/production.toml (with compose's ${#compose_env[@]} REBATE__ settings) are valid"

# What the shipped stacks promise (docs/DEPLOYMENT.md): the database the tests run on, exactly
# one trusted proxy in front (nginx in compose, the ingress controller on Kubernetes; its
# behaviour is scripts/nginx-test.sh's), and the service's image without the simulator, which
# has a target of its own for the demo.
python3 - "$scratch/config.toml" <<'PY'
import re, sys, tomllib, yaml

problems = []
with open("docker/compose.yaml") as file:
    compose = yaml.safe_load(file)
services = compose["services"]
databases = {
    name: service["image"]
    for name, service in services.items()
    if re.match(r"(mysql|mariadb)\b", service.get("image", ""))
}
if databases != {"mariadb": "mariadb:10.11"}:
    problems.append(f"compose's database should be mariadb:10.11 (the tests' server), not {databases}")
environment = compose["x-rebate-query"]["environment"]
hops = environment.get("REBATE__RESILIENCE__CLIENT_LIMIT__TRUSTED_PROXY_HOPS")
if str(hops) != "1":
    problems.append(f"compose's replicas should trust one proxy (nginx), not {hops!r}")
with open(sys.argv[1], "rb") as file:
    configmap = tomllib.load(file)
hops = configmap.get("resilience", {}).get("client_limit", {}).get("trusted_proxy_hops")
if hops != 1:
    problems.append(f"the ConfigMap should trust one proxy (the ingress controller), not {hops!r}")

with open("docker/Dockerfile") as file:
    stages = re.split(r"^FROM ", file.read(), flags=re.M)[1:]
names = [stage.split("\n", 1)[0].split(" AS ")[-1].strip() for stage in stages]
if "simulator" not in names or "upstream-sim" in stages[-1]:
    problems.append(f"the Dockerfile's last (default) stage should hold the service alone, "
                    f"with a simulator stage apart; stages: {names}")
production_build = "cargo build --release --locked -p query-api --no-default-features --features jemalloc"
if production_build not in "".join(stages):
    problems.append(f"the Dockerfile should build the service with `{production_build}`")
if services["upstream-sim"].get("build", {}).get("target") != "simulator":
    problems.append("compose's upstream-sim should build the Dockerfile's simulator target")
for name, service in services.items():
    if service.get("image", "").startswith("rebate-query:") and "target" in service.get("build", {}):
        problems.append(f"compose's {name} should build the Dockerfile's default target")

for problem in problems:
    print(f"check-deploy: {problem}", file=sys.stderr)
sys.exit(1 if problems else 0)
PY
echo "stacks: MariaDB 10.11, one trusted proxy in compose and the ConfigMap, the image without the simulator"

# promtool resolves rule_files as written: point it at the checkout's copy.
sed "s|/etc/prometheus/rules.yml|$PWD/docker/prometheus/rules.yml|" docker/prometheus/prometheus.yml \
  >"$scratch/prometheus.yml"
promtool check config --syntax-only "$scratch/prometheus.yml" >/dev/null
promtool check rules docker/prometheus/rules.yml >/dev/null
python3 -c 'import json, sys; [json.load(open(p)) for p in sys.argv[1:]]' docker/grafana/dashboards/*.json
echo "prometheus: configuration and rules valid; grafana: dashboards parse"

# The queries against a running instance's /metrics, after a request of each route.
api_port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
admin_port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
REBATE__STORE__SQLITE__PATH="$scratch/catalogue.sqlite" REBATE__ADMIN__TOKEN_FILE="$scratch/admin-token" \
  "$service_bin" --listen "127.0.0.1:$api_port" --admin-listen "127.0.0.1:$admin_port" \
  >"$scratch/service.log" 2>&1 &
service_pid=$!
trap 'kill $service_pid 2>/dev/null; wait $service_pid 2>/dev/null; rm -rf "$scratch"' EXIT
for _ in $(seq 1 100); do
  curl -fsS "http://127.0.0.1:$admin_port/readyz" >/dev/null 2>&1 && break
  sleep 0.2
done
curl -fsS "http://127.0.0.1:$api_port/api/v1/items/taobao/100001/rebate" >/dev/null
curl -fsS "http://127.0.0.1:$api_port/api/v1/items:batch" -H 'content-type: application/json' \
  -d '{"items":[{"platform":"jd","item_id":"100002"}]}' >/dev/null
curl -fsS "http://127.0.0.1:$admin_port/metrics" >"$scratch/metrics.txt"
python3 scripts/check-metrics-queries.py "$scratch/metrics.txt" docker/grafana/dashboards/*.json \
  docker/prometheus/rules.yml

#!/usr/bin/env bash
# Static checks of the deployment files (no cluster, no Docker engine needed):
# - every Kubernetes manifest under deploy/k8s validates against the Kubernetes 1.30 schemas
#   (kubernetes-validate from PyPI, installed when missing), strictly (unknown fields fail);
# - the validator itself fails on a manifest broken on purpose (so a pass means something);
# - the ConfigMap's config.toml is a configuration the service starts with
#   (`rebate-query check-config`), and every REBATE__* variable the Deployment sets is a key.
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
DATABASE_URL=mysql://rebate:x@mysql:3306/rebate REDIS_URL=redis://redis:6379 \
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

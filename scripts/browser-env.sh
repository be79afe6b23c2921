# Sourced by the browser tests (scripts/dashboard-test.sh, scripts/demo-test.sh): what they need
# installed, and free loopback ports.

# Builds the service binary if it is missing; installs Debian's chromium and tests/browser's
# playwright-core (`npm ci`, when absent or not the version package.json pins).
ensure_browser_env() {
  local service_bin=$1 chromium_bin=$2
  if [[ ! -x $service_bin ]]; then
    log "building $service_bin"
    cargo build --locked --quiet -p query-api
  fi
  if [[ ! -x $chromium_bin ]]; then
    log "installing Debian's chromium"
    if ! DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; then
      apt-get update -qq
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
    fi
  fi
  if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
    echo "node (>= 20) and npm are needed for the browser tests" >&2
    exit 1
  fi
  if ! (cd tests/browser && node -e '
    const pinned = require("./package.json").dependencies["playwright-core"];
    const installed = require("./node_modules/playwright-core/package.json").version;
    process.exit(pinned === installed ? 0 : 1);' 2>/dev/null); then
    log "npm ci in tests/browser"
    (cd tests/browser && npm ci --no-audit --no-fund --loglevel=error)
  fi
}

# Prints N loopback ports nobody listens on (bound, then released), on one line.
free_ports() {
  python3 -c '
import socket, sys
sockets = [socket.socket() for _ in range(int(sys.argv[1]))]
for s in sockets:
    s.bind(("127.0.0.1", 0))
print(*(s.getsockname()[1] for s in sockets))' "$1"
}

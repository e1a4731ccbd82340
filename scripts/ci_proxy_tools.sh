#!/usr/bin/env bash
# CI: install Debian's nginx so the proxy test (tests/integration/test_proxy.py) runs the
# shipped deploy/k8s/proxy/bert-serve.conf instead of skipping, and Debian's prometheus (2.42,
# with promtool) for the alerting rules' tests and the real-Prometheus test
# (tests/unit/test_prometheus_rules.py, tests/integration/test_operating.py). Only the binaries
# are used: the tests start their own nginx and prometheus on free 127.0.0.1 ports, and the
# services the packages start are stopped again. Without root or apt-get the tests skip and say
# why (under CI=true the Prometheus ones fail instead).
set -euo pipefail
have() { command -v "$1" >/dev/null || [ -x "/usr/sbin/$1" ] || [ -x "/usr/bin/$1" ]; }
missing=()
have nginx || missing+=(nginx)
{ have prometheus && have promtool; } || missing+=(prometheus)
[ ${#missing[@]} = 0 ] && exit 0
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
    echo "no ${missing[*]} and no root apt-get to install them: their tests will skip"
    exit 0
fi
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
if command -v service >/dev/null; then
    for name in "${missing[@]}"; do service "$name" stop >/dev/null 2>&1 || true; done
fi

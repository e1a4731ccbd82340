#!/usr/bin/env bash
# CI: install Debian's nginx so the proxy test (tests/integration/test_proxy.py) runs the
# shipped deploy/k8s/proxy/bert-serve.conf instead of skipping. Only the binary is used: the
# test starts its own nginx on a free 127.0.0.1 port, and the service the package starts is
# stopped again. Without root or apt-get the test skips and says why.
set -euo pipefail
command -v nginx >/dev/null || [ -x /usr/sbin/nginx ] && exit 0
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
    echo "no nginx and no root apt-get to install it: the proxy test will skip"
    exit 0
fi
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends nginx >/dev/null
if command -v service >/dev/null; then service nginx stop >/dev/null 2>&1 || true; fi

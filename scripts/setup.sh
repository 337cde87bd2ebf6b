#!/bin/sh
# Idempotent set-up for a fresh Debian 12 machine (run as root):
# system packages (libnftables1: the library the nftables binding loads), then a plain venv on Debian's
# python3 (no system site packages: it is what `pip install pycni` gives a user), then pycni.
set -eu
cd "$(dirname "$0")/.."

APT_PACKAGES="iproute2 nftables libnftables1 python3-venv iptables containernetworking-plugins netavark procps podman containerd runc busybox-static firewalld iperf3 gcc libc6-dev"

# No package install may start a service on this machine (firewalld, containerd, ...): the
# tests run every daemon inside their own namespaces. invoke-rc.d asks policy-rc.d; 101 = refuse.
if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\n# pycni setup: no service starts on package install\nexit 101\n' >/usr/sbin/policy-rc.d
    chmod 0755 /usr/sbin/policy-rc.d
fi
missing=""
for p in $APT_PACKAGES; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
if [ -n "$missing" ]; then
    echo "setup: installing$missing" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends $missing >/dev/null
fi

# A venv that saw the system's site packages (this script's older ones did) is made afresh.
if [ ! -x .venv/bin/python ] || grep -q '^include-system-site-packages = true' .venv/pyvenv.cfg; then
    rm -rf .venv
    /usr/bin/python3 -m venv .venv
fi
stamp=.venv/.pycni-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
    .venv/bin/python -m pip install -q --disable-pip-version-check -e ".[test,fuzz,bench,lint]"
    touch "$stamp"
fi
.venv/bin/python -c 'import pyroute2, attrs, click, hypothesis, jeepney; from pycni._libnftables import Nftables; Nftables()'

#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0 OR MIT
# Install what building memlan needs beyond a C compiler: libtirpc's headers (libmemlan-rpc,
# the RPC runtime), the system rpcgen (the RPC tests compare memlan-rpcgen with it), pkg-config
# and man (tests/py/test_install.py builds against the installed memlan.pc and renders the man
# pages).  `make deps` and `make test` run it; plain `make` never does.
# Debian packages; idempotent; needs root or sudo when something is missing.
set -euo pipefail
source "$(dirname "$0")/apt.sh"
missing=()
[[ -f /usr/include/tirpc/rpc/rpc.h ]] || missing+=(libtirpc-dev)
command -v rpcgen >/dev/null 2>&1 || missing+=(rpcsvc-proto)
command -v pkg-config >/dev/null 2>&1 || missing+=(pkg-config)
command -v man >/dev/null 2>&1 || missing+=(man-db)
[[ ${#missing[@]} -eq 0 ]] && exit 0
echo "install-deps: installing ${missing[*]}"
apt_get update -qq
apt_get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null

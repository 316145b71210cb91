#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0 OR MIT
# Install the papers' systems that tests/py/test_seeds.py and bench/seeds run under memlan
# (Debian packages): nfs-ganesha with its VFS FSAL and rpcbind (the NFS server), libnfs and its
# utilities (the NFS client), omniORB with omniidl (CORBA), Open MPI and MPICH with their
# compilers.  Idempotent: installs only what is missing.  Needs root or sudo.
# `make test` (scripts/test.sh) and bench/seeds run it; `make deps-seeds` too.
set -euo pipefail
source "$(dirname "$0")/apt.sh"
want=(/usr/bin/ganesha.nfsd:nfs-ganesha
      /usr/lib/x86_64-linux-gnu/ganesha/libfsalvfs.so:nfs-ganesha-vfs
      rpcbind:rpcbind
      nfs-cp:libnfs-utils
      /usr/include/nfsc/libnfs.h:libnfs-dev
      omniidl:omniidl
      /usr/include/omniORB4/CORBA.h:libomniorb4-dev
      g++:g++
      mpicc.openmpi:libopenmpi-dev mpirun.openmpi:openmpi-bin
      /usr/include/x86_64-linux-gnu/mpich/mpi.h:libmpich-dev mpiexec.mpich:mpich
      unshare:util-linux ip:iproute2)
# The FSAL's directory is per architecture.
arch=$(dpkg-architecture -qDEB_HOST_MULTIARCH 2>/dev/null || echo x86_64-linux-gnu)
missing=()
for w in "${want[@]}"; do
    cmd=${w%%:*} pkg=${w#*:}
    cmd=${cmd//x86_64-linux-gnu/$arch}
    if [[ $cmd == /* ]]; then [[ -e $cmd ]] && continue
    else command -v "$cmd" >/dev/null 2>&1 && continue; fi
    missing+=("$pkg")
done
[[ ${#missing[@]} -eq 0 ]] && { echo "install-seeds: all present"; exit 0; }
echo "install-seeds: installing ${missing[*]}"
apt_get update -qq
# Services must not start themselves (ganesha, rpcbind): the tests start their own instances
# inside network namespaces of their own.
had_policy=0; [[ -e /usr/sbin/policy-rc.d ]] && had_policy=1
[[ $had_policy -eq 0 ]] && printf '#!/bin/sh\nexit 101\n' | $SUDO tee /usr/sbin/policy-rc.d >/dev/null
[[ $had_policy -eq 0 ]] && $SUDO chmod +x /usr/sbin/policy-rc.d
rc=0
apt_get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null || rc=$?
[[ $had_policy -eq 0 ]] && $SUDO rm -f /usr/sbin/policy-rc.d
[[ $rc -eq 0 ]] || { echo "install-seeds: apt-get install failed ($rc)" >&2; exit $rc; }
echo "install-seeds: done"

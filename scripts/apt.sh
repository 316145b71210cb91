# SPDX-License-Identifier: Apache-2.0 OR MIT
# Sourced by the install scripts: apt-get that waits for another apt (unattended-upgrades after
# boot, a second install running) rather than fail.  apt-get waits for dpkg's lock itself when
# told (DPkg::Lock::Timeout), but not for the package lists' lock (update) nor the archives'
# (a download): a call refused for a lock is tried again, every 5 s, up to 10 minutes.  Any
# other failure is the caller's at once, with apt-get's own exit status and message.
SUDO=; [[ $(id -u) -ne 0 ]] && SUDO=sudo
export DEBIAN_FRONTEND=noninteractive

apt_get() {
    local i rc errf
    errf=$(mktemp)
    for ((i = 0; i < 120; i++)); do
        rc=0
        $SUDO apt-get -o DPkg::Lock::Timeout=600 "$@" 2>"$errf" || rc=$?
        if [[ $rc -eq 0 ]] || ! grep -q "Could not get lock" "$errf"; then
            cat "$errf" >&2
            rm -f "$errf"
            return $rc
        fi
        ((i % 12 == 0)) && echo "apt: another apt holds a lock ($1); waiting" >&2
        sleep 5
    done
    cat "$errf" >&2
    rm -f "$errf"
    return $rc
}

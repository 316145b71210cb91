# SPDX-License-Identifier: Apache-2.0 OR MIT
# Sourced by the install scripts: apt-get that waits for another apt (unattended-upgrades after
# boot, a second install running) rather than fail.  apt-get waits for dpkg's lock itself when
# told (DPkg::Lock::Timeout), but update does not wait for the lists' lock: it is tried again
# while that lock is the reason, up to 10 minutes.  Any other failure is the caller's at once.
SUDO=; [[ $(id -u) -ne 0 ]] && SUDO=sudo
export DEBIAN_FRONTEND=noninteractive

apt_get() {
    if [[ $1 != update ]]; then
        $SUDO apt-get -o DPkg::Lock::Timeout=600 "$@"
        return
    fi
    local i err
    for ((i = 0; i < 120; i++)); do
        if err=$($SUDO apt-get "$@" 2>&1 >/dev/null); then
            return 0
        fi
        if [[ $err != *"Could not get lock"* ]]; then
            printf '%s\n' "$err" >&2
            return 1
        fi
        ((i % 12 == 0)) && echo "apt: another apt holds the package lists' lock; waiting" >&2
        sleep 5
    done
    printf '%s\n' "$err" >&2
    return 1
}

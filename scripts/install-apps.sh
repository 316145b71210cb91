#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0 OR MIT
# Install the real programs that the integration suite and bench/apps run under memlan
# (Debian packages). Idempotent: installs only what is missing. Needs root or sudo.
set -euo pipefail
source "$(dirname "$0")/apt.sh"
# gRPC as most of its users get it, for the python that runs the tests: PyPI's grpcio, whose
# EventEngine poller thread sleeps in epoll_wait while other threads add sockets (Debian's older
# python3-grpcio polls from the application's threads).
if ! python3 -c 'import grpc' 2>/dev/null; then
    echo "install-apps: installing grpcio for $(command -v python3)"
    PIP_ROOT_USER_ACTION=ignore python3 -m pip install --quiet grpcio || echo "install-apps: pip could not install grpcio"
fi
# uvloop as PyPI ships it, for the same python: it bundles libuv 1.45 or later, which adds
# sockets to its epoll set through an io_uring (test_apps.py::test_python_asyncio_and_uvloop).
if ! python3 -c 'import uvloop' 2>/dev/null; then
    echo "install-apps: installing uvloop for $(command -v python3)"
    PIP_ROOT_USER_ACTION=ignore python3 -m pip install --quiet uvloop || echo "install-apps: pip could not install uvloop"
fi
want=(redis-server:redis-server memcached:memcached nginx:nginx-light wrk:wrk
      iperf3:iperf3 sockperf:sockperf pgbench:postgresql-client
      /usr/lib/postgresql/15/bin/postgres:postgresql memcslap:libmemcached-tools curl:curl
      rpcbind:rpcbind git:git rsync:rsync /usr/sbin/sshd:openssh-server ssh:openssh-client
      ip:iproute2 nft:nftables mpiexec.mpich:mpich strace:strace
      /usr/include/x86_64-linux-gnu/mpich/mpi.h:libmpich-dev
      /usr/sbin/lighttpd:lighttpd /usr/sbin/mosquitto:mosquitto mosquitto_sub:mosquitto-clients
      /usr/sbin/haproxy:haproxy /usr/sbin/varnishd:varnish
      /usr/lib/python3/dist-packages/zmq/__init__.py:python3-zmq
      /usr/lib/python3/dist-packages/grpc/__init__.py:python3-grpcio
      mariadbd:mariadb-server mariadb-slap:mariadb-client node:nodejs
      /usr/sbin/pgbouncer:pgbouncer javac:default-jdk-headless
      /usr/sbin/php-fpm8.2:php8.2-fpm /usr/bin/tinyproxy:tinyproxy /usr/sbin/apache2:apache2
      /usr/sbin/dovecot:dovecot-core /usr/lib/dovecot/imap:dovecot-imapd
      /usr/lib/dovecot/pop3:dovecot-pop3d socat:socat stunnel4:stunnel4 openssl:openssl
      exim4:exim4-daemon-light /usr/sbin/xinetd:xinetd /bin/nc.openbsd:netcat-openbsd
      ncat:ncat /usr/sbin/unbound:unbound /usr/sbin/slapd:slapd
      ldapsearch:ldap-utils beanstalkd:beanstalkd erlc:erlang-base
      /usr/sbin/rsyslogd:rsyslog logger:bsdutils /usr/sbin/named:bind9 dig:bind9-dnsutils
      /usr/sbin/ngircd:ngircd /usr/sbin/squid:squid /usr/sbin/privoxy:privoxy
      /usr/bin/h2o:h2o h2load:nghttp2-client /usr/sbin/nghttpx:nghttp2-proxy
      gunicorn:gunicorn /usr/lib/python3/dist-packages/gevent/__init__.py:python3-gevent
      uwsgi:uwsgi-core /usr/lib/uwsgi/plugins/python3_plugin.so:uwsgi-plugin-python3
      /usr/share/tomcat10/bin/catalina.sh:tomcat10 puma:puma rackup:ruby-rack
      valgrind:valgrind gdb:gdb gdbserver:gdbserver)
# proftpd-basic conflicts with an installed vsftpd package (both are an ftp-server): apt would
# remove vsftpd; test_apps_files.py then runs that one and skips proftpd's test.
[[ -x /usr/sbin/vsftpd ]] || want+=(/usr/sbin/proftpd:proftpd-basic)
# postfix as Debian ships it, for test_apps_daemons.py: its package conflicts with
# exim4-daemon-light (both are the mail-transport-agent), which test_apps_mail.py needs, so where
# it is not installed its package is unpacked, unchanged, under /opt/memlan-apps/postfix (the tests
# name its directories in their main.cf), with the user and groups its postinst would make.
if [[ ! -x /usr/sbin/postfix && ! -x /opt/memlan-apps/postfix/usr/sbin/postfix ]]; then
    echo "install-apps: unpacking postfix under /opt/memlan-apps/postfix"
    tmp=$(mktemp -d)
    chmod 755 "$tmp"
    if (cd "$tmp" && { apt-get download postfix >/dev/null 2>&1 ||
                       { apt_get update -qq && apt-get download postfix >/dev/null; }; }); then
        $SUDO mkdir -p /opt/memlan-apps
        $SUDO dpkg -x "$tmp"/postfix_*.deb /opt/memlan-apps/postfix
        getent group postfix >/dev/null || $SUDO groupadd --system postfix
        getent group postdrop >/dev/null || $SUDO groupadd --system postdrop
        getent passwd postfix >/dev/null || $SUDO useradd --system -g postfix -d /var/spool/postfix \
            -s /usr/sbin/nologin postfix
    else
        echo "install-apps: could not download postfix"
    fi
    rm -rf "$tmp"
fi
# vsftpd as Debian ships it, for test_apps_files.py: its package conflicts with proftpd-basic
# (both are an ftp-server), which the same tests run, so where it is not installed its package is
# unpacked, unchanged, under /opt/memlan-apps/vsftpd, with the ftp user its postinst would make
# and its PAM service (/etc/pam.d/vsftpd, its pam_service_name) where there is none.
if [[ ! -x /usr/sbin/vsftpd && ! -x /opt/memlan-apps/vsftpd/usr/sbin/vsftpd ]]; then
    echo "install-apps: unpacking vsftpd under /opt/memlan-apps/vsftpd"
    tmp=$(mktemp -d)
    chmod 755 "$tmp"
    if (cd "$tmp" && { apt-get download vsftpd >/dev/null 2>&1 ||
                       { apt_get update -qq && apt-get download vsftpd >/dev/null; }; }); then
        $SUDO mkdir -p /opt/memlan-apps
        $SUDO dpkg -x "$tmp"/vsftpd_*.deb /opt/memlan-apps/vsftpd
        [[ -e /etc/pam.d/vsftpd ]] || $SUDO cp /opt/memlan-apps/vsftpd/etc/pam.d/vsftpd /etc/pam.d/vsftpd
        getent passwd ftp >/dev/null || $SUDO adduser --system --home /srv/ftp --no-create-home \
            --quiet --gecos 'ftp daemon' --group ftp
    else
        echo "install-apps: could not download vsftpd"
    fi
    rm -rf "$tmp"
fi
# syslog-ng as Debian ships it, for test_apps_logs.py: syslog-ng-core conflicts with rsyslog (both
# are the system-log-daemon), so where it is not installed its package is unpacked, unchanged,
# under /opt/memlan-apps/syslog-ng (the test runs its binary with LD_LIBRARY_PATH and
# --module-path there), with the libraries it needs beside it installed.
if [[ ! -x /usr/sbin/syslog-ng && ! -x /opt/memlan-apps/syslog-ng/usr/sbin/syslog-ng ]]; then
    echo "install-apps: unpacking syslog-ng-core under /opt/memlan-apps/syslog-ng"
    tmp=$(mktemp -d)
    chmod 755 "$tmp"
    if (cd "$tmp" && { apt-get download syslog-ng-core >/dev/null 2>&1 ||
                       { apt_get update -qq && apt-get download syslog-ng-core >/dev/null; }; }); then
        $SUDO mkdir -p /opt/memlan-apps
        $SUDO dpkg -x "$tmp"/syslog-ng-core_*.deb /opt/memlan-apps/syslog-ng
        apt_get install -y -qq --no-install-recommends \
            libivykis0 libnet1 libwrap0 >/dev/null || echo "install-apps: syslog-ng's libraries missing"
    else
        echo "install-apps: could not download syslog-ng-core"
    fi
    rm -rf "$tmp"
fi
# The MPICH header's directory is per architecture (mpicc.mpich comes with the runtime package,
# mpi.h only with libmpich-dev: checking the compiler left test_seeds without the header).
arch=$(dpkg-architecture -qDEB_HOST_MULTIARCH 2>/dev/null || echo x86_64-linux-gnu)
missing=()
for w in "${want[@]}"; do
    cmd=${w%%:*} pkg=${w#*:}
    cmd=${cmd//x86_64-linux-gnu/$arch}
    if [[ $cmd == /* ]]; then [[ -e $cmd ]] && continue
    else command -v "$cmd" >/dev/null 2>&1 && continue; fi
    missing+=("$pkg")
done
# Erlang's crypto application (test_apps_daemons.py's gen_tcp checks the bytes with
# crypto:hash): a package of its own, which erlang-base does not pull in.
compgen -G "/usr/lib/erlang/lib/crypto-*/ebin/crypto.beam" >/dev/null || missing+=(erlang-crypto)
[[ ${#missing[@]} -eq 0 ]] && { echo "install-apps: all present"; exit 0; }
echo "install-apps: installing ${missing[*]}"
apt_get update -qq
# Services must not start themselves: the tests start their own instances on private ports.
had_policy=0; [[ -e /usr/sbin/policy-rc.d ]] && had_policy=1
[[ $had_policy -eq 0 ]] && printf '#!/bin/sh\nexit 101\n' | $SUDO tee /usr/sbin/policy-rc.d >/dev/null
[[ $had_policy -eq 0 ]] && $SUDO chmod +x /usr/sbin/policy-rc.d
apt_get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
[[ $had_policy -eq 0 ]] && $SUDO rm -f /usr/sbin/policy-rc.d
echo "install-apps: done"

# SPDX-License-Identifier: Apache-2.0 OR MIT
"""php-fpm behind nginx over FastCGI on TCP, as Debian ships them (php8.2-fpm's pool www.conf with
`listen = 127.0.0.1:PORT` instead of its Unix socket; scripts/install-apps.sh installs it): both
masters as root, their workers as www-data (a member of the test's group fabric, as in
test_apps.py's lighttpd test), pm dynamic with workers recycled every 20 requests.  A large POST
echoed back by PHP, a streamed response, and requests on nginx's FastCGI keep-alive connections:
every byte checked, every FastCGI connection accelerated at both ends, clean exits on SIGTERM.
"""
import hashlib
import os
import subprocess

import pytest

from conftest import logfile
from test_apps import (CRED_CHANGED, accelerated, alive_for, kill_quietly, member_run, need,
                       next_port, owned_dir, sigterm_exit, tcp_reasons, wait_port, wrap)

FPM = "/usr/sbin/php-fpm8.2"

FPM_CONF = """[global]
pid = {d}/run/php-fpm.pid
error_log = {d}/log/php-fpm.log
daemonize = no
[www]
user = www-data
group = www-data
listen = 127.0.0.1:{fpm}
pm = dynamic
pm.max_children = 5
pm.start_servers = 2
pm.min_spare_servers = 1
pm.max_spare_servers = 3
pm.max_requests = 20
"""

NGINX_CONF = """user www-data;
daemon off;
master_process on;
worker_processes 2;
pid {d}/run/nginx.pid;
error_log {d}/log/nginx-error.log;
events {{ worker_connections 512; }}
http {{
    access_log off;
    client_body_temp_path {d}/tmp/cb; proxy_temp_path {d}/tmp/px; fastcgi_temp_path {d}/tmp/fc;
    uwsgi_temp_path {d}/tmp/uw; scgi_temp_path {d}/tmp/sc;
    client_max_body_size 64m;
    upstream fpm {{ server 127.0.0.1:{fpm}; keepalive 4; }}
    server {{
        listen 127.0.0.1:{port};
        root {d}/www;
        location ~ ^/ka/(?<script>.*\\.php)$ {{
            include /etc/nginx/fastcgi_params;
            fastcgi_param SCRIPT_FILENAME $document_root/$script;
            fastcgi_keep_conn on;
            fastcgi_pass fpm;
        }}
        location ~ \\.php$ {{
            include /etc/nginx/fastcgi_params;
            fastcgi_param SCRIPT_FILENAME $document_root$fastcgi_script_name;
            fastcgi_pass 127.0.0.1:{fpm};
        }}
    }}
}}
"""

ECHO_PHP = """<?php
$in = file_get_contents('php://input');
header('X-Sha: ' . hash('sha256', $in));
echo $in;
"""

# n MiB in 64 KiB pieces, each flushed to nginx as it is made.
STREAM_PHP = """<?php
$chunk = str_repeat(hash('sha256', 'x'), 1024);
for ($i = 0; $i < intval($_GET['n']) * 16; $i++) { echo $chunk; flush(); }
"""


def test_php_fpm_behind_nginx_as_debian_ships_it(gfabric, group, pubdir):
    if os.geteuid() != 0:
        pytest.skip("php-fpm and nginx drop from root to www-data: needs root")
    need(FPM, "nginx", "curl", "/etc/nginx/fastcgi_params")
    fab, gid = gfabric
    # www-data joins the group: initgroups at each master's drop gives the workers the fabric.
    subprocess.run(["gpasswd", "-a", "www-data", group[0]], check=True, capture_output=True)
    www = pubdir / "www"
    www.mkdir()
    (www / "echo.php").write_text(ECHO_PHP)
    (www / "stream.php").write_text(STREAM_PHP)
    for d in ("run", "log"):
        (pubdir / d).mkdir()
    owned_dir(pubdir / "tmp", "www-data")
    got = owned_dir(pubdir / "got", "daemon")
    body = os.urandom(8 << 20)
    (pubdir / "body.bin").write_bytes(body)
    for p in (www, *www.iterdir(), pubdir / "body.bin"):
        os.chmod(p, 0o755 if p.is_dir() else 0o644)
    port, fport = next_port(), next_port()
    (pubdir / "fpm.conf").write_text(FPM_CONF.format(d=pubdir, fpm=fport))
    (pubdir / "nginx.conf").write_text(NGINX_CONF.format(d=pubdir, fpm=fport, port=port))
    flog, nlog, clog = (logfile(pubdir, n) for n in ("fpm.log", "nginx.log", "client.log"))
    fpm = nginx = None
    try:
        fpm = subprocess.Popen(wrap([FPM, "-F", "-y", str(pubdir / "fpm.conf"),
                                     "-d", "post_max_size=64M", "-d", "memory_limit=256M"], flog),
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        wait_port(fport, fpm)
        nginx = subprocess.Popen(wrap(["nginx", "-c", str(pubdir / "nginx.conf"), "-p",
                                       str(pubdir)], nlog),
                                 stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        wait_port(port, nginx)
        url = f"http://127.0.0.1:{port}"
        want = hashlib.sha256(body).hexdigest()
        for path in ("echo.php", "ka/echo.php"):
            out = got / path.replace("/", "-")
            hdr = member_run(gid, ["curl", "-sf", "-D", "-", "-o", str(out), "--data-binary",
                                   f"@{pubdir / 'body.bin'}", "-H",
                                   "Content-Type: application/octet-stream", f"{url}/{path}"],
                             clog)
            assert f"x-sha: {want}" in hdr.lower(), (path, hdr)
            assert hashlib.sha256(out.read_bytes()).hexdigest() == want, path
        piece = hashlib.sha256(b"x").hexdigest().encode() * 1024
        for path in ("stream.php", "ka/stream.php"):
            out = got / path.replace("/", "-")
            member_run(gid, ["curl", "-sf", "-o", str(out), f"{url}/{path}?n=20"], clog)
            assert out.read_bytes() == piece * 320, path
        # 45 small requests on one client connection, on nginx's FastCGI keep-alive connections:
        # the workers are recycled (pm.max_requests) under them, and those connections end.
        args = []
        for i in range(45):
            args += ["-o", str(got / f"small-{i}"), f"{url}/ka/stream.php?n=0"]
        member_run(gid, ["curl", "-sf"] + args, clog)
        assert all((got / f"small-{i}").read_bytes() == b"" for i in range(45))
        # Every FastCGI connection accelerated at both ends; none fell back to TCP.
        f, n = flog.read_text(), nlog.read_text()
        assert tcp_reasons(flog) == [] and tcp_reasons(nlog) == [], (f[-3000:], n[-3000:])
        assert CRED_CHANGED not in f + n and "out of reach" not in f + n, (f[-3000:], n[-3000:])
        to_fpm = n.count("accelerated (client)")
        assert to_fpm >= 4 and f.count("accelerated (accepted") == to_fpm, (f[-3000:], n[-3000:])
        assert accelerated(clog) == 5 and n.count("accelerated (accepted") == 5
        assert alive_for(fpm, 0.5) and alive_for(nginx, 0.5)
        assert sigterm_exit(nginx) == 0
        assert sigterm_exit(fpm) == 0
        flines = (pubdir / "log" / "php-fpm.log").read_text()
        assert "SIGSEGV" not in flines and "SIGBUS" not in flines, flines[-3000:]
        assert "[error]" not in (pubdir / "log" / "nginx-error.log").read_text()
    finally:
        kill_quietly(nginx)
        kill_quietly(fpm)

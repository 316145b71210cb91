#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0 OR MIT
"""Echo server: serve a name on the fabric and echo what each client sends, one client at a
time.  Usage: echo_server.py [NAME] [CLIENTS]  (exits after CLIENTS clients; 0 = forever)."""
import sys

import memlan


def main() -> int:
    name = sys.argv[1] if len(sys.argv) > 1 else "echo"
    clients = int(sys.argv[2]) if len(sys.argv) > 2 else 0
    with memlan.Fabric() as fab, fab.listen(name) as srv:
        print(f"echo_server: serving {name!r}", flush=True)
        served = 0
        while clients == 0 or served < clients:
            with srv.accept(timeout=30.0) as ch:
                while True:
                    data = ch.recv(65536)
                    if not data:
                        break
                    ch.send(data)
            served += 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

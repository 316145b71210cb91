#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0 OR MIT
"""Echo client: connect to a server by name, send lines, check they come back.
Usage: echo_client.py [NAME] [COUNT]"""
import sys
import time

import memlan


def main() -> int:
    name = sys.argv[1] if len(sys.argv) > 1 else "echo"
    count = int(sys.argv[2]) if len(sys.argv) > 2 else 1000
    with memlan.Fabric() as fab, fab.connect(name, timeout=10.0) as ch:
        t0 = time.perf_counter()
        for i in range(count):
            msg = f"hello {i}\n".encode()
            ch.send(msg)
            back = b""
            while len(back) < len(msg):
                back += ch.recv(len(msg) - len(back))
            if back != msg:
                print(f"echo_client: sent {msg!r}, got {back!r}", file=sys.stderr)
                return 1
        us = (time.perf_counter() - t0) / count * 1e6
    print(f"echo_client: {count} round trips by name {name!r}, {us:.1f} us each")
    return 0


if __name__ == "__main__":
    sys.exit(main())

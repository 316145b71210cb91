#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0 OR MIT
"""Zero-copy producer and consumer: the producer builds each record in the ring through a
memoryview loan (reserve/commit), the consumer reads it where it lies (peek/release).  The two
find each other by name.  Usage: zerocopy.py [COUNT]  (forks the producer)."""
import os
import struct
import sys

import memlan

RECORD = struct.Struct("<Qd8s")  # id, price, symbol: 24 bytes, 8-byte aligned in the ring


def producer(name: str, count: int) -> int:
    with memlan.Fabric() as fab, fab.connect(name, kind=memlan.MSG, ring_size=65536) as ch:
        for i in range(count):
            with ch.reserve(RECORD.size) as loan:
                RECORD.pack_into(loan.view, 0, i, 100.0 + i % 50, b"MEML")
    return 0


def main() -> int:
    count = int(sys.argv[1]) if len(sys.argv) > 1 else 100000
    name = f"zerocopy-{os.getpid()}"
    with memlan.Fabric() as fab, fab.listen(name, kind=memlan.MSG) as srv:
        pid = os.fork()
        if pid == 0:
            os._exit(producer(name, count))
        seen, total = 0, 0.0
        with srv.accept(timeout=10.0) as ch:
            while True:
                loan = ch.peek()
                if loan is None:
                    break
                with loan:
                    if loan.address % 8:
                        print("zerocopy: a payload not 8-byte aligned", file=sys.stderr)
                        return 1
                    rid, price, sym = RECORD.unpack_from(loan.view)
                    if rid != seen or sym.rstrip(b"\0") != b"MEML":
                        print(f"zerocopy: bad record {seen}", file=sys.stderr)
                        return 1
                    total += price
                    seen += 1
        _, st = os.waitpid(pid, 0)
    print(f"zerocopy: {seen} records read in place, total price {total:.0f}")
    return 0 if seen == count and os.WIFEXITED(st) and os.WEXITSTATUS(st) == 0 else 1


if __name__ == "__main__":
    sys.exit(main())

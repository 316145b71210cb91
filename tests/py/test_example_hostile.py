# SPDX-License-Identifier: Apache-2.0 OR MIT
"""Examples against a hostile peer's writes (found by the chaos suite, tests/chaos/): an example
whose connection is spoiled must end, with an error, and never wait for ever."""
import os
import signal
import struct
import subprocess
import time

from conftest import BUILD, memlan

ML_KIND_CHANNEL = 2


def channel_files(fab):
    out = []
    for n in os.listdir(fab):
        try:
            with open(os.path.join(fab, n), "rb") as f:
                h = f.read(40)
        except OSError:
            continue
        if len(h) == 40 and struct.unpack_from("<I", h, 24)[0] == ML_KIND_CHANNEL:
            out.append(os.path.join(fab, n))
    return out


def test_zerocopy_ends_when_its_ring_is_spoiled(fabric):
    """The vandal garbles the records of zerocopy's ring (producer -> consumer) while they flow:
    the consumer's memlan_peek fails and it stops reading.  It used to wait for its producer
    then, which was blocked for ever on the full ring that nobody read (a hang the chaos suite
    saw about once in ten runs); it now closes the channel first, and both end."""
    p = subprocess.Popen([str(BUILD / "examples" / "zerocopy")], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, start_new_session=True)
    spoiled = 0
    try:
        deadline = time.time() + 5
        while p.poll() is None and time.time() < deadline and spoiled < 2000:
            for path in channel_files(fabric):
                try:
                    fd = os.open(path, os.O_RDWR)
                except OSError:
                    continue
                try:
                    hdr = os.pread(fd, 128, 0)
                    body = struct.unpack_from("<Q", hdr, 32)[0]
                    ch = os.pread(fd, 40, body)
                    ring_size = struct.unpack_from("<I", ch, 4)[0]
                    data1 = struct.unpack_from("<Q", ch, 32)[0]  # ring 1: attacher -> creator
                    if 0 < ring_size <= 1 << 20:
                        os.pwrite(fd, b"\xff" * ring_size, data1)
                        spoiled += 1
                except (OSError, struct.error):
                    pass
                finally:
                    os.close(fd)
        try:
            _, err = p.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)  # the example and its producer
            p.communicate()
            raise AssertionError(f"zerocopy hung after {spoiled} writes into its ring")
    finally:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except OSError:
            pass
        p.wait()
        memlan("clean")
    assert spoiled, "the ring was never found"
    assert p.returncode in (0, 1), (p.returncode, err)

# SPDX-License-Identifier: Apache-2.0 OR MIT
"""What apps_zmq.py and apps_grpc.py share: the test data, the answer to it, and a run of
threads whose failures are the caller's."""
import hashlib
import threading


def val(i):
    return hashlib.sha256(b"%d" % i).digest() * (1 + (i * 7) % 400)  # 32 B .. 12.8 KB


def answer(m):
    return hashlib.sha256(m).digest() + m[::-1]


def in_threads(fn, k, timeout=60):
    """fn(t) in k threads at once; an exception (SystemExit too) or a thread still running after
    timeout seconds fails the caller."""
    bad = []

    def one(t):
        try:
            fn(t)
        except BaseException as e:
            bad.append(repr(e))

    th = [threading.Thread(target=one, args=(t,)) for t in range(k)]
    for t in th:
        t.start()
    for t in th:
        t.join(timeout)
    assert not bad and not any(t.is_alive() for t in th), bad

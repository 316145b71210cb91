# SPDX-License-Identifier: Apache-2.0 OR MIT
"""A gRPC server and client through Debian's python3-grpcio (test_apps_mt.py runs each under
`memlan run`).  Run with Debian's /usr/bin/python3, for which the package is built.  The service
is declared with the generic handler API and bytes in and out, so that no stub is generated.

    apps_grpc.py server PORT      serve until a client calls Quit (120 s at most)
    apps_grpc.py client PORT N    connect (10 s at most), N unary calls one by one, N in flight
                                  at once, a server stream of 5N messages, a client stream of N,
                                  N/3 calls from each of 4 threads on channels of their own,
                                  then Quit; every answer checked
"""
import hashlib
import sys
import threading
import time
from concurrent import futures

import grpc

from apps_common import answer, in_threads, val


THREADS = 4  # the client's callers on connections of their own


def same(b):
    return b


def server(port):
    stop = threading.Event()

    def stream(req, ctx):
        for i in range(int(req)):
            yield b"%d:" % i + val(i)

    def collect(it, ctx):
        h = hashlib.sha256()
        for m in it:
            h.update(m)
        return h.digest()

    def quit(req, ctx):
        stop.set()
        return b"bye"

    handler = grpc.method_handlers_generic_handler("t.T", {
        "Echo": grpc.unary_unary_rpc_method_handler(lambda req, ctx: answer(req), same, same),
        "Stream": grpc.unary_stream_rpc_method_handler(stream, same, same),
        "Collect": grpc.stream_unary_rpc_method_handler(collect, same, same),
        "Quit": grpc.unary_unary_rpc_method_handler(quit, same, same)})
    srv = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
    srv.add_generic_rpc_handlers((handler,))
    assert srv.add_insecure_port("127.0.0.1:%d" % port) == port
    srv.start()
    print("listening, grpcio", grpc.__version__, flush=True)
    if not stop.wait(120):
        sys.exit("server: never told to quit")
    assert srv.stop(5).wait(10), "server: did not stop in 10 s"
    print("stopped", flush=True)


def client(port, n):
    ch = grpc.insecure_channel("127.0.0.1:%d" % port)
    t0 = time.time()
    grpc.channel_ready_future(ch).result(timeout=10)  # issue 18: grpcio never connected
    print("connected in %.2f s" % (time.time() - t0), flush=True)

    def method(kind, name):
        return getattr(ch, kind)("/t.T/" + name, request_serializer=same, response_deserializer=same)

    echo = method("unary_unary", "Echo")
    for i in range(n):
        assert echo(val(i), timeout=10) == answer(val(i)), i
    fs = [echo.future(val(i), timeout=30) for i in range(n)]  # all in flight at once
    for i, f in enumerate(fs):
        assert f.result() == answer(val(i)), i
    k, got = 5 * n, 0
    for i, m in enumerate(method("unary_stream", "Stream")(b"%d" % k, timeout=30)):
        assert m == b"%d:" % i + val(i), i
        got += 1
    assert got == k, (got, k)
    want = hashlib.sha256(b"".join(val(i) for i in range(n))).digest()
    assert method("stream_unary", "Collect")((val(i) for i in range(n)), timeout=30) == want
    # T threads, each on a channel (a connection) of its own, calling at once.
    def caller(t):
        # A subchannel pool of its own: not the connection of the channel above.
        c = grpc.insecure_channel("127.0.0.1:%d" % port,
                                  options=[("grpc.use_local_subchannel_pool", 1)])
        e = c.unary_unary("/t.T/Echo", request_serializer=same, response_deserializer=same)
        for i in range(n // 3):
            v = val(t * n + i)
            assert e(v, timeout=20) == answer(v), (t, i)
        c.close()

    in_threads(caller, THREADS)
    assert method("unary_unary", "Quit")(b"", timeout=10) == b"bye"
    ch.close()
    print("ok", n, k, flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "server":
        server(int(sys.argv[2]))
    else:
        client(int(sys.argv[2]), int(sys.argv[3]))

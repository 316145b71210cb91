# SPDX-License-Identifier: Apache-2.0 OR MIT
"""Clients for test_apps_db.py, run under memlan (or not) as programs of their own.

  apps_db.py sentinel-writer S1,S2,S3 SECONDS OUT
      asks the sentinels for mymaster's address, writes w:<i> = val(i) with SET, then WAIT 1 500,
      and on any error asks again and reconnects (the fail-over); one line per acknowledged write
      ("i replicas port") in OUT, and at the end "ok WRITES FAILOVERS"
  apps_db.py bs-producer PORT N TUBE
      puts N jobs (bodies val(i)) into TUBE of beanstalkd, prints "ok N"
  apps_db.py bs-consumer PORT TUBE OUT
      reserves with a timeout, deletes, one line per job (its sha256) in OUT, until a reserve
      times out twice in a row; prints "ok COUNT"
  apps_db.py mp-server PORT N KEY / mp-client PORT N KEY
      multiprocessing.connection Listener/Client over TCP with an authkey: N objects each way;
      the server serves two clients, saying "refused: ..." for each with a wrong key
"""
import hashlib
import socket
import sys
import time


def val(i):
    return hashlib.sha256(b"%d" % i).hexdigest().encode() * (1 + (i * 7) % 300)


# ---- RESP --------------------------------------------------------------------------------------

class Resp:
    def __init__(self, port, timeout=5.0):
        self.s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.f = self.s.makefile("rb")

    def call(self, *args):
        out = b"*%d\r\n" % len(args)
        for a in args:
            a = a if isinstance(a, bytes) else str(a).encode()
            out += b"$%d\r\n%s\r\n" % (len(a), a)
        self.s.sendall(out)
        return self.read()

    def read(self):
        line = self.f.readline()
        if not line:
            raise ConnectionError("closed")
        t, rest = line[:1], line[1:-2]
        if t == b"+":
            return rest.decode()
        if t == b"-":
            raise RuntimeError(rest.decode())
        if t == b":":
            return int(rest)
        if t == b"$":
            n = int(rest)
            if n < 0:
                return None
            d = self.f.read(n + 2)
            return d[:-2]
        if t == b"*":
            n = int(rest)
            return None if n < 0 else [self.read() for _ in range(n)]
        raise ValueError(line)

    def close(self):
        self.s.close()


def master_of(sentinels):
    for p in sentinels:
        try:
            c = Resp(p, timeout=2.0)
            try:
                a = c.call("SENTINEL", "get-master-addr-by-name", "mymaster")
            finally:
                c.close()
            if a:
                return int(a[1])
        except (OSError, ConnectionError, RuntimeError):
            continue
    return None


def sentinel_writer(sentinels, seconds, out):
    end = time.time() + seconds
    i, failovers, c, port, errors = 0, 0, None, None, []
    with open(out, "w") as f:
        while time.time() < end:
            try:
                if c is None:
                    p = master_of(sentinels)
                    if p is None:
                        time.sleep(0.1)
                        continue
                    if port is not None and p != port:
                        failovers += 1
                    port = p
                    c = Resp(port, timeout=3.0)
                    if c.call("ROLE")[0] != b"master":
                        raise ConnectionError("not a master yet")
                c.call("SET", f"w:{i}", val(i))
                n = c.call("WAIT", 1, 500)
                f.write(f"{i} {n} {port}\n")
                f.flush()
                i += 1
            except (OSError, ConnectionError, RuntimeError) as e:
                errors.append(type(e).__name__)
                if c:
                    c.close()
                c = None
                time.sleep(0.1)
        if c:
            c.close()
    print("ok", i, failovers, " ".join(sorted(set(errors))))


# ---- beanstalkd --------------------------------------------------------------------------------

class Beanstalk:
    def __init__(self, port):
        self.s = socket.create_connection(("127.0.0.1", port), timeout=30)
        self.f = self.s.makefile("rb")

    def cmd(self, line, body=None):
        data = line.encode() + b"\r\n"
        if body is not None:
            data += body + b"\r\n"
        self.s.sendall(data)
        return self.f.readline().rstrip(b"\r\n").decode()

    def body(self, n):
        d = self.f.read(n + 2)
        assert d.endswith(b"\r\n"), d[-10:]
        return d[:-2]


def bs_producer(port, n, tube):
    b = Beanstalk(port)
    assert b.cmd(f"use {tube}") == f"USING {tube}"
    for i in range(n):
        body = b"%d:" % i + val(i)
        r = b.cmd(f"put {i % 5} 0 60 {len(body)}", body)
        assert r.startswith("INSERTED "), r
    print("ok", n)


def bs_consumer(port, tube, out):
    b = Beanstalk(port)
    assert b.cmd(f"watch {tube}").startswith("WATCHING")
    assert b.cmd("ignore default").startswith("WATCHING")
    got, empty = 0, 0
    with open(out, "w") as f:
        while empty < 2:
            r = b.cmd("reserve-with-timeout 1")
            if r == "TIMED_OUT":
                empty += 1
                continue
            empty = 0
            _, jid, size = r.split()
            body = b.body(int(size))
            i, v = body.split(b":", 1)
            assert v == val(int(i)), (i, len(v))
            f.write(f"{int(i)}\n")
            assert b.cmd(f"delete {jid}") == "DELETED"
            got += 1
    print("ok", got)


# ---- multiprocessing.connection -----------------------------------------------------------------

def mp_server(port, n, key):
    from multiprocessing import AuthenticationError
    from multiprocessing.connection import Listener
    with Listener(("127.0.0.1", port), authkey=key) as l:
        print("listening", flush=True)
        served = 0
        while served < 2:  # two clients, one after the other
            try:
                c = l.accept()
            except AuthenticationError as e:
                print("refused:", e, flush=True)
                continue
            served += 1
            with c:
                for i in range(n):
                    m = c.recv()
                    assert m == {"i": i, "v": val(i)}, i
                    c.send((i, hashlib.sha256(m["v"]).hexdigest()))
                c.send_bytes(b"x" * 3000000)
                assert c.recv_bytes() == b"done"
    print("ok", n, flush=True)


def mp_client(port, n, key):
    from multiprocessing.connection import Client
    with Client(("127.0.0.1", port), authkey=key) as c:
        for i in range(n):
            c.send({"i": i, "v": val(i)})
            assert c.recv() == (i, hashlib.sha256(val(i)).hexdigest()), i
        assert c.recv_bytes() == b"x" * 3000000
        c.send_bytes(b"done")
    print("ok", n)


def main():
    role = sys.argv[1]
    if role == "sentinel-writer":
        sentinel_writer([int(p) for p in sys.argv[2].split(",")], float(sys.argv[3]), sys.argv[4])
    elif role == "bs-producer":
        bs_producer(int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])
    elif role == "bs-consumer":
        bs_consumer(int(sys.argv[2]), sys.argv[3], sys.argv[4])
    elif role == "mp-server":
        mp_server(int(sys.argv[2]), int(sys.argv[3]), sys.argv[4].encode())
    elif role == "mp-client":
        mp_client(int(sys.argv[2]), int(sys.argv[3]), sys.argv[4].encode())
    else:
        sys.exit(f"unknown role {role}")


if __name__ == "__main__":
    main()

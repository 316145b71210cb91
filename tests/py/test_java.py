# SPDX-License-Identifier: Apache-2.0 OR MIT
"""Java under `memlan run`, as its users run it: Debian's OpenJDK (default-jdk-headless; scripts/
install-apps.sh installs it), a server JVM and a client JVM, both under memlan, compared with the
same two JVMs over kernel TCP.

The JVM installs its own SIGSEGV/SIGBUS handlers and runs many threads; its sockets are NIO's
(a Selector is an epoll set; a blocking Socket waits in poll for setSoTimeout; another thread's
close dup2s over the descriptor and signals the reader; FileChannel.transferTo is sendfile;
InputStream.available() is ioctl FIONREAD).  Every line the client prints must equal kernel
TCP's, every connection must be accelerated at both ends, no JVM may leave an hs_err file, and
the server must end on SIGTERM as it does without memlan.
"""
import os
import pathlib
import signal
import subprocess
import time

import pytest

from conftest import port_free
from test_apps import accelerated, need, settle, tcp_reasons, wrap

PORT = [23400]  # 23401-23499: no other test's range, below the ephemeral range (32768-60999)
JAVA = ["java", "-Xmx256m", "-XX:+UseSerialGC", "-Xshare:auto"]


def javac(d, name, source):
    """source written to d/name.java and compiled there."""
    (d / f"{name}.java").write_text(source)
    p = subprocess.run(["javac", "-d", str(d), str(d / f"{name}.java")],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr


def next_port():
    while True:
        PORT[0] += 1
        assert PORT[0] < 23500, "test_java ran out of its ports"
        if port_free(PORT[0], strict=True):
            return PORT[0]


# A server (a Selector echo on one port, a thread per connection on another, each connection's
# first byte saying what to do) and a client that prints one deterministic line per check.
RT = r"""
import java.io.*;
import java.net.*;
import java.nio.*;
import java.nio.channels.*;
import java.nio.file.*;
import java.security.MessageDigest;
import java.util.*;
import java.util.concurrent.*;

public class Rt {
    static byte[] det(int n, int seed) { byte[] d = new byte[n]; new Random(seed).nextBytes(d); return d; }
    static String sha(byte[] b) throws Exception {
        StringBuilder s = new StringBuilder();
        for (byte x : MessageDigest.getInstance("SHA-256").digest(b)) s.append(String.format("%02x", x));
        return s.substring(0, 16);
    }
    static void p(String s) { System.out.println(s); System.out.flush(); }

    public static void main(String[] a) throws Exception {
        int nio = Integer.parseInt(a[1]), blk = Integer.parseInt(a[2]), hello = Integer.parseInt(a[3]);
        if (a[0].equals("server")) server(nio, blk, hello); else client(nio, blk, hello);
    }

    // A thread per connection; on the hello port the server speaks first (the client sends nothing).
    static void acceptor(int port, boolean hello) throws IOException {
        ServerSocket ss = new ServerSocket();
        ss.bind(new InetSocketAddress("127.0.0.1", port), 64);
        Thread acc = new Thread(() -> {
            try { while (true) { Socket s = ss.accept(); Thread t = new Thread(() -> serve(s, hello)); t.setDaemon(true); t.start(); } }
            catch (IOException e) { System.err.println("accept " + e); }
        });
        acc.setDaemon(true); acc.start();
    }

    static void server(int nioPort, int blkPort, int helloPort) throws Exception {
        acceptor(blkPort, false);
        acceptor(helloPort, true);
        Selector sel = Selector.open();
        ServerSocketChannel l = ServerSocketChannel.open();
        l.bind(new InetSocketAddress("127.0.0.1", nioPort)); l.configureBlocking(false);
        l.register(sel, SelectionKey.OP_ACCEPT);
        p("ready");
        while (true) {
            sel.select();
            Iterator<SelectionKey> it = sel.selectedKeys().iterator();
            while (it.hasNext()) {
                SelectionKey k = it.next(); it.remove();
                if (!k.isValid()) continue;
                if (k.isAcceptable()) {
                    SocketChannel c = l.accept();
                    if (c == null) continue;
                    c.configureBlocking(false);
                    c.register(sel, SelectionKey.OP_READ, new ArrayDeque<ByteBuffer>());
                    continue;
                }
                SocketChannel c = (SocketChannel) k.channel();
                @SuppressWarnings("unchecked") ArrayDeque<ByteBuffer> q = (ArrayDeque<ByteBuffer>) k.attachment();
                try {
                    if (k.isReadable()) {
                        ByteBuffer b = ByteBuffer.allocateDirect(65536);
                        if (c.read(b) < 0) { c.close(); continue; }
                        b.flip(); q.add(b);
                    }
                    while (!q.isEmpty()) { c.write(q.peek()); if (q.peek().hasRemaining()) break; q.poll(); }
                    k.interestOps(q.isEmpty() ? SelectionKey.OP_READ : SelectionKey.OP_WRITE);
                } catch (IOException e) { System.err.println("nio " + e); c.close(); }
            }
        }
    }

    static void serve(Socket s, boolean hello) {
        try {
            InputStream in = s.getInputStream(); OutputStream out = s.getOutputStream();
            switch (hello ? 'A' : in.read()) {
                case 'E': { byte[] b = new byte[32768]; int n; while ((n = in.read(b)) > 0) out.write(b, 0, n); break; }
                case 'S': { Thread.sleep(2000); out.write("late".getBytes()); in.read(); break; }
                case 'A': { out.write(det(1000, 4)); out.flush(); in.read(); break; }
                case 'H': { byte[] g = in.readAllBytes(); out.write((g.length + " " + sha(g)).getBytes()); break; }
                case 'L': { out.write(det(1000, 3)); out.flush(); Thread.sleep(200); s.setSoLinger(true, 0); break; }
                case 'B': {
                    byte[] d = det(1 << 20, 7);
                    try { for (int i = 0; i < 64; i++) out.write(d); System.err.println("B: all sent"); }
                    catch (IOException e) { System.err.println("B: " + e.getMessage()); }
                    break;
                }
            }
            s.close();
        } catch (Exception e) { System.err.println("serve " + e); }
    }

    static Socket conn(int port, char cmd) throws IOException {
        Socket s = new Socket("127.0.0.1", port); s.getOutputStream().write(cmd); return s;
    }

    static String echo(int port, byte cmd, int id) throws Exception {
        byte[] d = det((1 << 20) + id, id);
        try (Socket s = new Socket("127.0.0.1", port)) {
            OutputStream o = s.getOutputStream();
            if (cmd != 0) o.write(cmd);
            Thread w = new Thread(() -> { try { o.write(d); s.shutdownOutput(); } catch (IOException e) { p("write " + e); } });
            w.start();
            byte[] g = s.getInputStream().readAllBytes(); w.join();
            return Arrays.equals(g, d) ? "ok" : "BAD " + g.length;
        }
    }

    static void client(int nio, int blk, int hello) throws Exception {
        ExecutorService ex = Executors.newFixedThreadPool(8);
        for (int port : new int[]{nio, blk}) {
            List<Future<String>> fs = new ArrayList<>();
            for (int i = 0; i < 8; i++) { int id = i; fs.add(ex.submit(() -> echo(port, (byte) (port == nio ? 0 : 'E'), id))); }
            StringBuilder r = new StringBuilder(); for (Future<String> f : fs) r.append(f.get(60, TimeUnit.SECONDS)).append(' ');
            p((port == nio ? "selector" : "thread") + " echo: " + r.toString().trim());
        }
        try (Socket s = new Socket("127.0.0.1", hello)) {
            // No other call on the socket since its connect: available() alone must see the
            // server's 1000 bytes (within 5 s, for a loaded machine).
            int n = 0; for (int i = 0; i < 100 && (n = s.getInputStream().available()) < 1000; i++) Thread.sleep(50);
            p("available: " + n);
            byte[] g = s.getInputStream().readNBytes(1000);
            p("available: read " + Arrays.equals(g, det(1000, 4)) + ", then " + s.getInputStream().available());
        }
        try (Socket s = conn(blk, 'S')) {
            s.setSoTimeout(300); long t0 = System.nanoTime(); String r;
            try { r = "read " + s.getInputStream().read(); }
            catch (SocketTimeoutException e) { long ms = (System.nanoTime() - t0) / 1000000; r = ms >= 250 && ms < 1900 ? "SocketTimeoutException" : "timed out after " + ms + " ms"; }
            p("setSoTimeout: " + r);
            s.setSoTimeout(10000); byte[] b = new byte[8]; int n = s.getInputStream().read(b);
            p("setSoTimeout: then " + new String(b, 0, Math.max(n, 0)));
        }
        {
            Socket s = conn(blk, 'S');
            Future<String> f = ex.submit(() -> { try { return "read " + s.getInputStream().read(); } catch (IOException e) { return e.getClass().getSimpleName() + ": " + e.getMessage(); } });
            Thread.sleep(300); s.close();
            String r; try { r = f.get(1500, TimeUnit.MILLISECONDS); } catch (TimeoutException e) { r = "reader still blocked"; }
            p("close from another thread: " + r);
        }
        byte[] d = det(3 << 20, 9);
        try (Socket s = conn(blk, 'H')) {
            s.getOutputStream().write(d); s.shutdownOutput();
            p("half-close: " + new String(s.getInputStream().readAllBytes()) + (" " + d.length + " " + sha(d)));
        }
        Path file = Files.createTempFile("rt", ".bin");
        try (FileChannel fc = FileChannel.open(file, StandardOpenOption.WRITE)) { fc.write(ByteBuffer.wrap(d)); }
        try (SocketChannel c = SocketChannel.open(new InetSocketAddress("127.0.0.1", blk)); FileChannel fc = FileChannel.open(file)) {
            c.write(ByteBuffer.wrap(new byte[]{'H'}));
            long pos = 0; while (pos < d.length) pos += fc.transferTo(pos, d.length - pos, c);
            c.shutdownOutput();
            ByteBuffer r = ByteBuffer.allocate(100); while (c.read(r) >= 0) {}
            p("transferTo: " + new String(r.array(), 0, r.position()));
        } finally { Files.delete(file); }
        try (Socket s = conn(blk, 'L')) {
            Thread.sleep(500); InputStream in = s.getInputStream(); byte[] b = new byte[4096]; long got = 0; String end;
            try { int n; while ((n = in.read(b)) >= 0) got += n; end = "EOF"; } catch (IOException e) { end = e.getMessage(); }
            p("SO_LINGER 0: " + got + " bytes, then " + end);
        }
        try (Socket s = conn(blk, 'B')) { s.getInputStream().readNBytes(1 << 20); }
        try (Socket s = new Socket()) { s.connect(new InetSocketAddress("127.0.0.1", nio), 5000); s.setSoTimeout(5000);
            s.getOutputStream().write("still".getBytes()); s.shutdownOutput(); p("server after a client left mid-response: " + new String(s.getInputStream().readAllBytes())); }
        ex.shutdown();
        p("done");
    }
}
"""


def hs_errs(d):
    return sorted(str(p) for p in pathlib.Path(d).glob("hs_err_pid*.log"))


def one_run(tmp_path, on):
    """The server and the client, under memlan or not: (client's lines, server's exit status,
    server's stderr, server log, client log)."""
    nio, blk, hello = next_port(), next_port(), next_port()
    tag = "memlan" if on else "tcp"
    slog, clog = tmp_path / f"server-{tag}.log", tmp_path / f"client-{tag}.log"
    cp = ["-cp", str(tmp_path)]
    srv = subprocess.Popen(wrap(JAVA + cp + ["Rt", "server", str(nio), str(blk), str(hello)], slog, on),
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path)
    try:
        assert srv.stdout.readline() == "ready\n", srv.stderr.read()
        c = subprocess.run(wrap(JAVA + cp + ["Rt", "client", str(nio), str(blk), str(hello)], clog, on),
                           capture_output=True, text=True, timeout=90, cwd=tmp_path)
        assert c.returncode == 0, (tag, c.stdout, c.stderr[-3000:])
        time.sleep(0.3)  # the server's last lines (the 'B' connection's end)
    finally:
        srv.send_signal(signal.SIGTERM)
        try:
            rc = srv.wait(15)
        except subprocess.TimeoutExpired:
            srv.kill()
            srv.wait()
            rc = "hung after SIGTERM"
    return c.stdout, rc, srv.stderr.read(), slog, clog


def test_java_nio_and_blocking_sockets_as_over_tcp(fabric, tmp_path):
    """Selector and thread-per-connection echo, available(), setSoTimeout firing, a close from
    another thread waking a blocked reader, half-close, transferTo (sendfile), SO_LINGER 0's
    reset, a client leaving mid-response: the client's every line equals kernel TCP's.  Before,
    available() said 0 under memlan where kernel TCP said 1000: the client had made no read since
    its offer, so FIONREAD found the socket undecided (the acceptor had attached and written)
    and answered 0 instead of settling it first."""
    need("java", "javac")
    javac(tmp_path, "Rt", RT)
    tcp_out, tcp_rc, tcp_err, _, _ = one_run(tmp_path, False)
    ml_out, ml_rc, ml_err, slog, clog = one_run(tmp_path, True)
    assert "available: 1000\n" in tcp_out and "done\n" in tcp_out, tcp_out
    assert ml_out == tcp_out
    # The JVM's SIGTERM: its shutdown hooks, then exit status 128 + 15.
    assert ml_rc == tcp_rc == 143, (ml_rc, tcp_rc, ml_err[-2000:])
    # The server saw the client leave mid-response as over TCP (how far it got differs: the
    # ring and the socket buffer are not the same size).
    for err in (tcp_err, ml_err):
        assert "B: " in err and "B: all sent" not in err, err
    assert "nio " not in ml_err and "serve " not in ml_err, ml_err
    # 16 echoes, 6 other connections of the blocking server, one more of the selector's, one
    # of the hello port's.
    assert accelerated(clog) == 24 and accelerated(slog) == 24, \
        (clog.read_text()[-2000:], slog.read_text()[-2000:])
    assert tcp_reasons(clog) == [] and tcp_reasons(slog) == []
    assert hs_errs(tmp_path) == []
    settle()


# Urgent data as Java sends it: Socket.sendUrgentData (MSG_OOB), right after connect, before the
# server accepts; setOOBInline(true) reading it in line; sendUrgentData as a liveness probe that
# ends with an IOException once the server closes.  argv: server|client PORT.
URG = r"""
import java.io.*;
import java.net.*;

public class Urg {
    static String readAll(Socket s) throws IOException {
        ByteArrayOutputStream o = new ByteArrayOutputStream();
        byte[] b = new byte[8192];
        int n;
        while ((n = s.getInputStream().read(b)) > 0) o.write(b, 0, n);
        return o.toString("ISO-8859-1");
    }
    public static void main(String[] a) throws Exception {
        int port = Integer.parseInt(a[1]);
        if (a[0].equals("server")) {
            try (ServerSocket ss = new ServerSocket(port, 5, InetAddress.getByName("127.0.0.1"))) {
                System.out.println("listening"); System.out.flush();
                Thread.sleep(500); // the client's first urgent byte comes before this accept
                for (int i = 0; i < 2; i++) {
                    Socket s = ss.accept();
                    s.setOOBInline(true);
                    System.out.println("read " + readAll(s));
                    s.close();
                }
                Socket p = ss.accept(); // the probe: never read, closed after a while
                Thread.sleep(1000);
                p.close();
            }
        } else {
            for (int i = 0; i < 2; i++) {
                Socket s = new Socket("127.0.0.1", port);
                OutputStream o = s.getOutputStream();
                o.write("abc".getBytes());
                s.sendUrgentData('X');
                o.write("def".getBytes());
                s.sendUrgentData('Y');
                o.write("end".getBytes());
                s.close();
                System.out.println("sent " + i);
                Thread.sleep(300);
            }
            Socket s = new Socket("127.0.0.1", port);
            String end = "no error in 60 probes";
            for (int i = 0; i < 60; i++) {
                try {
                    s.sendUrgentData(0);
                } catch (IOException e) {
                    end = "probe ended: " + e.getMessage();
                    break;
                }
                Thread.sleep(100);
            }
            System.out.println(end);
            s.close();
        }
    }
}
"""


def test_java_urgent_data_as_over_tcp(fabric, tmp_path):
    """Socket.sendUrgentData: right after connect, before the server accepts, it threw an
    IOException under memlan (the offer refused urgent data: EOPNOTSUPP, an explorer); read in
    line with setOOBInline(true); and as a liveness probe, which ends with an IOException once
    the server closes.  Every line as over kernel TCP (the first connection goes to TCP, its
    offer withdrawn; the second may be accepted in time to be carried)."""
    need("java", "javac")
    javac(tmp_path, "Urg", URG)
    outs = {}
    for on in (False, True):
        port = next_port()
        log = tmp_path / f"urg-{on}.log"
        srv = subprocess.Popen(wrap(JAVA + ["-cp", str(tmp_path), "Urg", "server", str(port)],
                                    log, on), stdout=subprocess.PIPE, text=True)
        try:
            assert srv.stdout.readline().strip() == "listening"
            c = subprocess.run(wrap(JAVA + ["-cp", str(tmp_path), "Urg", "client", str(port)],
                                    log, on), capture_output=True, text=True, timeout=120)
            out, _ = srv.communicate(timeout=60)
            outs[on] = (c.returncode, c.stdout, srv.returncode, out)
        finally:
            if srv.poll() is None:
                srv.kill()
                srv.wait()
    assert outs[False][0] == 0 and "read abcXdefYend" in outs[False][3], outs
    assert "probe ended" in outs[False][1], outs
    assert outs[True] == outs[False], (outs, log.read_text()[-3000:])
    text = log.read_text()
    assert "TCP (urgent data (MSG_OOB) was sent before a memlan acceptor took the offer)" in text, \
        text
    assert hs_errs(tmp_path) == []
    settle()

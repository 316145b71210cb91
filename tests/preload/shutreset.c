/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/*
 * shutreset: shutdown() on a connection its peer reset.  The kernel's socket is closed by the
 * reset (TCP_CLOSE), and shutdown() of any kind then fails with ENOTCONN (after setting the
 * shutdown bits, so poll's answer changes as usual); before the reset, after a plain FIN, or
 * on a live connection it returns 0.  Under memlan the accelerated end returned 0 after the
 * reset too.  Each case settles a fresh connection (both ends accelerated under memlan), makes
 * the peer's end go one way, then prints the calls the other end makes (callscript.h: w r b
 * are shutdown SHUT_WR, SHUT_RD, SHUT_RDWR).  Run once over kernel TCP and once under
 * `memlan run`: the two outputs must be equal (tests/py/test_preload.py).
 *
 * usage: shutreset PORT
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "callscript.h"


/* how the accepted end goes: 'u' closed with the client's bytes unread (a reset), 'l' closed
 * with SO_LINGER 0 (a reset), 'k' its last holder, a child, killed with bytes unread (a reset
 * at the death), 'c' closed with everything read (a FIN), 'f' shut down writing only (a FIN,
 * still open), 'n' nothing (a live connection).  side: 'c' the client's end makes the calls,
 * 's' the accepted end does (the cases where the client goes). */
static void peer_goes(char how, char side, const char *calls)
{
    int c, s;
    cs_pair(&c, &s, 0);
    static const char *names[] = {"unread close", "linger 0 close", "holder killed", "close",
                                  "shutdown", "nothing"};
    const char *hows = "ulkcfn";
    printf("%s by the %s, then %s\n", names[strchr(hows, how) - hows],
           side == 'c' ? "server" : "client", calls);
    int me = side == 'c' ? c : s, peer = side == 'c' ? s : c;
    if (how == 'u' || how == 'k')
        send(me, "0123456789", 10, 0);
    usleep(20000);
    if (how == 'k') {
        int go[2];
        if (pipe(go) < 0)
            cs_die("pipe");
        pid_t pid = fork();
        if (pid == 0) {
            if (write(go[1], "s", 1) != 1)
                _exit(1);
            for (;;)
                pause();
        }
        close(peer);
        char x;
        if (read(go[0], &x, 1) != 1)
            cs_die("go");
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
        close(go[0]);
        close(go[1]);
        peer = -1;
    } else if (how == 'l') {
        struct linger lg = {1, 0};
        setsockopt(peer, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
    }
    if (how == 'f')
        shutdown(peer, SHUT_WR);
    else if (how != 'n' && peer >= 0) {
        close(peer);
        peer = -1;
    }
    settle_close();
    script(me, calls);
    close(me);
    if (peer >= 0)
        close(peer);
}

int main(int argc, char **argv)
{
    if (argc != 2)
        return 2;
    cs_listen(argv[1]);

    /* Resets: shutdown first, after the error was read, after a recv read it, each kind. */
    peer_goes('u', 'c', "wP");
    peer_goes('u', 'c', "rP");
    peer_goes('u', 'c', "bP");
    peer_goes('u', 'c', "EwrbP");
    peer_goes('u', 'c', "RwR");
    peer_goes('u', 's', "wEP");
    peer_goes('l', 'c', "wP");
    peer_goes('l', 'c', "rbE");
    peer_goes('l', 's', "bR");
    peer_goes('k', 'c', "wE");
    peer_goes('k', 'c', "ERb");
    peer_goes('c', 'c', "SSwP"); /* a write after its close: its kernel's reset answers it */
    /* Not resets: these return 0 over kernel TCP and must stay so. */
    peer_goes('c', 'c', "wP");
    peer_goes('c', 'c', "RrwP");
    peer_goes('c', 's', "bP");
    peer_goes('f', 'c', "wRP");
    peer_goes('f', 'c', "rP");
    peer_goes('n', 'c', "wP");
    peer_goes('n', 'c', "rwbP");
    peer_goes('n', 'c', "wwP");
    /* Both ends' FINs through: closed, ENOTCONN again, without any reset. */
    peer_goes('c', 'c', "wwP");
    peer_goes('f', 'c', "wrbP");
    printf("done\n");
    return 0;
}

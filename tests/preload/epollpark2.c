/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/*
 * epollpark2: more of epoll_ctl's answers around a member deleted (parked under memlan: its
 * kernel entry stays, src/preload/epoll.c, "Parked members"), printed line by line over kernel
 * TCP and under memlan (tests/py/test_preload.py): a MOD with EPOLLEXCLUSIVE of a deleted member
 * (the kernel's EINVAL comes before its ENOENT), and the deleted member's fd closed while a
 * duplicate keeps the socket open, its number then brought back to the same socket (the
 * kernel's entry was deleted: the ADD succeeds); and a set inside another, from which a member
 * was deleted, not readable there when that member's peer shuts down; and a member deleted before
 * fork, added back by the child and then by the parent (the kernel's set is shared: 0, then
 * EEXIST), one in the set at fork deleted by one process and modified or added by the other
 * (ENOENT, 0), or one deleted before exec, added back by the new image (0).
 *
 * usage: epollpark2 PORT (and, as the exec'd image: epollpark2 exec EPFD FD)
 */
#include "twoends.h"

#include "epollprint.h"

#include <sys/wait.h>
#include <unistd.h>

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc == 4) { /* the image exec gave the set and the socket to: EP FD */
        ep = atoi(argv[2]);
        int fd = atoi(argv[3]);
        ctl("after exec, add", EPOLL_CTL_ADD, fd, EPOLLOUT);
        wait_("after exec, wait", 100);
        ctl("after exec, del", EPOLL_CTL_DEL, fd, 0);
        return 0;
    }
    if (argc != 2)
        return 2;
    struct sockaddr_in a;
    int l = listen_here(atoi(argv[1]), &a);
    int peer, c = settled_pair(l, &a, &peer);
    if ((ep = epoll_create(1)) < 0) /* no close-on-exec: the exec'd image below gets it */
        die("epoll_create1");

    /* EPOLLEXCLUSIVE with MOD is refused before the member is looked for. */
    ctl("add", EPOLL_CTL_ADD, c, EPOLLIN);
    ctl("mod exclusive", EPOLL_CTL_MOD, c, EPOLLIN | EPOLLEXCLUSIVE);
    ctl("del", EPOLL_CTL_DEL, c, 0);
    ctl("mod exclusive after del", EPOLL_CTL_MOD, c, EPOLLIN | EPOLLEXCLUSIVE);
    ctl("mod after del", EPOLL_CTL_MOD, c, EPOLLIN);

    /* Deleted, then its fd closed while a duplicate keeps the socket; the number's epoll_ctl
     * meanwhile says EBADF; the socket brought back to the same number and added. */
    int d = dup(c);
    if (d < 0)
        die("dup");
    close(c);
    ctl("del the closed fd", EPOLL_CTL_DEL, c, 0);
    if (dup2(d, c) != c)
        die("dup2");
    ctl("add it back under its number", EPOLL_CTL_ADD, c, EPOLLOUT);
    wait_("wait", 100);
    ctl("del", EPOLL_CTL_DEL, c, 0);
    ctl("del again", EPOLL_CTL_DEL, c, 0);

    /* The same, the number taken meanwhile by a pipe that is added and deleted. */
    ctl("add", EPOLL_CTL_ADD, c, EPOLLOUT);
    ctl("del", EPOLL_CTL_DEL, c, 0);
    close(c);
    int p[2];
    if (pipe(p) != 0)
        die("pipe");
    printf("the pipe has the number: %s\n", p[0] == c ? "yes" : "no");
    ctl("add the pipe", EPOLL_CTL_ADD, p[0], EPOLLIN);
    ctl("del the pipe", EPOLL_CTL_DEL, p[0], 0);
    if (dup2(d, p[0]) != p[0])
        die("dup2");
    ctl("add the socket back under the number", EPOLL_CTL_ADD, p[0], EPOLLOUT);
    wait_("wait", 100);
    ctl("del", EPOLL_CTL_DEL, p[0], 0);
    close(p[0]);
    close(p[1]);

    /* A set inside another (watched for EPOLLIN): a member deleted from it must not make it
     * readable there at its peer's FIN.  Deleted before the set went inside, then one deleted
     * after. */
    int in = ep, out = epoll_create1(0), peer2, c2 = settled_pair(l, &a, &peer2);
    ctl("add", EPOLL_CTL_ADD, d, EPOLLIN);
    ctl("del", EPOLL_CTL_DEL, d, 0);
    ep = out;
    ctl("the set into another", EPOLL_CTL_ADD, in, EPOLLIN);
    ep = in;
    if (shutdown(peer, SHUT_WR) != 0)
        die("shutdown");
    ep = out;
    wait_("the other set, the peer of one deleted before shut down", 200);
    ep = in;
    wait_("the set", 0);
    ctl("add another", EPOLL_CTL_ADD, c2, EPOLLIN);
    ctl("del it", EPOLL_CTL_DEL, c2, 0);
    ctl("del it again", EPOLL_CTL_DEL, c2, 0);
    if (shutdown(peer2, SHUT_WR) != 0)
        die("shutdown");
    ep = out;
    wait_("the other set, the peer of one deleted inside shut down", 200);
    ep = in;
    wait_("the set", 0);
    ctl("add it back", EPOLL_CTL_ADD, c2, EPOLLIN);
    ep = out;
    wait_("the other set, it added back", 200);
    ep = in;
    wait_("the set", 0);
    close(out);
    close(c2);
    close(peer2);

    /* Deleted, then fork: the kernel's set is the child's too.  The child adds the socket back
     * (the kernel: 0), then the parent does (the kernel: EEXIST, the child's entry). */
    int peer3, c3 = settled_pair(l, &a, &peer3);
    ctl("add", EPOLL_CTL_ADD, c3, EPOLLOUT);
    ctl("del", EPOLL_CTL_DEL, c3, 0);
    pid_t pid = fork();
    if (pid == 0) {
        ctl("the fork child adds it back", EPOLL_CTL_ADD, c3, EPOLLOUT);
        _exit(0);
    }
    if (pid < 0 || waitpid(pid, NULL, 0) != pid)
        die("fork");
    ctl("the parent adds it back", EPOLL_CTL_ADD, c3, EPOLLOUT);
    ctl("del", EPOLL_CTL_DEL, c3, 0);
    ctl("add", EPOLL_CTL_ADD, c3, EPOLLOUT);

    /* In the set at fork: the child deletes it, the parent's MOD is ENOENT, its ADD 0. */
    if ((pid = fork()) == 0) {
        ctl("the fork child deletes it", EPOLL_CTL_DEL, c3, 0);
        _exit(0);
    }
    if (pid < 0 || waitpid(pid, NULL, 0) != pid)
        die("fork");
    ctl("the parent modifies it", EPOLL_CTL_MOD, c3, EPOLLOUT);
    ctl("the parent adds it", EPOLL_CTL_ADD, c3, EPOLLOUT);
    /* In the set at fork: the parent deletes it, then the child adds it (0). */
    int go[2];
    if (pipe(go) != 0)
        die("pipe");
    if ((pid = fork()) == 0) {
        char x;
        if (read(go[0], &x, 1) != 1)
            _exit(1);
        ctl("the fork child adds it", EPOLL_CTL_ADD, c3, EPOLLOUT);
        _exit(0);
    }
    ctl("the parent deletes it", EPOLL_CTL_DEL, c3, 0);
    if (pid < 0 || write(go[1], "g", 1) != 1 || waitpid(pid, NULL, 0) != pid)
        die("fork");
    close(go[0]);
    close(go[1]);
    ctl("del", EPOLL_CTL_DEL, c3, 0);
    ctl("del again", EPOLL_CTL_DEL, c3, 0);

    /* Deleted, then the set and the socket given to a new image (fork and exec): its ADD is
     * the kernel's 0. */
    ctl("add", EPOLL_CTL_ADD, c3, EPOLLOUT);
    ctl("del", EPOLL_CTL_DEL, c3, 0);
    char epa[16], fda[16];
    snprintf(epa, sizeof epa, "%d", ep);
    snprintf(fda, sizeof fda, "%d", c3);
    if ((pid = fork()) == 0) {
        execl(argv[0], argv[0], "exec", epa, fda, (char *)NULL);
        _exit(9);
    }
    int st = 0;
    if (pid < 0 || waitpid(pid, &st, 0) != pid || st != 0)
        die("exec");
    close(c3);
    close(peer3);
    close(d);
    close(peer);
    close(ep);
    close(l);
    printf("done\n");
    return 0;
}

/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/*
 * rawclone: a child made by syscall(SYS_clone, SIGCHLD, NULL), as vsftpd makes each session's
 * process (with CLONE_NEWPID or CLONE_NEWIPC, and CLONE_NEWNET for its unprivileged half), and by
 * syscall(SYS_fork), serves an accepted connection its parent then closes, as a forking server
 * does: the child moves its stdio onto the connection (dup2 to 0, 1, 2, as vsftpd), writes a
 * greeting, reads the client's line, answers 100 KB and exits; the client reads the greeting,
 * the answer whole and end-of-file.
 *
 * Under memlan the child took itself for a vfork child (its pid was not the one fork's handlers
 * keep) and went past memlan on every call: its greeting was written on the idle kernel socket
 * ("bytes arrived on the kernel socket under an accelerated connection", the stream split), and
 * vsftpd's logins all failed.
 *
 * "shared": parent and raw child then both send on one connection at once, 10000 records of 8
 * bytes each ('P' and 'C'), three times, the client counting whole records of each.  glibc's mutexes name a
 * thread by its descriptor's tid, which a raw clone's child kept from its parent: a socket lock
 * (process-shared, robust, error-checking) held by one read EDEADLK in the other, which memlan
 * took for a broken lock and reported as a reset ("send: Connection reset by peer").
 *
 * "nested": the raw child raw-clones one of its own (vsftpd's session and its unprivileged
 * half), and those two send at once: a raw clone gives its child no clear-child-tid, so the
 * grandchild was left with its parent's tid unless the child names its own place to the kernel.
 * The first cases run with a child made by syscall(SYS_clone3) too (LXC's way), which went past
 * memlan as the others once did: the parent's close ended the connection under it.
 *
 * usage: rawclone PORT
 */
#include "twoends.h"

#include <poll.h>
#include <stdint.h>
#include <signal.h>
#include <sys/syscall.h>
#include <sys/wait.h>

#define ANSWER (100 * 1024)
#define NREC 10000 /* 8-byte records each: 160 KB in all, within a ring */
#define RECSZ 8

static long raw_child(int how)
{
    if (how == 0)
        return syscall(SYS_clone, (long)SIGCHLD, 0L, 0L, 0L, 0L);
    if (how == 2) {
#ifdef SYS_clone3
        struct { /* linux/sched.h's struct clone_args, first version */
            uint64_t flags, pidfd, child_tid, parent_tid, exit_signal, stack, stack_size, tls;
        } ca = {.exit_signal = SIGCHLD};
        long r = syscall(SYS_clone3, &ca, sizeof ca);
        if (r >= 0 || errno != ENOSYS)
            return r;
#endif
        return syscall(SYS_clone, (long)SIGCHLD, 0L, 0L, 0L, 0L); /* as clone3 would */
    }
#ifdef SYS_fork
    return syscall(SYS_fork);
#else
    return syscall(SYS_clone, (long)SIGCHLD, 0L, 0L, 0L, 0L);
#endif
}

/* The child's side: the connection on 0, 1 and 2, as vsftpd's session has it. */
static void serve(int s, int l)
{
    alarm(15); /* an alarm is not inherited: the child's own bound */
    close(l);
    if (dup2(s, 0) != 0 || dup2(s, 1) != 1 || dup2(s, 2) != 2)
        _exit(10);
    close(s);
    static const char hello[] = "220 hello from the child\r\n";
    if (write(1, hello, sizeof hello - 1) != (ssize_t)sizeof hello - 1)
        _exit(11);
    char line[64];
    size_t n = 0;
    while (n < sizeof line && (n == 0 || line[n - 1] != '\n')) {
        ssize_t r = read(0, line + n, sizeof line - n);
        if (r <= 0)
            _exit(12);
        n += (size_t)r;
    }
    if (n != 6 || memcmp(line, "USER\r\n", 6) != 0)
        _exit(13);
    static char big[ANSWER];
    for (size_t i = 0; i < sizeof big; i++)
        big[i] = (char)(i * 7 + 3);
    for (size_t off = 0; off < sizeof big;) {
        ssize_t w = write(1, big + off, sizeof big - off);
        if (w <= 0)
            _exit(14);
        off += (size_t)w;
    }
    _exit(0);
}

/* Everything the client reads until end-of-file, within 10 s. */
static size_t read_all(int c, char *buf, size_t max, int *eof)
{
    size_t n = 0;
    *eof = 0;
    double end = now_s() + 10;
    while (now_s() < end) {
        struct pollfd p = {.fd = c, .events = POLLIN};
        if (poll(&p, 1, 500) != 1)
            continue;
        ssize_t r = recv(c, buf + n, max - n, MSG_DONTWAIT);
        if (r == 0) {
            *eof = 1;
            break;
        }
        if (r < 0)
            break;
        n += (size_t)r;
        if (n == max)
            break;
    }
    return n;
}

/* Two writers' records (RECSZ bytes of one letter each, letters w[0] and w[1]) read to the
 * end: each writer's whole records into recs, the count of mixed ones returned. */
static int count_records(int c, const char *w, int recs[2], int *eof)
{
    static char all[2 * NREC * RECSZ + 1]; /* within a ring: the client reads after */
    size_t got = read_all(c, all, sizeof all, eof);
    int mixed = 0;
    recs[0] = recs[1] = 0;
    for (size_t off = 0; off + RECSZ <= got; off += RECSZ) {
        int k = all[off] == w[0] ? 0 : all[off] == w[1] ? 1 : -1;
        for (int j = 1; j < RECSZ && k >= 0; j++)
            if (all[off + j] != all[off])
                k = -1;
        if (k < 0)
            mixed++;
        else
            recs[k]++;
    }
    return mixed;
}

int main(int argc, char **argv)
{
    if (argc != 2)
        return 2;
    struct sockaddr_in a;
    int l = scripted_listener(argv[1], &a);
    static const char *names[] = {"clone(SIGCHLD)", "fork", "clone3"};
    static char buf[ANSWER + 256];
    for (int how = 0; how < 3; how++) {
        int s;
        int c = settled_pair(l, &a, &s);
        long pid = raw_child(how);
        if (pid < 0)
            die("raw clone");
        if (pid == 0)
            serve(s, l);
        close(s); /* as a forking server: the child alone serves it now */
        char hello[64];
        size_t n = 0;
        while (n < 26) {
            struct pollfd p = {.fd = c, .events = POLLIN};
            if (poll(&p, 1, 5000) != 1)
                break;
            ssize_t r = recv(c, hello + n, 26 - n, 0);
            if (r <= 0)
                break;
            n += (size_t)r;
        }
        printf("%s: greeting: %s\n", names[how],
               n == 26 && memcmp(hello, "220 hello from the child\r\n", 26) == 0 ? "ok" : "missing");
        if (send(c, "USER\r\n", 6, MSG_NOSIGNAL) != 6)
            printf("%s: send: %s\n", names[how], strerror(errno));
        int eof;
        size_t got = read_all(c, buf, sizeof buf, &eof);
        int right = got == ANSWER;
        for (size_t i = 0; right && i < got; i++)
            right = buf[i] == (char)(i * 7 + 3);
        printf("%s: answer: %zu bytes%s, %s\n", names[how], got, right ? " right" : "",
               eof ? "end-of-file" : "no end-of-file");
        int st = 0;
        if (waitpid((pid_t)pid, &st, 0) != (pid_t)pid)
            die("waitpid");
        printf("%s: child status %d\n", names[how], WIFEXITED(st) ? WEXITSTATUS(st) : -1);
        close(c);
    }
    /* shared */
    for (int round = 0; round < 3; round++) {
        int s, go[2];
        int c = settled_pair(l, &a, &s);
        if (pipe(go) < 0)
            die("pipe");
        long pid = raw_child(0);
        if (pid < 0)
            die("raw clone");
        char rec[RECSZ];
        int mine = pid == 0 ? 'C' : 'P', bad = 0;
        memset(rec, mine, sizeof rec);
        if (pid == 0) {
            alarm(15);
            close(l);
            close(c);
            char b;
            if (read(go[0], &b, 1) != 1) /* both start together */
                _exit(20);
        } else {
            usleep(100000);
            if (write(go[1], "g", 1) != 1)
                die("write");
        }
        for (int i = 0; i < NREC && !bad; i++) {
            ssize_t w = send(s, rec, sizeof rec, MSG_NOSIGNAL);
            if (w != (ssize_t)sizeof rec) {
                printf("shared: %c: send %zd: %s\n", mine, w, w < 0 ? strerror(errno) : "short");
                fflush(stdout);
                bad = 1;
            }
        }
        if (pid == 0)
            _exit(bad);
        int st = 0;
        if (waitpid((pid_t)pid, &st, 0) != (pid_t)pid)
            die("waitpid");
        close(s);
        int eof, recs[2], mixed = count_records(c, "PC", recs, &eof);
        printf("shared: %d P records, %d C records, %d mixed, %s; child status %d\n", recs[0],
               recs[1], mixed, eof ? "end-of-file" : "no end-of-file",
               WIFEXITED(st) ? WEXITSTATUS(st) : -1);
        close(c);
    }
    /* nested: the raw child raw-clones a child of its own (vsftpd's session and its
     * unprivileged half), and those two send at once; the parent only reads. */
    for (int round = 0; round < 3; round++) {
        int s, go[2];
        int c = settled_pair(l, &a, &s);
        if (pipe(go) < 0)
            die("pipe");
        long pid = raw_child(0);
        if (pid < 0)
            die("raw clone");
        if (pid == 0) {
            alarm(15);
            close(l);
            close(c);
            long g = raw_child(0);
            if (g < 0)
                _exit(30);
            char rec[RECSZ], b;
            int mine = g == 0 ? 'G' : 'C', bad = 0;
            memset(rec, mine, sizeof rec);
            if (g == 0 && read(go[0], &b, 1) != 1)
                _exit(20);
            if (g > 0) {
                usleep(100000);
                if (write(go[1], "g", 1) != 1)
                    _exit(21);
            }
            for (int i = 0; i < NREC && !bad; i++) {
                ssize_t w = send(s, rec, sizeof rec, MSG_NOSIGNAL);
                if (w != (ssize_t)sizeof rec) {
                    printf("nested: %c: send %zd: %s\n", mine, w,
                           w < 0 ? strerror(errno) : "short");
                    fflush(stdout);
                    bad = 1;
                }
            }
            if (g == 0)
                _exit(bad);
            int gst = 0;
            if (waitpid((pid_t)g, &gst, 0) != (pid_t)g || !WIFEXITED(gst) || WEXITSTATUS(gst))
                bad = 1;
            _exit(bad);
        }
        close(s);
        int st = 0;
        if (waitpid((pid_t)pid, &st, 0) != (pid_t)pid)
            die("waitpid");
        int eof, recs[2], mixed = count_records(c, "CG", recs, &eof);
        printf("nested: %d C records, %d G records, %d mixed, %s; status %d\n", recs[0], recs[1],
               mixed, eof ? "end-of-file" : "no end-of-file", WIFEXITED(st) ? WEXITSTATUS(st) : -1);
        close(c);
    }
    printf("done\n");
    return 0;
}

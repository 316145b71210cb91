/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/*
 * exitrace: what a process does with its connections after exit() has begun.  exit() runs the
 * exit handlers (memlan's among them), then the ELF destructors, then glibc's flush of stdio,
 * and only then does the kernel end the process; other threads run all the while.  Over kernel
 * TCP every byte a send accepted in that time reaches the peer, and nothing dies of it.  Each
 * round forks a child that connects to this process (the parent), does the case's thing and calls
 * exit(0); the parent reads the connection to its end and checks.
 *
 * usage: exitrace PORT CASE [ROUNDS]
 *   dtor:   the child sends "a", then exits; an ELF destructor sends "bye" and a stdio stream on
 *           the socket holds "-late" that glibc flushes at the very end: the parent must read
 *           "abye-late".  (Before: memlan's exit handler had ended the connection, and both went
 *           to the kernel socket under the channel, never read: the parent read "a".)
 *   thread: a thread of the child sends 1 KiB pieces and counts, after each send returned, the
 *           bytes sent (in memory the parent reads); the child's main thread exits a moment
 *           later.  The parent must read at least what was counted.
 *   shared: the child forks a grandchild that holds the connection too and exits at once; then
 *           the child sends "s" and exits.  The parent must read "s" and its end.  (With
 *           `memlan run`, the Python test also wants the fabric empty afterwards: the
 *           grandchild's exit() takes the channel file's name, as the child's would.)
 *   linger: the child sets SO_LINGER with a zero time, sends "a" and exits: the parent's reads
 *           must end with ECONNRESET (the kernel's close at the process's end aborts).
 *   flush:  the child puts 4 MiB in a stdio stream on the socket (a buffer that large) and exits;
 *           glibc's flush at exit's very end writes them while the parent begins to read only
 *           half a second after it accepted: the parent must read all 4 MiB (before: the write,
 *           waiting for room after memlan's exit handler had taken the channel file's name, took
 *           the parent for dead at its first look at its liveness, and the rest was lost).
 *   shutwr: the child sends "w", shuts its writing down, reads the parent's end and exits
 *           without closing: the parent must read "w" and its end.  (With `memlan run` the
 *           Python test wants the fabric empty afterwards: before, a side that had shut down
 *           kept its channel file's name at exit, and the file stayed for the next sweep.)
 *   lateshut: a thread of the child shuts the connection's writing down after memlan's exit
 *           handler has run (it waits for glibc's last flush, which comes after the handler, to
 *           reach a pipe it reads), then lets the process end; the parent reads the end, then
 *           sends until a send fails: it must fail (the child is gone), not time out.  (Before:
 *           the child's file had lost its name with its side open, and once shut down its
 *           kernel socket's FIN came at the shutdown, so the parent never found it dead and
 *           waited for room for ever.)
 *   undecided: the child connects, sends "u" and exits before the parent accepts (it does
 *           300 ms later): the parent must read "u" and the end.  (With `memlan run` the
 *           Python test wants the fabric empty afterwards: the offer the exit handler withdrew
 *           kept its channel file's name.)
 *   lateshutcred: as lateshut, with the parent's effective uid 65534 while it sends (when run
 *           as root), so that it cannot open the fabric's files by name: it must still find the
 *           child gone.
 *   lateconn: as lateshut, but the thread connects to the parent anew after memlan's exit
 *           handler and sends "c" there: the parent must read "c" and the end on it.  (With
 *           `memlan run` the Python test wants the fabric empty afterwards: a connection made
 *           after the handler must not leave its channel file behind.)
 *   forklate: the child forks a grandchild that holds the connection too; the child puts
 *           "late" in a stdio stream on the socket and exits; the grandchild closes its copy
 *           once glibc's last flush in the child (after memlan's handler) has begun, and the
 *           child's stream is flushed after that: the parent must read "late" and the end.
 *           (Before: the child's handler gave its holders count back, so the grandchild's
 *           close was the last one and ended the connection under the child's flush.)
 *   taken:  the child connects and, touching the socket no more, exits once the parent has
 *           accepted: the parent must read the end.  (With `memlan run` the Python test wants
 *           the fabric empty afterwards: the child's offer, taken by then, is found taken only
 *           at exit, and its channel file kept its name.)
 *   peershutrd: the parent shuts its reading down, then sends 4 MiB; a thread of the child
 *           reads them all, starting only half a second after memlan's exit handler has run
 *           (glibc's last flush reaching a pipe tells it): every send must succeed, and the
 *           thread must read the 4 MiB.
 *   shutrddead: the parent shuts its reading down; the child exits at once; the parent sends
 *           until a send fails: it must fail (the child is gone), not time out.
 *   poll:   threads of the child busy-poll (epoll_wait and poll with timeout 0) and send while
 *           the main thread exits (before: the exit handler unmapped the process's event queue
 *           under the polling thread).  The child must exit with status 0.
 * A child's status other than exit 0 fails the round.  Prints "CASE rounds N bad B"; exit 1 if
 * B > 0.  Every wait is bounded (10 s a round).
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "twoends.h"

static struct sockaddr_in addr;
static int lfd;
static atomic_int started;
/* Shared with the children: [0] bytes whose send had returned; [1] a case's word (lateshut: the
 * shutdown was made; taken: the parent accepted). */
static atomic_ulong *counted;
static int dtor_fd = -1;

static int dial(void)
{
    int c = socket(AF_INET, SOCK_STREAM, 0);
    if (c < 0 || connect(c, (struct sockaddr *)&addr, sizeof addr) < 0)
        die("connect");
    return c;
}

__attribute__((destructor)) static void late_send(void)
{
    if (dtor_fd >= 0 && send(dtor_fd, "bye", 3, MSG_NOSIGNAL) != 3)
        _exit(3);
}

/* ---- the poll case's threads -------------------------------------------------------------- */

struct two {
    int a, b;
};

static void *epoller(void *p)
{
    struct two *t = p;
    int ep = epoll_create1(0);
    struct epoll_event ev = {.events = EPOLLIN, .data.fd = t->a};
    if (ep < 0 || epoll_ctl(ep, EPOLL_CTL_ADD, t->a, &ev) < 0)
        die("epoll");
    atomic_fetch_add(&started, 1);
    char buf[64];
    for (unsigned long i = 0; i < 200000000ul; i++) { /* bounded; exit() ends it long before */
        struct epoll_event got[4];
        if (epoll_wait(ep, got, 4, 0) > 0 && recv(t->a, buf, sizeof buf, MSG_DONTWAIT) < 0 &&
            errno != EAGAIN)
            break;
        if ((i & 63) == 0)
            (void)send(t->b, "x", 1, MSG_DONTWAIT | MSG_NOSIGNAL);
    }
    return NULL;
}

static void *poller(void *p)
{
    struct two *t = p;
    atomic_fetch_add(&started, 1);
    for (unsigned long i = 0; i < 200000000ul; i++) {
        struct pollfd pf = {.fd = t->a, .events = POLLIN};
        (void)poll(&pf, 1, 0);
    }
    return NULL;
}

/* lateshut: the thread that shuts down once the exit handler has run. */
struct late {
    int c, rd, readall;
    int conn; /* lateconn: connect anew instead of shutting c down */
};

static void *late_shut(void *p)
{
    struct late *l = p;
    char buf[65536];
    atomic_fetch_add(&started, 1);
    if (read(l->rd, buf, 1) != 1) /* glibc's flush has begun: memlan's handler has run */
        _exit(4);
    if (l->readall) { /* peershutrd: read it all, beginning late */
        struct timespec hs = {0, 500000000};
        nanosleep(&hs, NULL);
        unsigned long t = 0;
        for (;;) {
            ssize_t n = recv(l->c, buf, sizeof buf, 0);
            if (n <= 0)
                break;
            t += (unsigned long)n;
        }
        atomic_store(&counted[1], t);
    } else if (l->conn) {
        int n = dial();
        if (send(n, "c", 1, 0) != 1)
            _exit(6);
    } else if (shutdown(l->c, SHUT_WR) != 0) {
        _exit(4);
    }
    if (!l->readall)
        atomic_store(&counted[1], 1);
    for (size_t got = 1; got < (256u << 10) + 1;) { /* let the flush end, and the process */
        ssize_t n = read(l->rd, buf, sizeof buf);
        if (n <= 0)
            _exit(5);
        got += (size_t)n;
    }
    return NULL;
}

/* Sends to the parent and counts what each send took. */
static void *sender(void *p)
{
    int fd = *(int *)p;
    char buf[1024];
    memset(buf, 'x', sizeof buf);
    atomic_fetch_add(&started, 1);
    for (unsigned long i = 0; i < 200000000ul; i++) {
        ssize_t n = send(fd, buf, sizeof buf, MSG_NOSIGNAL);
        if (n < 0)
            break;
        atomic_fetch_add(counted, (unsigned long)n);
    }
    return NULL;
}

/* A connection within the child, through a listener of its own (any free port). */
static void local_pair(struct two *t)
{
    static int l2 = -1;
    static struct sockaddr_in a2;
    if (l2 < 0) {
        socklen_t len = sizeof a2;
        a2.sin_family = AF_INET;
        a2.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        l2 = socket(AF_INET, SOCK_STREAM, 0);
        if (l2 < 0 || bind(l2, (struct sockaddr *)&a2, sizeof a2) < 0 || listen(l2, 8) < 0 ||
            getsockname(l2, (struct sockaddr *)&a2, &len) < 0)
            die("listen 2");
    }
    t->a = socket(AF_INET, SOCK_STREAM, 0);
    if (t->a < 0 || connect(t->a, (struct sockaddr *)&a2, sizeof a2) < 0)
        die("connect 2");
    t->b = accept(l2, NULL, NULL);
    if (t->b < 0)
        die("accept 2");
}

static void child(const char *cas, unsigned round)
{
    int c = dial();
    char k;
    if (!strcmp(cas, "taken")) {
        for (int i = 0; i < 10000 && !atomic_load(&counted[1]); i++) { /* 10 s at most */
            struct timespec ms = {0, 1000000};
            nanosleep(&ms, NULL);
        }
        exit(0);
    }
    if (!strcmp(cas, "undecided")) {
        if (send(c, "u", 1, 0) != 1)
            die("send");
        exit(0);
    }
    if (recv(c, &k, 1, MSG_WAITALL) != 1) /* the parent has accepted: the connection is settled */
        die("recv");
    pthread_t th;
    if (!strcmp(cas, "shutrddead"))
        exit(0);
    if (!strcmp(cas, "linger")) {
        struct linger lg = {1, 0};
        if (setsockopt(c, SOL_SOCKET, SO_LINGER, &lg, sizeof lg) < 0 || send(c, "a", 1, 0) != 1)
            die("linger");
        exit(0);
    }
    if (!strcmp(cas, "shared")) {
        pid_t g = fork(); /* it holds the connection too, and leaves by exit() at once */
        if (g == 0)
            exit(0);
        int st;
        if (g < 0 || waitpid(g, &st, 0) != g || !WIFEXITED(st) || WEXITSTATUS(st) != 0)
            die("grandchild");
        if (send(c, "s", 1, 0) != 1)
            die("send");
        exit(0);
    }
    if (!strcmp(cas, "forklate")) {
        static char sb[(256u << 10) + 4096];
        int p[2];
        FILE *late = fdopen(dup(c), "w"); /* opened first: flushed last (glibc's list) */
        FILE *f;
        if (!late || fputs("late", late) < 0 || pipe(p) != 0)
            die("forklate");
        pid_t g = fork();
        if (g < 0)
            die("fork");
        if (g == 0) { /* the grandchild: close c once the child's flush has begun */
            char buf[65536];
            close(p[1]);
            if (read(p[0], buf, 1) != 1)
                _exit(4);
            close(c);
            close(fileno(late)); /* its copy of the stream's fd: the socket's last in it */
            for (size_t got = 1; got < (256u << 10) + 1;) {
                ssize_t n = read(p[0], buf, sizeof buf);
                if (n <= 0)
                    _exit(5);
                got += (size_t)n;
            }
            _exit(0);
        }
        close(p[0]);
        if (!(f = fdopen(p[1], "w")) || setvbuf(f, sb, _IOFBF, sizeof sb) != 0)
            die("pipe");
        for (int i = 0; i < (256 << 10) + 1; i++) /* flushed first, until the grandchild reads */
            fputc(i ? 'z' : 'Z', f);
        exit(0);
    }
    if (!strcmp(cas, "lateshut") || !strcmp(cas, "lateshutcred") || !strcmp(cas, "lateconn") ||
        !strcmp(cas, "peershutrd")) {
        static struct late l;
        int p[2];
        static char sb[(256u << 10) + 4096]; /* the stream's buffer: a pipe takes 64 KiB */
        FILE *f;
        if (pipe(p) != 0 || !(f = fdopen(p[1], "w")) || setvbuf(f, sb, _IOFBF, sizeof sb) != 0)
            die("pipe");
        fputc('Z', f);
        for (int i = 0; i < 256 << 10; i++) /* in the stream's buffer until exit's flush */
            fputc('z', f);
        l.c = c;
        l.rd = p[0];
        l.conn = !strcmp(cas, "lateconn");
        l.readall = !strcmp(cas, "peershutrd");
        if (pthread_create(&th, NULL, late_shut, &l) != 0)
            die("pthread_create");
        while (atomic_load(&started) < 1)
            sched_yield();
        exit(0);
    }
    if (!strcmp(cas, "shutwr")) {
        if (send(c, "w", 1, 0) != 1 || shutdown(c, SHUT_WR) != 0 || recv(c, &k, 1, 0) != 0)
            die("shutwr");
        exit(0);
    }
    if (!strcmp(cas, "dtor")) {
        if (send(c, "a", 1, 0) != 1)
            die("send");
        FILE *f = fdopen(dup(c), "w");
        if (!f || fputs("-late", f) < 0) /* stays in the stream's buffer until exit's flush */
            die("fdopen");
        /* The destructor's "bye" must come before the stream's flush: glibc flushes after the
         * destructors, as exit(3) says. */
        dtor_fd = c;
        exit(0);
    }
    if (!strcmp(cas, "flush")) {
        size_t big = 4u << 20;
        char *b = malloc(big), *sb = malloc(big + 4096); /* glibc sizes only a buffer it is given */
        FILE *f = fdopen(dup(c), "w");
        if (!b || !sb || !f || setvbuf(f, sb, _IOFBF, big + 4096) != 0)
            die("fdopen");
        memset(b, 'f', big);
        /* It stays in the stream's buffer until exit's flush. */
        for (size_t o = 0; o < big; o += 65536)
            if (fwrite(b + o, 1, 65536, f) != 65536)
                die("fwrite");
        exit(0);
    }
    int want = 1;
    if (pthread_create(&th, NULL, sender, &c) != 0)
        die("pthread_create");
    if (!strcmp(cas, "poll")) {
        static struct two e, p;
        local_pair(&e);
        local_pair(&p);
        void *(*fn[])(void *) = {epoller, poller};
        void *arg[] = {&e, &p};
        for (int i = 0; i < 2; i++)
            if (pthread_create(&th, NULL, fn[i], arg[i]) != 0)
                die("pthread_create");
        want = 3;
    }
    while (atomic_load(&started) < want)
        sched_yield();
    /* Let them run a little, a different while each round, then leave. */
    struct timespec ts = {0, 200000 + (long)(round % 7) * 150000};
    nanosleep(&ts, NULL);
    exit(0);
}

static uint64_t now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000 + (uint64_t)t.tv_nsec / 1000000;
}

/* One round: the child's connection accepted and read to its end. */
static int round_once(const char *cas, unsigned r)
{
    int bad = 0;
    atomic_store(counted, 0);
    atomic_store(&counted[1], 0);
    fflush(stdout);
    pid_t pid = fork();
    if (pid < 0)
        die("fork");
    if (pid == 0)
        child(cas, r);
    if (!strcmp(cas, "undecided")) { /* the child's offer waits; the child is gone first */
        struct timespec ts = {0, 300000000};
        nanosleep(&ts, NULL);
    }
    int a = accept(lfd, NULL, NULL);
    if (a < 0 || (strcmp(cas, "undecided") && strcmp(cas, "taken") && send(a, "k", 1, 0) != 1))
        die("accept");
    if (!strcmp(cas, "taken"))
        atomic_store(&counted[1], 1);
    struct timeval tv = {10, 0};
    setsockopt(a, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    if (!strcmp(cas, "shutrddead") && shutdown(a, SHUT_RD) != 0)
        die("shutdown");
    if (!strcmp(cas, "peershutrd")) { /* the child reads all of it, late; then it ends */
        static char big[65536];
        setsockopt(a, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
        if (shutdown(a, SHUT_RD) != 0)
            die("shutdown");
        for (int i = 0; i < 64; i++) {
            if (send(a, big, sizeof big, MSG_NOSIGNAL) != (ssize_t)sizeof big) {
                printf("round %u: send %d to the live child: %s\n", r, i, strerror(errno));
                bad = 1;
                break;
            }
        }
        shutdown(a, SHUT_WR); /* the child's reads end */
    }
    if (!strcmp(cas, "flush")) { /* the child's flush meets a full ring, and waits */
        struct timespec hs = {0, 500000000};
        nanosleep(&hs, NULL);
    }
    char got[64] = {0};
    size_t have = 0;
    unsigned long total = 0;
    int err = 0;
    for (;;) {
        char buf[65536];
        ssize_t n = recv(a, buf, sizeof buf, 0);
        if (n <= 0) {
            err = n < 0 ? errno : 0;
            break;
        }
        if (have + (size_t)n < sizeof got) {
            memcpy(got + have, buf, (size_t)n);
            have += (size_t)n;
        }
        total += (unsigned long)n;
    }
    if (!strcmp(cas, "lateshut") || !strcmp(cas, "lateshutcred") || !strcmp(cas, "shutrddead")) {
        /* The child's end came by its shutdown, after its exit handler: now send until the
         * process's end fails a send (64 MiB at most; SO_SNDTIMEO bounds each wait). */
        int cred = !strcmp(cas, "lateshutcred") && geteuid() == 0;
        setsockopt(a, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
        if (cred && seteuid(65534) != 0)
            die("seteuid");
        static char big[65536];
        int serr = 0;
        for (int i = 0; i < 1024 && !serr; i++)
            if (send(a, big, sizeof big, MSG_NOSIGNAL) < 0)
                serr = errno;
        if (cred && seteuid(0) != 0)
            die("seteuid back");
        if (serr != EPIPE && serr != ECONNRESET) {
            printf("round %u: the sends to the gone child ended with %s\n", r,
                   serr ? strerror(serr) : "none failing");
            bad = 1;
        }
    }
    close(a);
    if (!strcmp(cas, "lateconn")) { /* the second connection, made after the handler */
        int a2 = accept(lfd, NULL, NULL);
        char b2[8];
        ssize_t n2 = -1;
        if (a2 >= 0) {
            setsockopt(a2, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
            n2 = recv(a2, b2, sizeof b2, MSG_WAITALL); /* "c", then the end */
        }
        if (n2 != 1 || b2[0] != 'c') {
            printf("round %u: the late connection gave %zd\n", r, n2);
            bad = 1;
        }
        if (a2 >= 0)
            close(a2);
    }
    int st;
    uint64_t t0 = now_ms();
    while (waitpid(pid, &st, WNOHANG) != pid) {
        if (now_ms() - t0 > 10000) {
            kill(pid, SIGKILL);
            waitpid(pid, &st, 0);
            printf("round %u: the child hung\n", r);
            return 1;
        }
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
    if (WIFSIGNALED(st)) {
        printf("round %u: the child was killed by signal %d\n", r, WTERMSIG(st));
        bad = 1;
    } else if (WEXITSTATUS(st) != 0) {
        printf("round %u: the child's status was %d\n", r, WEXITSTATUS(st));
        bad = 1;
    }
    if (!strcmp(cas, "linger")) {
        if (err != ECONNRESET) {
            printf("round %u: recv ended with %s, not a reset\n", r, err ? strerror(err) : "EOF");
            bad = 1;
        }
    } else if (err) {
        printf("round %u: recv: %s\n", r, strerror(err));
        bad = 1;
    }
    if ((!strcmp(cas, "lateshut") || !strcmp(cas, "lateshutcred")) &&
        (have != 0 || atomic_load(&counted[1]) != 1)) {
        printf("round %u: read %zu bytes before the end, the shutdown %s\n", r, have,
               atomic_load(&counted[1]) ? "made" : "not made");
        bad = 1;
    }
    if (!strcmp(cas, "peershutrd") && atomic_load(&counted[1]) != 64ul << 16) {
        printf("round %u: the child read %lu bytes of 4 MiB\n", r, atomic_load(&counted[1]));
        bad = 1;
    }
    if (!strcmp(cas, "forklate") && strcmp(got, "late") != 0) {
        printf("round %u: read \"%s\", not \"late\"\n", r, got);
        bad = 1;
    }
    if (!strcmp(cas, "undecided") && strcmp(got, "u") != 0) {
        printf("round %u: read \"%s\", not \"u\"\n", r, got);
        bad = 1;
    }
    if (!strcmp(cas, "shutwr") && strcmp(got, "w") != 0) {
        printf("round %u: read \"%s\", not \"w\"\n", r, got);
        bad = 1;
    }
    if (!strcmp(cas, "shared") && strcmp(got, "s") != 0) {
        printf("round %u: read \"%s\", not \"s\"\n", r, got);
        bad = 1;
    }
    if (!strcmp(cas, "dtor") && strcmp(got, "abye-late") != 0) {
        printf("round %u: read \"%s\", not \"abye-late\"\n", r, got);
        bad = 1;
    }
    if (!strcmp(cas, "flush") && total != 4u << 20) {
        printf("round %u: read %lu bytes of the %u the stream held\n", r, total, 4u << 20);
        bad = 1;
    }
    unsigned long c = atomic_load(counted);
    if (!strcmp(cas, "thread") || !strcmp(cas, "poll")) {
        if (total < c) {
            printf("round %u: read %lu bytes of the %lu whose send had returned\n", r, total, c);
            bad = 1;
        }
    }
    return bad;
}

int main(int argc, char **argv)
{
    if (argc < 3)
        return 2;
    const char *cas = argv[2];
    unsigned rounds = argc > 3 ? (unsigned)atoi(argv[3]) : 20;
    signal(SIGPIPE, SIG_IGN);
    counted = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (counted == MAP_FAILED)
        die("mmap");
    lfd = listen_here(atoi(argv[1]), &addr);
    unsigned bad = 0;
    for (unsigned r = 0; r < rounds; r++)
        bad += (unsigned)round_once(cas, r);
    printf("%s rounds %u bad %u\n", cas, rounds, bad);
    return bad ? 1 : 0;
}

/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/* sigbusconf: SIGBUS as the program set it, with an accelerated connection open (under memlan
 * the guard's handler is then in the kernel): the program's handler gets its faults with the
 * kernel's code and address, sigaction reports what the program installed, SA_RESETHAND is
 * one-shot, signal() and SIG_IGN behave, the default action kills with SIGBUS (a fault and a
 * sent signal), and the connection still works.  Printed line by line for a comparison with
 * kernel TCP. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <setjmp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

static sigjmp_buf jb;
static volatile sig_atomic_t runs, last_code;
static void *volatile last_addr;

static void die(const char *what)
{
    printf("FAIL %s: %s\n", what, strerror(errno));
    exit(1);
}

static void on_bus(int sig, siginfo_t *si, void *uc)
{
    (void)sig;
    (void)uc;
    runs++;
    last_code = si->si_code;
    last_addr = si->si_addr;
    siglongjmp(jb, 1);
}

static void on_bus_plain(int sig)
{
    (void)sig;
    runs++;
    siglongjmp(jb, 1);
}

/* A file of ours, mapped, then shrunk: its second page faults. */
static volatile unsigned char *shrunk_map(void)
{
    char path[] = "/tmp/sigbusconf-XXXXXX";
    int fd = mkstemp(path);
    if (fd < 0 || ftruncate(fd, 8192) < 0)
        die("file");
    unlink(path);
    volatile unsigned char *m = mmap(NULL, 8192, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (m == MAP_FAILED)
        die("mmap");
    m[0] = 1;
    if (ftruncate(fd, 0) < 0)
        die("ftruncate");
    close(fd);
    return m;
}

static const char *disp(void)
{
    struct sigaction o;
    if (sigaction(SIGBUS, NULL, &o) < 0)
        return "error";
    void *fn = (o.sa_flags & SA_SIGINFO) ? (void *)o.sa_sigaction : (void *)o.sa_handler;
    if (fn == (void *)SIG_DFL)
        return "default";
    if (fn == (void *)SIG_IGN)
        return "ignored";
    if (fn == (void *)on_bus)
        return (o.sa_flags & SA_SIGINFO) ? "on_bus, siginfo" : "on_bus, no siginfo";
    if (fn == (void *)on_bus_plain)
        return "on_bus_plain";
    return "someone else's";
}

static void no_core(void)
{
    struct rlimit r = {0, 0};
    setrlimit(RLIMIT_CORE, &r);
}

static int child_status(pid_t pid)
{
    int st;
    if (waitpid(pid, &st, 0) != pid)
        return -1;
    return WIFSIGNALED(st) ? 1000 + WTERMSIG(st) : WEXITSTATUS(st);
}

static void echo(int c, int s, const char *tag)
{
    char buf[16] = {0};
    if (send(c, "ping", 4, 0) != 4 || recv(s, buf, sizeof buf, 0) != 4)
        die(tag);
    printf("%s: connection works: %s\n", tag, buf);
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: sigbusconf PORT\n");
        return 2;
    }
    setvbuf(stdout, NULL, _IONBF, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((unsigned short)atoi(argv[1])),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    int l = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (l < 0 || bind(l, (struct sockaddr *)&a, sizeof a) < 0 || listen(l, 4) < 0)
        die("listen");
    int c = socket(AF_INET, SOCK_STREAM, 0);
    if (c < 0 || connect(c, (struct sockaddr *)&a, sizeof a) < 0)
        die("connect");
    int s = accept(l, NULL, NULL);
    if (s < 0)
        die("accept");
    echo(c, s, "start");
    printf("A disposition: %s\n", disp());

    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_bus;
    sa.sa_flags = SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    struct sigaction old;
    if (sigaction(SIGBUS, &sa, &old) < 0)
        die("sigaction");
    printf("B old: %s\n", old.sa_handler == SIG_DFL ? "default" : "other");
    printf("B disposition: %s\n", disp());
    volatile unsigned char *m = shrunk_map();
    if (sigsetjmp(jb, 1) == 0) {
        m[4096] = 2;
        printf("B no fault\n");
    }
    printf("B handler runs %d, code %s, address %s\n", (int)runs,
           last_code == BUS_ADRERR ? "BUS_ADRERR" : "other",
           last_addr == (void *)(m + 4096) ? "the access's" : "other");
    if (sigsetjmp(jb, 1) == 0) {
        kill(getpid(), SIGBUS);
        printf("C sent signal not delivered\n");
    }
    printf("C handler runs %d, code %s\n", (int)runs, last_code == SI_USER ? "SI_USER" : "other");

    sa.sa_flags = SA_SIGINFO | SA_RESETHAND;
    sigaction(SIGBUS, &sa, NULL);
    if (sigsetjmp(jb, 1) == 0)
        m[4096] = 3;
    printf("D one-shot handler runs %d, then: %s\n", (int)runs, disp());

    signal(SIGBUS, on_bus_plain); /* glibc's own path to the kernel */
    printf("E after signal(): %s\n", disp());
    if (sigsetjmp(jb, 1) == 0)
        m[4096] = 4;
    printf("E handler runs %d\n", (int)runs);
    if (sigaction(SIGBUS, &sa, NULL) < 0) /* back through sigaction */
        die("sigaction");
    sa.sa_flags = SA_SIGINFO;
    sigaction(SIGBUS, &sa, NULL);
    if (sigsetjmp(jb, 1) == 0)
        m[4096] = 5;
    printf("E2 handler runs %d, %s\n", (int)runs, disp());

    signal(SIGBUS, SIG_IGN);
    printf("F ignored: %s\n", disp());
    kill(getpid(), SIGBUS);
    printf("F sent signal ignored\n");
    pid_t pid = fork();
    if (pid == 0) {
        no_core();
        m[4096] = 6; /* an ignored fault: the kernel's default all the same */
        _exit(3);
    }
    printf("F child's fault while ignored: %d\n", child_status(pid));

    struct sigaction dfl;
    memset(&dfl, 0, sizeof dfl);
    dfl.sa_handler = SIG_DFL;
    sigaction(SIGBUS, &dfl, NULL);
    printf("G disposition: %s\n", disp());
    pid = fork();
    if (pid == 0) {
        no_core();
        echo(c, s, "G child");
        m[4096] = 7;
        _exit(3);
    }
    printf("G child's fault: %d\n", child_status(pid));
    pid = fork();
    if (pid == 0) {
        no_core();
        kill(getpid(), SIGBUS);
        _exit(3);
    }
    printf("G child sent SIGBUS: %d\n", child_status(pid));

    /* signal()'s answer saved and put back (under memlan: our handler, now without
     * SA_SIGINFO): the default all the same. */
    __sighandler_t saved = signal(SIGBUS, on_bus_plain);
    signal(SIGBUS, saved);
    printf("H put back: %s\n", disp());
    pid = fork();
    if (pid == 0) {
        no_core();
        m[4096] = 8;
        _exit(3);
    }
    printf("H child's fault: %d\n", child_status(pid));
    pid = fork();
    if (pid == 0) {
        no_core();
        kill(getpid(), SIGBUS);
        _exit(3);
    }
    printf("H child sent SIGBUS: %d\n", child_status(pid));
    echo(c, s, "end");
    close(c);
    close(s);
    close(l);
    printf("done\n");
    return 0;
}

/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/* endpoint-trust: named endpoints against careless and hostile neighbours (issue 20).
 *
 * 1. memlan_connect with timeout 0 reaches a server blocked in memlan_accept (it always failed
 *    with -ETIMEDOUT: the server's answer cannot come in no time at all).
 * 2. A fork child that closes the listener it inherited leaves the parent's name served (it
 *    removed ep-NAME and ep-NAME.sock: the next client got -ECONNREFUSED).
 * 3. A sweep running beside a server that takes over a dead server's name never makes the
 *    listen fail nor takes the new server's socket (memlan_listen said -EADDRINUSE while the
 *    sweep held the name's lock for a moment, and the sweep removed ep-NAME.sock after the lock
 *    file, by then possibly the new server's).
 * 4. (as root) The server attaches only a channel its connecting user created (SO_PEERCRED
 *    against the file's owner): a client of another uid that sends the token of root's channel
 *    is answered -EACCES, root's channel stays unattached; that user's own channel is taken. */
#include "test.h"

#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>

static void reap_ok(pid_t pid)
{
    int st;
    ASSERT_EQ(waitpid(pid, &st, 0), pid);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
        fprintf(stderr, "child %d: status %#x\n", (int)pid, st);
    ASSERT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0);
}

static void serve_one(memlan_listener_t *l)
{
    memlan_channel_t *ch;
    char buf[16];
    ASSERT_OK(memlan_accept(l, 5000, &ch));
    ASSERT_EQ(memlan_recv(ch, buf, sizeof buf, 0), 5);
    ASSERT_EQ(memlan_send(ch, "HELLO", 5, 0), 5);
    memlan_channel_close(ch);
}

/* A client in a child: connect with timeout_ms, say hello, expect the answer. */
static pid_t client(memlan_fabric_t *fab, const char *name, int timeout_ms)
{
    pid_t pid = fork();
    if (pid == 0) {
        memlan_channel_t *ch;
        int r = memlan_connect(fab, name, NULL, timeout_ms, &ch);
        if (r != 0) {
            fprintf(stderr, "connect %s (timeout %d): %d\n", name, timeout_ms, r);
            _exit(1);
        }
        char buf[16];
        ASSERT_EQ(memlan_send(ch, "hello", 5, 0), 5);
        ASSERT_EQ(memlan_recv(ch, buf, sizeof buf, 0), 5);
        memlan_channel_close(ch);
        _exit(0);
    }
    return pid;
}

/* The endpoint's hello, as endpoint.c sends it. */
struct hello {
    uint32_t magic, version;
    char token[MEMLAN_TOKEN_LEN + 1];
    char pad[7];
};

static int32_t raw_hello(const char *name, const char *token)
{
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    if (snprintf(sa.sun_path, sizeof sa.sun_path, "%.60s/ep-%.40s.sock", ml_test_dir, name) < 0)
        return -999;
    int s = socket(AF_UNIX, SOCK_SEQPACKET, 0);
    if (s < 0 || connect(s, (struct sockaddr *)&sa, sizeof sa) < 0)
        return -1000 - errno;
    struct hello h = {.magic = 0x6d6c6570u, .version = 1};
    memcpy(h.token, token, MEMLAN_TOKEN_LEN);
    int32_t answer = -2000;
    struct pollfd pf = {s, POLLIN, 0};
    if (send(s, &h, sizeof h, 0) == (ssize_t)sizeof h && poll(&pf, 1, 5000) == 1 &&
        recv(s, &answer, sizeof answer, 0) != (ssize_t)sizeof answer)
        answer = -3000;
    close(s);
    return answer;
}

int main(int argc, char **argv)
{
    int only = argc > 1 ? atoi(argv[1]) : 0; /* run one case only */
    ml_test_watchdog(120);
    memlan_fabric_t *fab = ml_test_fabric();
    memlan_listener_t *l;
    memlan_channel_t *ch;
    pid_t c;

    /* 1 */
    if (!only || only == 1) {
    ASSERT_OK(memlan_listen(fab, "zero", 0, &l));
    c = client(fab, "zero", 0);
    serve_one(l);
    reap_ok(c);
    memlan_listener_close(l);
    printf("1. connect with timeout 0: ok\n");
    }

    /* 2 */
    if (!only || only == 2) {
    ASSERT_OK(memlan_listen(fab, "forked", 0, &l));
    pid_t k = fork();
    if (k == 0) {
        memlan_listener_close(l); /* the child's copy: e.g. a prefork worker tidying up */
        _exit(0);
    }
    reap_ok(k);
    c = client(fab, "forked", 5000);
    serve_one(l);
    reap_ok(c);
    memlan_listener_close(l);
    ASSERT_EQ(memlan_connect(fab, "forked", NULL, 100, &ch), -ECONNREFUSED);
    printf("2. a fork child's close leaves the name: ok\n");
    }

    /* 3 */
    if (!only || only == 3) {
    pid_t sweeper = fork();
    if (sweeper == 0) {
        memlan_fabric_t *f;
        ASSERT_OK(memlan_fabric_open(ml_test_dir, &f));
        for (;;)
            (void)memlan_fabric_clean(f);
    }
    int refused = 0, lost = 0, rounds = 0;
    uint64_t end = ml_test_now_ns() + 6000000000ull;
    char sockpath[300];
    snprintf(sockpath, sizeof sockpath, "%s/ep-race.sock", ml_test_dir);
    while (rounds < 400 && ml_test_now_ns() < end) {
        rounds++;
        pid_t d = fork();
        if (d == 0) { /* a server that dies without closing: its files stay */
            memlan_listener_t *dl;
            _exit(memlan_listen(fab, "race", 0, &dl) == 0 ? 0 : 1);
        }
        int st;
        waitpid(d, &st, 0);
        int r = memlan_listen(fab, "race", 0, &l);
        if (r == -EADDRINUSE) {
            refused++;
            continue;
        }
        ASSERT_OK(r);
        struct stat sb;
        for (int i = 0; i < 20; i++) { /* our socket stays while we serve */
            if (stat(sockpath, &sb) != 0) {
                lost++;
                break;
            }
            sched_yield();
        }
        memlan_listener_close(l);
    }
    kill(sweeper, SIGKILL);
    waitpid(sweeper, NULL, 0);
    printf("3. listen beside a sweep: %d rounds, %d refused, %d sockets lost\n", rounds, refused,
           lost);
    ASSERT_EQ(refused, 0);
    ASSERT_EQ(lost, 0);
    (void)memlan_fabric_clean(fab);
    }

    /* 4 */
    if (only && only != 4) {
    } else if (geteuid() != 0) {
        printf("4. skipped (not root)\n");
    } else {
        ASSERT_EQ(chmod(ml_test_dir, 01777), 0); /* a fabric shared on purpose */
        memlan_fabric_t *shared;
        ASSERT_OK(memlan_fabric_open(ml_test_dir, &shared));
        memlan_channel_t *roots;
        ASSERT_OK(memlan_channel_create(shared, NULL, &roots));
        ASSERT_OK(memlan_listen(shared, "guarded", 0, &l));
        char token[MEMLAN_TOKEN_LEN + 1];
        snprintf(token, sizeof token, "%s", memlan_channel_token(roots));
        pid_t n = fork();
        if (n == 0) {
            if (setgid(65534) || setuid(65534))
                _exit(2);
            int32_t a = raw_hello("guarded", token);
            if (a != -EACCES) {
                fprintf(stderr, "another user's token: answer %d\n", (int)a);
                _exit(1);
            }
            /* Its own channel is taken. */
            memlan_fabric_t *f;
            memlan_channel_t *mine;
            if (memlan_fabric_open(ml_test_dir, &f) < 0 ||
                memlan_connect(f, "guarded", NULL, 5000, &mine) < 0)
                _exit(3);
            char buf[16];
            if (memlan_send(mine, "hello", 5, 0) != 5 || memlan_recv(mine, buf, 5, 0) != 5)
                _exit(4);
            memlan_channel_close(mine);
            memlan_fabric_close(f);
            _exit(0);
        }
        serve_one(l); /* the nobody user's own channel, and not root's */
        reap_ok(n);
        ASSERT_EQ(memlan_accept(l, 200, &ch), -ETIMEDOUT);
        ASSERT_EQ(memlan_channel_wait_peer(roots, 0), -ETIMEDOUT); /* nobody attached it */
        memlan_listener_close(l);
        memlan_channel_close(roots);
        memlan_fabric_close(shared);
        ASSERT_EQ(chmod(ml_test_dir, 0700), 0);
        printf("4. another user's token refused, its own channel taken: ok\n");
    }
    ml_test_fabric_empty(fab);
    printf("endpoint-trust: ok\n");
    return 0;
}

/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/* endpoint-names: named endpoints.  A client connects by name and gets a channel the server has
 * attached; bad names are refused; a live server's name is refused to a second server and a
 * SIGKILLed server's name is reclaimed; the kind filter refuses the other kind; accept times
 * out, answers -EAGAIN with timeout 0, and its fd wakes a poll loop; nothing is left behind. */
#include "test.h"

#include <poll.h>
#include <signal.h>
#include <sys/wait.h>

static pid_t client(memlan_fabric_t *fab, const char *name, int kind, int expect)
{
    pid_t pid = fork();
    if (pid == 0) {
        struct memlan_channel_opts o = {.kind = kind};
        memlan_channel_t *ch;
        int r = memlan_connect(fab, name, &o, 5000, &ch);
        if (r != expect) {
            fprintf(stderr, "connect: %d, expected %d\n", r, expect);
            _exit(1);
        }
        if (r == 0) {
            char buf[16];
            ASSERT_EQ(memlan_send(ch, "hello", 5, 0), 5);
            ASSERT_EQ(memlan_recv(ch, buf, sizeof buf, 0), 5);
            ASSERT_TRUE(memcmp(buf, "HELLO", 5) == 0);
            memlan_channel_close(ch);
        }
        _exit(0);
    }
    return pid;
}

static void reap_ok(pid_t pid)
{
    int st;
    ASSERT_EQ(waitpid(pid, &st, 0), pid);
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

/* A server in a child that listens on name, says so, and waits to be killed. */
static pid_t doomed_server(memlan_fabric_t *fab, const char *name, int pfd[2])
{
    char c;
    pid_t srv = fork();
    if (srv == 0) {
        memlan_listener_t *dl;
        ASSERT_OK(memlan_listen(fab, name, 0, &dl));
        ASSERT_EQ(write(pfd[1], "r", 1), 1);
        pause();
        _exit(0);
    }
    ASSERT_EQ(read(pfd[0], &c, 1), 1);
    return srv;
}

int main(void)
{
    memlan_fabric_t *fab = ml_test_fabric();
    memlan_listener_t *l, *l2;
    memlan_channel_t *ch;
    char longname[MEMLAN_NAME_MAX + 2];
    memset(longname, 'x', sizeof longname - 1);
    longname[sizeof longname - 1] = 0;

    /* Bad names. */
    ASSERT_EQ(memlan_listen(fab, "a/b", 0, &l), -EINVAL);
    ASSERT_EQ(memlan_listen(fab, "", 0, &l), -EINVAL);
    ASSERT_EQ(memlan_listen(fab, "tab\there", 0, &l), -EINVAL);
    ASSERT_EQ(memlan_listen(fab, "a.sock", 0, &l), -EINVAL); /* would be taken for a rendezvous */
    ASSERT_EQ(memlan_listen(fab, longname, 0, &l), -ENAMETOOLONG);
    ASSERT_EQ(memlan_listen(fab, "k", 7, &l), -EINVAL);
    ASSERT_EQ(memlan_connect(fab, "../x", NULL, 100, &ch), -EINVAL);
    ASSERT_EQ(memlan_connect(fab, "nobody", NULL, 100, &ch), -ECONNREFUSED);

    /* A name, a client, a second server refused, timeouts. */
    ASSERT_OK(memlan_listen(fab, "echo", 0, &l));
    ASSERT_TRUE(strcmp(memlan_listener_name(l), "echo") == 0);
    ASSERT_EQ(memlan_listen(fab, "echo", 0, &l2), -EADDRINUSE);
    ASSERT_EQ(memlan_accept(l, 0, &ch), -EAGAIN);
    ASSERT_EQ(memlan_accept(l, 50, &ch), -ETIMEDOUT);
    pid_t c = client(fab, "echo", MEMLAN_STREAM, 0);
    serve_one(l);
    reap_ok(c);

    /* The fd wakes a poll loop; then accept(0) gives the channel. */
    c = client(fab, "echo", MEMLAN_MSG, 0);
    struct pollfd pf = {memlan_listener_fd(l), POLLIN, 0};
    int got = 0;
    for (int i = 0; i < 100 && !got; i++) {
        ASSERT_GE(poll(&pf, 1, 5000), 1);
        int r = memlan_accept(l, 0, &ch);
        if (r == -EAGAIN)
            continue; /* connected, hello not read yet: the fd stays readable for it */
        ASSERT_OK(r);
        got = 1;
    }
    ASSERT_TRUE(got);
    ASSERT_EQ(memlan_channel_kind(ch), MEMLAN_MSG);
    char buf[16];
    ASSERT_EQ(memlan_recv(ch, buf, sizeof buf, 0), 5);
    ASSERT_EQ(memlan_send(ch, "HELLO", 5, 0), 5);
    memlan_channel_close(ch);
    reap_ok(c);
    memlan_listener_close(l);
    ASSERT_EQ(memlan_connect(fab, "echo", NULL, 100, &ch), -ECONNREFUSED);

    /* The kind filter. */
    ASSERT_OK(memlan_listen(fab, "msgs", MEMLAN_MSG, &l));
    c = client(fab, "msgs", MEMLAN_STREAM, -EPROTOTYPE);
    ASSERT_EQ(memlan_accept(l, 500, &ch), -ETIMEDOUT);
    reap_ok(c);
    memlan_listener_close(l);

    /* A SIGKILLed server's name is reclaimed. */
    int pfd[2];
    ASSERT_OK(pipe(pfd));
    pid_t srv = doomed_server(fab, "phoenix", pfd);
    ASSERT_EQ(memlan_listen(fab, "phoenix", 0, &l), -EADDRINUSE);
    kill(srv, SIGKILL);
    waitpid(srv, NULL, 0);
    ASSERT_OK(memlan_listen(fab, "phoenix", 0, &l));
    c = client(fab, "phoenix", 0, 0);
    serve_one(l);
    reap_ok(c);
    memlan_listener_close(l);

    /* A dead server's files are swept by memlan_fabric_clean. */
    srv = doomed_server(fab, "ghost", pfd);
    kill(srv, SIGKILL);
    waitpid(srv, NULL, 0);
    ASSERT_EQ(memlan_connect(fab, "ghost", NULL, 100, &ch), -ECONNREFUSED);
    ASSERT_GE(memlan_fabric_clean(fab), 2);
    ml_test_fabric_empty(fab);
    printf("endpoint-names: ok\n");
    return 0;
}

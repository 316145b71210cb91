/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/*
 * pollroom: both ends of a connection stream at each other as socat relays do: poll for POLLIN
 * and POLLOUT, read what is there, and after POLLOUT write 8 KiB with a blocking write.  Over
 * kernel TCP POLLOUT means room for a third of the send buffer (sk_stream_is_writeable), so such
 * a write does not wait, and both ends finish.
 *
 * Under memlan POLLOUT meant one free byte in the ring: each end's 8 KiB write waited for the
 * other to read, and the other was waiting in its own write: both stuck for ever (two socat
 * relays, TCP-LISTEN,fork to TCP, echoing through cat, hung so).
 *
 * usage: pollroom PORT
 */
#include "twoends.h"

#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#define TOTAL (32L << 20)
#define PIECE 8192

static volatile sig_atomic_t in_write;

static void on_alarm(int sig)
{
    (void)sig;
    const char *m = in_write ? "stuck in a write after POLLOUT\n" : "stuck elsewhere\n";
    (void)!write(1, m, strlen(m));
    _exit(3);
}

/* Stream TOTAL bytes out and take TOTAL in; 0 when both are done. */
static int stream(int fd)
{
    static char out[PIECE], in[PIECE / 2];
    long sent = 0, got = 0;
    memset(out, 'x', sizeof out);
    signal(SIGALRM, on_alarm);
    alarm(20);
    while (sent < TOTAL || got < TOTAL) {
        struct pollfd p = {.fd = fd, .events = POLLIN | (sent < TOTAL ? POLLOUT : 0)};
        if (poll(&p, 1, -1) < 0)
            return 1;
        if ((p.revents & POLLOUT) && sent < TOTAL) {
            in_write = 1;
            ssize_t w = write(fd, out, PIECE);
            in_write = 0;
            if (w <= 0)
                return 2;
            sent += w;
        }
        if (p.revents & POLLIN) {
            ssize_t r = read(fd, in, sizeof in);
            if (r <= 0)
                return 2;
            got += r;
        }
    }
    alarm(0);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc != 2)
        return 2;
    setvbuf(stdout, NULL, _IOLBF, 0);
    struct sockaddr_in a;
    int l = listen_here(atoi(argv[1]), &a), s;
    int c = settled_pair(l, &a, &s);
    pid_t pid = fork();
    if (pid < 0)
        die("fork");
    if (pid == 0) {
        close(s);
        int r = stream(c);
        shutdown(c, SHUT_WR);
        _exit(r);
    }
    close(c);
    int r = stream(s);
    int st;
    waitpid(pid, &st, 0);
    printf("both ends streamed 32 MiB each way: %s\n",
           r == 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0 ? "yes" : "no");
    close(s);
    close(l);
    printf("done\n");
    return 0;
}

/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/*
 * poll.c - readiness over any mix of accelerated and kernel fds: one socket's readiness, poll,
 * ppoll, select, pselect and a blocking call's long sleep (epoll is epoll.c's, the process's
 * event queue and the per-thread wake-ups pqueue.c's; readiness.h is what the three share).
 *
 * An accelerated socket's data sits in a ring, not in its kernel socket, so its readiness is
 * computed from the channel.  To sleep, a waiter arms each channel's tripwire in event-queue mode
 * (the peer posts to our process's event queue and rings its doorbell, a FIFO, only when armed),
 * then sleeps in the real poll/epoll on its kernel fds plus the doorbell.  Each accelerated
 * socket's kernel fd is watched for POLLRDHUP only: nothing ever arrives on it but the FIN that
 * the kernel sends when the peer's last holder closes or dies, so a sleeping poller hears of a
 * dead peer at once and an idle one is never woken.  Before sleeping the waiter spins on the
 * channels for the spin budget, like a blocking recv.
 */
#include "preload.h"
#include "readiness.h"
#include "sys/sys.h"

#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
/* ---- one socket's readiness -------------------------------------------------------------- */

/* poll(2) bits of an accelerated or undecided socket; -1 when the kernel's answer is the truth. */
int mlp_revents(struct mlp_sock *s, int fd) { return mlp_revents_want(s, fd, -1); }

/* The same for a caller that keeps only the bits of want (and the errors): room is looked for
 * only when asked.  The look reads the peer's consumer line (tail), which the peer writes at
 * every receive: an epoll server of readers paid a line transfer per wait for it. */
int mlp_revents_want(struct mlp_sock *s, int fd, short want)
{
    if (s->type != MLP_CONN || !s->ch ||
        atomic_load_explicit(&s->disconnected, memory_order_relaxed)) /* the kernel's again */
        return -1;
    int st = s->state;
    if (st == MLP_UNDECIDED)
        st = mlp_decide(s, fd, false);
    if (st == MLP_TCP) {
        (void)mlp_tcp_catch_up(s, fd, false); /* push what the ring still holds to the kernel */
        return -1;
    }
    struct memlan_channel *ch = s->ch;
    /* Read-only, from the shared indices (__ml_chan_rx_avail_ro): we do not hold the
     * directions, and after fork our private indices may be a ring behind another process's. */
    if (st == MLP_UNDECIDED) {
        /* Writable only once the kernel's connect is done, as over TCP: a nonblocking connect
         * posts its offer at EINPROGRESS, and one still in SYN-SENT (an accept queue full)
         * said POLLOUT with SO_ERROR 0, "connected" to the program (tests/preload/
         * connectpending.c).  The kernel's answer while it is not writable: nothing yet, or
         * its error. */
        struct pollfd k = {.fd = fd, .events = POLLOUT};
        int saved = errno;
        int kr = mlp_real_poll(&k, 1, 0);
        errno = saved;
        if (kr == 1 && (k.revents & (POLLERR | POLLHUP | POLLNVAL)))
            return -1;
        int rev = 0;
        if (kr == 1 && (k.revents & POLLOUT) && __ml_chan_tx_free_ro(ch) != 0)
            rev |= POLLOUT | POLLWRNORM;
        return rev;
    }
    uint32_t ps = __ml_chan_peer_state(ch);
    bool dead = ch->peer_dead;
    bool rd_done = ps != ML_SIDE_OPEN || dead || ch->rd_eof_when_empty;
    int rev = 0;
    /* The bytes of SO_RCVLOWAT, or cannot tell (let recv look), or the end. */
    if (rd_done || __ml_chan_rx_inband_ro(ch)) /* (not an urgent byte out of line alone) */
        rev |= POLLIN | POLLRDNORM;
    if (rd_done)
        rev |= POLLRDHUP;
    if (ps == ML_SIDE_CLOSED || dead || ch->shut_wr ||
        ((want & (POLLOUT | POLLWRNORM)) && mlp_tx_roomy_ro(ch)))
        rev |= POLLOUT | POLLWRNORM;
    if (rd_done && ch->shut_wr) /* both ways shut, whoever shut them: our SHUT_RDWR too */
        rev |= POLLHUP;
    if (ml_unlikely((uint32_t)atomic_load_explicit(&s->zc_pend, memory_order_relaxed)))
        rev |= POLLERR; /* a MSG_ZEROCOPY completion waits on the error queue (negotiate.c) */
    if (rd_done) {
        int rs = mlp_reset_state(s, false); /* a reset: the kernel's socket is closed, HUP for good */
        if (rs)
            rev |= POLLHUP | (rs == 1 ? POLLERR : 0);
    }
    if (ch->rx.corrupt || ch->tx.corrupt)
        rev |= POLLERR;
    /* The peer's urgent byte is here, neither taken by recv(MSG_OOB) nor read past: POLLPRI
     * (select's except set), as TCP's TCP_URG_VALID (sock.c, mlp_send_urgent). */
    uint8_t ub;
    if ((__ml_chan_urg_state(ch, &ub, NULL, false) & (ML_URG_HERE | ML_URG_TAKEN)) == ML_URG_HERE)
        rev |= POLLPRI;
    return rev;
}

short mlp_sock_revents(struct mlp_sock *s, int fd, short events)
{
    int r = mlp_revents_want(s, fd, events);
    if (r < 0)
        return -1;
    return (short)(r & (events | POLLERR | POLLHUP | POLLNVAL));
}

/* Does s's peer say that it may not reach our queue (ML_SOCK_NOPOST: it changed credentials)?
 * Then its posts can be lost and we look again every millisecond rather than sleep on the queue.
 * Once one peer says so, epoll waits of this process nap too (they do not look per member),
 * until no peer has said it for two liveness intervals: a flag taken back (a refused post's,
 * channel.c) or a connection closed left every epoll wait napping for good (a review).  A
 * member whose peer still says it stays on its set's ready list and is looked at at each nap,
 * which says it again (epoll.c, the harvest). */
static _Atomic uint64_t mlp_nopost_ns; /* mlp_coarse_ns() when a peer last said it; 0: never */

/* Does the flagged peer say that it still reaches the queue our registration names (its reach
 * byte for our slot is our registration's tag: it posted there before its change, and keeps the
 * queue mapped)?  Then we sleep on it as before: an idle ssh client, whose sshd session process
 * dropped to the user for good, napped every millisecond for the session's life.  A queue made
 * since (a new epoll set's) it cannot reach: not there.  The peer writes both the byte and (it
 * can) our slot: a lie costs us only wake-ups, as withholding its posts does, and no sleep of
 * ours outlasts the liveness interval. */
static bool mlp_peer_reaches(struct mlp_sock *s, const struct ml_sock_side *peer)
{
    memlan_channel_t *ch = s->ch;
    if (!ch->evq || ch->evq_pid != (int32_t)__ml_pid() || ch->evq_ref >= ML_EVQ_REFS)
        return false;
    uint32_t i = ch->evq_ref;
    uint32_t w = ml_load_acquire(&((struct ml_sock_side *)peer)->reach[i / 4]);
    uint32_t got = (w >> (8 * (i % 4))) & 0xffu;
    if (!got)
        return false;
    struct ml_evq_ref mine;
    memcpy(&mine, &ch->rx_refs->rx[i], sizeof mine);
    return mine.valid == ML_REF_VALID && __ml_evq_ref_tag(&mine) == got;
}

bool mlp_peer_nopost(struct mlp_sock *s)
{
    if (!s->ch)
        return false;
    const struct ml_sock_side *peer = mlp_side_block(s->ch, 1 - s->side);
    if (!(ml_load_relaxed(&peer->flags) & ML_SOCK_NOPOST) || mlp_peer_reaches(s, peer))
        return false;
    uint64_t now = mlp_coarse_ns();
    if (now - ml_load_relaxed(&mlp_nopost_ns) > 100000000u)
        ml_store_relaxed(&mlp_nopost_ns, now);
    return true;
}

bool mlp_nopost_recent(void)
{
    uint64_t t = ml_load_relaxed(&mlp_nopost_ns);
    return t && mlp_coarse_ns() - t < 2 * (uint64_t)ML_LIVENESS_MAX_NS;
}

/*
 * The liveness interval a thread's waits start from.  A wait that sleeps on our queue looks at
 * the liveness interval (100 ms, doubling while quiet to 1 s); a program that waits again and
 * again for a second with nothing coming (curl's 1 s poll on an idle icecast2 stream) slept 100,
 * 200, 400 and 300 ms in each, four wake-ups a second where kernel TCP has one (an explorer's).
 * So a wait that ran out with nothing hands the interval it reached on to the thread's next
 * wait, if that comes within ML_LIVENESS_NS; so does a wait that answered with the program's own
 * fds alone (smbd's idle connection child woke for its own timer, and each time its next waits
 * slept 100, 200, 400 ms again: 48 wake-ups in 30 s, 6 over kernel TCP).  A wait that reported
 * a socket of ours starts the next afresh.  The bound on a wake-up owed by a peer that cannot
 * deliver it is then what one long quiet wait had already: 1 s.
 */
static __thread int64_t mlp_live_next __attribute__((tls_model("initial-exec")));
static __thread uint64_t mlp_live_by __attribute__((tls_model("initial-exec")));

int64_t mlp_live_begin(void)
{
    if (mlp_live_next > (int64_t)ML_LIVENESS_NS && mlp_coarse_ns() <= mlp_live_by)
        return mlp_live_next;
    return ML_LIVENESS_NS;
}

void mlp_live_end(int64_t live, int ret)
{
    mlp_live_next = ret == 0 ? live : 0;
    mlp_live_by = ret == 0 ? mlp_coarse_ns() + ML_LIVENESS_NS : 0;
}

/*
 * The brief wait on a ring's futex before a long sleep (poll's one socket, below; a blocking
 * call's slice, sock.c) is for a request and its answer, where the peer's send wakes this very
 * thread.  On an idle connection it is one more wake-up per wait: a program that polls, or
 * receives with SO_RCVTIMEO, a second at a time on a quiet socket woke twice a second where
 * kernel TCP wakes once.  So a wait on one socket that spent its slice and ran out with nothing
 * lets the thread's next wait on that socket, if it comes within ML_LIVENESS_NS, go straight to
 * the long sleep; a wait that returned anything else gives the slice back.  (The socket is
 * known by its address only: one that closed and whose record was reused costs a wake-up.)
 */
static __thread const void *mlp_idle_on __attribute__((tls_model("initial-exec")));
static __thread uint64_t mlp_idle_by __attribute__((tls_model("initial-exec")));

bool mlp_idle_skip(const void *s)
{
    return s && s == mlp_idle_on && mlp_coarse_ns() <= mlp_idle_by;
}

void mlp_idle_note(const void *s, bool idle)
{
    if (idle) {
        mlp_idle_on = s;
        mlp_idle_by = mlp_coarse_ns() + ML_LIVENESS_NS;
    } else if (s == mlp_idle_on) {
        mlp_idle_on = NULL;
    }
}

/* Arm s for the events asked; true if it turned ready meanwhile (do not sleep). */
bool mlp_arm(struct mlp_sock *s, short events, bool under_epmu)
{
    (void)mlp_peer_nopost(s);
    if (!mlp_queue_add(s, under_epmu))
        return false;
    uint32_t ev = 0;
    if (events & (POLLIN | POLLRDNORM | POLLRDHUP | POLLPRI)) /* POLLPRI: an urgent byte's */
        ev |= MEMLAN_EV_READ;
    if (events & (POLLOUT | POLLWRNORM))
        ev |= MEMLAN_EV_WRITE;
    if (!ev || !__ml_chan_arm_evq(s->ch, ev))
        return false;
    /* The channel's "ready" counts one free byte as room; ours is mlp_tx_room's (else a poll
     * with less room than that would look, arm and look again without sleeping).  A wait for
     * POLLPRI alone is ready for the urgent byte only: the ring's other bytes would make it look
     * ready at each arm, and report nothing (a spin: a review). */
    uint8_t b;
    bool rd = ((events & (POLLIN | POLLRDNORM | POLLRDHUP)) && __ml_chan_ready_ro(s->ch, 0, 0)) ||
              ((events & POLLPRI) && (__ml_chan_urg_state(s->ch, &b, NULL, false) &
                                      (ML_URG_HERE | ML_URG_TAKEN)) == ML_URG_HERE);
    return ((ev & MEMLAN_EV_READ) && rd) ||
           ((ev & MEMLAN_EV_WRITE) && __ml_chan_ready_ro(s->ch, 1, mlp_tx_room(s->ch)));
}


/* Take the queue's events: each names a socket that changed, whose epoll memberships go on their
 * sets' ready lists (poll and select recompute their own fds' readiness anyway). */
void mlp_queue_drain(void) { mlp_queue_drain_look(true); }

/* full false: the look at the summary words covers the slots handed out only
 * (__ml_evq_quiet_hint), for a caller that has not been told by memlan_evq_arm that something
 * is pending (an epoll_wait's first look and its spin's): bits a peer wrote above them are left
 * to the full look that follows such an answer. */
void mlp_queue_drain_look(bool full)
{
    /* Nothing posted: the collect would find nothing.  Looked at without the lock, as
     * epoll_wait's spin does (the queue goes only in a fork child): a lock and a scan of the
     * summary words fewer per call, the process's queue being quiet whenever a set's own
     * queue takes its members' posts. */
    memlan_evq_t *q = __atomic_load_n(&mlp_q, __ATOMIC_ACQUIRE);
    if (!q || (full ? __ml_evq_quiet(q) : __ml_evq_quiet_hint(q)))
        return;
    struct memlan_event ev[64];
    int n;
    do {
        pthread_mutex_lock(&mlp_q_mu);
        n = mlp_q ? memlan_evq_wait(mlp_q, ev, 64, 0) : 0;
        pthread_mutex_unlock(&mlp_q_mu);
        for (int i = 0; i < n; i++)
            if (ev[i].udata)
                mlp_mark_sock_posted(ev[i].udata);
    } while (n == 64);
}

/* A peer whose end no FIN of its kernel socket will tell us:
 * - one whose process passed its socket over SCM_RIGHTS (ML_SOCK_PASSED, negotiate.c's
 *   mlp_passed) and then ended by _exit or a signal: its exit handler, which publishes such a
 *   side's end (sock.c, mlp_passed_at_exit), never ran, and its kernel socket's FIN never comes,
 *   since the receiver holds that socket (tests/preload/passexit.c, "epoll-_exit");
 * - one that shut down its writing and left our ring at least half full while we wait to write
 *   (out: the caller asks for POLLOUT): its FIN came at the shutdown, and its death, which over
 *   TCP resets a writer, says nothing more to our kernel socket (a nonblocking writer whose
 *   ring it no longer drained waited for POLLOUT for ever).  Not one that passed its socket
 *   (ML_SOCK_PASSED): its lock goes with its process while the receiver may not have taken
 *   the side up yet, and a live connection was declared dead.
 * So a poll or epoll_wait asks such a peer's lock, at most once per liveness interval (100 ms)
 * and socket (a peer that sets the flag without passing, or a live one that does not read for
 * that long, costs us only that look): a passed one only once a sleep ran out (ran_out: its
 * receiver may take the side up a little after the passer's _exit, which waits for nothing; a
 * look at the first wait declared it dead, removed the channel's file, and the receiver could
 * not open it: passexit epoll-_exit), a half-closed one at any wait that may sleep, busy set or
 * idle.  True when the peer is now known gone.  Before, a server asleep in epoll_wait or poll
 * on it waited for ever. */
bool mlp_peer_passed_gone(struct mlp_sock *s, bool out, bool ran_out)
{
    if (s->type != MLP_CONN || !s->ch || s->state != MLP_ACCEL)
        return false;
    struct memlan_channel *ch = s->ch;
    if (ch->peer_dead)
        return false;
    uint32_t ps = __ml_chan_peer_state(ch);
    bool passed = (atomic_load(&mlp_side_block(ch, 1 - s->side)->flags) & ML_SOCK_PASSED) != 0;
    if (!(ps == ML_SIDE_OPEN && passed && ran_out) &&
        !(ps == ML_SIDE_SHUT_WR && out && !passed && !ch->shut_wr &&
          __ml_chan_tx_queued(ch) >= ch->size / 2))
        return false;
    /* at the liveness pace, whatever the caller's timeouts */
    uint64_t now = mlp_coarse_ns(), t = atomic_load(&s->passed_ns);
    if (now - t < ML_LIVENESS_NS || !atomic_compare_exchange_strong(&s->passed_ns, &t, now))
        return false;
    (void)__ml_chan_check_peer(ch);
    return ch->peer_dead;
}

/* The peer's kernel socket ended (its FIN came): has the peer itself?  Its liveness lock goes
 * with its last mapping, which for a process being killed can come after the FIN (the kernel
 * closes files and drops mappings in its own order, and may defer the last release), and an
 * epoll member's FIN is reported once: looked at once, a killed peer looked alive and its
 * connection stayed open for ever (redis kept 18 of 20 killed clients).  So until the lock says
 * so the socket is looked at again; after MLP_FIN_GRACE_NS the FIN alone decides, since a peer
 * whose every process has closed the kernel socket can never write again.  True while it is
 * still open to question. */
#define MLP_FIN_GRACE_NS 1000000000ull
bool mlp_check_peer(struct mlp_sock *s)
{
    if (s->type != MLP_CONN || !s->ch || s->state != MLP_ACCEL)
        return false;
    struct memlan_channel *ch = s->ch;
    (void)__ml_chan_check_peer(ch);
    if (ch->peer_dead || __ml_chan_peer_state(ch) != ML_SIDE_OPEN) {
        atomic_store(&s->fin_ns, 0);
        return false;
    }
    /* After our own SHUT_RD the kernel socket says RDHUP of itself, FIN or not: only the lock
     * (just asked) can tell the peer's end then.  The FIN alone decided after the grace, and a
     * live peer that went on reading was declared dead a second into the polls of a program
     * that had shut down its reading side: its writes failed with EPIPE. */
    if (ch->rd_eof_when_empty) {
        atomic_store(&s->fin_ns, 0);
        return false;
    }
    uint64_t now = mlp_now_ns(), t = 0;
    if (atomic_compare_exchange_strong(&s->fin_ns, &t, now))
        return true;
    if (now - t < MLP_FIN_GRACE_NS)
        return true;
    ch->peer_dead = true;
    atomic_store(&s->fin_ns, 0);
    return false;
}

int64_t mlp_left(uint64_t deadline)
{
    if (!deadline)
        return -1;
    uint64_t now = mlp_now_ns();
    return now >= deadline ? 0 : (int64_t)(deadline - now);
}

struct timespec mlp_ts(int64_t ns)
{
    return (struct timespec){.tv_sec = ns / 1000000000, .tv_nsec = ns % 1000000000};
}

/* ---- poll -------------------------------------------------------------------------------- */

/*
 * A vfork child runs in its parent's memory, on the vforking thread's stack and thread-local
 * storage, with a copy of its fd table, until it execs or exits.  What its waits would make there
 * (the process's event queue, the thread's waiter and its eventfd, an epoll set's record and
 * queue) would stay in the parent naming descriptors that exist only in the child: the parent's
 * next poll slept on the child's dead doorbell (POLLNVAL at once) and spun.  So a vfork child's
 * poll and select make nothing and take nothing: they look at the rings (read-only) and nap 1 ms
 * at a time in the real ppoll on the kernel fds; its epoll calls are the kernel's (a set it makes
 * gets no record; an accelerated socket it adds is its idle kernel socket: only its end is seen).
 * Asked (a getpid) only where a call would first sleep or make a record: vf is -1 until then.
 */
bool mlp_vf(int *vf)
{
    if (*vf < 0)
        *vf = mlp_vfork_child();
    return *vf;
}

/* poll's spin (__ml_spin_run): is any of our sockets ready for what it is asked? */
struct mlp_poll_spin {
    struct pollfd *fds;
    struct mlp_sock **socks;
    nfds_t n;
};

static int mlp_poll_spin_look(struct ml_spinning *sp, void *a)
{
    struct mlp_poll_spin *w = a;
    for (nfds_t i = 0; i < w->n; i++)
        if (w->socks[i] && mlp_sock_revents(w->socks[i], w->fds[i].fd, w->fds[i].events) > 0)
            return 1;
    return 0;
}

/* What a poll holds, for its cleanup (see "waits left by a jump or a cancellation"). */
struct mlp_poll_undo {
    struct _pthread_cleanup_buffer buf;
    struct mlp_sock **socks;
    nfds_t n;
    volatile bool own;            /* socks[] hold the call's own references (not lent) */
    struct mlp_pwait *volatile w; /* the waiter the call took */
    void *volatile heap[2];       /* socks and k, when on the heap */
};

/* Run by a jump or cancellation out of the poll, or by its end: idempotent. */
static void mlp_poll_left(void *arg)
{
    struct mlp_poll_undo *u = arg;
    struct mlp_pwait *w = u->w;
    if (w) {
        mlp_pw_left(w);
        u->w = NULL;
    }
    if (u->own) {
        u->own = false;
        for (nfds_t i = 0; i < u->n; i++) {
            struct mlp_sock *s = u->socks[i];
            u->socks[i] = NULL;
            if (s)
                mlp_put(s);
        }
    }
    void *a = u->heap[0], *b = u->heap[1];
    u->heap[0] = u->heap[1] = NULL;
    __ml_free(a);
    __ml_free(b);
}

/* pthread_cleanup_push's setjmp: cancellation runs the handler and unwinds on, it never
 * resumes this function, so no local it could clobber is read again. */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wclobbered"
int mlp_poll(struct pollfd *fds, nfds_t n, int64_t timeout_ns, const sigset_t *mask)
{
    struct mlp_sock *stack_socks[64];
    struct pollfd stack_k[66];
    struct mlp_sock **socks = n <= 64 ? stack_socks : calloc(n, sizeof *socks);
    struct pollfd *k = n <= 64 ? stack_k : calloc(n + 3, sizeof *k);
    if (!socks || !k) {
        if (n > 64) {
            __ml_free(socks);
            __ml_free(k);
        }
        return -ENOMEM;
    }
    struct mlp_pwait *pw = NULL; /* this thread's waiter, once it first sleeps */
    int64_t live = mlp_live_begin();
    int naccel = 0, nep = 0;
    for (nfds_t i = 0; i < n; i++) {
        mlp_received_look(fds[i].fd); /* a connection passed to us: ours from its first poll */
        socks[i] = mlp_get(fds[i].fd);
        if (socks[i] && (socks[i]->type != MLP_CONN || socks[i]->state == MLP_TCP)) {
            mlp_put(socks[i]);
            socks[i] = NULL;
        }
        naccel += socks[i] != NULL;
        if (!socks[i] && mlp_ep_poll_nest(fds[i].fd))
            nep++;
    }
    /* An epoll fd with members of ours (GLib, Qt and libuv poll one loop's epoll fd from
     * another's): it is a nested set now, whose kernel file is readable exactly while one of its
     * members is ready; make that true before the first look, which may not sleep. */
    if (nep)
        mlp_nested_refresh();
    /* A poll that must not wait (timeout 0: Open MPI's and libevent's progress loops make
     * several a message) reads no clock: it has no deadline to keep. */
    const bool zero = timeout_ns == 0;
    uint64_t deadline = timeout_ns <= 0 ? 0 : mlp_now_ns() + (uint64_t)timeout_ns;
    bool spun = false, lent = false;
    /* The futex path (below): open until a wake-up on it found nothing poll reports. */
    bool fast = mask == NULL && n == 1 && timeout_ns != 0 && socks[0] &&
                (fds[0].events & (POLLIN | POLLRDNORM)) &&
                !(fds[0].events & (POLLOUT | POLLWRNORM | POLLWRBAND));
    /* The thread's last wait on this socket spent its slice for nothing (mlp_idle_note). */
    const void *idle_s = fast ? socks[0] : NULL;
    bool idle = fast && mlp_idle_skip(idle_s);
    fast = fast && !idle;
    bool fast_woke = false;
    bool ours = false; /* the answer has a socket of ours in it */
    int vf = -1; /* a vfork child (mlp_vf) */
    int ret;
    /* Left by a jump or cancelled (the ppoll below, the futex wait's hook): what the call holds
     * at that moment goes (its references, its waiter's registrations, its arrays). */
    struct mlp_poll_undo u = {.socks = socks, .n = n, .own = true, .w = NULL,
                              .heap = {n > 64 ? socks : NULL, n > 64 ? k : NULL}};
    pthread_cleanup_push(mlp_poll_left, &u);
    mlp_left_push(&u.buf, mlp_poll_left, &u);
    for (;;) {
        /* 1. What is ready now, without sleeping. */
        int ready = 0;
        for (nfds_t i = 0; i < n; i++) {
            fds[i].revents = 0;
            if (!socks[i])
                continue;
            short r = mlp_sock_revents(socks[i], fds[i].fd, fds[i].events);
            if (r < 0) { /* it fell to TCP */
                struct mlp_sock *gone = socks[i];
                socks[i] = NULL; /* first: the cleanup must not put it too */
                if (pw)
                    mlp_pw_unregister(pw, gone); /* the lent reference, if lent */
                if (!lent)
                    mlp_put(gone);
                continue;
            }
            fds[i].revents = r;
            ready += r != 0;
        }
        /* 1a. One accelerated socket, waited on for reading, and nothing else: sleep on the
         * ring's futex, where the peer's send wakes this very thread, for a slice, as a blocking
         * recv does (sock.c, mlp_wait_dir).  The long sleep below wakes through the process's
         * doorbell, which every thread asleep in poll watches: with several threads each polling
         * its own connection before a read (libtirpc's clients, thread-per-connection servers)
         * each post woke them all and one of them forwarded it (perf: 2.4 context switches and
         * 5 system calls a call with 4 RPC client threads on one core, against 1 and 3 over
         * kernel TCP).  The slice's end, a kernel fd, a mask, or a wake-up that brought nothing
         * poll reports (SO_RCVLOWAT-like thresholds, a ring that is not live) leave it for the
         * path below.  So does a peer whose process says it is ending (ML_SOCK_EXITING), before
         * the slice or during it: its end comes by the kernel socket's FIN, which the path below
         * watches (a select after a fork child's _exit saw the end 6-7 ms late, the slice).  A
         * deadline makes any handler's run end the wait (EINTR), SA_RESTART or not, as poll(2)
         * does; "none" is a deadline that never comes. */
        if (fast && fast_woke && !ready)
            fast = false;
        struct mlp_pwait *fw = NULL;
        if (fast && !ready && socks[0] && socks[0]->state == MLP_ACCEL && socks[0]->ch->sock_ino &&
            !__ml_chan_peer_exiting(socks[0]->ch) &&
            __atomic_load_n(&mlp_nnested, __ATOMIC_RELAXED) == 0 && !pw && !mlp_vf(&vf) &&
            (fw = mlp_pw_get()) && mlp_pw_take(fw, (uintptr_t)__builtin_frame_address(0), &u.w)) {
            /* A peer that died without a close while we were not looking: its FIN is in the
             * kernel socket, which the futex cannot watch (one look a millisecond at most). */
            if (mlp_end_look(socks[0])) {
                fw->busy = 0;
                u.w = NULL;
                continue;
            }
            /* Our reference is lent to the thread's waiter while we sleep, as the long sleep's
             * are: a handler that siglongjmp()s out of the wait, or a cancellation, gives it back
             * through the cleanup (without glibc's cleanup buffers: the thread's next take of
             * the waiter, or the thread's end). */
            u.own = false;
            fw->held = socks[0];
            atomic_fetch_add(&socks[0]->lent, 1); /* after held is set (mlp_poll_fork_drop) */
            uint64_t dl = timeout_ns < 0 ? UINT64_MAX : deadline;
            int r = __ml_chan_wait_ro_first(socks[0]->ch, 0, 1, dl, mlp_now_ns() + MLP_SLICE_NS);
            /* poll is a cancellation point: a pthread_cancel whose signal interrupted the futex
             * acts here, the reference still lent, as it would in the kernel's poll, rather
             * than become an EINTR.  (glibc sends no signal to a thread outside its own
             * cancellable calls: then it acts at the slice's end, in the ppoll below.) */
            if (r == -EINTR && __ml_wait_hook)
                (void)__ml_wait_hook();
            atomic_fetch_sub(&socks[0]->lent, 1); /* before held goes (mlp_poll_fork_drop) */
            fw->held = NULL; /* then own again: a jump in between leaks it, never puts it twice */
            u.own = true;
            fw->busy = 0;
            u.w = NULL;
            fast_woke = true;
            if (r == -EINTR) {
                ret = -EINTR;
                break;
            }
            if (r == -EAGAIN) { /* the deadline */
                fds[0].revents = 0;
                ret = 0;
                break;
            }
            if (r != 0 && r != -ECONNRESET)
                fast = false; /* the slice's end (-ETIME), or anything else: the long way */
            idle = r == -ETIME;
            spun = true;      /* the futex wait spun first, by the channel's policy */
            continue;
        }
        fast = false;
        /* 2. Spin on the channels for a while before sleeping. */
        if (!ready && !spun && timeout_ns != 0 && naccel) {
            spun = true;
            int pcpu = 0;
            for (nfds_t i = 0; i < n && !pcpu; i++)
                if (socks[i] && socks[i]->state == MLP_ACCEL)
                    pcpu = (int)ml_load_relaxed(&socks[i]->ch->tx.ctl->rx_cpu);
            /* Say where we wait whether or not we spin: a peer that does not know would spin
             * on the core we need (memcached's epoll worker against libmemcached's poll). */
            int me = __ml_getcpu() + 1;
            for (nfds_t i = 0; i < n; i++)
                if (socks[i] && socks[i]->state == MLP_ACCEL)
                    ml_note_cpu(&socks[i]->ch->rx.ctl->rx_cpu, (uint32_t)me);
            struct mlp_poll_spin look = {fds, socks, n};
            struct ml_spinning spin = {
                .sp = &mlp_poll_spin, .budget = __ml_spin_budget_ns(&mlp_poll_spin, (uint32_t)pcpu),
                .every = 16, .look = mlp_poll_spin_look, .arg = &look};
            if (__ml_spin_run(&spin) > 0)
                continue;
        }
        /* 3. Arm, and sleep in the kernel on the kernel fds and the doorbell. */
        bool nap = false;
        bool nested = __atomic_load_n(&mlp_nnested, __ATOMIC_RELAXED) != 0;
        if (!ready && timeout_ns != 0 && mlp_vf(&vf)) {
            nap = true; /* a vfork child: nothing armed, nothing made (above) */
        } else if (!ready && timeout_ns != 0 && mlp_sig_in_handler()) {
            nap = true; /* a handler: the queue's locks and allocations may be its thread's */
        } else if (!ready && timeout_ns != 0) {
            /* Nested sets first: the refresh drains the queue, which must not swallow a post
             * for one of our own sockets after we armed it (we would sleep past it). */
            if (nested)
                mlp_nested_refresh();
            if (naccel && !pw && (pw = mlp_pw_get())) {
                if (!mlp_pw_take(pw, (uintptr_t)__builtin_frame_address(0), &u.w)) {
                    pw = NULL;
                } else if (!mlp_pw_register_all(pw, socks, n)) {
                    pw->busy = 0;
                    u.w = NULL;
                    pw = NULL;
                } else {
                    /* The registrations hold a reference to each socket: ours go, so that a
                     * call that never returns (cancelled in the ppoll below, or left by a
                     * handler's siglongjmp) leaves nothing but the thread's waiter holding
                     * them, which the cleanup gives back (without glibc's cleanup buffers: the
                     * thread's next call, or its end). */
                    u.own = false;
                    for (nfds_t i = 0; i < n; i++)
                        if (socks[i])
                            mlp_put(socks[i]);
                    lent = true;
                }
            }
            if (pw)
                mlp_pw_clear(pw);
            else if (naccel)
                nap = true; /* no wake-up of our own: look again soon */
            for (nfds_t i = 0; i < n; i++) {
                if (!socks[i])
                    continue;
                if (socks[i]->state == MLP_UNDECIDED)
                    nap = true; /* the claim does not ring: look again soon */
                else if (mlp_arm(socks[i], fds[i].events, false))
                    ready = -1;
                else if (!mlp_q || mlp_peer_nopost(socks[i]) || !socks[i]->ch->evq)
                    nap = true; /* no post can reach us (no queue, or no registration slot) */
            }
            if (ready < 0)
                continue;
            if (mlp_q && memlan_evq_arm(mlp_q) == 1) {
                mlp_queue_drain();
                continue;
            }
        }
        /* A look that will not wait (a zero timeout, or something of ours already ready) asks
         * the kernel only of the caller's own fds, and of an accelerated socket's at most once
         * a millisecond (mlp_look_due): that look is for the end of a peer killed without a
         * close, which a millisecond later is as good, and one fewer fd in the kernel's poll is
         * about 50 ns (Open MPI's progress loop makes about 5 zero-timeout polls a message and
         * rank).  Nor the doorbell: only a sleeping waiter arms the queue, and its own wait
         * hears the bell.  With nothing left to ask and no mask to set, no system call at all
         * (a spinning poll that found its answer made one, about 0.2 us, for nothing). */
        const bool look = (zero || ready) && !mask;
        uint64_t cnow = 0;
        bool kask = !look;
        nfds_t nk = 0;
        for (nfds_t i = 0; i < n; i++) {
            k[nk] = fds[i];
            if (socks[i]) {
                /* Only the peer's end comes through the kernel, and only until we know of it;
                 * an undecided socket also listens for a server that answers over TCP. */
                struct mlp_sock *s = socks[i];
                k[nk].events = 0;
                if (s->state == MLP_UNDECIDED) {
                    k[nk].events = POLLIN | POLLRDHUP;
                } else if (__ml_chan_peer_state(s->ch) == ML_SIDE_OPEN && !s->ch->peer_dead) {
                    k[nk].events = POLLRDHUP;
                    if (look && !mlp_look_due(s, cnow ? cnow : (cnow = mlp_coarse_ns())))
                        k[nk].fd = -1;
                } else if (look) {
                    k[nk].fd = -1; /* the peer's end is known: the kernel has nothing to add */
                }
            }
            kask |= k[nk].fd >= 0;
            k[nk].revents = 0;
            nk++;
        }
        int bell = -1;
        if (mlp_q && (naccel || nested) && vf != 1 && !look && !mlp_sig_in_handler()) {
            bell = (int)nk;
            k[nk++] = (struct pollfd){.fd = memlan_evq_fd(mlp_q), .events = POLLIN};
        }
        if (pw)
            k[nk++] = (struct pollfd){.fd = pw->efd, .events = POLLIN};
        int64_t left = ready || zero ? 0 : mlp_left(deadline);
        if (timeout_ns < 0 && !ready)
            left = -1;
        if (nap && (left < 0 || left > 1000000))
            left = 1000000;
        /* A sleep on our queue lasts at most the liveness interval (100 ms, doubling while
         * quiet to 1 s, as a blocking recv's): a wake-up can be owed by a peer that cannot
         * deliver it (one that dropped its credentials before it could reach our queue, and
         * flagged ML_SOCK_NOPOST after we slept: sshd's sandboxed child and ssh hung so). */
        if (naccel && !ready && (left < 0 || left > live)) {
            left = live;
            live = live * 2 < (int64_t)ML_LIVENESS_MAX_NS ? live * 2 : (int64_t)ML_LIVENESS_MAX_NS;
        }
        struct timespec ts = mlp_ts(left < 0 ? 0 : left);
        /* Without the system call poll is still a cancellation point, as glibc's is at every
         * call (a thread whose loop polls sockets of ours whose peers have shut down, with
         * nothing to ask the kernel, was never cancelled). */
        int r = 0;
        if (kask || nk > n)
            r = mlp_real_ppoll(k, nk, left < 0 ? NULL : &ts, mask);
        else
            pthread_testcancel();
        mlp_kept_tick(); /* regions kept while their senders rest, when due (one load) */
        if (r < 0 && errno == EINVAL && nk > n) {
            /* More fds than RLIMIT_NOFILE allows (sshd's sandboxed child sets it to 1, for its
             * own poll of one fd): ours go, and without them we nap and look again. */
            nk = n;
            bell = -1;
            if (left < 0 || left > 1000000)
                left = 1000000;
            ts = mlp_ts(left);
            nap = false; /* the ppoll below is the nap */
            r = mlp_real_ppoll(k, nk, &ts, mask);
        }
        if (r < 0) {
            ret = -errno;
            break;
        }
        if (bell >= 0 && k[bell].revents)
            mlp_queue_drain();
        int got = 0;
        bool checked = false;
        for (nfds_t i = 0; i < n; i++) {
            if (socks[i]) {
                if (k[i].revents & (POLLRDHUP | POLLHUP | POLLERR)) {
                    (void)mlp_check_peer(socks[i]);
                    checked = true;
                    short rv = mlp_sock_revents(socks[i], fds[i].fd, fds[i].events);
                    if (rv > 0) {
                        fds[i].revents = rv;
                    } else if (!ready) {
                        nap = true; /* FIN before the peer's state is visible: look again */
                    }
                } else if (!zero && naccel &&
                           mlp_peer_passed_gone(socks[i], (fds[i].events & POLLOUT) != 0,
                                                r == 0 && left != 0)) {
                    /* a peer whose end no FIN tells: its lock, at the liveness pace (a
                     * zero-timeout poll never asks) */
                    checked = true;
                    short rv = mlp_sock_revents(socks[i], fds[i].fd, fds[i].events);
                    if (rv > 0)
                        fds[i].revents = rv;
                }
                if (fds[i].revents) {
                    got++;
                    ours = true;
                }
            } else {
                fds[i].revents = k[i].revents;
                if (fds[i].revents)
                    got++;
            }
        }
        /* A socket in the set twice is asked of once a look (mlp_look_due): its other entries
         * were computed before the peer's end was found, and must say what the asked one says,
         * as the kernel's entries of one fd do. */
        for (nfds_t i = 0; checked && i < n; i++) {
            if (socks[i] && k[i].fd < 0) {
                short rv = mlp_sock_revents(socks[i], fds[i].fd, fds[i].events);
                if (rv > 0) {
                    got += !fds[i].revents;
                    fds[i].revents = rv;
                    ours = true;
                }
            }
        }
        if (got || ready || zero || mlp_left(deadline) == 0) {
            ret = got;
            ours |= ready > 0;
            break;
        }
        if (nap) {
            struct timespec d = {0, 1000000};
            nanosleep(&d, NULL);
        }
        /* Woken by the doorbell or a spurious FIN: compute again. */
    }
    /* The end: the lent references (the waiter's), or our own, and the arrays go, still inside
     * the cleanup's reach (a waiter left busy with no cleanup to free it would be lost). */
    if (pw) {
        mlp_pw_unregister_all(pw); /* puts the lent references */
        pw->busy = 0;
        u.w = NULL;
    }
    mlp_poll_left(&u);
    mlp_left_pop(&u.buf);
    pthread_cleanup_pop(0);
    /* Only an answer of ours starts the next wait's interval afresh: the program's own fds
     * (smbd's timer, a pipe) tell nothing about our peers. */
    mlp_live_end(live, ours ? 1 : 0);
    if (idle_s)
        mlp_idle_note(idle_s, idle && ret == 0);
    return ret;
}
#pragma GCC diagnostic pop

/* ---- a blocking call's long sleep ------------------------------------------------------- */

/* What a blocking call's long sleep holds: the waiter it took (see mlp_poll_undo). */
struct mlp_sleep_undo {
    struct _pthread_cleanup_buffer buf;
    struct mlp_pwait *volatile w;
    struct mlp_sock *volatile lends; /* the call's reference, counted in lends->lent */
};

/*
 * While a blocking call sleeps here, the call's own reference to the socket (its mlp_call's) is
 * counted in s->lent as a poll's lent one is, though the call keeps it: a fork by another thread
 * meanwhile gave the child a copy of that reference, which no thread there would put, so the
 * child's close of the socket did not end its hold and the parent's close did not end the
 * connection (the channel's file stayed in the fabric after every process had exited: an
 * explorer's fork6.py, a thread blocked in recv while the main thread forked).  The child's
 * mlp_poll_fork_drop puts it, unless it is this thread's (mlp_sleep_lending: a handler that
 * forked on top of this sleep returns into it in the child too).  Named here before it is
 * counted and uncounted before the name goes: a fork in between leaves a reference (as before),
 * never puts one too many.
 */
static __thread struct mlp_sock *mlp_sleep_lends;

struct mlp_sock *mlp_sleep_lending(void) { return mlp_sleep_lends; }

static void mlp_sleep_lend(struct mlp_sleep_undo *u, struct mlp_sock *s)
{
    mlp_sleep_lends = s;
    u->lends = s;
    atomic_signal_fence(memory_order_seq_cst);
    atomic_fetch_add(&s->lent, 1);
}

static void mlp_sleep_unlend(struct mlp_sleep_undo *u)
{
    struct mlp_sock *s = u->lends;
    if (s) {
        atomic_fetch_sub(&s->lent, 1);
        atomic_signal_fence(memory_order_seq_cst);
        u->lends = NULL;
        mlp_sleep_lends = NULL;
    }
}

static void mlp_sleep_left(void *arg)
{
    struct mlp_sleep_undo *u = arg;
    mlp_sleep_unlend(u);
    struct mlp_pwait *w = u->w;
    if (w) {
        mlp_pw_left(w);
        u->w = NULL;
    }
}

/*
 * A blocked recv or send that found nothing on the ring's futex for a short slice sleeps here
 * (sock.c, mlp_wait_dir), as poll does for one socket: armed on the process's event queue, in
 * ppoll on the queue's doorbell, the thread's eventfd and the kernel socket under the channel.
 * The kernel socket is what the futex cannot watch: its FIN comes when the last process holding
 * the peer's socket has closed it or died (_exit, a signal, a failed exec), which no code of the
 * peer's announces (issue 19, item 11).  The FIN only wakes us: the peer's liveness lock then
 * decides (mlp_check_peer: a FIN that comes before the lock goes is looked at again every
 * millisecond, for at most MLP_FIN_GRACE_NS).  It is watched only while the peer's side is open
 * and our own SHUT_RD (which the kernel socket reports as its own RDHUP) has not been made.
 * One sleep, of at most *live (the liveness interval, doubled here up to its maximum), ended by
 * a timeout with a liveness look as the futex sleep's timeout makes.  0: look again; -EAGAIN:
 * the deadline; -EINTR: a handler ran; -ENOSYS: cannot sleep so here (no event queue, no
 * eventfd, a kernel socket no longer ours to watch, a signal handler, a vfork child): the
 * caller sleeps on the futex.
 */
int mlp_sock_sleep(struct mlp_sock *s, int dir, uint64_t want, uint64_t deadline, int64_t *live)
{
    struct memlan_channel *ch = s->ch;
    if (mlp_vfork_child() || !ch || s->state != MLP_ACCEL || !ch->sock_ino || mlp_peer_nopost(s) ||
        mlp_sig_in_handler()) /* (a handler: the waiter's and the queue's locks, as in poll) */
        return -ENOSYS;
    /* A process that lost the fabric (its credentials changed, a sandbox refused a creation)
     * makes nothing new for this (a sandbox may kill for what it did not expect): only a queue
     * and an eventfd made before serve. */
    bool mine = mlp_pw_self && mlp_pw_self->gen == mlp_pw_gen;
    if (mlp_fabric_out() ? !mlp_q || !mine : !mlp_queue())
        return -ENOSYS;
    struct mlp_pwait *pw;
    if (mine) {
        pw = mlp_pw_self;
    } else {
        if (atomic_fetch_add(&mlp_pw_sleepers, 1) >= mlp_sleep_efds()) {
            atomic_fetch_sub(&mlp_pw_sleepers, 1);
            return -ENOSYS;
        }
        if (!(pw = mlp_pw_get())) {
            atomic_fetch_sub(&mlp_pw_sleepers, 1);
            return -ENOSYS;
        }
        pw->sleeper = true;
    }
    struct mlp_sleep_undo u = {.w = NULL, .lends = NULL};
    int ret = 0, saved = errno;
    mlp_left_push(&u.buf, mlp_sleep_left, &u);
    if (!mlp_pw_take(pw, (uintptr_t)__builtin_frame_address(0), &u.w)) {
        mlp_left_pop(&u.buf);
        return -ENOSYS;
    }
    struct mlp_sock *one[1] = {s};
    if (!mlp_pw_register_all(pw, one, 1)) {
        pw->busy = 0;
        u.w = NULL;
        mlp_left_pop(&u.buf);
        errno = saved;
        return -ENOSYS;
    }
    pthread_cleanup_push(mlp_sleep_left, &u);
    mlp_sleep_lend(&u, s);
    mlp_pw_clear(pw);
    bool ready = false;
    if (!mlp_queue_add(s, false))
        ret = -ENOSYS;
    else if ((void)__ml_chan_arm_evq(ch, dir ? MEMLAN_EV_WRITE : MEMLAN_EV_READ),
             __ml_chan_ready_ro(ch, dir, want)) /* a send waits for want bytes of room */
        ready = true;
    else if (memlan_evq_arm(mlp_q) == 1) {
        mlp_queue_drain();
        ready = true;
    }
    if (ret == 0 && !ready) {
        struct pollfd k[3];
        nfds_t nk = 0;
        int kf = -1;
        if (__ml_chan_peer_state(ch) == ML_SIDE_OPEN && !ch->peer_dead && !ch->rd_eof_when_empty) {
            kf = (int)nk;
            k[nk++] = (struct pollfd){.fd = ch->sock_fd, .events = POLLRDHUP};
        }
        int bell = (int)nk;
        k[nk++] = (struct pollfd){.fd = memlan_evq_fd(mlp_q), .events = POLLIN};
        k[nk++] = (struct pollfd){.fd = pw->efd, .events = POLLIN};
        int64_t left = *live;
        if (*live < (int64_t)ML_LIVENESS_MAX_NS)
            *live = *live * 2 < (int64_t)ML_LIVENESS_MAX_NS ? *live * 2 : (int64_t)ML_LIVENESS_MAX_NS;
        int64_t dl = mlp_left(deadline);
        if (dl == 0)
            ret = -EAGAIN;
        else if (dl > 0 && dl < left)
            left = dl;
        struct timespec ts = mlp_ts(left);
        int r = ret ? 0 : mlp_real_ppoll(k, nk, &ts, NULL);
        if (ret) {
        } else if (r < 0) {
            ret = errno == EINTR ? -EINTR : -ENOSYS;
        } else if (r == 0) {
            (void)__ml_chan_check_peer(ch); /* the liveness look, as the futex's timeout */
            mlp_kept_tick();
        } else {
            /* Awake: a drain (ours or another thread's) need not write our eventfd. */
            atomic_store(&pw->rung, 1);
            if (k[bell].revents)
                mlp_queue_drain();
            if (kf >= 0 && k[kf].revents && !ch->rd_eof_when_empty) {
                /* The kernel socket ended, or the fd is no longer it (closed under us before
                 * the keep-alive duplicate took over): only our socket's end counts, and not
                 * our own SHUT_RD made meanwhile (the kernel says RDHUP for it too). */
                if (__ml_sys_socket_hup(ch->sock_fd, ch->sock_ino) != 1) {
                    ret = -ENOSYS;
                } else if (mlp_check_peer(s)) {
                    struct timespec d = {0, 1000000}; /* the FIN before the lock: again soon */
                    if (mlp_real_ppoll(NULL, 0, &d, NULL) < 0 && errno == EINTR)
                        ret = -EINTR;
                }
            }
        }
    }
    mlp_sleep_unlend(&u);
    pthread_cleanup_pop(0);
    mlp_pw_unregister_all(pw);
    pw->busy = 0;
    u.w = NULL;
    mlp_left_pop(&u.buf);
    errno = saved;
    return ret;
}

/* Is a look at s's kernel socket due, for a call that must not wait (a nonblocking recv, a
 * zero-timeout poll)?  At most one a millisecond per socket, by the coarse clock (so one a tick
 * where the tick is longer), whichever thread makes it. */
bool mlp_look_due(struct mlp_sock *s, uint64_t now)
{
    uint64_t t = atomic_load_explicit(&s->look_ns, memory_order_relaxed);
    return now - t >= 1000000u && atomic_compare_exchange_strong(&s->look_ns, &t, now);
}

/* A nonblocking call found nothing to read: has the peer's kernel socket ended with every
 * process of the peer's side gone?  Nothing would ever tell a program that only calls recv
 * (no poll) otherwise.  One look at the kernel socket (a system call) per socket per
 * millisecond at most; the peer's liveness lock decides, as for a FIN seen by poll.  True when
 * the peer is now known dead (look again under the lock: EOF, or the reset). */
bool mlp_end_look(struct mlp_sock *s)
{
    struct memlan_channel *ch = s->ch;
    if (!ch || s->state != MLP_ACCEL || ch->peer_dead || !ch->sock_ino ||
        ch->rd_eof_when_empty || __ml_chan_peer_state(ch) != ML_SIDE_OPEN)
        return false;
    if (!mlp_look_due(s, mlp_coarse_ns()))
        return false;
    if (__ml_sys_socket_hup(ch->sock_fd, ch->sock_ino) != 1)
        return false;
    (void)mlp_check_peer(s);
    return ch->peer_dead;
}

/* ---- select, through poll ---------------------------------------------------------------- */

int mlp_select(int n, fd_set *rs, fd_set *ws, fd_set *es, int64_t timeout_ns,
               const sigset_t *mask, int64_t *left_ns)
{
    struct pollfd stack[64], *p = stack;
    int cnt = 0;
    for (int fd = 0; fd < n; fd++)
        if ((rs && FD_ISSET(fd, rs)) || (ws && FD_ISSET(fd, ws)) || (es && FD_ISSET(fd, es)))
            cnt++;
    if (cnt > 64 && !(p = calloc((size_t)cnt, sizeof *p)))
        return -ENOMEM;
    int j = 0;
    for (int fd = 0; fd < n; fd++) {
        short ev = 0;
        if (rs && FD_ISSET(fd, rs))
            ev |= POLLIN;
        if (ws && FD_ISSET(fd, ws))
            ev |= POLLOUT;
        if (es && FD_ISSET(fd, es))
            ev |= POLLPRI;
        if (ev)
            p[j++] = (struct pollfd){.fd = fd, .events = ev};
    }
    uint64_t t0 = mlp_now_ns();
    /* poll reports POLLHUP and POLLERR whatever was asked; select counts a hang-up only for a
     * descriptor in the read set and an error only in the read or write set, and sleeps on past
     * them otherwise (the kernel's POLLIN_SET, POLLOUT_SET, POLLEX_SET).  A descriptor woken by
     * such a bit alone (a pipe whose writer closed, in the except set only, as ncat's client
     * puts its stdin) is left out of the next poll, which sleeps on for the time left: before,
     * select returned 0 at once, its timeout or NULL notwithstanding, and ncat's loop spun at
     * 75% of a core (an explorer).  Each round leaves one descriptor out at least. */
    int r;
    for (int64_t wait = timeout_ns;;) {
        r = mlp_poll(p, (nfds_t)cnt, wait, mask);
        if (r <= 0)
            break;
        bool counted = false;
        for (int i = 0; i < cnt; i++) {
            int fd = p[i].fd;
            short rv = p[i].revents;
            if (fd < 0 || !rv)
                continue;
            bool in = rs && FD_ISSET(fd, rs), out = ws && FD_ISSET(fd, ws);
            if ((rv & POLLNVAL) || (in && (rv & (POLLIN | POLLHUP | POLLERR))) ||
                (out && (rv & (POLLOUT | POLLERR))) || (es && FD_ISSET(fd, es) && (rv & POLLPRI)))
                counted = true;
            else
                p[i].fd = ~fd; /* poll skips a negative fd */
        }
        if (counted)
            break;
        if (timeout_ns >= 0) {
            uint64_t spent = mlp_now_ns() - t0;
            if (spent >= (uint64_t)timeout_ns) {
                r = 0;
                break;
            }
            wait = timeout_ns - (int64_t)spent;
        }
    }
    for (int i = 0; i < cnt; i++)
        if (p[i].fd < 0) {
            p[i].fd = ~p[i].fd;
            p[i].revents = 0;
        }
    if (left_ns && timeout_ns >= 0) {
        uint64_t spent = mlp_now_ns() - t0;
        *left_ns = spent >= (uint64_t)timeout_ns ? 0 : timeout_ns - (int64_t)spent;
    }
    if (r < 0)
        goto out;
    for (int i = 0; i < cnt; i++)
        if (p[i].revents & POLLNVAL) {
            r = -EBADF;
            goto out;
        }
    r = 0;
    for (int i = 0; i < cnt; i++) {
        int fd = p[i].fd;
        short rv = p[i].revents;
        if (rs && FD_ISSET(fd, rs)) {
            if (rv & (POLLIN | POLLHUP | POLLERR))
                r++;
            else
                FD_CLR(fd, rs);
        }
        if (ws && FD_ISSET(fd, ws)) {
            if (rv & (POLLOUT | POLLERR))
                r++;
            else
                FD_CLR(fd, ws);
        }
        if (es && FD_ISSET(fd, es)) {
            if (rv & POLLPRI)
                r++;
            else
                FD_CLR(fd, es);
        }
    }
out:
    if (p != stack)
        __ml_free(p);
    return r;
}

/*
 * poll.c - readiness over any mix of accelerated and kernel fds: poll, ppoll, select, pselect
 * and epoll.
 *
 * An accelerated socket's data sits in a ring, not in its kernel socket, so its readiness is
 * computed from the channel.  To sleep, a waiter arms each channel's tripwire in event-queue mode
 * (the peer posts to our process's event queue and rings its doorbell, a FIFO, only when armed),
 * then sleeps in the real poll/epoll on its kernel fds plus the doorbell.  Each accelerated
 * socket's kernel fd is watched for POLLRDHUP only: nothing ever arrives on it but the FIN that
 * the kernel sends when the peer's last holder closes or dies, so a sleeping poller hears of a
 * dead peer at once and an idle one is never woken.  Before sleeping the waiter spins on the
 * channels for the spin budget, like a blocking recv.
 *
 * epoll keeps, per epoll fd, a ready list of members that may be ready (the kernel's design): the
 * event queue names the sockets that changed, each such socket's memberships go on their sets'
 * lists, and epoll_wait looks only at its list.  A member found not ready leaves the list with its
 * tripwire armed, so the next change posts it again: O(1) per ready socket, never a scan.
 */
#include "preload.h"
#include "sys/sys.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

static memlan_evq_t *mlp_q;
static pthread_mutex_t mlp_q_mu = PTHREAD_MUTEX_INITIALIZER;
static struct ml_spin mlp_poll_spin;
static void mlp_epoll_after_fork(void);
struct mlp_ep;
static void mlp_ep_nested_leave(struct mlp_ep *e);
static void mlp_nested_refresh(void);

void mlp_poll_after_fork(void)
{
    /* The parent's queue is the parent's: its doorbell would wake the parent.  Forget it (the
     * fd is shared, so not closed) and make our own on first use. */
    mlp_q = NULL;
    pthread_mutex_init(&mlp_q_mu, NULL);
    mlp_epoll_after_fork();
}

void mlp_poll_forget(struct mlp_sock *s)
{
    if (s->type != MLP_CONN || !s->ch || !s->ch->evq)
        return;
    pthread_mutex_lock(&mlp_q_mu);
    if (s->ch->evq == mlp_q)
        (void)memlan_evq_del(mlp_q, s->ch);
    else
        s->ch->evq = NULL; /* a queue from before fork: the parent's to keep */
    pthread_mutex_unlock(&mlp_q_mu);
}

void mlp_poll_at_exit(void)
{
    if (mlp_q) {
        int *sfd, *bfd;
        __ml_evq_fds(mlp_q, &sfd, &bfd);
        mlp_disown_fd(*sfd);
        mlp_disown_fd(*bfd);
        memlan_evq_close(mlp_q);
        mlp_q = NULL;
    }
}

/* A failed creation (a process that changed its credentials cannot create files in the fabric)
 * is said once per process and tried again at most once a second, not at every poll. */
static uint64_t mlp_q_failed_ns;
static bool mlp_q_failure_said;

static memlan_evq_t *mlp_queue(void)
{
    if (mlp_q || !mlp_fab)
        return mlp_q;
    if (mlp_q_failed_ns && mlp_now_ns() - mlp_q_failed_ns < 1000000000u)
        return NULL;
    pthread_mutex_lock(&mlp_q_mu);
    if (!mlp_q) {
        memlan_evq_t *q;
        int e = memlan_evq_create(mlp_fab, 65536, &q);
        if (e == 0) {
            int *sfd, *bfd;
            __ml_evq_fds(q, &sfd, &bfd);
            mlp_own_fd(sfd, true);
            mlp_own_fd(bfd, true);
            mlp_q = q;
        } else {
            mlp_q_failed_ns = mlp_now_ns();
            if (!mlp_q_failure_said)
                mlp_log(0, "cannot create the event queue (%s): poll falls back to 1 ms naps",
                        strerror(-e));
            mlp_q_failure_said = true;
        }
        pthread_mutex_unlock(&mlp_q_mu);
        if (e < 0)
            mlp_fabric_refused("the event queue", e); /* a sandbox refuses what we open */
        return mlp_q;
    }
    pthread_mutex_unlock(&mlp_q_mu);
    return mlp_q;
}

/* Make sure s's channel posts to our queue; false if it cannot (then we nap instead). */
static bool mlp_queue_add(struct mlp_sock *s)
{
    memlan_evq_t *q = mlp_queue();
    if (!q)
        return false;
    if (s->ch->evq == q)
        return true;
    pthread_mutex_lock(&mlp_q_mu); /* the queue's slot table is not thread-safe */
    if (s->ch->evq && s->ch->evq != q) /* a queue from before fork */
        s->ch->evq = NULL;
    bool ok = s->ch->evq == q || memlan_evq_add(q, s->ch, MEMLAN_EV_READ | MEMLAN_EV_WRITE, s) == 0;
    pthread_mutex_unlock(&mlp_q_mu);
    return ok;
}

/* ---- one socket's readiness -------------------------------------------------------------- */

/* poll(2) bits of an accelerated or undecided socket; -1 when the kernel's answer is the truth. */
static int mlp_revents(struct mlp_sock *s, int fd)
{
    if (s->type != MLP_CONN || !s->ch)
        return -1;
    int st = s->state;
    if (st == MLP_UNDECIDED)
        st = mlp_decide(s, fd, false);
    if (st == MLP_TCP) {
        (void)mlp_tcp_catch_up(s, fd, false); /* push what the ring still holds to the kernel */
        return -1;
    }
    struct memlan_channel *ch = s->ch;
    if (st == MLP_UNDECIDED) {
        int rev = 0;
        if (ml_ring_free(&ch->tx, 1) > 0)
            rev |= POLLOUT | POLLWRNORM;
        return rev;
    }
    uint32_t ps = __ml_chan_peer_state(ch);
    bool dead = ch->peer_dead;
    bool rd_done = ps != ML_SIDE_OPEN || dead || ch->rd_eof_when_empty;
    int rev = 0;
    if (rd_done || __ml_chan_rx_avail(ch) != 0)
        rev |= POLLIN | POLLRDNORM;
    if (rd_done)
        rev |= POLLRDHUP;
    if (ps == ML_SIDE_CLOSED || dead || ch->shut_wr || ml_ring_free(&ch->tx, 1) != 0)
        rev |= POLLOUT | POLLWRNORM;
    if ((ps != ML_SIDE_OPEN || dead) && ch->shut_wr)
        rev |= POLLHUP;
    if (rd_done) {
        int rs = mlp_reset_state(s, false); /* a reset: the kernel's socket is closed, HUP for good */
        if (rs)
            rev |= POLLHUP | (rs == 1 ? POLLERR : 0);
    }
    if (ch->rx.corrupt || ch->tx.corrupt)
        rev |= POLLERR;
    return rev;
}

short mlp_sock_revents(struct mlp_sock *s, int fd, short events)
{
    int r = mlp_revents(s, fd);
    if (r < 0)
        return -1;
    return (short)(r & (events | POLLERR | POLLHUP | POLLNVAL));
}

/* Does s's peer say that it may not reach our queue (ML_SOCK_NOPOST: it changed credentials)?
 * Then its posts can be lost and we look again every millisecond rather than sleep on the queue.
 * Once one peer says so, epoll waits of this process nap too (they do not look per member). */
static _Atomic bool mlp_nopost_seen;
static bool mlp_peer_nopost(struct mlp_sock *s)
{
    if (!s->ch || !(ml_load_relaxed(&mlp_side_block(s->ch, 1 - s->side)->flags) & ML_SOCK_NOPOST))
        return false;
    if (!ml_load_relaxed(&mlp_nopost_seen))
        ml_store_relaxed(&mlp_nopost_seen, true);
    return true;
}

/* Arm s for the events asked; true if it turned ready meanwhile (do not sleep). */
static bool mlp_arm(struct mlp_sock *s, short events)
{
    (void)mlp_peer_nopost(s);
    if (!mlp_queue_add(s))
        return false;
    uint32_t ev = 0;
    if (events & (POLLIN | POLLRDNORM | POLLRDHUP))
        ev |= MEMLAN_EV_READ;
    if (events & (POLLOUT | POLLWRNORM))
        ev |= MEMLAN_EV_WRITE;
    return ev && __ml_chan_arm_evq(s->ch, ev);
}

static void mlp_mark_sock(struct mlp_sock *s);

/* Take the queue's events: each names a socket that changed, whose epoll memberships go on their
 * sets' ready lists (poll and select recompute their own fds' readiness anyway). */
static void mlp_queue_drain(void)
{
    if (!mlp_q)
        return;
    struct memlan_event ev[64];
    int n;
    do {
        pthread_mutex_lock(&mlp_q_mu);
        n = mlp_q ? memlan_evq_wait(mlp_q, ev, 64, 0) : 0;
        pthread_mutex_unlock(&mlp_q_mu);
        for (int i = 0; i < n; i++)
            if (ev[i].udata)
                mlp_mark_sock(ev[i].udata);
    } while (n == 64);
}

/* The peer's kernel socket ended: has the peer itself? */
static void mlp_check_peer(struct mlp_sock *s)
{
    if (s->type == MLP_CONN && s->ch)
        (void)__ml_chan_check_peer(s->ch);
}

static int64_t mlp_left(uint64_t deadline)
{
    if (!deadline)
        return -1;
    uint64_t now = mlp_now_ns();
    return now >= deadline ? 0 : (int64_t)(deadline - now);
}

static struct timespec mlp_ts(int64_t ns)
{
    return (struct timespec){.tv_sec = ns / 1000000000, .tv_nsec = ns % 1000000000};
}

/* ---- poll -------------------------------------------------------------------------------- */

int mlp_poll(struct pollfd *fds, nfds_t n, int64_t timeout_ns, const sigset_t *mask)
{
    struct mlp_sock *stack_socks[64];
    struct pollfd stack_k[66];
    struct mlp_sock **socks = n <= 64 ? stack_socks : calloc(n, sizeof *socks);
    struct pollfd *k = n <= 64 ? stack_k : calloc(n + 2, sizeof *k);
    if (!socks || !k) {
        if (n > 64) {
            free(socks);
            free(k);
        }
        return -ENOMEM;
    }
    int naccel = 0;
    for (nfds_t i = 0; i < n; i++) {
        socks[i] = mlp_get(fds[i].fd);
        if (socks[i] && (socks[i]->type != MLP_CONN || socks[i]->state == MLP_TCP)) {
            mlp_put(socks[i]);
            socks[i] = NULL;
        }
        naccel += socks[i] != NULL;
    }
    uint64_t deadline = timeout_ns < 0 ? 0 : mlp_now_ns() + (uint64_t)timeout_ns;
    bool spun = false;
    int ret;
    for (;;) {
        /* 1. What is ready now, without sleeping. */
        int ready = 0;
        for (nfds_t i = 0; i < n; i++) {
            fds[i].revents = 0;
            if (!socks[i])
                continue;
            short r = mlp_sock_revents(socks[i], fds[i].fd, fds[i].events);
            if (r < 0) { /* it fell to TCP */
                mlp_put(socks[i]);
                socks[i] = NULL;
                continue;
            }
            fds[i].revents = r;
            ready += r != 0;
        }
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
                    ml_store_relaxed(&socks[i]->ch->rx.ctl->rx_cpu, (uint32_t)me);
            uint64_t budget = __ml_spin_budget_ns(&mlp_poll_spin, (uint32_t)pcpu);
            if (budget) {
                uint64_t end = mlp_now_ns() + budget;
                bool hit = false;
                for (unsigned it = 1; !hit; it++) {
                    for (nfds_t i = 0; i < n && !hit; i++)
                        if (socks[i] && mlp_sock_revents(socks[i], fds[i].fd, fds[i].events) > 0)
                            hit = true;
                    ml_cpu_relax();
                    if ((it & 15) == 0 && mlp_now_ns() >= end)
                        break;
                }
                __ml_spin_result(&mlp_poll_spin, hit);
                if (hit)
                    continue;
            }
        }
        /* 3. Arm, and sleep in the kernel on the kernel fds and the doorbell. */
        bool nap = false;
        bool nested = __atomic_load_n(&mlp_nnested, __ATOMIC_RELAXED) != 0;
        if (!ready && timeout_ns != 0) {
            /* Nested sets first: the refresh drains the queue, which must not swallow a post
             * for one of our own sockets after we armed it (we would sleep past it). */
            if (nested)
                mlp_nested_refresh();
            for (nfds_t i = 0; i < n; i++) {
                if (!socks[i])
                    continue;
                if (socks[i]->state == MLP_UNDECIDED)
                    nap = true; /* the claim does not ring: look again soon */
                else if (mlp_arm(socks[i], fds[i].events))
                    ready = -1;
                else if (!mlp_q || mlp_peer_nopost(socks[i]))
                    nap = true;
            }
            if (ready < 0)
                continue;
            if (mlp_q && memlan_evq_arm(mlp_q) == 1) {
                mlp_queue_drain();
                continue;
            }
        }
        nfds_t nk = 0;
        for (nfds_t i = 0; i < n; i++) {
            k[nk] = fds[i];
            if (socks[i]) {
                /* Only the peer's end comes through the kernel, and only until we know of it;
                 * an undecided socket also listens for a server that answers over TCP. */
                struct mlp_sock *s = socks[i];
                k[nk].events = 0;
                if (s->state == MLP_UNDECIDED)
                    k[nk].events = POLLIN | POLLRDHUP;
                else if (__ml_chan_peer_state(s->ch) == ML_SIDE_OPEN && !s->ch->peer_dead)
                    k[nk].events = POLLRDHUP;
            }
            k[nk].revents = 0;
            nk++;
        }
        int bell = -1;
        if (mlp_q && (naccel || nested)) {
            bell = (int)nk;
            k[nk++] = (struct pollfd){.fd = memlan_evq_fd(mlp_q), .events = POLLIN};
        }
        int64_t left = ready ? 0 : mlp_left(deadline);
        if (timeout_ns < 0 && !ready)
            left = -1;
        if (nap && (left < 0 || left > 1000000))
            left = 1000000;
        struct timespec ts = mlp_ts(left < 0 ? 0 : left);
        int r = mlp_real_ppoll(k, nk, left < 0 ? NULL : &ts, mask);
        if (r < 0) {
            ret = -errno;
            break;
        }
        if (bell >= 0 && k[bell].revents)
            mlp_queue_drain();
        int got = 0;
        for (nfds_t i = 0; i < n; i++) {
            if (socks[i]) {
                if (k[i].revents & (POLLRDHUP | POLLHUP | POLLERR)) {
                    mlp_check_peer(socks[i]);
                    short rv = mlp_sock_revents(socks[i], fds[i].fd, fds[i].events);
                    if (rv > 0) {
                        fds[i].revents = rv;
                    } else if (!ready) {
                        nap = true; /* FIN before the peer's state is visible: look again */
                    }
                }
                if (fds[i].revents)
                    got++;
            } else {
                fds[i].revents = k[i].revents;
                if (fds[i].revents)
                    got++;
            }
        }
        if (got || ready || mlp_left(deadline) == 0) {
            ret = got;
            break;
        }
        if (nap) {
            struct timespec d = {0, 1000000};
            nanosleep(&d, NULL);
        }
        /* Woken by the doorbell or a spurious FIN: compute again. */
    }
    for (nfds_t i = 0; i < n; i++)
        if (socks[i])
            mlp_put(socks[i]);
    if (n > 64) {
        free(socks);
        free(k);
    }
    return ret;
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
    int r = mlp_poll(p, (nfds_t)cnt, timeout_ns, mask);
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
        free(p);
    return r;
}

/* ---- epoll ------------------------------------------------------------------------------- */

/*
 * Per epoll fd, the accelerated members, which the kernel's set does not see as such: each one's
 * kernel fd is registered for EPOLLRDHUP|EPOLLET only (its peer's FIN), tagged so that its events
 * are recognised.  The set also holds two fds of ours: the process's doorbell and the set's own
 * eventfd, which another thread rings after it put members on this set's ready list.
 *
 * One mutex guards every set's members and ready list: members are few per call, the work under
 * it is short, and a single-threaded server (most of them) never contends for it.  A member holds
 * a reference on its socket; it goes when the socket's last fd is closed or the set is closed.
 */
#define MLP_TAG      0x6d6c000000000000ull /* never a user-space pointer */
#define MLP_TAG_MASK 0xffff000000000000ull
#define MLP_TAG_BELL (MLP_TAG | 0xffffffffull)
#define MLP_TAG_WAKE (MLP_TAG | 0xfffffffeull)
#define MLP_EXCL_OK  (EPOLLIN | EPOLLOUT | EPOLLRDNORM | EPOLLWRNORM | EPOLLERR | EPOLLHUP | \
                      EPOLLWAKEUP | EPOLLET | EPOLLEXCLUSIVE)

struct mlp_ep;

struct mlp_member {
    struct mlp_ep *ep;
    int fd;
    struct mlp_sock *s;                 /* a reference */
    uint32_t events;
    epoll_data_t data;
    bool disabled;                      /* EPOLLONESHOT fired */
    bool queued;                        /* on ep's ready list */
    uint32_t undecided_seen;            /* edge-triggered, undecided: bits already reported */
    struct mlp_member *rprev, *rnext;   /* the ready list */
    struct mlp_member *snext;           /* the socket's memberships */
};

struct mlp_ep {
    struct mlp_member **byfd;           /* fd -> member */
    int nbyfd;
    int n;                              /* members */
    struct mlp_member *rhead, *rtail;   /* ready list */
    int nready;
    uint64_t gen;                       /* insertions into the ready list */
    int sleepers;                       /* threads asleep in the kernel on this set */
    int waiters;                        /* threads inside epoll_wait on this set */
    int efd;                            /* eventfd, -1 until needed */
    bool efd_rung;
    bool in_kernel;                     /* doorbell and eventfd added to the kernel set */
    bool tagged;                        /* an entry with our tag was ever put in the kernel set */
    bool nested;                        /* this set is itself a member of another set */
    uint32_t peer_cpu;                  /* where the peer of the last ready socket waited + 1 */
    struct mlp_ep *next_free;
};

static struct mlp_ep **mlp_eps;
static int mlp_neps;
static int mlp_eps_max = -1;          /* highest epoll fd that ever had a set */
static struct mlp_ep *mlp_eps_free;   /* closed sets, reused: never freed, since another thread
                                       * may still be inside epoll_wait on a closed epoll fd */
static pthread_mutex_t mlp_eps_mu = PTHREAD_MUTEX_INITIALIZER; /* the table of sets */
static pthread_mutex_t mlp_epmu = PTHREAD_MUTEX_INITIALIZER;   /* members and ready lists */
int mlp_nnested;                      /* sets that are members of other sets */

/* The epoll fds the program made (below 65536; a higher one, or a duplicate, is looked up). */
static _Atomic uint8_t mlp_epfd[1 << 16];

void mlp_epoll_created(int epfd)
{
    if (epfd >= 0 && epfd < (1 << 16))
        atomic_store_explicit(&mlp_epfd[epfd], 1, memory_order_relaxed);
}


static struct mlp_ep *mlp_ep_get(int epfd, bool create)
{
    if (epfd < 0)
        return NULL;
    if (!mlp_eps) {
        if (!create)
            return NULL;
        pthread_mutex_lock(&mlp_eps_mu);
        if (!mlp_eps) {
            void *p;
            if (__ml_sys_mmap(&p, NULL, (1u << 20) * sizeof(void *), PROT_READ | PROT_WRITE,
                              MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0) == 0) {
                mlp_neps = 1 << 20;
                mlp_eps = p;
            }
        }
        pthread_mutex_unlock(&mlp_eps_mu);
    }
    if (!mlp_eps || epfd >= mlp_neps)
        return NULL;
    struct mlp_ep *e = __atomic_load_n(&mlp_eps[epfd], __ATOMIC_ACQUIRE);
    if (e || !create)
        return e;
    pthread_mutex_lock(&mlp_eps_mu);
    e = mlp_eps[epfd];
    if (!e) {
        if ((e = mlp_eps_free))
            mlp_eps_free = e->next_free;
        else
            e = malloc(sizeof *e);
        if (e) {
            /* A reused set is reset under the members' lock: a thread still waiting on the
             * closed epoll fd it belonged to may touch its counters. */
            pthread_mutex_lock(&mlp_epmu);
            memset(e, 0, sizeof *e);
            e->efd = -1;
            pthread_mutex_unlock(&mlp_epmu);
            if (epfd > mlp_eps_max)
                mlp_eps_max = epfd;
            __atomic_store_n(&mlp_eps[epfd], e, __ATOMIC_RELEASE);
        }
    }
    pthread_mutex_unlock(&mlp_eps_mu);
    return e;
}

bool mlp_epoll_has_ours(int epfd)
{
    if (__atomic_load_n(&mlp_nnested, __ATOMIC_RELAXED))
        return true; /* any set may hold a nested set whose readiness is ours to check */
    /* A set whose kernel side ever held one of our tagged entries (the doorbell, the eventfd, a
     * member's kernel fd, which a forked child's copy keeps there after our close) stays ours
     * with no member left: its events carry our tags, which must never reach the program
     * (nginx took the doorbell's tag for a connection pointer: its workers died of SIGBUS after
     * each accelerated connection closed). */
    struct mlp_ep *e = mlp_ep_get(epfd, false);
    return e && (__atomic_load_n(&e->n, __ATOMIC_RELAXED) > 0 ||
                 __atomic_load_n(&e->tagged, __ATOMIC_RELAXED));
}

/* ---- the ready list (mlp_epmu held) ---- */

static void mlp_ep_ring(struct mlp_ep *e)
{
    if (e->efd_rung || e->efd < 0)
        return;
    uint64_t one = 1;
    (void)__ml_sys_write(e->efd, &one, sizeof one);
    e->efd_rung = true;
}

static uint32_t mlp_ev_from_poll(int rev);

/* Is m worth reporting now?  Unknown (undecided, gone to TCP, or cannot tell): yes. */
static bool mlp_member_ready(struct mlp_member *m)
{
    struct mlp_sock *s = m->s;
    if (m->disabled)
        return false;
    if (s->type != MLP_CONN || s->state != MLP_ACCEL || !s->ch)
        return true;
    int rev = mlp_revents(s, m->fd);
    return rev < 0 || (mlp_ev_from_poll(rev) & (m->events | EPOLLERR | EPOLLHUP)) != 0;
}

static void mlp_rl_push(struct mlp_member *m)
{
    struct mlp_ep *e = m->ep;
    if (m->queued || m->disabled)
        return;
    m->queued = true;
    m->rnext = NULL;
    m->rprev = e->rtail;
    if (e->rtail)
        e->rtail->rnext = m;
    else
        e->rhead = m;
    e->rtail = m;
    e->nready++;
    e->gen++;
    /* A set inside another looks readable to it through the eventfd: only while a member is
     * really ready, as the kernel's set answers a poll by checking its ready list. */
    if (e->sleepers || (e->nested && mlp_member_ready(m)))
        mlp_ep_ring(e);
}

static void mlp_rl_del(struct mlp_member *m)
{
    struct mlp_ep *e = m->ep;
    if (!m->queued)
        return;
    if (m->rprev)
        m->rprev->rnext = m->rnext;
    else
        e->rhead = m->rnext;
    if (m->rnext)
        m->rnext->rprev = m->rprev;
    else
        e->rtail = m->rprev;
    m->queued = false;
    e->nready--;
}

/* A socket changed: every set it is in may have something to say. */
static void mlp_mark_sock(struct mlp_sock *s)
{
    if (!__atomic_load_n(&s->epm, __ATOMIC_RELAXED))
        return;
    /* EPOLLEXCLUSIVE as the kernel's wake-up does it: the memberships with it are visited in
     * turn and the visit stops at the first set that a thread is waiting on; the sets before it
     * (nobody waiting) keep the event on their ready lists. */
    bool woke = false;
    pthread_mutex_lock(&mlp_epmu);
    for (struct mlp_member *m = s->epm; m; m = m->snext) {
        if (!(m->events & EPOLLEXCLUSIVE)) {
            mlp_rl_push(m);
        } else if (!woke) {
            mlp_rl_push(m);
            woke = __atomic_load_n(&m->ep->waiters, __ATOMIC_RELAXED) > 0;
        }
    }
    pthread_mutex_unlock(&mlp_epmu);
}

/* Unlink m everywhere and free it; returns its socket reference for the caller to drop once the
 * lock is released. */
static struct mlp_sock *mlp_member_free(struct mlp_member *m)
{
    struct mlp_ep *e = m->ep;
    struct mlp_sock *s = m->s;
    mlp_rl_del(m);
    for (struct mlp_member **pp = &s->epm; *pp; pp = &(*pp)->snext)
        if (*pp == m) {
            *pp = m->snext;
            break;
        }
    if (m->fd < e->nbyfd && e->byfd[m->fd] == m)
        e->byfd[m->fd] = NULL;
    __atomic_store_n(&e->n, e->n - 1, __ATOMIC_RELAXED);
    free(m);
    return s;
}

static void mlp_put_all(struct mlp_sock **v, int n)
{
    for (int i = 0; i < n; i++)
        mlp_put(v[i]);
}

/* close(fd) of an epoll fd: forget its members. */
void mlp_epoll_forget_fd(int fd)
{
    /* On every close(): a load first, so that closing ordinary fds writes nothing. */
    if (fd >= 0 && fd < (1 << 16) && atomic_load_explicit(&mlp_epfd[fd], memory_order_relaxed))
        atomic_store_explicit(&mlp_epfd[fd], 0, memory_order_relaxed);
    if (!mlp_eps || fd < 0 || fd >= mlp_neps || !__atomic_load_n(&mlp_eps[fd], __ATOMIC_RELAXED))
        return;
    struct mlp_ep *e = __atomic_exchange_n(&mlp_eps[fd], NULL, __ATOMIC_ACQ_REL);
    if (!e)
        return;
    for (;;) {
        struct mlp_sock *puts[64];
        int np = 0;
        pthread_mutex_lock(&mlp_epmu);
        for (int i = 0; i < e->nbyfd && np < 64; i++)
            if (e->byfd[i])
                puts[np++] = mlp_member_free(e->byfd[i]);
        pthread_mutex_unlock(&mlp_epmu);
        mlp_put_all(puts, np);
        if (np < 64)
            break;
    }
    pthread_mutex_lock(&mlp_epmu);
    if (e->nested) {
        e->nested = false;
        __atomic_sub_fetch(&mlp_nnested, 1, __ATOMIC_RELAXED);
    }
    if (e->efd >= 0) {
        mlp_disown_fd(e->efd);
        __ml_sys_close(e->efd);
        e->efd = -1;
    }
    free(e->byfd);
    e->byfd = NULL;
    e->nbyfd = 0;
    pthread_mutex_unlock(&mlp_epmu);
    pthread_mutex_lock(&mlp_eps_mu);
    e->next_free = mlp_eps_free;
    mlp_eps_free = e;
    pthread_mutex_unlock(&mlp_eps_mu);
}

/* exit(): every epoll set lets go of its members, as the kernel's sets do when the process's
 * files close, so that the sockets' last references go and their peers read EOF at once (a
 * forked child that exits while its parent has already closed: the child is the last holder). */
void mlp_epoll_at_exit(void)
{
    if (!mlp_eps)
        return;
    for (int fd = 0; fd < mlp_neps && fd <= mlp_eps_max; fd++)
        mlp_epoll_forget_fd(fd);
}

/* The socket's last fd is closing: it leaves every set, as the kernel's file does. */
void mlp_epoll_sock_gone(struct mlp_sock *s)
{
    if (!__atomic_load_n(&s->epm, __ATOMIC_RELAXED))
        return;
    struct mlp_sock *puts[64];
    int np = 0;
    pthread_mutex_lock(&mlp_epmu);
    while (s->epm && np < 64)
        puts[np++] = mlp_member_free(s->epm);
    pthread_mutex_unlock(&mlp_epmu);
    mlp_put_all(puts, np);
    if (s->epm)
        mlp_epoll_sock_gone(s);
}

/* After fork: our queue is new, so every member must arm again, and the set needs our doorbell. */
static void mlp_epoll_after_fork(void)
{
    pthread_mutex_init(&mlp_epmu, NULL);
    pthread_mutex_init(&mlp_eps_mu, NULL);
    if (!mlp_eps)
        return;
    for (int fd = 0; fd < mlp_neps && fd <= mlp_eps_max; fd++) {
        struct mlp_ep *e = mlp_eps[fd];
        if (!e)
            continue;
        e->in_kernel = false;
        e->sleepers = 0;
        for (int i = 0; i < e->nbyfd; i++)
            if (e->byfd[i])
                mlp_rl_push(e->byfd[i]);
    }
}

static uint32_t mlp_ev_from_poll(int rev)
{
    uint32_t ev = 0;
    if (rev & POLLIN) ev |= EPOLLIN | EPOLLRDNORM;
    if (rev & POLLOUT) ev |= EPOLLOUT | EPOLLWRNORM;
    if (rev & POLLRDHUP) ev |= EPOLLRDHUP;
    if (rev & POLLHUP) ev |= EPOLLHUP;
    if (rev & POLLERR) ev |= EPOLLERR;
    return ev;
}

/* The doorbell and the set's eventfd go into the kernel set once. */
static void mlp_ep_setup(int epfd, struct mlp_ep *e)
{
    if (e->in_kernel)
        return;
    memlan_evq_t *q = mlp_queue();
    pthread_mutex_lock(&mlp_epmu);
    if (e->efd < 0) {
        long fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
        if (fd >= 0) {
            e->efd = (int)fd;
            mlp_own_fd(&e->efd, true);
        }
    }
    int efd = e->efd;
    pthread_mutex_unlock(&mlp_epmu);
    bool ok = q != NULL && efd >= 0;
    __atomic_store_n(&e->tagged, true, __ATOMIC_RELAXED); /* before: see mlp_epoll_has_ours() */
    if (q && !e->nested) {
        struct epoll_event bev = {.events = EPOLLIN, .data.u64 = MLP_TAG_BELL};
        if (mlp_real_epoll_ctl(epfd, EPOLL_CTL_ADD, memlan_evq_fd(q), &bev) < 0 && errno != EEXIST)
            ok = false;
    }
    if (efd >= 0) {
        struct epoll_event wev = {.events = EPOLLIN, .data.u64 = MLP_TAG_WAKE};
        if (mlp_real_epoll_ctl(epfd, EPOLL_CTL_ADD, efd, &wev) < 0 && errno != EEXIST)
            ok = false;
    }
    e->in_kernel = ok;
}

static bool mlp_is_epoll_fd(int fd)
{
    if (fd >= 0 && fd < (1 << 16))
        return atomic_load_explicit(&mlp_epfd[fd], memory_order_relaxed) != 0;
    char path[48], link[32];
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    ssize_t n = readlink(path, link, sizeof link - 1);
    if (n < 0)
        return false;
    link[n] = 0;
    return strcmp(link, "anon_inode:[eventpoll]") == 0;
}

/* The set at fd goes into another set.  Its readiness there must be its members': the doorbell
 * leaves its kernel set (any post would make it look readable), and its eventfd says whether a
 * member is ready.  Waits on it, and every wait of the process, take the doorbell's part. */
static void mlp_ep_make_nested(int fd)
{
    struct mlp_ep *inner = mlp_ep_get(fd, true);
    if (!inner)
        return;
    pthread_mutex_lock(&mlp_epmu);
    bool first = !inner->nested;
    inner->nested = true;
    pthread_mutex_unlock(&mlp_epmu);
    if (!first)
        return;
    __atomic_add_fetch(&mlp_nnested, 1, __ATOMIC_RELAXED);
    if (mlp_q)
        (void)mlp_real_epoll_ctl(fd, EPOLL_CTL_DEL, memlan_evq_fd(mlp_q), NULL);
    mlp_ep_nested_leave(inner);
}

int mlp_epoll_ctl(int epfd, int op, int fd, struct epoll_event *ev, bool *handled)
{
    *handled = false;
    struct mlp_sock *s = mlp_get(fd);
    struct mlp_ep *e0 = mlp_ep_get(epfd, false);
    struct mlp_member *known = NULL;
    if (e0) {
        pthread_mutex_lock(&mlp_epmu);
        if (fd >= 0 && fd < e0->nbyfd)
            known = e0->byfd[fd];
        pthread_mutex_unlock(&mlp_epmu);
    }
    bool ours = s && s->type == MLP_CONN && s->state != MLP_TCP;
    if (!ours) {
        if (known) {
            /* It fell to TCP (or fd is something else now): forget the member, and the
             * application's call goes to the kernel as it is (ADD gets EEXIST, as it would). */
            struct mlp_sock *old = NULL;
            pthread_mutex_lock(&mlp_epmu);
            if (fd < e0->nbyfd && e0->byfd[fd] == known)
                old = mlp_member_free(known);
            pthread_mutex_unlock(&mlp_epmu);
            if (old)
                mlp_put(old);
        } else if (op == EPOLL_CTL_ADD && !s) {
            /* An epoll fd inside another: it must look readable to the outer set when our
             * members are ready. */
            if (mlp_is_epoll_fd(fd))
                mlp_ep_make_nested(fd);
        }
        if (s)
            mlp_put(s);
        return 0;
    }
    *handled = true;
    if (op != EPOLL_CTL_ADD && op != EPOLL_CTL_MOD && op != EPOLL_CTL_DEL) {
        mlp_put(s);
        return -EINVAL;
    }
    if (op != EPOLL_CTL_DEL && !ev) {
        mlp_put(s);
        return -EFAULT;
    }
    uint32_t want = ev ? ev->events : 0;
    if (op == EPOLL_CTL_ADD && (want & EPOLLEXCLUSIVE) && (want & ~(uint32_t)MLP_EXCL_OK)) {
        mlp_put(s);
        return -EINVAL;
    }
    struct mlp_ep *e = mlp_ep_get(epfd, true);
    if (!e) {
        mlp_put(s);
        return -ENOMEM;
    }
    /* The kernel checks epfd, fd, op, EEXIST/ENOENT and EPOLLEXCLUSIVE with MOD for us, on the
     * kernel fd.  Edge-triggered: the FIN is reported once, not on every wait after it. */
    struct epoll_event kev = {.events = EPOLLRDHUP | EPOLLET, .data.u64 = MLP_TAG | (uint32_t)fd};
    if (want & EPOLLEXCLUSIVE)
        kev.events = EPOLLIN | EPOLLET | EPOLLEXCLUSIVE; /* RDHUP is not allowed with it */
    if (op != EPOLL_CTL_DEL)
        __atomic_store_n(&e->tagged, true, __ATOMIC_RELAXED);
    int r = mlp_real_epoll_ctl(epfd, op, fd, op == EPOLL_CTL_DEL ? NULL : &kev);
    if (r < 0) {
        r = -errno;
        mlp_put(s);
        return r;
    }
    struct mlp_sock *drop[3] = {NULL, NULL, NULL};
    pthread_mutex_lock(&mlp_epmu);
    struct mlp_member *m = fd < e->nbyfd ? e->byfd[fd] : NULL;
    if (m && m->s != s) { /* a member for a socket this fd no longer names */
        drop[0] = mlp_member_free(m);
        m = NULL;
    }
    if (op == EPOLL_CTL_DEL) {
        if (m)
            drop[1] = mlp_member_free(m);
        drop[2] = s;
    } else {
        if (!m) {
            if (fd >= e->nbyfd) {
                int nn = e->nbyfd ? e->nbyfd : 64;
                while (nn <= fd)
                    nn *= 2;
                void *p = realloc(e->byfd, (size_t)nn * sizeof *e->byfd);
                if (p) {
                    memset((struct mlp_member **)p + e->nbyfd, 0,
                           (size_t)(nn - e->nbyfd) * sizeof *e->byfd);
                    e->byfd = p;
                    e->nbyfd = nn;
                }
            }
            if (fd < e->nbyfd && (m = calloc(1, sizeof *m))) {
                m->ep = e;
                m->fd = fd;
                m->s = s; /* our reference becomes the member's */
                m->snext = s->epm;
                __atomic_store_n(&s->epm, m, __ATOMIC_RELEASE);
                e->byfd[fd] = m;
                __atomic_store_n(&e->n, e->n + 1, __ATOMIC_RELAXED);
            } else {
                pthread_mutex_unlock(&mlp_epmu);
                (void)mlp_real_epoll_ctl(epfd, EPOLL_CTL_DEL, fd, NULL);
                if (drop[0])
                    mlp_put(drop[0]);
                mlp_put(s);
                return -ENOMEM;
            }
        } else {
            drop[2] = s; /* the member has its reference already */
        }
        m->events = want;
        m->data = ev->data;
        m->disabled = false;
        m->undecided_seen = 0;
        mlp_rl_del(m);
        mlp_rl_push(m); /* like the kernel's insert: looked at on the next wait */
    }
    pthread_mutex_unlock(&mlp_epmu);
    for (int i = 0; i < 3; i++)
        if (drop[i])
            mlp_put(drop[i]);
    if (op != EPOLL_CTL_DEL)
        mlp_ep_setup(epfd, e);
    return 0;
}

/* A member whose socket fell to TCP: hand it to the kernel with the application's events, and
 * forget it (mlp_epmu held).  Returns the reference to drop. */
static struct mlp_sock *mlp_member_to_kernel(int epfd, struct mlp_member *m)
{
    struct epoll_event kev = {.events = m->disabled ? 0 : m->events, .data = m->data};
    kev.events &= ~(uint32_t)EPOLLEXCLUSIVE;
    (void)mlp_real_epoll_ctl(epfd, EPOLL_CTL_MOD, m->fd, &kev);
    return mlp_member_free(m);
}

/* Take up to max ready events off e's ready list (mlp_epmu held).  Sockets to drop go to puts.
 * *undecided: some member waits for its connection to settle (it must be looked at again soon). */
static int mlp_ep_harvest(int epfd, struct mlp_ep *e, struct epoll_event *out, int max,
                          bool *undecided, struct mlp_sock **puts, int *np)
{
    int got = 0;
    for (int k = e->nready; k > 0 && got < max && e->rhead && *np < 64; k--) {
        struct mlp_member *m = e->rhead;
        mlp_rl_del(m);
        struct mlp_sock *s = m->s;
        if (m->disabled)
            continue;
        int looks = 0;
    look:;
        int rev = s->type == MLP_CONN && s->state != MLP_TCP ? mlp_revents(s, m->fd) : -1;
        if (rev < 0) {
            puts[(*np)++] = mlp_member_to_kernel(epfd, m);
            continue;
        }
        uint32_t ev = mlp_ev_from_poll(rev) & (m->events | EPOLLERR | EPOLLHUP);
        bool und = s->state == MLP_UNDECIDED;
        if (und) {
            *undecided = true;
            if (m->events & EPOLLET) {
                uint32_t fresh = ev & ~m->undecided_seen;
                m->undecided_seen |= ev;
                ev = fresh;
            }
        }
        if (ev) {
            out[got].events = ev;
            out[got].data = m->data;
            got++;
            if (!und && s->ch) {
                /* Same-core detection for the spin (as recv and poll do): where the peer waits,
                 * and where we do. */
                e->peer_cpu = ml_load_relaxed(&s->ch->tx.ctl->rx_cpu);
                ml_store_relaxed(&s->ch->rx.ctl->rx_cpu, (uint32_t)(__ml_getcpu() + 1));
            }
            if (m->events & EPOLLONESHOT)
                m->disabled = true;
            else if (und || !(m->events & EPOLLET))
                mlp_rl_push(m); /* level-triggered: looked at again on the next wait */
            else
                (void)mlp_arm(s, (short)(m->events & 0xffff)); /* the next change posts again */
        } else if (und) {
            mlp_rl_push(m);
        } else if (mlp_arm(s, (short)(m->events & 0xffff))) {
            /* It changed as we armed.  Look at it again now: its writer may have written before
             * it could see the tripwire, and then no post comes; a caller that got nothing here
             * would sleep past the data (a ping-pong server hung so).  Only this member: the
             * others may already be in this answer, and the kernel reports an fd once per call. */
            if (++looks < 3)
                goto look;
            mlp_rl_push(m);
            *undecided = true; /* still changing: the caller naps 1 ms rather than sleeping */
        } else if (!mlp_q) {
            mlp_rl_push(m); /* cannot be armed: look again */
        }
    }
    return got;
}

static int mlp_ep_collect(int epfd, struct mlp_ep *e, struct epoll_event *out, int max,
                          bool *undecided, uint64_t *gen)
{
    struct mlp_sock *puts[64];
    int np = 0;
    mlp_queue_drain();
    pthread_mutex_lock(&mlp_epmu);
    int got = e->rhead ? mlp_ep_harvest(epfd, e, out, max, undecided, puts, &np) : 0;
    if (gen)
        *gen = e->gen;
    pthread_mutex_unlock(&mlp_epmu);
    mlp_put_all(puts, np);
    return got;
}

/* A set inside another set looks readable to the outer one through its eventfd: keep that true
 * to the members (mlp_epmu held).  Members found not ready leave the ready list armed, as a wait
 * would leave them; the eventfd stays rung only while one is ready or cannot be told. */
static void mlp_ep_prune(struct mlp_ep *e)
{
    bool ready = false;
    for (int k = e->nready; k > 0 && e->rhead && !ready; k--) {
        struct mlp_member *m = e->rhead;
        mlp_rl_del(m);
        if (m->disabled)
            continue;
        if (mlp_member_ready(m) || mlp_arm(m->s, (short)(m->events & 0xffff)) || !mlp_q) {
            ready = true; /* back on the list (at its tail) for the next wait to report */
            mlp_rl_push(m);
        }
    }
    if (ready) {
        mlp_ep_ring(e);
    } else if (e->efd_rung) { /* the list is empty now */
        uint64_t v;
        (void)__ml_sys_read(e->efd, &v, sizeof v);
        e->efd_rung = false;
    }
}

static void mlp_ep_nested_leave(struct mlp_ep *e)
{
    pthread_mutex_lock(&mlp_epmu);
    mlp_ep_prune(e);
    pthread_mutex_unlock(&mlp_epmu);
    if (mlp_q && memlan_evq_arm(mlp_q) == 1)
        mlp_queue_drain(); /* rings e's eventfd if it concerns e */
}

/* Before any wait of a process that has nested sets sleeps: take the queue's events and make
 * every nested set's readiness true, so that an outer set (or poll) reports an inner one only
 * when a member of it is ready.  The sleeping wait has the doorbell, which nested sets do not. */
static void mlp_nested_refresh(void)
{
    if (!__atomic_load_n(&mlp_nnested, __ATOMIC_RELAXED) || !mlp_eps)
        return;
    mlp_queue_drain();
    pthread_mutex_lock(&mlp_epmu);
    for (int fd = 0; fd <= mlp_eps_max && fd < mlp_neps; fd++) {
        struct mlp_ep *e = __atomic_load_n(&mlp_eps[fd], __ATOMIC_ACQUIRE);
        if (e && e->nested)
            mlp_ep_prune(e);
    }
    pthread_mutex_unlock(&mlp_epmu);
    if (mlp_q && memlan_evq_arm(mlp_q) == 1)
        mlp_queue_drain();
}

int mlp_epoll_wait(int epfd, struct epoll_event *out, int max, int64_t timeout_ns,
                   const sigset_t *mask)
{
    struct mlp_ep *e = mlp_ep_get(epfd, false);
    if (max <= 0)
        return -EINVAL;
    if (!e && __atomic_load_n(&mlp_nnested, __ATOMIC_RELAXED))
        e = mlp_ep_get(epfd, true); /* a set with no member of ours may hold a nested one */
    if (!e)
        return -EBADF;
    uint64_t deadline = timeout_ns < 0 ? 0 : mlp_now_ns() + (uint64_t)timeout_ns;
    bool spun = false;
    int ret;
    __atomic_add_fetch(&e->waiters, 1, __ATOMIC_RELAXED);
    for (;;) {
        bool undecided = false;
        uint64_t gen = 0;
        int got = mlp_ep_collect(epfd, e, out, max, &undecided, &gen);
        if (!got && !spun && timeout_ns != 0) {
            spun = true;
            uint64_t budget = __ml_spin_budget_ns(&mlp_poll_spin, e->peer_cpu);
            if (budget) {
                uint64_t end = mlp_now_ns() + budget;
                for (unsigned it = 1;; it++) {
                    if ((got = mlp_ep_collect(epfd, e, out, max, &undecided, &gen)))
                        break;
                    ml_cpu_relax();
                    if ((it & 3) == 0 && mlp_now_ns() >= end)
                        break;
                }
                __ml_spin_result(&mlp_poll_spin, got > 0);
            }
        }
        bool slept = false;
        if (!got && timeout_ns != 0) {
            mlp_ep_setup(epfd, e);
            mlp_nested_refresh();
            pthread_mutex_lock(&mlp_epmu);
            bool changed = e->gen != gen;
            if (!changed)
                e->sleepers++;
            pthread_mutex_unlock(&mlp_epmu);
            if (changed)
                continue;
            slept = true;
            if (!mlp_q || !e->in_kernel || ml_load_relaxed(&mlp_nopost_seen)) {
                undecided = true; /* no doorbell to wake us: nap and look again */
            } else if (memlan_evq_arm(mlp_q) == 1) {
                pthread_mutex_lock(&mlp_epmu); /* a post came in as we armed: collect it */
                e->sleepers--;
                pthread_mutex_unlock(&mlp_epmu);
                continue;
            }
        }
        int64_t left = got ? 0 : mlp_left(deadline);
        if (timeout_ns < 0 && !got)
            left = -1;
        if (undecided && !got && (left < 0 || left > 1000000))
            left = 1000000;
        int room = max - got;
        int r = 0;
        bool bell = false;
        if (room > 0 && left != 0 && e->nested && mlp_q) {
            /* The doorbell is not in a nested set's kernel set: sleep on both, then look. */
            struct timespec ts = mlp_ts(left < 0 ? 0 : left);
            struct pollfd pf[2] = {{.fd = epfd, .events = POLLIN},
                                   {.fd = memlan_evq_fd(mlp_q), .events = POLLIN}};
            r = mlp_real_ppoll(pf, 2, left < 0 ? NULL : &ts, mask);
            if (r < 0)
                r = -errno;
            else
                bell = pf[1].revents != 0;
            left = 0;
        }
        if (room > 0 && r >= 0) {
            struct timespec ts = mlp_ts(left < 0 ? 0 : left);
            r = mlp_real_epoll_pwait2 ? mlp_real_epoll_pwait2(epfd, out + got, room,
                                                               left < 0 ? NULL : &ts, mask)
                                      : mlp_real_epoll_pwait(epfd, out + got, room,
                                                             left < 0 ? -1
                                                                      : (int)((left + 999999) / 1000000),
                                                             mask);
            if (r < 0)
                r = -errno;
        }
        if (slept) {
            pthread_mutex_lock(&mlp_epmu);
            if (--e->sleepers == 0 && e->efd_rung && !e->nested) {
                uint64_t v;
                (void)__ml_sys_read(e->efd, &v, sizeof v);
                e->efd_rung = false;
            }
            pthread_mutex_unlock(&mlp_epmu);
        }
        if (r < 0) {
            ret = got ? got : r;
            break;
        }
        /* Keep the application's events; act on ours. */
        int w = got;
        bool again = bell;
        for (int i = got; i < got + r; i++) {
            uint64_t d = out[i].data.u64;
            if ((d & MLP_TAG_MASK) == MLP_TAG) {
                if (d != MLP_TAG_BELL && d != MLP_TAG_WAKE) {
                    struct mlp_sock *s = mlp_get((int)(uint32_t)d);
                    if (s) {
                        mlp_check_peer(s);
                        mlp_mark_sock(s);
                        mlp_put(s);
                    }
                }
                again = true;
                continue;
            }
            out[w++] = out[i];
        }
        /* Our sockets were collected before the kernel call: collect again only if that found
         * nothing, or a socket would be reported twice in one answer. */
        if (again && got == 0 && w < max)
            w += mlp_ep_collect(epfd, e, out + w, max - w, &undecided, NULL);
        if (w || mlp_left(deadline) == 0) {
            ret = w;
            break;
        }
    }
    __atomic_sub_fetch(&e->waiters, 1, __ATOMIC_RELAXED);
    if (e->nested)
        mlp_ep_nested_leave(e);
    return ret;
}

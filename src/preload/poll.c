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
 * This first version scans the accelerated members of a set on every wait (O(members)); the
 * event queue already says which channels changed, which is where the scalable epoll goes next.
 */
#include "preload.h"
#include "sys/sys.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

static memlan_evq_t *mlp_q;
static pthread_mutex_t mlp_q_mu = PTHREAD_MUTEX_INITIALIZER;
static struct ml_spin mlp_poll_spin;

void mlp_poll_after_fork(void)
{
    /* The parent's queue is the parent's: its doorbell would wake the parent.  Forget it (the
     * fd is shared, so not closed) and make our own on first use. */
    mlp_q = NULL;
    pthread_mutex_init(&mlp_q_mu, NULL);
}

void mlp_poll_forget(struct mlp_sock *s) { (void)s; }

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

static memlan_evq_t *mlp_queue(void)
{
    if (mlp_q || !mlp_fab)
        return mlp_q;
    pthread_mutex_lock(&mlp_q_mu);
    if (!mlp_q) {
        memlan_evq_t *q;
        if (memlan_evq_create(mlp_fab, 65536, &q) == 0) {
            int *sfd, *bfd;
            __ml_evq_fds(q, &sfd, &bfd);
            mlp_own_fd(sfd, true);
            mlp_own_fd(bfd, true);
            mlp_q = q;
        } else {
            mlp_log(0, "cannot create the event queue: poll falls back to 1 ms naps");
        }
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
    if (s->ch->evq) /* a queue from before fork */
        s->ch->evq = NULL;
    return memlan_evq_add(q, s->ch, MEMLAN_EV_READ | MEMLAN_EV_WRITE, s) == 0;
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
    if (dead && __ml_chan_peer_left_unread(ch))
        rev |= POLLERR | POLLHUP;
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

/* Arm s for the events asked; true if it turned ready meanwhile (do not sleep). */
static bool mlp_arm(struct mlp_sock *s, short events)
{
    if (!mlp_queue_add(s))
        return false;
    uint32_t ev = 0;
    if (events & (POLLIN | POLLRDNORM | POLLRDHUP))
        ev |= MEMLAN_EV_READ;
    if (events & (POLLOUT | POLLWRNORM))
        ev |= MEMLAN_EV_WRITE;
    return ev && __ml_chan_arm_evq(s->ch, ev);
}

/* Drain the queue's events (we recompute readiness ourselves). */
static void mlp_queue_drain(void)
{
    if (!mlp_q)
        return;
    struct memlan_event ev[64];
    while (memlan_evq_wait(mlp_q, ev, 64, 0) == 64)
        ;
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
            uint64_t budget = __ml_spin_budget_ns(&mlp_poll_spin, (uint32_t)pcpu);
            if (budget) {
                int me = __ml_getcpu() + 1;
                for (nfds_t i = 0; i < n; i++)
                    if (socks[i] && socks[i]->state == MLP_ACCEL)
                        ml_store_relaxed(&socks[i]->ch->rx.ctl->rx_cpu, (uint32_t)me);
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
        if (!ready && timeout_ns != 0) {
            for (nfds_t i = 0; i < n; i++) {
                if (!socks[i])
                    continue;
                if (socks[i]->state == MLP_UNDECIDED)
                    nap = true; /* the claim does not ring: look again soon */
                else if (mlp_arm(socks[i], fds[i].events))
                    ready = -1;
                else if (!mlp_q)
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
        if (mlp_q && naccel) {
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
 * Per epoll fd: the accelerated members, which the kernel epoll does not see (their kernel fd is
 * registered for EPOLLRDHUP only, tagged so that its events are recognised), and whether the
 * doorbell is in the set.  Members do not hold references: a member whose fd now names another
 * socket (the fd was closed) is dropped, as the kernel drops closed fds.
 */
#define MLP_TAG      0x6d6c000000000000ull /* never a user-space pointer */
#define MLP_TAG_MASK 0xffff000000000000ull
#define MLP_TAG_BELL (MLP_TAG | 0xffffffffull)

struct mlp_member {
    int fd;
    struct mlp_sock *s;
    uint64_t sid;
    uint32_t events;
    epoll_data_t data;
    bool disabled;            /* EPOLLONESHOT fired */
    uint64_t seen;            /* events counter of s when last reported (edge-triggered) */
};

struct mlp_ep {
    pthread_mutex_t mu;
    struct mlp_member *m;
    int n, cap;
    bool bell;
};

static struct mlp_ep **mlp_eps;
static int mlp_neps;
static pthread_mutex_t mlp_eps_mu = PTHREAD_MUTEX_INITIALIZER;

static struct mlp_ep *mlp_ep_get(int epfd, bool create)
{
    if (epfd < 0)
        return NULL;
    if (!mlp_eps) {
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
    if (!e && (e = calloc(1, sizeof *e))) {
        pthread_mutex_init(&e->mu, NULL);
        __atomic_store_n(&mlp_eps[epfd], e, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&mlp_eps_mu);
    return e;
}

bool mlp_epoll_has_ours(int epfd)
{
    struct mlp_ep *e = mlp_ep_get(epfd, false);
    return e && e->n > 0;
}

/* close(epfd): forget its members. */
void mlp_epoll_forget_fd(int fd)
{
    /* On every close(): a load first, so that closing ordinary fds writes nothing. */
    if (!mlp_eps || fd < 0 || fd >= mlp_neps || !__atomic_load_n(&mlp_eps[fd], __ATOMIC_RELAXED))
        return;
    struct mlp_ep *e = __atomic_exchange_n(&mlp_eps[fd], NULL, __ATOMIC_ACQ_REL);
    if (e) {
        free(e->m);
        free(e);
    }
}

static struct mlp_member *mlp_member_find(struct mlp_ep *e, int fd)
{
    for (int i = 0; i < e->n; i++)
        if (e->m[i].fd == fd)
            return &e->m[i];
    return NULL;
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

int mlp_epoll_ctl(int epfd, int op, int fd, struct epoll_event *ev, bool *handled)
{
    *handled = false;
    struct mlp_sock *s = mlp_get(fd);
    struct mlp_ep *e0 = mlp_ep_get(epfd, false);
    struct mlp_member *known = NULL;
    if (e0) {
        pthread_mutex_lock(&e0->mu);
        known = mlp_member_find(e0, fd);
        pthread_mutex_unlock(&e0->mu);
    }
    bool ours = s && s->type == MLP_CONN && s->state != MLP_TCP;
    if (!ours && !known) {
        if (s)
            mlp_put(s);
        return 0;
    }
    *handled = true;
    struct mlp_ep *e = mlp_ep_get(epfd, true);
    if (!e) {
        if (s)
            mlp_put(s);
        return -ENOMEM;
    }
    /* The kernel checks epfd, fd, op and EEXIST/ENOENT for us, on the kernel fd. */
    /* Edge-triggered: the FIN is reported once, not on every wait after it. */
    struct epoll_event kev = {.events = EPOLLRDHUP | EPOLLET, .data.u64 = MLP_TAG | (uint32_t)fd};
    int r = mlp_real_epoll_ctl(epfd, op, fd, op == EPOLL_CTL_DEL ? NULL : &kev);
    if (r < 0) {
        r = -errno;
        if (s)
            mlp_put(s);
        return r;
    }
    pthread_mutex_lock(&e->mu);
    struct mlp_member *m = mlp_member_find(e, fd);
    if (op == EPOLL_CTL_DEL) {
        if (m)
            *m = e->m[--e->n];
    } else if (op == EPOLL_CTL_ADD || op == EPOLL_CTL_MOD) {
        if (!m) {
            if (e->n == e->cap) {
                int cap = e->cap ? 2 * e->cap : 8;
                void *p = realloc(e->m, (size_t)cap * sizeof *e->m);
                if (!p) {
                    pthread_mutex_unlock(&e->mu);
                    if (s)
                        mlp_put(s);
                    return -ENOMEM;
                }
                e->m = p;
                e->cap = cap;
            }
            m = &e->m[e->n++];
            memset(m, 0, sizeof *m);
        }
        m->fd = fd;
        m->s = s;
        m->sid = s ? s->id : 0;
        m->events = ev ? ev->events : 0;
        m->data = ev ? ev->data : (epoll_data_t){0};
        m->disabled = false;
        m->seen = s ? s->evcount - 1 : 0;
    }
    pthread_mutex_unlock(&e->mu);
    if (s)
        mlp_put(s);
    return 0;
}

/* Scan the members: fill out[] with up to max ready events. */
static int mlp_ep_scan(struct mlp_ep *e, struct epoll_event *out, int max)
{
    int got = 0;
    pthread_mutex_lock(&e->mu);
    for (int i = 0; i < e->n && got < max; i++) {
        struct mlp_member *m = &e->m[i];
        struct mlp_sock *s = mlp_get(m->fd);
        if (!s || s != m->s || s->id != m->sid) {
            if (s)
                mlp_put(s);
            *m = e->m[--e->n]; /* the fd was closed (or is something else now) */
            i--;
            continue;
        }
        if (m->disabled) {
            mlp_put(s);
            continue;
        }
        int rev;
        if (s->state == MLP_TCP) {
            /* It fell to TCP after it joined the set: ask the kernel directly. */
            struct pollfd p = {.fd = m->fd, .events = (short)(m->events & 0xffff)};
            rev = mlp_real_poll(&p, 1, 0) > 0 ? p.revents : 0;
        } else {
            rev = mlp_revents(s, m->fd);
        }
        uint32_t ev = mlp_ev_from_poll(rev < 0 ? 0 : rev) &
                      (m->events | EPOLLERR | EPOLLHUP);
        if (ev && (m->events & EPOLLET)) {
            uint64_t c = s->evcount;
            if (c == m->seen)
                ev = 0; /* nothing new since we last reported it */
            else
                m->seen = c;
        }
        if (ev) {
            out[got].events = ev;
            out[got].data = m->data;
            got++;
            if (m->events & EPOLLONESHOT)
                m->disabled = true;
        }
        mlp_put(s);
    }
    pthread_mutex_unlock(&e->mu);
    return got;
}

static void mlp_ep_arm(struct mlp_ep *e, bool *ready, bool *nap)
{
    pthread_mutex_lock(&e->mu);
    for (int i = 0; i < e->n; i++) {
        struct mlp_member *m = &e->m[i];
        struct mlp_sock *s = mlp_get(m->fd);
        if (!s)
            continue;
        if (s == m->s && !m->disabled) {
            if (s->state == MLP_UNDECIDED || s->state == MLP_TCP)
                *nap = true;
            else if (mlp_arm(s, (short)(m->events & 0xffff)))
                *ready = true;
            else if (!mlp_q)
                *nap = true;
        }
        mlp_put(s);
    }
    pthread_mutex_unlock(&e->mu);
}

/* Note which sockets the queue says changed (edge-triggered members report them). */
static void mlp_queue_drain_mark(void)
{
    if (!mlp_q)
        return;
    struct memlan_event ev[64];
    int n;
    do {
        n = memlan_evq_wait(mlp_q, ev, 64, 0);
        for (int i = 0; i < n; i++) {
            struct mlp_sock *s = ev[i].udata;
            if (s)
                atomic_fetch_add(&s->evcount, 1);
        }
    } while (n == 64);
}

int mlp_epoll_wait(int epfd, struct epoll_event *out, int max, int64_t timeout_ns,
                   const sigset_t *mask)
{
    struct mlp_ep *e = mlp_ep_get(epfd, false);
    if (max <= 0)
        return -EINVAL;
    uint64_t deadline = timeout_ns < 0 ? 0 : mlp_now_ns() + (uint64_t)timeout_ns;
    bool spun = false;
    for (;;) {
        mlp_queue_drain_mark();
        int got = mlp_ep_scan(e, out, max);
        if (!got && !spun && timeout_ns != 0 && e->n) {
            spun = true;
            uint64_t budget = __ml_spin_budget_ns(&mlp_poll_spin, 0);
            if (budget) {
                uint64_t end = mlp_now_ns() + budget;
                for (unsigned it = 1;; it++) {
                    if ((got = mlp_ep_scan(e, out, max)))
                        break;
                    ml_cpu_relax();
                    if ((it & 3) == 0 && mlp_now_ns() >= end)
                        break;
                }
                __ml_spin_result(&mlp_poll_spin, got > 0);
            }
        }
        bool nap = false;
        if (!got && timeout_ns != 0) {
            bool ready = false;
            mlp_ep_arm(e, &ready, &nap);
            if (ready)
                continue;
            if (mlp_q && !e->bell) {
                struct epoll_event bev = {.events = EPOLLIN, .data.u64 = MLP_TAG_BELL};
                if (mlp_real_epoll_ctl(epfd, EPOLL_CTL_ADD, memlan_evq_fd(mlp_q), &bev) == 0 ||
                    errno == EEXIST)
                    e->bell = true;
                else
                    nap = true;
            }
            if (mlp_q && memlan_evq_arm(mlp_q) == 1)
                continue;
        }
        int64_t left = got ? 0 : mlp_left(deadline);
        if (timeout_ns < 0 && !got)
            left = -1;
        if (nap && (left < 0 || left > 1000000))
            left = 1000000;
        int room = max - got;
        int r = 0;
        if (room > 0) {
            struct timespec ts = mlp_ts(left < 0 ? 0 : left);
            r = mlp_real_epoll_pwait2 ? mlp_real_epoll_pwait2(epfd, out + got, room,
                                                               left < 0 ? NULL : &ts, mask)
                                      : mlp_real_epoll_pwait(epfd, out + got, room,
                                                             left < 0 ? -1
                                                                      : (int)((left + 999999) / 1000000),
                                                             mask);
            if (r < 0) {
                if (got)
                    return got;
                return -errno;
            }
        }
        /* Keep the application's events; act on ours. */
        int w = got;
        bool again = false;
        for (int i = got; i < got + r; i++) {
            uint64_t d = out[i].data.u64;
            if ((d & MLP_TAG_MASK) == MLP_TAG) {
                if (d != MLP_TAG_BELL) {
                    struct mlp_sock *s = mlp_get((int)(uint32_t)d);
                    if (s) {
                        mlp_check_peer(s);
                        atomic_fetch_add(&s->evcount, 1);
                        mlp_put(s);
                    }
                }
                again = true;
                continue;
            }
            out[w++] = out[i];
        }
        /* Our sockets were scanned before the kernel call: scan again only if that found
         * nothing, or a socket would be reported twice in one answer. */
        if (again && got == 0 && w < max) {
            mlp_queue_drain_mark();
            w += mlp_ep_scan(e, out + w, max - w);
        }
        if (w || mlp_left(deadline) == 0)
            return w;
        if (nap && !again) {
            struct timespec d = {0, 1000000};
            nanosleep(&d, NULL);
        }
    }
}

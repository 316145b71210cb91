/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/*
 * epoll.c - epoll over any mix of accelerated and kernel fds, nested sets included.
 *
 * epoll keeps, per epoll set (the kernel's open file: every fd naming it, dup or original, maps
 * to one struct mlp_ep), a ready list of members that may be ready (the kernel's design): the
 * event queue names the sockets that changed, each such socket's memberships go on their sets'
 * lists, and epoll_wait looks only at its list.  A member found not ready leaves the list with its
 * tripwire armed, so the next change posts it again: O(1) per ready socket, never a scan.  The
 * process's queue and the per-thread wake-ups are pqueue.c's; one socket's readiness is poll.c's.
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
/* ---- epoll ------------------------------------------------------------------------------- */

/*
 * Per epoll set (the kernel's open file, which dup and fork share: mlp_eps[] maps each fd naming
 * it to one struct mlp_ep, counted in nfds), the accelerated members, which the kernel's set does
 * not see as such: each one's kernel fd is registered for EPOLLRDHUP|EPOLLET only (its peer's
 * FIN), tagged so that its events are recognised.  The set also holds two fds of ours: the
 * process's doorbell and the set's own eventfd, which another thread rings after it put members
 * on this set's ready list.
 *
 * One mutex guards every set's members and ready list: members are few per call, the work under
 * it is short, and a single-threaded server (most of them) never contends for it.  A member holds
 * a reference on its socket; it goes when the socket's last fd is closed or the set is closed.
 */
#define MLP_TAG      0x6d6c000000000000ull /* never a user-space pointer */
#define MLP_TAG_MASK 0xffff000000000000ull
#define MLP_TAG_BELL (MLP_TAG | 0xffffffffull)
#define MLP_TAG_WAKE (MLP_TAG | 0xfffffffeull)
#define MLP_TAG_SBELL (MLP_TAG | 0xfffffffdull) /* the set's own queue's doorbell */
#define MLP_SETQ_CAP 16384 /* a set's own queue; members beyond it post to the process's */
#define MLP_KPOLL_NS 50000ull /* the kernel set is asked at least this often (OpenOnload's way) */
#define MLP_EXCL_OK  (EPOLLIN | EPOLLOUT | EPOLLRDNORM | EPOLLWRNORM | EPOLLERR | EPOLLHUP | \
                      EPOLLWAKEUP | EPOLLET | EPOLLEXCLUSIVE)

struct mlp_ep;
struct mlp_ep_watch;

struct mlp_member {
    struct mlp_ep *ep;
    int fd;
    struct mlp_sock *s;                 /* a reference */
    uint32_t events;
    epoll_data_t data;
    bool disabled;                      /* EPOLLONESHOT fired, or parked */
    bool parked;                        /* the application deleted it; the kernel's entry stays
                                         * (mlp_epoll_ctl: "Parked members") */
    bool shared;                        /* it was in the set at a fork: the kernel's set is the
                                         * other process's too, its answers the kernel's */
    bool queued;                        /* on ep's ready list */
    uint32_t undecided_seen;            /* edge-triggered, undecided: bits already reported */
    /* Edge-triggered, settled: what the last look reported, or found ready and armed over;
     * where a look whose peer said ML_SOCK_NOPOST starts (mlp_ep_harvest): the member may go
     * from sleeping on its queue to napping between two waits (its channel moved to a queue
     * the peer does not reach), and the readiness reported then is no new edge.  napping: the
     * last look was such a one; the next that is not starts from nopost_seen (the flag taken
     * back: what was reported while it stood is no new edge by itself). */
    uint32_t nopost_seen;
    bool napping;
    /* Edge-triggered, settled: the peer's head of our receive ring and its tail of our send
     * ring as the last report found them, read before it looked (mlp_ep_harvest): a look
     * that finds no new data, no room after the ring was short, and nothing ready beyond
     * what was reported, is no new edge. */
    uint64_t rx_head_seen, tx_tail_seen;
    uint32_t tx_short_seen;             /* and the channel's tx_short then */
    uint32_t ends_seen;                 /* and the two sides' ends (mlp_ep_ends) */
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
    _Atomic int sleepers;               /* threads asleep in the kernel on this set */
    int waiters;                        /* threads inside epoll_wait on this set */
    int efd;                            /* eventfd, -1 until needed */
    bool efd_rung;
    bool in_kernel;                     /* doorbell and eventfd added to the kernel set */
    bool tagged;                        /* the kernel set ever held an fd of ours, or a tagged
                                         * member: its answers are filtered from then on */
    _Atomic uint64_t kpoll_ns;          /* when the kernel set was last asked */
    uint64_t passed_ns;                 /* when its members' passed peers were last asked
                                         * (mlp_ep_passed_look) */
    bool nested;                        /* this set is itself a member of another set, or
                                         * was asked about by poll/select */
    int nfds;                           /* fds naming the set (dup), under mlp_eps_mu */
    uint32_t peer_cpu;                  /* where the peer of the last ready socket waited + 1 */
    /* The last event reported (mlp_ep_harvest; read without the lock by mlp_ep_handler_here): by
     * which thread, on which cpu, for which fd and socket, and our published send and receive
     * indices then (reset with the set when it is reused). */
    uintptr_t rep_thr;
    int rep_cpu, rep_fd;
    void *rep_s;
    uint64_t rep_tx, rep_rx;
    struct mlp_ep_watch *watches;       /* the waits whose spins watch members of this set
                                         * (mlp_epmu; "epoll_wait watches its members") */
    struct mlp_ep *next_free;
    /* Wake-ups (see "One doorbell per set" in design.md).  Kept when the set is reused: */
    memlan_evq_t *q;                    /* the set's own queue, made at its first setup */
    bool q_failed;                      /* it could not be made: the process's queue only */
    pthread_mutex_t qmu;                /* q's slot table */
    /* Reset when the set is reused: */
    _Atomic bool pbell;                 /* some member may post to the process's queue: the
                                         * process's doorbell belongs in the kernel set */
    bool k_pbell, k_sbell;              /* in the kernel set now (mlp_kset_mu) */
    int watch;                          /* outer sets that watch this one for EPOLLIN, plus one
                                         * for a poll on it; nested while > 0 (mlp_epmu) */
    bool poll_watched;                  /* that one was counted */
    struct mlp_nest *nest;              /* the sets inside this one (mlp_epmu) */
    int nnest, capnest;
    uint64_t life;                      /* bumped at each reuse, so that a stale nest entry
                                         * naming an earlier set in this record is ignored */
};

/* A set inside this one, and whether this one watches it for EPOLLIN. */
struct mlp_nest {
    struct mlp_ep *inner;
    uint64_t life;
    int fd;
    bool watch;
};

static struct mlp_ep **mlp_eps;
static int mlp_neps;
static int mlp_eps_max = -1;          /* highest epoll fd that ever had a set */
static struct mlp_ep *mlp_eps_free;   /* closed sets, reused: never freed, since another thread
                                       * may still be inside epoll_wait on a closed epoll fd */
static pthread_mutex_t mlp_eps_mu = PTHREAD_MUTEX_INITIALIZER; /* the table of sets */
static pthread_mutex_t mlp_epmu = PTHREAD_MUTEX_INITIALIZER;   /* members and ready lists */
int mlp_nnested;                      /* sets that are members of other sets */
static pthread_mutex_t mlp_kset_mu = PTHREAD_MUTEX_INITIALIZER; /* our fds in kernel sets */

/* The epoll fds the program made are marked in their fd records (a duplicate is looked up). */
void mlp_epoll_created(int epfd)
{
    struct mlp_fdrec *r = mlp_fdrec_make(epfd);
    if (r)
        atomic_store_explicit(&r->epfd, 1, memory_order_relaxed);
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
                mlp_lsan_root(p, (1u << 20) * sizeof(void *));
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
        bool reused = false;
        if ((e = mlp_eps_free)) {
            mlp_eps_free = e->next_free;
            reused = true;
        } else {
            e = malloc(sizeof *e);
        }
        if (e) {
            /* A reused set is reset under the members' lock: a thread still waiting on the
             * closed epoll fd it belonged to may touch its counters. */
            pthread_mutex_lock(&mlp_epmu);
            memlan_evq_t *q = reused ? e->q : NULL;
            bool q_failed = reused && e->q_failed;
            uint64_t life = reused ? e->life + 1 : 1;
            if (reused)
                pthread_mutex_lock(&e->qmu);
            memset((char *)e, 0, offsetof(struct mlp_ep, q));
            memset((char *)e + offsetof(struct mlp_ep, pbell), 0,
                   sizeof *e - offsetof(struct mlp_ep, pbell));
            e->efd = -1;
            e->nfds = 1;
            e->q = q;
            e->q_failed = q_failed;
            e->life = life;
            if (reused)
                pthread_mutex_unlock(&e->qmu);
            else
                pthread_mutex_init(&e->qmu, NULL);
            pthread_mutex_unlock(&mlp_epmu);
            if (epfd > mlp_eps_max)
                mlp_eps_max = epfd;
            mlp_epoll_created(epfd); /* its record says so: its close forgets the set */
            __atomic_store_n(&mlp_eps[epfd], e, __ATOMIC_RELEASE);
        }
    }
    pthread_mutex_unlock(&mlp_eps_mu);
    return e;
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

/* ---- which queue a socket posts to -------------------------------------------------------- */

/*
 * A socket whose only epoll membership is in a set that is not nested posts to that set's own
 * queue, whose doorbell only that set's kernel set holds: a post wakes the threads asleep on that
 * set and no others.  Any other socket (in no set, in two, watched by poll or select, in a nested
 * set) posts to the process's queue, whose doorbell is in the sets that may have such a member
 * (pbell) and in every poll.  The choice is made where the socket is armed (mlp_queue_add), so a
 * move happens only where the socket is about to be looked at again anyway; each move re-arms and
 * re-checks in the new queue (memlan_evq_add), and, outside the members' lock, marks the socket,
 * so that a thread asleep on the old queue's doorbell wakes and looks again.
 */

/* s's epoll memberships changed (mlp_epmu held): which set's queue should it post to? */
static void mlp_home_hint(struct mlp_sock *s)
{
    struct mlp_member *m = s->epm;
    struct mlp_ep *h = m && !m->snext && !m->ep->nested ? m->ep : NULL;
    __atomic_store_n(&s->home_ep, h, __ATOMIC_RELAXED);
}

/* While a nested set exists, every wait of the process sleeps with the process's doorbell: its
 * members post there, and whoever drains the queue makes the nested set's readiness true for
 * the set (or poll) that watches it. */
static bool mlp_ep_wants_pbell(struct mlp_ep *e)
{
    return !__atomic_load_n(&e->q, __ATOMIC_ACQUIRE) || atomic_load(&e->pbell) ||
           __atomic_load_n(&mlp_nnested, __ATOMIC_RELAXED);
}

/* Take s's channel out of whatever queue it is in (mlp_home_mu held). */
static void mlp_unhome_locked(struct mlp_sock *s)
{
    memlan_evq_t *q = s->ch->evq;
    struct mlp_ep *h = s->qep;
    if (q && h && q == h->q) {
        pthread_mutex_lock(&h->qmu);
        (void)memlan_evq_del(q, s->ch);
        pthread_mutex_unlock(&h->qmu);
    } else if (q && q == mlp_q) {
        pthread_mutex_lock(&mlp_q_mu);
        (void)memlan_evq_del(q, s->ch);
        pthread_mutex_unlock(&mlp_q_mu);
    } else if (q) {
        s->ch->evq = NULL; /* a queue from before fork: the parent's to keep */
    }
    s->qep = NULL;
}

void mlp_unhome(struct mlp_sock *s)
{
    pthread_mutex_lock(&mlp_home_mu);
    mlp_unhome_locked(s);
    pthread_mutex_unlock(&mlp_home_mu);
}

/* s left e: it no longer posts to e's queue (whose set may close and be reused). */
static void mlp_unhome_from(struct mlp_sock *s, struct mlp_ep *e)
{
    if (s->qep != e)
        return;
    pthread_mutex_lock(&mlp_home_mu);
    if (s->qep == e)
        mlp_unhome_locked(s);
    pthread_mutex_unlock(&mlp_home_mu);
}

/* The set s should post to, or NULL for the process's queue.  A poll or select waiting on s
 * sleeps on the process's doorbell, so then s posts there, and its set must hear that bell. */
static struct mlp_ep *mlp_home_want(struct mlp_sock *s, struct mlp_ep **forced)
{
    struct mlp_ep *h = __atomic_load_n(&s->home_ep, __ATOMIC_RELAXED);
    if (!h)
        return NULL;
    if (__atomic_load_n(&s->pw, __ATOMIC_ACQUIRE) || h->nested) {
        *forced = h;
        return NULL;
    }
    return __atomic_load_n(&h->q, __ATOMIC_ACQUIRE) ? h : NULL;
}

/* Make sure s's channel posts to the queue it should (above); false if it cannot post to any
 * (then we nap instead).  under_epmu: the caller holds the members' lock and is the set's own
 * waiter, awake: no mark is needed, nor allowed. */
bool mlp_queue_add(struct mlp_sock *s, bool under_epmu)
{
    memlan_evq_t *p = mlp_queue();
    if (!p)
        return false;
    struct mlp_ep *forced = NULL;
    struct mlp_ep *h = mlp_home_want(s, &forced);
    if (s->qep == h && s->ch->evq == (h ? h->q : p) && (!forced || atomic_load(&forced->pbell)))
        return true;
    pthread_mutex_lock(&mlp_home_mu);
    forced = NULL;
    h = mlp_home_want(s, &forced);
    /* its waiter takes the process's doorbell once it looks again: marked below */
    bool flipped = forced && !atomic_exchange(&forced->pbell, true);
    bool moved = false, ok = true;
    if (s->qep != h || s->ch->evq != (h ? h->q : p)) {
        moved = s->ch->evq != NULL;
        mlp_unhome_locked(s);
        ok = false;
        if (h) {
            pthread_mutex_lock(&h->qmu);
            ok = __ml_evq_add_quiet(h->q, s->ch, MEMLAN_EV_READ | MEMLAN_EV_WRITE, s) == 0;
            pthread_mutex_unlock(&h->qmu);
            if (ok)
                s->qep = h;
            else
                atomic_store(&h->pbell, true); /* its queue is full: this one posts to ours */
        }
        if (!ok) {
            pthread_mutex_lock(&mlp_q_mu); /* the queue's slot table is not thread-safe */
            ok = __ml_evq_add_quiet(p, s->ch, MEMLAN_EV_READ | MEMLAN_EV_WRITE, s) == 0;
            pthread_mutex_unlock(&mlp_q_mu);
        }
    }
    if (ok)
        /* A receive that finds nothing arms nothing here (the native API's arm at -EAGAIN,
         * "Event queues"): epoll_wait, poll and select arm a reader before they sleep, and an
         * armed reader made every send post, for nothing, while epoll_wait spun over the ring
         * ("epoll_wait watches its members while it spins").  A sender's EAGAIN still arms its
         * room: an edge-triggered writer is armed for room only when it had none. */
        s->ch->evq_events = MEMLAN_EV_WRITE;
    pthread_mutex_unlock(&mlp_home_mu);
    if ((moved || flipped) && !under_epmu)
        mlp_mark_sock(s);
    return ok;
}

/* Take the events of e's own queue (as mlp_queue_drain_look does the process's). */
static void mlp_ep_drain(struct mlp_ep *e, bool full)
{
    memlan_evq_t *q = __atomic_load_n(&e->q, __ATOMIC_ACQUIRE);
    if (!q || (full ? __ml_evq_quiet(q) : __ml_evq_quiet_hint(q))) /* nothing posted */
        return;
    struct memlan_event ev[64];
    int n;
    do {
        pthread_mutex_lock(&e->qmu);
        n = e->q == q ? memlan_evq_wait(q, ev, 64, 0) : 0;
        pthread_mutex_unlock(&e->qmu);
        for (int i = 0; i < n; i++)
            if (ev[i].udata)
                mlp_mark_sock_posted(ev[i].udata);
    } while (n == 64);
}

/* e's own queue, made at its first setup (not under mlp_epmu); NULL if it cannot be. */
static memlan_evq_t *mlp_ep_queue(struct mlp_ep *e)
{
    memlan_evq_t *q = __atomic_load_n(&e->q, __ATOMIC_ACQUIRE);
    if (q || e->q_failed || !mlp_fab || mlp_cred_lost_here(false))
        return q;
    pthread_mutex_lock(&e->qmu);
    if (!e->q && !e->q_failed) {
        if (memlan_evq_create(mlp_fab, MLP_SETQ_CAP, &q) == 0) {
            int *sfd, *bfd;
            __ml_evq_fds(q, &sfd, &bfd);
            mlp_own_fd(sfd, true);
            mlp_own_fd(bfd, true);
            __atomic_store_n(&e->q, q, __ATOMIC_RELEASE);
            mlp_queue_made(q);
        } else {
            e->q_failed = true; /* the process's queue serves it */
        }
    }
    q = e->q;
    pthread_mutex_unlock(&e->qmu);
    return q;
}

/* Is m worth reporting now?  Unknown (undecided, gone to TCP, or cannot tell): yes. */
static bool mlp_member_ready(struct mlp_member *m)
{
    struct mlp_sock *s = m->s;
    if (m->disabled)
        return false;
    if (s->type != MLP_CONN || s->state != MLP_ACCEL || !s->ch)
        return true;
    int rev = mlp_revents_want(s, m->fd, (short)(m->events & 0xffff));
    return rev < 0 || (mlp_ev_from_poll(rev) & (m->events | EPOLLERR | EPOLLHUP)) != 0;
}

/* Put m on its set's ready list without waking anyone (mlp_epmu held). */
static bool mlp_rl_link(struct mlp_member *m)
{
    struct mlp_ep *e = m->ep;
    if (m->queued || m->disabled)
        return false;
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
    return true;
}

static void mlp_rl_push(struct mlp_member *m)
{
    struct mlp_ep *e = m->ep;
    if (!mlp_rl_link(m))
        return;
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

/*
 * A post's mark on m's socket (mlp_epmu held).  A set inside another (nested) that no thread
 * waits in looks readable only through its eventfd, which mlp_rl_push rings for a member that is
 * ready: one that is not (the peer's post says "a byte of room", our POLLOUT wants mlp_tx_room's
 * worth) is armed again here, as the prune before a sleep arms it, and stays off the list.  Only
 * for a post, whose next one the arm brings: a kernel FIN's mark (mlp_ep_filter) lists the
 * member as before, to be looked at again until its peer's lock says (no post says it).
 * Listed unrung, it sat there with nothing armed: the post that brought it had used the arm up,
 * the prune had run before the drain that listed it, and a poll on the set slept for ever while
 * the reader emptied the ring (Racket's ports: epoll_ctl ADD, then poll on the epoll fd, a
 * bulk writer stalled in 5 runs of 9: an explorer).
 */
static void mlp_rl_push_marked(struct mlp_member *m)
{
    struct mlp_ep *e = m->ep;
    if (e->nested && !e->sleepers && !m->queued && !m->disabled && !mlp_member_ready(m) &&
        mlp_q && m->s->ch && !mlp_arm(m->s, (short)(m->events & 0xffff), true) && m->s->ch->evq)
        return; /* armed, not ready: its next change posts again (in a queue: as the prune) */
    mlp_rl_push(m);
}

/* A socket changed: every set it is in may have something to say.  posted: a post of the
 * peer's said so (mlp_mark_sock_posted). */
static void mlp_mark_sock_how(struct mlp_sock *s, bool posted)
{
    mlp_pw_wake(s);
    if (!__atomic_load_n(&s->epm, __ATOMIC_RELAXED))
        return;
    /* EPOLLEXCLUSIVE as the kernel's wake-up does it: the memberships with it are visited in
     * turn and the visit stops at the first set that a thread is waiting on; the sets before it
     * (nobody waiting) keep the event on their ready lists. */
    bool woke = false;
    pthread_mutex_lock(&mlp_epmu);
    for (struct mlp_member *m = s->epm; m; m = m->snext) {
        bool excl = (m->events & EPOLLEXCLUSIVE) != 0;
        if (excl && woke)
            continue;
        if (posted)
            mlp_rl_push_marked(m);
        else
            mlp_rl_push(m);
        if (excl)
            woke = __atomic_load_n(&m->ep->waiters, __ATOMIC_RELAXED) > 0;
    }
    pthread_mutex_unlock(&mlp_epmu);
}

void mlp_mark_sock(struct mlp_sock *s) { mlp_mark_sock_how(s, false); }
void mlp_mark_sock_posted(struct mlp_sock *s) { mlp_mark_sock_how(s, true); }

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
    __ml_free(m);
    mlp_home_hint(s);
    if (s->type == MLP_CONN && s->ch)
        mlp_unhome_from(s, e);
    return s;
}

static void mlp_put_all(struct mlp_sock **v, int n)
{
    for (int i = 0; i < n; i++)
        mlp_put(v[i]);
}

/* close(fd) of an epoll fd: forget its members. */
/*
 * A plain fd in a kernel set.  A program may put a socket in its epoll set before it connects it
 * (nginx's upstream connections: socket, epoll_ctl ADD with EPOLLIN|EPOLLOUT|EPOLLRDHUP|EPOLLET,
 * then connect; Netty registers its channels first too).  The kernel's entry then watches the
 * kernel socket for the program's events, and once the connect makes the socket ours nothing
 * comes there but the connect's completion: the peer's bytes arrive in the ring, and the set
 * never reported them (nginx waited for its upstream's answer until its client gave up).  So
 * each ADD or MOD of a plain fd that the kernel accepted is noted in the fd's record (the set,
 * the events, the data: stores, no system call), a DEL forgets it, a close clears it, and a
 * connect that posts an offer turns the entry into a member as an ADD of an accelerated socket
 * would have made it (mlp_epoll_adopt).  A record can be stale (an fd closed behind our back, a
 * set closed since): the adoption's MOD asks the kernel, whose ENOENT or EBADF means that no set
 * holds this socket under that fd now.  In a vfork child the record is the parent's, but so are
 * the files the child's fds name (unless it replaced them) and the kernel set it changed: the
 * record still says what that set holds.
 */
void mlp_epoll_note_plain(int epfd, int op, int fd, const struct epoll_event *ev)
{
    if (op == EPOLL_CTL_DEL) {
        struct mlp_fdrec *r = mlp_fdrec(fd);
        if (r && atomic_load_explicit(&r->kep, memory_order_relaxed) == epfd + 1)
            atomic_store_explicit(&r->kep, 0, memory_order_relaxed);
        return;
    }
    if ((op != EPOLL_CTL_ADD && op != EPOLL_CTL_MOD) || !ev || epfd < 0)
        return;
    /* Ours too (a connection that fell to TCP, whose entries are the kernel's): a disconnect
     * (connect(AF_UNSPEC)) keeps the notes, and the connect after it may make it ours again.
     * Not from a vfork child's call on one of ours (its kernel call on an accelerated socket,
     * mlp_epoll_ctl's): the record is the parent's, whose sets it says nothing of. */
    struct mlp_fdrec *r = mlp_fdrec_make(fd);
    if (!r || (atomic_load_explicit(&r->sock, memory_order_relaxed) && mlp_vfork_child()))
        return;
    int k = atomic_load_explicit(&r->kep, memory_order_relaxed);
    if (k != 0 && k != epfd + 1) { /* in a second set: mlp_epoll_adoptable says no */
        if (k != -1)
            atomic_store_explicit(&r->kep, -1, memory_order_relaxed);
        return;
    }
    atomic_store_explicit(&r->kep_events, ev->events, memory_order_relaxed);
    atomic_store_explicit(&r->kep_data, ev->data.u64, memory_order_relaxed);
    atomic_store_explicit(&r->kep, epfd + 1, memory_order_release);
}

/* Before an offer: NULL when fd's kernel entries, if any, can become members (one set, not
 * EPOLLEXCLUSIVE, whose entry the kernel lets nobody change), else why the connection stays on
 * TCP. */
const char *mlp_epoll_adoptable(int fd)
{
    struct mlp_fdrec *r = mlp_fdrec(fd);
    int k = r ? atomic_load_explicit(&r->kep, memory_order_acquire) : 0;
    if (k == 0)
        return NULL;
    if (k < 0)
        return "the program put the socket in more than one epoll set before it connected";
    if (atomic_load_explicit(&r->kep_events, memory_order_relaxed) & EPOLLEXCLUSIVE)
        return "the program put the socket in an epoll set with EPOLLEXCLUSIVE before it "
               "connected";
    return NULL;
}

/* After the offer: the entry noted for fd becomes a member (the kernel's entry is changed to
 * ours by mlp_epoll_ctl's MOD).  NULL when done or when no set holds fd; else why not, and the
 * kernel's entry is put back as the program made it (the caller withdraws the offer). */
const char *mlp_epoll_adopt(int fd)
{
    struct mlp_fdrec *r = mlp_fdrec(fd);
    int k = r ? atomic_load_explicit(&r->kep, memory_order_acquire) : 0;
    if (k <= 0)
        return NULL;
    struct epoll_event ev = {.events = atomic_load_explicit(&r->kep_events, memory_order_relaxed),
                             .data.u64 = atomic_load_explicit(&r->kep_data, memory_order_relaxed)};
    atomic_store_explicit(&r->kep, 0, memory_order_relaxed);
    int saved = errno;
    bool handled;
    struct epoll_event arg = ev;
    int e = mlp_epoll_ctl(k - 1, EPOLL_CTL_MOD, fd, &arg, &handled);
    const char *why = NULL;
    if (!handled) {
        why = "its epoll set could not take it over";
    } else if (e == -ENOENT || e == -EBADF || e == -EINVAL) {
        /* no set holds it under fd now (the record was stale, or k - 1 is no epoll fd now) */
    } else if (e < 0) {
        why = "its epoll set could not take it over (out of memory)";
        /* mlp_epoll_ctl took the kernel's entry away when it could not make the member */
        if (mlp_real_epoll_ctl(k - 1, EPOLL_CTL_ADD, fd, &ev) < 0 && errno == EEXIST)
            (void)mlp_real_epoll_ctl(k - 1, EPOLL_CTL_MOD, fd, &ev);
    } else {
        mlp_log(2, "fd %d: its entry in epoll set %d taken over", fd, k - 1);
    }
    errno = saved;
    return why;
}

static int mlp_ep_some_fd(struct mlp_ep *e);

/* The epoll fd epfd closes while another fd names its set e: notes naming the set by epfd
 * (mlp_epoll_note_plain) name it by that fd.  A walk of the records, at the close of an epoll
 * fd that has a duplicate only. */
static void mlp_epoll_renote(int epfd, struct mlp_ep *e)
{
    pthread_mutex_lock(&mlp_epmu);
    int other = mlp_ep_some_fd(e);
    pthread_mutex_unlock(&mlp_epmu);
    if (other < 0 || other == epfd)
        return;
    for (int f = mlp_fdrec_next(0, INT32_MAX); f >= 0; f = mlp_fdrec_next(f + 1, INT32_MAX)) {
        struct mlp_fdrec *r = mlp_fdrec(f);
        int k = epfd + 1;
        if (atomic_load_explicit(&r->kep, memory_order_relaxed) == k)
            atomic_compare_exchange_strong(&r->kep, &k, other + 1);
    }
}

void mlp_epoll_forget_fd(int fd)
{
    /* On every close(): a load first, so that closing ordinary fds writes nothing. */
    struct mlp_fdrec *r = mlp_fdrec(fd);
    if (r && atomic_load_explicit(&r->epfd, memory_order_relaxed))
        atomic_store_explicit(&r->epfd, 0, memory_order_relaxed);
    if (r && atomic_load_explicit(&r->kep, memory_order_relaxed))
        atomic_store_explicit(&r->kep, 0, memory_order_relaxed);
    if (!mlp_eps || fd < 0 || fd >= mlp_neps || !__atomic_load_n(&mlp_eps[fd], __ATOMIC_RELAXED))
        return;
    pthread_mutex_lock(&mlp_eps_mu);
    struct mlp_ep *e = __atomic_exchange_n(&mlp_eps[fd], NULL, __ATOMIC_ACQ_REL);
    bool last = e && --e->nfds == 0;
    pthread_mutex_unlock(&mlp_eps_mu);
    if (!last) {
        /* Another fd (a dup) still names the set, as the kernel's file lives on: the plain
         * entries noted under this number name the set by that one now, or a connect could
         * not take them over (tests/preload/epollbefore.c, "dup"). */
        if (e)
            mlp_epoll_renote(fd, e);
        return;
    }
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
    e->watch = 0;
    /* The sets inside it are watched by one set less (the kernel's file goes with its last fd). */
    struct mlp_nest *nest = e->nest;
    int nnest = e->nnest;
    e->nest = NULL;
    e->nnest = e->capnest = 0;
    pthread_mutex_unlock(&mlp_epmu);
    for (int i = 0; i < nnest; i++) {
        struct mlp_ep *in = nest[i].inner;
        pthread_mutex_lock(&mlp_epmu);
        bool live = nest[i].watch && in != e && in->life == nest[i].life && in->nfds > 0;
        pthread_mutex_unlock(&mlp_epmu);
        if (live)
            mlp_ep_watch(nest[i].fd, in, -1);
    }
    __ml_free(nest);
    pthread_mutex_lock(&mlp_epmu);
    if (e->efd >= 0) {
        mlp_disown_fd(e->efd);
        __ml_sys_close(e->efd);
        e->efd = -1;
    }
    __ml_free(e->byfd);
    e->byfd = NULL;
    e->nbyfd = 0;
    pthread_mutex_unlock(&mlp_epmu);
    pthread_mutex_lock(&mlp_eps_mu);
    e->next_free = mlp_eps_free;
    mlp_eps_free = e;
    pthread_mutex_unlock(&mlp_eps_mu);
}

/* dup, dup2, dup3, F_DUPFD of fd onto nfd (already released): if fd is an epoll fd, nfd names
 * the same set, as it names the same kernel file.  The set is made now if it was not yet, so that
 * both fds find one. */
void mlp_epoll_dup(int fd, int nfd)
{
    struct mlp_fdrec *r = mlp_fdrec(fd);
    if (!r || !atomic_load_explicit(&r->epfd, memory_order_relaxed) || fd == nfd)
        return;
    mlp_epoll_created(nfd);
    struct mlp_ep *e = mlp_ep_get(fd, true);
    if (!e || nfd < 0 || nfd >= mlp_neps)
        return;
    pthread_mutex_lock(&mlp_eps_mu);
    if (__atomic_load_n(&mlp_eps[fd], __ATOMIC_RELAXED) == e &&
        !__atomic_load_n(&mlp_eps[nfd], __ATOMIC_RELAXED)) {
        e->nfds++;
        if (nfd > mlp_eps_max)
            mlp_eps_max = nfd;
        __atomic_store_n(&mlp_eps[nfd], e, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&mlp_eps_mu);
}

/* exit(): the sets' own queues lose their names (mlp_at_exit); the sets and their queues stay
 * for the threads that may still wait on them until the process is gone.  A set's memory is
 * never freed (a closed set waits on the free list, with its queue, for reuse), so the table is
 * read without its lock; the free list needs it, and a set whose lock another thread holds (or
 * that this thread's interrupted code holds: exit() from a handler) leaves its files to the
 * next sweep. */
void mlp_epoll_at_exit(void)
{
    if (!mlp_eps)
        return;
    for (int fd = 0; fd < mlp_neps && fd <= mlp_eps_max; fd++) {
        struct mlp_ep *e = __atomic_load_n(&mlp_eps[fd], __ATOMIC_ACQUIRE);
        if (e)
            __ml_evq_unname(__atomic_load_n(&e->q, __ATOMIC_ACQUIRE));
    }
    if (pthread_mutex_trylock(&mlp_eps_mu) != 0)
        return;
    for (struct mlp_ep *e = mlp_eps_free; e; e = e->next_free)
        __ml_evq_unname(__atomic_load_n(&e->q, __ATOMIC_ACQUIRE));
    pthread_mutex_unlock(&mlp_eps_mu);
}

static int mlp_ep_some_fd(struct mlp_ep *e);
static struct mlp_sock *mlp_member_to_kernel(int epfd, struct mlp_member *m);

/* s leaves every set: its memberships freed, or, to_kernel, handed to the kernel first. */
static void mlp_epoll_sock_leave(struct mlp_sock *s, bool to_kernel)
{
    if (!__atomic_load_n(&s->epm, __ATOMIC_RELAXED))
        return;
    struct mlp_sock *puts[64];
    int np = 0;
    pthread_mutex_lock(&mlp_epmu);
    while (s->epm && np < 64) {
        struct mlp_member *m = s->epm;
        int epfd = to_kernel ? mlp_ep_some_fd(m->ep) : -1;
        puts[np++] = epfd >= 0 ? mlp_member_to_kernel(epfd, m) : mlp_member_free(m);
    }
    pthread_mutex_unlock(&mlp_epmu);
    mlp_put_all(puts, np);
    if (s->epm)
        mlp_epoll_sock_leave(s, to_kernel);
}

/* The socket's last fd is closing: it leaves every set, as the kernel's file does. */
void mlp_epoll_sock_gone(struct mlp_sock *s) { mlp_epoll_sock_leave(s, false); }

/* s stops being ours while its fds stay open (a TCP disconnect: connect(AF_UNSPEC)): each of
 * its memberships goes to the kernel with the application's events, as a member whose socket
 * fell to TCP does, since the kernel's entry lives on with the file (freed, as at the socket's
 * last close, the entry kept our tag and the application never heard of the fd again). */
void mlp_epoll_sock_to_kernel(struct mlp_sock *s) { mlp_epoll_sock_leave(s, true); }

/* An fd naming the set e, or -1 (a look at the table without its lock: the caller holds
 * mlp_epmu, which mlp_eps_mu is never taken under). */
static int mlp_ep_some_fd(struct mlp_ep *e)
{
    for (int i = 0; mlp_eps && i <= mlp_eps_max && i < mlp_neps; i++)
        if (__atomic_load_n(&mlp_eps[i], __ATOMIC_ACQUIRE) == e)
            return i;
    return -1;
}

/* fd is about to stop naming its socket (close, close_range, a dup2 or dup3 over it) while
 * another fd of ours still names it, or after we passed it to another process over SCM_RIGHTS.
 * A member parked under fd (the application deleted it) leaves its set now, its kernel entry
 * with it: the kernel keys the entry by file and fd number, and only now can fd still name it.
 * Left in place, the entry outlived the fd (the file lives on under the other, or in the
 * process we passed it to), and the socket brought back under that number (dup2; or passed
 * back to us: dovecot's imap-hibernate hands an idle client back to a new imap process, which
 * hands it to imap-hibernate again, at the same fd) met EEXIST on its ADD, which the kernel,
 * whose entry the DEL had removed, answers 0 (tests/preload/epollpark2.c; imap-hibernate died
 * of "Panic: epoll_ctl(add, 14) failed: File exists", test_apps_mail.py).  Otherwise only while
 * another fd names the socket: at its last the kernel's entry goes with the file, and where
 * the file lives on in a fork child that parked it too, the child's copy of the member still
 * counts on the entry. */
void mlp_epoll_fd_closing(int fd)
{
    struct mlp_sock *s = mlp_get(fd);
    if (!s)
        return;
    struct mlp_sock *puts[64];
    int np = 0;
    /* Not in a handler: the thread it interrupted may hold mlp_epmu. */
    if (__atomic_load_n(&s->epm, __ATOMIC_RELAXED) &&
        (atomic_load(&s->nfds) > 1 || atomic_load(&s->sent)) && !mlp_sig_in_handler()) {
        pthread_mutex_lock(&mlp_epmu);
        for (struct mlp_member **pp = &s->epm; *pp && np < 64;) {
            struct mlp_member *m = *pp;
            if (!m->parked || m->fd != fd) {
                pp = &m->snext;
                continue;
            }
            int epfd = mlp_ep_some_fd(m->ep);
            if (epfd >= 0)
                (void)mlp_real_epoll_ctl(epfd, EPOLL_CTL_DEL, fd, NULL);
            puts[np++] = mlp_member_free(m); /* unlinks it: *pp is the next one */
        }
        pthread_mutex_unlock(&mlp_epmu);
    }
    mlp_put_all(puts, np); /* never the last: we hold one */
    mlp_put(s);
}

/* Every parked member of e (the set at epfd) leaves it, its kernel entry deleted: as if the
 * application's DELs had gone to the kernel.  share: the others are marked shared (a fork). */
static void mlp_ep_unpark(int epfd, struct mlp_ep *e, bool share)
{
    for (;;) {
        struct mlp_sock *puts[64];
        int np = 0;
        pthread_mutex_lock(&mlp_epmu);
        for (int i = 0; i < e->nbyfd && np < 64; i++)
            if (e->byfd[i] && e->byfd[i]->parked) {
                (void)mlp_real_epoll_ctl(epfd, EPOLL_CTL_DEL, i, NULL);
                puts[np++] = mlp_member_free(e->byfd[i]);
            } else if (e->byfd[i] && share) {
                e->byfd[i]->shared = true;
            }
        pthread_mutex_unlock(&mlp_epmu);
        mlp_put_all(puts, np); /* never the last: the member's fd holds one */
        if (np < 64)
            break;
    }
}

/* Before fork and exec (not in a vfork child, whose records are its parent's): every parked
 * member leaves its set, its kernel entry deleted.  The kernel's set outlives our records of it
 * there.  A fork child shares it, with a copy of our records that its epoll_ctl changes without
 * the parent's knowing: the child's ADD back of a member the parent had deleted answered 0 from
 * its copy and left the kernel alone, and the parent's own ADD back answered 0 too, where the
 * kernel, which the child's ADD reached, says EEXIST.  An image that exec gives the set to has
 * no record of it at all: its ADD of the carried socket met the parked entry (EEXIST; the
 * kernel: 0).  Deleted now, each such ADD goes to the kernel, and the kernel answers it.
 * fork: the members left are marked shared, in both processes, and parked or answered from our
 * record never again: a DEL or MOD of one by either process goes to the kernel, as before the
 * parking.  (The child's DEL of a member both held parked it in the child's copy alone, and the
 * parent's MOD then answered 0, the kernel ENOENT; the parent's DEL, and the child's ADD met
 * EEXIST from its copy, the kernel 0: a connection handed to a child that waits on the set.)
 * A member added after the fork is the adder's own, parked as any. */
void mlp_epoll_unpark_all(bool fork)
{
    if (!mlp_eps || mlp_vfork_child() || mlp_sig_in_handler())
        return; /* a handler's fork or exec: the thread it interrupted may hold mlp_epmu */
    for (int fd = 0; fd <= mlp_eps_max && fd < mlp_neps; fd++) {
        struct mlp_ep *e = __atomic_load_n(&mlp_eps[fd], __ATOMIC_ACQUIRE);
        if (e && __atomic_load_n(&e->n, __ATOMIC_RELAXED))
            mlp_ep_unpark(fd, e, fork); /* a set under several fds: its first leaves none */
    }
}

/* After fork: our queue is new, so every member must arm again, and the set needs our doorbell. */
void mlp_epoll_after_fork(void)
{
    pthread_mutex_init(&mlp_epmu, NULL);
    pthread_mutex_init(&mlp_eps_mu, NULL);
    pthread_mutex_init(&mlp_kset_mu, NULL);
    /* Closed sets kept for reuse keep their queues: the parent's here, which a set the child
     * makes would have taken over (its members posting to the parent's queue). */
    for (struct mlp_ep *f = mlp_eps_free; f; f = f->next_free) {
        mlp_q_forget(f->q);
        f->q = NULL;
        f->q_failed = false;
        pthread_mutex_init(&f->qmu, NULL);
    }
    if (!mlp_eps)
        return;
    for (int fd = 0; fd < mlp_neps && fd <= mlp_eps_max; fd++) {
        struct mlp_ep *e = mlp_eps[fd];
        if (!e)
            continue;
        e->in_kernel = false;
        e->sleepers = 0;
        e->watches = NULL; /* the parent's other threads' waits: their members are listed
                            * below (a handler's fork: its own spin's record finds it so) */
        /* Its own queue is the parent's (its doorbell stays in the shared kernel set, as the
         * process's does): the child's members post to the child's queue until the set has
         * one of its own again, made at its next setup.  A set under several fds is met once
         * per fd: its copy is let go of at the first. */
        mlp_q_forget(e->q);
        e->q = NULL;
        e->q_failed = false;
        e->k_pbell = e->k_sbell = false;
        atomic_store(&e->pbell, true);
        pthread_mutex_init(&e->qmu, NULL);
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
    if (rev & POLLPRI) ev |= EPOLLPRI; /* an urgent byte (sock.c, mlp_send_urgent) */
    return ev;
}

/* Our fds go into the kernel set while the set has a member of ours, and leave it when the last
 * goes (mlp_ep_unsetup): a set of kernel fds only must never be woken by our posts, nor hand the
 * application an event of ours.  They are the set's eventfd, the set's own queue's doorbell (its
 * members' posts) and, while some member may post to the process's queue (pbell), the process's
 * doorbell; a nested set holds neither doorbell.  mlp_kset_mu orders setup and unsetup, so that
 * an unsetup that saw no member cannot undo the setup of a member added meanwhile. */
static void mlp_ep_setup(int epfd, struct mlp_ep *e)
{
    memlan_evq_t *sq = e->nested ? NULL : mlp_ep_queue(e);
    bool want_p = !e->nested && mlp_ep_wants_pbell(e), want_s = sq != NULL;
    if (e->in_kernel && e->k_sbell == want_s && (e->k_pbell || !want_p))
        return;
    memlan_evq_t *q = mlp_queue();
    pthread_mutex_lock(&mlp_kset_mu);
    want_p = !e->nested && mlp_ep_wants_pbell(e);
    want_s = !e->nested && sq != NULL;
    if (e->in_kernel && e->k_sbell == want_s && (e->k_pbell || !want_p)) {
        pthread_mutex_unlock(&mlp_kset_mu);
        return;
    }
    pthread_mutex_lock(&mlp_epmu);
    if (e->efd < 0) {
        long fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
        if (fd >= 0) {
            e->efd = (int)fd;
            mlp_own_fd(&e->efd, true);
        }
    }
    int efd = e->efd;
    e->tagged = true;
    pthread_mutex_unlock(&mlp_epmu);
    bool ok = (q != NULL || sq != NULL) && efd >= 0;
    if (want_p && !e->k_pbell) {
        struct epoll_event bev = {.events = EPOLLIN, .data.u64 = MLP_TAG_BELL};
        if (q && (mlp_real_epoll_ctl(epfd, EPOLL_CTL_ADD, memlan_evq_fd(q), &bev) == 0 ||
                  errno == EEXIST))
            e->k_pbell = true;
        else
            ok = false;
    }
    if (want_s && !e->k_sbell) {
        struct epoll_event sev = {.events = EPOLLIN, .data.u64 = MLP_TAG_SBELL};
        if (mlp_real_epoll_ctl(epfd, EPOLL_CTL_ADD, memlan_evq_fd(sq), &sev) == 0 ||
            errno == EEXIST)
            e->k_sbell = true;
        else
            ok = false;
    } else if (!want_s && e->k_sbell && e->q) {
        (void)mlp_real_epoll_ctl(epfd, EPOLL_CTL_DEL, memlan_evq_fd(e->q), NULL);
        e->k_sbell = false;
    }
    if (efd >= 0 && !e->in_kernel) {
        struct epoll_event wev = {.events = EPOLLIN, .data.u64 = MLP_TAG_WAKE};
        if (mlp_real_epoll_ctl(epfd, EPOLL_CTL_ADD, efd, &wev) < 0 && errno != EEXIST)
            ok = false;
    }
    e->in_kernel = ok;
    /* A thread already asleep on this set entered it when the set had no member of ours, and
     * sleeps in the kernel on the application's fds alone: wake it to wait the whole way.
     * SYNC: the fence orders the caller's store of e->n before the load of sleepers; pairs with
     * the increment of sleepers before the load of e->n in mlp_ep_kernel_only(). */
    atomic_thread_fence(memory_order_seq_cst);
    if (atomic_load(&e->sleepers)) {
        pthread_mutex_lock(&mlp_epmu);
        mlp_ep_ring(e);
        pthread_mutex_unlock(&mlp_epmu);
    }
    pthread_mutex_unlock(&mlp_kset_mu);
}

/* The set has no member of ours left: our fds leave its kernel set. */
static void mlp_ep_unsetup(int epfd, struct mlp_ep *e)
{
    if (!e->in_kernel && !e->k_pbell && !e->k_sbell)
        return;
    pthread_mutex_lock(&mlp_kset_mu);
    if (__atomic_load_n(&e->n, __ATOMIC_RELAXED) == 0 && !e->nested) {
        if (mlp_q && e->k_pbell)
            (void)mlp_real_epoll_ctl(epfd, EPOLL_CTL_DEL, memlan_evq_fd(mlp_q), NULL);
        e->k_pbell = false;
        if (e->q && e->k_sbell)
            (void)mlp_real_epoll_ctl(epfd, EPOLL_CTL_DEL, memlan_evq_fd(e->q), NULL);
        e->k_sbell = false;
        pthread_mutex_lock(&mlp_epmu);
        if (e->efd >= 0 && e->in_kernel) {
            (void)mlp_real_epoll_ctl(epfd, EPOLL_CTL_DEL, e->efd, NULL);
            if (e->efd_rung && !e->sleepers) {
                uint64_t v;
                (void)__ml_sys_read(e->efd, &v, sizeof v);
                e->efd_rung = false;
            }
        }
        pthread_mutex_unlock(&mlp_epmu);
        e->in_kernel = false;
    }
    pthread_mutex_unlock(&mlp_kset_mu);
}

static bool mlp_fdrec_is_epoll(int fd)
{
    struct mlp_fdrec *r = mlp_fdrec(fd);
    return r && atomic_load_explicit(&r->epfd, memory_order_relaxed);
}

static bool mlp_is_epoll_fd(int fd)
{
    struct mlp_fdrec *r = mlp_fdrec(fd);
    if (r && atomic_load_explicit(&r->epfd, memory_order_relaxed))
        return true;
    if (fd >= 0 && fd < (1 << 16))
        return false; /* below 65536 only a duplicate of one is missed, as before */
    char path[48], link[32];
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    ssize_t n = readlink(path, link, sizeof link - 1);
    if (n < 0)
        return false;
    link[n] = 0;
    return strcmp(link, "anon_inode:[eventpoll]") == 0;
}

/* The set at fd is watched by another set (or by poll).  Its readiness there must be its
 * members': the doorbells leave its kernel set (any post would make it look readable), its
 * members move to the process's queue (each is put on the ready list, and the prune re-arms it
 * there), and its eventfd says whether a member is ready.  Waits on it, and every wait of the
 * process, take the doorbell's part. */
static void mlp_ep_make_nested(int fd, struct mlp_ep *inner)
{
    if (!inner)
        return;
    pthread_mutex_lock(&mlp_kset_mu);
    if (mlp_q && inner->k_pbell)
        (void)mlp_real_epoll_ctl(fd, EPOLL_CTL_DEL, memlan_evq_fd(mlp_q), NULL);
    if (inner->q && inner->k_sbell)
        (void)mlp_real_epoll_ctl(fd, EPOLL_CTL_DEL, memlan_evq_fd(inner->q), NULL);
    inner->k_pbell = inner->k_sbell = false;
    pthread_mutex_unlock(&mlp_kset_mu);
    /* Its parked members leave it, their kernel entries with them: an entry's FIN (the peer's
     * shutdown, long after the application deleted the member) made the set readable to the
     * outer one, which the kernel's set, without the entry, is not.  Nested now, its DELs go
     * to the kernel (mlp_epoll_ctl), so none is parked after this. */
    mlp_ep_unpark(fd, inner, false);
    pthread_mutex_lock(&mlp_epmu);
    for (int i = 0; i < inner->nbyfd; i++)
        if (inner->byfd[i]) {
            mlp_home_hint(inner->byfd[i]->s);
            mlp_rl_push(inner->byfd[i]);
        }
    pthread_mutex_unlock(&mlp_epmu);
    mlp_ep_nested_leave(inner);
}

/* Nobody watches the set at fd any more: it is a set like any other again, whose members move
 * back to its own queue as they are armed (the process's doorbell stays in it for those that
 * have not yet). */
static void mlp_ep_unnest(struct mlp_ep *inner)
{
    pthread_mutex_lock(&mlp_epmu);
    atomic_store(&inner->pbell, true);
    for (int i = 0; i < inner->nbyfd; i++)
        if (inner->byfd[i]) {
            mlp_home_hint(inner->byfd[i]->s);
            mlp_rl_push(inner->byfd[i]);
        }
    if (inner->sleepers)
        mlp_ep_ring(inner); /* a waiter on it takes the doorbells back before it sleeps again */
    pthread_mutex_unlock(&mlp_epmu);
}

/* One more (d = 1) or one less (d = -1) watcher of inner, the set at fd.  A set inside another
 * that does not ask for EPOLLIN on it (UCX's async thread keeps its interfaces' sets in its own
 * with no events, most of the time) is not nested: nobody can see its readiness, and treating it
 * as nested put the process's doorbell in the outer set and woke that thread on every post. */
void mlp_ep_watch(int fd, struct mlp_ep *inner, int d)
{
    pthread_mutex_lock(&mlp_epmu);
    int before = inner->watch;
    inner->watch += d;
    if (inner->watch < 0)
        inner->watch = 0;
    bool nest = before == 0 && inner->watch > 0, unnest = before > 0 && inner->watch == 0;
    if (nest)
        inner->nested = true;
    else if (unnest)
        inner->nested = false;
    pthread_mutex_unlock(&mlp_epmu);
    if (nest) {
        __atomic_add_fetch(&mlp_nnested, 1, __ATOMIC_RELAXED);
        mlp_ep_make_nested(fd, inner);
        /* A thread asleep on a set without the process's doorbell (the one watching inner among
         * them) wakes to take it. */
        pthread_mutex_lock(&mlp_epmu);
        for (int i = 0; i <= mlp_eps_max && i < mlp_neps; i++) {
            struct mlp_ep *o = __atomic_load_n(&mlp_eps[i], __ATOMIC_ACQUIRE);
            if (o && o->sleepers && !o->k_pbell && !o->nested)
                mlp_ep_ring(o);
        }
        pthread_mutex_unlock(&mlp_epmu);
    } else if (unnest) {
        __atomic_sub_fetch(&mlp_nnested, 1, __ATOMIC_RELAXED);
        mlp_ep_unnest(inner);
    }
}

/* epoll_ctl(outer, op, fd) where fd is an epoll fd: the call is made here, and then whether outer
 * watches fd's set for EPOLLIN is noted.  A new watcher makes the set nested before the call, so
 * that the outer set never sees it readable for a post of ours. */
static int mlp_epoll_ctl_nest(int epfd, int op, int fd, struct epoll_event *ev)
{
    struct mlp_ep *outer = mlp_ep_get(epfd, true), *inner = mlp_ep_get(fd, true);
    if (!outer || !inner || outer == inner) {
        if (inner && outer != inner && op == EPOLL_CTL_ADD && !inner->poll_watched) {
            inner->poll_watched = true; /* cannot be told apart: watched for good */
            mlp_ep_watch(fd, inner, 1);
        }
        int r = mlp_real_epoll_ctl(epfd, op, fd, ev);
        return r < 0 ? -errno : r;
    }
    bool want = op != EPOLL_CTL_DEL && ev && (ev->events & (EPOLLIN | EPOLLRDNORM));
    pthread_mutex_lock(&mlp_epmu);
    struct mlp_nest *n = NULL;
    for (int i = 0; i < outer->nnest; i++)
        if (outer->nest[i].fd == fd) {
            n = &outer->nest[i];
            break;
        }
    bool had = n && n->watch && n->inner == inner && n->life == inner->life;
    pthread_mutex_unlock(&mlp_epmu);
    if (want && !had)
        mlp_ep_watch(fd, inner, 1);
    int r = mlp_real_epoll_ctl(epfd, op, fd, ev);
    if (r < 0) {
        int err = errno;
        if (want && !had)
            mlp_ep_watch(fd, inner, -1);
        return -err;
    }
    pthread_mutex_lock(&mlp_epmu);
    n = NULL;
    for (int i = 0; i < outer->nnest; i++)
        if (outer->nest[i].fd == fd) {
            n = &outer->nest[i];
            break;
        }
    if (op == EPOLL_CTL_DEL) {
        if (n)
            *n = outer->nest[--outer->nnest];
    } else {
        if (!n && outer->nnest == outer->capnest) {
            int cap = outer->capnest ? outer->capnest * 2 : 8;
            void *p = realloc(outer->nest, (size_t)cap * sizeof *outer->nest);
            if (p) {
                outer->nest = p;
                outer->capnest = cap;
            }
        }
        if (!n && outer->nnest < outer->capnest)
            n = &outer->nest[outer->nnest++];
        if (n)
            *n = (struct mlp_nest){.inner = inner, .life = inner->life, .fd = fd, .watch = want};
        else if (want)
            inner->poll_watched = true; /* no room to remember it: watched for good */
    }
    pthread_mutex_unlock(&mlp_epmu);
    if (!want && had)
        mlp_ep_watch(fd, inner, -1);
    return 0;
}

/* Does poll or select on fd need our path: an epoll fd whose set holds a member of ours (or is
 * nested already)?  Its kernel file alone cannot say when those members are ready. */
bool mlp_epoll_has_ours(int fd)
{
    struct mlp_ep *e = mlp_ep_get(fd, false);
    return e && (__atomic_load_n(&e->n, __ATOMIC_RELAXED) || e->nested);
}

/* poll or select on fd: if it is such an epoll fd, it becomes a nested set (as if it were in
 * another set), so that its kernel file is readable only while a member is ready. */
bool mlp_ep_poll_nest(int fd)
{
    struct mlp_fdrec *r = mlp_fdrec(fd);
    if (!r || !atomic_load_explicit(&r->epfd, memory_order_relaxed) || !mlp_epoll_has_ours(fd))
        return false;
    struct mlp_ep *e = mlp_ep_get(fd, false);
    if (e && !e->poll_watched) {
        e->poll_watched = true; /* nested for good, until its last fd closes */
        mlp_ep_watch(fd, e, 1);
    }
    return true;
}

/* EPOLL_CTL_MOD has just enabled m again (mlp_epmu held; a thread sleeps on its set): may the
 * sleepers stay asleep?  The kernel's ep_modify wakes them only if the fd is ready then.  Yes when
 * m is a settled socket of ours that posts to its set's own queue, whose doorbell the sleepers
 * hear, and arming it there finds it not ready: its next change posts and wakes them.  m goes on
 * the list either way (the next wait looks at it).  Anything else rings, as before: libntirpc
 * (nfs-ganesha) re-arms its one-shot connection with MOD before it replies, and the ring woke
 * its loop thread for nothing once per request (on one cpu, ahead of the reply). */
static bool mlp_member_quiet(struct mlp_member *m)
{
    struct mlp_sock *s = m->s;
    struct mlp_ep *e = m->ep;
    if (m->disabled || e->nested || !e->in_kernel || !e->k_sbell || !e->q ||
        s->type != MLP_CONN || s->state != MLP_ACCEL || !s->ch || !mlp_q ||
        mlp_nopost_recent() || atomic_load(&s->fin_ns) || mlp_peer_nopost(s))
        return false;
    struct mlp_ep *forced = NULL;
    if (mlp_home_want(s, &forced) != e || forced || s->qep != e || s->ch->evq != e->q)
        return false;
    bool et = (m->events & EPOLLET) != 0;
    if (et ? mlp_arm_et(m, 0) : mlp_arm(s, (short)(m->events & 0xffff), true))
        return false; /* ready (or turned ready as we armed) */
    /* Armed in e's queue, unless it moved meanwhile (a poll on it from another thread). */
    if (s->qep != e || s->ch->evq != e->q || s->state != MLP_ACCEL)
        return false;
    return !mlp_member_ready(m);
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
            if (fd < e0->nbyfd && e0->byfd[fd] == known) {
                /* A parked member's kernel entry, for this same socket, goes too: the
                 * application deleted it (its ADD would meet EEXIST). */
                if (known->parked && known->s == s)
                    (void)mlp_real_epoll_ctl(epfd, EPOLL_CTL_DEL, fd, NULL);
                old = mlp_member_free(known);
            }
            pthread_mutex_unlock(&mlp_epmu);
            if (old)
                mlp_put(old);
        } else if (!s && (op == EPOLL_CTL_ADD ? mlp_is_epoll_fd(fd) : mlp_fdrec_is_epoll(fd)) &&
                   !mlp_vfork_child()) {
            /* An epoll fd inside another: it must look readable to the outer set when our
             * members are ready, if the outer set asks. */
            *handled = true;
            return mlp_epoll_ctl_nest(epfd, op, fd, ev);
        }
        if (s)
            mlp_put(s);
        return 0;
    }
    if ((!e0 || op == EPOLL_CTL_ADD) && mlp_vfork_child()) {
        mlp_put(s); /* a vfork child makes no record or member (see mlp_vf): the kernel's call */
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
    /*
     * Parked members.  The kernel's entry for a member of ours does not depend on the events the
     * application asks for (RDHUP, edge-triggered, our tag: the FIN is all the kernel watches),
     * so a MOD of a member we know changes nothing in the kernel, and a DEL leaves the entry
     * there, the member parked: disabled, reported never, holding its socket as before.  An ADD
     * of the same socket under the same fd takes it back.  The kernel's answers we know: a DEL
     * or MOD of a parked member is ENOENT, an ADD of a live one EEXIST.  redis-benchmark, one
     * client, made five epoll_ctl system calls a request (two ADDs, two DELs, a MOD: it adds and
     * deletes its write and read events around each), most of its time under perf.  An
     * EPOLLEXCLUSIVE entry (another kernel form) is never parked or changed without the kernel.
     */
    pthread_mutex_lock(&mlp_epmu);
    struct mlp_member *pm = fd < e->nbyfd ? e->byfd[fd] : NULL;
    /* A MOD with EPOLLEXCLUSIVE goes to the kernel, whose EINVAL for it comes before its
     * ENOENT (a parked member) and its change (a live one).  So does a DEL in a set inside
     * another (nested: mlp_ep_make_nested): a parked member's kernel entry would make the set
     * readable there at the member's FIN. */
    bool known_here = pm && pm->s == s && !(pm->events & EPOLLEXCLUSIVE) &&
                      !(op == EPOLL_CTL_MOD && (want & EPOLLEXCLUSIVE)) &&
                      !(op == EPOLL_CTL_DEL && e->nested && !pm->parked) && !pm->shared;
    int early = 1; /* 1: go on */
    if (known_here && pm->parked && op != EPOLL_CTL_ADD) {
        early = -ENOENT;
    } else if (known_here && !pm->parked && op == EPOLL_CTL_ADD) {
        early = -EEXIST;
    } else if (known_here && !pm->parked && op == EPOLL_CTL_DEL) {
        pm->parked = true;
        pm->disabled = true;
        mlp_rl_del(pm);
        early = 0;
    }
    if (early <= 0) {
        pthread_mutex_unlock(&mlp_epmu);
        mlp_put(s);
        return early;
    }
    bool skip_kernel = known_here && !(want & EPOLLEXCLUSIVE); /* an ADD back, or a MOD */
    bool parked_anew = known_here && pm->parked; /* read under the lock, used after it */
    int r;
    if (!skip_kernel) {
        pthread_mutex_unlock(&mlp_epmu);
        if (parked_anew) /* an EPOLLEXCLUSIVE ADD over a parked entry: anew */
            (void)mlp_real_epoll_ctl(epfd, EPOLL_CTL_DEL, fd, NULL);
        /* The kernel checks epfd, fd, op, EEXIST/ENOENT and EPOLLEXCLUSIVE with MOD for us, on
         * the kernel fd.  Edge-triggered: the FIN is reported once, not on every wait after it. */
        struct epoll_event kev = {.events = EPOLLRDHUP | EPOLLET,
                                  .data.u64 = MLP_TAG | (uint32_t)fd};
        e->tagged = true; /* before the kernel holds the tag: a wait that sees it must filter it */
        if (want & EPOLLEXCLUSIVE)
            kev.events = EPOLLIN | EPOLLET | EPOLLEXCLUSIVE; /* RDHUP is not allowed with it */
        r = mlp_real_epoll_ctl(epfd, op, fd, op == EPOLL_CTL_DEL ? NULL : &kev);
        if (r < 0) {
            r = -errno;
            mlp_put(s);
            return r;
        }
        pthread_mutex_lock(&mlp_epmu);
    }
    struct mlp_sock *drop[3] = {NULL, NULL, NULL};
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
                mlp_home_hint(s);
                if (m->snext) {
                    /* In two sets now: it posts to the process's queue, whose doorbell each of
                     * its sets must hear; one asleep without it wakes to take it. */
                    for (struct mlp_member *o = s->epm; o; o = o->snext)
                        if (!atomic_exchange(&o->ep->pbell, true) && o->ep->sleepers)
                            mlp_ep_ring(o->ep);
                }
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
        m->parked = false;
        m->undecided_seen = 0;
        m->nopost_seen = 0;
        m->napping = false;
        mlp_rl_del(m);
        /* like the kernel's insert: looked at on the next wait; the sleepers woken only if it
         * may be ready */
        if (op == EPOLL_CTL_MOD && e->sleepers && mlp_member_quiet(m))
            (void)mlp_rl_link(m);
        else
            mlp_rl_push(m);
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
    /* Noted as the program's own plain entry would be: after a disconnect (connect(AF_UNSPEC))
     * the connect that makes the socket ours again takes it over (mlp_epoll_adopt). */
    if (m->parked) { /* the application deleted it: so must the kernel now */
        if (mlp_real_epoll_ctl(epfd, EPOLL_CTL_DEL, m->fd, NULL) == 0)
            mlp_epoll_note_plain(epfd, EPOLL_CTL_DEL, m->fd, NULL);
    } else if (mlp_real_epoll_ctl(epfd, EPOLL_CTL_MOD, m->fd, &kev) == 0) {
        mlp_epoll_note_plain(epfd, EPOLL_CTL_MOD, m->fd, &kev);
    }
    return mlp_member_free(m);
}

/* Arm an edge-triggered member after a look that reported `reported` (or found nothing).  The
 * kernel's next edge is new data, or write space after the socket was full: so the read tripwire
 * is armed even while data waits, and the write tripwire only while the ring has less than
 * mlp_tx_room free, the socket not writable (armed while writable, every read by the peer would
 * post a write "edge" the kernel never makes).  True if
 * something not yet reported turned up meanwhile: its writer may have missed the tripwire. */
bool mlp_arm_et(struct mlp_member *m, uint32_t reported)
{
    struct mlp_sock *s = m->s;
    if (!mlp_queue_add(s, true))
        return false;
    uint32_t ev = 0;
    if (m->events & (EPOLLIN | EPOLLRDNORM | EPOLLRDHUP | EPOLLPRI)) /* EPOLLPRI: urgent */
        ev |= MEMLAN_EV_READ;
    if ((m->events & (EPOLLOUT | EPOLLWRNORM)) && !mlp_tx_roomy_ro(s->ch)) {
        ev |= MEMLAN_EV_WRITE;
        atomic_fetch_add_explicit(&s->ch->tx_short, 1, memory_order_relaxed);
    }
    if (!ev)
        return false;
    (void)__ml_chan_arm_evq(s->ch, ev); /* its fence orders the arm before the look below */
    int rev = mlp_revents_want(s, m->fd, (short)(m->events & 0xffff));
    if (rev < 0)
        return true;
    return (mlp_ev_from_poll(rev) & (m->events | EPOLLERR | EPOLLHUP) & ~reported) != 0;
}

/* Members that one epoll_wait leaves unarmed while it spins, looking at their rings itself
 * (design.md, "epoll_wait watches its members while it spins").  Each holds a reference to its
 * socket, so its channel stays mapped while the spin reads it without mlp_epmu. */
#define MLP_EP_WATCH 4
struct mlp_ep_watch {
    int n;
    int fd[MLP_EP_WATCH];
    struct mlp_sock *s[MLP_EP_WATCH];
    /* The rest under mlp_epmu.  Linked in its set's list (watches) while it has members, so
     * that any other wait on the set takes them back (mlp_ep_unwatch_others); stop: one did,
     * and this wait watches no more. */
    struct mlp_ep_watch *next;
    bool linked, stop;
};

/* The sockets this thread's waits watch, each counted in its s->lent as well: a fork child's
 * mlp_poll_fork_drop gives back what the parent's other threads' spins held (their threads do
 * not exist there) and keeps what this thread's own holds (a handler that forked may have
 * interrupted its spin, which gives them back when it goes on).  A wait nested in a handler
 * watches beside the one it interrupted; none when the slots are full. */
#define MLP_EP_MINE (2 * MLP_EP_WATCH) /* a wait, and one a handler of its spin makes */
static __thread struct mlp_sock *mlp_ep_mine[MLP_EP_MINE]
    __attribute__((tls_model("initial-exec")));

static int mlp_ep_mine_slot(const struct mlp_sock *s)
{
    for (int i = 0; i < MLP_EP_MINE; i++)
        if (mlp_ep_mine[i] == s)
            return i;
    return -1;
}

/* In a fork child: how many of s's lent references this thread's own spins hold. */
int mlp_ep_watch_mine(const struct mlp_sock *s)
{
    int k = 0;
    for (int i = 0; i < MLP_EP_MINE; i++)
        k += s && mlp_ep_mine[i] == s;
    return k;
}

static void mlp_ep_watch_unlink(struct mlp_ep *e, struct mlp_ep_watch *w)
{
    if (!w->linked)
        return;
    for (struct mlp_ep_watch **pp = &e->watches; *pp; pp = &(*pp)->next)
        if (*pp == w) { /* not there when the set was reused, or in a fork child */
            *pp = w->next;
            break;
        }
    w->linked = false;
}

/* May m, found not ready, be watched rather than armed?  Level-triggered readers of ours only:
 * an edge-triggered member's arm keeps what was reported, and a writer's room, an exclusive
 * wake-up or a one-shot member are the arm's to tell. */
static bool mlp_ep_watchable(const struct mlp_member *m)
{
    const struct mlp_sock *s = m->s;
    /* A member that asks for no bytes (events 0, or EPOLLRDHUP alone) is armed: its unread
     * bytes would make the spin's look say ready on every round, and the collect find nothing
     * to report. */
    return (m->events & (EPOLLIN | EPOLLRDNORM)) &&
           !(m->events & (EPOLLET | EPOLLONESHOT | EPOLLEXCLUSIVE | EPOLLOUT | EPOLLWRNORM |
                          EPOLLPRI)) &&
           s->type == MLP_CONN && s->state == MLP_ACCEL && s->ch && s->ch->evq && mlp_q &&
           !atomic_load_explicit(&s->fin_ns, memory_order_relaxed);
}

/* The spin is over (or left by a jump): every member w watched is armed as the harvest would
 * have armed it, or goes back on the ready list when it turned ready as it was armed or cannot
 * be armed (the next collect reports it, or naps on it, as the harvest does).  arm false: each
 * goes back on the list unarmed (mlp_ep_left's: a handler's context, where an arm's queue work
 * has no place).  mlp_epmu held; w's references stay.  Returns whether any went back. */
static bool mlp_ep_unwatch_locked(struct mlp_ep *e, struct mlp_ep_watch *w, bool arm)
{
    bool back = false;
    for (int i = 0; i < w->n; i++) {
        int fd = w->fd[i];
        struct mlp_sock *s = w->s[i];
        struct mlp_member *m = fd < e->nbyfd ? e->byfd[fd] : NULL;
        if (!m || m->s != s || m->disabled || m->queued)
            continue; /* gone, changed, or listed again meanwhile (a post, a MOD) */
        if (!arm || !mlp_ep_watchable(m) || mlp_arm(s, (short)(m->events & 0xffff), true) ||
            !s->ch->evq || mlp_peer_nopost(s)) { /* (no post would bring it back: harvest) */
            mlp_rl_push(m);
            back = true;
        }
    }
    return back;
}

/* Another wait on e is here (mlp_epmu held): every member that other waits' spins watch goes
 * back on the ready list, unarmed, for this wait's harvest to report or arm, and those waits
 * watch no more.  A watched member is seen by nobody but its spin: a wait of another thread,
 * or of a handler that interrupted the spin, would otherwise report nothing of it, and sleep
 * through its data (nothing posts for it) for as long as the spin did not run, as while the
 * handler ran (tests/preload/watchhole.c).  own: the caller's own record, left alone. */
static bool mlp_ep_unwatch_others(struct mlp_ep *e, const struct mlp_ep_watch *own)
{
    bool back = false;
    for (struct mlp_ep_watch **pp = &e->watches; *pp;) {
        struct mlp_ep_watch *w = *pp;
        if (w == own) {
            pp = &w->next;
            continue;
        }
        *pp = w->next;
        w->linked = false;
        w->stop = true;
        back |= mlp_ep_unwatch_locked(e, w, false);
    }
    return back;
}

/* The ends of an accelerated connection as one word: the peer's side state, its death as we
 * know it, our shutdowns and a reset: any change is an edge (the kernel's state change wakes
 * its waiters), whatever the rings say. */
static uint32_t mlp_ep_ends(struct mlp_sock *s)
{
    struct memlan_channel *ch = s->ch;
    uint32_t f = s->me ? (atomic_load(&s->me->flags) & (ML_SOCK_RESET_TOLD | ML_SOCK_WROTE_LATE))
                       : 0;
    return (__ml_chan_peer_state(ch) & 0xff) | (uint32_t)ch->peer_dead << 8 |
           (uint32_t)ch->shut_wr << 9 | (uint32_t)ch->shut_rd << 10 |
           (uint32_t)ch->rd_eof_when_empty << 11 | (f ? 1u << 12 : 0) | f << 16;
}

/* Take up to max ready events off e's ready list (mlp_epmu held).  Sockets to drop go to puts.
 * *undecided: some member waits for its connection to settle (it must be looked at again soon).
 * w: the caller spins next; level-triggered readers found not ready are watched there, not
 * armed (NULL: armed). */
static int mlp_ep_harvest(int epfd, struct mlp_ep *e, struct epoll_event *out, int max,
                          bool *undecided, struct mlp_sock **puts, int *np,
                          struct mlp_ep_watch *w)
{
    int got = 0;
    for (int k = e->nready; k > 0 && got < max && e->rhead && *np < 64; k--) {
        struct mlp_member *m = e->rhead;
        mlp_rl_del(m);
        struct mlp_sock *s = m->s;
        if (m->disabled)
            continue;
        int looks = 0, slot;
        bool et = (m->events & EPOLLET) != 0;
        uint32_t reported = 0; /* edge-triggered: bits already reported for the current edge */
    look:;
        /* Edge-triggered: where the rings stood before this look (see "moved", below).  Read
         * first: data that lands after it makes the next look's differ (its post, for the
         * read tripwire armed at the last report, puts the member back). */
        uint64_t rxh = 0, txt = 0;
        uint32_t txs = 0, ends = 0;
        bool ring_pos = et && s->type == MLP_CONN && s->state == MLP_ACCEL && s->ch;
        if (ring_pos) {
            ends = mlp_ep_ends(s);
            txs = atomic_load_explicit(&s->ch->tx_short, memory_order_relaxed);
            rxh = atomic_load_explicit(&s->ch->rx.ctl->head, memory_order_acquire);
            txt = atomic_load_explicit(&s->ch->tx.ctl->tail, memory_order_acquire);
        }
        int rev = s->type == MLP_CONN && s->state != MLP_TCP
                      ? mlp_revents_want(s, m->fd, (short)(m->events & 0xffff))
                      : -1;
        if (rev < 0) {
            puts[(*np)++] = mlp_member_to_kernel(epfd, m);
            continue;
        }
        uint32_t ev = mlp_ev_from_poll(rev) & (m->events | EPOLLERR | EPOLLHUP);
        bool und = s->state == MLP_UNDECIDED;
        /* A peer that said its posts may not reach us (ML_SOCK_NOPOST: it changed credentials):
         * no post puts the member back on the list, so it stays there, looked at at every nap,
         * and edge-triggered reports only what turned ready since the last look, as for an
         * undecided socket (a readiness that stays, an idle socket's EPOLLOUT, was reported
         * again at every look: a review). */
        bool nopost = !und && s->type == MLP_CONN && s->state == MLP_ACCEL && mlp_peer_nopost(s);
        if (und) {
            *undecided = true;
            if (et) {
                uint32_t fresh = ev & ~m->undecided_seen;
                m->undecided_seen |= ev;
                ev = fresh;
            }
        } else if (nopost) {
            *undecided = true;
            if (et) {
                uint32_t fresh = ev & ~m->nopost_seen;
                m->nopost_seen = ev; /* what is ready now; what went may come again */
                m->napping = true;
                ev = fresh;
            }
        } else {
            /* Settled: what was reported while undecided is no new edge by itself; an edge
             * with something new reports the whole mask, as the kernel's wake-ups do (the
             * server's first byte came as EPOLLIN alone: tests/preload/etsettle.c).  So for
             * what was reported while the peer said ML_SOCK_NOPOST. */
            reported |= m->undecided_seen | (m->napping ? m->nopost_seen : 0);
            m->undecided_seen = 0;
            m->napping = false;
        }
        if (et && !und && !nopost) {
            /* A post for nothing (a credential change's priming posts: cred.c), or for data
             * that a member waiting for room alone does not watch, found no new data, no room
             * after the ring was short and no end since the last report: what that report
             * said, still ready, is no new edge, as the kernel, whose wake-ups come only with
             * data, room or an end (keyed by kind), makes none (two EPOLLOUT reports came at a
             * server's drop: rev27).  The peer writes these positions; a lie moves them, and
             * costs a report, as a post for nothing did before. */
            bool reads = (m->events & (EPOLLIN | EPOLLRDNORM | EPOLLRDHUP | EPOLLPRI)) != 0;
            if (ring_pos && (rxh == m->rx_head_seen || !reads) && ends == m->ends_seen &&
                (txt == m->tx_tail_seen || txs == m->tx_short_seen))
                reported |= m->nopost_seen;
            if (!(ev & ~reported))
                ev = 0; /* nothing new; with something new, the whole mask, as the kernel's */
            m->nopost_seen = ev | reported;
            if (ev) {
                m->rx_head_seen = rxh;
                m->tx_tail_seen = txt;
                m->tx_short_seen = txs;
                m->ends_seen = ends;
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
                int cpu = __ml_getcpu();
                ml_note_cpu(&s->ch->rx.ctl->rx_cpu, (uint32_t)(cpu + 1));
                __atomic_store_n(&e->rep_thr, (uintptr_t)pthread_self(), __ATOMIC_RELAXED);
                __atomic_store_n(&e->rep_cpu, cpu, __ATOMIC_RELAXED);
                __atomic_store_n(&e->rep_fd, m->fd, __ATOMIC_RELAXED);
                __atomic_store_n(&e->rep_s, (void *)s, __ATOMIC_RELAXED);
                __atomic_store_n(&e->rep_tx,
                                 atomic_load_explicit(s->ch->tx.pub, memory_order_relaxed),
                                 __ATOMIC_RELAXED);
                __atomic_store_n(&e->rep_rx,
                                 atomic_load_explicit(s->ch->rx.pub, memory_order_relaxed),
                                 __ATOMIC_RELAXED);
            }
            if (m->events & EPOLLONESHOT)
                m->disabled = true;
            else if (und || nopost || !et)
                mlp_rl_push(m); /* level-triggered: looked at again on the next wait */
            else if (mlp_arm_et(m, reported | ev))
                mlp_rl_push(m); /* a new edge already: the next wait reports it */
        } else if (und || nopost) {
            mlp_rl_push(m);
        } else if (atomic_load(&s->fin_ns) && mlp_check_peer(s)) {
            mlp_rl_push(m); /* its FIN came before its lock went: nap and look again */
            *undecided = true;
        } else if (w && !w->stop && !e->sleepers && w->n < MLP_EP_WATCH &&
                   mlp_ep_watchable(m) && (slot = mlp_ep_mine_slot(NULL)) >= 0) {
            /* The caller's spin looks at its ring; armed when the spin ends (mlp_ep_unwatch).
             * Not while a thread sleeps on the set: it would not hear of the data. */
            atomic_fetch_add(&s->refs, 1);
            w->fd[w->n] = m->fd;
            w->s[w->n++] = s;
            mlp_ep_mine[slot] = s;
            atomic_fetch_add(&s->lent, 1); /* after it is named (mlp_poll_fork_drop) */
            if (!w->linked) {
                w->next = e->watches;
                e->watches = w;
                w->linked = true;
            }
        } else if (et ? mlp_arm_et(m, reported) : mlp_arm(s, (short)(m->events & 0xffff), true)) {
            /* It changed as we armed.  Look at it again now: its writer may have written before
             * it could see the tripwire, and then no post comes; a caller that got nothing here
             * would sleep past the data (a ping-pong server hung so).  Only this member: the
             * others may already be in this answer, and the kernel reports an fd once per call. */
            if (++looks < 3)
                goto look;
            mlp_rl_push(m);
            *undecided = true; /* still changing: the caller naps 1 ms rather than sleeping */
        } else if (!mlp_q || !s->ch->evq || mlp_peer_nopost(s)) {
            /* Cannot be armed (no queue, or every registration slot of the direction taken:
             * more processes wait on it than it has slots), or its peer said just now that its
             * posts may not reach us (ML_SOCK_NOPOST, above): no post can put it back on the
             * list, so it stays there, and the caller naps rather than sleeping.  (Before, the
             * nap looked at the list only: a client in epoll_wait never heard the reply of a
             * server that dropped its euid, samba's smbd: an explorer.) */
            mlp_rl_push(m);
            *undecided = true;
        }
    }
    return got;
}

/* A member whose peer's end no FIN tells (poll.c, mlp_peer_passed_gone: one that passed its
 * socket to another process and then ended without its exit handler, or one that shut down its
 * writing and died while we wait to write) goes on the ready list, where the harvest reports its
 * end.  So does one whose peer said, after we armed it, that its posts may not reach us
 * (ML_SOCK_NOPOST): the harvest keeps it there, and the wait naps and looks.  Nothing else
 * would: no post comes from a dead process, nor a FIN from a kernel socket
 * that the receiver holds or that sent its FIN at the shutdown.  A walk of the set's members at
 * most once per liveness interval, by any wait that may sleep, busy set or idle (made only when
 * a wait ran out, a writer in a busy loop's set was never woken; a passed peer still only then,
 * ran_out), and a system call only for those members whose peer qualifies. */
static bool mlp_ep_passed_look(struct mlp_ep *e, bool ran_out)
{
    /* at the liveness pace per set, whatever the caller's timeouts (a short one each loop) */
    uint64_t now = mlp_coarse_ns(), t = __atomic_load_n(&e->passed_ns, __ATOMIC_RELAXED);
    if (now - t < ML_LIVENESS_NS ||
        !__atomic_compare_exchange_n(&e->passed_ns, &t, now, false, __ATOMIC_RELAXED,
                                     __ATOMIC_RELAXED))
        return false;
    bool found = false;
    pthread_mutex_lock(&mlp_epmu);
    for (int fd = 0; fd < e->nbyfd; fd++) {
        struct mlp_member *m = e->byfd[fd];
        if (m && m->s && !m->disabled && !m->parked && !m->queued &&
            (mlp_peer_passed_gone(m->s, (m->events & EPOLLOUT) != 0, ran_out) ||
             (m->s->type == MLP_CONN && m->s->state == MLP_ACCEL && mlp_peer_nopost(m->s)))) {
            mlp_rl_push(m);
            found = true;
        }
    }
    pthread_mutex_unlock(&mlp_epmu);
    return found;
}

/* w's members are named no more (mlp_epmu held): their lent counts and this thread's slots given
 * back, w out of its set's list.  Returns how many references (w->s[0..n)) the caller puts once
 * the lock is released. */
static int mlp_ep_watch_drop_locked(struct mlp_ep *e, struct mlp_ep_watch *w)
{
    int n = w->n;
    for (int i = 0; i < n; i++) {
        struct mlp_sock *s = w->s[i];
        atomic_fetch_sub(&s->lent, 1); /* before it is unnamed (mlp_poll_fork_drop) */
        int slot = mlp_ep_mine_slot(s);
        if (slot >= 0)
            mlp_ep_mine[slot] = NULL;
    }
    w->n = 0; /* before the puts: a jump between leaks them, never puts twice */
    mlp_ep_watch_unlink(e, w);
    return n;
}

/* The same, taking mlp_epmu, then w's references given back.  left: from mlp_ep_left (a jump
 * from under mlp_epmu, which stays held, leaves them). */
static bool mlp_ep_unwatch(struct mlp_ep *e, struct mlp_ep_watch *w, bool arm, bool left)
{
    if (!w->n)
        return false;
    if (left ? !mlp_lock_left(&mlp_epmu) : pthread_mutex_lock(&mlp_epmu) != 0)
        return false;
    bool back = mlp_ep_unwatch_locked(e, w, arm);
    int n = mlp_ep_watch_drop_locked(e, w);
    pthread_mutex_unlock(&mlp_epmu);
    for (int i = 0; i < n; i++)
        mlp_put(w->s[i]); /* outside the lock: the last put may destroy the socket */
    return back;
}

/* full: the drains look at every summary word, as they must once memlan_evq_arm said that
 * something is pending (a look bounded to the slots handed out would leave a peer's bits above
 * them there, and the caller looping); false for a wait's first collect and its spin's. */
static int mlp_ep_collect(int epfd, struct mlp_ep *e, struct epoll_event *out, int max,
                          bool *undecided, uint64_t *gen, struct mlp_ep_watch *w, bool full)
{
    struct mlp_sock *puts[64 + MLP_EP_WATCH];
    int np = 0;
    mlp_queue_drain_look(full);
    mlp_ep_drain(e, full);
    pthread_mutex_lock(&mlp_epmu);
    if (e->watches)
        (void)mlp_ep_unwatch_others(e, w); /* what other spins watch, this wait sees */
    if (w && w->n) {
        /* The spin saw a watched member ready, or its fd gone: all go back on the list,
         * unarmed, for the harvest to look at (those still not ready are watched again). */
        (void)mlp_ep_unwatch_locked(e, w, false);
        int n = mlp_ep_watch_drop_locked(e, w);
        for (int i = 0; i < n; i++)
            puts[np++] = w->s[i];
    }
    int got = e->rhead ? mlp_ep_harvest(epfd, e, out, max, undecided, puts, &np, w) : 0;
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
    if (e->watches)
        (void)mlp_ep_unwatch_others(e, NULL); /* a spin's members: armed below, or listed */
    for (int k = e->nready; k > 0 && e->rhead && !ready; k--) {
        struct mlp_member *m = e->rhead;
        mlp_rl_del(m);
        if (m->disabled)
            continue;
        if (mlp_member_ready(m) || mlp_arm(m->s, (short)(m->events & 0xffff), true) || !mlp_q ||
            !m->s->ch->evq) {
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

void mlp_ep_nested_leave(struct mlp_ep *e)
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
void mlp_nested_refresh(void)
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

/* The kernel set's answer, waiting up to left ns (-1: for ever).  epoll_pwait, in milliseconds
 * rounded up, unless the application itself called epoll_pwait2: a kernel before 5.11 or a
 * seccomp filter that predates it refuses epoll_pwait2 (ENOSYS, EPERM, or SIGSYS), and a program
 * that never called it must not meet that because of us. */
__thread bool mlp_ep_ns __attribute__((tls_model("initial-exec"))); /* set by the epoll_pwait2 interposer around its call */
static _Atomic bool mlp_no_pwait2;

static int mlp_ep_kwait(int epfd, struct epoll_event *out, int max, int64_t left,
                        const sigset_t *mask)
{
    if (mlp_ep_ns && mlp_real_epoll_pwait2 && !atomic_load_explicit(&mlp_no_pwait2,
                                                                    memory_order_relaxed)) {
        struct timespec ts = mlp_ts(left < 0 ? 0 : left);
        int r = mlp_real_epoll_pwait2(epfd, out, max, left < 0 ? NULL : &ts, mask);
        if (r >= 0)
            return r;
        if (errno != ENOSYS)
            return -errno;
        atomic_store(&mlp_no_pwait2, true);
    }
    int r = mlp_real_epoll_pwait(epfd, out, max,
                                 left < 0 ? -1 : (int)((left + 999999) / 1000000), mask);
    return r < 0 ? -errno : r;
}

/* Keep the application's events of a kernel answer and act on ours: a member's FIN (look at its
 * peer, put it on its sets' lists), the doorbell or the set's eventfd (*ours: look again).  No
 * event of ours ever reaches the application. */
static int mlp_ep_filter(struct epoll_event *out, int r, bool *ours)
{
    int w = 0;
    for (int i = 0; i < r; i++) {
        uint64_t d = out[i].data.u64;
        if ((d & MLP_TAG_MASK) == MLP_TAG) {
            if (d != MLP_TAG_BELL && d != MLP_TAG_WAKE && d != MLP_TAG_SBELL) {
                struct mlp_sock *s = mlp_get((int)(uint32_t)d);
                if (s) {
                    (void)mlp_check_peer(s);
                    mlp_mark_sock(s);
                    mlp_put(s);
                }
            }
            *ours = true;
            continue;
        }
        out[w++] = out[i];
    }
    return w;
}

#define MLP_EP_SWITCH 1000000000 /* mlp_ep_kernel_only: a member of ours came, wait the whole way */

/* What an epoll_wait holds on its set (see "waits left by a jump or a cancellation"): its count
 * in waiters, and in sleepers (1: counted alone, as mlp_ep_kernel_only does; 2: under mlp_epmu,
 * the last sleeper draining a rung eventfd).  A count left behind kept the set's eventfd rung,
 * and every later wait on the set woke at once and spun. */
struct mlp_ep_undo {
    struct _pthread_cleanup_buffer buf;
    struct mlp_ep *e;
    volatile bool waiter;
    volatile int sleeper;
    struct mlp_ep_watch *w; /* its members go back on the ready list */
};

static void mlp_ep_left(void *arg)
{
    struct mlp_ep_undo *u = arg;
    struct mlp_ep *e = u->e;
    if (u->w)
        (void)mlp_ep_unwatch(e, u->w, false, true);
    if (u->waiter) {
        u->waiter = false;
        __atomic_sub_fetch(&e->waiters, 1, __ATOMIC_RELAXED);
    }
    int sl = u->sleeper;
    if (sl == 1) {
        u->sleeper = 0;
        atomic_fetch_sub(&e->sleepers, 1);
    } else if (sl == 2 && mlp_lock_left(&mlp_epmu)) {
        u->sleeper = 0;
        if (--e->sleepers == 0 && e->efd_rung && !e->nested) {
            uint64_t v;
            (void)__ml_sys_read(e->efd, &v, sizeof v);
            e->efd_rung = false;
        }
        pthread_mutex_unlock(&mlp_epmu);
    }
}

/* A set with no member of ours: the kernel's answer, with our fds out of the set and any tagged
 * leftover filtered.  The thread counts as a sleeper, so that a member added meanwhile by another
 * thread rings the set's eventfd (mlp_ep_setup) and this wait goes on the whole way. */
static int mlp_ep_kernel_only(int epfd, struct mlp_ep *e, struct epoll_event *out, int max,
                              int64_t timeout_ns, uint64_t deadline, const sigset_t *mask)
{
    mlp_ep_unsetup(epfd, e);
    struct mlp_ep_undo u = {.e = e};
    int ret;
    mlp_left_push(&u.buf, mlp_ep_left, &u);
    pthread_cleanup_push(mlp_ep_left, &u);
    for (;;) {
        /* No lock: threads with a set each (tokio, Envoy) must not meet on a process-wide one.
         * SYNC: the seq_cst increment pairs with the fence in mlp_ep_setup(). */
        atomic_fetch_add(&e->sleepers, 1);
        u.sleeper = 1; /* after the count, and cleared before it: a jump leaks, never undoes twice */
        if (__atomic_load_n(&e->n, __ATOMIC_SEQ_CST) > 0) {
            u.sleeper = 0;
            atomic_fetch_sub(&e->sleepers, 1);
            ret = MLP_EP_SWITCH;
            break;
        }
        int64_t left = timeout_ns < 0 ? -1 : mlp_left(deadline);
        int r = mlp_ep_kwait(epfd, out, max, left, mask);
        u.sleeper = 0;
        atomic_fetch_sub(&e->sleepers, 1); /* a ring for us stays on the eventfd: the whole
                                            * wait that follows takes it */
        if (r <= 0) {
            ret = r;
            break;
        }
        bool ours = false;
        int w = e->tagged ? mlp_ep_filter(out, r, &ours) : r;
        if (w || (timeout_ns >= 0 && mlp_left(deadline) == 0)) {
            ret = w;
            break;
        }
    }
    pthread_cleanup_pop(0);
    mlp_left_pop(&u.buf);
    return ret;
}

/* epoll_wait's spin (__ml_spin_run): a collect of the set's ready list. */
struct mlp_ep_spin {
    int epfd;
    struct mlp_ep *e;
    struct epoll_event *out;
    int max;
    bool *undecided;
    uint64_t *gen;
    struct mlp_ep_watch *watch;
};

static int mlp_ep_spin_look(struct ml_spinning *sp, void *a)
{
    struct mlp_ep_spin *w = a;
    /* The members it watches: their rings, read as a blocking receive's spin reads its own.
     * And their fds: a socket whose last fd went (a close, a dup2 over it, a disconnect by
     * another thread) is let go of at once, since the kernel's epoll holds no reference to its
     * members' files: held to the spin's end, its connection's end (the FIN, a disconnect's
     * reset) waited for the spin's budget (tests/preload/watchhole.c, "disconnect"). */
    struct mlp_ep_watch *wa = w->watch;
    for (int i = 0; i < wa->n; i++)
        if (__ml_chan_ready_ro(wa->s[i]->ch, 0, 0) ||
            !atomic_load_explicit(&wa->s[i]->nfds, memory_order_relaxed))
            return mlp_ep_collect(w->epfd, w->e, w->out, w->max, w->undecided, w->gen, wa,
                                  false);
    /* Nothing on the set's ready list and nothing posted to its queues: no lock taken.  Each
     * round used to take three mutexes (the process's queue, the set's, mlp_epmu), 40 % of an
     * idle redis-server's cycles between requests under perf; they make a look several times
     * a spin round's pause.  Read racily, each is a hint: what it misses, the next round or
     * the locked look before any sleep finds (*gen keeps the locked look's, the older). */
    memlan_evq_t *pq = __atomic_load_n(&mlp_q, __ATOMIC_ACQUIRE),
                 *sq = __atomic_load_n(&w->e->q, __ATOMIC_ACQUIRE);
    if (!__atomic_load_n(&w->e->rhead, __ATOMIC_RELAXED) && (!pq || __ml_evq_quiet_hint(pq)) &&
        (!sq || __ml_evq_quiet_hint(sq)))
        return 0;
    return mlp_ep_collect(w->epfd, w->e, w->out, w->max, w->undecided, w->gen, wa, false);
}

/* Is another thread of ours still handling this set's last event, on the cpu we are on?  The
 * event was reported here and nothing has been sent on its socket since, so its peer waits for
 * an answer; and either another thread took it, or we did and have not read it (we handed it
 * on).  A spin here could then only hold off the thread that must give that answer (nfs-ganesha:
 * libntirpc's loop passes to a fresh pool thread as the old one handles the request, and with
 * its threads on one cpu the new loop thread spun ahead of every reply).  A thread that took the
 * event itself and has read or answered (a plain server, a stream's reader) spins as before. */
static bool mlp_ep_handler_here(struct mlp_ep *e)
{
    uintptr_t thr = __atomic_load_n(&e->rep_thr, __ATOMIC_RELAXED);
    if (!thr)
        return false;
    int cpu = __ml_getcpu();
    if (cpu < 0 || __atomic_load_n(&e->rep_cpu, __ATOMIC_RELAXED) != cpu)
        return false;
    struct mlp_sock *s = mlp_get(__atomic_load_n(&e->rep_fd, __ATOMIC_RELAXED));
    if (!s)
        return false;
    bool owed = (void *)s == __atomic_load_n(&e->rep_s, __ATOMIC_RELAXED) &&
                s->type == MLP_CONN && s->state == MLP_ACCEL && s->ch &&
                atomic_load_explicit(s->ch->tx.pub, memory_order_relaxed) ==
                    __atomic_load_n(&e->rep_tx, __ATOMIC_RELAXED) &&
                (thr != (uintptr_t)pthread_self() ||
                 atomic_load_explicit(s->ch->rx.pub, memory_order_relaxed) ==
                     __atomic_load_n(&e->rep_rx, __ATOMIC_RELAXED));
    mlp_put(s);
    return owed;
}

int mlp_epoll_wait(int epfd, struct epoll_event *out, int max, int64_t timeout_ns,
                   const sigset_t *mask)
{
    if (max <= 0)
        return -EINVAL;
    uint64_t deadline = timeout_ns < 0 ? 0 : mlp_now_ns() + (uint64_t)timeout_ns;
    /* Every set has a record, members or not: a thread asleep on a set must hear of a member
     * that another thread adds (gRPC's and tokio's pattern), and a set that had members must
     * never hand the application an event of ours. */
    int vf = -1; /* a vfork child (mlp_vf): it makes no record */
    struct mlp_ep *e = mlp_ep_get(epfd, false);
    if (!e && !mlp_vf(&vf))
        e = mlp_ep_get(epfd, true);
    if (!e) { /* beyond the table (or no memory, or a vfork child's set): the kernel's answer,
               * filtered */
        int r = mlp_ep_kwait(epfd, out, max, timeout_ns < 0 ? -1 : timeout_ns, mask);
        bool ours = false;
        return r > 0 ? mlp_ep_filter(out, r, &ours) : r;
    }
    if (!__atomic_load_n(&e->n, __ATOMIC_RELAXED) && !e->nested &&
        !__atomic_load_n(&mlp_nnested, __ATOMIC_RELAXED)) {
        int r = mlp_ep_kernel_only(epfd, e, out, max, timeout_ns, deadline, mask);
        if (r != MLP_EP_SWITCH)
            return r;
    }
    bool spun = false, again_full = false;
    bool mine = false; /* the answer has a member of ours in it */
    int ret;
    int64_t live = mlp_live_begin();
    struct mlp_ep_watch watch = {.n = 0};
    struct mlp_ep_undo u = {.e = e, .w = &watch};
    mlp_left_push(&u.buf, mlp_ep_left, &u);
    pthread_cleanup_push(mlp_ep_left, &u);
    __atomic_add_fetch(&e->waiters, 1, __ATOMIC_RELAXED);
    u.waiter = true;
    for (;;) {
        bool undecided = false;
        uint64_t gen = 0;
        int got = 0;
        /* The kernel's fds get their turn at a bounded interval, and at least half the answer
         * then, even while members of ours fill every answer (libevent's 32 events and more
         * busy connections: its listener was never reported); but not on every call, which cost
         * a system call per answer. */
        uint64_t now = mlp_now_ns();
        if (now - __atomic_load_n(&e->kpoll_ns, __ATOMIC_RELAXED) >= MLP_KPOLL_NS) {
            __atomic_store_n(&e->kpoll_ns, now, __ATOMIC_RELAXED);
            mlp_nested_refresh(); /* a set inside this one must look ready only if it is */
            /* One more than half: our doorbell, which the filter takes out, is ready there from
             * the wake-up that rang it until the next sleep, and took a place of the program's
             * (a program's check with maxevents 3 and a ready fd of its own saw a killed peer's
             * end one call late: PostgreSQL's client_connection_check_interval, a whole
             * interval; an explorer, test_a_peers_end_is_in_the_first_check_after_it). */
            int r = mlp_ep_kwait(epfd, out, max > 2 ? (max + 1) / 2 + 1 : max > 1 ? 2 : 1, 0,
                                 NULL);
            if (r < 0) {
                ret = r;
                break;
            }
            bool ours = false;
            got = mlp_ep_filter(out, r, &ours);
        }
        /* Before its spin, level-triggered readers found not ready are watched, not armed: a
         * sender then makes no post, and the spin sees their data as it lands. */
        bool watch_on = !spun && timeout_ns != 0 && !e->nested;
        if (got < max) {
            int c = mlp_ep_collect(epfd, e, out + got, max - got, &undecided, &gen,
                                   watch_on ? &watch : NULL, again_full);
            mine |= c > 0;
            got += c;
        }
        again_full = true; /* a look again follows an arm's answer, or a sleep */
        if (!got && !spun && timeout_ns != 0) {
            spun = true;
            struct mlp_ep_spin look = {epfd, e, out, max, &undecided, &gen, &watch};
            struct ml_spinning spin = {
                .sp = &mlp_poll_spin,
                .budget = mlp_ep_handler_here(e) ? 0
                                                 : __ml_spin_budget_ns(&mlp_poll_spin, e->peer_cpu),
                .every = 4, .look = mlp_ep_spin_look, .arg = &look};
            got = __ml_spin_run(&spin);
            mine |= got > 0; /* the spin reports members of ours alone */
        }
        (void)mlp_ep_unwatch(e, &watch, true, false); /* armed before any sleep or return */
        if (got) {
            ret = got;
            break;
        }
        bool slept = false;
        if (timeout_ns != 0 && mlp_vf(&vf)) {
            undecided = true; /* a vfork child sets nothing up: nap and look again */
        } else if (timeout_ns != 0) {
            mlp_ep_setup(epfd, e);
            mlp_nested_refresh();
            pthread_mutex_lock(&mlp_epmu);
            /* Members another thread's spin watches come back to be armed first: nothing
             * posts for them, and that spin may stop running (a handler on its thread). */
            if (e->watches)
                (void)mlp_ep_unwatch_others(e, NULL);
            bool changed = e->gen != gen;
            if (!changed) {
                e->sleepers++;
                u.sleeper = 2;
            }
            pthread_mutex_unlock(&mlp_epmu);
            if (changed)
                continue;
            slept = true;
            /* The doorbells this set sleeps with: its own queue's, and the process's while a
             * member may post there (a nested set sleeps with the process's, below). */
            bool pb = e->nested || e->k_pbell, sb = !e->nested && e->k_sbell && e->q;
            if (!e->in_kernel || (!pb && !sb) || (pb && !mlp_q) ||
                mlp_nopost_recent()) {
                undecided = true; /* no doorbell to wake us: nap and look again */
            } else if ((pb && memlan_evq_arm(mlp_q) == 1) | (sb && memlan_evq_arm(e->q) == 1)) {
                pthread_mutex_lock(&mlp_epmu); /* a post came in as we armed: collect it */
                u.sleeper = 0;
                e->sleepers--;
                pthread_mutex_unlock(&mlp_epmu);
                continue;
            }
        }
        int64_t left = mlp_left(deadline);
        if (timeout_ns < 0)
            left = -1;
        if (undecided && (left < 0 || left > 1000000))
            left = 1000000;
        if (slept && (left < 0 || left > live)) { /* the liveness bound, as in mlp_poll */
            left = live;
            live = live * 2 < (int64_t)ML_LIVENESS_MAX_NS ? live * 2 : (int64_t)ML_LIVENESS_MAX_NS;
        }
        int r = 0;
        bool bell = false;
        if (left != 0 && e->nested && mlp_q) {
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
        if (r >= 0) {
            /* The kernel set is asked for the whole wait, up to its return: that is when it was
             * last asked.  Stamped before the wait, a sleep longer than MLP_KPOLL_NS made the
             * next epoll_wait ask it again at once, for nothing (nfs-ganesha: the thread that
             * takes the loop over from the one this wait woke, once per request). */
            r = mlp_ep_kwait(epfd, out, max, left, mask);
            __atomic_store_n(&e->kpoll_ns, mlp_now_ns(), __ATOMIC_RELAXED);
        }
        mlp_kept_tick(); /* regions kept while their senders rest, when due (one load) */
        if (slept) {
            pthread_mutex_lock(&mlp_epmu);
            u.sleeper = 0;
            if (--e->sleepers == 0 && e->efd_rung && !e->nested) {
                uint64_t v;
                (void)__ml_sys_read(e->efd, &v, sizeof v);
                e->efd_rung = false;
            }
            pthread_mutex_unlock(&mlp_epmu);
        }
        if (r < 0) {
            ret = r;
            break;
        }
        bool again = bell;
        int w = mlp_ep_filter(out, r, &again);
        if (timeout_ns != 0 && __atomic_load_n(&e->n, __ATOMIC_RELAXED) &&
            mlp_ep_passed_look(e, !w && !again && r == 0 && slept && left != 0))
            again = true; /* peers whose end no FIN tells: their locks, at the liveness pace */
        if (again && w < max) {
            int c = mlp_ep_collect(epfd, e, out + w, max - w, &undecided, NULL, NULL, true);
            mine |= c > 0;
            w += c;
        }
        if (w || mlp_left(deadline) == 0) {
            ret = w;
            break;
        }
        if (undecided && r > 0 && again && timeout_ns != 0) {
            /* A nap whose kernel wait a doorbell ended, with nothing to collect: a post's byte
             * that no arm drained (only an arm drains it, and a nap does not arm) keeps the
             * doorbell readable, and every kernel wait returned at once: a peer's epoll_wait
             * took a whole core while a thread of ours toggled its euid (a review).  The nap
             * is slept out here, in the program's mask (a handler ends the call, as the
             * kernel's wait would). */
            int64_t nap = mlp_left(deadline);
            struct timespec ts = mlp_ts(nap < 0 || nap > 1000000 ? 1000000 : nap);
            if (mlp_real_ppoll(NULL, 0, &ts, mask) < 0 && errno == EINTR) {
                ret = -EINTR;
                break;
            }
        }
    }
    u.waiter = false;
    __atomic_sub_fetch(&e->waiters, 1, __ATOMIC_RELAXED);
    pthread_cleanup_pop(0);
    mlp_left_pop(&u.buf);
    if (e->nested)
        mlp_ep_nested_leave(e);
    mlp_live_end(live, mine ? 1 : 0); /* the program's own fds tell nothing of our peers */
    return ret;
}

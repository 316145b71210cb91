/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/*
 * readiness.h - what pqueue.c (the process's event queue, the per-thread wake-ups), poll.c
 * (one socket's readiness, poll, select, the long sleep) and epoll.c share.  Internal to the
 * preload; nothing here is exported from the library.
 */
#ifndef MLP_READINESS_H
#define MLP_READINESS_H

#include "preload.h"

#include <poll.h>
#include <time.h>

struct mlp_ep;
struct mlp_member;

/* The most threads with an eventfd of their own for a blocking call's long sleep (pqueue.c):
 * a sixteenth of the process's RLIMIT_NOFILE, between MLP_SLEEP_EFDS_MIN and _MAX. */
#define MLP_SLEEP_EFDS_MIN 64
#define MLP_SLEEP_EFDS_MAX 1024
int mlp_sleep_efds(void);

/* A thread's registration on one socket it waits for, and its waiter (pqueue.c). */
struct mlp_pwreg {
    struct mlp_pwait *w;
    unsigned gen;
    struct mlp_sock *s;      /* a reference, NULL once unregistered */
    struct mlp_pwreg *next;
};

/* A thread's waiter.  Its registrations live here, not on the poll call's stack: a thread
 * cancelled or longjmp'd out of its sleep (ppoll is a cancellation point) leaves them linked, and
 * they must stay valid until its next poll or its exit unlinks them. */
struct mlp_pwait {
    int efd;                 /* ours (a high number), EFD_NONBLOCK */
    unsigned gen;            /* the process it was made in (mlp_pw_gen) */
    _Atomic int rung;
    struct mlp_pwreg *regs;  /* nregs linked, of cap */
    int nregs, cap;
    int busy;                /* a poll, select or mlp_sock_sleep of the thread is using it: a
                              * handler's blocking call that interrupted it does not take it */
    uintptr_t busy_sp;       /* where that call took it (mlp_pw_take) */
    struct mlp_sock *held;   /* a reference lent by a poll asleep on one socket's futex (1a) */
    bool sleeper;            /* made by mlp_sock_sleep: counted in mlp_pw_sleepers */
    volatile bool left;      /* busy, but its call was left and its cleanup (mlp_pw_left) could
                              * not give back what it held: the next take gives it back */
};

extern pthread_mutex_t mlp_home_mu;
bool mlp_nopost_recent(void); /* poll.c: a peer of this process said ML_SOCK_NOPOST lately */
extern struct ml_spin mlp_poll_spin;
extern unsigned mlp_pw_gen;
extern __thread struct mlp_pwait *mlp_pw_self __attribute__((tls_model("initial-exec")));
extern _Atomic int mlp_pw_sleepers;
extern memlan_evq_t *mlp_q;
extern pthread_mutex_t mlp_q_mu;

/* The room that makes an accelerated socket writable to poll, select and epoll: as the kernel's
 * TCP (sk_stream_is_writeable: free space at least half of what is queued), a third of the ring.
 * One free byte made it writable, and a program that writes a piece with a blocking write after
 * POLLOUT (socat) then waited in that write for its peer, which waited in its own:
 * tests/preload/pollroom.c. */
static inline uint64_t mlp_tx_room(const struct memlan_channel *ch)
{
    return ch->tx.size / 3 ? ch->tx.size / 3 : 1;
}

/* Is there that room (or can we not tell: -1, go and look)?  Read-only. */
static inline bool mlp_tx_roomy_ro(const struct memlan_channel *ch)
{
    int64_t f = __ml_chan_tx_free_ro(ch);
    return f < 0 || (uint64_t)f >= mlp_tx_room(ch);
}

bool mlp_arm(struct mlp_sock *s, short events, bool under_epmu);
bool mlp_arm_et(struct mlp_member *m, uint32_t reported);
void mlp_ep_nested_leave(struct mlp_ep *e);
bool mlp_ep_poll_nest(int fd);
void mlp_ep_watch(int fd, struct mlp_ep *inner, int d);
void mlp_epoll_after_fork(void);
int64_t mlp_left(uint64_t deadline);
bool mlp_lock_left(pthread_mutex_t *m);
int mlp_ep_watch_mine(const struct mlp_sock *s); /* epoll.c: lent to this thread's spins */
void mlp_mark_sock(struct mlp_sock *s);
void mlp_mark_sock_posted(struct mlp_sock *s); /* the same, for a post of the peer's */
void mlp_nested_refresh(void);
bool mlp_peer_nopost(struct mlp_sock *s);
void mlp_pw_clear(struct mlp_pwait *w);
struct mlp_pwait *mlp_pw_get(void);
void mlp_pw_left(struct mlp_pwait *w);
bool mlp_pw_register_all(struct mlp_pwait *w, struct mlp_sock **socks, nfds_t n);
bool mlp_pw_take(struct mlp_pwait *w, uintptr_t sp, struct mlp_pwait *volatile *slot);
void mlp_pw_unregister(struct mlp_pwait *w, struct mlp_sock *s);
void mlp_pw_wake(struct mlp_sock *s);
void mlp_q_forget(memlan_evq_t *q);
memlan_evq_t *mlp_queue(void);
void mlp_queue_made(memlan_evq_t *q); /* a new queue: nameless at once if exit() began */
bool mlp_queue_add(struct mlp_sock *s, bool under_epmu);
void mlp_queue_drain(void);
void mlp_queue_drain_look(bool full);
int mlp_revents(struct mlp_sock *s, int fd);
int mlp_revents_want(struct mlp_sock *s, int fd, short want);
struct timespec mlp_ts(int64_t ns);
void mlp_unhome(struct mlp_sock *s);
bool mlp_vf(int *vf);
void mlp_pw_unregister_all(struct mlp_pwait *w);

#endif

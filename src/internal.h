/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/*
 * internal.h - private types and functions shared by the core's files.
 *
 * Names: the public API is memlan_*; internal non-static symbols are __ml_*; file-local helpers
 * are static ml_*.  Nothing here is exported from the shared library (see libmemlan.map).
 */
#ifndef MEMLAN_INTERNAL_H
#define MEMLAN_INTERNAL_H

#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "memlan.h"
#include "memlan/layout.h"
#include "atomics.h"

#define ML_PAGE 4096u
#define ML_MAX_SEG_SIZE (1ull << 40)
#define ML_MAX_GROW (64ull << 20) /* the largest region a stream ring grows into */

#define ml_likely(x)   __builtin_expect(!!(x), 1)
#define ml_unlikely(x) __builtin_expect(!!(x), 0)

/* heap.c: a signal handler of the host runs on this thread (counted by the preload's
 * trampoline; 0 in libmemlan); free() there only queues the block, which the next __ml_free
 * outside a handler frees (a handler may have interrupted malloc).  Every free of ours that a
 * socket call can reach goes through __ml_free. */
extern __thread unsigned __ml_sig_depth __attribute__((tls_model("initial-exec")));
void __ml_free(void *p);
void __ml_free_later_run(void);

/* Channel files a creator keeps after their connections closed, to reuse (channel.c). */
#define ML_POOL_MAX 8

struct memlan_fabric {
    int dirfd;
    bool shared;              /* the directory is open to group or others */
    _Atomic bool swept;       /* lazy reclaim done (the first time we create a file) */
    _Atomic bool sweep_asks;  /* the lazy reclaim may ask the kernel which sockets listen
                               * (sock_diag); the preload's: only outside a seccomp sandbox */
    uid_t uid;
    pthread_mutex_t pool_mu;
    int npool;                /* pool[0] is the oldest */
    struct memlan_segment *pool[ML_POOL_MAX];
    char path[PATH_MAX];
};

/* Who besides its creator may open a private channel's file in a shared fabric (acl.c): the
 * acceptor users, sorted, unique, without the creator's own uid.  A pooled file is reused only
 * for the same set (design.md, "Fabric"). */
#define ML_ACCESS_MAX 8
struct ml_access {
    uint32_t n;
    uint32_t uids[ML_ACCESS_MAX];
};

struct memlan_segment {
    memlan_fabric_t *fab;
    int fd;                   /* carries our liveness lock; -1 once dropped (see below) */
    uint64_t ino, dev;        /* the file's identity, for when fd is gone */
    uint8_t *base;
    size_t map_size;          /* private copy of the geometry, trusted */
    struct ml_seg_hdr *hdr;
    uint32_t kind;
    uint64_t body_off, body_size;
    uint64_t mirror;          /* a channel's ring size: each ring's data is mapped twice */
    uint64_t grow;            /* a channel's region size (0: none), mapped once each */
    bool owner;               /* we created it */
    int park_pid;             /* the process that parked it in its pool (channel.c) */
    int32_t pid;              /* the process that made this handle: a fork child's close of its
                               * inherited copy lets go of its copies only (memlan_segment_close,
                               * memlan_channel_close) */
    bool writable;
    bool cacheable;           /* an acceptor's channel mapping made without our lock: see
                               * segment.c's mapping cache; fd/hold carry the lock instead */
    void *hold;               /* one page of the locked open file: keeps it after fd is closed */
    int guard;                /* the mapping's registration in guard.c, or -1 */
    char token[MEMLAN_TOKEN_LEN + 1];
    struct ml_access access;  /* a private channel's acceptor users (see acl.c); n = 0: none */
};

/* Set by the socket layer (src/preload) so that the long-lived fds the core opens on its own
 * (imported event queues and their doorbells) are kept out of the host program's way: keep moves
 * *fdp to a private number, drop forgets it before it is closed.  NULL: plain fds. */
extern void (*__ml_fd_keep)(int *fdp);
extern void (*__ml_fd_drop)(int fd);
/* A limit the core met that the user should hear of (one line, no newline): said once per
 * process and topic (ML_NOTE_*).  The socket layer sets __ml_note to say it its own way (stderr
 * and its log); else libmemlan writes it on stderr unless MEMLAN_QUIET. */
enum { ML_NOTE_EVQ_PARTS = 1 };
extern void (*__ml_note)(unsigned topic, const char *msg);
void __ml_say_once(unsigned topic, const char *msg);

/* guard.c: a fabric file shrunk under a registered mapping is recovered, not a SIGBUS. */
int __ml_guard_add(void *base, size_t len);  /* the slot, or -1 (not guarded) */
void __ml_guard_del(int slot);               /* before the munmap; -1 is nothing */
void __ml_guard_del_at(const void *base);    /* the same, found by address (a scan: rare uses) */
bool __ml_guard_broken(int slot);            /* was the mapping replaced? */
/* A system call of ours on [p, p + n) in a registered mapping failed with EFAULT (a file shrunk
 * under it): recover the mapping as the handler would; true if it was ours (the caller then
 * ends the connection, never passes EFAULT on). */
bool __ml_guard_fault_in(const void *p, size_t n);
/* In a SIGBUS handler: was this fault in a registered mapping (now replaced)? */
bool __ml_guard_recover(const siginfo_t *si);
/* In a SIGBUS handler: the default action for sig, as the kernel would take it. */
void __ml_guard_default(int sig, siginfo_t *si);
/* In a SIGBUS handler: was it installed with SA_SIGINFO (is si real)?  query: sigaction. */
bool __ml_guard_has_siginfo(int sig,
                            int (*query)(int, const struct sigaction *, struct sigaction *));
/* The socket layer installs the handler its own way (arm: 0, -EAGAIN to retry, other -errno). */
void __ml_guard_set_arm(int (*arm)(void));
unsigned long __ml_guard_recoveries(void);

/* acl.c: POSIX access ACLs written as the kernel's xattr.  users: the named users of fd's ACL
 * (count, -E2BIG past max, -errno); add_user: grant uid read-write on fd (owner or CAP_FOWNER
 * only); private: make fd readable and writable by its owner and uids[0..n) only. */
int __ml_acl_users(int fd, uint32_t *uids, int max);
int __ml_acl_add_user(int fd, uint32_t uid);
int __ml_acl_bell(int fd, const uint32_t *uids, int n, bool wide); /* see evq.c */
int __ml_acl_private(int fd, const uint32_t *uids, int n);
/* acl.c: who may write fd's file besides root: 0 and *out (sorted), 1 for anyone of the group
 * or others (or too many to name), -errno (see evq.c's parts). */
int __ml_acl_writers(int fd, struct ml_access *out);

/* fabric.c */
int __ml_token_valid(const char *token);
int __ml_token_new(char out[MEMLAN_TOKEN_LEN + 1]);
void __ml_fabric_name(char *buf, size_t len, const char *prefix, const char *token);
int __ml_fabric_reclaim(memlan_fabric_t *fab);
int __ml_fabric_open_carried(const char *path, bool explicit_path, uid_t owner,
                             memlan_fabric_t **out); /* the preload's exec: see fabric.c */
/* memlan_fabric_clean with an account of what it left (memlan clean says it): files it may not
 * open and so could not judge, dead files it may not remove, and files too new to judge
 * without opening them; each with the first such name. */
struct ml_clean_report {
    int removed;
    int unopened, kept, young;
    char unopened_name[64], kept_name[64], young_name[64];
    uint32_t dir_uid; /* the fabric directory's owner */
};
int __ml_fabric_clean_report(memlan_fabric_t *fab, struct ml_clean_report *rep);
/* Why memlan_fabric_open(NULL) failed with err, in words (for logs): buf. */
const char *__ml_fabric_explain(int err, char *buf, size_t len);
/* The lazy sweep: once per handle, before the first file it creates (or when the caller says). */
void __ml_fabric_sweep_once(memlan_fabric_t *fab);
void __ml_fabric_sweep_once_ask(memlan_fabric_t *fab, bool ask); /* ask: sweep_asks */
int __ml_fabric_reclaim_name(memlan_fabric_t *fab, const char *name); /* 1 if removed */

/* segment.c: segments of any kind.  create() returns a zeroed, mapped, locked segment whose
 * header is complete but whose body the caller fills; import() validates the header first. */
int __ml_seg_create(memlan_fabric_t *fab, uint32_t kind, int mode, uint64_t body_off,
                    uint64_t body_size, uint64_t mirror, struct memlan_segment **out);
/* The same, for a file that stays mode 0600 even in a shared fabric (a private channel). */
int __ml_seg_create_private(memlan_fabric_t *fab, uint32_t kind, int mode, uint64_t body_off,
                            uint64_t body_size, uint64_t mirror, struct memlan_segment **out);
int __ml_seg_import(memlan_fabric_t *fab, const char *token, uint32_t kind, bool writable,
                    struct memlan_segment **out);
void __ml_seg_destroy(struct memlan_segment *seg);
/* Remove seg's name (if it is still seg's file and we own it) and nothing else: the mapping
 * and the descriptor stay, and a later destroy unlinks nothing.  For exit(): see sock.c. */
void __ml_seg_unname(struct memlan_segment *seg);
void __ml_seg_publish(struct memlan_segment *seg);
/* 1 when the byte's holder lives, 0 when dead, negative errno on error. */
struct stat;
int __ml_seg_import_fd(memlan_fabric_t *fab, const char *token, int fd, uint32_t kind,
                       bool writable, const struct stat *known, struct memlan_segment **out);
long __ml_seg_reopen(const struct memlan_segment *seg, int flags);
int __ml_seg_alive(const struct memlan_segment *seg, int lock_byte);
int __ml_seg_let_go_look(struct memlan_segment *seg); /* see segment.c */
int __ml_seg_id_look(memlan_fabric_t *fab, const char *token, uint64_t ino, uint64_t dev);
/* Close the segment's fd and keep only its mappings.  The liveness lock taken on the fd belongs
 * to the open file description, which every mapping references: it is held until the last
 * mapping of it goes (munmap, exit, or exec), in this process and any child that inherited the
 * mappings, exactly as long as the fd would have held it.  A connection then costs the host
 * program no file descriptor beyond its socket.  Liveness probes reopen the file by name. */
void __ml_seg_drop_fd(struct memlan_segment *seg);
/* The acceptor's mapping cache (segment.c): would a second open of the file st describes help
 * (not kept yet, and small enough to be kept)?  And the import that uses it: the channel file opened as fd (which will carry the lock; taken), mapped
 * from the cache or else from fdb (a second open of the same file, taken; -1 for none, then the
 * mapping is made from fd and is not cacheable). */
bool __ml_mapcache_wants_open(const struct stat *st);
void __ml_mapcache_expire(void); /* at every accept: idle mappings go */
int __ml_seg_import_cached(memlan_fabric_t *fab, int fd, int fdb, const struct stat *st,
                           struct memlan_segment **out);

/* channel.c: give back (unlink) the channel files the pool keeps; at exit, before exec, and when
 * the fabric closes. */
void __ml_chan_pool_drain(memlan_fabric_t *fab);

/* spin.c: the spin-then-sleep policy. */
struct ml_spin {
    uint32_t fails;           /* consecutive spins that ended in sleep */
};
uint64_t __ml_spin_budget_ns(struct ml_spin *sp, uint32_t peer_cpu);
/* Where the spin budget is 0 because the peer last waited on our cpu (or we have only one): how
 * long a channel's wait gives its cpu away with sched_yield before it sleeps, 0 for none (the
 * preload, MEMLAN_SPIN_US set): see "Spin budget" in docs/design.md. */
uint64_t __ml_yield_budget_ns(struct ml_spin *sp, uint32_t peer_cpu);
/* The preload's: never yield (a seccomp filter may kill for sched_yield: OpenSSH's does). */
void __ml_yield_off(void);
/* Round `round` of a wait for a lock or a count held for a few instructions or system calls:
 * pauses, then gives the cpu away (sched_yield; in the preload a short futex sleep). */
void __ml_brief_wait(unsigned round);
void __ml_spin_result(struct ml_spin *sp, bool success);
void __ml_spin_set_us(int us);
/* What the policy asks the system (cpus online, MEMLAN_SPIN_US), asked now: the preload calls it
 * at start-up, before the program can confine itself in a sandbox. */
void __ml_spin_init(void);
/* fabric.c: a bad setting the core reads (one ML_ENV_* bit), said once on stderr with the
 * default used, unless MEMLAN_QUIET or the preload library, which says the whole environment
 * itself, is loaded. */
enum { ML_ENV_SPIN_US = 1, ML_ENV_FABRIC_CREATE = 2, ML_ENV_FENCE = 4 };
void __ml_env_say_bad(unsigned which, const char *name, const char *value, const char *want,
                      const char *def);
/* The preload has checked the environment and said what was wrong: the core says nothing more. */
void __ml_env_reported(void);

/*
 * spin.c: the one spin loop that every waiter runs before it sleeps (the channel's blocking
 * calls, memlan_evq_wait, poll and select, epoll_wait, memlan_svc_run); each then sleeps its own
 * way.  Fill in sp, budget (__ml_spin_budget_ns's answer, or 0: no spin), every, look, tick and
 * arg, then call __ml_spin_run, which answers:
 *  - look's value, > 0: ready (told to sp as a spin that succeeded);
 *  - tick's value, < 0: the spin was stopped (a handler ran: the call ends), told to sp as nothing;
 *  - tick's value, > 0: the spin was stopped, told to sp as a success if a look found work;
 *  - 0: the budget ran out, told to sp as a success only if a look found work (ml_spin_found).
 */
struct ml_spinning {
    struct ml_spin *sp;       /* the policy's record of how spins end */
    uint64_t budget;          /* ns; a tick may change it (the budget counts from start) */
    unsigned every;           /* rounds between ticks and looks at the clock: a power of two */
    int (*look)(struct ml_spinning *s, void *arg);  /* every round: > 0 ready; 0 nothing yet */
    int (*tick)(struct ml_spinning *s, void *arg);  /* every `every` rounds (NULL: none) */
    void *arg;
    /* Kept by the loop, for look and tick to read (and ml_spin_found to change). */
    uint64_t start;           /* __ml_now_ns() when the budget started */
    unsigned round;           /* 1, 2, ... */
    bool found;
    /* Give the cpu away (sched_yield) at each round instead of pausing, with a tick and a look
     * at the clock every round: the budget is __ml_yield_budget_ns's. */
    bool yield;
};
__attribute__((visibility("default"))) int __ml_spin_run(struct ml_spinning *s);
/* A look found work and the spin goes on (memlan_svc_run serves calls while they keep coming):
 * a fresh budget from now (the caller's clock reading), and the spin counts as a success. */
static inline void ml_spin_found(struct ml_spinning *s, uint64_t now)
{
    s->found = true;
    s->start = now;
}

/* evq.c: post endpoint `index` of the queue named by ref (a sender's wake-up path). */
int __ml_evq_post_ref(memlan_fabric_t *fab, const struct ml_evq_ref *ref, uint32_t *hint);
/* evq.c: the same, returning the reached queue's tag (struct ml_sock_side, reach); and the tag
 * of a registration (a private copy). */
int __ml_evq_prime_ref(memlan_fabric_t *fab, const struct ml_evq_ref *ref, uint32_t *hint);
uint32_t __ml_evq_ref_tag(const struct ml_evq_ref *copy);
/* evq.c: the spin policy of memlan_evq_wait for a caller that spins over a queue itself
 * (memlan_svc_run in libmemlan-rpc, hence exported in the MEMLAN_PRIVATE version node). */
struct memlan_evq;
__attribute__((visibility("default"))) uint64_t __ml_evq_spin_budget(struct memlan_evq *q);
__attribute__((visibility("default"))) struct ml_spin *__ml_evq_spin(struct memlan_evq *q);
/* evq.c: nothing posted to the queue, certainly (false: cannot tell, go and collect).  Without
 * the lock that collecting takes: the socket layer's epoll spin looks here first. */
bool __ml_evq_quiet(struct memlan_evq *q);
/* The same, looking only at the words over slots ever handed out (a spin's look). */
bool __ml_evq_quiet_hint(struct memlan_evq *q);

/* How often a side blocked on a channel checks that its peer still lives. */
#define ML_LIVENESS_NS (100u * 1000000u)
/* A wait that stays idle looks less often: the interval doubles up to this, so an idle process
 * wakes once a second, not ten times (a peer killed with SIGKILL is noticed within it). */
#define ML_LIVENESS_MAX_NS (1000u * 1000000u)
/* How long a native creator's blocking send/recv waits for a peer that never attaches
 * (include/memlan.h, memlan_channel_create). */
#define ML_ATTACH_WAIT_NS (10000ull * 1000000u)

#endif

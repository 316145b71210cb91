/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/*
 * segment.c - shared memory exported with a token and imported with it (SHRIMP's VMMC
 * import/export mappings on a fabric directory).
 *
 * The token is 128 random bits and names the file, so importing needs the token: a fabric
 * directory shared between users is made searchable but not readable (mode 0733 or 1733), and
 * then nobody can list it to learn the names.  An export's mode is enforced twice: the header says
 * whether importers may write, and a read-only import maps the file without PROT_WRITE.
 * Revocation marks the header and removes the name: no new imports, and every importer's next
 * check or channel operation sees the segment closed.  Mappings are never pulled from under an
 * importer, so revocation can never make it fault.
 */
#include "internal.h"
#include "sys/sys.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

static uint64_t ml_round_up(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

/* A channel's region size from its file's size and ring size (docs/design.md, "Rings grow"):
 * 0 for a file of [page][ring 0][ring 1]; for [page][ring 0][ring 1][region 0][region 1], the
 * region's size, a power of two above the ring's and at most ML_MAX_GROW; UINT64_MAX for any
 * other size. */
static uint64_t ml_seg_grow_of(uint64_t total, uint64_t mirror)
{
    if (total == ML_PAGE + 2 * mirror)
        return 0;
    if (total <= ML_PAGE + 2 * mirror || ((total - ML_PAGE - 2 * mirror) & 1))
        return UINT64_MAX;
    uint64_t g = (total - ML_PAGE - 2 * mirror) / 2;
    if (g <= mirror || (g & (g - 1)) || g > ML_MAX_GROW)
        return UINT64_MAX;
    return g;
}

/*
 * Map a segment.  With mirror == 0 the file is mapped once.  A channel (mirror == R, the ring
 * size) has the file layout [header page][ring 0 data][ring 1 data], and is mapped as
 * [header page][ring 0][ring 0 again][ring 1][ring 1 again] so that each ring's data is followed
 * by a second view of itself: see ring.h.  Three mmap calls do it (connection set-up pays for each
 * one): the whole file, with the rest of the span mapped past its end so that the span is ours;
 * then file [ring 0][ring 1] over the span from the first ring's end, and file [ring 1] over its
 * last quarter.  Nothing past the end of the file stays mapped.  A channel whose rings grow has
 * its two regions after the rings in the file, mapped once each (not mirrored: a copy that wraps
 * is two) by the third call, which maps [ring 1][region 0][region 1] from the span's last
 * ring on: still three mappings a channel (a process's mapping count is bounded, 65530 by
 * default: a second view of each region made six, and 10,000 connections could not map).
 */
static int ml_seg_map(int fd, uint64_t total, int prot, uint64_t mirror, uint8_t **base,
                      size_t *vsize)
{
    void *p;
    int r;
    if (!mirror) {
        if ((r = __ml_sys_mmap(&p, NULL, total, prot, MAP_SHARED, fd, 0)) < 0)
            return r;
        *base = p;
        *vsize = total;
        return 0;
    }
    uint64_t grow = ml_seg_grow_of(total, mirror);
    if (grow == UINT64_MAX)
        return -EPROTO;
    size_t vs = ML_PAGE + 4 * mirror + 2 * grow;
    if ((r = __ml_sys_mmap(&p, NULL, vs, prot, MAP_SHARED, fd, 0)) < 0)
        return r;
    uint8_t *b = p;
    struct { uint64_t va, off, len; } part[2] = {
        {ML_PAGE + mirror, ML_PAGE, 2 * mirror},
        {ML_PAGE + 3 * mirror, ML_PAGE + mirror, mirror + 2 * grow},
    };
    for (int i = 0; i < 2; i++) {
        void *q;
        r = __ml_sys_mmap(&q, b + part[i].va, part[i].len, prot, MAP_SHARED | MAP_FIXED, fd,
                          (off_t)part[i].off);
        /* MAP_FIXED over our own mapping cannot move; check anyway. */
        if (r < 0 || q != b + part[i].va) {
            __ml_sys_munmap(b, vs);
            return r < 0 ? r : -ENOMEM;
        }
    }
    *base = b;
    *vsize = vs;
    return 0;
}

static int ml_seg_create(memlan_fabric_t *fab, uint32_t kind, int mode, uint64_t body_off,
                         uint64_t body_size, uint64_t mirror, bool priv,
                         struct memlan_segment **out)
{
    if (!fab || !out || (mode != MEMLAN_MODE_RO && mode != MEMLAN_MODE_RW))
        return -EINVAL;
    if (body_off < sizeof(struct ml_seg_hdr) || body_size > ML_MAX_SEG_SIZE)
        return -EINVAL;
    uint64_t total = ml_round_up(body_off + body_size, ML_PAGE);
    /* Lazy reclaim: the first file a handle creates first sweeps the orphans of the dead. */
    __ml_fabric_sweep_once(fab);
    struct memlan_segment *seg = calloc(1, sizeof *seg);
    if (!seg)
        return -ENOMEM;
    seg->pid = (int32_t)__ml_pid();
    char name[80];
    long fd;
    int r;
    struct stat st;
    for (int attempt = 0;; attempt++) {
        if (attempt == 8) {
            r = -EAGAIN;
            goto fail_free;
        }
        if ((r = __ml_token_new(seg->token)) < 0)
            goto fail_free;
        __ml_fabric_name(name, sizeof name, "seg", seg->token);
        fd = __ml_sys_open(fab->dirfd, name, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW, 0600);
        if (fd == -EEXIST)
            continue;
        if (fd < 0) {
            r = (int)fd;
            goto fail_free;
        }
        /* Take the owner's liveness byte.  A reclaimer may have locked the empty file first and
         * removed it; then nlink is 0 and we start again with a new token. */
        if ((r = __ml_sys_lock_byte((int)fd, ML_LOCK_OWNER, 1)) < 0 ||
            (r = __ml_sys_fstat((int)fd, &st)) < 0) {
            __ml_sys_unlinkat(fab->dirfd, name, 0);
            __ml_sys_close((int)fd);
            goto fail_free;
        }
        if (st.st_nlink > 0)
            break;
        __ml_sys_close((int)fd);
    }
    if (fab->shared && !priv)
        (void)__ml_sys_fchmod((int)fd, mode == MEMLAN_MODE_RW ? 0666 : 0644);
    /* Reserve the file's blocks before mapping it: a sparse file (ftruncate) on a tmpfs that
     * fills up would make the first store to a page fault with SIGBUS, in whatever process
     * touched it (a memcpy in memlan_send, say).  A full fabric is an error here instead: the
     * file goes and the caller sees -ENOSPC (the socket layer falls back to TCP, "fabric full").
     * Only a file system without fallocate gets the sparse file, as before.  A stat record
     * (ML_KIND_PROC, 4096 slots, most never used) reserves its first page here and the rest as
     * its owner claims slots (mlp_proc_slot() in src/preload/negotiate.c). */
    uint64_t reserve = kind == ML_KIND_PROC ? ML_PAGE : total;
    /* A channel's regions (the rings' growth) are reserved when a ring grows into one
     * (channel.c, ml_grow), never before: most connections never fill a ring. */
    if (kind == ML_KIND_CHANNEL && mirror && total > ML_PAGE + 2 * mirror)
        reserve = ML_PAGE + 2 * mirror;
    r = __ml_sys_fallocate((int)fd, 0, (off_t)reserve);
    if (r == -EOPNOTSUPP || (r == 0 && reserve < total))
        r = __ml_sys_ftruncate((int)fd, (off_t)total);
    if (r < 0)
        goto fail_unlink;
    uint8_t *p;
    size_t vsize;
    if ((r = ml_seg_map((int)fd, total, PROT_READ | PROT_WRITE, mirror, &p, &vsize)) < 0)
        goto fail_unlink;
    seg->fab = fab;
    seg->fd = (int)fd;
    seg->ino = (uint64_t)st.st_ino;
    seg->dev = (uint64_t)st.st_dev;
    seg->base = p;
    seg->map_size = vsize;
    seg->guard = __ml_guard_add(p, vsize);
    seg->mirror = mirror;
    seg->grow = mirror ? ml_seg_grow_of(total, mirror) : 0; /* ml_seg_map checked it */
    seg->hdr = (struct ml_seg_hdr *)p;
    seg->kind = kind;
    seg->body_off = body_off;
    seg->body_size = body_size;
    seg->owner = true;
    seg->writable = true;

    struct ml_seg_hdr *h = seg->hdr;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    h->magic = ML_SEG_MAGIC;
    h->version = ML_LAYOUT_VERSION;
    h->hdr_size = sizeof *h;
    h->total_size = total;
    h->kind = kind;
    h->mode = (uint32_t)mode;
    h->body_off = body_off;
    h->body_size = body_size;
    h->owner_pid = (int32_t)__ml_sys_getpid();
    h->owner_uid = (uint32_t)fab->uid;
    h->created_ns = (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
    ml_store_relaxed(&h->state, ML_SEG_LIVE);
    /* ready is stored by __ml_seg_publish() once the body is initialised too. */
    *out = seg;
    return 0;

fail_unlink:
    __ml_sys_unlinkat(fab->dirfd, name, 0);
    __ml_sys_close((int)fd);
fail_free:
    __ml_free(seg);
    return r;
}

int __ml_seg_create(memlan_fabric_t *fab, uint32_t kind, int mode, uint64_t body_off,
                    uint64_t body_size, uint64_t mirror, struct memlan_segment **out)
{
    return ml_seg_create(fab, kind, mode, body_off, body_size, mirror, false, out);
}

int __ml_seg_create_private(memlan_fabric_t *fab, uint32_t kind, int mode, uint64_t body_off,
                            uint64_t body_size, uint64_t mirror, struct memlan_segment **out)
{
    return ml_seg_create(fab, kind, mode, body_off, body_size, mirror, true, out);
}

void __ml_seg_publish(struct memlan_segment *seg)
{
    /* SYNC: pairs with the acquire load of ready in __ml_seg_import(); everything the creator
     * wrote to the header and body before this is visible to an importer that sees ready. */
    ml_store_release(&seg->hdr->ready, 1u);
}

int __ml_seg_import(memlan_fabric_t *fab, const char *token, uint32_t kind, bool writable,
                    struct memlan_segment **out)
{
    if (!fab || !out)
        return -EINVAL;
    *out = NULL;
    if (!__ml_token_valid(token))
        return -EINVAL;
    char name[80];
    __ml_fabric_name(name, sizeof name, "seg", token);
    /* A channel's attacher needs write access for its lock byte even on its own segment. */
    long fd = __ml_sys_open(fab->dirfd, name, (writable ? O_RDWR : O_RDONLY) | O_NOFOLLOW, 0);
    if (fd < 0)
        return fd == -ELOOP ? -EPROTO : (int)fd;
    return __ml_seg_import_fd(fab, token, (int)fd, kind, writable, NULL, out);
}

/* The import from an open file (which it takes: closed on failure, seg->fd on success). */
int __ml_seg_import_fd(memlan_fabric_t *fab, const char *token, int fd, uint32_t kind,
                       bool writable, const struct stat *known, struct memlan_segment **out)
{
    *out = NULL;
    struct stat st;
    struct ml_seg_hdr h;
    int r = 0;
    if (known) /* the caller's fstat of this fd */
        st = *known;
    else if ((r = __ml_sys_fstat((int)fd, &st)) < 0)
        goto fail;
    r = -EPROTO;
    if (!S_ISREG(st.st_mode) || (uint64_t)st.st_size < sizeof h ||
        (uint64_t)st.st_size > ML_MAX_SEG_SIZE + ML_PAGE)
        goto fail;
    /* The header and, for a channel, its geometry just after it: one read. */
    struct {
        struct ml_seg_hdr h;
        struct ml_chan_hdr c;
    } both;
    size_t want = kind == ML_KIND_CHANNEL ? sizeof both : sizeof h;
    if ((uint64_t)st.st_size < want || __ml_sys_pread((int)fd, &both, want, 0) != (ssize_t)want)
        goto fail;
    h = both.h;
    if (h.magic != ML_SEG_MAGIC)
        goto fail;
    if (h.version != ML_LAYOUT_VERSION) {
        r = -EPROTONOSUPPORT;
        goto fail;
    }
    if (h.hdr_size != sizeof h || h.total_size != (uint64_t)st.st_size ||
        h.total_size % ML_PAGE || h.body_off < sizeof h || h.body_off > h.total_size ||
        h.body_off % ML_CACHELINE /* a body's structures are laid out from an aligned start */ ||
        h.body_size > h.total_size - h.body_off || h.kind != kind ||
        (h.mode != MEMLAN_MODE_RO && h.mode != MEMLAN_MODE_RW))
        goto fail;
    if (h.state != ML_SEG_LIVE || h.ready != 1) {
        r = h.state == ML_SEG_REVOKED ? -ENOENT : -EPROTO;
        goto fail;
    }
    if (writable && h.mode != MEMLAN_MODE_RW) {
        r = -EACCES;
        goto fail;
    }
    /* A channel's geometry decides how it is mapped: read it (once, privately) first. */
    uint64_t mirror = 0;
    if (kind == ML_KIND_CHANNEL) {
        if (h.body_off != sizeof h || h.body_size < sizeof both.c)
            goto fail;
        mirror = both.c.ring_size;
        if (mirror < ML_PAGE || (mirror & (mirror - 1)) ||
            ml_seg_grow_of(h.total_size, mirror) != both.c.grow_size)
            goto fail;
    }
    uint8_t *p;
    size_t vsize;
    int prot = PROT_READ | (writable ? PROT_WRITE : 0);
    if ((r = ml_seg_map((int)fd, h.total_size, prot, mirror, &p, &vsize)) < 0)
        goto fail;
    struct memlan_segment *seg = calloc(1, sizeof *seg);
    if (!seg) {
        __ml_sys_munmap(p, vsize);
        r = -ENOMEM;
        goto fail;
    }
    seg->pid = (int32_t)__ml_pid();
    seg->fab = fab;
    seg->fd = (int)fd;
    seg->ino = (uint64_t)st.st_ino;
    seg->dev = (uint64_t)st.st_dev;
    seg->base = p;
    seg->map_size = vsize;
    seg->guard = __ml_guard_add(p, vsize);
    seg->mirror = mirror;
    seg->grow = mirror ? both.c.grow_size : 0;
    seg->hdr = (struct ml_seg_hdr *)p;
    seg->kind = kind;
    seg->body_off = h.body_off;
    seg->body_size = h.body_size;
    seg->owner = false;
    seg->writable = writable;
    if (token)
        memcpy(seg->token, token, MEMLAN_TOKEN_LEN + 1);
    /* SYNC: pairs with the release store of ready in __ml_seg_publish(). */
    if (ml_load_acquire(&seg->hdr->ready) != 1) {
        __ml_seg_destroy(seg);
        return -EPROTO;
    }
    *out = seg;
    return 0;
fail:
    __ml_sys_close((int)fd);
    return r;
}

/*
 * ---- the acceptor's mapping cache ----
 *
 * A server maps each client's channel file when it accepts, and a client's pool hands it the same
 * few files again and again.  Mapping one costs three mmap calls, an munmap at close and the page
 * faults of touching its rings again: a third of an accepting server's time per short connection.
 * So a channel attached by offer keeps its mapping here when it closes, and the next offer of the
 * same file takes it.  (dev, ino) names the file: our mapping pins the inode, so the pair cannot
 * name another file meanwhile; the size must match too.  A cached mapping must carry no lock
 * (the pool reuses a file once the old peer's lock is gone), so it is made from an open of its
 * own, and each connection's attacher lock lives on the offer's open, kept after its fd is closed
 * by a one-page mapping (seg->hold) that goes at close.  Bounded: 8 mappings of files up to
 * 12 MiB + a page (the socket layer's 256 KiB rings with their 4 MiB regions make 8.5 MiB, whose
 * region pages exist only where a ring grew), none idle for more than 5 s once the process
 * accepts or closes again.
 */
#define ML_MAPC_N 8
#define ML_MAPC_MAX_FILE ((12u << 20) + ML_PAGE)
#define ML_MAPC_IDLE_NS (5ull * 1000000000u)

struct ml_mapc {
    uint64_t dev, ino, total, mirror, grow, body_off, body_size;
    uint8_t *base;
    size_t vsize;
    int guard;
    uint64_t parked_ns;
};
static struct ml_mapc ml_mapc[ML_MAPC_N];
static int ml_nmapc;
static pthread_mutex_t ml_mapc_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t ml_mapc_once = PTHREAD_ONCE_INIT;

static void ml_mapc_prepare(void) { pthread_mutex_lock(&ml_mapc_mu); }
static void ml_mapc_parent(void) { pthread_mutex_unlock(&ml_mapc_mu); }
static void ml_mapc_child(void) { pthread_mutex_init(&ml_mapc_mu, NULL); }
static void ml_mapc_init(void) { pthread_atfork(ml_mapc_prepare, ml_mapc_parent, ml_mapc_child); }

/* Drop entries idle too long (with the lock held); returns how many are left. */
static int ml_mapc_expire(uint64_t now)
{
    for (int i = 0; i < ml_nmapc;) {
        if (now - ml_mapc[i].parked_ns > ML_MAPC_IDLE_NS) {
            __ml_guard_del(ml_mapc[i].guard);
            __ml_sys_munmap(ml_mapc[i].base, ml_mapc[i].vsize);
            ml_mapc[i] = ml_mapc[--ml_nmapc];
        } else {
            i++;
        }
    }
    return ml_nmapc;
}

static int ml_mapc_find(const struct stat *st)
{
    for (int i = 0; i < ml_nmapc; i++)
        if (ml_mapc[i].dev == (uint64_t)st->st_dev && ml_mapc[i].ino == (uint64_t)st->st_ino &&
            ml_mapc[i].total == (uint64_t)st->st_size)
            return i;
    return -1;
}

bool __ml_mapcache_wants_open(const struct stat *st)
{
    if ((uint64_t)st->st_size > ML_MAPC_MAX_FILE)
        return false; /* never cached: the second open would be wasted */
    pthread_once(&ml_mapc_once, ml_mapc_init);
    pthread_mutex_lock(&ml_mapc_mu);
    bool has = ml_mapc_find(st) >= 0;
    pthread_mutex_unlock(&ml_mapc_mu);
    return !has;
}

/* Any accept, accelerated or not: let go of mappings idle too long.  Accelerated accepts and
 * closes did it alone, so a server whose later connections all went over TCP (a member had
 * truncated its port's record, say) kept its last 8 clients' channel mappings for good. */
void __ml_mapcache_expire(void)
{
    if (__atomic_load_n(&ml_nmapc, __ATOMIC_RELAXED) == 0)
        return;
    pthread_once(&ml_mapc_once, ml_mapc_init);
    pthread_mutex_lock(&ml_mapc_mu);
    ml_mapc_expire(__ml_now_ns());
    pthread_mutex_unlock(&ml_mapc_mu);
}

/* A closing cacheable segment's mapping: into the cache (or unmapped). */
static void ml_mapc_park(struct memlan_segment *seg)
{
    pthread_once(&ml_mapc_once, ml_mapc_init);
    uint64_t now = __ml_now_ns();
    uint8_t *evict = NULL;
    size_t evict_size = 0;
    int evict_guard = -1;
    if (__ml_guard_broken(seg->guard)) { /* shrunk under us (guard.c): never reused */
        __ml_guard_del(seg->guard);
        __ml_sys_munmap(seg->base, seg->map_size);
        return;
    }
    /* A close in a signal handler (async-signal-safe) on top of a thread inside the cache (every
     * accept expires it): the lock only if free at once, else the mapping just goes. */
    if (__ml_sig_depth ? pthread_mutex_trylock(&ml_mapc_mu) != 0
                       : pthread_mutex_lock(&ml_mapc_mu) != 0) {
        __ml_guard_del(seg->guard);
        __ml_sys_munmap(seg->base, seg->map_size);
        return;
    }
    if (ml_mapc_expire(now) == ML_MAPC_N) { /* full: the oldest goes */
        int old = 0;
        for (int i = 1; i < ML_MAPC_N; i++)
            if (ml_mapc[i].parked_ns < ml_mapc[old].parked_ns)
                old = i;
        evict = ml_mapc[old].base;
        evict_size = ml_mapc[old].vsize;
        evict_guard = ml_mapc[old].guard;
        ml_mapc[old] = ml_mapc[--ml_nmapc];
    }
    /* total: the file's size, which a channel's geometry fixes */
    uint64_t total = ML_PAGE + 2 * seg->mirror + 2 * seg->grow;
    struct ml_mapc e = {.dev = seg->dev, .ino = seg->ino, .total = total,
                        .mirror = seg->mirror, .grow = seg->grow, .body_off = seg->body_off,
                        .body_size = seg->body_size, .base = seg->base, .vsize = seg->map_size,
                        .guard = seg->guard, .parked_ns = now};
    ml_mapc[ml_nmapc++] = e;
    pthread_mutex_unlock(&ml_mapc_mu);
    if (evict) {
        __ml_guard_del(evict_guard);
        __ml_sys_munmap(evict, evict_size);
    }
}

int __ml_seg_import_cached(memlan_fabric_t *fab, int fd, int fdb, const struct stat *st,
                           struct memlan_segment **out)
{
    *out = NULL;
    pthread_once(&ml_mapc_once, ml_mapc_init);
    struct ml_mapc e = {0};
    pthread_mutex_lock(&ml_mapc_mu);
    ml_mapc_expire(__ml_now_ns());
    int i = ml_mapc_find(st);
    if (i >= 0) {
        e = ml_mapc[i];
        ml_mapc[i] = ml_mapc[--ml_nmapc];
    }
    pthread_mutex_unlock(&ml_mapc_mu);
    if (i < 0) {
        /* Not cached: map from the second open (no lock on it), so that the mapping can be
         * cached later; without one, the old way (the mapping carries the lock). */
        struct stat stb;
        if (fdb < 0 || (uint64_t)st->st_size > ML_MAPC_MAX_FILE ||
            __ml_sys_fstat(fdb, &stb) < 0 || stb.st_dev != st->st_dev ||
            stb.st_ino != st->st_ino) {
            if (fdb >= 0)
                __ml_sys_close(fdb);
            return __ml_seg_import_fd(fab, NULL, fd, ML_KIND_CHANNEL, true, st, out);
        }
        int r = __ml_seg_import_fd(fab, NULL, fdb, ML_KIND_CHANNEL, true, st, out);
        if (r < 0) {
            __ml_sys_close(fd);
            return r;
        }
        __ml_sys_close((*out)->fd); /* the mapping keeps its own open: no lock on it */
        (*out)->fd = fd;
        (*out)->cacheable = true;
        return 0;
    }
    if (fdb >= 0)
        __ml_sys_close(fdb);
    struct memlan_segment *seg = calloc(1, sizeof *seg);
    if (seg)
        seg->pid = (int32_t)__ml_pid();
    if (!seg) {
        __ml_guard_del(e.guard);
        __ml_sys_munmap(e.base, e.vsize);
        __ml_sys_close(fd);
        return -ENOMEM;
    }
    seg->fab = fab;
    seg->fd = fd;
    seg->ino = e.ino;
    seg->dev = e.dev;
    seg->base = e.base;
    seg->map_size = e.vsize;
    seg->guard = e.guard;
    seg->mirror = e.mirror;
    seg->grow = e.grow;
    seg->hdr = (struct ml_seg_hdr *)e.base;
    seg->kind = ML_KIND_CHANNEL;
    seg->body_off = e.body_off;
    seg->body_size = e.body_size;
    seg->writable = true;
    seg->cacheable = true;
    /* The file may have been reused, never replaced: it must still be a live channel. */
    if (ml_load_relaxed(&seg->hdr->state) != ML_SEG_LIVE ||
        ml_load_acquire(&seg->hdr->ready) != 1) {
        seg->cacheable = false; /* not again */
        __ml_seg_destroy(seg);
        return -EPROTO;
    }
    *out = seg;
    return 0;
}

/* Close the fd; the mappings keep the file and our lock on it.  The file's identity was taken when
 * it was opened (create and import fstat it), so a probe by name can tell it from another. */
void __ml_seg_drop_fd(struct memlan_segment *seg)
{
    if (seg->fd < 0 || !seg->ino)
        return; /* keep the fd: without the file's identity we could not probe by name */
    if (seg->cacheable) {
        /* the lock is on fd's open, not the (cacheable) mapping's: one page of it keeps it */
        void *p;
        if (__ml_sys_mmap(&p, NULL, ML_PAGE, PROT_READ, MAP_SHARED, seg->fd, 0) < 0)
            return; /* keep the fd instead */
        seg->hold = p;
    }
    __ml_sys_close(seg->fd);
    seg->fd = -1;
}

/* Is lock_byte (or, for a channel side, its bridge byte) held in the file? */
static int ml_seg_held(int fd, int lock_byte)
{
    int r = __ml_sys_byte_held(fd, lock_byte);
    if (r == 0 && (lock_byte == ML_LOCK_OWNER || lock_byte == ML_LOCK_ATTACHER))
        r = __ml_sys_byte_held(fd, ML_LOCK_BRIDGE(lock_byte));
    return r;
}

/* Open seg's file again by its name: the fd, -ENOENT when the name is gone, -ESTALE when it
 * names another file now, or another -errno. */
long __ml_seg_reopen(const struct memlan_segment *seg, int flags)
{
    char name[80];
    __ml_fabric_name(name, sizeof name, "seg", seg->token);
    long fd = __ml_sys_open(seg->fab->dirfd, name, flags | O_NOFOLLOW, 0);
    if (fd < 0)
        return fd;
    struct stat st, mine;
    int r = __ml_sys_fstat((int)fd, &st);
    if (r == 0 && seg->fd >= 0 && (r = __ml_sys_fstat(seg->fd, &mine)) == 0) {
        if (st.st_ino != mine.st_ino || st.st_dev != mine.st_dev)
            r = -ESTALE;
    } else if (r == 0 && ((uint64_t)st.st_ino != seg->ino || (uint64_t)st.st_dev != seg->dev)) {
        r = -ESTALE;
    }
    if (r < 0) {
        __ml_sys_close((int)fd);
        return r;
    }
    return fd;
}

int __ml_seg_alive(const struct memlan_segment *seg, int lock_byte)
{
    /* A mapping replaced after its file was shrunk (guard.c) is a dead connection: the peer's
     * memory and ours are no longer the same. */
    if (__ml_guard_broken(seg->guard))
        return 0;
    if (seg->fd >= 0)
        return ml_seg_held(seg->fd, lock_byte);
    /* Slow path: reopen by name.  A name that is gone, or names another file, means the owner
     * closed it or a reclaimer found it dead: nobody holds this file's locks any more that we
     * could ask about, and callers read the peer's closing state before they conclude. */
    long fd = __ml_seg_reopen(seg, O_RDONLY | O_NONBLOCK);
    if (fd < 0)
        return fd == -ENOENT || fd == -ESTALE ? 0 : (int)fd;
    int r = ml_seg_held((int)fd, lock_byte);
    __ml_sys_close((int)fd);
    return r;
}

static void ml_seg_unlink(struct memlan_segment *seg)
{
    char name[80];
    __ml_fabric_name(name, sizeof name, "seg", seg->token);
    struct stat a, b;
    bool mine;
    if (seg->fd >= 0)
        mine = __ml_sys_fstat(seg->fd, &a) == 0 && a.st_nlink > 0 &&
               __ml_sys_fstatat(seg->fab->dirfd, name, &b, AT_SYMLINK_NOFOLLOW) == 0 &&
               a.st_ino == b.st_ino && a.st_dev == b.st_dev;
    else
        mine = __ml_sys_fstatat(seg->fab->dirfd, name, &b, AT_SYMLINK_NOFOLLOW) == 0 &&
               (uint64_t)b.st_ino == seg->ino && (uint64_t)b.st_dev == seg->dev;
    /* Remove the name only if it is still our file. */
    if (mine)
        __ml_sys_unlinkat(seg->fab->dirfd, name, 0);
}

void __ml_seg_unname(struct memlan_segment *seg)
{
    if (!seg || !seg->owner)
        return;
    ml_seg_unlink(seg);
    seg->owner = false;
}

void __ml_seg_destroy(struct memlan_segment *seg)
{
    if (!seg)
        return;
    if (seg->owner)
        ml_seg_unlink(seg);
    if (seg->hold)
        __ml_sys_munmap(seg->hold, ML_PAGE); /* our attacher lock goes with it */
    if (seg->fd >= 0)
        __ml_sys_close(seg->fd);
    if (seg->cacheable) {
        ml_mapc_park(seg);
    } else {
        __ml_guard_del(seg->guard);
        __ml_sys_munmap(seg->base, seg->map_size);
    }
    __ml_free(seg);
}

/*
 * A channel's holder that is not its side's last (the socket layer: fork children were counted
 * as holders too) lets go of seg: its mapping goes, and the name stays for the others.  But
 * where the others ended without a close of ours (a fork child's _exit: multiprocessing's
 * workers end so) and the peer has let go as well, nobody would ever remove the name: the file
 * stayed in the fabric while the process lived (an explorer: 172 channel files, 88 MB, in 12 s of
 * a threaded client forking a pool).  So once ours is gone, a look by name (__ml_seg_id_look).
 * 1: the name is gone; 0: it stays (a side still held, or a look that could not tell: the
 * caller may look again later).
 */
int __ml_seg_let_go_look(struct memlan_segment *seg)
{
    memlan_fabric_t *fab = seg->fab;
    uint64_t ino = seg->ino, dev = seg->dev;
    char token[MEMLAN_TOKEN_LEN + 1];
    memcpy(token, seg->token, sizeof token);
    seg->owner = false;
    __ml_seg_destroy(seg);
    return __ml_seg_id_look(fab, token, ino, dev);
}

/* The channel file named token (ino, dev): the sweep's test for that one name (the owner's byte
 * taken, then neither bridge nor the attacher's byte held: a creator reusing the file from its
 * pool holds the owner's byte, so no new side can come meanwhile), and its name goes.  1 when
 * the name is gone (or names another file now), else 0. */
int __ml_seg_id_look(memlan_fabric_t *fab, const char *token, uint64_t ino, uint64_t dev)
{
    char name[80];
    __ml_fabric_name(name, sizeof name, "seg", token);
    if (__ml_fabric_reclaim_name(fab, name) > 0)
        return 1;
    struct stat b;
    return __ml_sys_fstatat(fab->dirfd, name, &b, AT_SYMLINK_NOFOLLOW) < 0 ||
           (uint64_t)b.st_ino != ino || (uint64_t)b.st_dev != dev;
}

/* ---- the public raw-segment API ---------------------------------------------------------- */

int memlan_segment_export(memlan_fabric_t *fab, size_t size, int mode, memlan_segment_t **out)
{
    if (!fab || !out || size == 0 || size > ML_MAX_SEG_SIZE)
        return -EINVAL;
    *out = NULL;
    struct memlan_segment *seg;
    /* The user's region starts on its own page. */
    int r = __ml_seg_create(fab, ML_KIND_RAW, mode, ML_PAGE, size, 0, &seg);
    if (r < 0)
        return r;
    __ml_seg_publish(seg);
    *out = seg;
    return 0;
}

int memlan_segment_import(memlan_fabric_t *fab, const char *token, int mode,
                          memlan_segment_t **out)
{
    if (!out || (mode != MEMLAN_MODE_RO && mode != MEMLAN_MODE_RW))
        return -EINVAL;
    return __ml_seg_import(fab, token, ML_KIND_RAW, mode == MEMLAN_MODE_RW, out);
}

const char *memlan_segment_token(const memlan_segment_t *seg) { return seg ? seg->token : NULL; }

void *memlan_segment_ptr(const memlan_segment_t *seg)
{
    return seg ? seg->base + seg->body_off : NULL;
}

size_t memlan_segment_size(const memlan_segment_t *seg) { return seg ? seg->body_size : 0; }

int memlan_segment_check(const memlan_segment_t *seg)
{
    if (!seg)
        return -EINVAL;
    if (__ml_guard_broken(seg->guard))
        return -EIO;
    if (ml_load_acquire(&seg->hdr->state) != ML_SEG_LIVE)
        return -ECONNABORTED;
    if (!seg->owner && __ml_seg_alive(seg, ML_LOCK_OWNER) == 0)
        return -EOWNERDEAD;
    return 0;
}

int memlan_segment_revoke(memlan_segment_t *seg)
{
    if (!seg)
        return -EINVAL;
    if (!seg->owner)
        return -EPERM;
    /* SYNC: pairs with the acquire load of state in memlan_segment_check() and the channel
     * operations; the name goes after the flag so an import racing us sees one or the other. */
    ml_store_release(&seg->hdr->state, ML_SEG_REVOKED);
    ml_seg_unlink(seg);
    return 0;
}

void memlan_segment_close(memlan_segment_t *seg)
{
    if (!seg)
        return;
    /* A fork child's close of the handle it inherited lets go of its own copies (mapping,
     * descriptor, memory): the segment and its file are the exporter's, which goes on. */
    if (seg->pid != (int32_t)__ml_pid())
        seg->owner = false;
    if (seg->owner)
        (void)memlan_segment_revoke(seg);
    __ml_seg_destroy(seg);
}

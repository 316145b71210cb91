/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/*
 * acl.c - POSIX access ACLs on fabric files, written as the kernel's xattr (no libacl).
 *
 * In a fabric shared on purpose by a group, a channel's file is readable and writable by its
 * two ends only: mode 0600 (the creating client) plus one ACL entry per acceptor user, with
 * the group and others given nothing (design.md, "Fabric").  The acceptor users come from the
 * listener record's own ACL: a listener that is about to change its euid (cred.c) names the new
 * euid there while it is still the record's owner or privileged, since only the owner of a file
 * (or CAP_FOWNER) may change its ACL; so a member of the group who can write the record cannot
 * add itself.
 *
 * The xattr system.posix_acl_access is a little-endian header (version 2) then entries of
 * {u16 tag, u16 perm, u32 id}, sorted by tag, named users by id.
 */
#include "internal.h"
#include "sys/sys.h"

#include <errno.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#define ML_ACL_NAME      "system.posix_acl_access"
#define ML_ACL_VERSION   2u
#define ML_ACL_USER_OBJ  0x01u
#define ML_ACL_USER      0x02u
#define ML_ACL_GROUP_OBJ 0x04u
#define ML_ACL_GROUP     0x08u
#define ML_ACL_MASK      0x10u
#define ML_ACL_OTHER     0x20u
#define ML_ACL_NOID      0xffffffffu
#define ML_ACL_MAXENT    64

struct ml_acl_ent {
    uint16_t tag, perm;
    uint32_t id;
};

static long ml_acl_get(int fd, void *buf, size_t len)
{
    long r = syscall(SYS_fgetxattr, fd, ML_ACL_NAME, buf, len);
    return r < 0 ? -errno : r;
}

static int ml_acl_put(int fd, const struct ml_acl_ent *e, int n)
{
    uint8_t buf[4 + ML_ACL_MAXENT * 8];
    uint32_t v = ML_ACL_VERSION;
    memcpy(buf, &v, 4); /* little-endian on every target memlan builds for (x86-64, arm64) */
    for (int i = 0; i < n; i++)
        memcpy(buf + 4 + 8 * i, &e[i], 8);
    int saved = errno;
    long r = syscall(SYS_fsetxattr, fd, ML_ACL_NAME, buf, (size_t)(4 + 8 * n), 0);
    r = r < 0 ? -errno : 0;
    errno = saved;
    return (int)r;
}

/* The file's ACL as entries (its mode's three when it has none); count, or -errno. */
static int ml_acl_read(int fd, struct ml_acl_ent *e, int max)
{
    uint8_t buf[4 + ML_ACL_MAXENT * 8];
    int saved = errno;
    long n = ml_acl_get(fd, buf, sizeof buf);
    errno = saved;
    if (n == -ENODATA || n == -EOPNOTSUPP) { /* no ACL, or no ACLs here: the mode says */
        struct stat st;
        int r = __ml_sys_fstat(fd, &st);
        if (r < 0)
            return r;
        e[0] = (struct ml_acl_ent){ML_ACL_USER_OBJ, (uint16_t)((st.st_mode >> 6) & 7), ML_ACL_NOID};
        e[1] = (struct ml_acl_ent){ML_ACL_GROUP_OBJ, (uint16_t)((st.st_mode >> 3) & 7), ML_ACL_NOID};
        e[2] = (struct ml_acl_ent){ML_ACL_OTHER, (uint16_t)(st.st_mode & 7), ML_ACL_NOID};
        return 3;
    }
    if (n < 0)
        return (int)n;
    uint32_t v;
    if (n < 4 || (n - 4) % 8 != 0 || (n - 4) / 8 > max)
        return -EPROTO;
    memcpy(&v, buf, 4);
    if (v != ML_ACL_VERSION)
        return -EPROTO;
    int cnt = (int)((n - 4) / 8);
    for (int i = 0; i < cnt; i++)
        memcpy(&e[i], buf + 4 + 8 * i, 8);
    return cnt;
}

int __ml_acl_users(int fd, uint32_t *uids, int max)
{
    struct ml_acl_ent e[ML_ACL_MAXENT];
    int n = ml_acl_read(fd, e, ML_ACL_MAXENT);
    if (n < 0)
        return n;
    int k = 0;
    for (int i = 0; i < n; i++) {
        if (e[i].tag != ML_ACL_USER)
            continue;
        if (k == max)
            return -E2BIG;
        uids[k++] = e[i].id;
    }
    return k;
}

int __ml_acl_add_user(int fd, uint32_t uid)
{
    struct ml_acl_ent e[ML_ACL_MAXENT + 2], out[ML_ACL_MAXENT + 2];
    int n = ml_acl_read(fd, e, ML_ACL_MAXENT);
    if (n < 0)
        return n;
    if (n >= ML_ACL_MAXENT)
        return -E2BIG;
    uint16_t group = 0, named = 6;
    bool have_mask = false;
    for (int i = 0; i < n; i++) {
        if (e[i].tag == ML_ACL_USER && e[i].id == uid)
            return 0; /* there already */
        if (e[i].tag == ML_ACL_GROUP_OBJ)
            group = e[i].perm;
        else if (e[i].tag == ML_ACL_USER || e[i].tag == ML_ACL_GROUP)
            named |= e[i].perm;
        else if (e[i].tag == ML_ACL_MASK)
            have_mask = true;
    }
    /* Copy in the kernel's order, the new user among the named ones by id; a mask is needed
     * once there is a named entry (it grants what the group and the named entries have). */
    int k = 0;
    bool put = false;
    for (int i = 0; i < n; i++) {
        if (!put && (e[i].tag > ML_ACL_USER || (e[i].tag == ML_ACL_USER && e[i].id > uid))) {
            out[k++] = (struct ml_acl_ent){ML_ACL_USER, 6, uid};
            put = true;
        }
        if (e[i].tag == ML_ACL_MASK) {
            out[k] = e[i];
            out[k++].perm |= 6;
            continue;
        }
        if (!have_mask && e[i].tag == ML_ACL_OTHER)
            out[k++] = (struct ml_acl_ent){ML_ACL_MASK, (uint16_t)(group | named), ML_ACL_NOID};
        out[k++] = e[i];
    }
    if (!put)
        return -EPROTO; /* no OTHER entry: not an ACL the kernel wrote */
    return ml_acl_put(fd, out, k);
}

int __ml_acl_private(int fd, const uint32_t *uids, int n)
{
    struct ml_acl_ent e[ML_ACL_MAXENT];
    if (n < 0 || n > ML_ACL_MAXENT - 4)
        return -E2BIG;
    int k = 0;
    e[k++] = (struct ml_acl_ent){ML_ACL_USER_OBJ, 6, ML_ACL_NOID};
    for (int i = 0; i < n; i++) /* the caller gives them sorted, unique, without the owner */
        e[k++] = (struct ml_acl_ent){ML_ACL_USER, 6, uids[i]};
    e[k++] = (struct ml_acl_ent){ML_ACL_GROUP_OBJ, 0, ML_ACL_NOID};
    if (n > 0)
        e[k++] = (struct ml_acl_ent){ML_ACL_MASK, 6, ML_ACL_NOID};
    e[k++] = (struct ml_acl_ent){ML_ACL_OTHER, 0, ML_ACL_NOID};
    return ml_acl_put(fd, e, k);
}

/* An event queue's doorbell FIFO: its owner reads and writes, uids[0..n) (sorted, unique,
 * without the owner) only write (a reader could take rings away from the owner), and with wide
 * the group and others write too.  Written whole each time the queue's parts change. */
int __ml_acl_bell(int fd, const uint32_t *uids, int n, bool wide)
{
    struct ml_acl_ent e[ML_ACL_MAXENT];
    if (n < 0 || n > ML_ACL_MAXENT - 4)
        return -E2BIG;
    int k = 0;
    uint16_t g = wide ? 2 : 0;
    e[k++] = (struct ml_acl_ent){ML_ACL_USER_OBJ, 6, ML_ACL_NOID};
    for (int i = 0; i < n; i++)
        e[k++] = (struct ml_acl_ent){ML_ACL_USER, 2, uids[i]};
    e[k++] = (struct ml_acl_ent){ML_ACL_GROUP_OBJ, g, ML_ACL_NOID};
    if (n > 0)
        e[k++] = (struct ml_acl_ent){ML_ACL_MASK, 2, ML_ACL_NOID};
    e[k++] = (struct ml_acl_ent){ML_ACL_OTHER, g, ML_ACL_NOID};
    return ml_acl_put(fd, e, k);
}

/* Who may write fd's file (the owner, and the named users whose entry the mask lets write):
 * 0 and out filled (sorted, unique, root left out: it may write anything anyway), 1 when the
 * group class or others may write (or more than ML_ACCESS_MAX users may), or -errno. */
int __ml_acl_writers(int fd, struct ml_access *out)
{
    struct stat st;
    struct ml_acl_ent e[ML_ACL_MAXENT];
    int r = __ml_sys_fstat(fd, &st);
    if (r < 0)
        return r;
    int n = ml_acl_read(fd, e, ML_ACL_MAXENT);
    if (n < 0)
        return n;
    uint16_t mask = 7;
    for (int i = 0; i < n; i++)
        if (e[i].tag == ML_ACL_MASK)
            mask = e[i].perm;
    out->n = 0;
    uint32_t cand[ML_ACL_MAXENT + 1];
    int k = 0;
    cand[k++] = (uint32_t)st.st_uid;
    for (int i = 0; i < n; i++) {
        uint16_t eff = e[i].tag == ML_ACL_OTHER || e[i].tag == ML_ACL_USER_OBJ ? e[i].perm
                                                                               : e[i].perm & mask;
        if (!(eff & 2))
            continue;
        if (e[i].tag == ML_ACL_GROUP_OBJ || e[i].tag == ML_ACL_GROUP || e[i].tag == ML_ACL_OTHER)
            return 1;
        if (e[i].tag == ML_ACL_USER)
            cand[k++] = e[i].id;
    }
    for (int i = 0; i < k; i++) {
        uint32_t u = cand[i];
        if (u == 0)
            continue;
        uint32_t j = 0;
        while (j < out->n && out->uids[j] < u)
            j++;
        if (j < out->n && out->uids[j] == u)
            continue;
        if (out->n == ML_ACCESS_MAX)
            return 1;
        memmove(&out->uids[j + 1], &out->uids[j], (out->n - j) * sizeof out->uids[0]);
        out->uids[j] = u;
        out->n++;
    }
    return 0;
}

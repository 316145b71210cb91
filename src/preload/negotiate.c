/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/*
 * negotiate.c - how two memlan processes agree to carry a TCP connection over a channel, and how
 * everything else stays plain TCP without a byte added.
 *
 * Nothing is ever written into the TCP stream.  The rendezvous is out of band, in the fabric
 * (the record layouts are in layout.h):
 *   - a memlan listener holds a read lock on the record ls-NETNS-PORT;
 *   - a memlan client that sees a live record counts itself in the record's pending, connects,
 *     creates a channel and offers it under a name made of the connection's own addresses and
 *     ports (cx-NETNS-CLIENT-SERVER, a hard link to the channel's file, whose offer block holds
 *     the same name), then counts itself out;
 *   - the acceptor opens the offer by the accepted socket's addresses.  Found: it attaches from
 *     that fd if the offer block still names it (the core's CAS on the channel's attached word is
 *     the claim).  Not found and nobody pending: the
 *     client is not memlan.  Not found but clients pending: it waits a little for the offer, then
 *     refuses by marking the offer's name in the record (refused[]), which the late client
 *     finds there while it waits for the claim, and withdraws.
 *   - Until the claim the client's socket is undecided: what it writes goes into the ring (the
 *     acceptor will read it, or the client will send it over TCP), and it decides TCP itself when
 *     the server talks over TCP (so it is not memlan) or when no claim comes within
 *     MEMLAN_ACCEPT_WAIT_MS (a listener inherited by a program without memlan, say).  Its
 *     withdrawal is a CAS on the same word as the claim, so exactly one of the two wins.
 * A real TCP connection stays under every accelerated socket: it gives the fd its identity,
 * orders the set-up, and its FIN tells a sleeping poller that the peer is gone.
 */
#include "preload.h"
#include "sys/sys.h"

#include <arpa/inet.h>
#include <errno.h>
#include <limits.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <linux/futex.h>
#include <linux/if_packet.h>
#include <linux/inet_diag.h>
#include <linux/sock_diag.h>
#include <linux/neighbour.h>
#include <linux/netlink.h>
#include <linux/rtnetlink.h>
#include <net/if.h>
#include <net/if_arp.h>
#include <linux/errqueue.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

static pthread_mutex_t mlp_neg_mu = PTHREAD_MUTEX_INITIALIZER;
/* The acceptor's reason when no offer came and the client's FIN is there. */
#define MLP_WHY_NO_OFFER_FIN                                                                    \
    "the client shut down its sending before accept, with no offer (a memlan client that "      \
    "closed, or one without memlan)"
/* The acceptor's reason when the client marked its offer withdrawn (mlp_withdrawal_key). */
#define MLP_WHY_WITHDRAWN                                                                       \
    "the client withdrew its offer before this acceptor took it (the client's own log says why)"
static bool mlp_fab_tried;
char mlp_carry_fabric[4096];
bool mlp_carry_explicit;  /* the carried fabric was named (MEMLAN_FABRIC), not a default */
uid_t mlp_carry_owner;    /* a carried default's owner (its uid's default directory) */
/* How our fabric was named, for an exec that carries connections in it (exec.c's F line): a
 * default is checked in the new image as that user's default, whatever uid the image runs as. */
bool mlp_fab_explicit;
uid_t mlp_fab_owner;

static const char mlp_no_listener_why[] = "no memlan listener on this port in the fabric";
static void mlp_no_listener_hint(void);

/* The fabric's directory when it is opened: MEMLAN_FABRIC as the environment has it then (a
 * program may set its own before its first socket, as libmemlan's memlan_fabric_open(NULL) in the
 * same process reads it), else as it was at start-up (a daemon that emptied its environment:
 * exim), else NULL, the default. */
static const char *mlp_fabric_dir(void)
{
    const char *env = getenv("MEMLAN_FABRIC");
    if (env && *env)
        return env;
    return mlp_cfg.fabric[0] ? mlp_cfg.fabric : NULL;
}

static bool mlp_confined(void);

/* The fabric, opened on first use. */
static memlan_fabric_t *mlp_fabric(void)
{
    if (mlp_fab || mlp_fab_tried)
        return mlp_fab;
    const char *why = NULL; /* set when the fabric cannot be used: said once, below */
    static char expl[96];
    bool refused = false;
    pthread_mutex_lock(&mlp_neg_mu);
    if (!mlp_fab_tried) {
        memlan_fabric_t *f;
        /* An image that took connections up across exec opens the fabric they live in (exec.c
         * names it): the default is per uid, and an inetd's child drops to its service's user
         * before the exec.  Not writable by this user, it is kept for them alone, as a process
         * that dropped after opening it keeps it (cred.c): its own connections stay on TCP. */
        const char *carried = mlp_carry_fabric[0] ? mlp_carry_fabric : NULL;
        const char *dir = mlp_fabric_dir();
        int r = carried ? __ml_fabric_open_carried(carried, mlp_carry_explicit, mlp_carry_owner, &f)
                        : memlan_fabric_open(dir, &f);
        if (carried && r == 0 && strcmp(carried, dir ? dir : "") != 0 &&
            (dir || mlp_carry_explicit || mlp_carry_owner != getuid()))
            mlp_log(0, "this program's connections carried across exec live in fabric %.200s: it "
                       "is this process's fabric (not %.200s)", carried,
                    dir ? dir : "the default");
        const char *brief = r == -EACCES ? "another user's, or open to others" : NULL;
        why = r == -EACCES ? "permission denied: the directory is another user's, or open to "
                             "others (a fabric shared on purpose is named by MEMLAN_FABRIC)"
            : r < 0 ? __ml_fabric_explain(r, expl, sizeof expl) : NULL; /* a symlink, missing */
        /* A directory we may open but not write into (another user's shared fabric, a
         * read-only mount) would fail every connection one by one: say it now, once. */
        if (r == 0 && faccessat(f->dirfd, ".", W_OK | X_OK, AT_EACCESS) < 0) {
            if (carried) {
                refused = true;
            } else {
                memlan_fabric_close(f);
                r = -EACCES;
                why = brief = "not writable by this user";
            }
        }
        if (r < 0) {
            snprintf(mlp_fab_error, sizeof mlp_fab_error, "fabric unavailable: %s",
                     brief ? brief : why);
        } else {
            mlp_own_fd(&f->dirfd, true);
            /* The lazy sweep asks the kernel which listeners live (sock_diag) only outside a
             * seccomp sandbox, which may kill for the socket (mlp_note_confined clears it). */
            atomic_store(&f->sweep_asks, !mlp_confined());
            mlp_fab_explicit = carried ? mlp_carry_explicit : dir != NULL;
            mlp_fab_owner = carried && !mlp_carry_explicit ? mlp_carry_owner : getuid();
            mlp_fab = f;
            mlp_cred_fabric_opened();
        }
        mlp_fab_tried = true;
    }
    pthread_mutex_unlock(&mlp_neg_mu);
    if (refused)
        mlp_fabric_refused("not writable by this user", -EACCES);
    /* Once: mlp_fab_tried is set for good (and a forked child inherits it).  Said outside the
     * lock, so that a stderr that blocks (a full pipe) holds up no other thread's connect. */
    if (why) {
        const char *dir = mlp_carry_fabric[0] ? mlp_carry_fabric : mlp_fabric_dir();
        char def[64];
        if (!dir || !*dir) {
            snprintf(def, sizeof def, "/dev/shm/memlan-%u", (unsigned)getuid());
            dir = def;
        }
        mlp_say(MLP_SAID_FABRIC, "cannot accelerate: fabric %.200s: %s; every connection "
                "stays on TCP", dir, why);
    }
    return mlp_fab;
}

/*
 * Before chroot() (interpose.c): a group-shared fabric opened now, while its path still names it,
 * so that a process that chroots before its first connect (postfix's smtp client, chroot y in
 * Debian's master.cf) finds it through its descriptor afterwards; before, it found "no such
 * directory" and every connection stayed on TCP.  Silent: a fabric that cannot be opened now is
 * left to the first use, which says why.
 */
static bool mlp_confined(void);

void mlp_fabric_preopen(void)
{
    if (mlp_cfg.off)
        return;
    /* Whether a seccomp filter confines us is read from /proc/self/status, which a chroot
     * usually lacks: unread, a chrooted passer counted as confined, and postfix's smtp client,
     * handing its connection to scache over SCM_RIGHTS, lost it ("the passer is in a seccomp
     * sandbox"), a later smtp process then writing RSET on the kernel socket under it.  Read
     * now; a filter installed later through our prctl or syscall is noted as before. */
    (void)mlp_confined();
    if (mlp_fab || mlp_fab_tried)
        return;
    pthread_mutex_lock(&mlp_neg_mu);
    if (!mlp_fab && !mlp_fab_tried) {
        memlan_fabric_t *f;
        if (memlan_fabric_open(mlp_fabric_dir(), &f) == 0) {
            /* Only a fabric shared with a group: a chroot goes with a drop to another account
             * (privilege separation), which a user's private fabric does not admit; opened for
             * nothing, its files made before the drop could not be removed after (dovecot's
             * login processes chroot, then drop to dovenull: their stat entries were left). */
            if (f->shared && faccessat(f->dirfd, ".", W_OK | X_OK, AT_EACCESS) == 0) {
                mlp_fab_explicit = mlp_fabric_dir() != NULL;
                mlp_fab_owner = getuid();
                mlp_own_fd(&f->dirfd, true);
                atomic_store(&f->sweep_asks, !mlp_confined());
                mlp_fab = f;
                mlp_cred_fabric_opened();
                mlp_fab_tried = true;
            } else {
                memlan_fabric_close(f);
            }
        }
    }
    pthread_mutex_unlock(&mlp_neg_mu);
}

/* ---- addresses --------------------------------------------------------------------------- */

struct mlp_addr {
    int v4;                   /* 1: IPv4 (v4-mapped IPv6 counts as IPv4) */
    uint8_t a[16];
    int port;
};

static bool mlp_addr_of(const struct sockaddr *sa, socklen_t len, struct mlp_addr *out)
{
    memset(out, 0, sizeof *out);
    if (sa->sa_family == AF_INET && len >= sizeof(struct sockaddr_in)) {
        const struct sockaddr_in *s4 = (const void *)sa;
        out->v4 = 1;
        memcpy(out->a, &s4->sin_addr, 4);
        out->port = ntohs(s4->sin_port);
        return true;
    }
    if (sa->sa_family == AF_INET6 && len >= sizeof(struct sockaddr_in6)) {
        const struct sockaddr_in6 *s6 = (const void *)sa;
        if (IN6_IS_ADDR_V4MAPPED(&s6->sin6_addr)) {
            out->v4 = 1;
            memcpy(out->a, &s6->sin6_addr.s6_addr[12], 4);
        } else {
            memcpy(out->a, &s6->sin6_addr, 16);
        }
        out->port = ntohs(s6->sin6_port);
        return true;
    }
    return false;
}

static bool mlp_addr_loopback(const struct mlp_addr *a)
{
    if (a->v4)
        return a->a[0] == 127;
    static const uint8_t lo6[16] = {[15] = 1};
    return memcmp(a->a, lo6, 16) == 0;
}

/* "7f000001p1f90": the address's bytes and the port, in hex (every connection names its offer
 * with two of these: no printf) */
static void mlp_addr_hex(const struct mlp_addr *a, char *buf, size_t len)
{
    static const char hx[] = "0123456789abcdef";
    int n = a->v4 ? 4 : 16;
    size_t o = 0;
    if (len < 2u * 16 + 6)
        return (void)(len ? buf[0] = 0 : 0);
    for (int i = 0; i < n; i++) {
        buf[o++] = hx[a->a[i] >> 4];
        buf[o++] = hx[a->a[i] & 15];
    }
    buf[o++] = 'p';
    unsigned port = (unsigned)a->port & 0xffff;
    int digits = 1;
    while (digits < 4 && (port >> (4 * digits)))
        digits++;
    for (int d = digits - 1; d >= 0; d--)
        buf[o++] = hx[(port >> (4 * d)) & 15];
    buf[o] = 0;
}

static bool mlp_addr_wild(const struct mlp_addr *a)
{
    static const uint8_t zero[16];
    return memcmp(a->a, zero, a->v4 ? 4 : 16) == 0;
}

static void mlp_addr_str(const struct mlp_addr *a, char *buf, size_t len)
{
    char ip[INET6_ADDRSTRLEN];
    inet_ntop(a->v4 ? AF_INET : AF_INET6, a->a, ip, sizeof ip);
    snprintf(buf, len, a->v4 ? "%s:%d" : "[%s]:%d", ip, a->port);
}

static int mlp_sock_addrs(int fd, struct mlp_addr *local, struct mlp_addr *remote,
                          const struct sockaddr *fallback, socklen_t fblen)
{
    struct sockaddr_storage ss;
    socklen_t l = sizeof ss;
    if (getsockname(fd, (struct sockaddr *)&ss, &l) < 0 ||
        !mlp_addr_of((struct sockaddr *)&ss, l, local))
        return -errno;
    /* A connect's own address is the peer's, unless it is a wildcard (the kernel connects that to
     * a local address, which only getpeername tells). */
    if (fallback && mlp_addr_of(fallback, fblen, remote) && !mlp_addr_wild(remote))
        return 0;
    l = sizeof ss;
    if (getpeername(fd, (struct sockaddr *)&ss, &l) == 0) {
        if (!mlp_addr_of((struct sockaddr *)&ss, l, remote))
            return -EAFNOSUPPORT;
    } else if (!fallback || !mlp_addr_of(fallback, fblen, remote)) {
        return -ENOTCONN;
    }
    return 0;
}

static bool mlp_addr_eq(const struct mlp_addr *a, const struct mlp_addr *b)
{
    return a->v4 == b->v4 && memcmp(a->a, b->a, 16) == 0;
}

/* The offer's name: cx-NETNS-CLIENT-SERVER, NETNS the listener's namespace.  Across namespaces
 * (mac set) "-mMAC" follows: the link-layer address of the client's interface, which the
 * acceptor reads from its own neighbour table for the peer (see "Across network namespaces"). */
static void mlp_offer_name(char *buf, size_t len, const char *netns, const struct mlp_addr *client,
                           const struct mlp_addr *server, const uint8_t *mac)
{
    char c[48], s[48];
    mlp_addr_hex(client, c, sizeof c);
    mlp_addr_hex(server, s, sizeof s);
    if (!mac) {
        snprintf(buf, len, "cx-%s-%s-%s", netns, c, s);
        return;
    }
    snprintf(buf, len, "cx-%s-%s-%s-m%02x%02x%02x%02x%02x%02x", netns, c, s, mac[0], mac[1],
             mac[2], mac[3], mac[4], mac[5]);
}

/* ---- the link to a peer in another namespace (rtnetlink) ----------------------------------- */

/*
 * One request to the kernel's routing netlink in our namespace and its one answer: 0 with the
 * answer's attributes copied out by fn, or -errno.  A short-lived socket of our own (not the
 * program's): the answer comes within the call, so the wait is bounded by a 1 s timeout.
 */
static int mlp_nl_ask(struct nlmsghdr *req, int (*fn)(struct nlmsghdr *, void *), void *arg)
{
    int fd = socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC, NETLINK_ROUTE);
    if (fd < 0)
        return -errno;
    struct timeval tv = {.tv_sec = 1};
    (void)mlp_real_setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    struct sockaddr_nl k = {.nl_family = AF_NETLINK};
    int e = -EIO;
    req->nlmsg_seq = 1;
    if (mlp_real_sendto(fd, req, req->nlmsg_len, 0, (struct sockaddr *)&k, sizeof k) < 0) {
        e = -errno;
        goto out;
    }
    union {
        char b[8192];
        struct nlmsghdr h;
    } u;
    for (int tries = 0; tries < 4; tries++) {
        ssize_t n = mlp_real_recv(fd, u.b, sizeof u.b, 0);
        if (n < 0) {
            e = errno == EAGAIN ? -ETIMEDOUT : -errno;
            goto out;
        }
        for (struct nlmsghdr *h = &u.h; NLMSG_OK(h, (size_t)n); h = NLMSG_NEXT(h, n)) {
            if (h->nlmsg_seq != 1)
                continue;
            if (h->nlmsg_type == NLMSG_ERROR) {
                const struct nlmsgerr *ne = NLMSG_DATA(h);
                e = ne->error ? ne->error : -ENOENT;
                goto out;
            }
            e = fn(h, arg);
            goto out;
        }
    }
out:
    __ml_sys_close(fd);
    return e;
}

/* A request: header, body, room for one attribute. */
struct mlp_nlreq {
    struct nlmsghdr h;
    union {
        struct rtmsg r;
        struct ndmsg n;
    };
    char attrs[64];
};

/* A request of type with a body of blen bytes (filled in by the caller, after the header) and
 * one attribute attr holding the address a; room for it follows the body. */
static void mlp_nl_request(struct nlmsghdr *h, int type, size_t blen, int attr,
                           const struct mlp_addr *a)
{
    int alen = a->v4 ? 4 : 16;
    h->nlmsg_len = NLMSG_LENGTH(blen);
    h->nlmsg_type = (unsigned short)type;
    h->nlmsg_flags = NLM_F_REQUEST;
    struct rtattr *ra = (struct rtattr *)((char *)h + NLMSG_ALIGN(h->nlmsg_len));
    ra->rta_type = (unsigned short)attr;
    ra->rta_len = (unsigned short)RTA_LENGTH(alen);
    memcpy(RTA_DATA(ra), a->a, (size_t)alen);
    h->nlmsg_len = NLMSG_ALIGN(h->nlmsg_len) + RTA_ALIGN(ra->rta_len);
}

struct mlp_route { int oif; bool gateway; };

static int mlp_route_got(struct nlmsghdr *h, void *arg)
{
    struct mlp_route *rt = arg;
    if (h->nlmsg_type != RTM_NEWROUTE)
        return -EIO;
    struct rtmsg *rm = NLMSG_DATA(h);
    int len = (int)RTM_PAYLOAD(h);
    if (rm->rtm_type != RTN_UNICAST)
        return -ENETUNREACH; /* local, broadcast, unreachable: not a peer on a link */
    for (struct rtattr *a = RTM_RTA(rm); RTA_OK(a, len); a = RTA_NEXT(a, len)) {
        if (a->rta_type == RTA_OIF)
            rt->oif = *(int *)RTA_DATA(a);
        else if (a->rta_type == RTA_GATEWAY || a->rta_type == RTA_VIA)
            rt->gateway = true;
    }
    return rt->oif > 0 ? 0 : -ENODEV;
}

/* The route our namespace takes to a: its interface and whether it goes through a router. */
static int mlp_route_to(const struct mlp_addr *a, struct mlp_route *rt)
{
    struct mlp_nlreq q;
    memset(&q, 0, sizeof q);
    q.r.rtm_family = a->v4 ? AF_INET : AF_INET6;
    q.r.rtm_dst_len = a->v4 ? 32 : 128;
    mlp_nl_request(&q.h, RTM_GETROUTE, sizeof q.r, RTA_DST, a);
    *rt = (struct mlp_route){0};
    return mlp_nl_ask(&q.h, mlp_route_got, rt);
}

static int mlp_neigh_got(struct nlmsghdr *h, void *arg)
{
    if (h->nlmsg_type != RTM_NEWNEIGH)
        return -EIO;
    struct ndmsg *nd = NLMSG_DATA(h);
    int len = (int)(h->nlmsg_len - NLMSG_LENGTH(sizeof *nd));
    if (nd->ndm_state & (NUD_INCOMPLETE | NUD_FAILED | NUD_NOARP))
        return -ENOENT;
    for (struct rtattr *a = (struct rtattr *)((char *)nd + NLMSG_ALIGN(sizeof *nd));
         RTA_OK(a, len); a = RTA_NEXT(a, len)) {
        if (a->rta_type == NDA_LLADDR && RTA_PAYLOAD(a) == 6) {
            memcpy(arg, RTA_DATA(a), 6);
            return 0;
        }
    }
    return -ENOENT;
}

/* Acceptor: the link-layer address our neighbour table holds for the peer a, found on the
 * interface of our route to it (the one the connection came in by).  -ENOENT when none: a peer
 * in our own namespace, or one behind a router (then the entry would be the router's: refused). */
static int mlp_peer_mac(const struct mlp_addr *a, uint8_t mac[6])
{
    struct mlp_route rt;
    int e = mlp_route_to(a, &rt);
    if (e < 0)
        return e;
    if (rt.gateway)
        return -ENOENT;
    struct mlp_nlreq q;
    memset(&q, 0, sizeof q);
    q.n.ndm_family = a->v4 ? AF_INET : AF_INET6;
    q.n.ndm_ifindex = rt.oif;
    mlp_nl_request(&q.h, RTM_GETNEIGH, sizeof q.n, NDA_DST, a);
    return mlp_nl_ask(&q.h, mlp_neigh_got, mac);
}

/* Client: our interface's link-layer address, for the offer's name; -errno (-ENOENT: the link
 * has none, a tunnel say). */
static int mlp_if_mac(int ifindex, uint8_t mac[6])
{
    struct ifreq ifr;
    memset(&ifr, 0, sizeof ifr);
    if (!if_indextoname((unsigned)ifindex, ifr.ifr_name))
        return -errno;
    int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -errno;
    int e = mlp_real_ioctl(fd, SIOCGIFHWADDR, &ifr) < 0 ? -errno : 0;
    __ml_sys_close(fd);
    if (e < 0)
        return e;
    static const uint8_t zero[6];
    if (ifr.ifr_hwaddr.sa_family != ARPHRD_ETHER || memcmp(ifr.ifr_hwaddr.sa_data, zero, 6) == 0)
        return -ENOENT;
    memcpy(mac, ifr.ifr_hwaddr.sa_data, 6);
    return 0;
}

/* ---- the stat segment -------------------------------------------------------------------- */

static struct memlan_segment *mlp_proc;
static struct ml_proc_hdr *mlp_proc_hdr;
static struct ml_proc_conn *mlp_proc_conns;
static unsigned mlp_proc_hint;
static uint64_t mlp_proc_reserved; /* bytes of the record reserved (fallocate) so far */
static bool mlp_proc_failed; /* once per process: a process that cannot create it does not retry */
static pthread_mutex_t mlp_proc_mu = PTHREAD_MUTEX_INITIALIZER;

static int mlp_proc_slot(void)
{
    memlan_fabric_t *fab = mlp_fabric();
    if (!fab)
        return -1;
    pthread_mutex_lock(&mlp_proc_mu);
    int e_proc = 0;
    if (!mlp_proc && !mlp_proc_failed) {
        size_t body = sizeof(struct ml_proc_hdr) + ML_PROC_SLOTS * sizeof(struct ml_proc_conn);
        struct memlan_segment *seg;
        int e = __ml_seg_create(fab, ML_KIND_PROC, MEMLAN_MODE_RO, sizeof(struct ml_seg_hdr),
                                body, 0, &seg);
        if (e < 0) {
            e_proc = e;
            mlp_proc_failed = true;
            mlp_log(0, "cannot create this process's entry for memlan stat (%s): its "
                       "connections are in the log only", strerror(-e));
        }
        if (e == 0) {
            mlp_own_fd(&seg->fd, true);
            mlp_proc_hdr = (struct ml_proc_hdr *)(seg->base + seg->body_off);
            mlp_proc_conns = (struct ml_proc_conn *)(mlp_proc_hdr + 1);
            mlp_proc_hdr->pid = mlp_pid;
            mlp_proc_hdr->nslots = ML_PROC_SLOTS;
            int fd = (int)__ml_sys_open(AT_FDCWD, "/proc/self/comm", O_RDONLY, 0);
            if (fd >= 0) {
                ssize_t n = __ml_sys_read(fd, mlp_proc_hdr->cmd, sizeof mlp_proc_hdr->cmd - 1);
                if (n > 0 && mlp_proc_hdr->cmd[n - 1] == '\n')
                    mlp_proc_hdr->cmd[n - 1] = 0;
                __ml_sys_close(fd);
            }
            __ml_seg_publish(seg);
            mlp_proc = seg;
            mlp_proc_reserved = ML_PAGE;
        }
    }
    int slot = -1;
    if (e_proc < 0) {
        pthread_mutex_unlock(&mlp_proc_mu);
        mlp_fabric_refused("the memlan stat entry", e_proc);
        return -1;
    }
    if (mlp_proc) {
        for (unsigned i = 0; i < ML_PROC_SLOTS; i++) {
            unsigned k = (mlp_proc_hint + i) % ML_PROC_SLOTS;
            /* The record is reserved as far as slots are used (see __ml_seg_create): a slot in
             * pages a full fabric cannot give is not used, rather than fault on first store. */
            uint64_t end = (uint64_t)((uint8_t *)&mlp_proc_conns[k + 1] - mlp_proc->base);
            if (end > mlp_proc_reserved) {
                uint64_t to = (end + 65535) & ~(uint64_t)65535;
                if (to > mlp_proc->hdr->total_size)
                    to = mlp_proc->hdr->total_size;
                if (__ml_sys_fallocate(mlp_proc->fd, 0, (off_t)to) < 0)
                    break;
                mlp_proc_reserved = to;
            }
            if (ml_load_relaxed(&mlp_proc_conns[k].state) == ML_CONN_FREE) {
                slot = (int)k;
                mlp_proc_hint = k + 1;
                ml_store_relaxed(&mlp_proc_conns[k].state, ML_CONN_WAIT);
                break;
            }
        }
    }
    pthread_mutex_unlock(&mlp_proc_mu);
    return slot;
}

static void mlp_slot_fill(int slot, uint32_t state, int fd, const struct mlp_addr *l,
                          const struct mlp_addr *r, const char *token, const char *why)
{
    if (slot < 0 || !mlp_proc_conns)
        return;
    struct ml_proc_conn *c = &mlp_proc_conns[slot];
    c->fd = fd;
    if (l)
        mlp_addr_str(l, c->local, sizeof c->local);
    if (r)
        mlp_addr_str(r, c->remote, sizeof c->remote);
    memset(c->token, 0, sizeof c->token);
    if (token)
        memcpy(c->token, token, ML_TOKEN_HEX);
    snprintf(c->why, sizeof c->why, "%s", why ? why : "");
    ml_store_release(&c->state, state);
    if (state == ML_CONN_ACCEL)
        atomic_fetch_add(&mlp_proc_hdr->accel_total, 1);
    else if (state == ML_CONN_TCP)
        atomic_fetch_add(&mlp_proc_hdr->tcp_total, 1);
}

/* Before a credential change (cred.c): the entry, made while the fabric is in reach. */
void mlp_stat_prepare(void)
{
    if (mlp_proc || mlp_proc_failed)
        return;
    int slot = mlp_proc_slot();
    if (slot >= 0)
        ml_store_release(&mlp_proc_conns[slot].state, ML_CONN_FREE);
}

/*
 * Our memlan stat entry's owner, in a fabric shared on purpose, follows root's euid changes
 * (cred.c): before a call that takes another euid it becomes that euid's, so that the process
 * can remove it at exit after the drop; after any uid call that leaves us root (it failed, or a
 * temporary drop ended) it is root's again.  The directory is sticky: a file there is removed by
 * its owner, the directory's or root only, and nsd or nbd-server, which drop after they listen,
 * left their entry (0.9 MB, and a DEAD line in memlan stat) at every clean exit until root's
 * `memlan clean`.  Meanwhile that euid's other processes may write the entry, as any entry of a
 * process of theirs.  Only where root can (CAP_CHOWN), and not in a seccomp sandbox (fchown is
 * a call such a filter may kill for).  (The port's listener record is not handed over: a record
 * owned by another user than the listening socket's maker is believed only when the kernel
 * vouches for it, mlp_lrec_access; root's next listener on the port, or root's `memlan clean`,
 * removes it.)
 */
void mlp_stat_owner(uid_t uid)
{
    struct stat st;
    if (!mlp_proc || !mlp_fab || !mlp_fab->shared || uid == (uid_t)-1 || geteuid() != 0 ||
        __ml_sys_fstat(mlp_proc->fd, &st) < 0 || st.st_uid == uid || mlp_known_confined() ||
        __ml_sys_seccomp_mode() != 0)
        return;
    long e = __ml_sys_raw(SYS_fchown, mlp_proc->fd, (long)uid, -1, 0, 0, 0);
    if (e < 0)
        mlp_log(1, "memlan stat entry: not handed to uid %u (%s): after a drop it stays in the "
                   "fabric until root's `memlan clean`", (unsigned)uid, strerror((int)-e));
}

void mlp_stat_clear(struct mlp_sock *s)
{
    if (s->slot >= 0 && mlp_proc_conns)
        ml_store_release(&mlp_proc_conns[s->slot].state, ML_CONN_FREE);
    s->slot = -1;
}

/* A connection that stays on TCP: log it and show it in memlan stat until it closes.  Plain TCP
 * fds are not in our table, so their slot is found again by fd at close (mlp_stat_tcp_closed). */
static void mlp_stat_tcp_addrs(int fd, const struct mlp_addr *l, const struct mlp_addr *r,
                               const char *why)
{
    char ls[64] = "?", rs[64] = "?";
    if (l)
        mlp_addr_str(l, ls, sizeof ls);
    if (r)
        mlp_addr_str(r, rs, sizeof rs);
    mlp_log(1, "fd %d %s -> %s: TCP (%s)", fd, ls, rs, why);
    if (mlp_sig_in_handler()) /* the entry's lock and its first creation: not there */
        return;
    int slot = mlp_proc_slot();
    if (slot < 0)
        return;
    mlp_slot_fill(slot, ML_CONN_TCP, fd, l, r, NULL, why);
    struct mlp_fdrec *rec = mlp_fdrec_make(fd);
    if (rec) {
        int old = atomic_exchange(&rec->tcp_slot, slot + 1);
        if (old > 0 && mlp_proc_conns)
            ml_store_release(&mlp_proc_conns[old - 1].state, ML_CONN_FREE);
    }
}

void mlp_stat_tcp(int fd, const char *why) { mlp_stat_tcp_addrs(fd, NULL, NULL, why); }

void mlp_stat_tcp_closed(int fd);
void mlp_stat_tcp_closed(int fd)
{
    struct mlp_fdrec *rec = mlp_fdrec(fd);
    if (rec && ml_load_relaxed(&rec->tcp_pending))
        ml_store_relaxed(&rec->tcp_pending, 0);
    if (!rec || !ml_load_relaxed(&rec->tcp_slot))
        return;
    int slot = atomic_exchange(&rec->tcp_slot, 0) - 1;
    if (slot >= 0 && mlp_proc_conns)
        ml_store_release(&mlp_proc_conns[slot].state, ML_CONN_FREE);
}

void mlp_stat_conn(struct mlp_sock *s, int fd, const char *why)
{
    if (s->slot < 0 || !mlp_proc_conns)
        return;
    struct ml_proc_conn *c = &mlp_proc_conns[s->slot];
    int st = s->state;
    if (st == MLP_ACCEL && s->side == 1)
        why = ML_CONN_ACCEPTED; /* memlan stat: which ring is our send ring */
    snprintf(c->why, sizeof c->why, "%s", why ? why : "");
    c->fd = fd;
    ml_store_release(&c->state, st == MLP_ACCEL ? ML_CONN_ACCEL
                                : st == MLP_TCP ? ML_CONN_TCP : ML_CONN_WAIT);
    if (st == MLP_ACCEL)
        atomic_fetch_add(&mlp_proc_hdr->accel_total, 1);
    else if (st == MLP_TCP)
        atomic_fetch_add(&mlp_proc_hdr->tcp_total, 1);
}

/* ---- ring sizes -------------------------------------------------------------------------- */

/*
 * SO_RCVBUF and SO_SNDBUF size the rings.  What the program set on a socket (the kernel's value,
 * which is doubled and capped by net.core.[rw]mem_max) is noted per fd; a listener publishes its
 * largest in its record, and a client's channel gets rings of the largest of its own and the
 * listener's, rounded up to a power of two (4 KB to 64 MB).  Without either, MEMLAN_RING_KB.
 * Set after the connection is accelerated, they reach only the kernel socket.
 */
/* [0] SO_SNDBUF, [1] SO_RCVBUF, as set: in the fd's record (struct mlp_fdrec). */

static void mlp_ring_hint_publish(struct ml_listen_rec *m, uint32_t v);
static void mlp_listener_bufsize(int fd, uint32_t v);

static uint32_t mlp_bufhint_of(int fd)
{
    struct mlp_fdrec *rec = mlp_fdrec(fd);
    if (!rec)
        return 0;
    uint32_t a = ml_load_relaxed(&rec->bufhint[0]), b = ml_load_relaxed(&rec->bufhint[1]);
    return a > b ? a : b;
}

void mlp_note_bufsize(int fd, int name)
{
    struct mlp_fdrec *rec = mlp_fdrec_make(fd);
    if (!rec)
        return;
    int rcv = name == SO_RCVBUF || name == SO_RCVBUFFORCE;
    int v = 0;
    socklen_t l = sizeof v;
    if (mlp_real_getsockopt(fd, SOL_SOCKET, rcv ? SO_RCVBUF : SO_SNDBUF, &v, &l) < 0 || v <= 0)
        return;
    ml_store_relaxed(&rec->bufhint[rcv], (uint32_t)v);
    mlp_listener_bufsize(fd, mlp_bufhint_of(fd));
}

/* SO_LINGER with a zero time set before the connection exists (on the socket, or on the listener
 * whose accepted sockets inherit it, as the kernel's do). */

void mlp_note_linger(int fd, const void *val, socklen_t len)
{
    if (len < sizeof(struct linger))
        return;
    const struct linger *lg = val;
    uint8_t on = lg->l_onoff && lg->l_linger == 0;
    struct mlp_fdrec *rec = on ? mlp_fdrec_make(fd) : mlp_fdrec(fd);
    if (rec)
        ml_store_relaxed(&rec->linger0, on);
}

/* SO_RCVLOWAT as the kernel takes it (sock_setsockopt): a negative value is INT_MAX, 0 is 1. */
uint32_t mlp_lowat_value(const void *val)
{
    int v;
    memcpy(&v, val, sizeof v);
    return v < 0 ? (uint32_t)INT_MAX : v == 0 ? 1u : (uint32_t)v;
}

/* SO_RCVLOWAT set on an fd, kept for the channel it may get (the socket's, or those accepted from
 * a listener, which inherit it as the kernel's do); an accelerated socket's own is its channel's
 * (sock.c, mlp_setsockopt). */
/* Some socket of this process image may carry a mark above 1: set by setsockopt here, or found
 * on a socket carried across exec.  Until then a new channel's mark is 1 without a look at the
 * kernel: the accept path made no getsockopt before, and a sandbox that kills for it (vsftpd's
 * post-login child) must not meet one there for a mark nobody set. */
static _Atomic bool mlp_lowat_seen;

void mlp_lowat_inherited(int fd)
{
    int v = 0;
    socklen_t l = sizeof v;
    if (mlp_real_getsockopt(fd, SOL_SOCKET, SO_RCVLOWAT, &v, &l) == 0 && v > 1)
        ml_store_relaxed(&mlp_lowat_seen, true);
}

void mlp_note_lowat(int fd, const void *val, socklen_t len)
{
    if (len < sizeof(int))
        return;
    uint32_t v = mlp_lowat_value(val);
    if (v > 1 && !ml_load_relaxed(&mlp_lowat_seen))
        ml_store_relaxed(&mlp_lowat_seen, true);
    struct mlp_fdrec *rec = v > 1 ? mlp_fdrec_make(fd) : mlp_fdrec(fd);
    if (rec)
        ml_store_relaxed(&rec->rcvlowat, v > 1 ? v : 0u);
}

/* The mark a new channel starts with: the kernel socket's own (setsockopt passes it to the
 * kernel too, and an accepted socket's is the listener's as the kernel copied it).  Asked, not
 * taken from the fd's record: a record whose fd was closed behind our back (fclose's internal
 * close) gave its mark to the next socket on that number, which then waited for bytes kernel
 * TCP never asked for, and a record knows nothing of a dup or of a mark set on a listener by
 * another process after a fork (a review found each).  The record is the fall-back where the
 * kernel will not say. */
static uint32_t mlp_lowat_of(int fd)
{
    if (!ml_load_relaxed(&mlp_lowat_seen))
        return 0;
    int v = 0;
    socklen_t l = sizeof v;
    if (mlp_real_getsockopt(fd, SOL_SOCKET, SO_RCVLOWAT, &v, &l) == 0)
        return v > 1 ? (uint32_t)v : 0u;
    struct mlp_fdrec *rec = mlp_fdrec(fd);
    return rec ? ml_load_relaxed(&rec->rcvlowat) : 0u;
}

/* Some socket of this process image was given SO_ZEROCOPY: from then on a connect asks the
 * kernel whether its socket has it (one getsockopt; never before, for a sandbox that kills for
 * it).  The flag is the socket's, not the fd number's: a dup, or the socket passed on, keeps it
 * (a note kept per fd number lost it, and the connection was accelerated with the kernel's flag
 * on: a review).  A socket given it in an earlier image, before an exec, is not seen. */
static _Atomic bool mlp_zerocopy_seen;

static bool mlp_zerocopy_on(int fd)
{
    if (!atomic_load_explicit(&mlp_zerocopy_seen, memory_order_relaxed))
        return false;
    int v = 0, saved = errno;
    socklen_t l = sizeof v;
    bool on = mlp_real_getsockopt(fd, SOL_SOCKET, SO_ZEROCOPY, &v, &l) == 0 && v > 0;
    errno = saved;
    return on;
}

static uint32_t mlp_linger_flag(int fd)
{
    struct mlp_fdrec *rec = mlp_fdrec(fd);
    return rec && ml_load_relaxed(&rec->linger0) ? ML_SOCK_LINGER0 : 0u;
}

void mlp_bufhint_clear(int fd)
{
    struct mlp_fdrec *rec = mlp_fdrec(fd);
    if (!rec)
        return;
    if (ml_load_relaxed(&rec->linger0))
        ml_store_relaxed(&rec->linger0, (uint8_t)0);
    if (ml_load_relaxed(&rec->received))
        ml_store_relaxed(&rec->received, (uint8_t)0);
    if (ml_load_relaxed(&rec->rcvlowat))
        ml_store_relaxed(&rec->rcvlowat, 0u);
    if (ml_load_relaxed(&rec->bufhint[0]) || ml_load_relaxed(&rec->bufhint[1])) {
        ml_store_relaxed(&rec->bufhint[0], 0u);
        ml_store_relaxed(&rec->bufhint[1], 0u);
    }
}

static void mlp_ring_hint_publish(struct ml_listen_rec *m, uint32_t v)
{
    uint32_t cur = ml_load_relaxed(&m->ring_hint);
    while (v > cur && !atomic_compare_exchange_weak(&m->ring_hint, &cur, v))
        ;
}

static size_t mlp_ring_size(int fd, uint32_t listener_hint)
{
    uint64_t want = mlp_bufhint_of(fd);
    /* The record is peer-writable, in a shared fabric by every member: a hint sizes our file on
     * the fabric's tmpfs, so another member's is believed up to 4 MiB only (a member wrote 64 MiB
     * and made every client of the port allocate 128 MiB a connection). */
    uint32_t cap = mlp_fab && mlp_fab->shared ? (4u << 20) : (64u << 20);
    if (listener_hint > want && listener_hint <= cap)
        want = listener_hint;
    if (!want)
        return mlp_cfg.ring_size;
    if (want > (64u << 20))
        want = 64u << 20;
    size_t rs = 4096;
    while (rs < want)
        rs <<= 1;
    return rs;
}

/* The region a full ring grows into (docs/design.md, "Rings grow"): MEMLAN_RING_GROW_KB, but
 * none where the ring's size came from SO_SNDBUF/SO_RCVBUF (ours or the listener's), as the
 * kernel stops autotuning a buffer the program sized. */
static size_t mlp_ring_grow(int fd, uint32_t listener_hint)
{
    return mlp_bufhint_of(fd) || listener_hint ? 0 : mlp_cfg.ring_grow;
}

/*
 * How much of an offer's ring and region a client may fill before its server attaches
 * (__ml_chan_offer_limit): what a withdrawal then sends over TCP at once, and so no more than
 * the kernel's buffers take before an accept.  They take about tcp_wmem's maximum there (the
 * socket's send buffer; 4 MiB by default: 4,196,352 bytes to a nonblocking client, 3 MiB at
 * once to a blocking one, measured); half of it, read once from /proc; 0 where that is
 * unreadable (a container's or a sandbox's /proc, a chroot): the caller takes the ring alone,
 * as before rings grew.
 */
static uint64_t mlp_offer_takes(void)
{
    static _Atomic int64_t known = -1;
    int64_t v = atomic_load_explicit(&known, memory_order_relaxed);
    if (v < 0) {
        char b[64] = {0};
        v = 0;
        if (!mlp_sandboxed()) {
            long f = __ml_sys_open(AT_FDCWD, "/proc/sys/net/ipv4/tcp_wmem", O_RDONLY, 0);
            if (f >= 0) {
                long min = 0, def = 0, max = 0;
                if (__ml_sys_read((int)f, b, sizeof b - 1) > 0 &&
                    sscanf(b, "%ld %ld %ld", &min, &def, &max) == 3 && max > 0)
                    v = max / 2;
                __ml_sys_close((int)f);
            }
        }
        atomic_store_explicit(&known, v, memory_order_relaxed);
    }
    return (uint64_t)v;
}

/* ---- listener records -------------------------------------------------------------------- */

struct mlp_lrec {
    struct mlp_lrec *next;    /* records of other namespaces: a list (ours: mlp_lrecs[port]) */
    char netns[24];           /* the listeners' namespace */
    int port;
    int lock_fd;              /* holds our read lock while we listen on the port, else -1 */
    int nlisten;              /* our listening sockets on the port */
    int check_fd;             /* for clients: a separate open file, whose GETLK sees our own lock */
    struct ml_listen_rec *map;
    ino_t ino;
    ino_t vouched_ino;        /* a shared fabric's record owned by another user, whose owner the */
    uid_t vouched_uid;        /* kernel confirmed (mlp_lrec_access); 0: not yet */
    struct mlp_addr vouched_at; /* ... for the server at this address and port only: another
                               * member listening first on another address of the port made the
                               * record, was vouched for there, and was believed for the real
                               * server's address too */
    unsigned misses;          /* acceptor: waits in a row that ended with no offer (see
                               * mlp_on_accept: pending is peer-writable) */
    int cred_pid;             /* the process that set ML_NO_OFFER_CRED in the record through
                               * this mapping (its accept out of reach, or its exec out of reach
                               * that keeps a listener), 0: none; relaxed atomics (an accept
                               * writes it unlocked) */
    bool no_offer_said;       /* "clients will not offer" was logged (an accept out of reach) */
    ino_t granted_ino;        /* the record file in whose ACL we last named granted_uid */
    uid_t granted_uid;
    int lock_pid;             /* the process that took lock_fd's lock (a fork child shares it) */
};
static struct mlp_lrec *mlp_lrecs[65536];
static void mlp_neg_deferred_run(void); /* under mlp_neg_mu: what signal handlers left */
static bool mlp_neg_lock_handler(void);
static void mlp_neg_defer_add(uintptr_t w);
#define MLP_WAIT_MISSES 4u
#define MLP_SHORT_WAIT_NS 2000000u /* 2 ms */
/* Found through la- names: other namespaces' listeners, newest first.  An entry goes when its
 * record is found dead (its namespace's listener gone) and the oldest when there are more than
 * MLP_XRECS_MAX: each holds a descriptor and a mapping, and a client that outlived many
 * namespaces' servers kept one of each per dead record, for ever. */
static struct mlp_lrec *mlp_xrecs;
#define MLP_XRECS_MAX 64
static bool mlp_lrec_live(int fd);
static bool mlp_groupwide(void);
static int mlp_lrec_grant_one(struct mlp_lrec *r, uid_t uid);

/*
 * Record mappings in use by clients.  A client looks a record up again when its listeners are
 * gone (a restarted server makes a new record file), and the record's mapping it had may still
 * be in use: by a thread between connect_start and connect_done (its pending count) or by an
 * undecided socket (s->lmap).  Each such use holds the mapping; a mapping that a record no
 * longer names is retired, and unmapped when its last hold goes, so a client keeps one mapping
 * per record plus those in use (it used to keep one per listener restart, for ever).
 * mlp_neg_mu.
 */
struct mlp_lmap {
    struct mlp_lmap *next;
    struct ml_listen_rec *map;
    int users;
    bool retired;
};
static struct mlp_lmap *mlp_lmaps;

/* A listener record's mapping goes: out of the guard's table first (src/guard.c). */
static void mlp_lrec_unmap(struct ml_listen_rec *m)
{
    __ml_guard_del_at(m);
    __ml_sys_munmap(m, ML_PAGE);
}

static struct mlp_lmap **mlp_lmap_find(struct ml_listen_rec *m)
{
    struct mlp_lmap **pp = &mlp_lmaps;
    while (*pp && (*pp)->map != m)
        pp = &(*pp)->next;
    return pp;
}

/* Hold m (mlp_neg_mu held); false without memory (then the caller holds nothing). */
static bool mlp_lmap_hold_locked(struct ml_listen_rec *m)
{
    struct mlp_lmap **pp = mlp_lmap_find(m);
    if (!*pp) {
        struct mlp_lmap *e = calloc(1, sizeof *e);
        if (!e)
            return false;
        e->map = m;
        *pp = e;
    }
    (*pp)->users++;
    return true;
}

static void mlp_lmap_put_locked(struct ml_listen_rec *m)
{
    struct mlp_lmap **pp = mlp_lmap_find(m), *e = *pp;
    if (!e || --e->users > 0)
        return;
    *pp = e->next;
    if (e->retired)
        mlp_lrec_unmap(e->map);
    __ml_free(e);
}

bool mlp_lmap_hold(struct ml_listen_rec *m)
{
    pthread_mutex_lock(&mlp_neg_mu);
    bool ok = mlp_lmap_hold_locked(m);
    pthread_mutex_unlock(&mlp_neg_mu);
    return ok;
}

void mlp_lmap_put(struct ml_listen_rec *m)
{
    if (mlp_sig_in_handler()) {
        if (!mlp_neg_lock_handler()) { /* a close from a handler: see mlp_neg_defer */
            mlp_neg_defer_add((uintptr_t)m | 1);
            return;
        }
    } else {
        pthread_mutex_lock(&mlp_neg_mu);
    }
    mlp_lmap_put_locked(m);
    mlp_neg_deferred_run();
    pthread_mutex_unlock(&mlp_neg_mu);
}

/* A record stops naming m: unmap it now, or when its last hold goes.  mlp_neg_mu. */
static void mlp_lmap_retire(struct ml_listen_rec *m)
{
    if (!m)
        return;
    struct mlp_lmap *e = *mlp_lmap_find(m);
    if (e)
        e->retired = true;
    else
        mlp_lrec_unmap(m);
}

/*
 * TCP_DEFER_ACCEPT on a listener (Apache's default on Linux, nginx's "deferred", systemd's
 * DeferAcceptSec=): the kernel leaves a connection out of the accept queue until TCP data
 * arrives or its SYN-ACK retransmits run out (1 s at the least).  A memlan client sends nothing
 * over TCP, so its connection reached accept only after its MEMLAN_ACCEPT_WAIT_MS, 2 s, when it
 * gave up and sent its data over TCP: every connection 2 s late, and none accelerated.  Such a
 * port's record says not to offer (ML_NO_OFFER_DEFER), set when the option is seen: at the
 * publication (a kernel look, as the publication's own file calls do) and when the program sets
 * it on a published listener.  Cleared only when the program turns it off again on a listener
 * of the port (mlp_note_defer); else the record goes with its last listener.
 *
 * The kernel's value of the option on the listener: set, the record says mark (if it says
 * nothing else).  1: set, 0: not set, -1: unknown (no record, or the kernel did not say). */
static int mlp_listener_opt(struct mlp_sock *s, int fd, int level, int name, uint32_t mark,
                            const char *what)
{
    int v = 0;
    socklen_t l = sizeof v;
    if (!s->rec || !s->rec->map || mlp_real_getsockopt(fd, level, name, &v, &l) < 0)
        return -1;
    if (v <= 0)
        return 0;
    uint32_t none = 0;
    if (atomic_compare_exchange_strong(&s->rec->map->no_offer, &none, mark))
        mlp_log(1, "listen fd %d port %d: %s", fd, s->port, what);
    return 1;
}

static int mlp_listener_defer(struct mlp_sock *s, int fd)
{
    return mlp_listener_opt(s, fd, IPPROTO_TCP, TCP_DEFER_ACCEPT, ML_NO_OFFER_DEFER,
                            "TCP_DEFER_ACCEPT set: clients will not offer (the kernel holds a "
                            "connection from accept until TCP data comes)");
}

/* TCP_DEFER_ACCEPT set on a published listener: marked as above; turned off again (the
 * kernel's value 0 now), the mark goes, if it is the mark there.  pgbouncer sets it and then
 * clears it at every RELOAD when told tcp_defer_accept = 0: its clients stayed on TCP for good
 * after the first (an explorer).  Another process's listener of the port (SO_REUSEPORT) that
 * still defers is not seen: its clients then offer, and wait for its accept. */
void mlp_note_defer(int fd)
{
    struct mlp_sock *s = mlp_get(fd);
    if (s) {
        if (s->type == MLP_LISTENER) {
            int saved = errno;
            uint32_t was = ML_NO_OFFER_DEFER;
            if (mlp_listener_defer(s, fd) == 0 &&
                atomic_compare_exchange_strong(&s->rec->map->no_offer, &was, 0u))
                mlp_log(1, "listen fd %d port %d: TCP_DEFER_ACCEPT cleared: clients offer again",
                        fd, s->port);
            errno = saved;
        }
        mlp_put(s);
    }
}

/* SO_RCVBUF/SO_SNDBUF set on a listening socket: published for the clients to come. */
static void mlp_listener_bufsize(int fd, uint32_t v)
{
    struct mlp_sock *s = mlp_get(fd);
    if (s) {
        if (s->type == MLP_LISTENER && s->rec && s->rec->map)
            mlp_ring_hint_publish(s->rec->map, v);
        mlp_put(s);
    }
}

static void mlp_lrec_name(char *buf, size_t len, const char *netns, int port)
{
    snprintf(buf, len, "ls-%s-%d", netns, port);
}

/* Open (creating when create) the record file, map it; -errno. */
static int mlp_lrec_open(const char *netns, int port, bool create, int *fdp,
                         struct ml_listen_rec **mapp, ino_t *ino)
{
    memlan_fabric_t *fab = mlp_fabric();
    if (!fab)
        return -ENOENT;
    char name[64];
    mlp_lrec_name(name, sizeof name, netns, port);
    for (int tries = 0; tries < 8; tries++) {
        long fd = __ml_sys_open(fab->dirfd, name, O_RDWR | O_NOFOLLOW | (create ? O_CREAT : 0),
                                fab->shared ? 0666 : 0600);
        if (fd < 0)
            return (int)fd;
        struct stat st;
        if (create) {
            struct flock fl = {.l_type = F_RDLCK, .l_whence = SEEK_SET, .l_start = 0, .l_len = 1};
            if (__ml_sys_fcntl((int)fd, F_OFD_SETLK, (long)&fl) < 0) {
                __ml_sys_close((int)fd); /* a reclaimer holds the write lock: it is removing it */
                continue;
            }
            if (fab->shared)
                (void)__ml_sys_fchmod((int)fd, 0666);
        }
        if (__ml_sys_fstat((int)fd, &st) < 0 || st.st_nlink == 0 || !S_ISREG(st.st_mode)) {
            __ml_sys_close((int)fd);
            if (!create)
                return -ENOENT;
            continue;
        }
        /* Reserved, not sparse: a full fabric must fail here, not fault on first touch. */
        if (st.st_size < ML_PAGE || create) {
            if (!create || __ml_sys_fallocate((int)fd, 0, ML_PAGE) < 0) {
                __ml_sys_close((int)fd);
                return -ENOENT;
            }
        }
        /* A listener maps the record through a second open file: the read lock is on the
         * first, and a mapping keeps its open file (and any lock on it) alive, so the lock would
         * outlive the listener's close and the record the last listener. */
        long mfd = fd;
        if (create) {
            struct stat st2;
            mfd = __ml_sys_open(fab->dirfd, name, O_RDWR | O_NOFOLLOW, 0);
            if (mfd >= 0 && (__ml_sys_fstat((int)mfd, &st2) < 0 || st2.st_ino != st.st_ino ||
                             st2.st_dev != st.st_dev)) {
                __ml_sys_close((int)mfd);
                mfd = -ESTALE;
            }
            if (mfd < 0) {
                __ml_sys_close((int)fd);
                if (mfd == -ESTALE || mfd == -ENOENT)
                    continue; /* removed and created again meanwhile */
                return (int)mfd;
            }
        }
        void *p;
        int r = __ml_sys_mmap(&p, NULL, ML_PAGE, PROT_READ | PROT_WRITE, MAP_SHARED, (int)mfd, 0);
        if (mfd != fd)
            __ml_sys_close((int)mfd);
        if (r < 0) {
            __ml_sys_close((int)fd);
            return r;
        }
        __ml_guard_add(p, ML_PAGE); /* shrunk by anyone: zeros, no SIGBUS (src/guard.c) */
        struct ml_listen_rec *m = p;
        if (create && m->magic != ML_LREC_MAGIC) {
            m->version = ML_LAYOUT_VERSION;
            m->port = (uint32_t)port;
            m->magic = ML_LREC_MAGIC;
        }
        int cfd = (int)fd;
        mlp_own_fd(&cfd, true);
        *fdp = cfd;
        *mapp = m;
        *ino = st.st_ino;
        return 0;
    }
    return -EAGAIN;
}

/* Does some process hold a read lock on the record (a memlan listener lives)? */
static bool mlp_lrec_live(int fd)
{
    struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = 0, .l_len = 1};
    if (__ml_sys_fcntl(fd, F_OFD_GETLK, (long)&fl) < 0)
        return false;
    return fl.l_type != F_UNLCK;
}

/* Forget an entry of mlp_xrecs: its descriptor closed, its mapping retired (unmapped when the
 * last connect or undecided socket using it lets go).  mlp_neg_mu. */
static void mlp_xrec_drop(struct mlp_lrec *r)
{
    for (struct mlp_lrec **pp = &mlp_xrecs; *pp; pp = &(*pp)->next)
        if (*pp == r) {
            *pp = r->next;
            break;
        }
    if (r->check_fd >= 0) {
        mlp_disown_fd(r->check_fd);
        __ml_sys_close(r->check_fd);
    }
    mlp_lmap_retire(r->map);
    __ml_free(r);
}

/* Our entry for port is for the namespace netns; one made in another namespace of ours (before
 * an unshare or setns) is taken over when nothing listens through it, else false.  mlp_neg_mu. */
static bool mlp_lrec_rekey(struct mlp_lrec *r, const char *netns)
{
    if (strcmp(r->netns, netns) == 0)
        return true;
    if (r->nlisten > 0)
        return false;
    snprintf(r->netns, sizeof r->netns, "%s", netns);
    if (r->check_fd >= 0) { /* it watches the other namespace's record */
        mlp_disown_fd(r->check_fd);
        __ml_sys_close(r->check_fd);
        r->check_fd = -1;
    }
    return true;
}

/* Client: the live record for port in namespace netns (ours, or one an la- name led to), or
 * NULL; with *held, its mapping, held for the caller (mlp_lmap_put), or NULL. */
static struct mlp_lrec *mlp_lrec_find(const char *netns, int port, struct ml_listen_rec **held)
{
    *held = NULL;
    char cur[24];
    mlp_netns(cur);
    bool ours = strcmp(netns, cur) == 0;
    pthread_mutex_lock(&mlp_neg_mu);
    mlp_neg_deferred_run();
    struct mlp_lrec *r = NULL, *x = NULL;
    if (ours) {
        r = mlp_lrecs[port];
        if (r && !mlp_lrec_rekey(r, netns)) {
            pthread_mutex_unlock(&mlp_neg_mu);
            return NULL; /* our own listener on the port, in the namespace we left */
        }
    } else {
        for (r = mlp_xrecs; r && (r->port != port || strcmp(r->netns, netns) != 0); r = r->next)
            ;
        x = r;
    }
    for (int pass = 0; pass < 2; pass++) {
        if (r && r->check_fd >= 0 && mlp_lrec_live(r->check_fd))
            break;
        if (pass == 1) {
            r = NULL;
            break;
        }
        /* No record yet, or ours went stale (the listeners left and it may have been removed
         * and created again): look the name up afresh. */
        int fd;
        struct ml_listen_rec *m;
        ino_t ino;
        if (mlp_lrec_open(netns, port, false, &fd, &m, &ino) < 0) {
            r = NULL;
            break;
        }
        if (!r) {
            r = calloc(1, sizeof *r);
            if (!r) {
                mlp_disown_fd(fd);
                __ml_sys_close(fd);
                mlp_lrec_unmap(m);
                break;
            }
            snprintf(r->netns, sizeof r->netns, "%s", netns);
            r->port = port;
            r->lock_fd = -1;
            r->check_fd = -1;
            if (ours) {
                mlp_lrecs[port] = r;
            } else {
                /* Room for it: the entries whose records are dead go (one lock probe each,
                 * only when an entry is added), then the oldest beyond the bound. */
                int n = 0;
                struct mlp_lrec *last = NULL, *next;
                for (struct mlp_lrec *e = mlp_xrecs; e; e = next) {
                    next = e->next;
                    if (e->check_fd < 0 || !mlp_lrec_live(e->check_fd)) {
                        mlp_xrec_drop(e);
                        continue;
                    }
                    n++;
                    last = e;
                }
                if (n >= MLP_XRECS_MAX && last)
                    mlp_xrec_drop(last);
                r->next = mlp_xrecs;
                mlp_xrecs = r;
                x = r;
            }
        }
        if (r->check_fd >= 0) {
            mlp_disown_fd(r->check_fd);
            __ml_sys_close(r->check_fd);
        }
        r->check_fd = fd;
        /* The old mapping may still be in use (a thread between connect_start and connect_done
         * counts itself out through it): retired, unmapped when its last hold goes. */
        if (r->nlisten == 0 && r->map != m) {
            mlp_lmap_retire(r->map);
            r->map = m;
        } else if (r->map != m) {
            mlp_lrec_unmap(m); /* our own listener's record: we keep its mapping */
        }
        r->ino = ino;
    }
    if (!r && x)
        mlp_xrec_drop(x); /* that namespace's listeners are gone, and with them its record */
    if (r && r->map && !mlp_lmap_hold_locked(r->map))
        r = NULL;
    if (r)
        *held = r->map;
    pthread_mutex_unlock(&mlp_neg_mu);
    return r;
}

/*
 * Address records: la-ADDR (ADDR as in offer names, with the port) is a symbolic link to the
 * record ls-NETNS-PORT of the namespace whose listener is reachable at that address, so that a
 * client in another namespace sharing the fabric finds it by the address it connects to.  The
 * first live one wins: a second namespace with the same address (an address plan used twice)
 * does not take it over, and its clients' offers to the first could never be taken (the MAC in
 * their names is not the one the first's acceptor sees).  Ours go when our namespace's record
 * does; a dead namespace's link is replaced, or removed by the fabric's sweep.
 */
struct mlp_alink {
    struct mlp_alink *next;
    int port;
    char name[64];
};
static struct mlp_alink *mlp_alinks; /* the la- names we made or found ours; mlp_neg_mu */

static bool mlp_lrec_name_ok(const char *t, char *netns, size_t nslen, int port)
{
    if (strncmp(t, "ls-", 3) != 0)
        return false;
    const char *dash = strchr(t + 3, '-');
    size_t n = dash ? (size_t)(dash - (t + 3)) : 0;
    if (n == 0 || n >= nslen || strspn(t + 3, "0123456789abcdef") != n)
        return false;
    char pb[12];
    snprintf(pb, sizeof pb, "%d", port);
    if (strcmp(dash + 1, pb) != 0)
        return false;
    memcpy(netns, t + 3, n);
    netns[n] = 0;
    return true;
}

static bool mlp_lrec_name_live(const char *name)
{
    long fd = __ml_sys_open(mlp_fab->dirfd, name, O_RDWR | O_NOFOLLOW, 0);
    if (fd < 0)
        return false;
    bool live = mlp_lrec_live((int)fd);
    __ml_sys_close((int)fd);
    return live;
}

static void mlp_addr_link(const struct mlp_addr *a, const char *target)
{
    char name[64], hx[48], as[64];
    mlp_addr_hex(a, hx, sizeof hx);
    snprintf(name, sizeof name, "la-%s", hx);
    mlp_addr_str(a, as, sizeof as);
    for (int tries = 0; tries < 4; tries++) {
        char cur[64];
        bool mine = symlinkat(target, mlp_fab->dirfd, name) == 0;
        if (!mine) {
            if (errno != EEXIST)
                return mlp_log(0, "%s: no address record (%s): other namespaces will not find "
                                  "this listener", as, strerror(errno));
            ssize_t n = readlinkat(mlp_fab->dirfd, name, cur, sizeof cur - 1);
            if (n < 0)
                continue; /* removed meanwhile */
            cur[n] = 0;
            if (strcmp(cur, target) != 0) {
                if (mlp_lrec_name_live(cur))
                    return mlp_log(0, "%s: already published by another namespace's listener "
                                      "(%s): connections to it from other namespaces stay "
                                      "theirs", as, cur);
                (void)unlinkat(mlp_fab->dirfd, name, 0); /* its namespace's listeners are gone */
                continue;
            }
        }
        pthread_mutex_lock(&mlp_neg_mu);
        struct mlp_alink *l;
        for (l = mlp_alinks; l && strcmp(l->name, name) != 0; l = l->next)
            ;
        if (!l && (l = calloc(1, sizeof *l))) {
            l->port = a->port;
            snprintf(l->name, sizeof l->name, "%s", name);
            l->next = mlp_alinks;
            mlp_alinks = l;
        }
        pthread_mutex_unlock(&mlp_neg_mu);
        if (mine)
            mlp_log(1, "%s: address record published for other namespaces", as);
        return;
    }
}

/* A listening socket's addresses other namespaces may reach it at: its own, or for a wildcard
 * every non-loopback address of our namespace (of its family; IPv4 too on a dual-stack one). */
static void mlp_addr_links(int fd, const struct mlp_addr *a)
{
    char target[64], cur[24];
    mlp_netns(cur);
    mlp_lrec_name(target, sizeof target, cur, a->port);
    if (!mlp_addr_wild(a))
        return mlp_addr_link(a, target);
    int v6only = 0;
    socklen_t l = sizeof v6only;
    if (!a->v4)
        (void)mlp_real_getsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &v6only, &l);
    struct ifaddrs *ifs;
    if (getifaddrs(&ifs) < 0)
        return;
    for (struct ifaddrs *i = ifs; i; i = i->ifa_next) {
        if (!i->ifa_addr || (i->ifa_flags & IFF_LOOPBACK))
            continue;
        int fam = i->ifa_addr->sa_family;
        if (!(fam == AF_INET && (a->v4 || !v6only)) && !(fam == AF_INET6 && !a->v4))
            continue;
        struct mlp_addr x;
        if (!mlp_addr_of(i->ifa_addr, fam == AF_INET ? sizeof(struct sockaddr_in)
                                                     : sizeof(struct sockaddr_in6), &x))
            continue;
        if (mlp_addr_loopback(&x) || (!x.v4 && x.a[0] == 0xfe && (x.a[1] & 0xc0) == 0x80))
            continue; /* link-local IPv6: the same on many links, and scoped */
        x.port = a->port;
        mlp_addr_link(&x, target);
    }
    freeifaddrs(ifs);
}

/* Our namespace's record for port is gone: so are the address records we made for it.  Under
 * mlp_neg_mu. */
static void mlp_addr_links_drop(int port, const char *target)
{
    for (struct mlp_alink **pl = &mlp_alinks; *pl;) {
        struct mlp_alink *l = *pl;
        if (l->port != port) {
            pl = &l->next;
            continue;
        }
        char cur[64];
        ssize_t n = readlinkat(mlp_fab->dirfd, l->name, cur, sizeof cur - 1);
        if (n > 0 && (cur[n] = 0, strcmp(cur, target) == 0))
            (void)unlinkat(mlp_fab->dirfd, l->name, 0);
        *pl = l->next;
        __ml_free(l);
    }
}

/* Client: the namespace whose listener is reachable at a (an la- name), into netns; false when
 * no namespace published it. */
static bool mlp_addr_netns(const struct mlp_addr *a, char *netns, size_t nslen)
{
    char name[64], hx[48], cur[64];
    mlp_addr_hex(a, hx, sizeof hx);
    snprintf(name, sizeof name, "la-%s", hx);
    ssize_t n = readlinkat(mlp_fab->dirfd, name, cur, sizeof cur - 1);
    if (n <= 0)
        return false;
    cur[n] = 0;
    return mlp_lrec_name_ok(cur, netns, nslen, a->port);
}

/*
 * A record whose listeners all died without closing (exit(), a crash, SIGKILL: tinyproxy and
 * `squid -N` stop so) outlives them: the last close that removes it never came.  Taken over as
 * it was by the next listener, what it says of them (no_offer: a credential change, a
 * TCP_DEFER_ACCEPT; the ring hint; groupwide) kept every client of the port on TCP after a
 * restart, until a `memlan clean`.  Its lock alone cannot tell: a live listener need not hold
 * it (haproxy's re-executed master receives its listeners over SCM_RIGHTS while the old,
 * chrooted worker serves them; a record removed there lost what vouched for the live one).  So
 * the record names the listening sockets published in it (lsock, by inode), and the kernel says
 * which still listen: a record is dead when nobody holds its lock, it names sockets, ours is not
 * one of them, and none of them is a listening socket on the port in our namespace (a
 * sock_diag dump of TCP's listeners, both families).  A record whose slots cannot tell
 * (lsock_full) is dead when nothing but our socket listens on the port at all.  Anything unknown
 * (an older record that names none, a sandboxed process, a dump refused) keeps the record.
 */
static bool mlp_unconfined(void);

/* Is the calling thread in the network namespace netns (our records' name for it)?  The kernel's
 * dump answers for the thread's namespace, and mlp_netns is the process's view of it: another
 * thread's setns or unshare may have moved one and not yet the other. */
static bool mlp_thread_in_netns(const char *netns)
{
    struct stat st;
    char me[24];
    if (__ml_sys_fstatat(AT_FDCWD, "/proc/thread-self/ns/net", &st, 0) < 0)
        return false;
    snprintf(me, sizeof me, "%llx", (unsigned long long)st.st_ino);
    return strcmp(me, netns) == 0;
}

/* Before this process's first listener on port publishes (mlp_neg_mu): the record, if its
 * listeners are all dead (above), is removed, so that ours is made afresh.  my_ino: the inode of
 * the socket we publish. */
static void mlp_lrec_reclaim_dead(int fd, const char *netns, int port, uint32_t my_ino)
{
    char name[64];
    if (mlp_known_confined())
        return; /* a sandbox: no call beyond the ones listen() makes anyway */
    mlp_lrec_name(name, sizeof name, netns, port);
    long rfd = __ml_sys_open(mlp_fab->dirfd, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC,
                             0);
    if (rfd < 0)
        return; /* none (the usual start), or not ours to read: nothing to do */
    struct ml_listen_rec m;
    struct stat st;
    bool named = false, dead = false;
    if (__ml_sys_fstat((int)rfd, &st) == 0 && S_ISREG(st.st_mode) &&
        (size_t)st.st_size >= sizeof m &&
        __ml_sys_read((int)rfd, &m, sizeof m) == (ssize_t)sizeof m &&
        m.magic == ML_LREC_MAGIC && !mlp_lrec_live((int)rfd)) {
        dead = true;
        for (unsigned i = 0; i < ML_LREC_LSOCKS; i++) {
            uint32_t v = m.lsock[i];
            named |= v != 0;
            if (v != 0 && v == my_ino)
                dead = false; /* our socket is theirs: passed or inherited, and alive */
        }
        named |= m.lsock_full != 0;
    }
    __ml_sys_close((int)rfd);
    if (!dead || !named || !mlp_thread_in_netns(netns) || !mlp_unconfined())
        return;
    uint32_t inos[ML_LREC_LSOCKS];
    bool listens[ML_LREC_LSOCKS];
    for (unsigned i = 0; i < ML_LREC_LSOCKS; i++)
        inos[i] = m.lsock[i];
    /* Slots that cannot tell (lsock_full: more listeners than they hold, or written by a member
     * of a shared fabric): dead only when nothing listens on the port, ours included (a socket
     * of ours that listens already was passed or inherited, and may be one the record named). */
    int n = m.lsock_full ? __ml_sys_tcp_listeners_but(port, 0)
                         : __ml_sys_tcp_listening(port, inos, ML_LREC_LSOCKS, listens);
    if (n < 0) {
        mlp_log(1, "listen fd %d port %d: its record names no listener of ours, and the kernel "
                   "could not say whether they live (%s): kept",
                fd, port, strerror(-n));
        return;
    }
    if (n == 0 && __ml_fabric_reclaim_name(mlp_fab, name) > 0)
        mlp_log(1, "listen fd %d port %d: the record its dead listeners left (none of their "
                   "sockets listens any more) removed",
                fd, port);
}

/* Our listening socket (inode ino) named in the record m, for mlp_lrec_reclaim_dead. */
static void mlp_lrec_note_socket(struct ml_listen_rec *m, const char *netns, int port,
                                 uint32_t ino)
{
    if (!m || ino == 0 || ml_load_relaxed(&m->lsock_full))
        return;
    for (int pass = 0; pass < 2; pass++) {
        for (unsigned i = 0; i < ML_LREC_LSOCKS; i++)
            if (ml_load_relaxed(&m->lsock[i]) == ino)
                return;
        for (unsigned i = 0; i < ML_LREC_LSOCKS; i++) {
            uint32_t z = 0;
            if (ml_load_relaxed(&m->lsock[i]) == 0 &&
                atomic_compare_exchange_strong(&m->lsock[i], &z, ino))
                return;
        }
        if (pass == 1 || mlp_known_confined() || !mlp_thread_in_netns(netns) ||
            !mlp_unconfined())
            break;
        /* None free: the slots of sockets that no longer listen on the port are cleared.  Read
         * before the dump: a socket is named once it listens (mlp_on_listened), so one named
         * in the snapshot and alive is in the dump, and a slot named anew meanwhile holds
         * another value, which the exchange below leaves. */
        uint32_t snap[ML_LREC_LSOCKS];
        bool listens[ML_LREC_LSOCKS];
        for (unsigned i = 0; i < ML_LREC_LSOCKS; i++)
            snap[i] = ml_load_acquire(&m->lsock[i]);
        if (__ml_sys_tcp_listening(port, snap, ML_LREC_LSOCKS, listens) < 0)
            break;
        for (unsigned i = 0; i < ML_LREC_LSOCKS; i++) {
            uint32_t v = snap[i];
            if (!listens[i])
                (void)atomic_compare_exchange_strong(&m->lsock[i], &v, 0u);
        }
    }
    ml_store_release(&m->lsock_full, 1u);
}

bool mlp_listen_carried;

int mlp_on_listen(int fd, bool before)
{
    if (mlp_cfg.off)
        return 0;
    struct sockaddr_storage ss;
    socklen_t l = sizeof ss;
    struct mlp_addr a;
    int type = 0, proto = 0;
    socklen_t tl = sizeof type;
    if (getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &tl) < 0 || type != SOCK_STREAM)
        return 0;
    tl = sizeof proto;
    if (getsockopt(fd, SOL_SOCKET, SO_PROTOCOL, &proto, &tl) < 0 || proto != IPPROTO_TCP)
        return 0;
    if (getsockname(fd, (struct sockaddr *)&ss, &l) < 0 ||
        !mlp_addr_of((struct sockaddr *)&ss, l, &a))
        return 0;
    if (before && a.port == 0)
        return 0; /* not bound yet: the kernel's listen picks the port, we publish after it */
    const char *why;
    if (!mlp_port_allowed(a.port, &why)) {
        mlp_log(1, "listen fd %d port %d: not published (%s)", fd, a.port, why);
        return 0;
    }
    if (!mlp_fabric())
        return 0;
    struct mlp_sock *old = mlp_get(fd);
    if (old) { /* listen() again, to change the backlog */
        mlp_put(old);
        return 0;
    }
    char cur[24];
    mlp_netns(cur);
    pthread_mutex_lock(&mlp_neg_mu);
    mlp_neg_deferred_run(); /* a listener a handler closed: its count first */
    struct mlp_lrec *r = mlp_lrecs[a.port];
    if (r && !mlp_lrec_rekey(r, cur)) {
        pthread_mutex_unlock(&mlp_neg_mu);
        mlp_log(1, "listen fd %d port %d: not published (this process listens on the port in "
                   "another network namespace too)", fd, a.port);
        return 0;
    }
    if (!r && (r = calloc(1, sizeof *r))) {
        snprintf(r->netns, sizeof r->netns, "%s", cur);
        r->port = a.port;
        r->lock_fd = -1;
        r->check_fd = -1;
        mlp_lrecs[a.port] = r;
    }
    int err = r ? 0 : -ENOMEM;
    struct stat sst;
    uint32_t sino = __ml_sys_fstat(fd, &sst) == 0 ? (uint32_t)sst.st_ino : 0;
    if (r && r->nlisten == 0) {
        int lfd;
        struct ml_listen_rec *m;
        ino_t ino;
        mlp_lrec_reclaim_dead(fd, cur, a.port, sino);
        err = mlp_lrec_open(cur, a.port, true, &lfd, &m, &ino);
        if (err == 0) {
            r->lock_fd = lfd;
            r->lock_pid = atomic_load(&mlp_pid);
            if (r->map != m)
                mlp_lmap_retire(r->map); /* a client's look-up of an earlier record */
            r->map = m;
            r->ino = ino;
            /* A shared fabric's record made by another user's listener: we accept too, so our
             * euid must be named in it (its owner's is, as the owner). */
            if (mlp_fab->shared)
                (void)mlp_lrec_grant_one(r, geteuid());
            if (mlp_fab->shared && mlp_groupwide())
                ml_store_release(&m->groupwide, 1u);
        }
    }
    if (err == 0) {
        r->nlisten++;
        if (!before) /* else once the kernel listens: mlp_on_listened */
            mlp_lrec_note_socket(r->map, cur, a.port, sino);
    }
    pthread_mutex_unlock(&mlp_neg_mu);
    if (err < 0) {
        mlp_log(0, "listen fd %d port %d: cannot publish (%s); its connections stay on TCP", fd,
                a.port, strerror(-err));
        return 1; /* said: listen() does not try (and say it) again after the kernel's call */
    }
    struct mlp_sock *s = mlp_sock_new(MLP_LISTENER);
    if (!s) {
        mlp_lrec_release(r);
        return 0;
    }
    s->port = a.port;
    s->rec = r;
    uint32_t hint = mlp_bufhint_of(fd);
    if (hint && r->map)
        mlp_ring_hint_publish(r->map, hint);
    (void)mlp_listener_defer(s, fd);
    mlp_install(fd, s);
    mlp_put(s);
    /* A listener carried across exec is published again by each image (Xvfb's `sh -c xkbcomp`
     * at every server reset: 254 of 324 lines of its log, an explorer): at level 2 then. */
    mlp_log(mlp_listen_carried ? 2 : 1, "listen fd %d port %d: %spublished in %s", fd, a.port,
            mlp_listen_carried ? "carried across exec, " : "", mlp_fab->path);
    if (!mlp_addr_loopback(&a))
        mlp_addr_links(fd, &a);
    return 0;
}

/* The kernel listens on fd, which mlp_on_listen published before it did: the socket is named in
 * its record now (mlp_lrec_note_socket: a slot is named only for a listening socket). */
void mlp_on_listened(int fd)
{
    struct mlp_sock *s = mlp_get(fd);
    if (!s)
        return;
    struct stat st;
    if (s->type == MLP_LISTENER && s->rec && __ml_sys_fstat(fd, &st) == 0) {
        pthread_mutex_lock(&mlp_neg_mu);
        if (s->rec->map && s->rec->nlisten > 0)
            mlp_lrec_note_socket(s->rec->map, s->rec->netns, s->port, (uint32_t)st.st_ino);
        pthread_mutex_unlock(&mlp_neg_mu);
    }
    mlp_put(s);
}

/*
 * Descriptors received over SCM_RIGHTS (recvmsg, recvmmsg) are marked in their per-fd records,
 * and a marked listening TCP socket is published at the process's next fork or the socket's
 * first accept (mlp_publish_received, mlp_accept_received), as if this process had called
 * listen() on it: haproxy's reload hands the old worker's listeners to the new master this way,
 * and the workers it forks accept on them; unpublished, their clients went over TCP.  The mark
 * is memory only, no system call and no lock: recvmsg is called by sandboxed processes (vsftpd's
 * child takes its data connections so, under a seccomp filter that kills for getsockopt) and
 * from signal handlers, and neither may meet a call or a lock of ours there.  It is cleared
 * wherever the fd is released, as the record's other fields are; a stale mark costs one look at
 * the next fork or accept.
 */
static _Atomic bool mlp_received_marks; /* some fd may carry the mark: look before a fork */
static void mlp_received_publish(int fd, const char *when);

/* Each descriptor an SCM_RIGHTS message carries (sent or received: the kernel has checked the
 * control messages, or the sender's will), read within msg_controllen however the headers say
 * otherwise. */
static void mlp_scm_rights_each_ctx(const struct msghdr *m, void (*each)(int fd, void *ctx),
                                    void *ctx)
{
    if (mlp_cfg.off || !m->msg_control || m->msg_controllen < sizeof(struct cmsghdr))
        return;
    const char *end = (const char *)m->msg_control + m->msg_controllen;
    for (struct cmsghdr *c = CMSG_FIRSTHDR(m); c; c = CMSG_NXTHDR((struct msghdr *)m, c)) {
        if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS ||
            c->cmsg_len < CMSG_LEN(0))
            continue;
        const unsigned char *data = CMSG_DATA(c);
        if ((const char *)data > end)
            break;
        size_t n = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        if (n > (size_t)(end - (const char *)data) / sizeof(int))
            n = (size_t)(end - (const char *)data) / sizeof(int);
        for (size_t i = 0; i < n; i++) {
            int fd;
            memcpy(&fd, data + i * sizeof fd, sizeof fd);
            each(fd, ctx);
        }
    }
}

static void mlp_mark_received_fd(int fd, void *ctx)
{
    (void)ctx;
    struct mlp_fdrec *rec = fd >= 0 ? mlp_fdrec_make(fd) : NULL;
    if (rec) {
        ml_store_relaxed(&rec->received, (uint8_t)MLP_RCV_NEW);
        atomic_store_explicit(&mlp_received_marks, true, memory_order_release);
    }
}

/* One descriptor marked so (the new image of a vfork child's exec: mlp_carry_received). */
void mlp_mark_received_one(int fd) { mlp_mark_received_fd(fd, NULL); }

void mlp_mark_received(const struct msghdr *m)
{
    mlp_scm_rights_each_ctx(m, mlp_mark_received_fd, NULL);
}

bool mlp_received_pending(void)
{
    return atomic_load_explicit(&mlp_received_marks, memory_order_acquire);
}

/* Before a fork: every marked listener is published by the parent, whose children inherit the
 * publication and accept (haproxy's new master receives the listeners as root, then forks the
 * workers, which drop to their user: a record a worker made would not be its socket's owner's,
 * and clients would refuse it).  A sandboxed process seldom forks; one that only forwards the
 * sockets without forking publishes nothing. */
void mlp_publish_received(void)
{
    if (!atomic_exchange_explicit(&mlp_received_marks, false, memory_order_acq_rel))
        return;
    int max = mlp_fd_max();
    for (int fd = mlp_fdrec_next(0, max); fd >= 0; fd = mlp_fdrec_next(fd + 1, max)) {
        struct mlp_fdrec *rec = mlp_fdrec(fd);
        if (rec && ml_load_relaxed(&rec->received) && !mlp_fd_is_ours(fd))
            mlp_received_publish(fd, "before a fork");
    }
}

/* fd, not ours, may carry the mark above (at a fork, or an accept on it): once, if it is a
 * listening TCP socket of our network namespace (SIOCGSKNS, where we may ask: it needs
 * CAP_NET_ADMIN over the socket's namespace), publish it (mlp_on_listen), so that its accepts
 * take clients' offers.  A process that only holds or forwards such a socket never publishes it, so
 * no client waits for an acceptor that does not look.  The caller keeps errno. */
static void mlp_received_publish(int fd, const char *when)
{
    struct mlp_fdrec *rec = mlp_fdrec(fd);
    if (rec && (ml_load_relaxed(&rec->received) & 1) && mlp_take_passed(fd))
        return; /* a connection passed to us, taken up */
    if (!rec || !ml_load_relaxed(&rec->received))
        return;
    ml_store_relaxed(&rec->received, (uint8_t)0);
    int acc = 0;
    socklen_t l = sizeof acc;
    if (mlp_real_getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &acc, &l) < 0 || !acc)
        return;
    uint64_t ino;
    char ours[24], theirs[24];
    if (__ml_sys_socket_netns(fd, &ino) == 0) {
        mlp_netns(ours);
        snprintf(theirs, sizeof theirs, "%llx", (unsigned long long)ino);
        if (strcmp(ours, theirs) != 0) {
            mlp_log(1, "fd %d: a listening socket received from another network namespace: "
                       "not published", fd);
            return;
        }
    }
    mlp_log(1, "fd %d: a listening socket received over SCM_RIGHTS: published (%s)", fd, when);
    (void)mlp_on_listen(fd, false);
}

/* An accept on fd, not ours: the mark looked at first (memory only: no system call for the
 * accepts of a listener that is not a received one); not from a signal handler of ours, which
 * may have interrupted this thread inside the locks that publishing takes, nor in a vfork child,
 * whose memory is its parent's. */
void mlp_accept_received(int fd)
{
    struct mlp_fdrec *rec = mlp_fdrec(fd);
    if (ml_likely(!rec || !ml_load_relaxed(&rec->received)) || mlp_sig_in_handler() ||
        mlp_vfork_child())
        return;
    mlp_received_publish(fd, "its first accept");
}

/*
 * Passing a connection over SCM_RIGHTS (design.md, "Passing a connection").  The descriptor
 * carries the kernel socket, whose bytes are in the channel: so the passer leaves the channel to
 * the receiver.  Before the kernel takes the message (the receiver may use the descriptor the
 * moment it has it), for each accelerated connection among the descriptors, the passer
 *   - opens the channel's file anew with a read lock on its side's bridge byte (as across exec:
 *     the side stays alive to the peer while the descriptor is in flight, whoever closes what),
 *   - writes a record "px-<the socket's inode>" in the fabric: the side, the channel's token,
 *     the connection's ports, and
 *   - counts the receiver as a holder of the side, as a fork child is counted.
 * If the kernel refuses the message, all three are undone.  The receiver takes the side up at its
 * first call on the descriptor (mlp_take_passed): it finds the record by the socket's inode,
 * checks it (a regular file of its own user, the ports of the socket it holds), maps the channel
 * from a bridge of its own and removes the record; the passer closes its bridge once the record
 * is gone (mlp_pass_reap, at its later passes, accepts and closes), or after MLP_PASS_WAIT_NS,
 * when it says the connection lost: the receiver did not take it up (it runs without memlan, in
 * a seccomp sandbox, as another user, or never used the descriptor).
 *
 * An acceptor that hands its connections on (Node.js's cluster primary, round robin, its default
 * on Linux; a pre-fork server whose parent accepts) still marks its port's record
 * ML_NO_OFFER_PASS at its first pass: later clients stay on TCP from the start, where the
 * descriptor carries the connection whatever the receiver is; a client that offered just before
 * withdraws at its next look.  The connections passed before the mark are taken up.
 *
 * Not from a signal handler of ours (the caller checks) or a vfork child.  Nothing of ours runs
 * for a message without an accelerated connection among its descriptors beyond reading them (a
 * passer may be sandboxed: vsftpd's privileged broker passes PASV data connections to its
 * child, under a filter that kills for fstat and getpid), and a passer known to be in a seccomp
 * sandbox (mlp_confined) makes no bridge: its connection is said lost, as before bridges existed.
 * errno kept.
 */
#define MLP_PASS_WAIT_NS 10000000000ull /* a receiver's time to take a connection up */

/* A seccomp filter: 0 not known yet, 1 none, 2 this process is confined (a filter installed
 * through our prctl or syscall, or "Seccomp:" not 0 in /proc/self/status, read once per image at
 * the first pass or take-up, with the calls those make anyway).  Filters outlive fork and exec. */
static _Atomic int mlp_confinement;
static bool mlp_unconfined(void);

void mlp_note_confined(void)
{
    atomic_store(&mlp_confinement, 2);
    __ml_madvise_off(); /* a ring's growth reserves and gives back pages with madvise */
    memlan_fabric_t *f = mlp_fab;
    if (f)
        atomic_store(&f->sweep_asks, false);
}

bool mlp_known_confined(void) { return atomic_load_explicit(&mlp_confinement, memory_order_relaxed) == 2; }

bool mlp_sandboxed(void) { return mlp_confined(); }

static bool mlp_confined(void)
{
    int c = atomic_load_explicit(&mlp_confinement, memory_order_relaxed);
    if (c == 0) {
        int none = 0;
        (void)atomic_compare_exchange_strong(&mlp_confinement, &none, mlp_unconfined() ? 1 : 2);
        c = atomic_load(&mlp_confinement);
    }
    return c == 2;
}

/*
 * A fork child's first send or receive on a connection its parent listed in memlan stat: listed
 * in our own entry now, and the channel's line names us (`memlan stat --pid` of a PostgreSQL
 * backend or walsender listed nothing, and its channel named the postmaster, which had closed
 * its copy long before).  Not inside a handler (it allocates and takes locks: owed until the
 * next call); not where the fabric is out of our reach, nor where a sandbox may confine us or
 * we do not know (the entry is a file we create, which such a filter may kill for).  The fd is
 * the parent's, or, moved since (an inetd's child dup2s it onto 0 and 1), the lowest that names
 * the socket.  Once per socket per process: the flag is taken by one thread.
 */
void mlp_stat_inherited(struct mlp_sock *s)
{
    if (!atomic_exchange(&s->stat_owed, false))
        return;
    int e = errno; /* as the call leaves it: the program's, whatever we meet */
    /* Not in a handler, nor in a vfork child of ours (its files are not ours: the entry's fd
     * would name nothing, or the program's file, in the parent afterwards; a review's
     * reproduction): owed to a later call. */
    if (mlp_sig_in_handler() || mlp_vfork_child()) {
        atomic_store(&s->stat_owed, true);
        errno = e;
        return;
    }
    /* Nor once exit() has begun (stdio's flush after our atexit handler): the entry would be
     * made after its name was taken away, and stay in the fabric. */
    if (mlp_fabric_out() || mlp_exiting() ||
        atomic_load_explicit(&mlp_confinement, memory_order_relaxed) != 1 ||
        s->state != MLP_ACCEL || !s->ch || s->slot >= 0) {
        errno = e;
        return;
    }
    int fd = s->stat_fd;
    struct mlp_sock *t = fd >= 0 ? mlp_get(fd) : NULL;
    if (t)
        mlp_put(t); /* compared only: ours keeps s */
    if (t != s) {
        fd = -1;
        int max = mlp_fd_max();
        for (int i = 0; i <= max && fd < 0; i++) {
            if ((t = mlp_get(i))) {
                if (t == s)
                    fd = i;
                mlp_put(t);
            }
        }
        if (fd < 0) {
            errno = e;
            return;
        }
    }
    struct mlp_addr l, r;
    bool have = mlp_sock_addrs(fd, &l, &r, NULL, 0) == 0;
    int slot = mlp_proc_slot();
    errno = e;
    if (slot < 0)
        return;
    mlp_slot_fill(slot, ML_CONN_ACCEL, fd, have ? &l : NULL, have ? &r : NULL, s->ch->seg->token,
                  s->side == 1 ? ML_CONN_ACCEPTED : "");
    s->stat_fd = fd;
    s->slot = slot;
    s->ch->hdr->side_pid[s->side] = (int32_t)mlp_pid; /* shown only: memlan stat reads it */
}

struct mlp_passing {
    struct mlp_passing *next;
    struct mlp_sock *s;       /* held while the message may still be refused; NULL after */
    int bridge;               /* our side's bridge lock (one of our own fds) */
    int fd;                   /* the passer's fd, for what is said */
    int port;                 /* the connection's local port, for what is said */
    int side;
    uint64_t t0;
    bool again;               /* the connection's record stood already (passed again before its
                               * receiver took it up): no bridge, nothing counted */
    char name[40];            /* "px-<socket inode>" */
    char token[MEMLAN_TOKEN_LEN + 1];
};
static pthread_mutex_t mlp_pass_mu = PTHREAD_MUTEX_INITIALIZER;
static struct mlp_passing *mlp_passings;  /* passed, their receivers not seen yet */
static _Atomic int mlp_npassing;
static _Atomic unsigned mlp_said_pass;

static void mlp_pass_name(char *buf, size_t len, unsigned long long ino)
{
    snprintf(buf, len, "px-%llx", ino);
}

static void mlp_passing_free(struct mlp_passing *p)
{
    if (p->bridge >= 0) {
        mlp_disown_fd(p->bridge);
        __ml_sys_close(p->bridge);
    }
    __ml_free(p);
}

/* The port's record says ML_NO_OFFER_PASS (if we listen on the connection's port): true when
 * this call set it. */
static bool mlp_pass_mark_port(struct mlp_sock *s)
{
    int port = s->side == 1 ? s->port : 0;
    bool marked = false;
    if (port > 0 && port < 65536) {
        pthread_mutex_lock(&mlp_neg_mu);
        struct mlp_lrec *rec = mlp_lrecs[port];
        uint32_t none = 0;
        if (rec && rec->nlisten > 0 && rec->map)
            marked = atomic_compare_exchange_strong(&rec->map->no_offer, &none, ML_NO_OFFER_PASS);
        pthread_mutex_unlock(&mlp_neg_mu);
    }
    if (marked)
        mlp_log(1, "port %d: clients will not offer (this process passes its accepted "
                   "connections to other processes over SCM_RIGHTS)",
                port);
    return marked;
}

/* A connection passed that its receiver cannot have: said, once, not only logged (the user sees
 * a reset or a silent peer, not why). */
static void mlp_pass_lost(int fd, const char *why, bool marked)
{
    mlp_log(0, "fd %d: an accelerated connection passed to another process over SCM_RIGHTS is "
               "lost (%s)", fd, why);
    if (!(atomic_fetch_or(&mlp_said_pass, 1u) & 1u))
        mlp_say(MLP_SAID_PASS, "a connection on memlan was handed to another process "
                "(SCM_RIGHTS) that could not take it up (%s): it is lost%s",
                why, marked ? "; the port's later clients stay on TCP" : "");
}

/* Close the bridges whose receivers took their sides up (the record is gone), and give up on
 * those older than MLP_PASS_WAIT_NS.  Never waits: another thread reaping does it for us. */
static void mlp_pass_reap(void)
{
    if (ml_likely(!atomic_load_explicit(&mlp_npassing, memory_order_relaxed)) || !mlp_fab ||
        pthread_mutex_trylock(&mlp_pass_mu) != 0)
        return;
    int saved = errno;
    uint64_t now = mlp_now_ns();
    for (struct mlp_passing **pp = &mlp_passings; *pp;) {
        struct mlp_passing *p = *pp;
        struct stat st;
        bool gone = __ml_sys_fstatat(mlp_fab->dirfd, p->name, &st, AT_SYMLINK_NOFOLLOW) == -ENOENT;
        if (!gone && now - p->t0 < MLP_PASS_WAIT_NS) {
            pp = &p->next;
            continue;
        }
        if (!gone) {
            __ml_sys_unlinkat(mlp_fab->dirfd, p->name, 0);
            mlp_pass_lost(p->fd, "its receiver did not take it up within 10 s: it runs without "
                                 "memlan, in a seccomp sandbox, or as another user", false);
        } else {
            mlp_log(1, "fd %d (passed): its receiver has looked at the connection", p->fd);
        }
        *pp = p->next;
        atomic_fetch_sub(&mlp_npassing, 1);
        mlp_passing_free(p);
    }
    pthread_mutex_unlock(&mlp_pass_mu);
    errno = saved;
}

/* Each descriptor an SCM_RIGHTS message carries, with a context. */
static void mlp_scm_rights_each_ctx(const struct msghdr *m, void (*each)(int fd, void *ctx),
                                    void *ctx);

struct mlp_pass_call {
    struct mlp_passing *made;   /* bridged in this call */
    int sfd;                    /* the socket the message is sent on */
    int *carries;               /* mlp_pass_carries's answer for it, -1 before it is asked */
};

/* Does a message sent on sfd pass its descriptors?  Only a unix socket's: TCP's and UDP's kernel
 * take a message with SCM_RIGHTS and pass nothing (sendmsg says the bytes sent), so nothing is
 * in flight and the connection stays ours (tests/preload/passundo.c tcp).  Asked once per call,
 * and only once an accelerated connection is found among the descriptors. */
static bool mlp_pass_carries(int sfd, int *carries)
{
    if (*carries < 0) {
        int dom = AF_UNIX;
        socklen_t len = sizeof dom;
        *carries = !(mlp_real_getsockopt(sfd, SOL_SOCKET, SO_DOMAIN, &dom, &len) == 0 &&
                     dom != AF_UNIX);
    }
    return *carries != 0;
}

/* Is the record name the one of s's side (its channel's token and side), left by a pass of
 * ours whose receiver has not taken it up yet (another message of the same sendmmsg, another
 * thread's sendmsg, an earlier call)? */
/* A pass record's text into buf (terminated): its length; -ENOENT when there is none; another
 * negative value when it is not a regular file of our own user, or too long to be one. */
static ssize_t mlp_pass_record_read(int dirfd, const char *name, char *buf, size_t cap)
{
    long rf = __ml_sys_open(dirfd, name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK, 0);
    if (rf < 0)
        return rf == -ENOENT ? -ENOENT : -EPERM;
    struct stat rs;
    ssize_t n = -EPERM;
    if (__ml_sys_fstat((int)rf, &rs) == 0 && S_ISREG(rs.st_mode) && rs.st_uid == geteuid() &&
        rs.st_size > 0 && rs.st_size < (off_t)cap)
        n = __ml_sys_read((int)rf, buf, cap - 1);
    __ml_sys_close((int)rf);
    if (n <= 0)
        return n == 0 ? -EPERM : n;
    buf[n] = 0;
    return n;
}

static bool mlp_pass_record_is(const char *name, const struct mlp_sock *s)
{
    char buf[256], token[MEMLAN_TOKEN_LEN + 1];
    int side;
    unsigned flags;
    return mlp_pass_record_read(mlp_fab->dirfd, name, buf, sizeof buf) > 0 &&
           sscanf(buf, "memlan-pass 1 %d %u %32s", &side, &flags, token) == 3 &&
           side == s->side && strcmp(token, s->ch->seg->token) == 0;
}

static void mlp_withdraw(struct mlp_sock *s, int fd, const char *why);

/* An undecided client settled now, without waiting for the decision: taken by the acceptor
 * already, accelerated; else its offer is withdrawn for why, and it is on TCP (an acceptor that
 * attached in between, the withdrawal's CAS lost, makes it accelerated after all).  Returns the
 * state. */
static int mlp_settle_now(struct mlp_sock *s, int fd, const char *why)
{
    if (mlp_decide(s, fd, false) == MLP_UNDECIDED) {
        mlp_withdraw(s, fd, why);
        if (atomic_load(&s->state) == MLP_UNDECIDED)
            (void)mlp_decide(s, fd, false);
    }
    return atomic_load(&s->state);
}

static _Atomic bool mlp_ulp_told, mlp_zerocopy_told;

/* A connection of ours given an option that acts on the kernel socket only: its state, an
 * undecided client settled first without waiting (withdrawn for why, what its ring held handed
 * to the kernel without waiting: left there, it waited for the program's next call on the
 * socket, and a server that waited for those bytes before it answered waited for ever). */
static int mlp_kernel_only(struct mlp_sock *s, int fd, const char *why)
{
    int st = atomic_load(&s->state);
    if (st == MLP_UNDECIDED && s->ch && !mlp_confined() && !mlp_vfork_child() &&
        !mlp_sig_in_handler()) { /* (a handler: our locks may be its thread's) */
        st = mlp_settle_now(s, fd, why);
        if (st == MLP_TCP)
            (void)mlp_tcp_catch_up(s, fd, false);
    }
    return st;
}

/*
 * setsockopt(TCP_ULP) on a connection of ours.  An upper-layer protocol (kernel TLS, "tls"; ESP
 * in TCP, "espintcp") transforms what the kernel socket carries, and an accelerated connection's
 * bytes never pass through it: OpenSSL with kernel TLS on (nginx's `ssl_conf_command Options
 * KTLS`, Python's OP_ENABLE_KTLS) would then write plaintext into the ring where its peer reads
 * TLS records, and read the peer's records as plaintext.  On a channel it is refused with
 * ENOENT, as a kernel without that protocol's module refuses it (OpenSSL then goes on with TLS
 * in user space), logged once per process.  An undecided client is settled first, without
 * waiting: withdrawn, it is on TCP, and the kernel's call is made once what the ring held has
 * gone to the kernel (else it is refused too: those bytes would pass through the protocol).
 * Returns 0 for the kernel's call, or -ENOENT.
 */
int mlp_ulp_set(struct mlp_sock *s, int fd)
{
    int st = mlp_kernel_only(s, fd, "a TCP upper-layer protocol (TCP_ULP, kernel TLS) was set "
                                    "before a memlan acceptor took the offer");
    if (st == MLP_TCP && mlp_tcp_catch_up(s, fd, false) == 0)
        return 0;
    if (!mlp_sig_in_handler() && !atomic_exchange(&mlp_ulp_told, true))
        mlp_log(1, "fd %d: TCP_ULP refused (ENOENT), as a kernel without the protocol's module "
                   "refuses it: an upper-layer protocol (kernel TLS) acts on the kernel socket, "
                   "%s (OpenSSL goes on with TLS in user space)", fd,
                st == MLP_TCP ? "and bytes written before it are still on their way to it"
                              : "which a channel's bytes never pass through");
    return -ENOENT;
}

/*
 * SO_ZEROCOPY.  With it, a send with MSG_ZEROCOPY leaves its buffer to the kernel and a
 * completion comes on the socket's error queue (POLLERR, recvmsg MSG_ERRQUEUE), which the program
 * waits for before it reuses the buffer (QEMU's multifd migration, the kernel's msg_zerocopy
 * tool); a channel's send copies and made none, and such a program waited for ever.  Set on an
 * undecided client, the client is settled first: on TCP it keeps the kernel's path (its sends
 * in the ring before would be numbered by nobody); where it cannot be settled at once the call
 * is refused with EOPNOTSUPP, the kernel's answer for a socket that cannot do it (the caller
 * turns the kernel's flag off again).  Set before connect, the connect does not offer
 * (mlp_zerocopy_on: the process notes here, before the kernel's call, that some socket may have
 * it).  A listener's is not looked at: gRPC
 * sets it on every listener and sends with MSG_ZEROCOPY only when told to, and a mark kept every
 * gRPC server on TCP (CI).  A connection accepted from such a listener inherits the flag: its
 * MSG_ZEROCOPY sends on the channel get the kernel's completions, made by us (below); so does
 * an accelerated connection that is given the flag, which keeps the kernel's answer (over
 * loopback the kernel copies too, and its completions say so, as ours do).
 */
void mlp_zerocopy_before(void)
{
    if (!atomic_load_explicit(&mlp_zerocopy_seen, memory_order_relaxed))
        atomic_store(&mlp_zerocopy_seen, true);
}

/* A send with MSG_ZEROCOPY on a channel (sock.c): true if the kernel socket has SO_ZEROCOPY
 * (asked once per socket, then kept by our setsockopt), so that the send owes a completion, as
 * the kernel's would: without the flag the kernel ignores MSG_ZEROCOPY and makes none.  The
 * answer is stored before the look is marked done: a second thread's first send at the same
 * moment asks the kernel too, rather than read a flag not yet stored (its completion was lost:
 * a review, 1 round in 300). */
bool mlp_zerocopy_send(struct mlp_sock *s, int fd)
{
    if (atomic_load(&s->zerocopy_looked))
        return atomic_load(&s->zc_on);
    int v = 0, saved = errno;
    socklen_t l = sizeof v;
    bool on = mlp_real_getsockopt(fd, SOL_SOCKET, SO_ZEROCOPY, &v, &l) == 0 && v > 0;
    errno = saved;
    atomic_store(&s->zc_on, on);
    if (!atomic_exchange(&s->zerocopy_looked, true) && on && !mlp_sig_in_handler())
        mlp_log(1, "fd %d: MSG_ZEROCOPY sends on an accelerated connection with SO_ZEROCOPY: each "
                   "is copied into the ring, and its completion, made by memlan, says so "
                   "(SO_EE_CODE_ZEROCOPY_COPIED)", fd);
    return on;
}

void mlp_zerocopy_off(struct mlp_sock *s)
{
    atomic_store(&s->zc_on, false);
    atomic_store(&s->zerocopy_looked, true);
}

/* The completion of a MSG_ZEROCOPY send that moved bytes: the kernel numbers such sends from 0
 * per socket and merges the completions of consecutive ones not yet read into one range; the
 * socket is POLLERR while one waits (poll.c), and a post makes that an edge for our epoll sets,
 * as the kernel's error report wakes its waiters at each. */
void mlp_zerocopy_done(struct mlp_sock *s)
{
    /* One word, so that sends of two threads at once neither lose nor split a completion: the
     * next id above, the count not yet read below (the range is next - count .. next - 1). */
    uint64_t p = atomic_load(&s->zc_pend);
    while (!atomic_compare_exchange_weak(&s->zc_pend, &p,
                                         p + (1ull << 32) + ((uint32_t)p != UINT32_MAX)))
        ;
    if (s->ch)
        __ml_chan_post_self(s->ch);
}

/* recvmsg(MSG_ERRQUEUE) with a completion waiting: as the kernel's ip_recv_error (ipv6's for an
 * AF_INET6 socket) reads it: no byte, an IP_RECVERR (IPV6_RECVERR) control message holding a
 * sock_extended_err and a zeroed offender address, MSG_ERRQUEUE in the flags (and
 * MSG_CMSG_CLOEXEC when asked, as the kernel echoes it); a control buffer too small gets what
 * fits and MSG_CTRUNC, one the program may not write gets nothing (the kernel's put_cmsg copies
 * out without a fault; our memcpy killed the program: a review), and the completion is read all
 * the same.  msg_namelen is written only with a msg_name, as the kernel's.  (Not made: the
 * timestamp message SO_TIMESTAMP adds before it.) */
ssize_t mlp_zerocopy_read(struct mlp_sock *s, int fd, struct msghdr *m, int flags)
{
    uint64_t p = atomic_fetch_and(&s->zc_pend, ~(uint64_t)UINT32_MAX); /* the ids stay */
    uint32_t next = (uint32_t)(p >> 32), count = (uint32_t)p;
    if (!count)
        return -EAGAIN;
    union {
        struct cmsghdr h;
        char b[CMSG_SPACE(sizeof(struct sock_extended_err) + sizeof(struct sockaddr_in6))];
    } c;
    memset(&c, 0, sizeof c);
    struct sock_extended_err ee = {.ee_errno = 0,
                                   .ee_origin = SO_EE_ORIGIN_ZEROCOPY,
                                   .ee_code = SO_EE_CODE_ZEROCOPY_COPIED,
                                   .ee_info = next - count,
                                   .ee_data = next - 1};
    memcpy(CMSG_DATA(&c.h), &ee, sizeof ee); /* the offender after it: zeroes */
    int dom = AF_INET, saved = errno;
    socklen_t dl = sizeof dom;
    (void)mlp_real_getsockopt(fd, SOL_SOCKET, SO_DOMAIN, &dom, &dl);
    errno = saved;
    bool v6 = dom == AF_INET6;
    size_t len = sizeof ee + (v6 ? sizeof(struct sockaddr_in6) : sizeof(struct sockaddr_in));
    m->msg_flags = MSG_ERRQUEUE | (flags & MSG_CMSG_CLOEXEC);
    if (m->msg_name)
        m->msg_namelen = 0;
    if (!m->msg_control || m->msg_controllen < sizeof(struct cmsghdr)) {
        m->msg_flags |= MSG_CTRUNC;
        m->msg_controllen = 0;
        return 0;
    }
    size_t cmlen = CMSG_LEN(len);
    if (m->msg_controllen < cmlen) {
        m->msg_flags |= MSG_CTRUNC;
        cmlen = m->msg_controllen;
    }
    c.h.cmsg_len = cmlen;
    c.h.cmsg_level = v6 ? SOL_IPV6 : SOL_IP;
    c.h.cmsg_type = v6 ? IPV6_RECVERR : IP_RECVERR;
    size_t used = CMSG_SPACE(len) < m->msg_controllen ? CMSG_SPACE(len) : m->msg_controllen;
    size_t copy = cmlen; /* the padding after it is the program's */
    bool ok;
    if (mlp_known_confined()) { /* a sandbox may kill for process_vm_writev */
        memcpy(m->msg_control, c.b, copy);
        ok = true;
    } else {
        struct iovec lo = {c.b, copy}, ro = {m->msg_control, copy};
        ok = __ml_sys_raw(SYS_process_vm_writev, atomic_load(&mlp_pid), (long)&lo, 1, (long)&ro,
                          1, 0) == (long)copy;
    }
    if (!ok) {
        m->msg_flags &= ~MSG_CTRUNC;
        used = 0;
    }
    m->msg_controllen = used;
    return 0;
}

/* A MSG_ZEROCOPY send on an undecided client with the flag (a socket given it in an earlier
 * image, which connect did not see): settled first, without waiting; the state. */
/* An urgent send before a memlan acceptor took the offer: TCP's urgent pointer cannot ride in
 * an offer that the server may still take over TCP, so the offer is withdrawn (unless taken
 * meanwhile) and the send is the kernel's, after what the ring held (design.md, "Urgent
 * data").  Java's sendUrgentData right after connect failed with EOPNOTSUPP before. */
int mlp_oob_settle(struct mlp_sock *s, int fd)
{
    return mlp_kernel_only(s, fd, "urgent data (MSG_OOB) was sent before a memlan acceptor took "
                                  "the offer");
}

int mlp_zerocopy_settle(struct mlp_sock *s, int fd)
{
    return mlp_kernel_only(s, fd, "a MSG_ZEROCOPY send with SO_ZEROCOPY came before a memlan "
                                  "acceptor took the offer");
}

int mlp_zerocopy_set(struct mlp_sock *s, int fd)
{
    int st = mlp_kernel_only(s, fd, "SO_ZEROCOPY was set before a memlan acceptor took the offer");
    if (st == MLP_TCP)
        return 0;
    if (st == MLP_ACCEL) {
        /* The kernel's flag is on (getsockopt says so, as over TCP); our sends make the
         * completions (mlp_zerocopy_done). */
        atomic_store(&s->zc_on, true);
        atomic_store(&s->zerocopy_looked, true);
        if (!mlp_sig_in_handler() && !atomic_exchange(&mlp_zerocopy_told, true))
            mlp_log(1, "fd %d: SO_ZEROCOPY on an accelerated connection: its MSG_ZEROCOPY sends "
                       "are copied into the ring, and their completions, made by memlan, say so "
                       "(SO_EE_CODE_ZEROCOPY_COPIED)", fd);
        return 0;
    }
    /* Undecided still (in a handler, a vfork child, a sandbox: not settled here): its sends
     * go into the ring, and where it ends on TCP the kernel numbers its completions anew. */
    return -EOPNOTSUPP;
}

static void mlp_pass_prepare_fd(int fd, void *ctx)
{
    struct mlp_pass_call *x = ctx;
    /* A connection passed to us and passed on unused (forwarded): taken up first, and passed
     * on as ours, with a record of its own.  Left to the record we were passed it with, the
     * receiver and our close raced for it: our close took it up and ended our hold, and the
     * receiver, finding no record, had an idle kernel socket (tests/preload/epollpassback.c). */
    if (fd >= 0)
        mlp_received_look(fd);
    struct mlp_sock *s = fd >= 0 && mlp_fd_is_ours(fd) ? mlp_get(fd) : NULL;
    if (!s)
        return;
    /* An undecided connection is settled before it goes: passed as it was, its bytes stayed in
     * our ring while the receiver wrote over the kernel socket, whose bytes then came before
     * ours (a review).  Not by waiting for the decision (a nonblocking passer waited the accept
     * wait, 2 s, and one whose flush could not finish for ever: a second review): taken now,
     * accelerated, it is passed below; else the offer is withdrawn, and what the ring held is
     * handed to the kernel without waiting, before the receiver can write. */
    if (s->type == MLP_CONN && atomic_load(&s->state) == MLP_UNDECIDED && !mlp_confined() &&
        !mlp_vfork_child()) {
        /* The acceptor attached in between (the withdrawal's CAS lost): accelerated, and passed
         * so below (left undecided, it went with no record, and the receiver wrote on the kernel
         * socket under a channel: a third review, under gdb) */
        (void)mlp_settle_now(s, fd, "passed over SCM_RIGHTS before a memlan acceptor took the "
                                    "offer");
        if (atomic_load(&s->state) == MLP_TCP && mlp_tcp_catch_up(s, fd, false) == -EAGAIN &&
            s->ch && __ml_chan_tx_queued(s->ch) > 0)
            /* Not all of it went: the kernel's buffers were made smaller than what the ring
             * holds after it was written (SO_SNDBUF).  The rest follows at our next call on the
             * socket, after what the receiver writes: said, not hidden. */
            mlp_say(MLP_SAID_PASS, "fd %d: passed over SCM_RIGHTS with %llu bytes of its ring "
                    "not yet sent over TCP (its SO_SNDBUF was made smaller after they were "
                    "written): the receiver's writes may come before them", fd,
                    (unsigned long long)__ml_chan_tx_queued(s->ch));
    }
    /* the vfork child's look (getpid) and the sandbox's after a connection of ours is found */
    if (s->type != MLP_CONN || atomic_load(&s->state) != MLP_ACCEL || !s->ch || !s->me ||
        !mlp_fab || mlp_vfork_child() || mlp_confined() ||
        !mlp_pass_carries(x->sfd, x->carries)) {
        mlp_put(s);
        return;
    }
    for (struct mlp_passing *q = x->made; q; q = q->next)
        if (q->s == s) { /* the same connection twice in one message: one record */
            mlp_put(s);
            return;
        }
    struct stat st;
    struct mlp_addr l, r;
    struct mlp_passing *p = NULL;
    const char *why = NULL;
    int b = -1;
    if (__ml_sys_fstat(fd, &st) < 0 || mlp_sock_addrs(fd, &l, &r, NULL, 0) < 0)
        why = "its socket's addresses are unavailable";
    else if (!(p = calloc(1, sizeof *p)))
        why = "out of memory";
    else if ((b = __ml_chan_exec_bridge(s->ch, s->cred_fd)) < 0)
        why = strerror(-b);
    if (why) {
        mlp_log(0, "fd %d: cannot leave the connection to the process it is passed to (%s)", fd,
                why);
        __ml_free(p);
        mlp_put(s);
        return;
    }
    mlp_pass_name(p->name, sizeof p->name, (unsigned long long)st.st_ino);
    char line[160];
    unsigned flags = (s->ch->rd_eof_when_empty ? MLP_CARRY_RD_EOF : 0) |
                     (s->ch->shut_rd ? MLP_CARRY_SHUT_RD : 0);
    /* The socket's cookie too: the kernel's identity of it, never reused, which the receiver
     * compares with its own socket's (the ports alone cannot tell an acceptor's sockets apart
     * once a socket is past both FINs and has no peer name: a review).  0: none to say. */
    uint64_t cookie = 0;
    socklen_t cl = sizeof cookie;
    if (mlp_real_getsockopt(fd, SOL_SOCKET, SO_COOKIE, &cookie, &cl) != 0 || cl != sizeof cookie)
        cookie = 0;
    int n = snprintf(line, sizeof line, "memlan-pass 1 %d %u %s %d %d %llx\n", s->side, flags,
                     s->ch->seg->token, l.port, r.port, (unsigned long long)cookie);
    long rf = -EEXIST;
    for (int tries = 0; tries < 2 && rf == -EEXIST; tries++) {
        rf = __ml_sys_open(mlp_fab->dirfd, p->name,
                           O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
        if (rf != -EEXIST || tries)
            break;
        /* A record of this socket's: ours, passed again before its receiver took it (the one
         * that looks first takes it: one bridge, one holder counted, whatever the copies);
         * else a stale one of an inode that died, removed.  Ours is known by the list of
         * those waiting, or by its content: a pass of another message of the same sendmmsg, or
         * of another thread, is on no list yet (b888bea removed its record and made a second
         * one, counting a second holder that nobody would ever take away: the side never
         * ended by its last close, tests/preload/passend.c mtwice). */
        bool mine = false;
        pthread_mutex_lock(&mlp_pass_mu);
        for (struct mlp_passing *q = mlp_passings; q && !mine; q = q->next)
            mine = strcmp(q->name, p->name) == 0;
        pthread_mutex_unlock(&mlp_pass_mu);
        if (mine || mlp_pass_record_is(p->name, s)) {
            /* nothing new in flight: this copy goes with the record that stands */
            __ml_sys_close(b);
            p->bridge = -1;
            p->again = true;
            p->fd = fd;
            p->s = s;
            p->next = x->made;
            x->made = p;
            return;
        }
        __ml_sys_unlinkat(mlp_fab->dirfd, p->name, 0);
    }
    bool wrote = rf >= 0 && n > 0 && n < (int)sizeof line &&
                 __ml_sys_write((int)rf, line, (size_t)n) == n;
    if (rf >= 0)
        __ml_sys_close((int)rf);
    if (!wrote) {
        if (rf >= 0)
            __ml_sys_unlinkat(mlp_fab->dirfd, p->name, 0);
        if (rf != -EEXIST)
            mlp_log(0, "fd %d: cannot leave the connection to the process it is passed to "
                       "(its record: %s)", fd, strerror(rf < 0 ? (int)-rf : EIO));
        __ml_sys_close(b);
        __ml_free(p);
        mlp_put(s);
        return;
    }
    p->bridge = b;
    mlp_own_fd(&p->bridge, true);
    p->fd = fd;
    p->port = l.port;
    p->side = s->side;
    snprintf(p->token, sizeof p->token, "%s", s->ch->seg->token);
    p->t0 = mlp_now_ns();
    p->s = s; /* our reference, until the call's end */
    /* The receiver holds the side from now on, as a fork child would; and moves the ring
     * positions, so that our own calls, if any, reload them at each lock (mlp_lock_dir). */
    atomic_fetch_add(&s->me->holders, 1);
    if (!atomic_load_explicit(&s->forked, memory_order_relaxed))
        atomic_store(&s->forked, true);
    /* Until the receiver takes it up (which clears it), a passer that dies without its exit
     * handler leaves the peer only its lock to ask (poll.c, mlp_peer_passed_gone); counted
     * first, so that the peer's grace starts again (channel.c, ml_passed_grace). */
    atomic_fetch_add(&s->me->passes, 1);
    atomic_fetch_or(&s->me->flags, ML_SOCK_PASSED);
    p->next = x->made;
    x->made = p;
}

void *mlp_pass_prepare(const struct msghdr *m, int sfd, int *carries)
{
    struct mlp_pass_call x = {NULL, sfd, carries};
    int saved = errno;
    mlp_scm_rights_each_ctx(m, mlp_pass_prepare_fd, &x);
    errno = saved;
    return x.made;
}

/* After the kernel's call: ok, it took the message.  Accelerated connections passed without a
 * bridge are lost; those with one wait for their receivers.  made: mlp_pass_prepare's. */
struct mlp_pass_after {
    struct mlp_passing *made;
    int sfd;
    int *carries;
};

static void mlp_pass_after_fd(int fd, void *ctx)
{
    struct mlp_pass_after *x = ctx;
    struct mlp_sock *s = fd >= 0 && mlp_fd_is_ours(fd) ? mlp_get(fd) : NULL;
    if (!s)
        return;
    bool bridged = false;
    for (struct mlp_passing *q = x->made; q && !bridged; q = q->next)
        bridged = q->s == s;
    /* the vfork child's look (getpid) last: only a connection of ours pays for it */
    if (!bridged && s->type == MLP_CONN && atomic_load(&s->state) == MLP_ACCEL &&
        !mlp_vfork_child() && mlp_pass_carries(x->sfd, x->carries)) {
        /* Lost: its end is still ours to tell, at exit (sock.c, mlp_passed_at_exit), and the
         * peer's waiters ask our lock meanwhile (poll.c, mlp_peer_passed_gone): the receiver
         * holds the kernel socket, whose FIN would otherwise tell it. */
        atomic_store(&s->passed, true);
        if (s->me)
            atomic_fetch_or(&s->me->flags, ML_SOCK_PASSED);
        mlp_pass_lost(fd, mlp_confinement == 2 ? "the passer is in a seccomp sandbox"
                                               : "no record of it could be left",
                      mlp_pass_mark_port(s));
    }
    mlp_put(s);
}

void mlp_pass_finish(const struct msghdr *m, void *made, bool ok, int sfd, int *carries)
{
    int saved = errno;
    struct mlp_passing *list = made;
    if (ok) {
        struct mlp_pass_after x = {list, sfd, carries};
        mlp_scm_rights_each_ctx(m, mlp_pass_after_fd, &x);
    }
    while (list) {
        struct mlp_passing *p = list;
        list = p->next;
        struct mlp_sock *s = p->s;
        p->s = NULL;
        if (ok)
            atomic_store(&s->sent, true);
        if (p->again) { /* passed again: the record that stands, and its bridge, serve it */
            mlp_put(s);
            __ml_free(p);
            continue;
        }
        if (!ok) { /* the kernel kept the descriptor: nothing is in flight */
            __ml_sys_unlinkat(mlp_fab->dirfd, p->name, 0);
            atomic_fetch_sub(&s->me->holders, 1);
            if (!atomic_load(&s->passed))
                atomic_fetch_and(&s->me->flags, ~ML_SOCK_PASSED);
            mlp_passing_free(p);
            mlp_put(s);
            continue;
        }
        mlp_log(1, "fd %d: an accelerated connection passed to another process over "
                   "SCM_RIGHTS: left to it (%s)", p->fd, p->name);
        (void)mlp_pass_mark_port(s);
        mlp_put(s);
        pthread_mutex_lock(&mlp_pass_mu);
        p->next = mlp_passings;
        mlp_passings = p;
        atomic_fetch_add(&mlp_npassing, 1);
        pthread_mutex_unlock(&mlp_pass_mu);
    }
    if (ok)
        mlp_pass_reap();
    errno = saved;
}

/* Other moments a passer looks at its bridges: an accept, a close of ours (memory only when
 * nothing was passed). */
void mlp_pass_tick(void) { mlp_pass_reap(); }

/* A fork child: the bridges are the parent's (its receivers are the parent's to wait for). */
static void mlp_pass_after_fork(void)
{
    pthread_mutex_init(&mlp_pass_mu, NULL);
    while (mlp_passings) {
        struct mlp_passing *p = mlp_passings;
        mlp_passings = p->next;
        mlp_passing_free(p);
    }
    atomic_store(&mlp_npassing, 0);
}

/*
 * The receiving side: fd came over SCM_RIGHTS (marked MLP_RCV_NEW by recvmsg, memory only) and
 * is not ours.  At its first call (a data call, poll, select, epoll_ctl, a fork, an accept), one
 * look: is there a record of a connection passed with it?  If so, take its side up, as across
 * exec, and the call goes on on the channel.  Not in a signal handler of ours, a vfork child, or
 * under a lock of ours (the next call looks).  Another thread's call meanwhile waits for the
 * look's end (a few system calls; bounded).  True when fd is ours now.
 */
static void mlp_take_passed_look(int fd)
{
    /* A sandbox first ("Seccomp:" in /proc/self/status, once per image, where no filter was
     * seen installed): its filter may kill the look's own calls (fstat, open, getsockname). */
    if (mlp_confined())
        return;
    struct stat st;
    if (__ml_sys_fstat(fd, &st) < 0 || !S_ISSOCK(st.st_mode))
        return;
    memlan_fabric_t *fab = mlp_fabric();
    if (!fab)
        return;
    char name[40], buf[256];
    mlp_pass_name(name, sizeof name, (unsigned long long)st.st_ino);
    ssize_t n = mlp_pass_record_read(fab->dirfd, name, buf, sizeof buf);
    if (n == -ENOENT)
        return; /* not a connection memlan passed */
    int side, lport, rport, off = 0;
    unsigned flags;
    char token[MEMLAN_TOKEN_LEN + 1];
    if (n <= 0 || sscanf(buf, "memlan-pass 1 %d %u %32s %d %d%n", &side, &flags, token, &lport,
                         &rport, &off) != 5 || (side != 0 && side != 1)) {
        mlp_log(0, "fd %d: received over SCM_RIGHTS with a record %s that is not a memlan "
                   "passer's (another user's, or unreadable): left as it is", fd, name);
        return;
    }
    /* The socket's cookie, where the record has one, is its identity (never reused).  Past
     * both ends' FINs (a passer that shut down its writing, a client that closed since) the
     * socket has no peer name any more (ENOTCONN): the cookie decides then, and without one (an
     * older passer's record) the port, for a record made within the last minute (the name's
     * inode could be another socket's only after 2^32 more inodes).  Taken for another
     * socket's, the record went with nothing said, and the receiver read the end where the
     * client's last bytes waited in the ring (a review). */
    unsigned long long rc = 0, mc = 0;
    socklen_t mcl = sizeof mc;
    if (sscanf(buf + off, " %llx", &rc) != 1 ||
        mlp_real_getsockopt(fd, SOL_SOCKET, SO_COOKIE, &mc, &mcl) != 0 || mcl != sizeof mc)
        rc = mc = 0;
    struct mlp_addr l = {0}, r = {0};
    int ae = mlp_sock_addrs(fd, &l, &r, NULL, 0);
    struct stat rs;
    if (ae == -ENOTCONN && !rc &&
        (__ml_sys_fstatat(fab->dirfd, name, &rs, AT_SYMLINK_NOFOLLOW) != 0 ||
         (int64_t)time(NULL) - (int64_t)rs.st_mtime > 60))
        ae = -ESTALE;
    if ((rc && rc != mc) || (ae < 0 && ae != -ENOTCONN) || l.port != lport ||
        (ae == 0 && r.port != rport)) {
        /* another socket's that had this inode number, left by a passer that died */
        __ml_sys_unlinkat(fab->dirfd, name, 0);
        return;
    }
    /* Where it cannot be taken up, the program reads the end (shut down), not nothing; the
     * record goes either way, and with it the passer's bridge (our own holds the side from here
     * when we take it up). */
    int b = __ml_chan_bridge_open(fab, token, side);
    __ml_sys_unlinkat(fab->dirfd, name, 0);
    if (b < 0) {
        char why[96];
        snprintf(why, sizeof why, "the receiver cannot open its channel: %s", strerror(-b));
        mlp_pass_lost(fd, why, false);
        (void)mlp_real_shutdown(fd, SHUT_RDWR);
        return;
    }
    mlp_adopt_conn(&fd, 1, b, side, token, (flags & (MLP_CARRY_RD_EOF | MLP_CARRY_SHUT_RD)) |
                   MLP_CARRY_PASSED, "passed over SCM_RIGHTS");
}

bool mlp_take_passed(int fd)
{
    struct mlp_fdrec *rec = mlp_fdrec(fd);
    if (!rec)
        return false;
    uint8_t v = atomic_load(&rec->received);
    for (bool asked = false;;) {
        if (v == MLP_RCV_TAKING) {
            /* another thread looks: its few system calls, bounded */
            uint64_t until = mlp_now_ns() + 2000000000ull;
            for (unsigned i = 0;
                 atomic_load(&rec->received) == MLP_RCV_TAKING && mlp_now_ns() < until; i++)
                __ml_brief_wait(i);
            return mlp_fd_is_ours(fd);
        }
        if (v != MLP_RCV_NEW || mlp_cfg.off || mlp_sig_in_handler() || mlp_holds_lock())
            return mlp_fd_is_ours(fd);
        /* A process known to be in a seccomp sandbox meets no system call of ours here, not
         * even the vfork child's getpid: its filter may kill any (tests/preload/sandboxuse.c). */
        if (mlp_known_confined()) {
            (void)atomic_compare_exchange_strong(&rec->received, &v, MLP_RCV_LOOKED);
            return mlp_fd_is_ours(fd);
        }
        if (!asked && mlp_vfork_child())
            return mlp_fd_is_ours(fd);
        asked = true;
        if (atomic_compare_exchange_strong(&rec->received, &v, MLP_RCV_TAKING))
            break;
        /* another thread began its look first (v TAKING now): its end is waited for, so that a
         * close goes on only once nothing can be installed on the number any more */
    }
    int saved = errno, inside = mlp_inside;
    mlp_inside = 1;
    mlp_take_passed_look(fd);
    mlp_inside = inside;
    errno = saved;
    bool ours = mlp_fd_is_ours(fd);
    uint8_t t = MLP_RCV_TAKING; /* a close meanwhile reset the record: leave it so */
    (void)atomic_compare_exchange_strong(&rec->received, &t, ours ? 0 : MLP_RCV_LOOKED);
    return ours;
}

/*
 * This process's credentials are back within the fabric's reach (a seteuid back to root): the
 * ports whose ML_NO_OFFER_CRED it set take offers again.  spamd's parent drops its euid and egid
 * for a moment after its listen (to read its user's files) and comes back: its mark stayed, and
 * every later client of its port stayed on TCP (an explorer).  A process out of reach again
 * marks again at its next accept (mlp_on_accept), and refuses the offer of a client that did
 * not see the mark, which withdraws; so does another holder of the port still out of reach
 * (which found the mark set and did not note itself).  False: busy (tried, never waited for:
 * the caller may be a handler), owed to a later call.
 */
bool mlp_lrec_cred_back(void)
{
    int pid = ml_load_relaxed(&mlp_pid);
    if ((int)__ml_sys_getpid() != pid)
        return true; /* a vfork child's: the marks are its parent's */
    if (pthread_mutex_trylock(&mlp_neg_mu) != 0)
        return false;
    int first = -1, n = 0;
    for (int port = 0; port < 65536; port++) {
        struct mlp_lrec *r = mlp_lrecs[port];
        if (!r || !r->map || __atomic_load_n(&r->cred_pid, __ATOMIC_RELAXED) != pid)
            continue;
        __atomic_store_n(&r->cred_pid, 0, __ATOMIC_RELAXED);
        uint32_t v = ML_NO_OFFER_CRED;
        if (atomic_compare_exchange_strong(&r->map->no_offer, &v, 0) && n++ == 0)
            first = port;
    }
    pthread_mutex_unlock(&mlp_neg_mu);
    /* Once per process, as the loss is said: a server that toggles would say it per request. */
    static _Atomic bool said;
    if (n && !atomic_exchange(&said, true))
        mlp_log(1, "port %d%s: clients may offer again (this process's credentials are back; "
                   "said once)", first, n > 1 ? " and others" : "");
    return true;
}

/*
 * Before an exec of this process (own; a vfork child's or a spawn's exec makes another process,
 * whose marks are not ours to clear): the ports whose ML_NO_OFFER_CRED this process set, and on
 * which none of its listeners survives the exec, are cleared (kept[port / 8] bit: a listener of
 * ours on port survives), and, when the fabric is out of the exec'ing thread's reach (mark), the
 * ports whose listeners survive are marked.  An inetd's child drops to a
 * service's user while it still holds every listener of the inetd, then execs the service
 * without them (a mark made when a drop marked every port stayed while the inetd, root and the
 * only acceptor, lived, and every later client of every port of the inetd stayed on TCP), or
 * with the one it accepts on itself (`wait = yes`).  Returns the ports cleared (malloc'd, *n of
 * them) for mlp_lrec_cred_undo when the exec fails.
 */
int *mlp_lrec_cred_exec(const uint8_t *kept, int *n, bool mark, bool own)
{
    *n = 0;
    int pid = ml_load_relaxed(&mlp_pid);
    if ((own && (int)__ml_sys_getpid() != pid) || pthread_mutex_trylock(&mlp_neg_mu) != 0)
        return NULL; /* busy (a handler's exec): the marks stay, as before */
    int *out = NULL, cap = 0;
    for (int port = 0; port < 65536; port++) {
        struct mlp_lrec *r = mlp_lrecs[port];
        if (r && r->map && mark && (kept[port / 8] & (1u << (port % 8)))) {
            /* The new image accepts here out of our fabric's reach, and may not see this
             * fabric at all (an inetd's `wait = yes` service exec'd as nobody opens nobody's):
             * it could neither take nor refuse an offer, so the port is marked now, as ours
             * (our pid: a vfork child's is its parent's, whose memory it writes), cleared when
             * our credentials come back: a helper that a drop spawned and that has exited
             * since kept the port marked for good (a review).  A service that goes on
             * accepting out of reach after that is the gap of any mark's clearing (its
             * clients offer, and wait for it). */
            uint32_t none = 0;
            if (atomic_compare_exchange_strong(&r->map->no_offer, &none, ML_NO_OFFER_CRED)) {
                __atomic_store_n(&r->cred_pid, pid, __ATOMIC_RELAXED);
                mlp_log(1, "port %d: clients will not offer (%s; a program out of the fabric's "
                           "reach is started with the listener)", port, mlp_cred_why);
            }
            continue;
        }
        if (!own)
            continue;
        if (!r || __atomic_load_n(&r->cred_pid, __ATOMIC_RELAXED) != pid || !r->map ||
            (kept[port / 8] & (1u << (port % 8))))
            continue;
        uint32_t v = ML_NO_OFFER_CRED;
        if (*n == cap) {
            int *no = realloc(out, (size_t)(cap = cap ? cap * 2 : 16) * sizeof *no);
            if (!no)
                break;
            out = no;
        }
        if (atomic_compare_exchange_strong(&r->map->no_offer, &v, 0)) {
            out[(*n)++] = port;
            mlp_log(1, "port %d: clients may offer again (the process that changed its "
                       "credentials execs without its listeners)", port);
        }
    }
    pthread_mutex_unlock(&mlp_neg_mu);
    return out;
}

/* The exec failed: the marks mlp_lrec_cred_exec cleared are set again. */
void mlp_lrec_cred_undo(const int *ports, int n)
{
    for (int i = 0; i < n; i++) {
        struct mlp_lrec *r = mlp_lrecs[ports[i]];
        uint32_t none = 0;
        if (r && r->map)
            (void)atomic_compare_exchange_strong(&r->map->no_offer, &none, ML_NO_OFFER_CRED);
    }
}

/*
 * Before an exec that keeps listener s into an image that runs without memlan (exec.c,
 * mlp_exec_blind): the port's record says so, and clients do not offer from then on, as for the
 * other marks (it goes with the record): that process accepts where we never see it, and each
 * client waited for its offer to be taken (an eighth of the accept wait after the kernel's
 * accept: 270 ms a connection to Apache Traffic Server, whose manager execs traffic_server with
 * the listeners under other credentials, an explorer).  Written only over no mark (another
 * already holds clients off).  True when written, for mlp_lrec_blind_undo.  No lock: a vfork
 * child may be the caller, and the mapping lives as long as the listener, which it holds.
 */
bool mlp_lrec_blind_mark(struct mlp_sock *s)
{
    struct mlp_lrec *r = s->rec;
    uint32_t none = 0;
    return r && r->map && atomic_compare_exchange_strong(&r->map->no_offer, &none,
                                                         ML_NO_OFFER_BLIND);
}

/* The exec failed: the mark mlp_lrec_blind_mark wrote on port goes (as mlp_lrec_cred_undo,
 * through our record of the port). */
void mlp_lrec_blind_undo(int port)
{
    uint32_t v = ML_NO_OFFER_BLIND;
    struct mlp_lrec *r = port >= 0 && port < 65536 ? mlp_lrecs[port] : NULL;
    if (r && r->map)
        (void)atomic_compare_exchange_strong(&r->map->no_offer, &v, 0u);
}

/*
 * A send of urgent data (MSG_OOB) on a connection its server has not accepted yet is refused
 * (sock.c, mlp_send_oob_refused): its bytes are in an offer, which the server may still take
 * over TCP.  The server's port is marked (server: the port of our end; client: the peer's), so
 * that its later connections stay on TCP from the start, where the kernel carries urgent data
 * (an accepted connection carries it on its channel: mlp_send_urgent).  That connection still
 * meets the refusal, which is said.
 * Through our own record of the port where we listen on it, else by the record's name (an
 * inetd's child, a client): opened, mapped for the one exchange and let go.  Written only over
 * no mark.  True when written.
 */
bool mlp_lrec_oob_mark(int port)
{
    if (port <= 0 || port >= 65536)
        return false;
    char netns[24];
    mlp_netns(netns);
    pthread_mutex_lock(&mlp_neg_mu);
    struct mlp_lrec *r = mlp_lrecs[port];
    uint32_t none = 0;
    bool ours = r && r->map && strcmp(r->netns, netns) == 0, marked = false;
    if (ours)
        marked = atomic_compare_exchange_strong(&r->map->no_offer, &none, ML_NO_OFFER_OOB);
    pthread_mutex_unlock(&mlp_neg_mu);
    memlan_fabric_t *fab = mlp_fabric();
    if (ours || !fab)
        return marked;
    char name[64];
    mlp_lrec_name(name, sizeof name, netns, port);
    long fd = __ml_sys_open(fab->dirfd, name, O_RDWR | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0);
    if (fd < 0)
        return false;
    struct stat st;
    void *p = NULL;
    if (__ml_sys_fstat((int)fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_size >= ML_PAGE &&
        __ml_sys_mmap(&p, NULL, ML_PAGE, PROT_READ | PROT_WRITE, MAP_SHARED, (int)fd, 0) == 0) {
        int g = __ml_guard_add(p, ML_PAGE); /* shrunk by anyone: zeros, no SIGBUS (guard.c) */
        struct ml_listen_rec *m = p;
        none = 0;
        if (m->magic == ML_LREC_MAGIC && m->port == (uint32_t)port)
            marked = atomic_compare_exchange_strong(&m->no_offer, &none, ML_NO_OFFER_OOB);
        __ml_guard_del(g);
        __ml_sys_munmap(p, ML_PAGE);
    }
    __ml_sys_close((int)fd);
    return marked;
}

/* Why a record says not to offer. */
static const char *mlp_no_offer_why(const struct ml_listen_rec *m)
{
    uint32_t v = ml_load_acquire(&m->no_offer);
    if (v == 0)
        return NULL;
    /* (one mark for both: a credential change, or a fabric that refused a file to a process whose
     * credentials did not change as libc saw them, a sandbox's: mlp_fabric_refused; the server's
     * own log says which) */
    return v == ML_NO_OFFER_CRED ? "a server process lost the fabric (credentials, sandbox): it "
                                   "cannot take offers" /* at most 79: a stat entry's why */
           : v == ML_NO_OFFER_GRANT
               ? "a server process cannot be named as an acceptor in the shared fabric's record"
           : v == ML_NO_OFFER_DEFER
               ? "the server's listener defers accept until data (TCP_DEFER_ACCEPT)"
           : v == ML_NO_OFFER_PASS
               ? "the server passes its accepted connections to other processes (SCM_RIGHTS)"
           : v == ML_NO_OFFER_BLIND
               ? "a process given the server's listener runs, or ran, without memlan"
           : v == ML_NO_OFFER_OOB
               ? "a connection of the port sent urgent data (MSG_OOB): kept on TCP"
               : "the server's record says not to offer";
}

/* A refusal's key: the offer's name hashed (FNV-1a), never 0 (an empty entry). */
static uint64_t mlp_refusal_key(const char *name)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (const unsigned char *c = (const unsigned char *)name; *c; c++)
        h = (h ^ *c) * 0x100000001b3ull;
    return h ? h : 1;
}

/* The acceptor gave up on name's offer: say so in the record (no file is made).  SYNC: the
 * exchange is a full barrier before the acceptor's last look for the offer, paired with the
 * client's fence between posting its offer and looking here (mlp_refused_in): either the
 * acceptor's look finds the offer, or the client finds the refusal. */
static void mlp_lrec_mark(struct ml_listen_rec *m, uint64_t key)
{
    uint32_t i = ml_fetch_add(&m->refused_next, 1u) % ML_LREC_REFUSED;
    (void)ml_xchg(&m->refused[i], key);
}

static bool mlp_lrec_marked(const struct ml_listen_rec *m, uint64_t key)
{
    ml_fence(); /* SYNC: pairs with the exchange in mlp_lrec_mark() */
    for (unsigned i = 0; i < ML_LREC_REFUSED; i++)
        if (ml_load_relaxed((_Atomic uint64_t *)&m->refused[i]) == key)
            return true;
    return false;
}

static void mlp_refuse_mark(struct ml_listen_rec *m, const char *name)
{
    mlp_lrec_mark(m, mlp_refusal_key(name));
}

/* Has an acceptor refused the offer under name?  The words are any member's to write: a false
 * yes sends us to TCP, a false no leaves us to the accept wait. */
static bool mlp_refused_in(const struct ml_listen_rec *m, const char *name)
{
    return mlp_lrec_marked(m, mlp_refusal_key(name));
}

/* A client that gave up its offer says so in the same words, under the complement of the
 * refusal's key, before it removes the offer's name (the exchange orders them): an acceptor
 * that then finds no offer says that the client withdrew, not that it is not memlan.  Peer input
 * too: a wrong word changes only what the acceptor says (a connection of the same four
 * addresses that comes later may find the mark of one that withdrew: it is looked at only where
 * no offer is coming, pending 0 or the server's wait over). */
static uint64_t mlp_withdrawal_key(const char *name)
{
    uint64_t k = ~mlp_refusal_key(name);
    return k ? k : 2;
}

/*
 * Work under mlp_neg_mu that a signal handler cannot wait for.  A close from a handler (close is
 * async-signal-safe: a server's SIGTERM handler closes its listening socket) on top of its
 * thread's section under the lock waited for itself for ever (tests/preload/exithandler.c
 * "close", "closeconn"): a listener's release, a client's hold of a listener record's mapping.
 * There, when the lock cannot be had at once (a few tries), the work is left in a slot to the
 * lock's next holder (a release, a listen, a client's look-up): the record stays a little
 * longer, and the kernel refuses connections to the closed listener meanwhile.  Slots hold a
 * pointer, its low bit the kind; with all 64 taken the work is dropped (a mapping or a record
 * kept to the process's end).
 */
#define MLP_NEG_DEFER 64
static _Atomic uintptr_t mlp_neg_defer[MLP_NEG_DEFER];
static _Atomic int mlp_neg_ndefer;

static void mlp_lrec_release_locked(struct mlp_lrec *r);
static void mlp_lmap_put_locked(struct ml_listen_rec *m);

/* From a handler: mlp_neg_mu after a few tries, or false (then the caller leaves its work). */
static bool mlp_neg_lock_handler(void)
{
    for (int i = 0; i < 5; i++) {
        if (pthread_mutex_trylock(&mlp_neg_mu) == 0)
            return true;
        (void)nanosleep(&(struct timespec){0, 200000}, NULL);
    }
    return false;
}

static void mlp_neg_defer_add(uintptr_t w)
{
    for (int i = 0; i < MLP_NEG_DEFER; i++) {
        uintptr_t none = 0;
        if (atomic_compare_exchange_strong(&mlp_neg_defer[i], &none, w)) {
            atomic_fetch_add(&mlp_neg_ndefer, 1);
            return;
        }
    }
}

static void mlp_neg_deferred_run(void)
{
    if (ml_likely(!atomic_load_explicit(&mlp_neg_ndefer, memory_order_relaxed)))
        return;
    for (int i = 0; i < MLP_NEG_DEFER; i++) {
        uintptr_t w = atomic_exchange(&mlp_neg_defer[i], 0);
        if (!w)
            continue;
        atomic_fetch_sub(&mlp_neg_ndefer, 1);
        if (w & 1)
            mlp_lmap_put_locked((struct ml_listen_rec *)(w & ~(uintptr_t)1));
        else
            mlp_lrec_release_locked((struct mlp_lrec *)w);
    }
}

void mlp_lrec_release(struct mlp_lrec *r)
{
    if (mlp_sig_in_handler()) {
        if (!mlp_neg_lock_handler()) {
            mlp_neg_defer_add((uintptr_t)r);
            return;
        }
    } else {
        pthread_mutex_lock(&mlp_neg_mu);
    }
    mlp_lrec_release_locked(r);
    mlp_neg_deferred_run();
    pthread_mutex_unlock(&mlp_neg_mu);
}

static void mlp_lrec_release_locked(struct mlp_lrec *r)
{
    if (--r->nlisten == 0 && r->lock_fd >= 0) {
        mlp_disown_fd(r->lock_fd);
        __ml_sys_close(r->lock_fd); /* drops our read lock */
        r->lock_fd = -1;
        /* The last listener on the port anywhere?  Then the record goes. */
        char name[64];
        mlp_lrec_name(name, sizeof name, r->netns, r->port);
        if (mlp_fab && __ml_fabric_reclaim_name(mlp_fab, name) > 0) {
            mlp_addr_links_drop(r->port, name);
        } else if (mlp_fab && mlp_fabric_out() && !mlp_sig_in_handler()) {
            /* Out of reach since a credential change (varnishd's manager exits as vcache,
             * tor, mpd): the record stays, dead (its lock is gone with ours).  Said once per
             * process, as exit() says so of the stat entry; nothing was said (an explorer). */
            static _Atomic bool said;
            struct stat st;
            /* Not where a fork child lets go of the lock it shares with its parent, which goes on
             * listening with it (the lock is the open file's, which the parent still has):
             * mini_httpd's request children, as nobody, said the record dead at each exit, 415
             * times for 414 requests (an explorer).  Said where the parent is gone, or cannot
             * be asked (a known sandbox: nothing said).  A parent that ends before its
             * children, still listening, says it with the record held by them. */
            int maker = r->lock_pid, saved = errno;
            bool shared = maker && maker != atomic_load(&mlp_pid) &&
                          (mlp_known_confined() || kill(maker, 0) == 0 || errno == EPERM);
            errno = saved;
            if (!shared &&
                __ml_sys_fstatat(mlp_fab->dirfd, name, &st, AT_SYMLINK_NOFOLLOW) != -ENOENT &&
                !atomic_exchange(&said, true))
                mlp_log(1, "port %d: its listener record stays in fabric %.200s (out of reach "
                           "since this process changed its credentials; dead, clients connect "
                           "over TCP): `memlan clean`, or a later process's sweep of the fabric, "
                           "removes it (said once)", r->port, mlp_fab->path);
        }
    }
}

/* ---- private channels in a shared fabric -------------------------------------------------- */

struct mlp_diag_req {
    struct nlmsghdr h;
    struct inet_diag_req_v2 q;
};

static void mlp_diag_request(struct mlp_diag_req *req, const struct mlp_addr *l,
                             const struct mlp_addr *r)
{
    memset(req, 0, sizeof *req);
    req->h.nlmsg_len = sizeof *req;
    req->h.nlmsg_type = SOCK_DIAG_BY_FAMILY;
    req->h.nlmsg_flags = NLM_F_REQUEST;
    req->h.nlmsg_seq = 1;
    req->q.sdiag_family = r->v4 ? AF_INET : AF_INET6;
    req->q.sdiag_protocol = IPPROTO_TCP;
    req->q.idiag_states = ~0u;
    req->q.id.idiag_sport = htons((uint16_t)r->port); /* the server's side: its port first */
    req->q.id.idiag_dport = htons((uint16_t)l->port);
    memcpy(req->q.id.idiag_src, r->a, r->v4 ? 4 : 16);
    memcpy(req->q.id.idiag_dst, l->a, l->v4 ? 4 : 16);
    req->q.id.idiag_cookie[0] = INET_DIAG_NOCOOKIE;
    req->q.id.idiag_cookie[1] = INET_DIAG_NOCOOKIE;
}

/* The answer to req in n bytes of u: 0 and *uid, *state, *inode (0: no file yet, an accepted
 * socket's not yet accepted); -errno; -EAGAIN when it answers another request (want_id: the
 * socket it names must be req's). */
static int mlp_diag_answer(const struct nlmsghdr *u, ssize_t n, const struct mlp_diag_req *req,
                           bool want_id, uint32_t *uid, uint8_t *state, uint32_t *inode)
{
    int e = -EIO;
    for (const struct nlmsghdr *h = u; NLMSG_OK(h, (size_t)n); h = NLMSG_NEXT(h, n)) {
        if (h->nlmsg_type == NLMSG_ERROR) {
            const struct nlmsgerr *ne = NLMSG_DATA(h);
            if (want_id && (ne->msg.nlmsg_len < sizeof *req ||
                            h->nlmsg_len < NLMSG_LENGTH(sizeof *ne + sizeof req->q) ||
                            memcmp((const char *)(ne + 1), &req->q, sizeof req->q) != 0))
                return -EAGAIN;
            return ne->error ? ne->error : -ENOENT;
        }
        if (h->nlmsg_type == SOCK_DIAG_BY_FAMILY &&
            h->nlmsg_len >= NLMSG_LENGTH(sizeof(struct inet_diag_msg))) {
            const struct inet_diag_msg *m = NLMSG_DATA(h);
            if (want_id && (m->id.idiag_sport != req->q.id.idiag_sport ||
                            m->id.idiag_dport != req->q.id.idiag_dport))
                return -EAGAIN;
            *uid = m->idiag_uid;
            *state = m->idiag_state;
            *inode = m->idiag_inode;
            return 0;
        }
    }
    return e;
}

/*
 * The server's side of our connection, as the kernel knows it (sock_diag, an exact look-up by
 * the connection's four addresses): its uid.  0 and *uid, or -errno.  (The handshake look asks
 * for the state through its own socket: mlp_hs_ask.)
 *
 * Which uid that is depends on the accept.  A socket the server has not accepted yet (in its
 * accept queue, or a request socket) carries the uid of the process that made the listening
 * socket; an accepted one that of the process whose accept made its file (the kernel's
 * sock_graft: that process's fsuid).  They differ where one user makes the listening socket and
 * another listens and accepts on it: varnishd's manager makes and binds it as root, and its
 * child worker, dropped to vcache, listens (so the port's record is made by vcache) and
 * accepts.  want: the uid we hope to see; while the server's side carries another and has no
 * file yet, we look again every 500 us, up to wait_ns, for the accept (*late: still not
 * accepted then).  The acceptor, which counted us in the record's pending, waits meanwhile for
 * our offer (MEMLAN_SERVER_WAIT_MS).  wait_ns 0: one look.
 */
static int mlp_diag_server(const struct mlp_addr *l, const struct mlp_addr *r, uint32_t want,
                           uint64_t wait_ns, uint32_t *uid, bool *late)
{
    uint8_t state;
    uint32_t inode = 0;
    if (late)
        *late = false;
    int fd = socket(AF_NETLINK, SOCK_DGRAM | SOCK_CLOEXEC, NETLINK_SOCK_DIAG);
    if (fd < 0)
        return -errno;
    struct timeval tv = {.tv_sec = 1};
    (void)mlp_real_setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    struct mlp_diag_req req;
    mlp_diag_request(&req, l, r);
    struct sockaddr_nl k = {.nl_family = AF_NETLINK};
    uint64_t end = mlp_now_ns() + wait_ns;
    int e = -EIO;
    bool again = false;
    for (int looks = 0; looks < 1000; looks++) { /* 500 us apart: a 500 ms wait at the most */
        if (mlp_real_sendto(fd, &req, sizeof req, 0, (struct sockaddr *)&k, sizeof k) < 0) {
            e = -errno;
            break;
        }
        union {
            char b[4096];
            struct nlmsghdr h;
        } u;
        ssize_t n = mlp_real_recv(fd, u.b, sizeof u.b, 0);
        if (n < 0) {
            e = errno == EAGAIN ? -ETIMEDOUT : -errno;
            break;
        }
        e = mlp_diag_answer(&u.h, n, &req, false, uid, &state, &inode);
        /* Accepted by another uid than the one we hope for: asked once more, at once.  The
         * kernel reads the uid and the inode apart (inet_sk_diag_fill: sock_i_uid, then
         * sock_i_ino, each under the socket's callback lock), and the accept's sock_graft sets
         * both between two such reads: an answer made across it has the listening socket's
         * maker's uid with the accepted file's inode.  slapd (its socket made by root, listened
         * on and accepted by openldap) lost one client of eight to TCP so, once in some 40 runs,
         * "the listener record was not made by the server's user". */
        if (e == 0 && *uid != want && inode != 0 && !again) {
            again = true;
            continue;
        }
        if ((e == 0 && (*uid == want || inode != 0)) || (e < 0 && e != -ENOENT))
            break; /* accepted (by whom it says), or the answer we hoped for, or no answer */
        if (wait_ns == 0 || mlp_now_ns() >= end) {
            if (late)
                *late = true;
            break;
        }
        /* Not accepted yet (or, before a nonblocking connect's handshake is through, not
         * there yet): the accept comes. */
        (void)nanosleep(&(struct timespec){0, 500000}, NULL);
    }
    __ml_sys_close(fd);
    return e;
}

/*
 * The sock_diag socket of mlp_handshake_open: one per process image, made at its first offer
 * and kept.  An undecided client asks it 200 ms after its offer, when the program may have
 * confined itself in a seccomp sandbox that kills for socket() (a worker keeps the connections
 * it made): a socket(AF_NETLINK) made there for each look killed the client (SIGSYS,
 * tests/preload/sandboxdiag.c).  Asked by write and read, which every sandbox that lets the
 * program talk over its sockets allows (sshd's kills for sendto and recvfrom).  The kernel
 * answers within the write; a fork sibling shares the socket and may read our answer (ours is
 * then missing: this look changes nothing) or leave us its own (known by the socket it names,
 * and passed over).  -1: not made yet; -2: cannot be.
 */
static _Atomic int mlp_hs_fd = -1;
static pthread_mutex_t mlp_hs_mu = PTHREAD_MUTEX_INITIALIZER;

/* Is this process outside any seccomp sandbox ("Seccomp:\t0" in /proc/self/status)?  Read
 * with the calls an offer makes anyway (open, read): a process already confined at its first
 * offer may be killed for socket(AF_NETLINK) (tests/preload/sandboxdiag.c "before"), and gets
 * no handshake looks (its connections wait for the accept wait, as before them). */
static bool mlp_unconfined(void) { return __ml_sys_seccomp_mode() == 0; }

static void mlp_hs_prepare(void)
{
    int none = -1;
    if (ml_load_relaxed(&mlp_hs_fd) != -1 ||
        !atomic_compare_exchange_strong(&mlp_hs_fd, &none, -3))
        return;
    int saved = errno;
    /* Asked now (a filter may have come by a system call no interposer sees since the state
     * was cached); where /proc cannot say (a chroot), the state cached before it. */
    int mode = __ml_sys_seccomp_mode();
    bool free_ = mode == 0 || (mode < 0 && !mlp_confined());
    int fd = free_ ? socket(AF_NETLINK, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, NETLINK_SOCK_DIAG)
                   : -1;
    if (fd >= 0)
        mlp_own_fd(&fd, true);
    errno = saved;
    ml_store_release(&mlp_hs_fd, fd >= 0 ? fd : -2);
}

static int mlp_hs_ask(const struct mlp_addr *l, const struct mlp_addr *r, uint8_t *state,
                      uint32_t *inode)
{
    int fd = ml_load_acquire(&mlp_hs_fd);
    if (fd < 0 || pthread_mutex_trylock(&mlp_hs_mu) != 0)
        return -EAGAIN; /* none, or another thread (or the handler's own) asks now */
    union {
        char b[4096];
        struct nlmsghdr h;
    } u;
    while (__ml_sys_read(fd, u.b, sizeof u.b) > 0)
        ; /* a fork sibling's answer, or one left by a look that ended early */
    struct mlp_diag_req req;
    mlp_diag_request(&req, l, r);
    int e = -EIO;
    uint32_t uid;
    if (__ml_sys_write(fd, &req, sizeof req) == (ssize_t)sizeof req) {
        ssize_t n = __ml_sys_read(fd, u.b, sizeof u.b);
        e = n > 0 ? mlp_diag_answer(&u.h, n, &req, true, &uid, state, inode)
                  : n < 0 ? (int)n : -EIO;
    }
    pthread_mutex_unlock(&mlp_hs_mu);
    return e;
}

static bool mlp_groupwide_ok; /* MEMLAN_FABRIC_GROUPWIDE=1: see mlp_client_offer */
static _Atomic bool mlp_full_said; /* the fabric-full note, once per process image */
static bool mlp_groupwide_read;

/* Did the user ask for group-wide channels (MEMLAN_FABRIC_GROUPWIDE=1)?  Both ends must: a
 * client offers one only to a port whose record says a listener takes them, and an acceptor
 * takes one only when it asked itself (the record is any member's to write). */
static bool mlp_groupwide(void)
{
    if (!__atomic_load_n(&mlp_groupwide_read, __ATOMIC_ACQUIRE)) {
        /* as the environment has it now, else as at start-up (see mlp_fabric_dir) */
        const char *g = getenv("MEMLAN_FABRIC_GROUPWIDE");
        mlp_groupwide_ok = g ? strcmp(g, "1") == 0 : mlp_cfg.groupwide;
        __atomic_store_n(&mlp_groupwide_read, true, __ATOMIC_RELEASE);
    }
    return mlp_groupwide_ok;
}

static int mlp_uid_cmp(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? -1 : x > y;
}

/* The entry for the record of port in namespace netns (cur: ours), or NULL.  mlp_neg_mu. */
static struct mlp_lrec *mlp_lrec_entry(const char *netns, int port, const char *cur)
{
    struct mlp_lrec *rec = NULL;
    if (port > 0 && port < 65536 && strcmp(netns, cur) == 0)
        rec = mlp_lrecs[port];
    for (struct mlp_lrec *x = mlp_xrecs; !rec && x; x = x->next)
        if (x->port == port && strcmp(x->netns, netns) == 0)
            rec = x;
    return rec;
}

/*
 * Client, in a fabric shared on purpose: the users who may accept on the record's port, the
 * only ones our channel's file is granted to (acl.c).  They are the record's owner (the euid of
 * its first listener) and the named users of the record's ACL (listeners that changed their
 * euid since, cred.c), which only the record's owner or a privileged process can write, so no
 * member of the group can add itself.  A record owned by root or by us is believed; one owned by
 * another user only when the kernel says that the socket accepting our connection was made by
 * that user (sock_diag, once per record file): any member could create a port's record before
 * its server does.  That look waits for the server's accept, up to MEMLAN_SERVER_WAIT_MS,
 * where the listening socket was made by another user than the record's (mlp_diag_server:
 * varnishd's child, restarted, listens as vcache on its manager's socket, made as root; the
 * look came before the child's accept and said root, and the first client after each new
 * record went over TCP, "not made by the server's user").  The lock is not held meanwhile.
 * NULL and acc filled, or why not to offer.
 */
static const char *mlp_lrec_access(const char *netns, int port, const struct mlp_addr *l,
                                   const struct mlp_addr *r, struct ml_access *acc)
{
    memset(acc, 0, sizeof *acc);
    uint32_t me = (uint32_t)geteuid();
    uint32_t u[ML_ACCESS_MAX + 1];
    const char *why = NULL;
    struct stat st;
    char cur[24];
    mlp_netns(cur);
    pthread_mutex_lock(&mlp_neg_mu);
    /* Found again under the lock: another namespace's entry may have been dropped since. */
    struct mlp_lrec *rec = mlp_lrec_entry(netns, port, cur);
    if (!rec) {
        pthread_mutex_unlock(&mlp_neg_mu);
        return "the server's listener record went away";
    }
    int fd = rec->check_fd >= 0 ? rec->check_fd : rec->lock_fd;
    int n = fd < 0 ? -EBADF : __ml_sys_fstat(fd, &st);
    if (n == 0) {
        n = __ml_acl_users(fd, u, ML_ACCESS_MAX);
        if (n == -EOPNOTSUPP || n == -ENODATA)
            n = 0; /* no ACLs here: the owner alone */
    }
    bool vouch = false;
    if (n == -E2BIG)
        why = "the server's record names more accepting users than a channel can be granted to";
    else if (n < 0)
        why = "the server's listener record cannot be read";
    else
        vouch = st.st_uid != 0 && st.st_uid != me &&
                !(rec->vouched_ino == st.st_ino && rec->vouched_uid == st.st_uid &&
                  mlp_addr_eq(&rec->vouched_at, r) && rec->vouched_at.port == r->port);
    pthread_mutex_unlock(&mlp_neg_mu);
    if (why)
        return why;
    if (vouch) {
        uint32_t k = 0;
        bool late = false;
        int e = mlp_diag_server(l, r, (uint32_t)st.st_uid,
                                (uint64_t)mlp_cfg.server_wait_ms * 1000000u, &k, &late);
        if (e == 0 && k == st.st_uid) {
            pthread_mutex_lock(&mlp_neg_mu);
            rec = mlp_lrec_entry(netns, port, cur);
            if (rec) { /* another record file since: its own look */
                rec->vouched_ino = st.st_ino;
                rec->vouched_uid = st.st_uid;
                rec->vouched_at = *r;
            }
            pthread_mutex_unlock(&mlp_neg_mu);
        } else if (late) {
            /* Until the accept the kernel names only the listening socket's maker. */
            static __thread char lw[200];
            char by[48] = "no server side yet";
            if (e == 0)
                snprintf(by, sizeof by, "listening socket made by uid %u", (unsigned)k);
            snprintf(lw, sizeof lw,
                     "the server did not accept within %d ms: its record's user (uid %u) is not "
                     "vouched for by the kernel (%s)",
                     mlp_cfg.server_wait_ms, (unsigned)st.st_uid, by);
            return lw;
        } else {
            return "the listener record was not made by the server's user (another member of "
                   "the shared fabric may have made it)";
        }
    }
    u[n++] = (uint32_t)st.st_uid;
    qsort(u, (size_t)n, sizeof u[0], mlp_uid_cmp);
    for (int i = 0; i < n; i++) {
        if (u[i] == me || (i > 0 && u[i] == u[i - 1]))
            continue;
        if (acc->n == ML_ACCESS_MAX)
            return "the server's record names more accepting users than a channel can be granted "
                   "to";
        acc->uids[acc->n++] = u[i];
    }
    return NULL;
}

/*
 * Listener, about to change its euid to uid (cred.c, before the call, while it still owns the
 * record or is privileged): name uid in the ACL of the record of every port it listens on in a
 * shared fabric, so that clients grant it their channels.  Where that fails (not the record's
 * owner, a file system without ACLs) the port's clients do not offer: the new euid could not
 * open their channels.
 */
/* Name uid in the ACL of r's record (mlp_neg_mu held); 0 or -errno, said in the log.  Failing,
 * the port's clients do not offer (ML_NO_OFFER_GRANT). */
static int mlp_lrec_grant_one(struct mlp_lrec *r, uid_t uid)
{
    struct stat st;
    bool known = __ml_sys_fstat(r->lock_fd, &st) == 0;
    if (known && st.st_uid == uid)
        return 0;
    /* Named already in this very file: a server that toggles its euid (postfix's master, some
     * thirty seteuid calls as it starts) rewrote the ACL and logged the line at each. */
    if (known && r->granted_uid == uid && r->granted_ino == st.st_ino && st.st_ino != 0)
        return 0;
    /* Several workers may do this at once (each with its own euid): the read-modify-write of the
     * ACL goes under a write lock on byte 1 of the record, through a new open file (the workers
     * share the listener's), waited for at most 200 ms. */
    char name[64];
    mlp_lrec_name(name, sizeof name, r->netns, r->port);
    long lfd = __ml_sys_open(mlp_fab->dirfd, name, O_RDWR | O_NOFOLLOW, 0);
    int e = (int)(lfd < 0 ? lfd : 0);
    if (lfd >= 0) {
        struct stat st2;
        e = -EAGAIN;
        for (int i = 0; i < 200 && e == -EAGAIN; i++) {
            e = __ml_sys_lock_byte((int)lfd, 1, 0);
            if (e == -EAGAIN || e == -EACCES) {
                (void)nanosleep(&(struct timespec){0, 1000000}, NULL);
                e = -EAGAIN;
            }
        }
        if (e == 0 && (__ml_sys_fstat((int)lfd, &st2) < 0 || st2.st_ino != st.st_ino))
            e = -ESTALE;
        if (e == 0)
            e = __ml_acl_add_user((int)lfd, (uint32_t)uid);
        (void)__ml_sys_unlock_range((int)lfd, 1, 1); /* see __ml_sys_unlock_range */
        __ml_sys_close((int)lfd);
    }
    if (e < 0) {
        if (r->map && !ml_load_relaxed(&r->map->no_offer))
            ml_store_release(&r->map->no_offer, ML_NO_OFFER_GRANT);
        /* Another user's record is theirs to change: one left by their server that died (a
         * signal: no exit handler) stays in a sticky directory until `memlan clean` (an
         * explorer's runs as root kept a later user's server on TCP, with no word of why). */
        if (known && st.st_uid != geteuid())
            mlp_log(0, "port %d: cannot name euid %u as an acceptor in the shared fabric's "
                       "record, which uid %u made (%s): its clients will not offer; if no "
                       "server of uid %u listens on the port, `memlan clean` run by that user or "
                       "root removes the record its dead server left", r->port, (unsigned)uid,
                    (unsigned)st.st_uid, strerror(-e), (unsigned)st.st_uid);
        else
            mlp_log(0, "port %d: cannot name euid %u as an acceptor in the shared fabric's record "
                       "(%s): its clients will not offer", r->port, (unsigned)uid, strerror(-e));
    } else {
        r->granted_uid = uid;
        r->granted_ino = st.st_ino;
        mlp_log(1, "port %d: euid %u may accept private channels", r->port, (unsigned)uid);
    }
    return e;
}

/*
 * Listener, about to change its euid to uid (cred.c, before the call, while it still owns the
 * record or is privileged): name uid in the ACL of the record of every port it listens on in a
 * shared fabric, so that clients grant it their channels.  Where that fails (not the record's
 * owner, a file system without ACLs) the port's clients do not offer: the new euid could not
 * open their channels.
 */
void mlp_lrec_grant(uid_t uid)
{
    if (!mlp_fab || !mlp_fab->shared || uid == (uid_t)-1)
        return;
    /* Only tried: setuid is async-signal-safe, and a handler installed by signal() (which we do
     * not see as one) may call it while its thread holds the lock.  Not granted, the new euid
     * cannot open its clients' offers: its first accept says so in the record (ML_NO_OFFER_CRED)
     * and the port's connections go on over TCP. */
    if (pthread_mutex_trylock(&mlp_neg_mu) != 0) {
        mlp_log(1, "shared fabric: uid %u not named in our listeners' records (busy): their "
                "connections will stay on TCP", (unsigned)uid);
        return;
    }
    for (int port = 0; port < 65536; port++) {
        struct mlp_lrec *r = mlp_lrecs[port];
        if (r && r->nlisten > 0 && r->lock_fd >= 0)
            (void)mlp_lrec_grant_one(r, uid);
    }
    pthread_mutex_unlock(&mlp_neg_mu);
}

/* ---- the client side --------------------------------------------------------------------- */

struct mlp_pending {
    char netns[24];           /* the listener's namespace (a copy: the entry may be dropped) */
    struct ml_listen_rec *map;
    bool other_ns;            /* the listener is in another namespace (found by an la- name) */
    const char *no_offer;     /* set: we do not offer, and did not count ourselves in, because */
};

static void mlp_pending_done(struct mlp_pending *p)
{
    struct ml_listen_rec *m = p->map;
    if (p->no_offer) {
        mlp_lmap_put(m);
        return; /* never counted in */
    }
    /* SYNC: the offer was linked before this release; an acceptor that sees pending fall to 0
     * (acquire) and then finds no offer knows the client posted none. */
    if (atomic_fetch_sub_explicit(&m->pending, 1, memory_order_acq_rel) == 1 &&
        ml_load_acquire(&m->waiters))
        __ml_sys_futex_wake(&m->pending, INT32_MAX);
    mlp_lmap_put(m);
}

void mlp_on_connect_start(int fd, const struct sockaddr *addr, socklen_t len, void **token)
{
    *token = NULL;
    struct mlp_addr a;
    if (mlp_cfg.off || !addr || !mlp_addr_of(addr, len, &a) || mlp_fd_is_ours(fd))
        return;
    const char *why;
    if (!mlp_port_allowed(a.port, &why) || !mlp_fabric())
        return;
    /* A non-loopback address may be another namespace's listener's (see mlp_addr_link);
     * loopback is every namespace's own. */
    char ns[24], cur[24];
    mlp_netns(cur);
    bool other = !mlp_addr_loopback(&a) && !mlp_addr_wild(&a) &&
                 mlp_addr_netns(&a, ns, sizeof ns) && strcmp(ns, cur) != 0;
    struct ml_listen_rec *lm;
    struct mlp_lrec *r = mlp_lrec_find(other ? ns : cur, a.port, &lm);
    if (!r)
        return;
    const char *rns = other ? ns : cur;
    const char *no = mlp_cred_lost_here(false) ? mlp_cred_why
                     : mlp_exiting()      ? "exit() has begun in this process"
                     : mlp_zerocopy_on(fd)
                         ? "SO_ZEROCOPY is set on the socket (MSG_ZEROCOPY completions are the "
                           "kernel's)"
                         : mlp_no_offer_why(lm);
    if (no) {
        struct mlp_pending *p = malloc(sizeof *p);
        if (p)
        {
            *p = (struct mlp_pending){.map = lm, .other_ns = other, .no_offer = no};
            snprintf(p->netns, sizeof p->netns, "%s", rns);
        }
        else
            mlp_lmap_put(lm);
        *token = p;
        return;
    }
    /* The fabric's lazy sweep (opening and lock-probing every file in it, tens of milliseconds
     * when it holds thousands) runs before the first file a process creates.  Not between our
     * connect and our offer, where the acceptor waits only MEMLAN_SERVER_WAIT_MS: now.  And
     * once per 10 s per port among all its clients: a client that sees a recent sweep skips. */
    if (!ml_load_relaxed(&mlp_fab->swept)) {
        uint32_t now_s = (uint32_t)(__ml_now_ns() / 1000000000u);
        uint32_t last = ml_load_relaxed(&lm->swept_s);
        if (last && now_s - last < 10) {
            ml_store_relaxed(&mlp_fab->swept, true);
        } else {
            ml_store_relaxed(&lm->swept_s, now_s ? now_s : 1);
            __ml_fabric_sweep_once_ask(mlp_fab, !mlp_confined());
        }
    }
    struct mlp_pending *p = malloc(sizeof *p);
    if (!p) {
        mlp_lmap_put(lm);
        return;
    }
    snprintf(p->netns, sizeof p->netns, "%s", rns);
    p->map = lm;
    p->other_ns = other;
    p->no_offer = NULL;
    /* Tell the acceptor to look up our link-layer address: it does that (two rtnetlink round
     * trips) only for a record some client of another namespace has used. */
    if (other && !ml_load_relaxed(&lm->xns))
        ml_store_release(&lm->xns, 1u);
    /* SYNC: before connect(): an acceptor that sees our connection sees this count. */
    atomic_fetch_add_explicit(&p->map->pending, 1, memory_order_seq_cst);
    *token = p;
}

static bool mlp_is_tcp(int fd)
{
    int type = 0, proto = 0;
    socklen_t l = sizeof type;
    if (getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &l) < 0 || type != SOCK_STREAM)
        return false;
    l = sizeof proto;
    return getsockopt(fd, SOL_SOCKET, SO_PROTOCOL, &proto, &l) == 0 && proto == IPPROTO_TCP;
}

struct ml_sock_side *mlp_side_block(memlan_channel_t *ch, int side)
{
    return (struct ml_sock_side *)(ch->seg->base + ML_CHAN_SOCK_OFF) + side;
}

static bool mlp_fd_cloexec(int fd)
{
    long f = __ml_sys_fcntl(fd, F_GETFD, 0);
    return f > 0 && (f & FD_CLOEXEC);
}

/* Client, to a listener in another namespace: NULL when the route to the peer is a direct link
 * (no router, so no NAT on it), with our interface's link-layer address in mac; else why not. */
static const char *mlp_direct_link(const struct mlp_addr *l, const struct mlp_addr *r,
                                   uint8_t mac[6])
{
    struct mlp_route rt;
    if (mlp_addr_loopback(l))
        return "the peer is not on this host";
    if (mlp_route_to(r, &rt) < 0)
        return "no route to the peer's namespace found";
    if (rt.gateway)
        return "the peer's namespace is reached through a router (NAT possible): only a direct "
               "link (bridge, veth) is accelerated across namespaces";
    if (mlp_if_mac(rt.oif, mac) < 0)
        return "the link to the peer's namespace has no link-layer address";
    return NULL;
}

static int mlp_client_offer(int fd, struct mlp_addr *l, struct mlp_addr *r, const char *netns,
                            const uint8_t *mac, struct ml_listen_rec *lmap,
                            const struct ml_access *acc, const char **why)
{
    memlan_fabric_t *fab = mlp_fab;
    uint32_t hint = ml_load_relaxed(&lmap->ring_hint);
    memlan_channel_t *ch;
    int e = __ml_chan_create_pooled_for(fab, mlp_ring_size(fd, hint),
                                        mlp_ring_grow(fd, hint), acc, &ch);
    if (e == -EOPNOTSUPP && acc) {
        /* A shared fabric on a file system without POSIX ACLs: no channel can be private to its
         * two ends.  Files every member can open only when the user asked for them. */
        bool gw = mlp_groupwide();
        mlp_say(MLP_SAID_FABRIC, "fabric %.200s: its file system has no POSIX ACLs, so a channel "
                "cannot be private to its two ends: %s", fab->path,
                gw ? "channels to other users are readable and writable by every member where "
                     "the server asks for that too (MEMLAN_FABRIC_GROUPWIDE=1 on both sides)"
                   : "connections to other users stay on TCP "
                     "(MEMLAN_FABRIC_GROUPWIDE=1 on both sides shares them with every member)");
        if (gw && ml_load_acquire(&lmap->groupwide))
            e = __ml_chan_create_pooled(fab, mlp_ring_size(fd, hint),
                                        mlp_ring_grow(fd, hint), &ch);
        else if (gw)
            e = -EPERM;
    }
    if (e == -ENOSPC && !atomic_exchange(&mlp_full_said, true))
        /* Every connection after this one may stay on TCP too: said once, not only logged (a
         * container's 64 MB /dev/shm holds about a hundred default channels). */
        mlp_say(MLP_SAID_FULL, "fabric %.200s is full (no space for a channel): new connections "
                "stay on TCP until space is freed (memlan stat shows what holds it; --ring-kb "
                "makes channels smaller)", fab->path);
    if (e < 0) {
        *why = e == -ENOSPC       ? "fabric full (no space for a channel)"
               : e == -EOPNOTSUPP ? "the shared fabric's file system has no POSIX ACLs: a channel "
                                    "to another user cannot be private"
               : e == -EPERM ? "the shared fabric's file system has no POSIX ACLs and the server "
                               "does not take channels every member can open (it would need "
                               "MEMLAN_FABRIC_GROUPWIDE=1 too)"
               : e == -EMFILE || e == -ENFILE
                   ? "no descriptor left for the channel's file (the process's or the system's "
                     "limit)"
               : e == -ENOMEM ? "channel creation failed (out of memory or mappings)"
                              : "channel creation failed";
        return e;
    }
    /* (Unknown, /proc out of reach: the ring alone.  Passed as 0, it left the offer no room at
     * all: never writable, each send waiting for the server's accept; vsftpd's chrooted session
     * connects to an ftp client that accepts after the reply vsftpd sends once its connect
     * is writable, and every active-mode transfer waited out MEMLAN_ACCEPT_QUEUE_MS.) */
    uint64_t takes = mlp_offer_takes();
    __ml_chan_offer_limit(ch, takes ? takes : ch->size);
    mlp_own_fd(&ch->seg->fd, mlp_fd_cloexec(fd));
    char name[160];
    mlp_offer_name(name, sizeof name, netns, l, r, mac);
    /* The offer: the channel's file under the offer's name, a hard link made after the name is
     * written into the channel (the acceptor checks it there; see layout.h). */
    struct ml_offer_blk *ob = (struct ml_offer_blk *)(ch->seg->base + ML_CHAN_OFFER_OFF);
    size_t nlen = strlen(name);
    char segname[80];
    long ofd = -ENAMETOOLONG;
    if (nlen < sizeof ob->name) {
        memcpy(ob->token, ch->seg->token, ML_TOKEN_HEX);
        memcpy(ob->name, name, nlen);
        ml_store_release((_Atomic uint32_t *)&ob->name_len, (uint32_t)nlen);
        __ml_fabric_name(segname, sizeof segname, "seg", ch->seg->token);
        ofd = __ml_sys_linkat(fab->dirfd, segname, fab->dirfd, name);
    }
    if (ofd == -EEXIST) {
        /* The acceptor got there first and refused ("R"), or a stale offer has our name. */
        char buf[4] = "";
        long rfd = __ml_sys_open(fab->dirfd, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK, 0);
        struct stat rst;
        if (rfd >= 0) { /* a refusal is a regular file: a planted FIFO must not hold us */
            if (__ml_sys_fstat((int)rfd, &rst) == 0 && S_ISREG(rst.st_mode))
                (void)__ml_sys_read((int)rfd, buf, 1);
            __ml_sys_close((int)rfd);
        }
        __ml_sys_unlinkat(fab->dirfd, name, 0);
        *why = buf[0] == 'R' ? "the server accepted before our offer arrived and refused it"
                             : "a stale offer had this connection's name";
        mlp_disown_fd(ch->seg->fd);
        __ml_chan_end(ch);
        return -EEXIST;
    }
    if (ofd < 0) {
        *why = "could not post the offer";
        mlp_disown_fd(ch->seg->fd);
        __ml_chan_end(ch);
        return (int)ofd;
    }

    struct mlp_sock *s = mlp_sock_new(MLP_CONN);
    if (!s) {
        __ml_sys_unlinkat(fab->dirfd, name, 0);
        mlp_disown_fd(ch->seg->fd);
        __ml_chan_end(ch);
        *why = "out of memory";
        return -ENOMEM;
    }
    s->ch = ch;
    ch->rx_lowat = mlp_lowat_of(fd);
    s->side = 0;
    s->me = mlp_side_block(ch, 0);
    ml_store_relaxed(&s->me->holders, 1u);
    long fl = mlp_real_fcntl(fd, F_GETFL, 0);
    ml_store_relaxed(&s->me->flags, mlp_linger_flag(fd));
    mlp_set_nonblock(s, fl > 0 && (fl & O_NONBLOCK));
    s->state = MLP_UNDECIDED;
    if (fl > 0 && (fl & O_ASYNC)) /* set before connect: SIGIO for the channel (mlp_async) */
        mlp_async(s, fd, true);
    s->lmap = mlp_lmap_hold(lmap) ? lmap : NULL; /* put by mlp_sock_destroy */
    mlp_sock_liveness(ch, fd);
    s->offer_ns = mlp_now_ns();
    snprintf(s->offer, sizeof s->offer, "%s", name);
    if (!mac)
        mlp_hs_prepare(); /* for mlp_handshake_open, before any sandbox (there) */
    s->slot = mlp_proc_slot();
    s->stat_fd = fd;
    mlp_slot_fill(s->slot, ML_CONN_WAIT, fd, l, r, ch->seg->token, "offer posted, not yet taken");
    mlp_install(fd, s);
    mlp_put(s);
    return 0;
}

static void mlp_withdraw(struct mlp_sock *s, int fd, const char *why);

void mlp_on_connect_done(int fd, const struct sockaddr *addr, socklen_t len, void *token, int rc,
                         int err)
{
    struct mlp_pending *p = token;
    /* EINTR: a signal cut the wait short, and the kernel goes on connecting, as for EINPROGRESS
     * (a second connect says 0 or EALREADY).  The offer is posted now: posted at that second
     * connect, it came after the server had accepted the connection over TCP, nobody took it,
     * and the request waited in the ring for the accept wait (tests/preload/connectintr.c). */
    /* A connect that completes one in progress (a nonblocking connect, then a second connect
     * that says 0, as ab and libevent complete theirs) decided TCP at the first: it is not
     * decided, nor logged, again (every connection of `ab -n 2000` was logged twice: an
     * explorer).  (EALREADY and EISCONN return below.) */
    /* The inode says it is that socket still: a close we do not see (fclose of an fdopen'd
     * socket, inside libc) left the note, and the next socket at the number, connecting to a
     * memlan listener, stayed on TCP with nothing said (a review). */
    struct mlp_fdrec *rec = rc == 0 ? mlp_fdrec(fd) : NULL;
    uint64_t was = rec && ml_load_relaxed(&rec->tcp_pending) ? atomic_exchange(&rec->tcp_pending, 0)
                                                              : 0;
    struct stat wst;
    bool done_before = was && __ml_sys_fstat(fd, &wst) == 0 && (uint64_t)wst.st_ino == was;
    if ((rc < 0 && err != EINPROGRESS && err != EINTR) || done_before) {
        if (p) {
            mlp_pending_done(p);
            __ml_free(p);
        }
        return;
    }
    if (mlp_fd_is_ours(fd) || !mlp_is_tcp(fd)) {
        if (p) {
            mlp_pending_done(p);
            __ml_free(p);
        }
        return;
    }
    struct mlp_addr l, r;
    bool have = mlp_sock_addrs(fd, &l, &r, addr, len) == 0;
    const char *why = NULL;
    uint8_t mac[6];
    if (mlp_cfg.off)
        why = "memlan is off (MEMLAN_OFF)";
    else if (!have)
        why = "addresses unavailable";
    else if (!mlp_port_allowed(r.port, &why))
        ;
    else if (!mlp_fab)
        why = mlp_fab_error[0] ? mlp_fab_error : "no fabric";
    else if (!(mlp_addr_loopback(&r) || mlp_addr_eq(&l, &r) || (p && p->other_ns)))
        why = "the peer is not on this host";
    else if (p && p->other_ns && !p->no_offer && (why = mlp_direct_link(&l, &r, mac)))
        ;
    else if (!p)
        /* a process out of reach of the fabric finds no record either: its own reason first
         * (proftpd's and vsftpd's active-mode data connections, made after the drop to the
         * user's account, read "no memlan listener" while the client's listener was there) */
        why = mlp_cred_lost_here(false) ? mlp_cred_why : mlp_no_listener_why;
    else if (p->no_offer)
        why = p->no_offer;
    else if (mlp_cred_lost_here(false))
        why = mlp_cred_why;
    else if (mlp_exiting())
        why = "exit() has begun in this process";
    if (!why)
        why = mlp_epoll_adoptable(fd);
    struct ml_access acc;
    if (!why && mlp_fab->shared)
        why = mlp_lrec_access(p->netns, r.port, &l, &r, &acc);
    if (!why)
        (void)mlp_client_offer(fd, &l, &r, p->netns, p->other_ns ? mac : NULL, p->map,
                               mlp_fab->shared ? &acc : NULL, &why);
    if (p) {
        mlp_pending_done(p);
        __ml_free(p);
    }
    if (why) {
        /* A nonblocking connect that the kernel refused already (loopback answers within the
         * call) made no connection, as a blocking one that failed: no line, no entry (a gearman
         * worker retrying a stopped server wrote 733,297 lines in 20 s: an explorer). */
        struct pollfd k = {.fd = fd, .events = POLLOUT};
        int saved = errno;
        bool refused = rc < 0 && mlp_real_poll(&k, 1, 0) == 1 && (k.revents & (POLLERR | POLLHUP));
        errno = saved;
        if (!refused) {
            mlp_stat_tcp_addrs(fd, have ? &l : NULL, have ? &r : NULL, why);
            if (why == mlp_no_listener_why)
                mlp_no_listener_hint();
            struct mlp_fdrec *pend = rc < 0 ? mlp_fdrec_make(fd) : NULL;
            struct stat pst;
            if (pend && __ml_sys_fstat(fd, &pst) == 0 && pst.st_ino)
                ml_store_relaxed(&pend->tcp_pending, (uint64_t)pst.st_ino);
        }
        return;
    }
    mlp_log(1, "fd %d: offer posted for port %d", fd, r.port);
    /* An epoll set the program put the socket in before this connect watches the kernel's
     * socket for the program's events: it must watch ours now, or it never reports the peer's
     * bytes (nginx's upstream connections hung so). */
    if ((why = mlp_epoll_adopt(fd))) {
        struct mlp_sock *s = mlp_get(fd);
        if (s) {
            mlp_withdraw(s, fd, why);
            mlp_put(s);
        }
    }
}

/*
 * No listener of the port in our fabric, and the fabric is the default, this user's own: a
 * server that runs as another user (clamd as clamav, started as root, listens after its drop)
 * publishes in its own, and both logs said only "no memlan listener" and "not memlan (no offer)"
 * (an explorer).  A server that could not publish at all (saned as saned, exec'd by inetd with
 * the default fabric carried across: "cannot publish (Permission denied)") is named too, where
 * the hint alone sent a user looking for a fabric that does not exist (an explorer).  Said once
 * per process, in the log.
 */
static void mlp_no_listener_hint(void)
{
    static _Atomic bool said;
    if (mlp_fabric_dir() || mlp_carry_fabric[0] || !mlp_fab || atomic_exchange(&said, true))
        return;
    mlp_log(1, "this process's fabric is %s, the default: this user's own (uid %u); a server "
               "running as another user publishes in its own, and one that could not publish "
               "(its own log says why) publishes nowhere.  Both under one fabric: `memlan "
               "fabric create --group GROUP DIR`, then `memlan run --fabric DIR` (said once)",
            mlp_fab->path, (unsigned)getuid());
}

/* Set by close() around the socket's teardown: the offer's name is removed only after the kernel
 * socket is closed.  An acceptor that then finds no offer also finds the FIN, and says that the
 * client closed rather than that it is not memlan. */
__thread char *mlp_defer_offer_unlink __attribute__((tls_model("initial-exec")));

void mlp_offer_gone(struct mlp_sock *s)
{
    if (s->offer[0] && mlp_fab) {
        if (mlp_defer_offer_unlink && !mlp_defer_offer_unlink[0])
            memcpy(mlp_defer_offer_unlink, s->offer, sizeof s->offer);
        else
            __ml_sys_unlinkat(mlp_fab->dirfd, s->offer, 0);
        s->offer[0] = 0;
    }
}

/* The offer was claimed: its acceptor removed the name, except in a shared fabric whose sticky
 * directory lets only the name's owner (us) remove it; then we do. */
static void mlp_offer_claimed(struct mlp_sock *s)
{
    if (s->offer[0] && mlp_fab && mlp_fab->shared)
        (void)__ml_sys_unlinkat(mlp_fab->dirfd, s->offer, 0);
    s->offer[0] = 0;
}

/* An undecided client's close found its offer claimed (its withdrawal lost): the connection was
 * accelerated, and the acceptor may have read all it wrote.  Said as mlp_decide says it: a
 * client that only wrote into the ring and closed (logger, a log forwarder's last connection)
 * had never looked again, and its log and `memlan stat` said nothing of the connection but
 * "offer posted, not yet taken" (tests/py/test_apps_logs.py). */
void mlp_claimed_at_close(struct mlp_sock *s, int fd)
{
    mlp_offer_claimed(s);
    mlp_stat_conn(s, fd, "");
    mlp_log(1, "fd %d: accelerated (client)", fd);
}

void mlp_offer_unlink_name(const char *name)
{
    if (name[0] && mlp_fab)
        __ml_sys_unlinkat(mlp_fab->dirfd, name, 0);
}

static short mlp_look_events(int fd, short events, bool raw);

/* Send the bytes that went into the ring of a withdrawn offer over TCP.  0 when all are out,
 * -EAGAIN when the socket would block (nonblocking), or the kernel's error.  tx lock held.  A
 * kernel socket that holds an error (a reset before the server accepted: its listener closed,
 * the server died) gets none of them: over TCP they were in its buffers, and the reset dropped
 * them.  Sent, they took the error (the kernel's send reports and clears it), and the program's
 * read said end of file where TCP says ECONNRESET (Node, Ruby, Perl, Python, curl's "Empty reply
 * from server": an explorer).  Not looked at in a sandbox that may kill the poll. */
int mlp_flush_unsent(struct mlp_sock *s, int fd, bool block);
int mlp_flush_unsent(struct mlp_sock *s, int fd, bool block)
{
    bool looked = false;
    for (;;) {
        const void *p;
        size_t n = __ml_chan_unsent(s->ch, &p);
        if (n == 0)
            return 0;
        if (!looked && !mlp_known_confined()) {
            looked = true;
            int saved = errno;
            bool err = mlp_look_events(fd, POLLOUT, true) & POLLERR;
            if (err) {
                /* An error, and a connection that is over: not a report waiting on the error
                 * queue (IP_RECVERR, MSG_ZEROCOPY's) of one still up.  Asked without taking
                 * the error (SO_ERROR would). */
                struct tcp_info ti;
                socklen_t tl = sizeof ti;
                err = mlp_real_getsockopt(fd, IPPROTO_TCP, TCP_INFO, &ti, &tl) == 0 &&
                      tl >= 1 && ti.tcpi_state == TCP_CLOSE;
            }
            errno = saved;
            if (err) {
                size_t all = 0;
                for (; n; n = __ml_chan_unsent(s->ch, &p)) {
                    __ml_chan_unsent_done(s->ch, n);
                    all += n;
                }
                mlp_log(1, "fd %d: %zu bytes written before the server took the connection are "
                           "dropped with it (the kernel socket holds an error: a reset), as over "
                           "TCP", fd, all);
                return 0;
            }
        }
        ssize_t w = mlp_real_send(fd, p, n, MSG_DONTWAIT | MSG_NOSIGNAL);
        if (w > 0) {
            __ml_chan_unsent_done(s->ch, (size_t)w);
            continue;
        }
        int e = w < 0 ? errno : EIO;
        if (e == EINTR)
            continue;
        if (e == EFAULT && __ml_guard_fault_in(p, n))
            return -ECONNRESET; /* the ring's file was shrunk under us: those bytes are lost */
        if (e != EAGAIN || !block)
            return -e;
        struct pollfd pf = {.fd = fd, .events = POLLOUT};
        if (mlp_real_poll(&pf, 1, 1000) < 0 && errno != EINTR)
            return -errno;
    }
}

/* Withdraw an undecided client's offer (CAS `attached` 0 -> 2): TCP from then on, unless the
 * acceptor's claim came first.  Either way the state is settled or about to be (mlp_decide). */
static void mlp_withdraw(struct mlp_sock *s, int fd, const char *why)
{
    pthread_mutex_lock(&s->mu);
    if (s->state == MLP_UNDECIDED) {
        int w = __ml_chan_withdraw(s->ch);
        if (w == 0 || w == -EPROTO) { /* -EPROTO: broken, nobody can attach */
            /* Our side of the channel is published reset and closed: if the word was
             * overwritten after an acceptor claimed the offer (only garbage can make a 1 read as
             * 2 or anything else), that acceptor reads the ring and would wait there for ever
             * while we talk TCP; it ends instead (ECONNRESET), and its close reaches us over
             * TCP.  Nobody else can attach any more. */
            /* A shutdown while undecided owes the kernel socket's FIN after the ring's bytes
             * (mlp_shut_owed_pay); a fork sibling's is in our side's state, not in our flag (a
             * child that shut down and exited before this withdrawal: its bytes went over TCP
             * and the FIN never did, and the server waited for it: a review).  Taken before the
             * state becomes closed below. */
            if (ml_load_acquire(&s->ch->hdr->side_state[s->ch->side]) == ML_SIDE_SHUT_WR)
                atomic_store(&s->shut_owed, true);
            atomic_fetch_or(&s->me->flags, ML_SOCK_RESET);
            __ml_chan_abandon(s->ch);
            s->state = MLP_TCP;
            if (s->lmap && s->offer[0])
                mlp_lrec_mark(s->lmap, mlp_withdrawal_key(s->offer)); /* before the name goes */
            mlp_offer_gone(s);
            mlp_stat_conn(s, fd, why);
            mlp_log(1, "fd %d: TCP (%s)", fd, why);
        }
    }
    pthread_mutex_unlock(&s->mu);
}

/*
 * What the kernel socket under fd says, asked without taking anything from it: 1 bytes (the
 * peer spoke over TCP), 0 its end (a FIN, or an error: a connect refused, a reset), -1 nothing
 * yet.  A MSG_PEEK recv alone took a pending error (the kernel's sock_error clears it as it
 * reports it): a nonblocking connect refused at an address the port's memlan listener does not
 * listen on (a client of "localhost" trying ::1 first, the server on 127.0.0.1 only) then said
 * SO_ERROR 0 and POLLOUT without POLLERR, "connected", and its send EPIPE
 * (tests/preload/connrefused.c); an accepted socket reset before accept read EOF, not
 * ECONNRESET.  poll reports an error and leaves it; the peek follows only on POLLIN, where the
 * kernel returns bytes or a FIN's end before any error.  errno is kept.
 */
/* fd's poll events now, asked by the system call itself (raw) where no cancellation may act
 * (glibc's poll is a cancellation point), else through libc. */
static short mlp_look_events(int fd, short events, bool raw)
{
    struct pollfd p = {.fd = fd, .events = events};
    struct timespec zero = {0, 0};
    long n = raw ? __ml_sys_raw(SYS_ppoll, (long)&p, 1, (long)&zero, 0, 0, 0)
                 : mlp_real_poll(&p, 1, 0);
    return n == 1 ? p.revents : 0;
}

static int mlp_tcp_look_by(int fd, bool raw)
{
    int saved = errno, r = -1;
    short ev = mlp_look_events(fd, POLLIN | POLLRDHUP, raw);
    char c;
    if (ev & (POLLERR | POLLNVAL))
        r = 0;
    else if (ev & POLLIN)
        r = (raw ? __ml_sys_raw(SYS_recvfrom, fd, (long)&c, 1, MSG_PEEK | MSG_DONTWAIT, 0, 0)
                 : mlp_real_recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT)) > 0;
    else if (ev & POLLHUP)
        r = 0;
    errno = saved;
    return r;
}

static int mlp_tcp_look(int fd) { return mlp_tcp_look_by(fd, false); }

/*
 * Is our handshake still open on the server's side while bytes wait in our ring?  A server's
 * kernel whose accept queue was full when our last ACK came dropped that ACK.  Then either it
 * holds a request socket (TCP_SYN_RECV) and completes the handshake when TCP data comes or at
 * its SYN-ACK retransmits, 1 s and then 3 s later; or, when more SYNs were pending than the
 * backlog, it had answered ours with a SYN cookie and holds nothing at all (the look-up finds
 * the listener), and only a segment of ours can complete it.  Over TCP our first write and its
 * retransmits (200 ms on) would have completed it; in the ring they cannot, so a burst of 20
 * clients against socat's backlog of 5 had some wait 3 s, the accept wait and then TCP.  (A
 * listener whose TCP_DEFER_ACCEPT we did not see, set by a raw system call, holds it so too.)
 * Withdrawn, those bytes go over TCP and complete it as without memlan.  Looked at 200 ms after
 * the offer and every 200 ms after, only with bytes waiting: one sock_diag look-up (a failed
 * one, in a sandbox, or a server in another namespace, which our look-up does not find, changes
 * nothing).
 */
#define MLP_HANDSHAKE_LOOK_NS 200000000ull
static bool mlp_handshake_open(struct mlp_sock *s, int fd)
{
    uint64_t now = mlp_now_ns();
    const void *p;
    if (now - s->offer_ns < MLP_HANDSHAKE_LOOK_NS || now - s->hs_ns < MLP_HANDSHAKE_LOOK_NS ||
        strstr(s->offer, "-m") /* across namespaces (mlp_offer_name): not ours to look up */ ||
        __ml_chan_unsent(s->ch, &p) == 0)
        return false;
    s->hs_ns = now;
    struct mlp_addr l, r;
    uint8_t state = 0;
    uint32_t inode;
    int saved = errno;
    bool open = mlp_sock_addrs(fd, &l, &r, NULL, 0) == 0 &&
                mlp_hs_ask(&l, &r, &state, &inode) == 0 &&
                (state == TCP_SYN_RECV || state == TCP_LISTEN);
    errno = saved;
    return open;
}

/*
 * Has our offer waited long enough for a memlan acceptor?  No acceptor can take an offer before
 * its accept, and a server may accept late for reasons of its own.  Apache's graceful restart
 * (SIGUSR1, ServerLimit equal to StartServers) accepts nothing for about 2 s, until its next
 * maintenance tick forks the new children: clients that connected meanwhile gave up at 2 s from
 * their offer, and 0 to 4 of h2load's 4 went over TCP, by how they fell against the tick
 * (test_apache2_mod_http2; test_a_server_that_accepts_late_takes_the_offer).  Over TCP they
 * would have waited as long for the answer.
 *
 * So the client asks the kernel (sock_diag, the look-up of mlp_handshake_open, by the
 * connection's four addresses) where the server's side of the connection is: still in its
 * accept queue (established or close-wait, with no file yet), or accepted (it has its file's
 * inode).  The looks begin MLP_QUEUE_FIRST_NS after the offer (a memlan acceptor takes most
 * offers sooner, and those connections never pay for one), and come, while a decision is asked,
 * every half of the time since the offer, at most every quarter second (about ten before a 2 s
 * accept wait is over, each one netlink round trip); none once one saw the accept.
 *
 * - Accepted, and no memlan acceptor has taken the offer an eighth of MEMLAN_ACCEPT_WAIT_MS
 *   (250 ms) after the look that first saw the accept: the offer is over, whatever the accept
 *   wait has left.  A memlan acceptor takes an offer in its accept call, within microseconds of
 *   the kernel's accept, or refuses it, so the grace only covers its scheduling (a longer wait
 *   lengthens it: a server under a tracer, say).  The accepting process was one without
 *   memlan: a member of an SO_REUSEPORT group that runs without it (a rolling upgrade), a child
 *   that runs without it and accepts on its parent's published listener, a server under memlan
 *   in another fabric.  Each such client used to wait the whole accept wait, where kernel TCP
 *   answers in milliseconds (an outside user's SO_REUSEPORT pair: 2015 ms a connection for the
 *   plain member's clients).  A memlan acceptor slower than the grace finds the offer
 *   withdrawn, and the connection goes over TCP with the reason on both sides: nothing is lost.
 * - Queued, once MEMLAN_ACCEPT_WAIT_MS from the offer is over, for a decision that does not
 *   wait (a poll's, a nonblocking call's: the program's own loop waits, with its own timeouts
 *   and signals): the offer waits on, while the looks see it queued, and a memlan acceptor
 *   takes it at its accept.  MEMLAN_ACCEPT_QUEUE_MS (60 s) from the offer bounds it all.
 *
 * A blocking receive's wait (mlp_decide_call with rx) waits on the same way: it heeds the
 * program's signals and SO_RCVTIMEO as the kernel's read does, which would wait as long for the
 * answer.  The other decisions that wait (a send at a full ring, sendfile, splice, an exec that
 * settles its sockets, stdio's) count from the offer, as before: over kernel TCP a send's bytes
 * go into the buffers of a connection not yet accepted, and an exec or a vfork's parent would
 * not wait so long (a review of the first version, which extended them all: a system() waited
 * 10 s, a 600 KiB send 62 s); they end early on an accept as any.  So do a look that cannot be
 * made (no diag socket: a sandbox at the first offer; a process confined since, whose filter
 * may kill for getpeername; a server in another namespace) and one that another thread or a
 * fork sibling makes now, for a second at the most.  Nothing here is a peer's to write.
 */
#define MLP_QUEUE_FIRST_NS 20000000ull
#define MLP_QUEUE_LOOK_NS 10000000ull
#define MLP_QUEUE_EVERY_NS 250000000ull
#define MLP_QUEUE_STALE_NS 1000000000ull
#define MLP_WHY_ACCEPT_WAIT "no memlan acceptor took the offer within MEMLAN_ACCEPT_WAIT_MS"
#define MLP_WHY_ACCEPTED                                                                        \
    "no memlan acceptor took the offer within an eighth of MEMLAN_ACCEPT_WAIT_MS of the "       \
    "server's accept"
static const char *mlp_accept_wait_over(struct mlp_sock *s, int fd, bool wait)
{
    uint64_t now = mlp_now_ns(), aw = (uint64_t)mlp_cfg.accept_wait_ms * 1000000u;
    uint64_t off = now - s->offer_ns, cap = (uint64_t)mlp_cfg.accept_queue_ms * 1000000u;
    /* (loaded after now: another thread's later store makes q > now, not yet over) */
    uint64_t q = atomic_load_explicit(&s->queued_ns, memory_order_relaxed);
    uint64_t acc = atomic_load_explicit(&s->acc_ns, memory_order_relaxed);
    bool waited_on = q > s->offer_ns + aw; /* seen queued past the accept wait */
    if (off > cap)
        return waited_on  ? "the server did not accept the connection within "
                            "MEMLAN_ACCEPT_QUEUE_MS"
               : cap < aw ? "no memlan acceptor took the offer within MEMLAN_ACCEPT_QUEUE_MS"
                          : MLP_WHY_ACCEPT_WAIT;
    const char *late = off > aw ? MLP_WHY_ACCEPT_WAIT : NULL;
    if (strstr(s->offer, "-m") /* across namespaces (mlp_offer_name) */ ||
        ml_load_acquire(&mlp_hs_fd) < 0 || mlp_confined())
        return late;
    if (late ? wait : off < MLP_QUEUE_FIRST_NS)
        return late; /* a decision that waits counts from the offer; too soon to look */
    /* Only what a look saw decides: seen accepted, the grace from that look on; seen queued
     * within the last second, the wait goes on (a look that could not be made, another
     * thread's or a fork sibling's at the same moment, says nothing: a review found 2 to 16
     * of 200 threads' connections to a memlan server that accepted late sent over TCP when a
     * rule counted from the last queued look ran out between two of them). */
    const char *over = acc ? (now > acc && now - acc > aw / 8 ? MLP_WHY_ACCEPTED : NULL)
                       : q && (now < q || now - q <= MLP_QUEUE_STALE_NS) ? NULL
                                                                        : late;
    if (acc)
        return over; /* seen accepted: nothing more to look for */
    /* no look now, or one that could not be made: a second past the wait for one that can */
    const char *unsure = q ? over : off > aw + MLP_QUEUE_STALE_NS ? late : NULL;
    uint64_t every = off / 2;
    every = every < MLP_QUEUE_LOOK_NS    ? MLP_QUEUE_LOOK_NS
            : every > MLP_QUEUE_EVERY_NS ? MLP_QUEUE_EVERY_NS
                                         : every;
    uint64_t ql = atomic_load_explicit(&s->qlook_ns, memory_order_relaxed);
    if (now > ql && now - ql < every)
        return unsure; /* looked just now */
    atomic_store_explicit(&s->qlook_ns, now, memory_order_relaxed);
    struct mlp_addr l, r;
    uint8_t state = 0;
    uint32_t inode = 1;
    int saved = errno, e = mlp_sock_addrs(fd, &l, &r, NULL, 0);
    if (e == 0)
        e = mlp_hs_ask(&l, &r, &state, &inode);
    errno = saved;
    if (e == -EAGAIN) { /* another thread asks now, or a fork sibling took our answer */
        /* the next look in MLP_QUEUE_LOOK_NS, not at every peek of a poll (a review) */
        atomic_store_explicit(&s->qlook_ns, now - every + MLP_QUEUE_LOOK_NS,
                              memory_order_relaxed);
        return unsure;
    }
    if (e == 0 && inode == 0 && (state == TCP_ESTABLISHED || state == TCP_CLOSE_WAIT)) {
        if (late && !waited_on)
            mlp_log(1, "fd %d: the server has not accepted the connection yet: its offer waits "
                       "on (MEMLAN_ACCEPT_QUEUE_MS)", fd);
        atomic_store_explicit(&s->queued_ns, now, memory_order_relaxed);
        return NULL;
    }
    if (e == 0 && inode != 0 && state != TCP_LISTEN) { /* (a SYN cookie's look finds the
                                                          * listener: not an accept) */
        atomic_store_explicit(&s->acc_ns, now, memory_order_relaxed);
        return NULL; /* the grace from now */
    }
    return over;
}

/*
 * Settle an undecided client socket: ACCEL when the acceptor attached, TCP when we withdrew.
 * With wait, block until one happens (the acceptor takes the offer, the server speaks over TCP,
 * or the accept wait runs out).  Returns the state.
 */
static int mlp_decide_any(struct mlp_sock *s, int fd, bool wait, bool intr, uint64_t deadline,
                          bool queue)
{
    unsigned any0 = intr ? mlp_sig_runs_any() : 0, nores0 = intr ? mlp_sig_nores_count() : 0;
    for (;;) {
        int st = s->state;
        if (st != MLP_UNDECIDED)
            return st;
        uint32_t a = __ml_chan_attach_state(s->ch);
        const char *why = NULL;
        if (a == 1) {
            pthread_mutex_lock(&s->mu);
            if (s->state == MLP_UNDECIDED) {
                s->state = MLP_ACCEL;
                mlp_offer_claimed(s); /* the acceptor removed the name before it attached */
                mlp_stat_conn(s, fd, "");
                mlp_log(1, "fd %d: accelerated (client)", fd);
            }
            pthread_mutex_unlock(&s->mu);
            mlp_shut_owed_pay(s, fd);
            continue;
        }
        if (a == ML_ATTACH_WITHDRAWN) {
            why = "offer withdrawn";
        } else if (a != 0) {
            why = "the channel's attach word is corrupt"; /* peer garbage: give up, bounded */
        } else if (s->lmap && (why = mlp_no_offer_why(s->lmap))) {
            /* the acceptor changed its credentials after we offered: it cannot take it */
        } else if (s->lmap && s->offer[0] && mlp_refused_in(s->lmap, s->offer)) {
            why = "the server accepted before our offer arrived and refused it";
        } else if (!wait && mlp_now_ns() - s->peek_ns < 100000) {
            return MLP_UNDECIDED; /* a poll scan or spin: peek the kernel at most every 100 us */
        } else {
            s->peek_ns = mlp_now_ns();
            int k = mlp_tcp_look(fd); /* takes nothing the application would see */
            if (k >= 0)
                why = k > 0 ? "the server spoke over TCP first: it is not memlan"
                            : "the connection ended or failed before the server took the offer";
            else if (mlp_handshake_open(s, fd))
                why = "the server's kernel held the handshake open: only TCP data completes it";
            else if ((why = mlp_accept_wait_over(s, fd, wait && !queue)) &&
                     strstr(s->offer, "-m"))
                why = "no memlan acceptor took the offer within MEMLAN_ACCEPT_WAIT_MS (a NAT "
                      "between the namespaces changes the addresses it looks for)";
        }
        if (why) {
            mlp_withdraw(s, fd, why);
            continue;
        }
        if (!wait)
            return MLP_UNDECIDED;
        uint64_t now = mlp_now_ns();
        if (deadline && now >= deadline)
            return -EAGAIN; /* SO_RCVTIMEO or SO_SNDTIMEO: still undecided, as below */
        uint64_t left = (uint64_t)mlp_cfg.accept_wait_ms * 1000000u - (now - s->offer_ns);
        if (deadline && deadline - now < left)
            left = deadline - now;
        int ms = left / 1000000u > 10 ? 10 : (int)(left / 1000000u) + 1;
        int w = memlan_channel_wait_peer(s->ch, ms);
        /* A handler ran (the wait says so, or our count of those run through us): without
         * SA_RESTART it ends the call, and any does where a timeout is set (sock_intr_errno).
         * The count of handlers without SA_RESTART is never the same twice once one was
         * installed where we cannot count it (siginterrupt, sysv_signal): so it is asked only
         * after a handler ran, or every wait of such a program would end at its first 10 ms. */
        if (intr && (w == -EINTR || mlp_sig_runs_any() != any0) &&
            (deadline || mlp_sig_nores_count() != nores0))
            return -EINTR; /* still undecided: the next call goes on */
    }
}

int mlp_decide(struct mlp_sock *s, int fd, bool wait)
{
    return mlp_decide_any(s, fd, wait, false, 0, false);
}

/*
 * The wait of a program's blocking call (recv, send at a full ring, sendfile, splice) for the
 * decision: -EINTR when a handler installed without SA_RESTART ran meanwhile, or any handler
 * where a timeout is set (deadline), as the kernel's blocked call ends then; -EAGAIN at the
 * deadline (SO_RCVTIMEO, SO_SNDTIMEO from the call's start).  rx: a receive, which waits on
 * while the server leaves the connection queued (mlp_accept_wait_over).  The wait used to go
 * on to the decision and the call after it, and the handler's interruption was lost: alarm(1)
 * around a read from a memlan server that had not accepted yet read on (blocked on TCP after
 * the accept wait), where kernel TCP returns EINTR at 1 s; a 1 s SO_RCVTIMEO went unheard
 * (tests/preload/decideintr.c).  An exec's settlement (exec.c) and stdio's take the decision
 * whatever runs.
 */
int mlp_decide_call(struct mlp_sock *s, int fd, uint64_t deadline, bool rx)
{
    /* A handler we cannot count (siginterrupt, sysv_signal) that runs outside the futex sleep
     * goes unseen: such a program's receive keeps the wait from its offer (2 s), not the
     * queue's (60 s: a review saw one signal's EINTR lost so, and the read wait on). */
    bool blind = atomic_load_explicit(&__ml_intr_blind, memory_order_relaxed);
    return mlp_decide_any(s, fd, true, true, deadline, rx && !blind);
}

/* ---- the accepting side ------------------------------------------------------------------ */

/* The kernel socket under a channel: the peer's liveness when its lock cannot be asked. */
_Atomic bool mlp_had_accel;

void mlp_sock_liveness(memlan_channel_t *ch, int fd)
{
    struct stat st;
    if (!atomic_load_explicit(&mlp_had_accel, memory_order_relaxed))
        atomic_store(&mlp_had_accel, true);
    if (__ml_sys_fstat(fd, &st) == 0 && S_ISSOCK(st.st_mode)) {
        ch->sock_fd = fd;
        ch->sock_ino = (uint64_t)st.st_ino;
    }
}

/* The offer under name: its fd (> 0), 0 for a small file that is not one (a refusal file of
 * an older memlan: *refused), -ENOTSUP for something that can never be one (a FIFO, a device, a
 * directory, a symbolic link: whoever can write in the fabric may plant one; a blocking open or
 * read of a FIFO froze the acceptor and the client), or -errno. */
static long mlp_open_offer(const char *name, struct stat *st, bool *refused)
{
    long fd = __ml_sys_open(mlp_fab->dirfd, name, O_RDWR | O_NOFOLLOW | O_NONBLOCK, 0);
    if (fd == -ELOOP || fd == -EISDIR || fd == -ENXIO || fd == -ENODEV || fd == -ETXTBSY)
        return -ENOTSUP;
    if (fd < 0)
        return fd;
    if (__ml_sys_fstat((int)fd, st) < 0 || !S_ISREG(st->st_mode)) {
        __ml_sys_close((int)fd);
        return -ENOTSUP;
    }
    if (st->st_size >= ML_PAGE)
        return fd;
    char c = 0;
    *refused = __ml_sys_read((int)fd, &c, 1) == 1 && c == 'R';
    __ml_sys_close((int)fd);
    return 0;
}

/* In a shared fabric: was the offer file made by the client's user?  Any member can create a
 * file under a connection's offer name (the name is the addresses), and the acceptor would take
 * that member's channel for the client's connection: it would read what the server sends the
 * client and speak for the client.  A file of our own user's is ours to trust; another user's
 * must be the user the kernel knows the connecting socket by (sock_diag). */
static bool mlp_offer_owner_ok(const struct stat *st, const struct mlp_addr *l,
                               const struct mlp_addr *r)
{
    if (!mlp_fab->shared || st->st_uid == geteuid())
        return true;
    uint32_t k;
    return mlp_diag_server(l, r, (uint32_t)st->st_uid, 0, &k, NULL) == 0 && k == st->st_uid;
}

/* A memlan client that closed before we accepted has taken its offer away (wrk probes the
 * address that way): the reason says so rather than blame the client.  Fallback path only. */
static bool mlp_peer_closed(int fd)
{
    /* The FIN behind the bytes it wrote first counts: a client that wrote and closed before we
     * accepted (logger --tcp into a syslog-ng or rsyslog that accepts a moment later) had its
     * bytes sent over TCP at its close, and the peek saw them, not the end: the log blamed the
     * client, "not memlan (no offer)" (tests/py/test_apps_logs.py). */
    /* By the system calls themselves: the accept path is no cancellation point (interpose.c,
     * mlp_accept_common). */
    return (mlp_look_events(fd, POLLIN | POLLRDHUP, true) & (POLLRDHUP | POLLHUP)) ||
           mlp_tcp_look_by(fd, true) == 0;
}

void mlp_on_accept(int lfd, int fd, int flags)
{
    struct mlp_sock *ls = mlp_get(lfd);
    if (!ls)
        return;
    /* accept from a signal handler (it is async-signal-safe: a server driven by SIGIO accepts
     * in its handler).  Taking an offer maps the channel and allocates its state, on top of a
     * thread that may be inside malloc or hold the locks that this takes: the offer is refused
     * there, and the connection is the kernel's, with its reason below. */
    bool in_handler = mlp_sig_in_handler();
    if (!in_handler) {
        __ml_mapcache_expire();
        mlp_pass_reap(); /* connections this acceptor passed on: their receivers took them? */
    }
    if (ls->type != MLP_LISTENER || !mlp_fab) {
        mlp_put(ls);
        return;
    }
    struct ml_listen_rec *m = ls->rec->map;
    struct mlp_addr l, r;
    if (mlp_sock_addrs(fd, &l, &r, NULL, 0) < 0) {
        mlp_put(ls);
        mlp_stat_tcp(fd, "addresses of the accepted socket unavailable");
        return;
    }
    if (mlp_cred_lost_here(true)) {
        /* The fabric is out of our reach: we could neither take an offer nor open one.  The
         * record says so from now on (a drop does not mark it: cred.c), so clients that look
         * after this do not offer, and one that offered before sees it and withdraws: nobody
         * waits for us.  Said once per record and process. */
        uint32_t none = 0;
        if (atomic_compare_exchange_strong(&m->no_offer, &none, ML_NO_OFFER_CRED)) {
            __atomic_store_n(&ls->rec->cred_pid, ml_load_relaxed(&mlp_pid), __ATOMIC_RELAXED);
            if (!__atomic_exchange_n(&ls->rec->no_offer_said, true, __ATOMIC_RELAXED))
                mlp_log(1, "port %d: clients will not offer (%s)", ls->rec->port, mlp_cred_why);
        }
        /* And a client that offered before the mark is refused in the record's words, which
         * our mapping reaches: a mark cleared again at once (a thread's drop and return,
         * mlp_lrec_cred_back) left it to wait an eighth of the accept wait, or all of it (a
         * review).  A client of another namespace, whose offer names its link address, has
         * the mark alone.  (Whether an offer is there we cannot ask: its file is out of our
         * reach.  Each such accept takes one of the record's 64 refusal words.) */
        char cur[24], name[160];
        mlp_netns(cur);
        mlp_offer_name(name, sizeof name, cur, &r, &l, NULL);
        mlp_refuse_mark(m, name);
        mlp_put(ls);
        mlp_stat_tcp_addrs(fd, &l, &r, mlp_cred_why);
        return;
    }
    /* A peer on a link of ours, not one of our own addresses, may be a memlan client in another
     * namespace: its offer then names the link-layer address our neighbour table holds for it,
     * so that only the namespace at the other end of the link can have made it. */
    /* Only a record that a client of another namespace has used (xns, set by such clients)
     * pays for the look-up: a server accepting remote clients made two rtnetlink round trips
     * (and two sockets) per connection for nothing.  The word is a peer's to write: it decides
     * only which name we look for, never how long we wait. */
    uint8_t mac[6];
    bool other_ns = !mlp_addr_loopback(&r) && !mlp_addr_eq(&l, &r) &&
                    ml_load_acquire(&m->xns) != 0 && mlp_peer_mac(&r, mac) == 0;
    char name[160], cur[24];
    mlp_netns(cur);
    mlp_offer_name(name, sizeof name, cur, &r, &l, other_ns ? mac : NULL);
    const char *why = NULL;
    memlan_channel_t *ch = NULL;
    if (in_handler) {
        mlp_refuse_mark(m, name);
        mlp_stat_tcp_addrs(fd, &l, &r, "accepted in a signal handler (memlan takes no offer "
                                       "there: the handler may have interrupted malloc)");
        mlp_put(ls);
        return;
    }
    if (ml_load_acquire(&m->no_offer) == ML_NO_OFFER_PASS) {
        /* This port's acceptors pass their connections on (mlp_after_pass): a client that
         * offered before the mark is refused, and withdraws to TCP, rather than be taken and
         * lost (several accepted in one go before the first pass).  Peer-writable, as every
         * no_offer: a false mark only keeps this port's connections on TCP. */
        mlp_refuse_mark(m, name);
        mlp_stat_tcp_addrs(fd, &l, &r, mlp_no_offer_why(m));
        mlp_put(ls);
        return;
    }
    /* pending, which makes us wait for an offer, is in the peer-writable record: anyone who can
     * write it (any member of a shared fabric) could hold every accept of ours to the whole
     * wait, ordinary TCP clients' too (about 20 accepts a second).  After a few waits in a row
     * that no offer ended, we wait at most MLP_SHORT_WAIT_NS until an offer is found again: a
     * memlan client whose offer comes later is refused and goes over TCP, the safe side. */
    bool wait_ok = __atomic_load_n(&ls->rec->misses, __ATOMIC_RELAXED) < MLP_WAIT_MISSES;
    uint64_t wait_ns = (uint64_t)mlp_cfg.server_wait_ms * 1000000u;
    if (!wait_ok && wait_ns > MLP_SHORT_WAIT_NS)
        wait_ns = MLP_SHORT_WAIT_NS;
    uint64_t deadline = mlp_now_ns() + wait_ns;
    bool marked = false;
    unsigned written_waits = 0;
    for (;;) {
        /* SYNC: pending first, then the name: see mlp_pending_done(). */
        uint32_t pend = ml_load_acquire(&m->pending);
        bool refused = false;
        struct stat st;
        long k = mlp_open_offer(name, &st, &refused);
        if (k == -ENOTSUP) {
            why = "a file that cannot be an offer has this connection's offer name";
            break;
        }
        if (k > 0 && !mlp_offer_owner_ok(&st, &l, &r)) {
            __ml_sys_close((int)k);
            why = "the offer under this connection's name was not made by the client's user "
                  "(another member of the shared fabric may have made it)";
            break;
        }
        struct ml_access wr;
        if (k > 0 && mlp_fab->shared && __ml_acl_writers((int)k, &wr) != 0 && !mlp_groupwide()) {
            /* A channel any member may open would show them what we send: only when we asked
             * for that ourselves.  The client finds the refusal and withdraws. */
            __ml_sys_close((int)k);
            mlp_refuse_mark(m, name);
            why = "the client's channel is readable by every member of the shared fabric (this "
                  "side did not ask for that: MEMLAN_FABRIC_GROUPWIDE=1)";
            break;
        }
        if (k > 0) {
            /* A file whose mapping we do not keep yet, and could, is opened a second time, for a
             * mapping that carries no lock and can be kept (see segment.c's mapping cache). */
            long kb = __ml_mapcache_wants_open(&st)
                          ? __ml_sys_open(mlp_fab->dirfd, name, O_RDWR | O_NOFOLLOW, 0)
                          : -1;
            /* The name goes before the claim: a client that sees the claim knows it is gone. */
            __ml_sys_unlinkat(mlp_fab->dirfd, name, 0);
            int e = __ml_chan_attach_offer(mlp_fab, (int)k, kb < 0 ? -1 : (int)kb, &st, name, &ch);
            if (e == 0)
                __atomic_store_n(&ls->rec->misses, 0, __ATOMIC_RELAXED);
            if (e == -ESTALE)
                why = "a stale offer (its channel was already reused)";
            else if (e == -EBUSY)
                why = mlp_peer_closed(fd) ? "the client closed before accept"
                                          : "the client had already withdrawn its offer";
            else if (e < 0)
                why = "could not attach the client's channel";
            break;
        }
        if (k == -ENOENT && pend == 0) {
            const char *no = mlp_no_offer_why(m);
            bool gone = mlp_lrec_marked(m, mlp_withdrawal_key(name));
            why = gone                  ? MLP_WHY_WITHDRAWN
                  : mlp_peer_closed(fd) ? MLP_WHY_NO_OFFER_FIN
                  : no                  ? no
                  : other_ns ? "no offer under this connection's addresses: the client is not "
                               "memlan, or a NAT between the namespaces changed them"
                             : "the client is not memlan (no offer)";
            break;
        }
        if (k == -EACCES || k == -EPERM) {
            /* The fabric refuses us (a credential change made without libc that the check
             * above did not see, a sandbox): neither take nor refuse can work, and the client
             * must not wait for us.  Say so in the record for the ones to come, as ours: a mark
             * nobody had made stayed for good, where our credentials' return clears its own
             * (mlp_lrec_cred_back; a handler that toggles the euid around the accepts kept every
             * later client on TCP: a review).  (Other errors, EMFILE say, pass: they go by the
             * deadline and the refusal, as before.) */
            uint32_t none = 0;
            if (atomic_compare_exchange_strong(&m->no_offer, &none, ML_NO_OFFER_CRED))
                __atomic_store_n(&ls->rec->cred_pid, ml_load_relaxed(&mlp_pid), __ATOMIC_RELAXED);
            why = "cannot open the client's offer in the fabric: clients of this port will not "
                  "offer";
            break;
        }
        if (refused) {
            why = "offer refused";
            break;
        }
        if (k == -ENOENT && mlp_peer_closed(fd)) {
            /* No offer, and the client's end is here: a memlan client withdraws before its
             * kernel socket closes, and its offer's name goes only after, so none will come.
             * Another client's count in pending (omfwd's next connection, made as its last
             * closes) had this accept wait to the deadline and say "no offer from the client
             * within the server's wait" for a client that closed (tests/py/test_apps_logs.py). */
            why = MLP_WHY_NO_OFFER_FIN;
            break;
        }
        if (mlp_now_ns() >= deadline) {
            /* Refuse: mark the refusal in the record, then look once more.  An offer posted
             * before the mark is found and taken; a client that posts after it finds the mark
             * and withdraws (mlp_decide).  Refusals used to be files under the offer's name,
             * which in a shared fabric's sticky directory the client could not remove: they
             * stayed until our next sweep. */
            if (!marked) {
                mlp_refuse_mark(m, name);
                marked = true;
                continue;
            }
            if (pend > 0 && wait_ok)
                __atomic_add_fetch(&ls->rec->misses, 1, __ATOMIC_RELAXED);
            why = k == 0 ? "a file that is not an offer has this connection's offer name"
                  : mlp_lrec_marked(m, mlp_withdrawal_key(name)) ? MLP_WHY_WITHDRAWN
                  : other_ns ? "no offer under this connection's addresses within the "
                               "server's wait (a NAT between the namespaces changes them)"
                             : "no offer from the client within the server's wait";
            break;
        }
        if (k == -ENOENT) {
            atomic_fetch_add(&m->waiters, 1);
            (void)__ml_sys_futex_wait(&m->pending, pend, 1000000);
            atomic_fetch_sub(&m->waiters, 1);
        } else {
            __ml_brief_wait(written_waits++); /* being written */
        }
    }
    mlp_put(ls);
    if (!ch) {
        mlp_stat_tcp_addrs(fd, &l, &r, why);
        return;
    }
    mlp_own_fd(&ch->seg->fd, (flags & SOCK_CLOEXEC) != 0);
    struct mlp_sock *s = mlp_sock_new(MLP_CONN);
    if (!s) {
        mlp_disown_fd(ch->seg->fd);
        __ml_chan_end(ch);
        mlp_stat_tcp_addrs(fd, &l, &r, "out of memory");
        return;
    }
    s->ch = ch;
    ch->rx_lowat = mlp_lowat_of(fd); /* the listener's, as the kernel copied it */
    s->side = 1;
    s->port = l.port;
    s->me = mlp_side_block(ch, 1);
    ml_store_relaxed(&s->me->holders, 1u);
    ml_store_relaxed(&s->me->flags, mlp_linger_flag(lfd));
    mlp_set_nonblock(s, (flags & SOCK_NONBLOCK) != 0);
    if (mlp_linger_flag(lfd))
        mlp_note_linger(fd, &(struct linger){1, 0}, sizeof(struct linger));
    s->state = MLP_ACCEL;
    mlp_sock_liveness(ch, fd);
    s->slot = mlp_proc_slot();
    s->stat_fd = fd;
    mlp_slot_fill(s->slot, ML_CONN_ACCEL, fd, &l, &r, ch->seg->token, ML_CONN_ACCEPTED);
    mlp_install(fd, s);
    mlp_put(s);
    char rs[64];
    mlp_addr_str(&r, rs, sizeof rs);
    mlp_log(1, "fd %d: accelerated (accepted from %s)", fd, rs);
}

/* A side passed to us that its peer took for ended (ML_SOCK_PASSED_GONE, channel.c's
 * ml_passed_grace): our bridge lock is held (the adoption took it) before the flag is read,
 * seq_cst, as the peer sets the flag before it asks the lock again. */
static bool mlp_passed_gone_to_peer(memlan_channel_t *ch, int side)
{
    atomic_thread_fence(memory_order_seq_cst);
    return (atomic_load(&mlp_side_block(ch, 1 - side)->flags) & ML_SOCK_PASSED_GONE) != 0;
}

/*
 * After exec: the socket on fds[0..n) was accelerated in the image before us, which left its
 * channel side in the bridge file `bridge` (see exec.c).  Take it up again.  On failure the
 * kernel socket carries nothing the peer sent, so it is shut down (the program reads EOF rather
 * than wait for ever) and the reason logged.
 */
void mlp_adopt_conn(const int *fds, int n, int bridge, int side, const char *token,
                    unsigned flags, const char *how)
{
    const char *why = NULL;
    bool late = false; /* a receiver past its peer's grace: said on stderr too */
    memlan_channel_t *ch = NULL;
    struct mlp_sock *s = NULL;
    memlan_fabric_t *fab = mlp_fabric();
    if (!fab) {
        __ml_sys_close(bridge);
        why = mlp_fab_error[0] ? mlp_fab_error : "no fabric";
    } else {
        int e = __ml_chan_adopt(fab, token, bridge, side, &ch);
        if (e < 0)
            why = e == -EPROTO ? "the channel is not in a state to take up" : strerror(-e);
        else if ((late = (flags & MLP_CARRY_PASSED) && mlp_passed_gone_to_peer(ch, side)))
            why = "its peer had taken it for ended: taken up more than a second after its "
                  "passer's end";
        else if (!(s = mlp_sock_new(MLP_CONN)))
            why = "out of memory";
    }
    if (why) {
        if (ch)
            __ml_chan_end(ch);
        if (n > 0) {
            if (late) /* on stderr too, as the other passes that cannot be taken up */
                mlp_pass_lost(fds[0], why, false);
            else
                mlp_log(0, "fd %d: the connection %s is lost (%s): shut down", fds[0], how, why);
            (void)mlp_real_shutdown(fds[0], SHUT_RDWR);
        }
        return;
    }
    s->ch = ch;
    s->side = side;
    s->me = mlp_side_block(ch, side);
    s->state = MLP_ACCEL;
    if (n == 0) {
        /* Carried, but at no fd of ours (a spawn's file actions closed it, or never gave it):
         * the count the image before us took for us goes back, as a close of ours would give
         * it (and as the last holder's, end the side). */
        mlp_log(1, "a connection %s is at no fd of this program: let go", how);
        mlp_put(s);
        return;
    }
    /* Another process holds the socket still (the shell that forked us): it moves the ring
     * positions too, so each lock reloads them (mlp_lock_dir), as after a fork. */
    if (ml_load_relaxed(&s->me->holders) > 1)
        atomic_store(&s->forked, true);
    mlp_sock_liveness(ch, fds[0]);
    ch->rd_eof_when_empty = (flags & MLP_CARRY_RD_EOF) != 0;
    ch->shut_rd = (flags & MLP_CARRY_SHUT_RD) != 0;
    if (flags & MLP_CARRY_PASSED) /* we hold the side now: its peer's waiters need not ask */
        atomic_fetch_and(&s->me->flags, ~ML_SOCK_PASSED);
    /* O_NONBLOCK is the open file's: the kernel kept it across exec, and says it. */
    long fl = mlp_real_fcntl(fds[0], F_GETFL, 0);
    mlp_set_nonblock(s, fl > 0 && (fl & O_NONBLOCK));
    int lw = 0;
    socklen_t lwl = sizeof lw;
    if (mlp_real_getsockopt(fds[0], SOL_SOCKET, SO_RCVLOWAT, &lw, &lwl) == 0 && lw > 1) {
        ch->rx_lowat = (uint32_t)lw; /* the kernel socket's, as the image before us set it */
        ml_store_relaxed(&mlp_lowat_seen, true);
    }
    struct mlp_addr l, r;
    bool have = mlp_sock_addrs(fds[0], &l, &r, NULL, 0) == 0;
    if (have && side == 1)
        s->port = l.port;
    s->slot = mlp_proc_slot();
    s->stat_fd = fds[0];
    mlp_slot_fill(s->slot, ML_CONN_ACCEL, fds[0], have ? &l : NULL, have ? &r : NULL, token,
                  side == 1 ? ML_CONN_ACCEPTED : "");
    for (int i = 0; i < n; i++)
        mlp_install(fds[i], s);
    if (fl > 0 && (fl & O_ASYNC)) /* the open file's too: our SIGIO FIFO is made anew */
        mlp_async(s, fds[0], true);
    else
        mlp_sio_owner(s, fds[0]); /* and an owner's SIGURG FIFO */
    mlp_put(s);
    mlp_log(1, "fd %d: accelerated (%s)", fds[0], how);
}

/* After fork the child starts its own stat segment. */
void mlp_negotiate_after_fork(void);
void mlp_negotiate_after_fork(void)
{
    mlp_pass_after_fork();
    pthread_mutex_init(&mlp_neg_mu, NULL);
    pthread_mutex_init(&mlp_proc_mu, NULL);
    pthread_mutex_init(&mlp_hs_mu, NULL); /* a thread of the parent's may have held it */
    if (mlp_proc) {
        /* The parent's mapping and fd stay ours (the fd keeps the parent's entry alive no
         * longer than the parent); we forget them and create our own on first use. */
        mlp_disown_fd(mlp_proc->fd);
        __ml_sys_close(mlp_proc->fd);
        __ml_guard_del(mlp_proc->guard);
        __ml_sys_munmap(mlp_proc->base, mlp_proc->map_size);
        __ml_free(mlp_proc);
        mlp_proc = NULL;
        mlp_proc_hdr = NULL;
        mlp_proc_conns = NULL;
    }
    /* The parent's plain TCP lines were in its stat entry, not ours. */
    for (int fd = mlp_fdrec_next(0, INT32_MAX); fd >= 0; fd = mlp_fdrec_next(fd + 1, INT32_MAX)) {
        struct mlp_fdrec *rec = mlp_fdrec(fd);
        if (rec && ml_load_relaxed(&rec->tcp_slot))
            ml_store_relaxed(&rec->tcp_slot, 0);
    }
}

/*
 * _exit() and _Exit(), which run no exit handler: our stat entry's file loses its name, as at
 * exit() (its mapping goes with the process).  Without it every fork child that made an entry
 * (its first call on a connection its parent had) and left by _exit (Python's ForkingMixIn,
 * multiprocessing) left a dead file of 136 KiB in the fabric until the next sweep, which a
 * long-lived server never makes: 1,002 files, 136 MB, after `ab -n 1000` (an explorer).  So do
 * the channel files parked in the pool.  Only
 * in the process that made the entry (not a vfork child, whose entry is its parent's), and only
 * where no seccomp filter is known or may be (the unlink and its fstats could be killed for: a
 * sandboxed process that ends so would die of SIGSYS).  Async-signal-safe: system calls only.
 */
/* The name of our stat entry goes (at _exit).  System calls only. */
void mlp_stat_unname(void) { __ml_seg_unname(mlp_stat_seg()); }

/* Our stat entry, where it is this process's (not a fork parent's copy), or NULL. */
struct memlan_segment *mlp_stat_seg(void)
{
    struct memlan_segment *p = mlp_proc;
    return p && mlp_proc_hdr && mlp_proc_hdr->pid == mlp_pid ? p : NULL;
}

void mlp_exit_unname(void)
{
    /* the confinement first: the vfork child's look is a getpid, which a filter may kill for
     * (vsftpd's broker ends by _exit under one: test_sandboxed_passer_of_fds_is_not_killed) */
    if (atomic_load_explicit(&mlp_confinement, memory_order_relaxed) != 1 || !mlp_ready ||
        mlp_vfork_child())
        return;
    mlp_stat_unname();
    /* and the channel files parked for reuse (a multiprocessing child's, closed before its
     * _exit: 40 children left 40) */
    __ml_chan_pool_unname(mlp_fab);
    /* and the event queues' (a ForkingMixIn server's child that waited in recv made one: 50
     * clients left 49 queues, two files each, an explorer's) */
    mlp_epoll_at_exit();
    mlp_poll_at_exit();
}

/* exit(): the spare channels of the pool go (nobody uses them), and our stat entry's file loses
 * its name; its mapping stays for the threads that still count in it until the process is gone
 * (mlp_at_exit).  After _exit or a signal, the next reclaim removes the file. */
void mlp_negotiate_at_exit(void)
{
    /* Connections passed that no receiver took up yet: the receiver may be about to
     * (pgbouncer -R's old process exits right after its hand-over), and our bridges, which hold
     * their sides alive meanwhile, go with us.  So we wait a little (200 ms at the most, only
     * while some record is there).  A record still there then, of a pass made within the last
     * second (the longest a peer waits before it asks a passed side's lock), is kept for a
     * receiver that comes before the peer looks (one that waits for its passer to end before its
     * first call: tests/preload/passend.c passerexit), and said; its receiver removes it, or
     * `memlan clean` once nobody holds its side.  An older one has had its chance: it goes, said
     * lost, and its side is published reset through the bridge, so that the peer reads the end
     * at once rather than wait for a FIN the receiver's socket never sends. */
    if (atomic_load(&mlp_npassing) && mlp_fab && pthread_mutex_trylock(&mlp_pass_mu) == 0) {
        uint64_t until = mlp_now_ns() + 200000000ull;
        for (struct mlp_passing *p = mlp_passings; p; p = p->next) {
            struct stat st;
            while (__ml_sys_fstatat(mlp_fab->dirfd, p->name, &st, AT_SYMLINK_NOFOLLOW) == 0 &&
                   mlp_now_ns() < until)
                (void)nanosleep(&(struct timespec){0, 1000000}, NULL);
            if (__ml_sys_fstatat(mlp_fab->dirfd, p->name, &st, AT_SYMLINK_NOFOLLOW) != 0)
                continue; /* taken up */
            if (mlp_now_ns() - p->t0 < ML_LIVENESS_MAX_NS) {
                mlp_log(0, "fd %d: a connection passed over SCM_RIGHTS was not taken up by its "
                           "receiver before this process exited: it is lost unless the receiver "
                           "takes it up at once (%s)", p->fd, p->name);
                continue;
            }
            if (__ml_sys_unlinkat(mlp_fab->dirfd, p->name, 0) != 0)
                continue;
            mlp_pass_lost(p->fd, "the passer exited before its receiver took it up: the "
                                 "receiver runs without memlan, in a seccomp sandbox, as another "
                                 "user, or did not use it yet", false);
            memlan_channel_t *ch = NULL;
            mlp_disown_fd(p->bridge);
            int b = p->bridge;
            p->bridge = -1;
            if (__ml_chan_adopt(mlp_fab, p->token, b, p->side, &ch) == 0) {
                atomic_fetch_or(&mlp_side_block(ch, p->side)->flags, ML_SOCK_RESET);
                __ml_chan_abandon(ch); /* mapped until the process is gone */
            }
        }
        pthread_mutex_unlock(&mlp_pass_mu);
    }
    if (mlp_fab)
        __ml_chan_pool_drain(mlp_fab);
    struct memlan_segment *me = mlp_proc;
    bool owned = me && me->owner && me->fab;
    __ml_seg_unname(mlp_proc);
    /* Our stat entry's name stays where we could no longer remove it (we changed credentials
     * since it was made: a daemon's dropped children): said, so that `memlan stat`'s DEAD entry
     * and the file are explained (an explorer found them with nothing said). */
    struct stat st;
    if (owned) {
        /* (by its fd: out of reach, the directory cannot even be searched) */
        if (me->fd >= 0 && __ml_sys_fstat(me->fd, &st) == 0 && st.st_nlink > 0)
            mlp_log(1, "exit: this process's memlan stat entry stays in fabric %.200s (%s): "
                       "`memlan clean`, or a later process's sweep of the fabric, removes it",
                    me->fab->path,
                    mlp_fabric_out() ? "out of reach since it changed its credentials"
                                     : "its removal was refused");
    }
}

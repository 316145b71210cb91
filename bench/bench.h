/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/*
 * bench.h - memlan bench: what it measures and how the pieces talk.
 *
 * Every figure comes from two processes, pinned per placement ("split": cpu 0 and cpu 1; "same":
 * both on cpu 0), run in this invocation next to its floors and peers, so ratios are taken
 * between numbers measured seconds apart on the same machine.
 */
#ifndef MEMLAN_BENCH_H
#define MEMLAN_BENCH_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "memlan.h"

enum ep_kind { EP_MEMLAN, EP_TCP, EP_UNIX, EP_PIPE };

/* One side of a connection under test. */
struct ep {
    enum ep_kind kind;
    int rfd, wfd;               /* kernel transports */
    memlan_channel_t *ch;       /* memlan */
};

/* A connection made before fork() and finished by each side after it. */
struct pair {
    enum ep_kind kind;
    int memlan_msg;             /* memlan: a message channel (else a stream) */
    size_t ring;                /* memlan ring size */
    memlan_fabric_t *fab;
    char token[MEMLAN_TOKEN_LEN + 1];
    memlan_channel_t *creator;
    int lfd, port;              /* tcp listener */
    int sv[2];                  /* unix socketpair */
    int p1[2], p2[2];           /* pipes */
};

struct lat {
    double med, p99, p999;      /* round trip, microseconds */
    long n;
};

int pair_make(struct pair *p, enum ep_kind kind, memlan_fabric_t *fab, int msg, size_t ring);
int pair_parent(struct pair *p, struct ep *e);
int pair_child(struct pair *p, struct ep *e);
void pair_close(struct pair *p, struct ep *e, int parent);

ssize_t ep_send_all(struct ep *e, const void *buf, size_t n);
ssize_t ep_recv(struct ep *e, void *buf, size_t n);
ssize_t ep_recv_all(struct ep *e, void *buf, size_t n);
void ep_shutdown(struct ep *e);

/* Placement: pin the calling process.  "split": the parent on cpu 0, the child on cpu 1; "same":
 * both on cpu 0; "pair:K" (--pairs): the (2K)th and (2K+1)th cpus this process may run on;
 * anything else: unpinned. */
void bench_pin(const char *placement, int child);
/* The cpus this process may run on (sched_getaffinity), at most max, into cpus; their count. */
int bench_cpus(int *cpus, int max);

/* Round trips are timed in batches of LAT_BATCH, floors and memlan alike: a sample is a batch's
 * time divided by LAT_BATCH, so the clock's own cost (tens of ns) is not in the figures. */
#define LAT_BATCH 16
#define LAT_MIN_SAMPLES 64
int bench_enough(long n, uint64_t now, uint64_t end, uint64_t hard_end);
uint64_t bench_now_ns(void);
void lat_from_samples(struct lat *l, double *us, long n);

/* floors.c */
int floor_cacheline(const char *placement, double seconds, struct lat *out);
int floor_twolines(const char *placement, double seconds, struct lat *out);
int floor_futex(const char *placement, double seconds, struct lat *out);
int floor_ring(const char *placement, double seconds, double *Mps);
int floor_pipe(const char *placement, double seconds, double *MBps);
int floor_cma(const char *placement, double seconds, double *MBps);
void floor_memcpy(double *xt_MBps, double *xr_MBps, size_t block);

/* The generic two-process measurements (bench.c). */
int run_pingpong(struct pair *p, const char *placement, size_t size, double seconds, int spin_us,
                 struct lat *out);
int run_stream(struct pair *p, const char *placement, size_t size, double seconds,
               double *MBps, double *Mps);

/* plot.c */
struct plot_series {
    const char *name;
    int n;
    const double *x, *y;
};
/* A panel of 800 x 500 at (ox, oy) of an SVG document the caller writes to f.  Lines: one
 * polyline with a marker per point for each series; xbytes labels x as sizes (64 B, 1 MiB).
 * Bars: for each of nl labelled rows, one bar per series (s[k].y[row]), on a log scale. */
#include <stdio.h>
void plot_lines(FILE *f, double ox, double oy, const char *title, const char *xlabel,
                const char *ylabel, const struct plot_series *s, int ns, int logx, int logy,
                int xbytes);
void plot_bars(FILE *f, double ox, double oy, const char *title, const char *xlabel,
               const char *const *labels, int nl, const struct plot_series *s, int ns);

int bench_main(int argc, char **argv);

/* Shared with tools/memlan.c: getopt_long's '?' or ':' reported naming the option (returns 2);
 * --fabric DIR made absolute into MEMLAN_FABRIC (0, or 2 after a message). */
int cli_opt_error(const char *cmd, int c, char **argv);
int cli_set_fabric(const char *cmd, const char *dir);

#endif

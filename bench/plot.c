/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/*
 * plot.c - small SVG plots, so that `memlan bench --plot` needs nothing installed.
 *
 * Two kinds of panel, each drawn into a 800 x 500 box at an offset of a document the caller
 * opens: lines (bandwidth against message size) and horizontal bars (round-trip latency of each
 * transport).  Every point carries a marker, so a series of one point (kernel TCP in a --quick
 * run) is still seen, and tick labels are written for people: 64 B, 1 KiB, 1 MiB; 10k, 1M.
 */
#include "bench.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

static const double W = 800, H = 500, L = 80, R = 200, T = 50, B = 60;
static const char *colors[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd"};

static double tr(double v, int logv) { return logv ? log10(v > 0 ? v : 1e-9) : v; }

/* About three significant digits, never in exponent form ("%.3g" writes 1234 as 1.23e+03,
 * which a full test run's kernel TCP latency once put on the chart). */
static void fmt_num(char *out, size_t len, double v, const char *unit)
{
    double a = fabs(v);
    int prec = a >= 99.95 ? 0 : a >= 9.995 ? 1 : a >= 0.9995 ? 2 : 3;
    char num[32];
    int n = snprintf(num, sizeof num, "%.*f", prec, v);
    if (prec > 0 && n > 0 && n < (int)sizeof num) { /* 1.50 -> 1.5, 2.00 -> 2 */
        while (n > 1 && num[n - 1] == '0')
            num[--n] = '\0';
        if (num[n - 1] == '.')
            num[--n] = '\0';
    }
    snprintf(out, len, "%s%s", num, unit);
}

/* A size in bytes as people write it: 64 B, 4 KiB, 1 MiB (or 1.50 MiB). */
static void fmt_bytes(char *out, size_t len, double v)
{
    static const char *unit[] = {" B", " KiB", " MiB", " GiB", " TiB"};
    int u = 0;
    while (v >= 1024 && u < 4)
        v /= 1024, u++;
    if (v == floor(v))
        snprintf(out, len, "%.0f%s", v, unit[u]);
    else
        fmt_num(out, len, v, unit[u]);
}

/* A quantity with an SI suffix: 250, 1.50k, 10.0k, 2.00M (the suffix chosen after rounding). */
static void fmt_si(char *out, size_t len, double v)
{
    double a = fabs(v);
    if (a >= 999.5e6)
        fmt_num(out, len, v / 1e9, "G");
    else if (a >= 999.5e3)
        fmt_num(out, len, v / 1e6, "M");
    else if (a >= 999.5)
        fmt_num(out, len, v / 1e3, "k");
    else
        fmt_num(out, len, v, "");
}

/* Escape the few characters SVG text may not hold. */
static void xml_text(FILE *f, const char *s)
{
    for (; *s; s++) {
        if (*s == '<')
            fputs("&lt;", f);
        else if (*s == '>')
            fputs("&gt;", f);
        else if (*s == '&')
            fputs("&amp;", f);
        else
            fputc(*s, f);
    }
}

/* The frame, title and axis labels of a panel at (ox, oy) whose plot area starts at left. */
static void panel_open(FILE *f, double ox, double oy, double left, const char *title,
                       const char *xlabel, const char *ylabel)
{
    double pw = W - left - R, ph = H - T - B;
    fprintf(f, "<g transform=\"translate(%.0f,%.0f)\">\n", ox, oy);
    fprintf(f, "<text x=\"%.0f\" y=\"25\" font-size=\"16\" text-anchor=\"middle\">",
            (W - R + left) / 2);
    xml_text(f, title);
    fprintf(f, "</text>\n<rect x=\"%.0f\" y=\"%.0f\" width=\"%.0f\" height=\"%.0f\" fill=\"none\" "
               "stroke=\"black\"/>\n", left, T, pw, ph);
    fprintf(f, "<text x=\"%.0f\" y=\"%.0f\" text-anchor=\"middle\">", left + pw / 2, H - 15);
    xml_text(f, xlabel);
    fprintf(f, "</text>\n");
    if (ylabel) {
        fprintf(f, "<text x=\"20\" y=\"%.0f\" transform=\"rotate(-90 20 %.0f)\" "
                   "text-anchor=\"middle\">", T + ph / 2, T + ph / 2);
        xml_text(f, ylabel);
        fprintf(f, "</text>\n");
    }
}

static void legend(FILE *f, int k, const char *name)
{
    fprintf(f, "<rect x=\"%.0f\" y=\"%.0f\" width=\"12\" height=\"12\" fill=\"%s\"/>\n",
            W - R + 15, T + 20.0 * k, colors[k % 5]);
    fprintf(f, "<text x=\"%.0f\" y=\"%.0f\">", W - R + 32, T + 20.0 * k + 10);
    xml_text(f, name);
    fprintf(f, "</text>\n");
}

void plot_lines(FILE *f, double ox, double oy, const char *title, const char *xlabel,
                const char *ylabel, const struct plot_series *s, int ns, int logx, int logy,
                int xbytes)
{
    double x0 = INFINITY, x1 = -INFINITY, y0 = INFINITY, y1 = -INFINITY;
    for (int k = 0; k < ns; k++)
        for (int i = 0; i < s[k].n; i++) {
            if ((s[k].y[i] <= 0 && logy) || (s[k].x[i] <= 0 && logx))
                continue;
            double x = tr(s[k].x[i], logx), y = tr(s[k].y[i], logy);
            x0 = fmin(x0, x), x1 = fmax(x1, x), y0 = fmin(y0, y), y1 = fmax(y1, y);
        }
    if (!isfinite(x0))
        x0 = 0, x1 = 1;
    if (!isfinite(y0))
        y0 = 0, y1 = 1;
    if (!(x1 > x0))
        x1 = x0 + 1;
    if (logy)
        y0 = floor(y0), y1 = ceil(y1);
    if (!(y1 > y0))
        y1 = y0 + 1;
    double pw = W - L - R, ph = H - T - B;
    /* a margin inside the frame, so that markers at the ends are whole */
    double mx = (x1 - x0) * 0.03;
    x0 -= mx, x1 += mx;
#define PX(x) (L + ((x) - x0) / (x1 - x0) * pw)
#define PY(y) (T + ph - ((y) - y0) / (y1 - y0) * ph)
    panel_open(f, ox, oy, L, title, xlabel, ylabel);
    char lab[32];
    for (double v = y0; v <= y1 + 1e-9; v += logy ? 1 : (y1 - y0) / 5) {
        fprintf(f, "<line x1=\"%.1f\" x2=\"%.1f\" y1=\"%.1f\" y2=\"%.1f\" stroke=\"#ddd\"/>\n", L,
                L + pw, PY(v), PY(v));
        fmt_si(lab, sizeof lab, logy ? pow(10, v) : v);
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">%s</text>\n", L - 5,
                PY(v) + 4, lab);
    }
    /* x ticks at every x any series has, each once: the first series may be a one-point one
     * (kernel TCP in --quick), and then its one size was the only label */
    double xs[64];
    int nx = 0;
    for (int k = 0; k < ns; k++)
        for (int i = 0; i < s[k].n && nx < 64; i++) {
            if (logx && s[k].x[i] <= 0)
                continue;
            int j = 0;
            while (j < nx && xs[j] != s[k].x[i])
                j++;
            if (j == nx)
                xs[nx++] = s[k].x[i];
        }
    for (int i = 0; i < nx; i++) {
        double x = tr(xs[i], logx);
        if (xbytes)
            fmt_bytes(lab, sizeof lab, xs[i]);
        else
            fmt_si(lab, sizeof lab, xs[i]);
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%s</text>\n", PX(x),
                T + ph + 18, lab);
    }
    for (int k = 0; k < ns; k++) {
        const char *c = colors[k % 5];
        fprintf(f, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"2\" points=\"", c);
        for (int i = 0; i < s[k].n; i++)
            if (!(logy && s[k].y[i] <= 0))
                fprintf(f, "%.1f,%.1f ", PX(tr(s[k].x[i], logx)), PY(tr(s[k].y[i], logy)));
        fprintf(f, "\"/>\n");
        for (int i = 0; i < s[k].n; i++)
            if (!(logy && s[k].y[i] <= 0))
                fprintf(f, "<circle class=\"marker\" cx=\"%.1f\" cy=\"%.1f\" r=\"4\" fill=\"%s\"/>\n",
                        PX(tr(s[k].x[i], logx)), PY(tr(s[k].y[i], logy)), c);
        legend(f, k, s[k].name);
    }
    fprintf(f, "</g>\n");
#undef PX
#undef PY
}

void plot_bars(FILE *f, double ox, double oy, const char *title, const char *xlabel,
               const char *const *labels, int nl, const struct plot_series *s, int ns)
{
    /* log scale: the floors are tens of nanoseconds, kernel TCP tens of microseconds */
    double v0 = INFINITY, v1 = -INFINITY;
    for (int k = 0; k < ns; k++)
        for (int i = 0; i < s[k].n && i < nl; i++)
            if (s[k].y[i] > 0)
                v0 = fmin(v0, log10(s[k].y[i])), v1 = fmax(v1, log10(s[k].y[i]));
    if (!isfinite(v0))
        v0 = 0, v1 = 1;
    v0 = floor(v0), v1 = ceil(v1);
    if (!(v1 > v0))
        v1 = v0 + 1;
    const double LB = 190; /* room for the row labels */
    double pw = W - LB - R, ph = H - T - B;
    double row = ph / (nl > 0 ? nl : 1), bar = (row - 6) / (ns > 0 ? ns : 1);
#define BX(v) (LB + ((v) - v0) / (v1 - v0) * pw)
    panel_open(f, ox, oy, LB, title, xlabel, NULL);
    char lab[32];
    for (double v = v0; v <= v1 + 1e-9; v += 1) {
        fprintf(f, "<line x1=\"%.1f\" x2=\"%.1f\" y1=\"%.1f\" y2=\"%.1f\" stroke=\"#ddd\"/>\n",
                BX(v), BX(v), T, T + ph);
        fmt_si(lab, sizeof lab, pow(10, v));
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%s</text>\n", BX(v),
                T + ph + 18, lab);
    }
    for (int i = 0; i < nl; i++) {
        fprintf(f, "<text x=\"%.0f\" y=\"%.1f\" text-anchor=\"end\">", LB - 6,
                T + row * i + row / 2 + 4);
        xml_text(f, labels[i]);
        fprintf(f, "</text>\n");
        for (int k = 0; k < ns; k++) {
            if (i >= s[k].n || !(s[k].y[i] > 0))
                continue;
            double w = BX(log10(s[k].y[i])) - LB;
            char us[32];
            fmt_num(us, sizeof us, s[k].y[i], " us");
            fprintf(f, "<rect class=\"bar\" x=\"%.0f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" "
                       "fill=\"%s\"><title>%s</title></rect>\n",
                    LB, T + row * i + 3 + bar * k, w > 1 ? w : 1, bar, colors[k % 5], us);
            fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"10\">%s</text>\n",
                    LB + (w > 1 ? w : 1) + 4, T + row * i + 3 + bar * k + bar / 2 + 3, us);
        }
    }
    for (int k = 0; k < ns; k++)
        legend(f, k, s[k].name);
    fprintf(f, "</g>\n");
#undef BX
}

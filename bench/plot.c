/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/*
 * plot.c - a small SVG line plot, so that `memlan bench --plot` needs nothing installed.
 */
#include "bench.h"

#include <math.h>
#include <stdio.h>

static double tr(double v, int logv) { return logv ? log10(v > 0 ? v : 1e-9) : v; }

int plot_svg(const char *path, const char *title, const char *xlabel, const char *ylabel,
             const struct plot_series *s, int ns, int logx, int logy)
{
    FILE *f = fopen(path, "w");
    if (!f)
        return -1;
    const double W = 800, H = 500, L = 80, R = 200, T = 50, B = 60;
    double x0 = INFINITY, x1 = -INFINITY, y0 = INFINITY, y1 = -INFINITY;
    for (int k = 0; k < ns; k++)
        for (int i = 0; i < s[k].n; i++) {
            if (s[k].y[i] <= 0 && logy)
                continue;
            double x = tr(s[k].x[i], logx), y = tr(s[k].y[i], logy);
            x0 = fmin(x0, x), x1 = fmax(x1, x), y0 = fmin(y0, y), y1 = fmax(y1, y);
        }
    if (!(x1 > x0))
        x1 = x0 + 1;
    if (logy) {
        y0 = floor(y0), y1 = ceil(y1);
    }
    if (!(y1 > y0))
        y1 = y0 + 1;
    static const char *colors[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd"};
    fprintf(f, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" "
               "font-family=\"sans-serif\" font-size=\"12\">\n", W, H);
    fprintf(f, "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n");
    fprintf(f, "<text x=\"%.0f\" y=\"25\" font-size=\"16\" text-anchor=\"middle\">%s</text>\n",
            (W - R + L) / 2, title);
    double pw = W - L - R, ph = H - T - B;
#define PX(x) (L + ((x) - x0) / (x1 - x0) * pw)
#define PY(y) (T + ph - ((y) - y0) / (y1 - y0) * ph)
    fprintf(f, "<rect x=\"%.0f\" y=\"%.0f\" width=\"%.0f\" height=\"%.0f\" fill=\"none\" "
               "stroke=\"black\"/>\n", L, T, pw, ph);
    for (double v = logy ? y0 : y0; v <= y1 + 1e-9; v += logy ? 1 : (y1 - y0) / 5) {
        fprintf(f, "<line x1=\"%.1f\" x2=\"%.1f\" y1=\"%.1f\" y2=\"%.1f\" stroke=\"#ddd\"/>\n", L,
                L + pw, PY(v), PY(v));
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">%g</text>\n", L - 5,
                PY(v) + 4, logy ? pow(10, v) : v);
    }
    for (int i = 0; ns > 0 && i < s[0].n; i++) {
        double x = tr(s[0].x[i], logx);
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%g</text>\n", PX(x),
                T + ph + 18, s[0].x[i]);
    }
    fprintf(f, "<text x=\"%.0f\" y=\"%.0f\" text-anchor=\"middle\">%s</text>\n", L + pw / 2,
            H - 15, xlabel);
    fprintf(f, "<text x=\"20\" y=\"%.0f\" transform=\"rotate(-90 20 %.0f)\" "
               "text-anchor=\"middle\">%s</text>\n", T + ph / 2, T + ph / 2, ylabel);
    for (int k = 0; k < ns; k++) {
        const char *c = colors[k % 5];
        fprintf(f, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"2\" points=\"", c);
        for (int i = 0; i < s[k].n; i++)
            if (!(logy && s[k].y[i] <= 0))
                fprintf(f, "%.1f,%.1f ", PX(tr(s[k].x[i], logx)), PY(tr(s[k].y[i], logy)));
        fprintf(f, "\"/>\n");
        fprintf(f, "<rect x=\"%.0f\" y=\"%.0f\" width=\"12\" height=\"12\" fill=\"%s\"/>\n",
                W - R + 15, T + 20.0 * k, c);
        fprintf(f, "<text x=\"%.0f\" y=\"%.0f\">%s</text>\n", W - R + 32, T + 20.0 * k + 10,
                s[k].name);
    }
    fprintf(f, "</svg>\n");
#undef PX
#undef PY
    return fclose(f) == 0 ? 0 : -1;
}

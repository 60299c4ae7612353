/* SPDX-License-Identifier: MIT */
/*
 * timeline.c - the SVG timeline of a simulation (see timeline.h).
 *
 * The time axis is cut into BINS columns for the admitted/denied bars and
 * into one-pixel columns for the last-period line, whose value in a column
 * is the most it reached there (so a spike narrower than a pixel still
 * shows). Everything is scaled alike in every panel: the bars by the most
 * requests any bin received, the line by the largest worst interval.
 */
#include "timeline.h"

#include "svg.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#define WIDTH 1000.0
#define MARGIN_L 92.0
#define MARGIN_R 24.0
#define PLOT_W (WIDTH - MARGIN_L - MARGIN_R)
#define PLOT_COLS 884u /* = PLOT_W: one column per pixel */
#define HEADER_H 116.0
/* A panel, top to bottom: its title row, then two plots, each under a strip
 * of its own for its caption. Captions never sit on a plot: whatever the
 * data does, they cannot hide it. */
#define PANEL_H 196.0
#define BARS_Y 42.0 /* offsets within a panel */
#define BARS_H 56.0
#define LINE_Y 120.0
#define LINE_H 56.0
#define CAPTION_GAP 6.0 /* from a caption's baseline down to its plot */
#define AXIS_H 44.0
#define BINS 200u

#define GREEN "#2e9d4a"
#define RED "#d64541"
#define BLUE "#1f5fbf"
#define GREY "#888888"

static double x_of(uint64_t t_us, uint64_t duration) {
  return MARGIN_L + PLOT_W * (double)t_us / (double)duration;
}

/* A small caption in the strip above the plot whose top is at plot_y. */
static void caption(FILE *f, double plot_y, const char *text) {
  svg_text(f, MARGIN_L, plot_y - CAPTION_GAP, "start", 11, "normal", "%s",
           text);
}

/* Labels a time in the unit that reads best. */
static void fmt_time(char *buf, size_t cap, uint64_t us) {
  if (us % 1000000u == 0)
    snprintf(buf, cap, "%" PRIu64 " s", us / 1000000u);
  else if (us % 1000u == 0)
    snprintf(buf, cap, "%" PRIu64 " ms", us / 1000u);
  else
    snprintf(buf, cap, "%.3f ms", (double)us / 1000.0);
}

/* Admitted count over the last period, per pixel column, for one key of one
 * run: the most it reached within each column. */
static int last_period_columns(const sim_traffic *t, const sim_run *r,
                               uint32_t key, uint64_t period,
                               uint64_t cols[PLOT_COLS]) {
  size_t n = 0;
  for (size_t i = 0; i < t->n; i++)
    if (r->allowed[i] && t->ev[i].key == key)
      n++;
  uint64_t *at = malloc((n ? n : 1) * sizeof *at);
  if (!at)
    return -1;
  n = 0;
  for (size_t i = 0; i < t->n; i++)
    if (r->allowed[i] && t->ev[i].key == key)
      at[n++] = t->ev[i].t_us;
  /* sweep: +1 at each admit, -1 one period later; at equal times the -1
   * comes first (the interval is half-open) */
  size_t add = 0, drop = 0;
  uint64_t count = 0;
  for (unsigned c = 0; c < PLOT_COLS; c++) {
    uint64_t lo = t->duration_us * (uint64_t)c / PLOT_COLS;
    uint64_t hi = t->duration_us * (uint64_t)(c + 1) / PLOT_COLS;
    uint64_t best = 0;
    for (int pass = 0; pass < 2; pass++) {
      uint64_t end = pass == 0 ? lo : hi;
      for (;;) {
        uint64_t ta = add < n ? at[add] : UINT64_MAX;
        uint64_t td = drop < add ? at[drop] + period : UINT64_MAX;
        if ((ta < td ? ta : td) >= end)
          break;
        if (td <= ta) {
          drop++;
          count--;
        } else {
          add++;
          count++;
        }
        if (count > best)
          best = count;
      }
      if (pass == 0)
        best = count; /* the value entering the column */
    }
    cols[c] = best;
  }
  free(at);
  return 0;
}

static void header(FILE *f, const sim_params *p, const sim_traffic *t,
                   double height) {
  char per[32];
  fmt_time(per, sizeof per, p->quota.period_ms * 1000u);
  svg_begin(f, WIDTH, height);
  svg_text(f, MARGIN_L, 30, "start", 20, "bold",
           "tollgate simulate: %s traffic through every algorithm",
           sim_pattern_name(p->pattern));
  svg_text(f, MARGIN_L, 52, "start", 13, "normal", "Traffic: %s.",
           sim_pattern_about(p->pattern));
  svg_text(
      f, MARGIN_L, 70, "start", 13, "normal",
      "Quota: %" PRIu64 " per %s, burst %" PRIu64 ". %zu requests over %" PRIu64
      " periods%s, the same for every algorithm.",
      p->quota.limit, per, p->quota.burst ? p->quota.burst : p->quota.limit,
      t->n, p->periods, t->keys > 1 ? " on many keys" : "");
  double y = 96;
  svg_rect(f, MARGIN_L, y - 10, 12, 12, GREEN, 1);
  svg_text(f, MARGIN_L + 18, y, "start", 12, "normal", "admitted");
  svg_rect(f, MARGIN_L + 92, y - 10, 12, 12, RED, 1);
  svg_text(f, MARGIN_L + 110, y, "start", 12, "normal", "denied");
  svg_line(f, MARGIN_L + 174, y - 4, MARGIN_L + 200, y - 4, BLUE, 2, NULL);
  svg_text(f, MARGIN_L + 206, y, "start", 12, "normal",
           "admitted in the last %s (busiest key)", per);
  svg_line(f, MARGIN_L + 520, y - 4, MARGIN_L + 546, y - 4, "black", 1.2,
           "5 3");
  svg_text(f, MARGIN_L + 552, y, "start", 12, "normal", "limit");
  svg_line(f, MARGIN_L + 600, y - 10, MARGIN_L + 600, y + 2, GREY, 1, "2 2");
  svg_text(f, MARGIN_L + 606, y, "start", 12, "normal",
           "fixed-window boundary");
}

/* The period boundaries as faint vertical lines in [y0, y1]. */
static void boundaries(FILE *f, const sim_params *p, const sim_traffic *t,
                       double y0, double y1) {
  if (p->periods > 200)
    return;
  uint64_t period = p->quota.period_ms * 1000u;
  for (uint64_t k = 1; k < p->periods; k++) {
    double x = x_of(k * period, t->duration_us);
    svg_line(f, x, y0, x, y1, GREY, 0.6, "2 2");
  }
}

static int panel(FILE *f, const sim_params *p, const sim_traffic *t,
                 const sim_run *r, double top, uint64_t bin_max,
                 const uint64_t *adm, const uint64_t *den, double line_max,
                 uint64_t *cols) {
  uint64_t limit = p->quota.limit;
  char per[32], bin[32];
  fmt_time(per, sizeof per, p->quota.period_ms * 1000u);
  fmt_time(bin, sizeof bin, t->duration_us / BINS);
  svg_text(f, MARGIN_L, top + 16, "start", 15, "bold", "%s",
           tg_algorithm_name(r->alg));
  /* right-aligned, so a long algorithm name never runs into it */
  svg_text(f, MARGIN_L + PLOT_W, top + 16, "end", 13, "normal",
           "admitted %" PRIu64 ", denied %" PRIu64
           "; most admitted in any %s: %" PRIu64 " (%.2f x limit)",
           r->admitted, r->denied, per, r->worst,
           (double)r->worst / (double)limit);

  /* bars: admitted from the bottom, denied stacked on top */
  double by = top + BARS_Y, bw = PLOT_W / BINS;
  svg_rect(f, MARGIN_L, by, PLOT_W, BARS_H, "#f4f4f4", 1);
  for (unsigned b = 0; b < BINS; b++) {
    double ha = BARS_H * (double)adm[b] / (double)bin_max;
    double hd = BARS_H * (double)den[b] / (double)bin_max;
    double x = MARGIN_L + bw * b;
    if (adm[b])
      svg_rect(f, x, by + BARS_H - ha, bw, ha, GREEN, 1);
    if (den[b])
      svg_rect(f, x, by + BARS_H - ha - hd, bw, hd, RED, 1);
  }
  svg_text(f, MARGIN_L - 8, by + 10, "end", 11, "normal", "%" PRIu64, bin_max);
  svg_text(f, MARGIN_L - 8, by + BARS_H, "end", 11, "normal", "0");
  char text[96];
  snprintf(text, sizeof text, "requests per %s (all keys)", bin);
  caption(f, by, text);

  /* the last-period line of the busiest key, against the limit */
  double ly = top + LINE_Y;
  double y_limit = ly + LINE_H - LINE_H * (double)limit / line_max;
  svg_rect(f, MARGIN_L, ly, PLOT_W, LINE_H, "#f4f4f4", 1);
  svg_rect(f, MARGIN_L, ly, PLOT_W, y_limit - ly, RED, 0.08);
  /* over the plots only, not through the caption strip between them */
  boundaries(f, p, t, by, by + BARS_H);
  boundaries(f, p, t, ly, ly + LINE_H);
  if (last_period_columns(t, r, r->worst_key, p->quota.period_ms * 1000u,
                          cols) != 0)
    return -1;
  svg_poly_begin(f, BLUE, 1.8);
  for (unsigned c = 0; c < PLOT_COLS; c++)
    svg_poly_point(f, MARGIN_L + c + 0.5,
                   ly + LINE_H - LINE_H * (double)cols[c] / line_max);
  svg_poly_end(f);
  svg_line(f, MARGIN_L, y_limit, MARGIN_L + PLOT_W, y_limit, "black", 1.2,
           "5 3");
  svg_text(f, MARGIN_L - 8, y_limit + 4, "end", 11, "normal", "%" PRIu64,
           limit);
  svg_text(f, MARGIN_L - 8, ly + LINE_H, "end", 11, "normal", "0");
  double y_two = ly + LINE_H - LINE_H * (double)(2 * limit) / line_max;
  svg_text(f, MARGIN_L - 8, y_two + 4, "end", 11, "normal", "%" PRIu64,
           2 * limit);
  snprintf(text, sizeof text, "admitted in the last %s%s", per,
           t->keys > 1 ? " by the busiest key" : "");
  caption(f, ly, text);
  if (t->keys > 1)
    svg_text(f, MARGIN_L + PLOT_W, ly - CAPTION_GAP, "end", 11, "normal",
             "busiest key: k%" PRIu32, r->worst_key);
  return 0;
}

static void axis(FILE *f, const sim_params *p, const sim_traffic *t, double y) {
  uint64_t period = p->quota.period_ms * 1000u;
  uint64_t step = 1;
  while (p->periods / step > 20)
    step *= 2;
  svg_line(f, MARGIN_L, y, MARGIN_L + PLOT_W, y, "black", 1, NULL);
  for (uint64_t k = 0; k <= p->periods; k += step) {
    double x = x_of(k * period, t->duration_us);
    char lab[32];
    fmt_time(lab, sizeof lab, k * period);
    svg_line(f, x, y, x, y + 5, "black", 1, NULL);
    svg_text(f, x, y + 18, "middle", 11, "normal", "%s", lab);
  }
  svg_text(f, MARGIN_L + PLOT_W / 2, y + 36, "middle", 12, "normal",
           "simulated time (from a fixed-window boundary)");
}

int timeline_write(FILE *f, const sim_params *p, const sim_traffic *t,
                   const sim_run *runs, size_t nruns) {
  uint64_t *adm = calloc(BINS * (nruns ? nruns : 1), sizeof *adm);
  uint64_t *den = calloc(BINS * (nruns ? nruns : 1), sizeof *den);
  uint64_t *cols = malloc(PLOT_COLS * sizeof *cols);
  if (!adm || !den || !cols) {
    free(adm);
    free(den);
    free(cols);
    return -1;
  }
  uint64_t bin_max = 1;
  uint64_t worst = p->quota.limit * 2;
  for (size_t k = 0; k < nruns; k++) {
    for (size_t i = 0; i < t->n; i++) {
      size_t b = (size_t)(t->ev[i].t_us * BINS / t->duration_us);
      if (runs[k].allowed[i])
        adm[k * BINS + b]++;
      else
        den[k * BINS + b]++;
    }
    for (unsigned b = 0; b < BINS; b++) {
      uint64_t sum = adm[k * BINS + b] + den[k * BINS + b];
      if (sum > bin_max)
        bin_max = sum;
    }
    if (runs[k].worst > worst)
      worst = runs[k].worst;
  }
  double line_max = (double)worst * 1.1;
  double height = HEADER_H + PANEL_H * (double)nruns + AXIS_H;
  header(f, p, t, height);
  int rc = 0;
  for (size_t k = 0; k < nruns && rc == 0; k++)
    rc = panel(f, p, t, &runs[k], HEADER_H + PANEL_H * (double)k, bin_max,
               adm + k * BINS, den + k * BINS, line_max, cols);
  axis(f, p, t, HEADER_H + PANEL_H * (double)nruns - 8);
  svg_end(f);
  free(adm);
  free(den);
  free(cols);
  if (rc != 0 || ferror(f))
    return -1;
  return 0;
}

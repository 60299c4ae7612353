/* SPDX-License-Identifier: MIT */
/*
 * test_simulate.c - the numbers `tollgate simulate` prints (tools/simulate.c)
 * and the SVG it draws (tools/timeline.c).
 *
 * The headline: under the window-boundary attack a fixed window admits
 * twice its limit within one period, a sliding log exactly its limit. Then
 * the numbers are checked against independent reference models written
 * here (a sliding log and a fixed window in a dozen lines each, and a
 * brute-force "most admitted in any period"), and against the bounds each
 * algorithm promises, over every pattern and several quotas.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "simulate.h"
#include "timeline.h"

/* Runs every algorithm on the pattern; the caller frees with free_all. */
static void run_all(const sim_params *p, sim_traffic *t,
                    sim_run runs[TG_ALGORITHM_COUNT]) {
  assert_int_equal(sim_generate(p, t), TG_OK);
  for (int a = 0; a < TG_ALGORITHM_COUNT; a++)
    assert_int_equal(sim_replay(p, t, (tg_algorithm)a, &runs[a]), TG_OK);
}

static void free_all(sim_traffic *t, sim_run runs[TG_ALGORITHM_COUNT]) {
  for (int a = 0; a < TG_ALGORITHM_COUNT; a++)
    sim_run_free(&runs[a]);
  sim_traffic_free(t);
}

static void boundary_attack_doubles_the_fixed_window(void **state) {
  (void)state;
  static const tg_quota quotas[] = {
      {10, 1000, 0}, {1, 1000, 0}, {7, 60000, 0}, {100, 7, 0}, {3, 1, 0}};
  for (size_t i = 0; i < sizeof quotas / sizeof quotas[0]; i++) {
    sim_params p = {.pattern = SIM_BOUNDARY,
                    .quota = quotas[i],
                    .periods = 10,
                    .keys = 1,
                    .seed = 1};
    sim_traffic t;
    sim_run r[TG_ALGORITHM_COUNT];
    run_all(&p, &t, r);
    uint64_t l = quotas[i].limit;
    assert_int_equal(t.n, 5 * 2 * l); /* 5 attacks of 2 x limit */
    /* every request gets through the fixed window: 2 x limit per period */
    assert_int_equal(r[TG_FIXED_WINDOW].admitted, t.n);
    assert_int_equal(r[TG_FIXED_WINDOW].worst, 2 * l);
    /* the sliding log and the per-key window hold the line */
    assert_int_equal(r[TG_SLIDING_WINDOW].worst, l);
    assert_int_equal(r[TG_SLIDING_WINDOW].admitted, 5 * l);
    assert_int_equal(r[TG_FIXED_WINDOW_PER_KEY].worst, l);
    free_all(&t, r);
  }
}

/* Reference sliding log: admitted iff the admitted requests of the key
 * younger than a period, plus this one, fit the limit. */
static void reference_sliding(const sim_params *p, const sim_traffic *t,
                              unsigned char *ok) {
  uint64_t period = p->quota.period_ms * 1000u;
  for (size_t i = 0; i < t->n; i++) {
    uint64_t live = 0;
    for (size_t j = i; j-- > 0;) {
      if (t->ev[i].t_us - t->ev[j].t_us >= period)
        break;
      if (ok[j] && t->ev[j].key == t->ev[i].key)
        live++;
    }
    ok[i] = live + 1 <= p->quota.limit;
  }
}

/* Reference fixed window: epoch-aligned windows; every request is counted,
 * admitted iff the count including it fits the limit. */
static void reference_fixed(const sim_params *p, const sim_traffic *t,
                            unsigned char *ok) {
  uint64_t period = p->quota.period_ms * 1000u;
  for (size_t i = 0; i < t->n; i++) {
    uint64_t w = (t->t0_us + t->ev[i].t_us) / period, count = 1;
    for (size_t j = i; j-- > 0;) {
      if ((t->t0_us + t->ev[j].t_us) / period != w)
        break;
      if (t->ev[j].key == t->ev[i].key)
        count++;
    }
    ok[i] = count <= p->quota.limit;
  }
}

/* Brute force: most admitted for one key within [t, t + period). */
static uint64_t reference_worst(const sim_params *p, const sim_traffic *t,
                                const unsigned char *ok) {
  uint64_t period = p->quota.period_ms * 1000u, worst = 0;
  for (size_t i = 0; i < t->n; i++) {
    if (!ok[i])
      continue;
    uint64_t c = 0;
    for (size_t j = i; j < t->n && t->ev[j].t_us - t->ev[i].t_us < period; j++)
      c += ok[j] && t->ev[j].key == t->ev[i].key;
    if (c > worst)
      worst = c;
  }
  return worst;
}

static void every_pattern_matches_the_references(void **state) {
  (void)state;
  static const tg_quota quotas[] = {{5, 1000, 0}, {3, 250, 6}, {12, 60000, 4}};
  for (int pat = 0; pat < SIM_PATTERN_COUNT; pat++) {
    for (size_t qi = 0; qi < sizeof quotas / sizeof quotas[0]; qi++) {
      sim_params p = {.pattern = (sim_pattern)pat,
                      .quota = quotas[qi],
                      .periods = 8,
                      .keys = 20,
                      .seed = 7 + qi};
      sim_traffic t;
      sim_run r[TG_ALGORITHM_COUNT];
      run_all(&p, &t, r);
      assert_true(t.n > 0);
      for (size_t i = 1; i < t.n; i++)
        assert_true(t.ev[i - 1].t_us <= t.ev[i].t_us);
      assert_true(t.ev[t.n - 1].t_us < t.duration_us);
      unsigned char *ok = malloc(t.n);
      assert_non_null(ok);
      uint64_t l = p.quota.limit;
      uint64_t burst = p.quota.burst ? p.quota.burst : l;
      for (int a = 0; a < TG_ALGORITHM_COUNT; a++) {
        assert_int_equal(r[a].admitted + r[a].denied, t.n);
        assert_int_equal(r[a].worst, reference_worst(&p, &t, r[a].allowed));
      }
      reference_sliding(&p, &t, ok);
      assert_memory_equal(ok, r[TG_SLIDING_WINDOW].allowed, t.n);
      reference_fixed(&p, &t, ok);
      assert_memory_equal(ok, r[TG_FIXED_WINDOW].allowed, t.n);
      /* the bounds each algorithm promises for any one period */
      assert_true(r[TG_SLIDING_WINDOW].worst <= l);
      assert_true(r[TG_FIXED_WINDOW].worst <= 2 * l);
      assert_true(r[TG_FIXED_WINDOW_PER_KEY].worst <= 2 * l);
      assert_true(r[TG_TOKEN_BUCKET].worst <= burst + l);
      assert_true(r[TG_LEAKY_BUCKET].worst <= burst + l);
      free(ok);
      free_all(&t, r);
    }
  }
}

static void steady_traffic_at_twice_the_rate(void **state) {
  (void)state;
  sim_params p = {.pattern = SIM_STEADY,
                  .quota = {10, 1000, 0},
                  .periods = 10,
                  .keys = 1,
                  .seed = 1};
  sim_traffic t;
  sim_run r[TG_ALGORITHM_COUNT];
  run_all(&p, &t, r);
  assert_int_equal(t.n, 200);
  /* windows admit exactly the limit per period, and half the requests */
  assert_int_equal(r[TG_FIXED_WINDOW].admitted, 100);
  assert_int_equal(r[TG_SLIDING_WINDOW].admitted, 100);
  assert_int_equal(r[TG_SLIDING_WINDOW].worst, 10);
  /* a full bucket admits its burst on top of the rate at first */
  assert_true(r[TG_TOKEN_BUCKET].worst > 10);
  assert_true(r[TG_TOKEN_BUCKET].admitted > 100);
  free_all(&t, r);
}

static void many_keys_is_reproducible(void **state) {
  (void)state;
  sim_params p = {.pattern = SIM_MANY_KEYS,
                  .quota = {10, 1000, 0},
                  .periods = 4,
                  .keys = 50,
                  .seed = 3};
  sim_traffic a, b, c;
  assert_int_equal(sim_generate(&p, &a), TG_OK);
  assert_int_equal(sim_generate(&p, &b), TG_OK);
  p.seed = 4;
  assert_int_equal(sim_generate(&p, &c), TG_OK);
  assert_int_equal(a.n, 4 * 10 * 50 * 3 / 2);
  assert_int_equal(a.n, b.n);
  size_t same_c = 0;
  for (size_t i = 0; i < a.n; i++) {
    assert_int_equal(a.ev[i].t_us, b.ev[i].t_us);
    assert_int_equal(a.ev[i].key, b.ev[i].key);
    same_c += a.ev[i].t_us == c.ev[i].t_us && a.ev[i].key == c.ev[i].key;
  }
  assert_true(same_c < a.n / 10); /* another seed, other traffic */
  uint32_t seen = 0;
  for (size_t i = 0; i < a.n; i++) {
    assert_true(a.ev[i].key < 50);
    seen |= a.ev[i].key < 32 ? 1u << a.ev[i].key : 0;
  }
  assert_int_equal(seen, UINT32_MAX); /* the keys are all used */
  sim_traffic_free(&a);
  sim_traffic_free(&b);
  sim_traffic_free(&c);
}

static void bad_parameters_are_errors(void **state) {
  (void)state;
  sim_traffic t;
  sim_params p = {
      .pattern = SIM_STEADY, .quota = {0, 1000, 0}, .periods = 10, .keys = 1};
  assert_int_equal(sim_generate(&p, &t), TG_EQUOTA);
  p.quota.limit = 10;
  p.quota.period_ms = 0;
  assert_int_equal(sim_generate(&p, &t), TG_EQUOTA);
  p.quota.period_ms = 1000;
  p.periods = 0;
  assert_int_equal(sim_generate(&p, &t), TG_EINVAL);
  p.pattern = SIM_BOUNDARY;
  p.periods = 1; /* an attack needs a boundary inside the run */
  assert_int_equal(sim_generate(&p, &t), TG_EINVAL);
  p.pattern = SIM_MANY_KEYS;
  p.periods = 10;
  p.keys = 1000000;
  p.quota.limit = 1000000; /* far more than SIM_MAX_EVENTS requests */
  assert_int_equal(sim_generate(&p, &t), TG_EINVAL);
  assert_null(t.ev);
  p.pattern = (sim_pattern)SIM_PATTERN_COUNT;
  assert_int_equal(sim_generate(&p, &t), TG_EINVAL);
  sim_pattern pat;
  assert_int_equal(sim_parse_pattern("boundary", &pat), 0);
  assert_int_equal(pat, SIM_BOUNDARY);
  assert_int_equal(sim_parse_pattern("nope", &pat), -1);
  assert_string_equal(sim_pattern_name(SIM_MANY_KEYS), "many_keys");
}

/* A refusal says which limit was hit and with what values, so a user can
 * fix the command line without reading the source. */
static void a_refusal_names_the_limit_and_its_value(void **state) {
  (void)state;
  char why[256];
  uint64_t n = 1;
  sim_params p = {.pattern = SIM_BOUNDARY,
                  .quota = {1000, 1000, 0},
                  .periods = 100000,
                  .keys = 1};
  assert_int_equal(sim_check(&p, &n, why, sizeof why), TG_EINVAL);
  assert_int_equal(n, 0);
  assert_non_null(strstr(why, "100000000 requests")); /* what was asked */
  char max[32];
  snprintf(max, sizeof max, "%" PRIu64, SIM_MAX_EVENTS);
  assert_non_null(strstr(why, max)); /* the limit's value */
  assert_non_null(strstr(why, "--periods (100000)"));
  p.periods = 10;
  assert_int_equal(sim_check(&p, &n, why, sizeof why), TG_OK);
  assert_int_equal(n, 10000); /* 5 attacks of 2 x limit */
  assert_string_equal(why, "");
  p.periods = 1;
  assert_int_equal(sim_check(&p, NULL, why, sizeof why), TG_EINVAL);
  assert_non_null(strstr(why, "--periods 2 or more"));
  /* counts beyond 64 bits are refused, not wrapped into a small number */
  p.pattern = SIM_MANY_KEYS;
  p.periods = UINT64_MAX / 4;
  p.quota.period_ms = 1;
  p.keys = 1000000;
  p.quota.limit = UINT64_MAX / 2;
  assert_int_equal(sim_check(&p, &n, why, sizeof why), TG_EINVAL);
  assert_int_equal(sim_check(&p, &n, NULL, 0), TG_EINVAL);
  /* a quota a bucket refuses (tolerance burst x T beyond its bound) is
   * refused before any run, naming the algorithm */
  p = (sim_params){.pattern = SIM_BURSTY,
                   .quota = {1, 1000000000000, 20000000},
                   .periods = 1,
                   .keys = 1};
  assert_int_equal(sim_check(&p, &n, why, sizeof why), TG_EQUOTA);
  assert_non_null(strstr(why, "token_bucket"));
  assert_non_null(strstr(why, "--burst 20000000"));
  assert_non_null(strstr(why, "126 years"));
  /* a rate above one per nanosecond is the other bound, and is named as
   * that (it was named the tolerance's) */
  p.quota = (tg_quota){2000000, 1, 0};
  assert_int_equal(sim_check(&p, &n, why, sizeof why), TG_EQUOTA);
  assert_non_null(strstr(why, "one per nanosecond"));
  assert_null(strstr(why, "126 years"));
}

typedef struct seen {
  int calls[TG_ALGORITHM_COUNT];
  size_t last_done[TG_ALGORITHM_COUNT];
  int out_of_order;
} seen;

static void note_progress(void *ctx, tg_algorithm alg, size_t done,
                          size_t total) {
  seen *s = ctx;
  if (done > total || done < s->last_done[alg])
    s->out_of_order++;
  s->calls[alg]++;
  s->last_done[alg] = done;
}

/* The progress callback hears from every algorithm, in order, ending at
 * the total; a run without one is unaffected. */
static void a_replay_reports_its_progress(void **state) {
  (void)state;
  seen s = {0};
  sim_params p = {.pattern = SIM_STEADY,
                  .quota = {100000, 1000, 0},
                  .periods = 1,
                  .keys = 1,
                  .progress = note_progress,
                  .progress_ctx = &s};
  sim_traffic t;
  sim_run r[TG_ALGORITHM_COUNT];
  run_all(&p, &t, r);
  assert_int_equal(t.n, 200000);
  for (int a = 0; a < TG_ALGORITHM_COUNT; a++) {
    assert_int_equal(s.calls[a], 200000 / 65536 + 1); /* 3 steps, the end */
    assert_int_equal(s.last_done[a], t.n);
  }
  assert_int_equal(s.out_of_order, 0);
  free_all(&t, r);
}

/* Counts the occurrences of needle in hay. */
static int count(const char *hay, const char *needle) {
  int n = 0;
  for (const char *p = strstr(hay, needle); p; p = strstr(p + 1, needle))
    n++;
  return n;
}

static void the_timeline_is_an_svg_with_every_algorithm(void **state) {
  (void)state;
  sim_params p = {.pattern = SIM_BOUNDARY,
                  .quota = {10, 1000, 0},
                  .periods = 10,
                  .keys = 1,
                  .seed = 1};
  sim_traffic t;
  sim_run r[TG_ALGORITHM_COUNT];
  run_all(&p, &t, r);
  FILE *f = tmpfile();
  assert_non_null(f);
  assert_int_equal(timeline_write(f, &p, &t, r, TG_ALGORITHM_COUNT), 0);
  long len = ftell(f);
  assert_true(len > 1000);
  rewind(f);
  char *svg = calloc((size_t)len + 1, 1);
  assert_non_null(svg);
  assert_int_equal(fread(svg, 1, (size_t)len, f), (size_t)len);
  fclose(f);
  assert_true(strncmp(svg, "<?xml", 5) == 0);
  assert_non_null(strstr(svg, "<svg xmlns=\"http://www.w3.org/2000/svg\""));
  assert_string_equal(svg + len - 7, "</svg>\n");
  for (int a = 0; a < TG_ALGORITHM_COUNT; a++) {
    char title[64];
    snprintf(title, sizeof title, ">%s</text>",
             tg_algorithm_name((tg_algorithm)a));
    assert_int_equal(count(svg, title), 1);
  }
  /* one last-period line per algorithm, and the headline numbers */
  assert_int_equal(count(svg, "<polyline"), TG_ALGORITHM_COUNT);
  assert_non_null(strstr(svg, "most admitted in any 1 s: 20 (2.00 x limit)"));
  assert_non_null(strstr(svg, "most admitted in any 1 s: 10 (1.00 x limit)"));
  /* every element that opens is closed: no stray markup */
  assert_int_equal(count(svg, "<text"), count(svg, "</text>"));
  assert_int_equal(count(svg, "<"), count(svg, ">"));
  free(svg);
  free_all(&t, r);
}

/* A plot area of the timeline: the grey background every plot is drawn
 * on (timeline.c fills each with #f4f4f4 before drawing data into it). */
typedef struct box {
  double x0, y0, x1, y1;
} box;

static bool overlap(box a, box b) {
  return a.x0 < b.x1 && b.x0 < a.x1 && a.y0 < b.y1 && b.y0 < a.y1;
}

/* The box a <text> line covers, estimated generously from its font size
 * (glyphs at most 0.62 em wide, ascent 0.8 em, descent 0.25 em) and its
 * anchor. Entities count as one character. */
static box text_box(const char *line) {
  double x, y, size;
  char anchor[16];
  assert_int_equal(sscanf(line,
                          "<text x=\"%lf\" y=\"%lf\" text-anchor=\"%15[a-z]\" "
                          "font-size=\"%lf\"",
                          &x, &y, anchor, &size),
                   4);
  const char *body = strchr(line, '>') + 1;
  const char *end = strstr(body, "</text>");
  assert_non_null(end);
  size_t chars = 0;
  for (const char *c = body; c < end; c++) {
    if (*c == '&')
      c = strchr(c, ';');
    chars++;
  }
  double w = 0.62 * size * (double)chars;
  double left = strcmp(anchor, "start") == 0 ? x
                : strcmp(anchor, "end") == 0 ? x - w
                                             : x - w / 2;
  return (box){left, y - 0.8 * size, left + w, y + 0.25 * size};
}

/* Captions, titles and axis labels sit beside the plots, never on them, so
 * no pattern's data can be hidden by a label: checked on every pattern,
 * including one with many keys (which adds a "busiest key" label). */
static void no_label_covers_a_plot(void **state) {
  (void)state;
  for (int pat = 0; pat < SIM_PATTERN_COUNT; pat++) {
    sim_params p = {.pattern = (sim_pattern)pat,
                    .quota = {10, 1000, 0},
                    .periods = 6,
                    .keys = 100,
                    .seed = 1};
    sim_traffic t;
    sim_run r[TG_ALGORITHM_COUNT];
    run_all(&p, &t, r);
    FILE *f = tmpfile();
    assert_non_null(f);
    assert_int_equal(timeline_write(f, &p, &t, r, TG_ALGORITHM_COUNT), 0);
    rewind(f);
    box plots[64];
    size_t nplots = 0, ntexts = 0;
    char line[4096];
    while (fgets(line, sizeof line, f)) {
      box b;
      if (strncmp(line, "<rect ", 6) == 0 && strstr(line, "#f4f4f4")) {
        double w, h;
        assert_int_equal(sscanf(line,
                                "<rect x=\"%lf\" y=\"%lf\" width=\"%lf\" "
                                "height=\"%lf\"",
                                &b.x0, &b.y0, &w, &h),
                         4);
        b.x1 = b.x0 + w;
        b.y1 = b.y0 + h;
        assert_true(nplots < sizeof plots / sizeof plots[0]);
        plots[nplots++] = b;
      }
    }
    assert_int_equal(nplots, 2 * TG_ALGORITHM_COUNT);
    rewind(f);
    while (fgets(line, sizeof line, f)) {
      if (strncmp(line, "<text ", 6) != 0)
        continue;
      ntexts++;
      box tb = text_box(line);
      for (size_t i = 0; i < nplots; i++)
        if (overlap(tb, plots[i])) {
          print_error("pattern %s: label over a plot: %s",
                      sim_pattern_name((sim_pattern)pat), line);
          fail();
        }
    }
    assert_true(ntexts > 4 * TG_ALGORITHM_COUNT);
    fclose(f);
    free_all(&t, r);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(boundary_attack_doubles_the_fixed_window),
      cmocka_unit_test(every_pattern_matches_the_references),
      cmocka_unit_test(steady_traffic_at_twice_the_rate),
      cmocka_unit_test(many_keys_is_reproducible),
      cmocka_unit_test(bad_parameters_are_errors),
      cmocka_unit_test(a_refusal_names_the_limit_and_its_value),
      cmocka_unit_test(a_replay_reports_its_progress),
      cmocka_unit_test(the_timeline_is_an_svg_with_every_algorithm),
      cmocka_unit_test(no_label_covers_a_plot),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}

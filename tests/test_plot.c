/*
 * The plot writer and its font: tick steps are 1/2/5 x 10^k and minimal, the glyph table is
 * well formed and every glyph distinct, and a rendered PNG read back with libpng has the
 * requested size, each point's pixel in its series colour, white margins, labels inside the
 * plot area, non-finite points ignored, and clear errors for plots that cannot be drawn.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <png.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench/bitmap_font.h"
#include "bench/plot.h"
#include "vspec/types.h"

/* ---- helpers ------------------------------------------------------------------------- */

static void temp_path(char *buf, size_t len) {
  const char *dir = getenv("TMPDIR");
  snprintf(buf, len, "%s/vs_test_plot_XXXXXX", dir && *dir ? dir : "/tmp");
  int fd = mkstemp(buf);
  assert_true(fd >= 0);
  close(fd);
}

/* Reads an 8-bit RGB PNG with libpng's simplified API; returns the pixels (caller frees). */
static uint8_t *read_png(const char *path, int *w, int *h) {
  png_image img;
  memset(&img, 0, sizeof img);
  img.version = PNG_IMAGE_VERSION;
  if (!png_image_begin_read_from_file(&img, path)) fail_msg("libpng: %s", img.message);
  img.format = PNG_FORMAT_RGB;
  uint8_t *buf = malloc(PNG_IMAGE_SIZE(img));
  assert_non_null(buf);
  if (!png_image_finish_read(&img, NULL, buf, 0, NULL)) fail_msg("libpng: %s", img.message);
  *w = (int)img.width;
  *h = (int)img.height;
  return buf;
}

static const uint8_t *px_at(const uint8_t *rgb, int w, int x, int y) {
  return rgb + ((size_t)y * w + x) * 3;
}

static int is_white(const uint8_t *p) { return p[0] == 255 && p[1] == 255 && p[2] == 255; }

/* Three well-separated points in three series; the third is the rightmost. */
static const char *const kSeries[] = {"AR", "LANTERN", "VVS"};
static const vs_plot_point kPoints[] = {
    {1.0, 4.6, "AR", 0, 0, 0, 0}, {2.0, 5.0, "LANTERN d=0.1", 1, 0, 0, 0}, {3.5, 7.5, "VVS k=4", 2, 0, 0, 0}};

static vs_plot base_plot(void) {
  vs_plot p = {.title = "FID against TPF",
               .x_label = "TPF",
               .y_label = "FID",
               .series_names = kSeries,
               .n_series = 3,
               .points = kPoints,
               .n_points = 3};
  return p;
}

static double mantissa(double step) { return step / pow(10.0, floor(log10(step) + 1e-9)); }

static int is_nice(double step) {
  double m = mantissa(step);
  return fabs(m - 1) < 1e-9 || fabs(m - 2) < 1e-9 || fabs(m - 5) < 1e-9;
}

/* ---- ticks --------------------------------------------------------------------------- */

static void test_nice_step_values(void **state) {
  (void)state;
  assert_float_equal(vs_plot_nice_step(1.0, 6), 0.2, 1e-12);    /* 0, 0.2, .. 1 */
  assert_float_equal(vs_plot_nice_step(1.0, 5), 0.5, 1e-12);    /* 0.25 is not nice */
  assert_float_equal(vs_plot_nice_step(3.0, 4), 1.0, 1e-12);    /* 1, 2, 3, 4 */
  assert_float_equal(vs_plot_nice_step(3.71, 8), 1.0, 1e-12);   /* 0.5 would give 8 gaps */
  assert_float_equal(vs_plot_nice_step(0.037, 5), 0.01, 1e-15); /* small ranges */
  assert_float_equal(vs_plot_nice_step(12345, 6), 5000, 1e-9);  /* large ranges */
  assert_float_equal(vs_plot_nice_step(7, 2), 10, 1e-12);
  /* Not a range: 0, so callers cannot loop forever on a zero step. */
  assert_true(vs_plot_nice_step(0, 5) == 0);
  assert_true(vs_plot_nice_step(-1, 5) == 0);
  assert_true(vs_plot_nice_step(NAN, 5) == 0);
  assert_true(vs_plot_nice_step(INFINITY, 5) == 0);
  assert_true(vs_plot_nice_step(1, 1) == 0);
}

/* Over spans from 1e-6 to 1e6: the step is 1/2/5 x 10^k, keeps at most max_ticks ticks in
 * the span, and the next smaller nice step would not. */
static void test_nice_step_properties(void **state) {
  (void)state;
  for (double span = 1e-6; span < 1e6; span *= 1.37) {
    for (int mt = 2; mt <= 12; mt++) {
      double st = vs_plot_nice_step(span, mt);
      assert_true(st > 0);
      if (!is_nice(st)) fail_msg("span %g, %d ticks: step %g is not 1/2/5 x 10^k", span, mt, st);
      if (span / st > (mt - 1) * (1 + 1e-9))
        fail_msg("span %g, %d ticks: step %g gives too many ticks", span, mt, st);
      double m = mantissa(st), smaller = fabs(m - 5) < 1e-9 ? st * 0.4 : st * 0.5;
      if (span / smaller <= (mt - 1) * (1 - 1e-9))
        fail_msg("span %g, %d ticks: step %g is not the smallest (%g fits)", span, mt, st, smaller);
    }
  }
}

/* ---- font ---------------------------------------------------------------------------- */

static void test_font_table_well_formed(void **state) {
  (void)state;
  int bad = vs_font_check();
  if (bad) fail_msg("glyph sheet line %d is malformed", bad);
}

static void test_font_glyphs_distinct(void **state) {
  (void)state;
  for (int ch = 32; ch <= 126; ch++) {
    unsigned ink = 0;
    for (int r = 0; r < VS_FONT_GLYPH_H; r++) {
      unsigned bits = vs_font_glyph_row((unsigned char)ch, r);
      assert_true(bits < (1u << VS_FONT_GLYPH_W));
      ink |= bits;
    }
    if (ch == ' ') {
      assert_int_equal(ink, 0);
      continue;
    }
    if (!ink) fail_msg("glyph '%c' is empty", ch);
    for (int other = 33; other < ch; other++) {
      int same = 1;
      for (int r = 0; r < VS_FONT_GLYPH_H && same; r++)
        same =
            vs_font_glyph_row((unsigned char)ch, r) == vs_font_glyph_row((unsigned char)other, r);
      if (same) fail_msg("glyphs '%c' and '%c' are identical", other, ch);
    }
  }
  /* Outside printable ASCII draws as '?'. */
  for (int r = 0; r < VS_FONT_GLYPH_H; r++)
    assert_int_equal(vs_font_glyph_row(200, r), vs_font_glyph_row('?', r));
}

static int count_ink(const vs_canvas *c, int *minx, int *miny, int *maxx, int *maxy) {
  int n = 0;
  *minx = *miny = 1 << 30;
  *maxx = *maxy = -1;
  for (int y = 0; y < c->height; y++)
    for (int x = 0; x < c->width; x++)
      if (!is_white(px_at(c->rgb, c->width, x, y))) {
        n++;
        if (x < *minx) *minx = x;
        if (y < *miny) *miny = y;
        if (x > *maxx) *maxx = x;
        if (y > *maxy) *maxy = y;
      }
  return n;
}

static void test_draw_text(void **state) {
  (void)state;
  enum { W = 80, H = 60 };
  static uint8_t rgb[W * H * 3];
  vs_canvas c = {rgb, W, H};
  const uint8_t black[3] = {0, 0, 0};
  int x0, y0, x1, y1;

  memset(rgb, 255, sizeof rgb);
  assert_int_equal(vs_draw_text(&c, 5, 5, "   ", black, 2), vs_text_width("   ", 2));
  assert_int_equal(count_ink(&c, &x0, &y0, &x1, &y1), 0); /* space draws nothing */

  /* "Ag" at scale 2: exactly the glyph bits, each a 2x2 block, inside the text box. */
  int bits = 0;
  for (int r = 0; r < VS_FONT_GLYPH_H; r++)
    bits += __builtin_popcount(vs_font_glyph_row('A', r)) +
            __builtin_popcount(vs_font_glyph_row('g', r));
  int w = vs_draw_text(&c, 5, 7, "Ag", black, 2);
  assert_int_equal(w, 2 * VS_FONT_CELL_W * 2 - 2);
  assert_int_equal(count_ink(&c, &x0, &y0, &x1, &y1), bits * 4);
  assert_true(x0 >= 5 && x1 < 5 + w && y0 >= 7 && y1 < 7 + vs_text_height(2));
  assert_true(y1 >= 7 + VS_FONT_CAP_H * 2); /* g's descender goes below the baseline */

  /* Rotated: the same ink, in the transposed box above (x, y). */
  memset(rgb, 255, sizeof rgb);
  vs_draw_text_up(&c, 10, 50, "Ag", black, 2);
  assert_int_equal(count_ink(&c, &x0, &y0, &x1, &y1), bits * 4);
  assert_true(x0 >= 10 && x1 < 10 + vs_text_height(2) && y1 <= 50 && y0 > 50 - w);

  /* Clipping: text running off the canvas draws only what fits and does not crash. */
  memset(rgb, 255, sizeof rgb);
  vs_draw_text(&c, W - 4, H - 4, "WW", black, 3);
  vs_draw_text(&c, -20, -20, "WW", black, 3);
  assert_true(count_ink(&c, &x0, &y0, &x1, &y1) > 0);
}

/* ---- plots --------------------------------------------------------------------------- */

static void test_pareto(void **state) {
  (void)state;
  vs_plot_point pts[] = {
      {1.0, 4.6, "ar", 0, 0, 0, 0},  /* dominated by 1: as fast, better */
      {1.0, 4.5, "a", 0, 0, 0, 0},   /* front */
      {2.0, 5.0, "b", 0, 0, 0, 0},   /* dominated by d: as good, slower */
      {2.0, 5.5, "c", 0, 0, 0, 0},   /* dominated by b */
      {3.0, 5.0, "d", 0, 0, 0, 0},   /* front */
      {NAN, 1.0, "nan", 0, 0, 0, 0}, /* never on the front, never dominates */
      {4.0, 9.0, "e", 0, 0, 0, 0},   /* front: fastest */
  };
  int front[7];
  int n = vs_plot_pareto(pts, 7, front);
  int want[7] = {0, 1, 0, 0, 1, 0, 1};
  for (int i = 0; i < 7; i++)
    if (front[i] != want[i])
      fail_msg("point %s: on_front %d, want %d", pts[i].label, front[i], want[i]);
  assert_int_equal(n, 3);
}

static void test_series_colors(void **state) {
  (void)state;
  uint8_t c[7][3];
  for (int i = 0; i < 7; i++) {
    vs_plot_series_color(i, c[i]);
    assert_false(is_white(c[i]));
    for (int j = 0; j < i; j++) assert_false(memcmp(c[i], c[j], 3) == 0);
  }
  uint8_t again[3];
  vs_plot_series_color(7, again); /* the palette repeats */
  assert_memory_equal(again, c[0], 3);
}

static void test_png_pixels(void **state) {
  (void)state;
  char path[512], err[VSPEC_ERRLEN];
  temp_path(path, sizeof path);
  vs_plot p = base_plot();
  p.connect_series = 1;
  p.mark_pareto = 1;
  enum { W = 640, H = 480 };
  if (vs_plot_write_png(&p, W, H, path, err, sizeof err)) fail_msg("%s", err);
  int w, h;
  uint8_t *png = read_png(path, &w, &h);
  unlink(path);
  assert_int_equal(w, W);
  assert_int_equal(h, H);

  /* The layout is a pure function of the plot: render again in memory to get it. */
  static uint8_t rgb[W * H * 3];
  vs_plot_layout L;
  assert_int_equal(vs_plot_render(&p, W, H, rgb, &L, err, sizeof err), 0);
  assert_memory_equal(rgb, png, sizeof rgb); /* the file holds exactly the rendered pixels */

  assert_true(0 < L.x0 && L.x0 < L.x1 && L.x1 < W - 1);
  assert_true(0 < L.y0 && L.y0 < L.y1 && L.y1 < H - 1);
  assert_true(is_nice(L.xstep) && is_nice(L.ystep));
  assert_int_equal(L.n_drawn, 3);
  for (int i = 0; i < 3; i++) {
    int x, y;
    vs_plot_to_pixel(&L, kPoints[i].x, kPoints[i].y, &x, &y);
    assert_true(x > L.x0 && x < L.x1 && y > L.y0 && y < L.y1);
    uint8_t col[3];
    vs_plot_series_color(kPoints[i].series, col);
    const uint8_t *got = px_at(png, W, x, y);
    if (memcmp(got, col, 3))
      fail_msg("point %d at (%d,%d): colour %d,%d,%d, series colour %d,%d,%d", i, x, y, got[0],
               got[1], got[2], col[0], col[1], col[2]);
  }
  /* Margins are white: the corners and the strip left of the rotated y title. */
  assert_true(is_white(px_at(png, W, 0, 0)));
  assert_true(is_white(px_at(png, W, W - 1, H - 1)));
  assert_true(is_white(px_at(png, W, W - 1, 0)));
  for (int y = 0; y < H; y++) assert_true(is_white(px_at(png, W, 2, y)));
  /* The frame is drawn one pixel outside the area, dark. */
  const uint8_t *f = px_at(png, W, L.x0 - 1, (L.y0 + L.y1) / 2);
  assert_true(f[0] < 64 && f[1] < 64 && f[2] < 64);
  /* Legend: inside the canvas, covering no point. */
  assert_true(L.legend_x0 >= 0 && L.legend_x1 < W && L.legend_y0 >= 0 && L.legend_y1 < H);
  for (int i = 0; i < 3; i++) {
    int x, y;
    vs_plot_to_pixel(&L, kPoints[i].x, kPoints[i].y, &x, &y);
    assert_false(x >= L.legend_x0 && x <= L.legend_x1 && y >= L.legend_y0 && y <= L.legend_y1);
  }
  free(png);
}

/* A label is drawn, next to its point, and kept inside the plot area even for the
 * rightmost point (whose label must go left, not over the frame). */
static void test_labels_inside_area(void **state) {
  (void)state;
  enum { W = 480, H = 360 };
  static uint8_t with[W * H * 3], without[W * H * 3];
  char err[VSPEC_ERRLEN];
  vs_plot_point pts[3];
  memcpy(pts, kPoints, sizeof pts);
  pts[2].label = "a rather long label";
  vs_plot p = base_plot();
  p.points = pts;
  p.series_names = NULL; /* no legend: the label is the only difference */
  p.n_series = 0;
  for (int i = 0; i < 3; i++) pts[i].series = 0;
  vs_plot_layout L;
  assert_int_equal(vs_plot_render(&p, W, H, with, &L, err, sizeof err), 0);
  pts[2].label = NULL;
  assert_int_equal(vs_plot_render(&p, W, H, without, NULL, err, sizeof err), 0);
  int px, py, n = 0, far = 0;
  vs_plot_to_pixel(&L, pts[2].x, pts[2].y, &px, &py);
  for (int y = 0; y < H; y++)
    for (int x = 0; x < W; x++) {
      if (!memcmp(px_at(with, W, x, y), px_at(without, W, x, y), 3)) continue;
      n++;
      if (x <= L.x0 || x >= L.x1 || y <= L.y0 || y >= L.y1)
        fail_msg("label pixel (%d,%d) outside the plot area [%d,%d]x[%d,%d]", x, y, L.x0, L.x1,
                 L.y0, L.y1);
      if (abs(y - py) > 40) far++;
    }
  assert_true(n > 0);       /* the label was drawn */
  assert_int_equal(far, 0); /* and next to its point */
  assert_int_equal(L.legend_x0, -1);
}

static int legend_covers_a_point(const vs_plot_layout *L, const vs_plot_point *pts, int n) {
  for (int i = 0; i < n; i++) {
    int x, y;
    vs_plot_to_pixel(L, pts[i].x, pts[i].y, &x, &y);
    /* The marker's reach, not just its centre: a legend may not touch it. */
    if (x + 6 >= L->legend_x0 && x - 6 <= L->legend_x1 && y + 6 >= L->legend_y0 &&
        y - 6 <= L->legend_y1)
      return 1;
  }
  return 0;
}

/* The legend goes into a free corner of the plot area, or beside it when none is free. */
static void test_legend_avoids_points(void **state) {
  (void)state;
  enum { W = 640, H = 480 };
  static uint8_t rgb[W * H * 3];
  char err[VSPEC_ERRLEN];
  const char *const names[] = {"one series"};
  /* Three corners taken: only the lower left is free. */
  vs_plot_point three[] = {{0, 1, "ul", 0, 0, 0, 0}, {1, 1, "ur", 0, 0, 0, 0}, {1, 0, "lr", 0, 0, 0, 0}};
  vs_plot p = {.series_names = names, .n_series = 1, .points = three, .n_points = 3};
  vs_plot_layout L;
  assert_int_equal(vs_plot_render(&p, W, H, rgb, &L, err, sizeof err), 0);
  assert_int_equal(L.legend_outside, 0);
  assert_true(L.legend_x0 > L.x0 && L.legend_x1 < L.x1 && L.legend_y0 > L.y0 && L.legend_y1 < L.y1);
  assert_false(legend_covers_a_point(&L, three, 3));
  assert_true(L.legend_x1 < (L.x0 + L.x1) / 2 && L.legend_y0 > (L.y0 + L.y1) / 2);
  /* All four corners taken: the legend moves right of the area, still on the canvas. */
  vs_plot_point four[] = {{0, 1, "ul", 0, 0, 0, 0}, {1, 1, "ur", 0, 0, 0, 0}, {1, 0, "lr", 0, 0, 0, 0}, {0, 0, "ll", 0, 0, 0, 0}};
  p.points = four;
  p.n_points = 4;
  assert_int_equal(vs_plot_render(&p, W, H, rgb, &L, err, sizeof err), 0);
  assert_int_equal(L.legend_outside, 1);
  assert_true(L.legend_x0 > L.x1 && L.legend_x1 < W && L.legend_y1 < H);
  assert_false(legend_covers_a_point(&L, four, 4));
}

/* NaN and infinite points are skipped: the image is the same as without them. */
static void test_nonfinite_skipped(void **state) {
  (void)state;
  enum { W = 400, H = 300 };
  static uint8_t a[W * H * 3], b[W * H * 3];
  char err[VSPEC_ERRLEN];
  vs_plot_point pts[5];
  memcpy(pts, kPoints, 3 * sizeof pts[0]);
  pts[3] = (vs_plot_point){NAN, 5.0, "nan", 1, 0, 0, 0};
  pts[4] = (vs_plot_point){2.5, INFINITY, "inf", 2, 0, 0, 0};
  vs_plot p = base_plot();
  p.mark_pareto = 1;
  p.connect_series = 1;
  vs_plot_layout L;
  assert_int_equal(vs_plot_render(&p, W, H, a, NULL, err, sizeof err), 0);
  p.points = pts;
  p.n_points = 5;
  assert_int_equal(vs_plot_render(&p, W, H, b, &L, err, sizeof err), 0);
  assert_int_equal(L.n_drawn, 3);
  assert_memory_equal(a, b, sizeof a);
}

static void test_degenerate_ranges(void **state) {
  (void)state;
  enum { W = 320, H = 240 };
  static uint8_t rgb[W * H * 3];
  char err[VSPEC_ERRLEN];
  vs_plot_layout L;
  /* One point: a range is made around it and the point lands inside. */
  vs_plot_point one = {2.5, 4.0, "only", 0, 0, 0, 0};
  vs_plot p = {.points = &one, .n_points = 1, .mark_pareto = 1};
  if (vs_plot_render(&p, W, H, rgb, &L, err, sizeof err)) fail_msg("%s", err);
  assert_true(L.xmin < 2.5 && 2.5 < L.xmax && L.ymin < 4.0 && 4.0 < L.ymax);
  int x, y;
  vs_plot_to_pixel(&L, 2.5, 4.0, &x, &y);
  uint8_t col[3];
  vs_plot_series_color(0, col);
  assert_memory_equal(px_at(rgb, W, x, y), col, 3);
  /* All x equal (and zero): still a proper x range. */
  vs_plot_point same[] = {{0, 1, "a", 0, 0, 0, 0}, {0, 2, "b", 0, 0, 0, 0}, {0, 3, "c", 0, 0, 0, 0}};
  p.points = same;
  p.n_points = 3;
  if (vs_plot_render(&p, W, H, rgb, &L, err, sizeof err)) fail_msg("%s", err);
  assert_true(L.xmin < 0 && 0 < L.xmax && is_nice(L.xstep));
}

/* An error bar spans y_lo..y_hi in the series colour and widens the y range to fit; a point
 * without one draws nothing there. */
static void test_error_bars(void **state) {
  (void)state;
  enum { W = 480, H = 320 };
  static uint8_t rgb[W * H * 3];
  char err[VSPEC_ERRLEN];
  vs_plot_layout L;
  vs_plot_point pts[] = {{1.0, 2.0, "", 0, 1, 1.0, 6.0}, {3.0, 2.0, "", 0, 0, 0, 0}};
  vs_plot p = {.points = pts, .n_points = 2};
  if (vs_plot_render(&p, W, H, rgb, &L, err, sizeof err)) fail_msg("%s", err);
  assert_true(L.ymin <= 1.0 && 6.0 <= L.ymax);
  uint8_t col[3];
  vs_plot_series_color(0, col);
  int x, y;
  vs_plot_to_pixel(&L, 1.0, 4.5, &x, &y); /* on the bar, away from the marker */
  assert_memory_equal(px_at(rgb, W, x, y), col, 3);
  vs_plot_to_pixel(&L, 3.0, 4.5, &x, &y); /* the same height above the barless point */
  assert_true(memcmp(px_at(rgb, W, x, y), col, 3) != 0);
}

static void test_errors(void **state) {
  (void)state;
  enum { W = 320, H = 240 };
  static uint8_t rgb[W * H * 3];
  char err[VSPEC_ERRLEN];
  vs_plot empty = {.title = "nothing"};
  assert_int_equal(vs_plot_render(&empty, W, H, rgb, NULL, err, sizeof err), VSPEC_EINVAL);
  assert_non_null(strstr(err, "no points"));

  vs_plot_point nan = {NAN, 1, "x", 0, 0, 0, 0};
  vs_plot p = {.points = &nan, .n_points = 1};
  assert_int_equal(vs_plot_render(&p, W, H, rgb, NULL, err, sizeof err), VSPEC_EINVAL);
  assert_non_null(strstr(err, "finite"));

  vs_plot good = base_plot();
  good.n_series = 2; /* point 2 is in series 2 */
  assert_int_equal(vs_plot_render(&good, W, H, rgb, NULL, err, sizeof err), VSPEC_EINVAL);
  assert_non_null(strstr(err, "series 2"));

  good = base_plot();
  assert_int_equal(vs_plot_render(&good, 50, 50, rgb, NULL, err, sizeof err), VSPEC_EINVAL);
  assert_non_null(strstr(err, "50x50"));
  assert_int_equal(vs_plot_render(NULL, W, H, rgb, NULL, err, sizeof err), VSPEC_EINVAL);

  int rc = vs_plot_write_png(&good, W, H, "/nonexistent-dir/plot.png", err, sizeof err);
  assert_int_not_equal(rc, 0);
  assert_non_null(strstr(err, "/nonexistent-dir/plot.png"));
}

/* Same plot, same bytes: the PNG has no timestamp and the layout no randomness. */
static void test_deterministic(void **state) {
  (void)state;
  char a[512], b[512], err[VSPEC_ERRLEN];
  temp_path(a, sizeof a);
  temp_path(b, sizeof b);
  vs_plot p = base_plot();
  p.connect_series = p.mark_pareto = 1;
  assert_int_equal(vs_plot_write_png(&p, 500, 400, a, err, sizeof err), 0);
  assert_int_equal(vs_plot_write_png(&p, 500, 400, b, err, sizeof err), 0);
  FILE *fa = fopen(a, "rb"), *fb = fopen(b, "rb");
  assert_non_null(fa);
  assert_non_null(fb);
  int ca, cb;
  long n = 0;
  do {
    ca = fgetc(fa);
    cb = fgetc(fb);
    assert_int_equal(ca, cb);
    n++;
  } while (ca != EOF);
  assert_true(n > 100);
  fclose(fa);
  fclose(fb);
  unlink(a);
  unlink(b);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_nice_step_values),
      cmocka_unit_test(test_nice_step_properties),
      cmocka_unit_test(test_font_table_well_formed),
      cmocka_unit_test(test_font_glyphs_distinct),
      cmocka_unit_test(test_draw_text),
      cmocka_unit_test(test_pareto),
      cmocka_unit_test(test_series_colors),
      cmocka_unit_test(test_png_pixels),
      cmocka_unit_test(test_labels_inside_area),
      cmocka_unit_test(test_legend_avoids_points),
      cmocka_unit_test(test_nonfinite_skipped),
      cmocka_unit_test(test_degenerate_ranges),
      cmocka_unit_test(test_errors),
      cmocka_unit_test(test_error_bars),
      cmocka_unit_test(test_deterministic),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}

/*
 * bench/plot.c - scatter plot rasteriser: layout, ticks, markers, labels, legend.
 *
 * Everything is integer pixels at an integer scale (no anti-aliasing): the plots are read
 * by people comparing a handful of methods, and crisp pixel text at scale 1-2 reads well.
 */
#include "bench/plot.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/bitmap_font.h"
#include "core/png_write.h"
#include "vspec/types.h"

typedef struct plot_rect {
  int x0, y0, x1, y1; /* inclusive */
} plot_rect;

static const uint8_t VS__WHITE[3] = {255, 255, 255};
static const uint8_t VS__INK[3] = {25, 25, 25};        /* title, axis titles, frame */
static const uint8_t VS__TICK_INK[3] = {70, 70, 70};   /* tick labels */
static const uint8_t VS__LABEL_INK[3] = {45, 45, 45};  /* point labels */
static const uint8_t VS__GRID[3] = {228, 228, 228};    /* light enough to read through */
static const uint8_t VS__LEGEND_EDGE[3] = {170, 170, 170};
static const uint8_t VS__PARETO[3] = {110, 110, 110};

/* ---- small geometry ------------------------------------------------------------------ */

static int plot_rect_overlap(plot_rect a, plot_rect b) {
  return a.x0 <= b.x1 && b.x0 <= a.x1 && a.y0 <= b.y1 && b.y0 <= a.y1;
}

static plot_rect plot_rect_grow(plot_rect r, int d) {
  return (plot_rect){r.x0 - d, r.y0 - d, r.x1 + d, r.y1 + d};
}

/* Whether the segment passes through the rectangle; sampled at about one pixel, which is
 * exact enough for placing labels and costs nothing at plot sizes. */
static int plot_segment_hits(int ax, int ay, int bx, int by, plot_rect r) {
  int n = abs(bx - ax) > abs(by - ay) ? abs(bx - ax) : abs(by - ay);
  for (int i = 0; i <= n; i++) {
    double t = n ? (double)i / n : 0.0;
    int x = (int)lround(ax + t * (bx - ax)), y = (int)lround(ay + t * (by - ay));
    if (x >= r.x0 && x <= r.x1 && y >= r.y0 && y <= r.y1) return 1;
  }
  return 0;
}

/* ---- drawing primitives -------------------------------------------------------------- */

static void plot_rect_outline(const vs_canvas *c, plot_rect r, int t, const uint8_t col[3]) {
  vs_canvas_fill(c, r.x0, r.y0, r.x1, r.y0 + t - 1, col);
  vs_canvas_fill(c, r.x0, r.y1 - t + 1, r.x1, r.y1, col);
  vs_canvas_fill(c, r.x0, r.y0, r.x0 + t - 1, r.y1, col);
  vs_canvas_fill(c, r.x1 - t + 1, r.y0, r.x1, r.y1, col);
}

/* A line `width` pixels wide; dash > 0 draws dash pixels on, dash off. */
static void plot_line(const vs_canvas *c, int ax, int ay, int bx, int by, int width, int dash,
                     const uint8_t col[3]) {
  int dx = abs(bx - ax), dy = -abs(by - ay);
  int sx = ax < bx ? 1 : -1, sy = ay < by ? 1 : -1;
  int e = dx + dy, lo = -(width - 1) / 2, hi = width / 2;
  for (int step = 0;; step++) {
    if (dash <= 0 || (step / dash) % 2 == 0)
      vs_canvas_fill(c, ax + lo, ay + lo, ax + hi, ay + hi, col);
    if (ax == bx && ay == by) break;
    int e2 = 2 * e;
    if (e2 >= dy) {
      e += dy;
      ax += sx;
    }
    if (e2 <= dx) {
      e += dx;
      ay += sy;
    }
  }
}

static void plot_disc(const vs_canvas *c, int cx, int cy, int r, const uint8_t col[3]) {
  for (int y = -r; y <= r; y++)
    for (int x = -r; x <= r; x++)
      if (x * x + y * y <= r * r + r) vs_canvas_put(c, cx + x, cy + y, col);
}

static void plot_ring(const vs_canvas *c, int cx, int cy, int r, int t, const uint8_t col[3]) {
  int ro = r * r + r, ri = (r - t) * (r - t) + (r - t);
  for (int y = -r; y <= r; y++)
    for (int x = -r; x <= r; x++) {
      int d = x * x + y * y;
      if (d <= ro && d > ri) vs_canvas_put(c, cx + x, cy + y, col);
    }
}

/* Marker shapes change with the series as well as colours, so series stay apart in grey
 * print and for readers who cannot tell two palette colours apart. grow enlarges the shape
 * (used to draw a white halo under it). */
static void plot_marker(const vs_canvas *c, int cx, int cy, int r, int series, int grow,
                       const uint8_t col[3]) {
  int shape = series % 4;
  if (shape == 0) {
    plot_disc(c, cx, cy, r + grow, col);
  } else if (shape == 1) {
    int h = r * 85 / 100 + grow; /* a square reads as larger than a disc of equal radius */
    vs_canvas_fill(c, cx - h, cy - h, cx + h, cy + h, col);
  } else if (shape == 2) { /* triangle pointing up, centred on the point */
    int R = r + 1 + grow;
    for (int y = -R; y <= R; y++) {
      int half = (y + R) * 3 / 5; /* base 1.2x the height: close to equilateral */
      vs_canvas_fill(c, cx - half, cy + y, cx + half, cy + y, col);
    }
  } else { /* diamond */
    int R = r + 1 + grow;
    for (int y = -R; y <= R; y++) {
      int half = R - abs(y);
      vs_canvas_fill(c, cx - half, cy + y, cx + half, cy + y, col);
    }
  }
}

/* Text with a one-pixel white outline, so a label stays readable where it crosses a grid
 * or series line. */
static void plot_text_halo(const vs_canvas *c, int x, int y, const char *s, const uint8_t col[3],
                          int scale) {
  for (int dy = -1; dy <= 1; dy++)
    for (int dx = -1; dx <= 1; dx++)
      if (dx || dy) vs_draw_text(c, x + dx, y + dy, s, VS__WHITE, scale);
  vs_draw_text(c, x, y, s, col, scale);
}

/* ---- public helpers ------------------------------------------------------------------ */

double vs_plot_nice_step(double span, int max_ticks) {
  if (!isfinite(span) || span <= 0 || max_ticks < 2) return 0;
  /* k multiples of `step` fit in span when (k - 1) * step <= span; so need step >= raw. */
  double raw = span / (max_ticks - 1);
  double mag = pow(10.0, floor(log10(raw)));
  static const double mult[] = {1, 2, 5, 10};
  for (int i = 0; i < 4; i++)
    if (mult[i] * mag >= raw * (1 - 1e-12)) return mult[i] * mag;
  return 10 * mag;
}

void vs_plot_series_color(int series, uint8_t rgb[3]) {
  /* Okabe & Ito (2008), ordered for contrast on white. */
  static const uint8_t pal[7][3] = {{0, 114, 178},   {213, 94, 0},   {0, 158, 115},
                                    {204, 121, 167}, {230, 159, 0},  {86, 180, 233},
                                    {0, 0, 0}};
  int i = series < 0 ? 0 : series % 7;
  memcpy(rgb, pal[i], 3);
}

void vs_plot_to_pixel(const vs_plot_layout *l, double x, double y, int *px, int *py) {
  *px = l->x0 + (int)lround((x - l->xmin) / (l->xmax - l->xmin) * (l->x1 - l->x0));
  *py = l->y1 - (int)lround((y - l->ymin) / (l->ymax - l->ymin) * (l->y1 - l->y0));
}

static int plot_finite(const vs_plot_point *p) { return isfinite(p->x) && isfinite(p->y); }

int vs_plot_pareto(const vs_plot_point *points, int n, int *on_front) {
  int count = 0;
  for (int i = 0; i < n; i++) {
    on_front[i] = plot_finite(&points[i]);
    for (int j = 0; j < n && on_front[i]; j++) {
      if (j == i || !plot_finite(&points[j])) continue;
      const vs_plot_point *a = &points[i], *b = &points[j];
      if (b->x >= a->x && b->y <= a->y && (b->x > a->x || b->y < a->y)) on_front[i] = 0;
    }
    count += on_front[i];
  }
  return count;
}

/* ---- ticks --------------------------------------------------------------------------- */

#define VS__MAX_TICKS 12

typedef struct plot_ticks {
  int n;
  double v[VS__MAX_TICKS];
  char s[VS__MAX_TICKS][32];
  int widest;
} plot_ticks;

static void plot_format_tick(double v, double step, char *buf, size_t len) {
  if (fabs(v) < step * 1e-9) v = 0; /* no "-0.0" from rounding */
  int dec = (int)-floor(log10(step) + 1e-9);
  if (dec < 0) dec = 0;
  if (dec > 6 || fabs(v) >= 1e7)
    snprintf(buf, len, "%.3g", v);
  else
    snprintf(buf, len, "%.*f", dec, v);
}

static void plot_make_ticks(double lo, double hi, double step, int scale, plot_ticks *t) {
  t->n = 0;
  t->widest = 0;
  double first = ceil(lo / step - 1e-9);
  for (int k = 0; t->n < VS__MAX_TICKS; k++) {
    double v = (first + k) * step; /* multiply, not accumulate: no drift */
    if (v > hi + step * 1e-9) break;
    t->v[t->n] = v;
    plot_format_tick(v, step, t->s[t->n], sizeof t->s[0]);
    int w = vs_text_width(t->s[t->n], scale);
    if (w > t->widest) t->widest = w;
    t->n++;
  }
}

/* Pads the data range so markers and labels do not sit on the frame; a zero-width range
 * (one point, or all values equal) gets a width of its own. */
static void plot_pad_range(double lo, double hi, double *out_lo, double *out_hi) {
  double span = hi - lo;
  if (span <= 0) {
    double half = fabs(lo) > 0 ? fabs(lo) * 0.1 : 1.0;
    *out_lo = lo - half;
    *out_hi = hi + half;
    return;
  }
  *out_lo = lo - span * 0.08;
  *out_hi = hi + span * 0.08;
}

/* ---- layout -------------------------------------------------------------------------- */

typedef struct plot_ctx {
  const vs_plot *p;
  int width, height, s, ts; /* ts: title scale */
  int th;                   /* text height at scale s */
  int mr;                   /* marker radius */
  vs_plot_layout L;
  plot_ticks xt, yt;
  int *px, *py, *front; /* per point; px = VS__SKIP for a point that is not drawn */
  int n_front;
  /* legend */
  int n_legend, legend_w, legend_h, row_h, sample_w;
} plot_ctx;

#define VS__SKIP (-1000000)

static const char *plot_str(const char *s) { return s && *s ? s : NULL; }

/* The plot area and ticks for a given right margin extra (the legend, when outside). */
static void plot_layout(plot_ctx *c, double dxlo, double dxhi, double dylo, double dyhi,
                        int legend_outside) {
  const vs_plot *p = c->p;
  int s = c->s, th = c->th, tick = 5 * s;
  int top = 10 * s + (plot_str(p->title) ? vs_text_height(c->ts) + 10 * s : 0);
  int bottom = tick + 4 * s + th + (plot_str(p->x_label) ? 8 * s + th : 0) + 10 * s;
  int y0 = top, y1 = c->height - 1 - bottom;
  /* y ticks first: they depend only on the area's height, and their labels set the left
   * margin. Aim for a tick every ~2.5 text heights at most. */
  int max_y = (y1 - y0) / (th * 5 / 2);
  if (max_y > 10) max_y = 10;
  if (max_y < 2) max_y = 2;
  c->L.ystep = vs_plot_nice_step(dyhi - dylo, max_y);
  plot_make_ticks(dylo, dyhi, c->L.ystep, s, &c->yt);
  int left = 8 * s + (plot_str(p->y_label) ? th + 10 * s : 0) + c->yt.widest + 4 * s + tick;
  int right = 16 * s + (legend_outside ? c->legend_w + 12 * s : 0);
  /* x ticks: as many as fit with a gap of two characters between labels; the last label
   * may hang half its width past the area, so the right margin grows to hold it. */
  for (int pass = 0; pass < 2; pass++) {
    int x0 = left, x1 = c->width - 1 - right;
    int max_x = 10;
    for (;; max_x--) {
      c->L.xstep = vs_plot_nice_step(dxhi - dxlo, max_x);
      plot_make_ticks(dxlo, dxhi, c->L.xstep, s, &c->xt);
      double px_per_step = c->L.xstep / (dxhi - dxlo) * (x1 - x0);
      if (max_x == 2 || px_per_step >= c->xt.widest + 12 * s) break;
    }
    int need = c->xt.widest / 2 + 4 * s + (legend_outside ? c->legend_w + 12 * s : 0);
    if (need <= right) break;
    right = need;
  }
  c->L.x0 = left;
  c->L.x1 = c->width - 1 - right;
  c->L.y0 = y0;
  c->L.y1 = y1;
  c->L.xmin = dxlo;
  c->L.xmax = dxhi;
  c->L.ymin = dylo;
  c->L.ymax = dyhi;
  c->L.scale = s;
  c->L.legend_outside = legend_outside;
  for (int i = 0; i < p->n_points; i++) {
    if (!plot_finite(&p->points[i])) {
      c->px[i] = c->py[i] = VS__SKIP;
      continue;
    }
    vs_plot_to_pixel(&c->L, p->points[i].x, p->points[i].y, &c->px[i], &c->py[i]);
  }
}

/* How far ink reaches from a point's centre: the marker and its halo, or the Pareto ring. */
static int plot_point_reach(const plot_ctx *c, int i) {
  return c->front[i] ? c->mr + 3 * c->s : c->mr + c->s;
}

static plot_rect plot_marker_rect(const plot_ctx *c, int i) {
  int r = plot_point_reach(c, i) + c->s;
  return (plot_rect){c->px[i] - r, c->py[i] - r, c->px[i] + r, c->py[i] + r};
}

/* Calls fn on every line segment the plot draws (series lines, then the Pareto front). */
typedef int (*plot_seg_fn)(void *ud, int ax, int ay, int bx, int by);

static int plot_front_order_cmp_x(const vs_plot_point *pts, int a, int b) {
  if (pts[a].x != pts[b].x) return pts[a].x < pts[b].x ? -1 : 1;
  return pts[a].y < pts[b].y ? -1 : pts[a].y > pts[b].y;
}

static int plot_for_segments(const plot_ctx *c, plot_seg_fn fn, void *ud) {
  const vs_plot *p = c->p;
  int total = 0;
  if (p->connect_series) {
    int n_series = p->n_series > 0 ? p->n_series : 1;
    for (int sr = 0; sr < n_series; sr++) {
      int prev = -1;
      for (int i = 0; i < p->n_points; i++) {
        if (p->points[i].series != sr || c->px[i] == VS__SKIP) continue;
        if (prev >= 0) total += fn(ud, c->px[prev], c->py[prev], c->px[i], c->py[i]);
        prev = i;
      }
    }
  }
  if (p->mark_pareto) {
    /* The front joined from left to right: with x ascending its y ascends as well. */
    int prev = -1;
    for (;;) {
      int next = -1;
      for (int i = 0; i < p->n_points; i++) {
        if (!c->front[i]) continue;
        if (prev >= 0 && plot_front_order_cmp_x(p->points, i, prev) <= 0) continue;
        if (next < 0 || plot_front_order_cmp_x(p->points, i, next) < 0) next = i;
      }
      if (next < 0) break;
      if (prev >= 0) total += fn(ud, c->px[prev], c->py[prev], c->px[next], c->py[next]);
      prev = next;
    }
  }
  return total;
}

typedef struct plot_hit_ud {
  plot_rect r;
} plot_hit_ud;

static int plot_seg_hit(void *ud, int ax, int ay, int bx, int by) {
  return plot_segment_hits(ax, ay, bx, by, ((plot_hit_ud *)ud)->r);
}

/* ---- legend -------------------------------------------------------------------------- */

static void plot_legend_measure(plot_ctx *c) {
  const vs_plot *p = c->p;
  int s = c->s, widest = 0;
  c->n_legend = 0;
  if (p->series_names)
    for (int i = 0; i < p->n_series; i++) {
      const char *name = p->series_names[i] ? p->series_names[i] : "";
      int w = vs_text_width(name, s);
      if (w > widest) widest = w;
      c->n_legend++;
    }
  if (p->mark_pareto && c->n_front > 0) {
    int w = vs_text_width("Pareto front", s);
    if (w > widest) widest = w;
    c->n_legend++;
  }
  c->row_h = (c->th > 2 * c->mr + 2 * s ? c->th : 2 * c->mr + 2 * s) + 5 * s;
  c->sample_w = p->connect_series || p->mark_pareto ? 24 * s : 2 * c->mr + 4 * s;
  c->legend_w = 8 * s + c->sample_w + 6 * s + widest + 8 * s;
  c->legend_h = 6 * s + c->n_legend * c->row_h + 2 * s;
}

/* The least cluttered inside corner; returns its cost (>= 1000 when it covers a marker). */
static int plot_legend_place_inside(plot_ctx *c, plot_rect *best) {
  int inset = 6 * c->s, best_cost = -1;
  const vs_plot_layout *L = &c->L;
  /* Upper corners first: in the Pareto view the bad corner (slow and poor, upper left) and
   * the unreachable one (fast and good, lower right) are usually empty; ties keep order. */
  int xs[4] = {L->x1 - inset - c->legend_w + 1, L->x0 + inset, L->x1 - inset - c->legend_w + 1,
               L->x0 + inset};
  int ys[4] = {L->y0 + inset, L->y0 + inset, L->y1 - inset - c->legend_h + 1,
               L->y1 - inset - c->legend_h + 1};
  for (int k = 0; k < 4; k++) {
    plot_rect r = {xs[k], ys[k], xs[k] + c->legend_w - 1, ys[k] + c->legend_h - 1};
    if (r.x0 < L->x0 || r.y0 < L->y0 || r.x1 > L->x1 || r.y1 > L->y1) continue; /* too big */
    int cost = 0;
    for (int i = 0; i < c->p->n_points; i++)
      if (c->px[i] != VS__SKIP && plot_rect_overlap(r, plot_marker_rect(c, i))) cost += 1000;
    plot_hit_ud ud = {r};
    cost += 10 * plot_for_segments(c, plot_seg_hit, &ud);
    if (best_cost < 0 || cost < best_cost) {
      best_cost = cost;
      *best = r;
    }
  }
  return best_cost < 0 ? 1000000 : best_cost;
}

static void plot_legend_draw(const plot_ctx *c, const vs_canvas *cv, plot_rect r) {
  const vs_plot *p = c->p;
  int s = c->s;
  vs_canvas_fill(cv, r.x0, r.y0, r.x1, r.y1, VS__WHITE);
  plot_rect_outline(cv, r, 1, VS__LEGEND_EDGE);
  int y = r.y0 + 6 * s, sx0 = r.x0 + 8 * s, sx1 = sx0 + c->sample_w - 1;
  int scx = (sx0 + sx1) / 2, tx = sx1 + 1 + 6 * s;
  int rows = p->series_names ? p->n_series : 0;
  for (int i = 0; i < rows; i++, y += c->row_h) {
    uint8_t col[3];
    vs_plot_series_color(i, col);
    int cy = y + c->row_h / 2 - 2 * s;
    if (p->connect_series) plot_line(cv, sx0, cy, sx1, cy, 2 * s, 0, col);
    plot_marker(cv, scx, cy, c->mr, i, s, VS__WHITE);
    plot_marker(cv, scx, cy, c->mr, i, 0, col);
    const char *name = p->series_names[i] ? p->series_names[i] : "";
    vs_draw_text(cv, tx, cy - VS_FONT_CAP_H * s / 2, name, VS__INK, s);
  }
  if (p->mark_pareto && c->n_front > 0) {
    int cy = y + c->row_h / 2 - 2 * s;
    plot_line(cv, sx0, cy, sx1, cy, s, 4 * s, VS__PARETO);
    plot_ring(cv, scx, cy, c->mr + 3 * s, s, VS__INK);
    vs_draw_text(cv, tx, cy - VS_FONT_CAP_H * s / 2, "Pareto front", VS__INK, s);
  }
}

/* ---- point labels -------------------------------------------------------------------- */

/* Greedy placement: each label tries eight spots around its point and takes the first of
 * the cheapest, where leaving the plot area, covering a marker, another label or the legend
 * costs much and crossing a line costs a little. */
static void plot_place_labels(const plot_ctx *c, const vs_canvas *cv, const plot_rect *legend) {
  const vs_plot *p = c->p;
  const vs_plot_layout *L = &c->L;
  int s = c->s, th = VS_FONT_CAP_H * s, gap = 3 * s;
  plot_rect area = {L->x0 + 2, L->y0 + 2, L->x1 - 2, L->y1 - 2};
  plot_rect *placed = calloc((size_t)p->n_points + 1, sizeof *placed);
  int n_placed = 0;
  for (int i = 0; i < p->n_points; i++) {
    const char *label = plot_str(p->points[i].label);
    if (!label || c->px[i] == VS__SKIP) continue;
    int tw = vs_text_width(label, s), cx = c->px[i], cy = c->py[i], r = plot_point_reach(c, i);
    /* Label boxes cover the capital height only: descenders may overhang a little. */
    int cand[8][2] = {{cx + r + gap, cy - th / 2},      {cx - r - gap - tw, cy - th / 2},
                      {cx - tw / 2, cy - r - gap - th}, {cx - tw / 2, cy + r + gap},
                      {cx + r, cy - r - th},            {cx + r, cy + r},
                      {cx - r - tw, cy - r - th},       {cx - r - tw, cy + r}};
    int best = -1, best_cost = 0;
    plot_rect best_r = {0, 0, 0, 0};
    for (int k = 0; k < 8; k++) {
      plot_rect b = {cand[k][0], cand[k][1], cand[k][0] + tw - 1, cand[k][1] + th - 1};
      int cost = 0;
      /* Pull a box that sticks out back inside; what it then covers is paid for below. */
      if (b.x1 > area.x1) b = (plot_rect){area.x1 - tw + 1, b.y0, area.x1, b.y1};
      if (b.x0 < area.x0) b = (plot_rect){area.x0, b.y0, area.x0 + tw - 1, b.y1};
      if (b.y1 > area.y1) b = (plot_rect){b.x0, area.y1 - th + 1, b.x1, area.y1};
      if (b.y0 < area.y0) b = (plot_rect){b.x0, area.y0, b.x1, area.y0 + th - 1};
      if (b.x0 < area.x0 || b.x1 > area.x1) cost += 5000; /* wider than the whole area */
      plot_rect g = plot_rect_grow(b, s);
      for (int j = 0; j < p->n_points; j++)
        if (c->px[j] != VS__SKIP && plot_rect_overlap(g, plot_marker_rect(c, j))) cost += 1000;
      for (int j = 0; j < n_placed; j++)
        if (plot_rect_overlap(g, placed[j])) cost += 1000;
      if (legend && plot_rect_overlap(g, *legend)) cost += 1000;
      plot_hit_ud ud = {b};
      cost += 20 * plot_for_segments(c, plot_seg_hit, &ud);
      if (best < 0 || cost < best_cost) {
        best = k;
        best_cost = cost;
        best_r = b;
      }
    }
    plot_text_halo(cv, best_r.x0, best_r.y0, label, VS__LABEL_INK, s);
    /* Grown by most of a character so neighbouring labels never read as one. */
    if (placed) placed[n_placed++] = plot_rect_grow(best_r, 4 * s);
  }
  free(placed);
}

/* ---- rendering ----------------------------------------------------------------------- */

/* Copies text into buf, cut and ended with "..." when it is wider than max_w at scale; a
 * title that runs off the canvas would lose its end silently. Returns the width. */
static int plot_fit_text(const char *text, int scale, int max_w, char *buf, size_t len) {
  snprintf(buf, len, "%s", text);
  size_t n = strlen(buf);
  if (vs_text_width(buf, scale) <= max_w) return vs_text_width(buf, scale);
  while (n > 0) {
    n--;
    if (n + 3 >= len) continue;
    memcpy(buf + n, "...", 4);
    if (vs_text_width(buf, scale) <= max_w) break;
  }
  if (n == 0) buf[0] = 0;
  return vs_text_width(buf, scale);
}

typedef struct plot_line_ud {
  const vs_canvas *cv;
  int width, dash;
  const uint8_t *col;
} plot_line_ud;

static int plot_seg_draw(void *ud, int ax, int ay, int bx, int by) {
  plot_line_ud *u = ud;
  plot_line(u->cv, ax, ay, bx, by, u->width, u->dash, u->col);
  return 0;
}

static int plot_validate(const vs_plot *p, int width, int height, char *err, size_t errlen) {
  if (!p) {
    snprintf(err, errlen, "plot: no plot given");
    return VSPEC_EINVAL;
  }
  if (width < VS_PLOT_MIN_W || height < VS_PLOT_MIN_H || width > VS_PLOT_MAX_SIDE ||
      height > VS_PLOT_MAX_SIDE) {
    snprintf(err, errlen, "plot: size %dx%d outside %dx%d .. %dx%d", width, height,
             VS_PLOT_MIN_W, VS_PLOT_MIN_H, VS_PLOT_MAX_SIDE, VS_PLOT_MAX_SIDE);
    return VSPEC_EINVAL;
  }
  if (p->n_points < 0 || p->n_series < 0 || (p->n_points > 0 && !p->points)) {
    snprintf(err, errlen, "plot: bad point or series count (%d points, %d series)", p->n_points,
             p->n_series);
    return VSPEC_EINVAL;
  }
  int n_finite = 0, n_series = p->n_series > 0 ? p->n_series : 1;
  for (int i = 0; i < p->n_points; i++) {
    if (p->points[i].series < 0 || p->points[i].series >= n_series) {
      snprintf(err, errlen, "plot: point %d (%s) has series %d, the plot has %d", i,
               p->points[i].label ? p->points[i].label : "unlabelled", p->points[i].series,
               n_series);
      return VSPEC_EINVAL;
    }
    n_finite += plot_finite(&p->points[i]);
  }
  if (p->n_points == 0) {
    snprintf(err, errlen, "plot: nothing to draw: the plot has no points");
    return VSPEC_EINVAL;
  }
  if (n_finite == 0) {
    snprintf(err, errlen, "plot: nothing to draw: none of the %d points has finite x and y",
             p->n_points);
    return VSPEC_EINVAL;
  }
  return VSPEC_OK;
}

/* The data's extent, error bars included, padded (the drawn points are counted in c->L). */
static void plot_data_range(plot_ctx *c, double *dxlo, double *dxhi, double *dylo,
                            double *dyhi) {
  const vs_plot *p = c->p;
  double xlo = INFINITY, xhi = -INFINITY, ylo = INFINITY, yhi = -INFINITY;
  for (int i = 0; i < p->n_points; i++) {
    if (!plot_finite(&p->points[i])) continue;
    c->L.n_drawn++;
    xlo = fmin(xlo, p->points[i].x);
    xhi = fmax(xhi, p->points[i].x);
    ylo = fmin(ylo, p->points[i].y);
    yhi = fmax(yhi, p->points[i].y);
    if (p->points[i].has_bar && isfinite(p->points[i].y_lo) && isfinite(p->points[i].y_hi)) {
      ylo = fmin(ylo, p->points[i].y_lo); /* the bars fit in the frame too */
      yhi = fmax(yhi, p->points[i].y_hi);
    }
  }
  plot_pad_range(xlo, xhi, dxlo, dxhi);
  plot_pad_range(ylo, yhi, dylo, dyhi);
}

/* The plot area and the legend's place: inside, in the corner that hides the fewest
 * points, or in a column of its own. Returns whether there is a legend. */
static int plot_legend_layout(plot_ctx *c, double dxlo, double dxhi, double dylo, double dyhi,
                              plot_rect *legend_out) {
  int width = c->width;
  plot_legend_measure(c);
  plot_rect legend = {-1, -1, -1, -1};
  int has_legend = c->n_legend > 0;
  plot_layout(c, dxlo, dxhi, dylo, dyhi, 0);
  if (has_legend && plot_legend_place_inside(c, &legend) >= 1000) {
    /* Every inside corner would hide a point: give the legend its own column, unless that
     * squeezes the data into less than half the picture (small images, long names); then
     * the least bad inside corner it is. */
    plot_layout(c, dxlo, dxhi, dylo, dyhi, 1);
    if (c->L.x1 - c->L.x0 >= width / 2) {
      legend = (plot_rect){c->L.x1 + 12 * c->s, c->L.y0, c->L.x1 + 12 * c->s + c->legend_w - 1,
                           c->L.y0 + c->legend_h - 1};
    } else {
      plot_layout(c, dxlo, dxhi, dylo, dyhi, 0);
      if (plot_legend_place_inside(c, &legend) >= 1000000)
        legend = (plot_rect){c->L.x0 + 2, c->L.y0 + 2, c->L.x0 + 1 + c->legend_w,
                             c->L.y0 + 1 + c->legend_h}; /* bigger than the area: top left */
    }
  }
  if (has_legend) {
    c->L.legend_x0 = legend.x0;
    c->L.legend_y0 = legend.y0;
    c->L.legend_x1 = legend.x1;
    c->L.legend_y1 = legend.y1;
  } else {
    c->L.legend_x0 = c->L.legend_y0 = c->L.legend_x1 = c->L.legend_y1 = -1;
  }
  *legend_out = legend;
  return has_legend;
}

/* Grid, Pareto front, series lines, error bars, markers and rings. */
static void plot_draw_data(const plot_ctx *cc, vs_canvas *cvp) {
  plot_ctx c = *cc;
  const vs_plot *p = c.p;
  vs_canvas cv = *cvp;
  const vs_plot_layout *L = &c.L;
  int s = c.s;
  /* Grid under everything, then lines, markers, rings, labels, legend, frame and text. */
  int ipx, ipy;
  for (int k = 0; k < c.xt.n; k++) {
    vs_plot_to_pixel(L, c.xt.v[k], L->ymin, &ipx, &ipy);
    vs_canvas_fill(&cv, ipx, L->y0, ipx, L->y1, VS__GRID);
  }
  for (int k = 0; k < c.yt.n; k++) {
    vs_plot_to_pixel(L, L->xmin, c.yt.v[k], &ipx, &ipy);
    vs_canvas_fill(&cv, L->x0, ipy, L->x1, ipy, VS__GRID);
  }
  if (p->mark_pareto) {
    /* Only the front here (a copy with connect_series off): series lines are drawn in
     * their own colours below. */
    plot_line_ud u = {&cv, s, 5 * s, VS__PARETO};
    vs_plot only_front = *p;
    only_front.connect_series = 0;
    plot_ctx cf = c;
    cf.p = &only_front;
    plot_for_segments(&cf, plot_seg_draw, &u);
  }
  if (p->connect_series) {
    int n_series = p->n_series > 0 ? p->n_series : 1;
    for (int sr = 0; sr < n_series; sr++) {
      uint8_t col[3];
      vs_plot_series_color(sr, col);
      int prev = -1;
      for (int i = 0; i < p->n_points; i++) {
        if (p->points[i].series != sr || c.px[i] == VS__SKIP) continue;
        if (prev >= 0) plot_line(&cv, c.px[prev], c.py[prev], c.px[i], c.py[i], 2 * s, 0, col);
        prev = i;
      }
    }
  }
  /* error bars under the markers: a vertical line with short caps, in the series colour */
  for (int i = 0; i < p->n_points; i++) {
    const vs_plot_point *pt = &p->points[i];
    if (c.px[i] == VS__SKIP || !pt->has_bar || !isfinite(pt->y_lo) || !isfinite(pt->y_hi))
      continue;
    uint8_t col[3];
    vs_plot_series_color(pt->series, col);
    int bx, blo, bhi;
    vs_plot_to_pixel(&c.L, pt->x, pt->y_lo, &bx, &blo);
    vs_plot_to_pixel(&c.L, pt->x, pt->y_hi, &bx, &bhi);
    plot_line(&cv, bx, blo, bx, bhi, s, 0, col);
    plot_line(&cv, bx - 3 * s, blo, bx + 3 * s, blo, s, 0, col);
    plot_line(&cv, bx - 3 * s, bhi, bx + 3 * s, bhi, s, 0, col);
  }
  for (int i = 0; i < p->n_points; i++) {
    if (c.px[i] == VS__SKIP) continue;
    uint8_t col[3];
    vs_plot_series_color(p->points[i].series, col);
    plot_marker(&cv, c.px[i], c.py[i], c.mr, p->points[i].series, s, VS__WHITE);
    plot_marker(&cv, c.px[i], c.py[i], c.mr, p->points[i].series, 0, col);
  }
  for (int i = 0; i < p->n_points; i++)
    if (c.front[i]) plot_ring(&cv, c.px[i], c.py[i], c.mr + 3 * s, s, VS__INK);
}

/* The frame, the ticks and their values. */
static void plot_draw_axes(const plot_ctx *c, vs_canvas *cv) {
  const vs_plot_layout *L = &c->L;
  int s = c->s, tick = 5 * s, ipx, ipy;
  plot_rect frame = {L->x0, L->y0, L->x1, L->y1};
  plot_rect_outline(cv, plot_rect_grow(frame, 1), 1, VS__INK);
  for (int k = 0; k < c->xt.n; k++) {
    vs_plot_to_pixel(L, c->xt.v[k], L->ymin, &ipx, &ipy);
    vs_canvas_fill(cv, ipx, L->y1 + 2, ipx, L->y1 + 1 + tick, VS__INK);
    int w = vs_text_width(c->xt.s[k], s);
    vs_draw_text(cv, ipx - w / 2, L->y1 + 2 + tick + 4 * s, c->xt.s[k], VS__TICK_INK, s);
  }
  for (int k = 0; k < c->yt.n; k++) {
    vs_plot_to_pixel(L, L->xmin, c->yt.v[k], &ipx, &ipy);
    vs_canvas_fill(cv, L->x0 - 1 - tick, ipy, L->x0 - 2, ipy, VS__INK);
    int w = vs_text_width(c->yt.s[k], s);
    vs_draw_text(cv, L->x0 - 2 - tick - 4 * s - w, ipy - VS_FONT_CAP_H * s / 2, c->yt.s[k],
                 VS__TICK_INK, s);
  }
}

/* Title, x label and y label, shortened to fit. */
static void plot_draw_titles(const plot_ctx *c, vs_canvas *cv) {
  const vs_plot *p = c->p;
  const vs_plot_layout *L = &c->L;
  int s = c->s, tick = 5 * s, width = c->width;
  if (plot_str(p->title)) {
    /* A title too wide for its large scale drops to the label scale, then is shortened. */
    char buf[256];
    int ts = vs_text_width(p->title, c->ts) <= width - 8 * s ? c->ts : s;
    int w = plot_fit_text(p->title, ts, width - 8 * s, buf, sizeof buf);
    int x = (L->x0 + L->x1) / 2 - w / 2;
    if (x + w > width - 4 * s) x = width - 4 * s - w; /* keep it on the canvas */
    if (x < 4 * s) x = 4 * s;
    vs_draw_text(cv, x, 10 * s + (vs_text_height(c->ts) - vs_text_height(ts)) / 2, buf, VS__INK,
                 ts);
  }
  if (plot_str(p->x_label)) {
    char buf[256];
    int w = plot_fit_text(p->x_label, s, width - 8 * s, buf, sizeof buf);
    int x = (L->x0 + L->x1) / 2 - w / 2;
    if (x + w > width - 4 * s) x = width - 4 * s - w;
    if (x < 4 * s) x = 4 * s;
    vs_draw_text(cv, x, L->y1 + 2 + tick + 4 * s + c->th + 8 * s, buf, VS__INK, s);
  }
  if (plot_str(p->y_label)) {
    char buf[256];
    int w = plot_fit_text(p->y_label, s, L->y1 - L->y0 + 1, buf, sizeof buf);
    vs_draw_text_up(cv, 8 * s, (L->y0 + L->y1) / 2 + w / 2, buf, VS__INK, s);
  }
}

int vs_plot_render(const vs_plot *p, int width, int height, uint8_t *rgb, vs_plot_layout *layout,
                   char *err, size_t errlen) {
  int rc = plot_validate(p, width, height, err, errlen);
  if (rc) return rc;
  plot_ctx c = {.p = p, .width = width, .height = height};
  /* One scale step per 640x480: text stays about the same share of the picture. */
  double fit = fmin(width / 640.0, height / 480.0);
  c.s = fit < 1.5 ? 1 : (int)lround(fit);
  c.ts = c.s + 1;
  c.th = vs_text_height(c.s);
  c.mr = 4 * c.s;
  size_t n = (size_t)p->n_points;
  c.px = malloc(n * sizeof *c.px);
  c.py = malloc(n * sizeof *c.py);
  c.front = calloc(n, sizeof *c.front);
  if (!c.px || !c.py || !c.front) {
    free(c.px);
    free(c.py);
    free(c.front);
    snprintf(err, errlen, "plot: out of memory");
    return VSPEC_ENOMEM;
  }
  if (p->mark_pareto) c.n_front = vs_plot_pareto(p->points, p->n_points, c.front);

  double dxlo, dxhi, dylo, dyhi;
  plot_data_range(&c, &dxlo, &dxhi, &dylo, &dyhi);
  plot_rect legend;
  int has_legend = plot_legend_layout(&c, dxlo, dxhi, dylo, dyhi, &legend);
  vs_canvas cv = {rgb, width, height};
  memset(rgb, 255, (size_t)width * height * 3);
  plot_draw_data(&c, &cv);
  plot_place_labels(&c, &cv, has_legend ? &legend : NULL);
  if (has_legend) plot_legend_draw(&c, &cv, legend);
  plot_draw_axes(&c, &cv);
  plot_draw_titles(&c, &cv);
  if (layout) *layout = c.L;
  free(c.px);
  free(c.py);
  free(c.front);
  return VSPEC_OK;
}

int vs_plot_write_png(const vs_plot *p, int width, int height, const char *path, char *err,
                      size_t errlen) {
  int rc = plot_validate(p, width, height, err, errlen);
  if (rc) return rc;
  uint8_t *rgb = malloc((size_t)width * height * 3);
  if (!rgb) {
    snprintf(err, errlen, "plot: out of memory for a %dx%d image", width, height);
    return VSPEC_ENOMEM;
  }
  rc = vs_plot_render(p, width, height, rgb, NULL, err, errlen);
  if (!rc) {
    vs_png_text text = {"Title", p->title ? p->title : ""};
    rc = vs_png_write_file(path, rgb, width, height, &text, plot_str(p->title) ? 1 : 0, err,
                           errlen);
  }
  free(rgb);
  return rc;
}

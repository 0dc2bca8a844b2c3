/*
 * bench/plot.h - a minimal raster scatter plot written as PNG, for vspec-bench's reports.
 *
 * Made for the Pareto view of speculative-decoding papers: image quality (FID, lower is
 * better) against speed (TPF, tokens per target forward, higher is better), one labelled
 * point per decoding method. There is no plotting library in the build, so this draws into
 * an RGB buffer with the embedded font (bench/bitmap_font.h) and writes it with
 * vs_png_write_file. Output depends only on the input: the same plot gives the same bytes.
 */
#ifndef VS_PLOT_H
#define VS_PLOT_H

#include <stddef.h>
#include <stdint.h>

typedef struct vs_plot_point {
  double x, y;       /* points whose x or y is NaN or infinite are skipped */
  const char *label; /* drawn next to the point; NULL or "" for none */
  int series;        /* 0 .. n_series-1 (0 when the plot has no series names) */
  int has_bar;       /* nonzero: draw a vertical error bar from y_lo to y_hi (an interval) */
  double y_lo, y_hi;
} vs_plot_point;

typedef struct vs_plot {
  const char *title, *x_label, *y_label; /* each may be NULL */
  const char *const *series_names;       /* n_series legend names, or NULL: no legend rows */
  int n_series;
  const vs_plot_point *points;
  int n_points;
  int connect_series; /* join each series' points with a line, in the order given (e.g. as
                         a rule's relaxation grows) */
  int mark_pareto;    /* ring the points no other point beats (lower y and higher x is
                         better) and join them with a dashed line */
} vs_plot;

/* Where things landed; vs_plot_render fills it so callers (and the tests) can find a
 * point's pixel without re-deriving the layout. */
typedef struct vs_plot_layout {
  int scale;                     /* font scale of tick labels and point labels */
  int x0, y0, x1, y1;            /* plot area, inclusive pixel bounds, y0 at the top */
  double xmin, xmax, ymin, ymax; /* data values at the area's left/right/bottom/top edges */
  double xstep, ystep;           /* tick spacing, always 1, 2 or 5 times a power of ten */
  int legend_x0, legend_y0, legend_x1, legend_y1; /* legend box; all -1 without a legend */
  int legend_outside;                             /* 1: right of the plot area, not inside */
  int n_drawn;                                    /* points with finite x and y */
} vs_plot_layout;

#define VS_PLOT_MIN_W 200
#define VS_PLOT_MIN_H 150
#define VS_PLOT_MAX_SIDE 8192

/* Renders into rgb ([height, width, 3]) and, when layout is not NULL, reports the layout.
 * Fails with a message (VSPEC_EINVAL) on a missing or empty plot (no point with finite x and
 * y), a series index out of range, or a size outside VS_PLOT_MIN_W/H .. VS_PLOT_MAX_SIDE. */
int vs_plot_render(const vs_plot *p, int width, int height, uint8_t *rgb, vs_plot_layout *layout,
                   char *err, size_t errlen);
/* vs_plot_render into a temporary buffer, then vs_png_write_file (atomic replace). The PNG
 * carries the title in a "Title" text chunk. */
int vs_plot_write_png(const vs_plot *p, int width, int height, const char *path, char *err,
                      size_t errlen);

/* The smallest step of the form {1, 2, 5} x 10^k such that an interval of length `span`
 * holds at most `max_ticks` multiples of it; 0 when span is not finite and positive or
 * max_ticks < 2. */
double vs_plot_nice_step(double span, int max_ticks);
/* The pixel of data point (x, y) in a rendered layout. */
void vs_plot_to_pixel(const vs_plot_layout *l, double x, double y, int *px, int *py);
/* Fill colour of a series: the Okabe-Ito colour-blind-safe palette (yellow left out: too
 * light on white), repeating after 7; marker shapes also change with the series. */
void vs_plot_series_color(int series, uint8_t rgb[3]);
/* on_front[i] = 1 when point i is finite and no other finite point has x >= and y <= with
 * one of them strict; returns how many are on the front. */
int vs_plot_pareto(const vs_plot_point *points, int n, int *on_front);

#endif /* VS_PLOT_H */

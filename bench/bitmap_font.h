/*
 * bench/bitmap_font.h - a tiny embedded bitmap font and RGB canvas for vspec-bench's plots.
 *
 * No font or plotting library is part of the build, so the benchmark draws its own text:
 * printable ASCII (32..126) as 5x9 glyphs (7 rows above the baseline, 2 for descenders)
 * in a 6x10 cell, enlarged by an integer scale. Anything outside 32..126 draws as '?'.
 */
#ifndef VS_BITMAP_FONT_H
#define VS_BITMAP_FONT_H

#include <stdint.h>

#define VS_FONT_GLYPH_W 5
#define VS_FONT_GLYPH_H 9
#define VS_FONT_CELL_W 6  /* glyph + one column of spacing */
#define VS_FONT_CELL_H 10 /* glyph + one row of spacing */
#define VS_FONT_CAP_H 7   /* rows above the baseline: capitals and digits */

/* An RGB image being drawn on: rgb is [height, width, 3], row-major, as vs_png_write_file
 * expects. Every drawing call clips to it, so callers can draw near the edges freely. */
typedef struct vs_canvas {
  uint8_t *rgb;
  int width, height;
} vs_canvas;

/* Sets one pixel; outside the canvas it does nothing. */
void vs_canvas_put(const vs_canvas *c, int x, int y, const uint8_t color[3]);
/* Fills the rectangle [x0, x1] x [y0, y1] (inclusive, any corner order). */
void vs_canvas_fill(const vs_canvas *c, int x0, int y0, int x1, int y1, const uint8_t color[3]);

/* Row `row` (0 = top, < VS_FONT_GLYPH_H) of the glyph for character ch as a bit mask:
 * bit 4 is the leftmost column. Characters outside 32..126 give the glyph of '?'. */
unsigned vs_font_glyph_row(unsigned char ch, int row);
/* 0 when the embedded glyph table is well formed (every row the right length, only '.'
 * and '#'), otherwise the number of the first bad table line plus one; for the tests. */
int vs_font_check(void);

/* Size in pixels of `text` drawn at `scale` (one line; no trailing spacing column). */
int vs_text_width(const char *text, int scale);
int vs_text_height(int scale);

/* Draws `text` with the top-left corner of its first cell at (x, y); returns the width
 * drawn. vs_draw_text_up draws it rotated a quarter turn counter-clockwise, reading bottom
 * to top (for a y-axis title), with (x, y) the bottom-left corner of the rotated box. */
int vs_draw_text(const vs_canvas *c, int x, int y, const char *text, const uint8_t color[3],
                 int scale);
int vs_draw_text_up(const vs_canvas *c, int x, int y, const char *text, const uint8_t color[3],
                    int scale);

#endif /* VS_BITMAP_FONT_H */

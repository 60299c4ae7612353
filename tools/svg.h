/* SPDX-License-Identifier: MIT */
/*
 * svg.h - the few SVG elements the simulator's timeline is drawn with,
 * written straight to a FILE. Coordinates are in px (user units), printed
 * with one decimal. Text is XML-escaped, so any string can be drawn.
 */
#ifndef TG_TOOLS_SVG_H
#define TG_TOOLS_SVG_H

#include <stdio.h>

#if defined(__GNUC__)
#define SVG_PRINTF(f, a) __attribute__((format(printf, f, a)))
#else
#define SVG_PRINTF(f, a)
#endif

/* The XML prologue and the <svg> element of width w and height h, on a
 * white background. */
void svg_begin(FILE *f, double w, double h);
/* Closes the <svg> element. */
void svg_end(FILE *f);
/* A filled rectangle; fill is a CSS colour, opacity 0..1. */
void svg_rect(FILE *f, double x, double y, double w, double h, const char *fill,
              double opacity);
/* A line; dash is a stroke-dasharray ("4 3") or NULL for a solid line. */
void svg_line(FILE *f, double x1, double y1, double x2, double y2,
              const char *stroke, double width, const char *dash);
/* Text at (x, y) (baseline), anchor "start", "middle" or "end", size in px,
 * weight "normal" or "bold"; the rest is a printf format. */
void svg_text(FILE *f, double x, double y, const char *anchor, double size,
              const char *weight, const char *fmt, ...) SVG_PRINTF(7, 8);
/* A polyline: svg_poly_begin, then svg_poly_point for each vertex, then
 * svg_poly_end. */
void svg_poly_begin(FILE *f, const char *stroke, double width);
void svg_poly_point(FILE *f, double x, double y);
void svg_poly_end(FILE *f);

#endif

/* SPDX-License-Identifier: MIT */
/*
 * svg.c - minimal SVG writer (see svg.h).
 */
#include "svg.h"

#include <stdarg.h>

void svg_begin(FILE *f, double w, double h) {
  fprintf(f,
          "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
          "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" "
          "height=\"%.0f\" viewBox=\"0 0 %.0f %.0f\" "
          "font-family=\"DejaVu Sans, Helvetica, Arial, sans-serif\">\n",
          w, h, w, h);
  fprintf(f,
          "<rect x=\"0\" y=\"0\" width=\"%.0f\" height=\"%.0f\" "
          "fill=\"white\"/>\n",
          w, h);
}

void svg_end(FILE *f) { fprintf(f, "</svg>\n"); }

void svg_rect(FILE *f, double x, double y, double w, double h, const char *fill,
              double opacity) {
  fprintf(f,
          "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" "
          "fill=\"%s\" fill-opacity=\"%.2f\"/>\n",
          x, y, w, h, fill, opacity);
}

void svg_line(FILE *f, double x1, double y1, double x2, double y2,
              const char *stroke, double width, const char *dash) {
  fprintf(f,
          "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" "
          "stroke=\"%s\" stroke-width=\"%.1f\"",
          x1, y1, x2, y2, stroke, width);
  if (dash)
    fprintf(f, " stroke-dasharray=\"%s\"", dash);
  fprintf(f, "/>\n");
}

void svg_text(FILE *f, double x, double y, const char *anchor, double size,
              const char *weight, const char *fmt, ...) {
  char buf[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  fprintf(f,
          "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"%s\" font-size=\"%.0f\" "
          "font-weight=\"%s\">",
          x, y, anchor, size, weight);
  for (const char *p = buf; *p; p++) {
    switch (*p) {
    case '<':
      fputs("&lt;", f);
      break;
    case '>':
      fputs("&gt;", f);
      break;
    case '&':
      fputs("&amp;", f);
      break;
    case '"':
      fputs("&quot;", f);
      break;
    default:
      fputc(*p, f);
    }
  }
  fprintf(f, "</text>\n");
}

void svg_poly_begin(FILE *f, const char *stroke, double width) {
  fprintf(f,
          "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"%.1f\" "
          "stroke-linejoin=\"round\" points=\"",
          stroke, width);
}

void svg_poly_point(FILE *f, double x, double y) {
  fprintf(f, "%.1f,%.1f ", x, y);
}

void svg_poly_end(FILE *f) { fprintf(f, "\"/>\n"); }

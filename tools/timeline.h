/* SPDX-License-Identifier: MIT */
/*
 * timeline.h - draws a simulation as an SVG timeline: one panel per
 * algorithm, stacked on one time axis so they compare at a glance. Each
 * panel shows the requests admitted (green) and denied (red) over time,
 * and below them the busiest key's admitted count over the last period
 * against the limit (a dashed line): where that line rises above the limit,
 * the algorithm let a period hold more than its quota.
 */
#ifndef TG_TOOLS_TIMELINE_H
#define TG_TOOLS_TIMELINE_H

#include "simulate.h"

#include <stdio.h>

/* Writes the SVG document for runs[0..nruns) of traffic t to f. Returns 0,
 * or -1 if memory ran out or writing failed. */
int timeline_write(FILE *f, const sim_params *p, const sim_traffic *t,
                   const sim_run *runs, size_t nruns);

#endif

/* wait.h -- long polls' wait and the clients' pace (docs/api.md, "`wait`"
 * and "Poll-Interval-Ms"): the wait= parameter of a poll URL and the
 * Poll-Interval-Ms value of an answer. Pure functions: no allocation. */
#ifndef FP_WAIT_H
#define FP_WAIT_H

#include <stddef.h>

/* The value of `wait` in the target's query (docs/api.md, "`wait`"): 0
 * without one (or wait=0), else the seconds clamped to max_wait. The name
 * is matched ASCII case-insensitively and never percent-decoded; `wait`
 * without '=' is an occurrence. -1 if it occurs twice in any case, or its
 * value is not 1-6 decimal digits (a 400, as nginx and the app answer). */
long fp_wait_param(const char *target, size_t len, unsigned max_wait);

/* A Poll-Interval-Ms value: interval_ms + a random 0..jitter_pct % of it. */
unsigned fp_pace_ms(unsigned interval_ms, unsigned jitter_pct);

#endif

/* longpoll.h -- the poll port's conditional and long-poll policy
 * (docs/api.md, "If-None-Match" and "`wait`"): which polls may wait, when
 * an unchanged answer is held rather than answered 304, and how a held poll
 * ends (its answer changed, its wait is over, a drain). The holding itself
 * is hold.c's; the connection is conn.c's, the request's fields are
 * request.h's. */
#ifndef FP_LONGPOLL_H
#define FP_LONGPOLL_H

#include <stddef.h>
#include <stdint.h>

#include "cache.h"
#include "hold.h"
#include "httpparse.h"
#include "request.h"
#include "stats.h"

/* Sets r->wait_s from the request's wait= and nginx's route. Returns 0, or
 * -1 if the wait parameter is refused (400). */
int fp_longpoll_wait(struct fp_request *r, const struct fp_http_head *hd,
                     unsigned max_wait);

/* r's cache read starts now: announcements from here on are seen when it
 * is held (fp_hold_add's `since`). */
void fp_longpoll_read_starts(struct fp_request *r, const struct fp_hold *ho);

/* r's answer is tagged `tag`: sets its ETag and pace (the interval, or for a
 * long poll answered 200 that of a held poll that ends). Returns 200 (no
 * If-None-Match matches), 304 (one matches, not to be held: no wait= or a
 * drain) or 0 (one matches and the poll may be held). Counts nothing. */
int fp_longpoll_tagged(struct fp_request *r, uint64_t tag);

/* The Poll-Interval-Ms of a held poll that ends: 0 plus the jitter. */
unsigned fp_longpoll_held_pace(const struct fp_request *r);

/* The cache has value for r: its ETag and pace are set. Returns 200 (the
 * answer), 304 (unchanged, not held) or 0 (unchanged and held: answered
 * later by fp_longpoll_release or fp_longpoll_end). Counted in the stats
 * unless held. */
int fp_longpoll_hit(struct fp_request *r, struct fp_hold *ho,
                    const char *value, size_t len);

/* A held poll ends with 304: its wait is over, or the server drains. */
void fp_longpoll_end(struct fp_request *r, enum fp_stat_wake cause);

/* hold.c's release callback (fp_hold_release): a held poll's answer
 * changed (200), its key is gone (404) or a change could not be read (503):
 * nginx asks the app. */
void fp_longpoll_release(struct fp_held *hd, enum fp_cache_status st,
                         const char *value, size_t len, uint64_t tag,
                         enum fp_stat_wake cause, void *arg);

#endif

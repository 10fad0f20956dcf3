/* http.h -- the poll port's request layer (http.c, on conn.c's own
 * HTTP/1.1): GET/HEAD/POST -> key -> coalesced cache get -> 200 (hit) / 304
 * (If-None-Match matches; a long poll may be held first) / 404 (miss or
 * invalid key) / 503 (cache failed); 405 for every other method. The
 * listeners and the server's life around it: server.h. */
#ifndef FP_HTTP_H
#define FP_HTTP_H

#include "conn.h"

struct event_base;
struct fp_settings;
struct fp_cache;
struct fp_accept_guard;
struct fp_coalesce;
struct fp_coalesce_stats;
struct fp_hold;
struct fp_chpolls;
struct fp_signer;

/* The poll port's connections and what their requests use. */
struct fp_http {
    struct fp_conns cs;         /* first: a connection's c->h */
    struct fp_coalesce *co;
    struct fp_hold *hold;       /* held long polls */
    struct fp_chpolls *chp;     /* polls with channels (chpoll.c) */
    struct fp_signer *signer;   /* NULL: poll URLs are not signed */
};

/* Sets up h (zeroed by the caller) on base; guard is told when a
 * connection frees a descriptor. 0, or -1 (logged, nothing left to free).
 * The settings and the cache must outlive it. */
int fp_http_init(struct fp_http *h, struct event_base *base,
                 const struct fp_settings *settings, struct fp_cache *cache,
                 struct fp_accept_guard *guard);

/* Answers every later request with "Connection: close" and every held poll
 * with 304 now. `done` is called, from the loop or right away, once no
 * request is left in flight (waiting for the cache or for its answer to be
 * written). */
void fp_http_drain(struct fp_http *h, void (*done)(void *arg), void *arg);

/* Answers every request still waiting for the cache with 503 now (their
 * connections then close, as during a drain). */
void fp_http_abort_waiting(struct fp_http *h);

/* Requests in flight now. */
unsigned long fp_http_inflight(const struct fp_http *h);

/* The coalescers' counters, plain polls' and channel polls' parts' summed
 * (admin.c's /metrics). */
void fp_http_coalesce_stats(const struct fp_http *h,
                            struct fp_coalesce_stats *out);

/* Closes every connection and frees what fp_http_init made (not h). Free
 * the cache first, so that every waiting request has been answered
 * (fp_cache_free calls back). */
void fp_http_release(struct fp_http *h);

#endif

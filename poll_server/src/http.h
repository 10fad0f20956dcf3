/* http.h -- the poll port's HTTP front (http.c: its own HTTP/1.1 on
 * libevent's event loop): GET/HEAD/POST -> key -> coalesced cache get
 * -> 200 (hit) / 304 (If-None-Match matches; a long poll may be held
 * first) / 404 (miss or invalid key) / 503 (cache failed); 405 for every
 * other method. */
#ifndef FP_HTTP_H
#define FP_HTTP_H

struct event_base;
struct fp_settings;
struct fp_cache;
struct fp_http;
struct fp_coalesce_stats;

/* Binds settings->listen:port and starts serving on base. NULL on error
 * (logged). The settings and the cache must outlive the server. */
struct fp_http *fp_http_start(struct event_base *base,
                              const struct fp_settings *settings,
                              struct fp_cache *cache);

/* Stops accepting (closes the listening socket) and answers every later
 * request with "Connection: close". `done` is called, from the loop or
 * right away, once no request is left in flight (waiting for the cache or
 * for its answer to be written). */
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

/* Closes every connection and frees the server. Free the cache first, so
 * that every waiting request has been answered (fp_cache_free calls back). */
void fp_http_free(struct fp_http *h);

#endif

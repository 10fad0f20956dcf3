/* response.h -- the poll port's answers as HTTP/1.x bytes: the head of
 * every answer (status line, content and cache headers, Date, Connection)
 * and the fixed bodies. Formatting only: writing is conn.c's. */
#ifndef FP_RESPONSE_H
#define FP_RESPONSE_H

#include <stddef.h>
#include <stdint.h>
#include <time.h>

struct event_base;

/* What an answer's head says. */
struct fp_resp {
    int code;                   /* 200, 304, 400, 403, ... */
    int minor;                  /* HTTP/1.<minor> of the request */
    int close;                  /* Connection: close (else keep-alive) */
    size_t len;                 /* Content-Length (not for a 304) */
    int from_cache;             /* an answer from the cache: its headers */
    const char *content_type;   /* ... Content-Type (not for a 304), */
    int has_tag;                /* ... ETag if has_tag, */
    uint64_t tag;
    unsigned pace_ms;           /* ... Poll-Interval-Ms */
    const char *date;           /* Date, or NULL: none */
    int stream;                 /* an event stream's head (code 200, close
                                 * set, not from_cache): no length, the body
                                 * ends with the connection (docs/api.md,
                                 * "Event streams") */
};

/* What an answer from the cache says of itself (the request layer's, kept
 * with the request; struct fp_resp's fields of the same names). */
struct fp_resp_meta {
    int has_tag;                /* ETag if has_tag */
    uint64_t tag;
    unsigned pace_ms;           /* Poll-Interval-Ms */
};

/* The Date header's value, formatted at most once a second. */
struct fp_resp_date {
    time_t sec;
    char text[64];
};

/* The fixed body of an answer not from the cache (403's), or NULL with
 * *len 0. */
const char *fp_resp_body(int code, size_t *len);

/* Formats r's head into buf. Returns its length, 0 if it does not fit. */
size_t fp_resp_format(char *buf, size_t cap, const struct fp_resp *r);

/* The Date header's value for now (base's cached time), or NULL. */
const char *fp_resp_date_now(struct fp_resp_date *d, struct event_base *base);

#endif

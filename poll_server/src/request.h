/* request.h -- a poll request's own fields, kept with its connection: the
 * request layer's (http.c, longpoll.c, chpoll.c) object for a connection.
 * conn.c allocates it (fp_conn_ops.size, from its free list: nothing per
 * request) and knows only the struct conn it starts with; the request layer
 * goes from one to the other by a cast, no pointer followed. */
#ifndef FP_REQUEST_H
#define FP_REQUEST_H

#include <stddef.h>
#include <stdint.h>

#include "coalesce.h"
#include "conn.h"
#include "etag.h"
#include "hold.h"
#include "keys.h"
#include "response.h"
#include "stats.h"

/* The fields belong to the request being served, from its start() on. */
struct fp_request {
    struct conn c;                  /* first: conn.c's part */
    struct fp_waiter w;             /* the coalescer's handle */
    enum fp_stat_method method;
    int verdict;                    /* 0: ask the cache; else answer this */
    enum fp_stat_outcome outcome;   /* ... counted as this */
    size_t keylen;
    char key[FP_MAX_KEY_LEN + 1];
    /* Conditional and long polls (etag.h, hold.h, longpoll.h). */
    struct fp_inm inm;              /* If-None-Match, if cond */
    int cond;                       /* GET/HEAD with a valid If-None-Match */
    unsigned wait_s;                /* wait=, clamped; 0: not a long poll */
    uint64_t ann_seq;               /* fp_hold_seq() before its cache read */
    struct fp_resp_meta ans;        /* the answer from the cache's ETag and
                                     * Poll-Interval-Ms */
    struct fp_held held;
    /* Event streams (stream.h). */
    int stream;                     /* to be answered as a stream */
    int streaming;                  /* ... and its head is out */
    uint64_t stream_end_ms;         /* its life ends then (monotonic) */
    uint64_t stream_tag;            /* the last event's id */
};

_Static_assert(offsetof(struct fp_request, c) == 0,
               "conn.c's part starts the request layer's object");

static inline struct fp_request *fp_request_of(struct conn *c)
{
    return (struct fp_request *)(void *)c;
}

#endif

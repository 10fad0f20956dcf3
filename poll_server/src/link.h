/* link.h -- the mechanics of one cache server's connection that both
 * drivers share (cache_memcached.c per node, cache_redis.c): its up/down
 * state logged once per change, the reconnect after health.h's backoff,
 * and the hang check of a late request (health.h decides, this acts). */
#ifndef FP_LINK_H
#define FP_LINK_H

#include <stddef.h>

#include <event2/event.h>

#include "health.h"

enum fp_link_log { FP_LINK_LOG_NONE, FP_LINK_LOG_UP, FP_LINK_LOG_DOWN };

/* A driver's constants and questions. */
struct fp_link_ops {
    const char *kind;           /* "memcached": log lines "<kind> <name>: ..." */
    const char *answer, *then;  /* the hang's line: "no <answer> within N ms
                                 * and nothing from it for M ms, <then>" */
    int (*waiting)(void *arg);  /* requests wait on a live connection */
    void (*hung)(void *arg, const char *why); /* drop it, logged down */
};

struct fp_link {
    const struct fp_link_ops *ops;
    const char *name;           /* the driver's, may be rewritten in place */
    size_t index;               /* the server's stats index */
    unsigned timeout_ms;        /* [cache] timeout_ms */
    void *arg;                  /* the driver's server, for ops and retry */
    enum fp_link_log logged;
    struct fp_health health;
    struct event *retry;        /* reconnect timer, the driver's callback */
    struct event *hangcheck;    /* a late request's: is it silent yet? */
};

/* Sets the link up and creates its timers; retry_cb gets arg. 0, or -1
 * (then fp_link_free). */
int fp_link_init(struct fp_link *l, struct event_base *base,
                 const struct fp_link_ops *ops, const char *name, size_t index,
                 unsigned timeout_ms, void *arg, event_callback_fn retry_cb);
void fp_link_free(struct fp_link *l);

/* Answering: "connected" (then `note`, if any) logged when it was not up
 * or when there is a note; the up gauge set. */
void fp_link_up(struct fp_link *l, const char *note);

/* Down: `why` logged as a warning on the change, else at debug. */
void fp_link_down(struct fp_link *l, const char *why);

/* The last state logged was down (a reconnect then may be a recovery). */
int fp_link_was_down(const struct fp_link *l);

/* Arms the reconnect after health.h's delay (at once after a connection
 * that was answering, else the jittered backoff). */
void fp_link_retry(struct fp_link *l);

/* A request is late: 0, or -1 when the server is hung, with the health
 * marked bad and `why` the line to log. */
int fp_link_late(struct fp_link *l, char *why, size_t len);

#endif

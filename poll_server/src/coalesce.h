/* coalesce.h -- request coalescing: one cache round trip at a time per key,
 * however many requests wait for that key.
 *
 * Requests that arrive while a get for their key is in flight do not share
 * that get's answer if it is a hit: the get may have been read by the cache
 * before they were sent, and a poll sent after a publish returned must never
 * see the older value. They wait for the next get instead, which starts as
 * soon as the current one ends. A miss, error or timeout is shared with
 * every waiter at once (a miss sends them all to the app, which is
 * authoritative; an error makes waiting pointless). */
#ifndef FP_COALESCE_H
#define FP_COALESCE_H

#include <stddef.h>
#include <sys/queue.h>

#include "cache.h"

struct fp_fetch;
struct fp_wlist;

/* Embedded in the caller's per-request object; owned by the caller. */
struct fp_waiter {
    TAILQ_ENTRY(fp_waiter) link; /* its list, in arrival order */
    struct fp_wlist *list;   /* NULL when not waiting */
};

/* Called once per attached waiter, from the cache callback (so from the
 * event loop, never from inside fp_coalesce_get). The waiter is already
 * detached; the callee may reuse or free it. `value` is valid only during
 * the call and may contain NUL bytes. */
typedef void fp_coalesce_deliver(struct fp_waiter *w,
                                 enum fp_cache_status status,
                                 const char *value, size_t len, void *arg);

struct fp_coalesce_stats {
    unsigned long long gets;     /* fp_cache_get calls */
    unsigned long long requests; /* fp_coalesce_get calls that attached */
    size_t keys;                 /* keys with a get in flight now */
    size_t waiting;              /* waiters attached now */
};

struct fp_coalesce;

struct fp_coalesce *fp_coalesce_new(struct fp_cache *cache,
                                    fp_coalesce_deliver *deliver, void *arg);

/* Attaches w to the fetch of `key` (keylen <= FP_MAX_KEY_LEN), starting a
 * get if none is in flight. Returns 0, or -1 if nothing could be started
 * (out of memory, cache refused): then w is not attached and will not be
 * delivered. */
int fp_coalesce_get(struct fp_coalesce *co, const char *key, size_t keylen,
                    struct fp_waiter *w);

/* Detaches a waiting w (its client went away); it will not be delivered.
 * The get itself goes on: others may join it, and it cannot be cancelled.
 * No-op if w is not attached. */
void fp_coalesce_detach(struct fp_waiter *w);

/* Delivers `status` to every attached waiter now (shutdown: stop waiting).
 * The gets themselves stay in flight and end normally, with nobody left. */
void fp_coalesce_fail_all(struct fp_coalesce *co, enum fp_cache_status status);

void fp_coalesce_stats(const struct fp_coalesce *co,
                       struct fp_coalesce_stats *out);

/* Frees the table. The cache must have been freed first (so that every get
 * has been answered): fetches still in flight are a caller bug, and are
 * leaked rather than freed under a pending callback. */
void fp_coalesce_free(struct fp_coalesce *co);

#endif

/* cache.h -- the interface every cache backend implements (cache_memcached.c,
 * cache_redis.c). The HTTP side sees only this. */
#ifndef FP_CACHE_H
#define FP_CACHE_H

#include <stddef.h>

struct event_base;
struct fp_settings;

enum fp_cache_status {
    FP_CACHE_HIT,      /* value found; an empty value is a hit */
    FP_CACHE_MISS,     /* key not stored */
    FP_CACHE_ERROR,    /* server down, refused, protocol error */
    FP_CACHE_TIMEOUT   /* no answer within cache_timeout_ms */
};

/* Called exactly once per fp_cache_get() that returned 0, always from the
 * event loop and never from inside fp_cache_get() itself, and no later than
 * cache_timeout_ms (plus timer slack) after the get; with memcached replicas,
 * twice that (a failed primary read is followed by one replica read with a
 * deadline of its own). `value` is valid only
 * during the call and may contain NUL bytes. */
typedef void fp_cache_cb(enum fp_cache_status status, const char *value,
                         size_t len, void *arg);

struct fp_cache; /* opaque, one per process */

/* Creates the backend chosen in settings. Connects lazily, never blocks. */
struct fp_cache *fp_cache_create(struct event_base *base,
                                 const struct fp_settings *settings);

/* Starts a non-blocking fetch. `key` is a valid key (keys.c checked it);
 * the backend copies it. Gets are batched: each cache node receives them
 * in one write (memcached: pipelined "mg"s, Redis: pipelined GETs), so a
 * request that needs several keys, or many requests read in one wake-up,
 * cost one round trip per node, not one per key. A batch holds the gets of
 * one loop turn when the node is idle, and under load every get started
 * while the node's previous batch awaited its answers (one batch in flight
 * per connection); each get keeps its own deadline and failover. Returns
 * 0, or -1 if it
 * could not even queue the request (out of memory): then cb is never
 * called. */
int fp_cache_get(struct fp_cache *cache, const char *key, size_t keylen,
                 fp_cache_cb *cb, void *arg);

/* Closes every connection. Pending callbacks are called with FP_CACHE_ERROR
 * before it returns. */
void fp_cache_free(struct fp_cache *cache);

#endif

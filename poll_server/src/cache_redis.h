/* cache_redis.h -- Redis backend: hiredis async API on the libevent loop,
 * with our own per-request timeout and automatic reconnect. */
#ifndef FP_CACHE_REDIS_H
#define FP_CACHE_REDIS_H

#include <stddef.h>

#include "cache.h"

struct event_base;
struct fp_settings;
struct fp_redis;

struct fp_redis *fp_redis_create(struct event_base *base,
                                 const struct fp_settings *s);
int fp_redis_get(struct fp_redis *r, const char *key, size_t keylen,
                 fp_cache_cb *cb, void *arg);
void fp_redis_free(struct fp_redis *r);

#endif

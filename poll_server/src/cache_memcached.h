/* cache_memcached.h -- memcached backend: ketama server selection from
 * libmemcached, non-blocking pipelined text protocol on the event loop. */
#ifndef FP_CACHE_MEMCACHED_H
#define FP_CACHE_MEMCACHED_H

#include <stddef.h>

#include "cache.h"

struct event_base;
struct fp_settings;
struct fp_mc;

struct fp_mc *fp_mc_create(struct event_base *base, const struct fp_settings *s);
int fp_mc_get(struct fp_mc *mc, const char *key, size_t keylen,
              fp_cache_cb *cb, void *arg);
void fp_mc_free(struct fp_mc *mc);

#endif

/* cache.c -- dispatch fp_cache_* to the backend chosen in the settings.
 * The backends live in cache_memcached.c and cache_redis.c; this file only
 * owns the ops table so the HTTP side never knows which one runs. */
#include <stdlib.h>

#include "cache.h"
#include "cache_memcached.h"
#include "cache_redis.h"
#include "log.h"
#include "settings.h"

struct fp_cache_ops {
    const char *name;
    void *(*create)(struct event_base *base, const struct fp_settings *s);
    int (*get)(void *be, const char *key, size_t keylen, fp_cache_cb *cb,
               void *arg);
    void (*free)(void *be);
};

static void *mc_create(struct event_base *base, const struct fp_settings *s)
{
    return fp_mc_create(base, s);
}
static int mc_get(void *be, const char *key, size_t keylen, fp_cache_cb *cb,
                  void *arg)
{
    return fp_mc_get(be, key, keylen, cb, arg);
}
static void mc_free(void *be) { fp_mc_free(be); }

static void *rd_create(struct event_base *base, const struct fp_settings *s)
{
    return fp_redis_create(base, s);
}
static int rd_get(void *be, const char *key, size_t keylen, fp_cache_cb *cb,
                  void *arg)
{
    return fp_redis_get(be, key, keylen, cb, arg);
}
static void rd_free(void *be) { fp_redis_free(be); }

static const struct fp_cache_ops memcached_ops = {
    "memcached", mc_create, mc_get, mc_free
};
static const struct fp_cache_ops redis_ops = {
    "redis", rd_create, rd_get, rd_free
};

struct fp_cache {
    const struct fp_cache_ops *ops;
    void *be;
};

struct fp_cache *fp_cache_create(struct event_base *base,
                                 const struct fp_settings *settings)
{
    struct fp_cache *c = NULL;
    const struct fp_cache_ops *ops;

    switch (settings->backend) {
    case FP_BACKEND_MEMCACHED: ops = &memcached_ops; break;
    case FP_BACKEND_REDIS: ops = &redis_ops; break;
    default:
        fp_log(FP_LOG_ERROR, "cache: unknown backend %d", (int)settings->backend);
        return NULL;
    }
    c = calloc(1, sizeof(*c));
    if (c == NULL) {
        fp_log(FP_LOG_ERROR, "cache: out of memory");
        return NULL;
    }
    c->ops = ops;
    c->be = ops->create(base, settings);
    if (c->be == NULL) {
        fp_log(FP_LOG_ERROR, "cache: cannot create %s backend", ops->name);
        free(c);
        return NULL;
    }
    return c;
}

int fp_cache_get(struct fp_cache *cache, const char *key, size_t keylen,
                 fp_cache_cb *cb, void *arg)
{
    return cache->ops->get(cache->be, key, keylen, cb, arg);
}

void fp_cache_free(struct fp_cache *cache)
{
    if (cache == NULL)
        return;
    cache->ops->free(cache->be);
    free(cache);
}

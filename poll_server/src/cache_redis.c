/* cache_redis.c -- STUB: answers every get with FP_CACHE_ERROR (asynchronously) until
 * the real backend lands. */
#include <stdlib.h>

#include <event2/event.h>

#include "cache_redis.h"
#include "log.h"
#include "settings.h"

struct fp_redis {
    struct event_base *base;
};

struct stub_req {
    fp_cache_cb *cb;
    void *arg;
};

static void stub_fire(evutil_socket_t fd, short what, void *p)
{
    struct stub_req *r = p;
    (void)fd;
    (void)what;
    r->cb(FP_CACHE_ERROR, NULL, 0, r->arg);
    free(r);
}

struct fp_redis *fp_redis_create(struct event_base *base, const struct fp_settings *s)
{
    struct fp_redis *b = calloc(1, sizeof(*b));
    (void)s;
    if (b == NULL)
        return NULL;
    b->base = base;
    fp_log(FP_LOG_WARN, "cache: cache_redis.c is a stub, every get fails");
    return b;
}

int fp_redis_get(struct fp_redis *b, const char *key, size_t keylen, fp_cache_cb *cb,
             void *arg)
{
    struct stub_req *r = malloc(sizeof(*r));
    struct timeval tv = {0, 0};
    (void)key;
    (void)keylen;
    if (r == NULL)
        return -1;
    r->cb = cb;
    r->arg = arg;
    if (event_base_once(b->base, -1, EV_TIMEOUT, stub_fire, r, &tv) != 0) {
        free(r);
        return -1;
    }
    return 0;
}

void fp_redis_free(struct fp_redis *b)
{
    free(b);
}

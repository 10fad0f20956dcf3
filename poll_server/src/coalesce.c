/* coalesce.c -- a uthash table key -> fetch. A fetch exists while a get for
 * its key is in flight; it holds two lists of waiters: `cur`, the requests
 * that arrived before the get was started, and `next`, those that arrived
 * after it (see coalesce.h for why they do not share a hit). Fetch objects
 * are recycled through a free list, so a steady load allocates nothing. */
#include <stdlib.h>
#include <string.h>

#include "coalesce.h"
#include "log.h"
#include "settings.h"

/* uthash: a failed allocation must not exit the server. */
static int hash_oom;
#define HASH_NONFATAL_OOM 1
#define uthash_nonfatal_oom(obj) do { (void)(obj); hash_oom = 1; } while (0)
#include <uthash.h>

#define FREE_FETCH_MAX 1024 /* recycled fetch objects kept */

TAILQ_HEAD(fp_waiterq, fp_waiter);
SLIST_HEAD(fp_fetch_free, fp_fetch);

struct fp_wlist {
    struct fp_waiterq q;        /* a tail: delivered in arrival order */
    size_t n;
    struct fp_coalesce *co;
};

struct fp_fetch {
    UT_hash_handle hh;
    struct fp_coalesce *co;
    struct fp_wlist cur, next;
    SLIST_ENTRY(fp_fetch) free_link;
    size_t keylen;
    char key[FP_MAX_KEY_LEN + 1];
};

struct fp_coalesce {
    struct fp_cache *cache;
    /* Always in the table, under the empty key (no request has one): uthash
     * frees its table when the last item goes and allocates it again with
     * the next, two allocations per get at concurrency 1. */
    struct fp_fetch sentinel;
    fp_coalesce_deliver *deliver;
    void *arg;
    struct fp_fetch *table;     /* uthash head */
    struct fp_fetch_free free_list;
    size_t nfree;
    size_t waiting;
    unsigned long long gets, requests;
};

static void wlist_init(struct fp_wlist *l, struct fp_coalesce *co)
{
    TAILQ_INIT(&l->q);
    l->n = 0;
    l->co = co;
}

static void wlist_push(struct fp_wlist *l, struct fp_waiter *w)
{
    TAILQ_INSERT_TAIL(&l->q, w, link);
    l->n++;
    w->list = l;
}

static void wlist_remove(struct fp_waiter *w)
{
    struct fp_wlist *l = w->list;

    TAILQ_REMOVE(&l->q, w, link);
    l->n--;
    w->list = NULL;
}

/* Hands every waiter of l its answer. Each is detached before its callback,
 * which may therefore free it. */
static void wlist_deliver(struct fp_coalesce *co, struct fp_wlist *l,
                          enum fp_cache_status st, const char *value,
                          size_t len)
{
    struct fp_waiter *w;

    while ((w = TAILQ_FIRST(&l->q)) != NULL) {
        wlist_remove(w);
        co->waiting--;
        co->deliver(w, st, value, len, co->arg);
    }
}

static struct fp_fetch *fetch_alloc(struct fp_coalesce *co)
{
    struct fp_fetch *f = SLIST_FIRST(&co->free_list);

    if (f != NULL) {
        SLIST_REMOVE_HEAD(&co->free_list, free_link);
        co->nfree--;
    } else if ((f = malloc(sizeof(*f))) == NULL) {
        return NULL;
    }
    memset(f, 0, offsetof(struct fp_fetch, key));
    f->co = co;
    wlist_init(&f->cur, co);
    wlist_init(&f->next, co);
    return f;
}

static void fetch_release(struct fp_coalesce *co, struct fp_fetch *f)
{
    if (co->nfree >= FREE_FETCH_MAX) {
        free(f);
        return;
    }
    SLIST_INSERT_HEAD(&co->free_list, f, free_link);
    co->nfree++;
}

static void fetch_done(enum fp_cache_status st, const char *value, size_t len,
                       void *arg);

static int fetch_start(struct fp_fetch *f)
{
    if (fp_cache_get(f->co->cache, f->key, f->keylen, fetch_done, f) < 0)
        return -1;
    f->co->gets++;
    return 0;
}

static void fetch_done(enum fp_cache_status st, const char *value, size_t len,
                       void *arg)
{
    struct fp_fetch *f = arg;
    struct fp_coalesce *co = f->co;
    struct fp_waiter *w;

    if (st != FP_CACHE_HIT) {
        /* Safe to share with the late ones too: no stale data in it. */
        wlist_deliver(co, &f->cur, st, value, len);
        wlist_deliver(co, &f->next, st, value, len);
    } else {
        wlist_deliver(co, &f->cur, st, value, len);
        if (f->next.n > 0) {
            /* The late ones get a get of their own, started after they
             * all arrived; it stays the only one in flight for the key.
             * Moved in their order to the empty cur (a TAILQ head is
             * pointed into by its last element: never copied). */
            TAILQ_CONCAT(&f->cur.q, &f->next.q, link);
            f->cur.n = f->next.n;
            f->next.n = 0;
            /* Not TAILQ_FOREACH: make lint's cppcheck cannot expand it. */
            for (w = TAILQ_FIRST(&f->cur.q); w != NULL; w = TAILQ_NEXT(w, link))
                w->list = &f->cur;
            if (fetch_start(f) == 0)
                return;
            wlist_deliver(co, &f->cur, FP_CACHE_ERROR, NULL, 0);
        }
    }
    HASH_DELETE(hh, co->table, f);
    fetch_release(co, f);
}

struct fp_coalesce *fp_coalesce_new(struct fp_cache *cache,
                                    fp_coalesce_deliver *deliver, void *arg)
{
    struct fp_coalesce *co = calloc(1, sizeof(*co));

    if (co == NULL)
        return NULL;
    co->cache = cache;
    co->deliver = deliver;
    co->arg = arg;
    co->sentinel.co = co;
    wlist_init(&co->sentinel.cur, co);
    wlist_init(&co->sentinel.next, co);
    hash_oom = 0;
    HASH_ADD(hh, co->table, key, 0, &co->sentinel);
    if (hash_oom) {
        free(co);
        return NULL;
    }
    return co;
}

int fp_coalesce_get(struct fp_coalesce *co, const char *key, size_t keylen,
                    struct fp_waiter *w)
{
    struct fp_fetch *f;

    if (keylen == 0 || keylen > FP_MAX_KEY_LEN)
        return -1;
    HASH_FIND(hh, co->table, key, keylen, f);
    if (f != NULL) {
        wlist_push(&f->next, w);
        co->waiting++;
        co->requests++;
        return 0;
    }
    if ((f = fetch_alloc(co)) == NULL)
        return -1;
    memcpy(f->key, key, keylen);
    f->key[keylen] = '\0';
    f->keylen = keylen;
    hash_oom = 0;
    HASH_ADD(hh, co->table, key, keylen, f);
    if (hash_oom) {
        fetch_release(co, f);
        return -1;
    }
    if (fetch_start(f) < 0) {
        HASH_DELETE(hh, co->table, f);
        fetch_release(co, f);
        return -1;
    }
    wlist_push(&f->cur, w);
    co->waiting++;
    co->requests++;
    return 0;
}

void fp_coalesce_detach(struct fp_waiter *w)
{
    if (w->list == NULL)
        return;
    w->list->co->waiting--;
    wlist_remove(w);
}

void fp_coalesce_fail_all(struct fp_coalesce *co, enum fp_cache_status status)
{
    struct fp_fetch *f, *tmp;

    HASH_ITER(hh, co->table, f, tmp) {
        wlist_deliver(co, &f->cur, status, NULL, 0);
        wlist_deliver(co, &f->next, status, NULL, 0);
    }
}

void fp_coalesce_stats(const struct fp_coalesce *co,
                       struct fp_coalesce_stats *out)
{
    out->gets = co->gets;
    out->requests = co->requests;
    out->keys = HASH_COUNT(co->table) - 1; /* not the sentinel */
    out->waiting = co->waiting;
}

void fp_coalesce_free(struct fp_coalesce *co)
{
    struct fp_fetch *f, *tmp;

    if (co == NULL)
        return;
    HASH_DELETE(hh, co->table, &co->sentinel);
    if (co->table != NULL) {
        fp_log(FP_LOG_ERROR, "coalesce: freed with %u gets in flight",
               HASH_COUNT(co->table));
        /* Their callbacks may still come: leak rather than free. */
        HASH_ITER(hh, co->table, f, tmp) {
            wlist_deliver(co, &f->cur, FP_CACHE_ERROR, NULL, 0);
            wlist_deliver(co, &f->next, FP_CACHE_ERROR, NULL, 0);
        }
        HASH_CLEAR(hh, co->table);
    }
    while ((f = SLIST_FIRST(&co->free_list)) != NULL) {
        SLIST_REMOVE_HEAD(&co->free_list, free_link);
        free(f);
    }
    free(co);
}

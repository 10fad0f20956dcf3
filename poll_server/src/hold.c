/* hold.c -- held long polls, grouped by key (hold.h).
 *
 * A uthash table key -> struct fp_hkey (its holders, whether a read is in
 * flight); keys are also on a queue ordered by their last read, which the
 * re-check timer walks from the front. Key objects are recycled through a
 * free list. A read is never shared with an announcement that came during
 * it (the read may have been answered by the cache before the write): the
 * announcement marks the key to be read once more when that read ends.
 * The publish time an announcement carries goes with the first read that
 * starts after it; that read's new bodies are timed against it.
 *
 * An announcement of a key nobody holds yet may still matter: a poll whose
 * own first read (http.c, through the coalescer) was in flight when it came
 * could be answered from before the write, and then held on that answer
 * until the re-check. So every announcement is numbered and noted in a
 * small table by its key's hash (ANN_SLOTS, overwritten: a collision can
 * only cause one more read, never a missed one), and a poll that is about
 * to be held on a read that started before a later announcement of its key
 * has its key read again at once (fp_hold_add).
 *
 * A read for a change the holders have not seen (an announcement's, or one
 * with an announcement during it) that fails or times out is tried again
 * soon, RETRY_MAX times at most, RETRY_BASE_MS doubling: a late answer must
 * not cost a held poll the re-check period. The retry goes to the front of
 * the re-check queue, due then; keys behind it may be read that much later.
 * When the last retry fails too (a stalled or slow cache: the retries fail
 * fast or time out), the key's polls are released with that failure, so
 * they reach the app as a plain poll would (503, nginx's @fallback).
 *
 * A channel poll is held on each of its keys (struct fp_held_set): a read of
 * one key compares the answer with that part's tag as the poll read it, and
 * a change releases the whole poll with that read's value (chpoll.c). It
 * counts as one held poll.
 *
 * A stream is held again after each event: its watches have `keep`, and
 * stay on their keys through the release, which updates their tags in
 * place (no removal, lookup and insertion per event and stream). */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <event2/event.h>
#include <xxhash.h>

#include "announce.h"
#include "hold.h"
#include "log.h"
#include "settings.h"

/* uthash: a failed allocation must not exit the server. */
static int hash_oom;
#define HASH_NONFATAL_OOM 1
#define uthash_nonfatal_oom(obj) do { (void)(obj); hash_oom = 1; } while (0)
#include <uthash.h>

#define HOLD_BATCH    128   /* keys re-checked per timer turn at most */
#define FREE_KEY_MAX  1024  /* recycled key objects kept */
#define BUSY_TICK_MS  10    /* next turn when more keys are due */
#define ANN_SLOTS     4096  /* recent announcements, by key hash */
#define RETRY_MAX     4     /* failed reads of a change retried, in a row */
#define RETRY_BASE_MS 20    /* the first retry's delay, doubling */

TAILQ_HEAD(fp_hkey_queue, fp_hkey);
SLIST_HEAD(fp_hkey_free, fp_hkey);

struct fp_hkey {
    UT_hash_handle hh;
    struct fp_hold *ho;
    struct fp_held_list holders;
    size_t nholders;
    int reading;                /* a cache read is in flight */
    int again;                  /* ... and another is wanted after it */
    int retry;                  /* the next read is a failed one's retry */
    unsigned retries;           /* failed reads since the last answer */
    enum fp_stat_wake cause, again_cause;
    uint64_t checked_ms;        /* when its last read started */
    /* Publish times (Unix ms, 0: unknown) for the metric: the earliest of
     * the announcements no read has started after yet, and the one the
     * read in flight answers for. */
    uint64_t pub_ms, read_pub_ms;
    TAILQ_ENTRY(fp_hkey) qlink;   /* the re-check queue */
    SLIST_ENTRY(fp_hkey) free_link;
    size_t keylen;
    char key[FP_MAX_KEY_LEN + 1];
};

/* The latest announcement whose key hashed to this slot. */
struct ann_slot {
    uint64_t seq;               /* its number (fp_hold_seq), 0: none yet */
    uint64_t hash;              /* XXH3-64 of its key */
    uint64_t pub_ms;            /* its publish time, 0: unknown */
};

struct fp_hold {
    struct event_base *base;
    const struct fp_settings *s;
    struct fp_cache *cache;
    struct fp_announce *sub;
    fp_hold_release *release;
    void *arg;
    /* Always in the table, under the empty key (no poll has one): uthash
     * frees its table with the last item and allocates it with the next. */
    struct fp_hkey sentinel;
    struct fp_hkey *table;
    struct fp_hkey_queue queue; /* FIFO by last read; retries at the front */
    struct fp_hkey_free free_list;
    size_t nfree, held;
    struct event *tick;
    int tick_armed;
    uint64_t tick_due_ms;       /* when the armed tick fires */
    uint64_t ann_seq;           /* announcements so far */
    struct ann_slot ann[ANN_SLOTS];
};

static uint64_t now_ms(struct fp_hold *ho)
{
    struct timeval tv;

    if (event_base_gettimeofday_cached(ho->base, &tv) != 0)
        return 0;
    return (uint64_t)tv.tv_sec * 1000u + (uint64_t)tv.tv_usec / 1000u;
}

static uint64_t wall_ms(void)
{
    struct timespec ts;

    if (clock_gettime(CLOCK_REALTIME, &ts) != 0)
        return 0;
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static void arm_tick(struct fp_hold *ho, uint64_t in_ms)
{
    struct timeval tv;

    if (ho->tick_armed)
        return;
    tv.tv_sec = (time_t)(in_ms / 1000);
    tv.tv_usec = (suseconds_t)(in_ms % 1000) * 1000;
    if (evtimer_add(ho->tick, &tv) != 0) {
        fp_log(FP_LOG_ERROR, "hold: cannot arm the re-check timer");
        return;
    }
    ho->tick_armed = 1;
    ho->tick_due_ms = now_ms(ho) + in_ms;
}

/* Frees k if nothing needs it any more. */
static void key_release(struct fp_hkey *k)
{
    struct fp_hold *ho = k->ho;

    if (k->nholders > 0 || k->reading)
        return;
    HASH_DEL(ho->table, k);
    TAILQ_REMOVE(&ho->queue, k, qlink);
    if (ho->nfree < FREE_KEY_MAX) {
        SLIST_INSERT_HEAD(&ho->free_list, k, free_link);
        ho->nfree++;
    } else {
        free(k);
    }
}

static void read_key(struct fp_hkey *k, enum fp_stat_wake cause);
static uint64_t recheck_period(const struct fp_hold *ho);

/* Reads k again in_ms from now, through the re-check timer (never from
 * inside the failed read's callback: the cache may be closing). */
static void retry_later(struct fp_hkey *k, uint64_t in_ms)
{
    struct fp_hold *ho = k->ho;
    uint64_t now = now_ms(ho), period = recheck_period(ho);

    k->retry = 1;
    /* Due when checked_ms + period <= now. */
    k->checked_ms = now + in_ms >= period ? now + in_ms - period : 0;
    TAILQ_REMOVE(&ho->queue, k, qlink);
    TAILQ_INSERT_HEAD(&ho->queue, k, qlink);
    if (ho->tick_armed && ho->tick_due_ms > now + in_ms &&
        event_del(ho->tick) == 0)
        ho->tick_armed = 0;
    arm_tick(ho, in_ms);
}

static void on_read(enum fp_cache_status st, const char *value, size_t len,
                    void *arg)
{
    struct fp_hkey *k = arg;
    struct fp_hold *ho = k->ho;
    struct fp_held_list out = LIST_HEAD_INITIALIZER(out);
    struct fp_held *hd, *next;
    uint64_t tag = 0;
    int answered = st == FP_CACHE_HIT || st == FP_CACHE_MISS;
    int for_change = k->again || k->cause == FP_STAT_WAKE_ANNOUNCEMENT;
    /* The change may be there and the cache cannot say: the app can. */
    int give_up = !answered && for_change && k->retries >= RETRY_MAX;

    /* k->reading stays set until the end: k must outlive the releases. */
    if (answered || give_up) {
        if (st == FP_CACHE_HIT)
            tag = fp_etag_of(value, len);
        /* Detach every poll whose answer changed (but those with `keep`),
         * then release them: a release may answer and close its
         * connection, never touch k. A set's other keys are elsewhere (one
         * holder per key), never `next`. */
        for (hd = LIST_FIRST(&k->holders); hd != NULL; hd = next) {
            next = LIST_NEXT(hd, link);
            if (st == FP_CACHE_HIT && fp_inm_match(hd->inm, tag))
                continue;
            if (!hd->keep && hd->set != NULL)
                fp_hold_remove_set(hd->set);
            else if (!hd->keep)
                fp_hold_remove(hd);
            LIST_INSERT_HEAD(&out, hd, olink);
        }
    }
    while ((hd = LIST_FIRST(&out)) != NULL) {
        LIST_REMOVE(hd, olink);
        if (hd->set != NULL) {
            /* It composes its answer with this read's value, and times
             * it itself. */
            hd->set->changed(hd, st, value, len, k->cause,
                             st == FP_CACHE_HIT ? k->read_pub_ms : 0);
            continue;
        }
        ho->release(hd, st, value, len, tag, k->cause, ho->arg);
        /* Timed once its answer is handed to the socket. */
        if (st == FP_CACHE_HIT && k->read_pub_ms != 0)
            fp_stat_delivered(k->read_pub_ms, wall_ms());
    }
    if (answered || give_up) {
        k->retries = 0;
    } else if (k->read_pub_ms != 0 &&
               (k->pub_ms == 0 || k->read_pub_ms < k->pub_ms)) {
        k->pub_ms = k->read_pub_ms; /* not delivered: the next read's */
    }
    k->read_pub_ms = 0;
    k->reading = 0;
    if (k->nholders > 0 && !answered && for_change && !give_up) {
        /* Failed, or timed out (the answer may be late only, as when the
         * cache path is slowed near the timeout), reading for a change:
         * after RETRY_MAX its polls were released above. */
        k->again = 0;
        retry_later(k, (uint64_t)RETRY_BASE_MS << k->retries++);
        return;
    }
    if (k->again && k->nholders > 0 && answered) {
        k->again = 0;
        read_key(k, k->again_cause);
        return;
    }
    k->again = 0;
    key_release(k);
}

static void read_key(struct fp_hkey *k, enum fp_stat_wake cause)
{
    struct fp_hold *ho = k->ho;

    if (k->reading) {
        if (!k->again || cause == FP_STAT_WAKE_ANNOUNCEMENT)
            k->again_cause = cause;
        k->again = 1;
        return;
    }
    k->cause = cause;
    k->retry = 0;
    k->checked_ms = now_ms(ho);
    TAILQ_REMOVE(&ho->queue, k, qlink);
    TAILQ_INSERT_TAIL(&ho->queue, k, qlink);
    if (fp_cache_get(ho->cache, k->key, k->keylen, on_read, k) != 0) {
        fp_log(FP_LOG_DEBUG, "hold: cannot read %s again", k->key);
        return;
    }
    k->reading = 1;
    k->read_pub_ms = k->pub_ms;
    k->pub_ms = 0;
}

/* While subscribed, only an announcement lost without a disconnect (an app
 * that died between its write and its publish) needs the re-check. */
static uint64_t recheck_period(const struct fp_hold *ho)
{
    return fp_announce_subscribed(ho->sub) ? ho->s->recheck_subscribed_ms
                                           : ho->s->recheck_ms;
}

/* The re-check: the keys not read for a period, oldest first, at most
 * HOLD_BATCH per turn. */
static void on_tick(evutil_socket_t fd, short what, void *arg)
{
    struct fp_hold *ho = arg;
    uint64_t now = now_ms(ho), period = recheck_period(ho);
    struct fp_hkey *k;
    unsigned n = 0;

    (void)fd;
    (void)what;
    ho->tick_armed = 0;
    while ((k = TAILQ_FIRST(&ho->queue)) != NULL && n < HOLD_BATCH &&
           k->checked_ms + period <= now) {
        if (k->reading) {       /* its answer is on the way: requeue */
            TAILQ_REMOVE(&ho->queue, k, qlink);
            TAILQ_INSERT_TAIL(&ho->queue, k, qlink);
            k->checked_ms = now;
        } else {
            read_key(k, k->retry ? FP_STAT_WAKE_ANNOUNCEMENT
                                 : FP_STAT_WAKE_RECHECK);
        }
        n++;
    }
    if ((k = TAILQ_FIRST(&ho->queue)) == NULL)
        return;
    if (k->checked_ms + period <= now)
        arm_tick(ho, BUSY_TICK_MS);
    else
        arm_tick(ho, k->checked_ms + period - now);
}

/* Subscribed (again): every held key is read, batched by the timer.
 * Unsubscribed: the timer is re-armed for the shorter period. */
static void on_subscription(void *arg, int subscribed)
{
    struct fp_hold *ho = arg;
    struct fp_hkey *k;

    /* Not TAILQ_FOREACH: make lint's cppcheck cannot expand it. */
    if (subscribed)
        for (k = TAILQ_FIRST(&ho->queue); k != NULL; k = TAILQ_NEXT(k, qlink))
            k->checked_ms = 0;
    if (!TAILQ_EMPTY(&ho->queue)) {
        if (ho->tick_armed && event_del(ho->tick) == 0)
            ho->tick_armed = 0;
        arm_tick(ho, 0);
    }
}

static void on_message(void *arg, const char *key, size_t len,
                       uint64_t published_ms)
{
    fp_hold_announced(arg, key, len, published_ms);
}

struct fp_hold *fp_hold_new(struct event_base *base,
                            const struct fp_settings *s,
                            struct fp_cache *cache,
                            fp_hold_release *release, void *arg)
{
    struct fp_hold *ho = calloc(1, sizeof(*ho));

    if (ho == NULL)
        return NULL;
    ho->base = base;
    ho->s = s;
    ho->cache = cache;
    ho->release = release;
    ho->arg = arg;
    TAILQ_INIT(&ho->queue);
    ho->sentinel.ho = ho;
    hash_oom = 0;
    HASH_ADD(hh, ho->table, key, 0, &ho->sentinel);
    if (hash_oom) {
        free(ho);
        return NULL;
    }
    if ((ho->tick = evtimer_new(base, on_tick, ho)) == NULL ||
        fp_announce_new(base, s, on_message, on_subscription, ho, &ho->sub) != 0) {
        fp_hold_free(ho);
        return NULL;
    }
    return ho;
}

uint64_t fp_hold_seq(const struct fp_hold *ho)
{
    return ho->ann_seq;
}

/* Links hd into (d 1) or out of (d -1) its set's list of held keys.
 * Returns 1 if the held polls' count moves: always for a poll on one key,
 * at a set's first key in and its last key out. */
static int hold_counts(struct fp_held *hd, int d)
{
    struct fp_held_set *set = hd->set;

    if (set == NULL)
        return 1;
    if (d > 0) {
        LIST_INSERT_HEAD(&set->held, hd, slink);
        return set->nheld++ == 0;
    }
    LIST_REMOVE(hd, slink);
    return --set->nheld == 0;
}

int fp_hold_add(struct fp_hold *ho, const char *key, size_t keylen,
                struct fp_held *hd, uint64_t since)
{
    struct fp_hkey *k;
    uint64_t h;
    const struct ann_slot *a;

    if ((hd->set == NULL || hd->set->nheld == 0) &&
        ho->held >= ho->s->max_held)
        return -1;
    if (keylen > FP_MAX_KEY_LEN)
        return -1;
    HASH_FIND(hh, ho->table, key, keylen, k);
    if (k == NULL) {
        if ((k = SLIST_FIRST(&ho->free_list)) != NULL) {
            SLIST_REMOVE_HEAD(&ho->free_list, free_link);
            ho->nfree--;
        } else if ((k = malloc(sizeof(*k))) == NULL) {
            return -1;
        }
        memset(k, 0, sizeof(*k));
        k->ho = ho;
        memcpy(k->key, key, keylen);
        k->key[keylen] = '\0';
        k->keylen = keylen;
        /* The poll's own read just ended: the next is the re-check's. */
        k->checked_ms = now_ms(ho);
        hash_oom = 0;
        HASH_ADD(hh, ho->table, key, k->keylen, k);
        if (hash_oom) {
            free(k);
            return -1;
        }
        TAILQ_INSERT_TAIL(&ho->queue, k, qlink);
        arm_tick(ho, recheck_period(ho));
    }
    LIST_INSERT_HEAD(&k->holders, hd, link);
    k->nholders++;
    hd->key = k;
    if (hold_counts(hd, 1)) {
        ho->held++;
        fp_stat_held(1);
    }
    /* Announced since the poll's read started: the answer it is held on
     * may be from before the write. Read the key again now (one more read
     * if one is in flight already), as the announcement would have. */
    h = (uint64_t)XXH3_64bits(key, keylen);
    a = &ho->ann[h % ANN_SLOTS];
    if (a->seq > since) {
        if (a->hash == h && a->pub_ms != 0 &&
            (k->pub_ms == 0 || a->pub_ms < k->pub_ms))
            k->pub_ms = a->pub_ms;
        read_key(k, FP_STAT_WAKE_ANNOUNCEMENT);
    }
    return 0;
}

void fp_hold_remove(struct fp_held *hd)
{
    struct fp_hkey *k = hd->key;

    if (hd->set != NULL && hd->set->handle == hd) {
        hd->set->ended(hd->set);
        return;
    }
    if (k == NULL)
        return;
    LIST_REMOVE(hd, link);
    hd->key = NULL;
    k->nholders--;
    if (hold_counts(hd, -1)) {
        k->ho->held--;
        fp_stat_held(-1);
    }
    key_release(k);
}

void fp_hold_remove_set(struct fp_held_set *set)
{
    struct fp_held *hd;

    while ((hd = LIST_FIRST(&set->held)) != NULL)
        fp_hold_remove(hd);
}

size_t fp_hold_count(const struct fp_hold *ho)
{
    return ho->held;
}

void fp_hold_announced(struct fp_hold *ho, const char *key, size_t len,
                       uint64_t published_ms)
{
    struct fp_hkey *k;
    struct ann_slot *a;
    uint64_t h;

    if (len == 0 || len > FP_MAX_KEY_LEN)
        return;
    /* Noted before anything else: a poll whose read is in flight may be
     * held on this key later (fp_hold_add). */
    h = (uint64_t)XXH3_64bits(key, len);
    a = &ho->ann[h % ANN_SLOTS];
    a->seq = ++ho->ann_seq;
    a->hash = h;
    a->pub_ms = published_ms;
    HASH_FIND(hh, ho->table, key, len, k);
    if (k == NULL || k->nholders == 0)
        return;
    if (published_ms != 0 && (k->pub_ms == 0 || published_ms < k->pub_ms))
        k->pub_ms = published_ms;
    read_key(k, FP_STAT_WAKE_ANNOUNCEMENT);
}

void fp_hold_free(struct fp_hold *ho)
{
    struct fp_hkey *k;

    if (ho == NULL)
        return;
    fp_announce_free(ho->sub);
    if (ho->tick != NULL)
        event_free(ho->tick);
    if (ho->table != NULL)
        HASH_DELETE(hh, ho->table, &ho->sentinel);
    if (ho->table != NULL) {
        /* A caller bug (hold.h): their reads' callbacks may still come,
         * so leak them rather than free. */
        fp_log(FP_LOG_ERROR, "hold: freed with %u keys held (%zu polls)",
               HASH_COUNT(ho->table), ho->held);
        HASH_CLEAR(hh, ho->table);
    }
    while ((k = SLIST_FIRST(&ho->free_list)) != NULL) {
        SLIST_REMOVE_HEAD(&ho->free_list, free_link);
        free(k);
    }
    free(ho);
}

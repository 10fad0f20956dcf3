/* hold.h -- long polls held until their answer changes (docs/api.md,
 * "`wait`: long polls").
 *
 * Held polls are grouped by key: one entry per key however many polls wait
 * on it, and one cache read at a time per key. A key is read again when an
 * announcement names it (announce.c), and at the latest every
 * [server] recheck_ms, or recheck_subscribed_ms while subscribed (a lost
 * announcement), in batches of at most HOLD_BATCH keys per timer turn; all
 * of them at once after every (re)subscription. A read for an announced
 * change that fails or times out is tried again soon, a few times (hold.c),
 * then the key's polls are released with that failure (the app answers).
 * A read whose answer differs from a poll's If-None-Match releases that poll
 * with it; the others keep waiting. The caller ends a poll's wait itself
 * (its timer, its client gone, a drain) with fp_hold_remove. */
#ifndef FP_HOLD_H
#define FP_HOLD_H

#include <stddef.h>
#include <stdint.h>
#include <sys/queue.h>

#include "cache.h"
#include "etag.h"
#include "stats.h"

struct event_base;
struct fp_settings;
struct fp_hkey;
struct fp_hold;

struct fp_held_set;

LIST_HEAD(fp_held_list, fp_held);

/* Embedded in the caller's request; owned by the caller. */
struct fp_held {
    LIST_ENTRY(fp_held) link;   /* its key's holders */
    struct fp_hkey *key;        /* NULL when not held */
    const struct fp_inm *inm;   /* the poll's If-None-Match */
    /* One key of a poll held on several (struct fp_held_set), or NULL. */
    struct fp_held_set *set;
    LIST_ENTRY(fp_held) slink;  /* the set's keys held now */
    /* Set by the caller (a stream's watch, which would be added again at
     * once): a change leaves hd held (a set: all its keys), and the
     * callback either updates its inm's tag in place or lets go of it. */
    int keep;
    LIST_ENTRY(fp_held) olink;  /* a read's list of changed holders */
};

/* A poll held on several keys (a channel poll, chpoll.c): one fp_held per
 * key, each with an inm that matches its key's answer as the poll read it,
 * all with `set` pointing here; counted as one held poll. One watch per
 * key, shared with every other poll on it. When a read of one of its keys
 * finds another answer (or none, or a change could not be read), every key
 * of the set is removed (none if its fp_held has `keep`) and changed() is
 * called once, with that key's fp_held (hd->set: the set) and the read's
 * result (st FP_CACHE_HIT: value, len, valid during the call only;
 * FP_CACHE_MISS: the key is gone; FP_CACHE_ERROR or FP_CACHE_TIMEOUT: the
 * read failed).
 * `handle` is the poll's own fp_held (its connection's, never held on a
 * key): fp_hold_remove(handle), as a connection that closes calls it, calls
 * ended(), which lets go of the whole poll. */
struct fp_held_set {
    struct fp_held *handle;
    struct fp_held_list held;   /* its keys held now, through slink */
    size_t nheld;
    void (*changed)(struct fp_held *hd, enum fp_cache_status st,
                    const char *value, size_t len, enum fp_stat_wake cause,
                    uint64_t published_ms);
    void (*ended)(struct fp_held_set *set);
};

/* A held poll's answer changed: it is already removed, unless hd->keep. st
 * is FP_CACHE_HIT (value, len, tag: the new answer), FP_CACHE_MISS (the key
 * is gone: the app answers), or FP_CACHE_ERROR / FP_CACHE_TIMEOUT (a change
 * could not be read: the app answers). Called from the loop, never from
 * inside fp_hold_*. */
typedef void fp_hold_release(struct fp_held *hd, enum fp_cache_status st,
                             const char *value, size_t len, uint64_t tag,
                             enum fp_stat_wake cause, void *arg);

/* Also starts the subscriber (announce.c). NULL if out of memory. */
struct fp_hold *fp_hold_new(struct event_base *base,
                            const struct fp_settings *s,
                            struct fp_cache *cache,
                            fp_hold_release *release, void *arg);

/* Announcements received so far: read it before a poll's cache read
 * starts, and pass it to fp_hold_add. */
uint64_t fp_hold_seq(const struct fp_hold *ho);

/* Holds hd (hd->inm and hd->set set by the caller) on key. `since` is fp_hold_seq()
 * from before the read that found the poll's answer unchanged: if key was
 * announced after it, that answer may be older than the write, and the key
 * is read again at once. Returns 0, or -1 if [server] max_held polls are
 * held already, or out of memory: then answer the poll at once. Each key
 * of a set is added with its own call (max_held is checked at its first). */
int fp_hold_add(struct fp_hold *ho, const char *key, size_t keylen,
                struct fp_held *hd, uint64_t since);

/* Stops holding hd; a no-op if it is not held. hd a set's handle: calls
 * the set's ended(). */
void fp_hold_remove(struct fp_held *hd);

/* Stops holding every key of set (ended() is not called). */
void fp_hold_remove_set(struct fp_held_set *set);

/* Polls held now. */
size_t fp_hold_count(const struct fp_hold *ho);

/* An announcement of key (any bytes): a held key is read again. Its polls
 * answered with a new body by that read are timed against published_ms
 * (Unix ms; 0: not known) in fastpoll_publish_to_delivery_seconds. */
void fp_hold_announced(struct fp_hold *ho, const char *key, size_t len,
                       uint64_t published_ms);

/* Closes the subscriber. Free the cache first (its pending reads are
 * answered then) and remove every held poll. */
void fp_hold_free(struct fp_hold *ho);

#endif

/* chpoll.c -- polls with channels (chpoll.h, docs/channels.md).
 *
 * A poll with channels is a struct fp_chpoll: one part per key (the user's
 * first, then each channel's in the URL's order), each with the waiter of
 * its read, the value read, and its watch (an fp_held of the
 * poll's hold set) while the poll is held. Its life:
 *
 *   dispatch: parts read  --all in-->  200 / 304 / 404 / 503, or held
 *   held: a key's watch reads another answer  -->  composed with it, or
 *         (the key gone) parts read again
 *   held: the wait ends, or a drain  -->  304
 *   a stream: an event per change, its watches kept up throughout (keep)
 *   the client goes away (any time)  -->  abandon() -> fp_hold_remove
 *       (&r->held) -> ended(): the waiters detached, the watches removed
 *
 * The parts' values are copied as they come (a value is valid only during
 * its callback; one copy for all the parts that read the same bytes of a
 * key, struct value) and kept while the poll is held if they are CH_KEEP_MAX
 * bytes at most in all: when a watch's read finds a key changed, the
 * answer is composed from that read's value and the other parts as the
 * poll read them, without reading them again (larger parts are freed, and
 * read again, so that a held poll's memory stays bounded). That
 * answer is no older than any write that returned before the poll was sent
 * (every part was read after that, api.md's rule 1), and a part's own
 * change still wakes the poll, or the next poll, through its key's watch.
 * A room's message is thus one read of the room's key for all its held
 * members, not one read per member of their own key. */
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "channels.h"
#include "chpoll.h"
#include "coalesce.h"
#include "etag.h"
#include "log.h"
#include "longpoll.h"
#include "settings.h"
#include "sign.h"
#include "stream.h"

/* uthash: a failed allocation must not exit the server. */
static int hash_oom;
#define HASH_NONFATAL_OOM 1
#define uthash_nonfatal_oom(obj) do { (void)(obj); hash_oom = 1; } while (0)
#include <uthash.h>

/* A part's value over this is taken for a cache failure (as memcached's
 * client skips a value over 1 MB), and a composed answer over CH_BODY_MAX
 * too: the app answers such a poll. */
#define CH_PART_MAX (1024UL * 1024UL)
#define CH_BODY_MAX (8UL * 1024UL * 1024UL)
/* A held poll keeps its parts' values if they are this much at most in all
 * (about what a held poll costs the poll server anyway); else it reads
 * them again when woken. */
#define CH_KEEP_MAX 4096UL
/* A composed answer up to this is composed on the stack, not malloc'd. */
#define CH_SMALL_BODY 4096

struct fp_chpoll;

/* A part's value, one copy for every part that read the same bytes of the
 * same key (a room's held members share the room's), counted; while held,
 * it is in its poller's table under its key, the newest read of that key
 * (a part that reads other bytes makes a new one, the old one leaves the
 * table and lives on in the parts that hold it). */
struct value {
    UT_hash_handle hh;
    size_t refs;                /* parts holding it */
    int in_table;
    uint64_t tag;               /* fp_etag_of(bytes, len) */
    size_t len, keylen;
    char *key;                  /* after bytes */
    char bytes[];
};

struct part {
    struct fp_waiter w;         /* first: the coalescer's handle */
    struct fp_chpoll *p;
    struct fp_held held;        /* its key's watch while the poll is held */
    struct fp_inm inm;          /* ... matching the part as last read */
    const char *key;            /* in the poll's key bytes */
    size_t keylen;
    const char *name;           /* a channel's name (in key), or NULL */
    size_t nlen;
    enum fp_cache_status st;    /* the last read's */
    uint64_t seq;               /* fp_hold_seq before that read: an
                                 * announcement after it reads it again */
    struct value *v;            /* its value (NULL: empty), until answered */
    size_t len;
};

struct fp_chpoll {
    struct fp_held_set set;
    struct fp_chpolls *cp;
    struct fp_request *r;
    uint64_t pub_ms;            /* the waking publish's time, 0: unknown */
    size_t nparts, reading;     /* parts; reads still out */
    int was_held;               /* held once: its answer ends a wait */
    int kept;                   /* held with every part's value kept */
    int expired;                /* the wait ended while the parts were read */
    enum fp_stat_wake cause;    /* what woke it, or ended its wait */
    struct part parts[];        /* then the keys' bytes */
};

struct fp_chpolls {
    struct fp_coalesce *co;
    struct fp_hold *ho;
    const struct fp_settings *s;
    const struct fp_request *pending; /* fp_chpoll_start's, until its
                                       * dispatch */
    struct fp_ch ch;            /* ... and its channels */
    struct value *values;       /* uthash head: struct value by key */
};

static void on_part(struct fp_waiter *w, enum fp_cache_status st,
                    const char *value, size_t len, void *arg);

struct fp_chpolls *fp_chpolls_new(struct fp_cache *cache, struct fp_hold *ho,
                                  const struct fp_settings *s)
{
    struct fp_chpolls *cp = calloc(1, sizeof(*cp));

    if (cp == NULL)
        return NULL;
    if ((cp->co = fp_coalesce_new(cache, on_part, cp)) == NULL) {
        free(cp);
        return NULL;
    }
    cp->ho = ho;
    cp->s = s;
    return cp;
}

void fp_chpolls_free(struct fp_chpolls *cp)
{
    struct value *v, *tmp;

    if (cp == NULL)
        return;
    fp_coalesce_free(cp->co);
    /* None once every poll is gone; any other is its parts' to free. */
    HASH_ITER(hh, cp->values, v, tmp)
        v->in_table = 0;
    HASH_CLEAR(hh, cp->values);
    free(cp);
}

/* The value (len > 0 bytes) a part read of key: the table's if it has the
 * same bytes, else a new one, which the table then holds. NULL if out of
 * memory. */
static struct value *value_get(struct fp_chpolls *cp, const char *key,
                               size_t keylen, const char *bytes, size_t len)
{
    struct value *v, *old;

    HASH_FIND(hh, cp->values, key, keylen, old);
    if (old != NULL && old->len == len && memcmp(old->bytes, bytes, len) == 0) {
        old->refs++;
        return old;
    }
    if ((v = malloc(sizeof(*v) + len + keylen)) == NULL)
        return NULL;
    memcpy(v->bytes, bytes, len);
    v->key = v->bytes + len;
    memcpy(v->key, key, keylen);
    v->len = len;
    v->keylen = keylen;
    v->tag = fp_etag_of(bytes, len);
    v->refs = 1;
    v->in_table = 0;
    if (old != NULL) {
        HASH_DEL(cp->values, old);
        old->in_table = 0;
    }
    hash_oom = 0;
    HASH_ADD_KEYPTR(hh, cp->values, v->key, keylen, v);
    v->in_table = !hash_oom; /* not in it: shared by no later read */
    return v;
}

static void value_put(struct fp_chpolls *cp, struct value *v)
{
    if (v == NULL || --v->refs > 0)
        return;
    if (v->in_table && cp->values != NULL) /* in_table: there is a table */
        HASH_DEL(cp->values, v);
    free(v);
}

void fp_chpolls_fail_all(struct fp_chpolls *cp, enum fp_cache_status status)
{
    fp_coalesce_fail_all(cp->co, status);
}

void fp_chpolls_coalesce_stats(const struct fp_chpolls *cp,
                               struct fp_coalesce_stats *out)
{
    struct fp_coalesce_stats st;

    fp_coalesce_stats(cp->co, &st);
    out->gets += st.gets;
    out->requests += st.requests;
    out->keys += st.keys;
    out->waiting += st.waiting;
}

static void log_target(const char *what, const struct fp_http_head *hd)
{
    fp_log(FP_LOG_DEBUG, "http: %s: %.*s", what,
           (int)(hd->target_len > 200 ? 200 : hd->target_len), hd->target);
}

int fp_chpoll_start(struct fp_chpolls *cp, struct fp_request *r,
                    const struct fp_http_head *hd, ssize_t keylen,
                    const struct fp_signer *signer, long long now,
                    enum fp_stat_outcome *outcome)
{
    int rc;

    cp->pending = NULL;
    rc = fp_ch_parse(hd->target, hd->target_len, cp->s->channels_max, &cp->ch);
    if (rc == FP_CH_NONE)
        return 0;
    /* The signature covers the key and the decoded ch: a refused ch the
     * app signed (a larger [channels] max there) goes to the app. */
    if (signer != NULL &&
        (keylen < 0 || cp->ch.len == 0 ||
         fp_sign_check_ch(signer, hd->target, hd->target_len, r->key,
                          (size_t)keylen, cp->ch.value, cp->ch.len, now) != 0)) {
        log_target("no valid signature of key and ch", hd);
        *outcome = FP_STAT_FORBIDDEN;
        return 403;
    }
    /* Never sent to a cache: the app says what is wrong (400). nginx sends
     * no body; one from elsewhere would outlive the parsed ch. */
    if (keylen < 0 || rc != FP_CH_OK || r->c.chunked || r->c.body_left > 0) {
        log_target(rc != FP_CH_OK ? fp_ch_strerror(rc) : "no key", hd);
        *outcome = FP_STAT_INVALID_KEY;
        return 404;
    }
    cp->pending = r;
    return FP_CHPOLL_OK;
}

int fp_chpoll_pending(struct fp_chpolls *cp, const struct fp_request *r)
{
    int is = cp->pending == r;

    cp->pending = NULL;
    return is;
}

int fp_chpoll_is(const struct fp_request *r)
{
    return r->held.set != NULL;
}

static struct fp_chpoll *poll_of(struct fp_held_set *set)
{
    return (struct fp_chpoll *)(void *)((char *)set -
                                        offsetof(struct fp_chpoll, set));
}

static struct part *part_of(struct fp_held *hd)
{
    return (struct part *)(void *)((char *)hd - offsetof(struct part, held));
}

static void free_values(struct fp_chpoll *p)
{
    for (size_t i = 0; i < p->nparts; i++) {
        value_put(p->cp, p->parts[i].v);
        p->parts[i].v = NULL;
        p->parts[i].len = 0;
    }
}

/* Lets go of everything p holds (reads, watches, values) and frees it. */
static void release(struct fp_chpoll *p)
{
    for (size_t i = 0; i < p->nparts; i++)
        fp_coalesce_detach(&p->parts[i].w);
    fp_hold_remove_set(&p->set);
    free_values(p);
    p->r->held.set = NULL;
    free(p);
}

/* Starts every part's read, in this turn. 0, or -1 (none is left out). */
static int read_parts(struct fp_chpoll *p)
{
    struct fp_chpolls *cp = p->cp;
    uint64_t since = fp_hold_seq(cp->ho);

    for (size_t i = 0; i < p->nparts; i++) {
        struct part *pt = &p->parts[i];

        pt->seq = since;
        if (fp_coalesce_get(cp->co, pt->key, pt->keylen, &pt->w) < 0) {
            fp_log(FP_LOG_DEBUG, "http: cache get failed for %s", pt->key);
            for (size_t j = 0; j < i; j++)
                fp_coalesce_detach(&p->parts[j].w);
            p->reading = 0;
            return -1;
        }
    }
    p->reading = p->nparts;
    return 0;
}

/* Answers p's poll and frees p (body stays the caller's). */
static void answer(struct fp_chpoll *p, int code, enum fp_stat_outcome outcome,
                   const char *body, size_t len)
{
    struct fp_request *r = p->r;
    uint64_t pub_ms = p->pub_ms;

    if (p->was_held) {
        fp_stat_wake(p->cause);
        r->ans.pace_ms = fp_longpoll_held_pace(r);
    }
    fp_stat_request(r->method, outcome);
    release(p);
    conn_finish(&r->c, code, body, len,
                code == 200 || code == 304 ? &r->ans : NULL);
    if (code == 200 && pub_ms != 0) {
        struct timespec ts;

        if (clock_gettime(CLOCK_REALTIME, &ts) == 0)
            fp_stat_delivered(pub_ms, (uint64_t)ts.tv_sec * 1000u +
                                      (uint64_t)ts.tv_nsec / 1000000u);
    }
}

/* A part missed or could not be read: a poll goes to the app (404, 503);
 * a stream ends, and its client's reconnect does. */
static void fail(struct fp_chpoll *p, int code, enum fp_stat_outcome outcome)
{
    struct fp_request *r = p->r;

    if (r->streaming) {
        release(p);
        fp_stream_end(r, FP_STAT_STREAM_CACHE);
        return;
    }
    answer(p, code, outcome, NULL, 0);
}

/* Holds p on every part's key, each watch matching its part as read (a
 * watch still up, a stream's, is updated in place). 0, or -1 (max_held
 * polls held, out of memory): none is held. */
static int hold(struct fp_chpoll *p)
{
    for (size_t i = 0; i < p->nparts; i++) {
        struct part *pt = &p->parts[i];

        memset(&pt->inm, 0, sizeof(pt->inm));
        pt->inm.ntags = 1;
        pt->inm.tags[0] = pt->v != NULL ? pt->v->tag : fp_etag_of("", 0);
        if (pt->held.key != NULL)
            continue;
        if (fp_hold_add(p->cp->ho, pt->key, pt->keylen, &pt->held, pt->seq) != 0) {
            fp_hold_remove_set(&p->set);
            return -1;
        }
    }
    return 0;
}

/* A stream's parts are in, composed into body: its first event (the
 * stream starts) or the next, then it is held on them again. */
static void stream_parts(struct fp_chpoll *p, const char *body, size_t len,
                         size_t total)
{
    struct fp_request *r = p->r;
    uint64_t tag = fp_etag_of(body, len), pub_ms = p->pub_ms;
    int rc;

    if (!r->streaming) {
        if ((rc = fp_stream_open(r, body, len, tag)) <= 0) {
            if (rc == 0)
                release(p);
            return; /* rc < 0: gone, p with it */
        }
    } else if (fp_stream_send(r, body, len, tag) != 0) {
        return; /* gone, p with it */
    }
    p->was_held = 0;
    p->pub_ms = 0;
    if (hold(p) != 0) {
        fp_stat_over_cap();
        release(p);
        fp_stream_end(r, FP_STAT_STREAM_OVER_CAP);
        return;
    }
    p->kept = total <= CH_KEEP_MAX;
    if (!p->kept)
        free_values(p);
    if (pub_ms != 0) {
        struct timespec ts;

        if (clock_gettime(CLOCK_REALTIME, &ts) == 0)
            fp_stat_delivered(pub_ms, (uint64_t)ts.tv_sec * 1000u +
                                      (uint64_t)ts.tv_nsec / 1000000u);
    }
}

/* Every part is in: the composed answer, or the fallback. */
static void parts_in(struct fp_chpoll *p)
{
    struct fp_ch_part user, chans[FP_MAX_CHANNELS];
    enum fp_cache_status failed = FP_CACHE_HIT;
    size_t len, total = 0;
    char small[CH_SMALL_BODY], *body;
    int code;

    for (size_t i = 0; i < p->nparts; i++) {
        enum fp_cache_status st = p->parts[i].st;

        /* A miss wins: the app answers and fills the parts it lacks. */
        if (st == FP_CACHE_MISS || (st != FP_CACHE_HIT && failed == FP_CACHE_HIT))
            failed = st;
        total += p->parts[i].len;
    }
    if (failed == FP_CACHE_HIT && total > CH_BODY_MAX) {
        fp_log(FP_LOG_WARN, "http: a poll's %zu parts are %zu bytes: the app "
               "answers it", p->nparts, total);
        failed = FP_CACHE_ERROR;
    }
    if (failed == FP_CACHE_MISS) {
        fail(p, 404, FP_STAT_MISS);
        return;
    }
    if (failed != FP_CACHE_HIT) {
        fail(p, 503, failed == FP_CACHE_TIMEOUT ? FP_STAT_TIMEOUT
                                                : FP_STAT_BACKEND_ERROR);
        return;
    }
    user.name = NULL;
    user.nlen = 0;
    user.value = p->parts[0].v != NULL ? p->parts[0].v->bytes : NULL;
    user.len = p->parts[0].len;
    for (size_t i = 1; i < p->nparts; i++) {
        chans[i - 1].name = p->parts[i].name;
        chans[i - 1].nlen = p->parts[i].nlen;
        chans[i - 1].value = p->parts[i].v != NULL ? p->parts[i].v->bytes : NULL;
        chans[i - 1].len = p->parts[i].len;
    }
    /* Composed straight into the buffer when it fits in one. */
    len = fp_ch_compose(&user, chans, p->nparts - 1, small, sizeof(small));
    if (len <= sizeof(small)) {
        body = small;
    } else if ((body = malloc(len)) != NULL) {
        (void)fp_ch_compose(&user, chans, p->nparts - 1, body, len);
    } else {
        fp_log(FP_LOG_ERROR, "http: out of memory composing an answer");
        fail(p, 503, FP_STAT_BACKEND_ERROR);
        return;
    }
    if (p->r->stream) {
        stream_parts(p, body, len, total);
    } else if ((code = fp_longpoll_tagged(p->r, fp_etag_of(body, len))) == 0 &&
               !p->expired && hold(p) == 0) {
        p->kept = total <= CH_KEEP_MAX;
        if (!p->kept)
            free_values(p);
        /* still HELD, its timer armed */
    } else {
        if (code == 0 && !p->expired) {
            fp_stat_over_cap();
            fp_log(FP_LOG_DEBUG, "http: %zu polls held: answering at once",
                   fp_hold_count(p->cp->ho));
        }
        if (code != 200)
            answer(p, 304, FP_STAT_NOT_MODIFIED, NULL, 0);
        else
            answer(p, 200, FP_STAT_HIT, body, len);
    }
    if (body != small)
        free(body);
}

/* The coalescer's delivery of one part's read. */
static void on_part(struct fp_waiter *w, enum fp_cache_status st,
                    const char *value, size_t len, void *arg)
{
    struct part *pt = (struct part *)(void *)w;
    struct fp_chpoll *p = pt->p;

    (void)arg;
    pt->st = st;
    value_put(p->cp, pt->v);
    pt->v = NULL;
    pt->len = 0;
    if (st == FP_CACHE_HIT && len > CH_PART_MAX) {
        fp_log(FP_LOG_WARN, "http: %s is %zu bytes, over %lu: the app answers",
               pt->key, len, CH_PART_MAX);
        pt->st = FP_CACHE_ERROR;
    } else if (st == FP_CACHE_HIT && len > 0) {
        if ((pt->v = value_get(p->cp, pt->key, pt->keylen, value, len)) == NULL) {
            fp_log(FP_LOG_ERROR, "http: out of memory for a part's value");
            pt->st = FP_CACHE_ERROR;
        } else {
            pt->len = len;
        }
    }
    if (--p->reading == 0)
        parts_in(p);
}

/* hold.c: hd's key changed while p was held (every watch is removed). Its
 * read's value replaces that part and the answer is composed (the top of
 * the file says why the other parts need no read); a key gone, or values
 * not kept: all parts are read again (a miss sends the poll to the app); a
 * change that could not be read: the app answers (503). */
static void on_changed(struct fp_held *hd, enum fp_cache_status st,
                       const char *value, size_t len, enum fp_stat_wake cause,
                       uint64_t published_ms)
{
    struct fp_chpoll *p = poll_of(hd->set);

    p->was_held = 1;
    p->cause = cause;
    if (published_ms != 0 && (p->pub_ms == 0 || published_ms < p->pub_ms))
        p->pub_ms = published_ms;
    if (p->r->streaming)
        fp_stat_wake(cause);
    if (st == FP_CACHE_ERROR || st == FP_CACHE_TIMEOUT) {
        fail(p, 503, st == FP_CACHE_TIMEOUT ? FP_STAT_TIMEOUT
                                            : FP_STAT_BACKEND_ERROR);
        return;
    }
    if (st == FP_CACHE_HIT && p->kept) {
        /* Its watch's read: an announcement during it is read again by
         * hold.c (`again`), so the part is held again as of now; the kept
         * ones keep their own read's number (a change announced while
         * their watches were down, for this wake, is read again; a
         * stream's stay up: nothing to miss). */
        part_of(hd)->seq = fp_hold_seq(p->cp->ho);
        p->kept = 0;
        p->reading = 1;
        on_part(&part_of(hd)->w, st, value, len, NULL); /* -> parts_in() */
        return;
    }
    fp_hold_remove_set(&p->set); /* a stream's watches, still up */
    if (read_parts(p) != 0)
        fail(p, 503, FP_STAT_BACKEND_ERROR);
}

void fp_chpoll_stream_release(struct fp_request *r)
{
    release(poll_of(r->held.set));
}

/* hold.c: the connection let go of the poll (it closes). */
static void on_ended(struct fp_held_set *set)
{
    release(poll_of(set));
}

void fp_chpoll_end(struct fp_request *r, enum fp_stat_wake cause)
{
    struct fp_chpoll *p = poll_of(r->held.set);

    p->cause = cause;
    if (p->reading > 0) {
        p->expired = 1; /* answered when its parts are in, not held */
        return;
    }
    p->was_held = 1;
    answer(p, 304, FP_STAT_NOT_MODIFIED, NULL, 0);
}

/* Sizes and fills a poll for r's key and cp->ch's channels. NULL if out
 * of memory. */
static struct fp_chpoll *poll_new(struct fp_chpolls *cp, struct fp_request *r)
{
    const char *prefix = cp->s->key_prefix;
    size_t plen = strlen(prefix), n = 1 + cp->ch.n, keybytes = r->keylen + 1;
    struct fp_chpoll *p;
    char *keys;

    for (size_t i = 0; i < cp->ch.n; i++)
        keybytes += plen + 1 + cp->ch.nlen[i] + 1;
    p = calloc(1, sizeof(*p) + n * sizeof(struct part) + keybytes);
    if (p == NULL)
        return NULL;
    p->cp = cp;
    p->r = r;
    p->nparts = n;
    p->set.handle = &r->held;
    p->set.changed = on_changed;
    p->set.ended = on_ended;
    keys = (char *)&p->parts[n];
    for (size_t i = 0; i < n; i++) {
        struct part *pt = &p->parts[i];
        ssize_t kl;

        pt->p = p;
        pt->held.set = &p->set;
        pt->held.inm = &pt->inm;
        pt->held.keep = r->stream;
        pt->key = keys;
        if (i == 0) {
            memcpy(keys, r->key, r->keylen + 1);
            kl = (ssize_t)r->keylen;
        } else {
            /* Sized above: it fits. */
            kl = fp_ch_key(prefix, cp->ch.value + cp->ch.off[i - 1],
                           cp->ch.nlen[i - 1], keys, keybytes);
            pt->name = keys + plen + 1;
            pt->nlen = cp->ch.nlen[i - 1];
        }
        pt->keylen = (size_t)kl;
        keys += (size_t)kl + 1;
        keybytes -= (size_t)kl + 1;
    }
    return p;
}

int fp_chpoll_dispatch(struct fp_chpolls *cp, struct fp_request *r)
{
    struct fp_chpoll *p = poll_new(cp, r);

    if (p == NULL) {
        fp_log(FP_LOG_ERROR, "http: out of memory for a poll with channels");
        fp_stat_request(r->method, FP_STAT_BACKEND_ERROR);
        return conn_answer(&r->c, 503, NULL, 0, NULL);
    }
    /* HELD from now (see chpoll.h): its timer is the wait, or a bound the
     * cache's timeout keeps it from reaching. No part's read is delivered
     * before the loop runs again. */
    if (read_parts(p) != 0 ||
        conn_hold(&r->c, r->wait_s > 0 ? r->wait_s * 1000u
                                       : cp->s->request_timeout_ms) != 0) {
        fp_log(FP_LOG_ERROR, "http: cannot start a poll with channels");
        for (size_t i = 0; i < p->nparts; i++)
            fp_coalesce_detach(&p->parts[i].w);
        r->held.set = NULL;
        free(p);
        fp_stat_request(r->method, FP_STAT_BACKEND_ERROR);
        return conn_answer(&r->c, 503, NULL, 0, NULL);
    }
    r->held.set = &p->set;
    fp_log(FP_LOG_DEBUG, "http: %s and %zu channels: %zu reads", r->key,
           p->nparts - 1, p->nparts);
    return 1;
}

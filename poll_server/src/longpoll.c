/* longpoll.c -- the conditional and long-poll policy (longpoll.h). */
#include <stddef.h>

#include "etag.h"
#include "log.h"
#include "longpoll.h"
#include "settings.h"
#include "wait.h"

int fp_longpoll_wait(struct fp_request *r, const struct fp_http_head *hd,
                     unsigned max_wait)
{
    long w = fp_wait_param(hd->target, hd->target_len, max_wait);

    if (w < 0)
        return -1;
    /* nginx's plain-poll route gives up on a poller after 5 s and
     * marks it failed: such a request is never held, whatever its
     * query says (docs/api.md, "`wait`"). */
    r->wait_s = hd->route == FP_ROUTE_PLAIN ? 0 : (unsigned)w;
    return 0;
}

void fp_longpoll_read_starts(struct fp_request *r, const struct fp_hold *ho)
{
    /* Before the read starts: an announcement of this key from now on may
     * come after the cache answered the read (fp_hold_add). */
    r->ann_seq = fp_hold_seq(ho);
}

/* Held polls that end get a pace of 0 plus the jitter of interval_ms: ask
 * again at once, spread out (docs/api.md, "Poll-Interval-Ms"). */
static unsigned held_pace(const struct fp_settings *s)
{
    return fp_pace_ms(s->poll_interval_ms, s->poll_jitter_pct) -
           s->poll_interval_ms;
}

unsigned fp_longpoll_held_pace(const struct fp_request *r)
{
    return held_pace(r->c.h->s);
}

int fp_longpoll_tagged(struct fp_request *r, uint64_t tag)
{
    const struct fp_settings *s = r->c.h->s;
    int changed = !r->cond || !fp_inm_match(&r->inm, tag);

    r->ans.has_tag = 1;
    r->ans.tag = tag;
    /* A long poll with news is answered at once, and its client asks again
     * soon, as after a held poll's change: that poll is held. Paced by the
     * interval, a client of a busy key would be a second behind from then
     * on. */
    r->ans.pace_ms = changed && r->wait_s > 0
                         ? held_pace(s)
                         : fp_pace_ms(s->poll_interval_ms, s->poll_jitter_pct);
    if (changed)
        return 200;
    return r->wait_s == 0 || r->c.h->draining ? 304 : 0;
}

/* The poll's If-None-Match matches the cached answer and it asked to wait:
 * hold it if a slot is free. Returns 1 if held, 0 to answer 304 now. */
static int hold_or_304(struct fp_request *r, struct fp_hold *ho)
{
    r->held.inm = &r->inm;
    if (fp_hold_add(ho, r->key, r->keylen, &r->held, r->ann_seq) != 0) {
        fp_stat_over_cap();
        fp_log(FP_LOG_DEBUG, "http: %zu polls held: answering at once",
               fp_hold_count(ho));
        return 0;
    }
    if (conn_hold(&r->c, r->wait_s * 1000u) != 0) {
        fp_log(FP_LOG_ERROR, "http: cannot arm a held poll's timer");
        fp_hold_remove(&r->held);
        return 0;
    }
    return 1;
}

int fp_longpoll_hit(struct fp_request *r, struct fp_hold *ho,
                    const char *value, size_t len)
{
    int code = fp_longpoll_tagged(r, fp_etag_of(value, len));

    if (code == 0 && hold_or_304(r, ho))
        return 0;
    if (code == 200) {
        fp_stat_request(r->method, FP_STAT_HIT);
        return 200;
    }
    fp_stat_request(r->method, FP_STAT_NOT_MODIFIED);
    return 304;
}

void fp_longpoll_end(struct fp_request *r, enum fp_stat_wake cause)
{
    fp_hold_remove(&r->held);
    fp_stat_wake(cause);
    fp_stat_request(r->method, FP_STAT_NOT_MODIFIED);
    r->ans.pace_ms = held_pace(r->c.h->s);
    conn_finish(&r->c, 304, NULL, 0, &r->ans);
}

void fp_longpoll_release(struct fp_held *hd, enum fp_cache_status st,
                         const char *value, size_t len, uint64_t tag,
                         enum fp_stat_wake cause, void *arg)
{
    struct fp_request *r = (struct fp_request *)(void *)((char *)hd -
                               offsetof(struct fp_request, held));
    int code = st == FP_CACHE_HIT ? 200 : st == FP_CACHE_MISS ? 404 : 503;

    (void)arg;
    fp_stat_wake(cause);
    fp_stat_request(r->method, code == 200 ? FP_STAT_HIT :
                               code == 404 ? FP_STAT_MISS :
                               st == FP_CACHE_TIMEOUT ? FP_STAT_TIMEOUT :
                               FP_STAT_BACKEND_ERROR);
    r->ans.has_tag = 1;
    r->ans.tag = tag;
    r->ans.pace_ms = held_pace(r->c.h->s);
    conn_finish(&r->c, code, code == 200 ? value : NULL,
                code == 200 ? len : 0, code == 200 ? &r->ans : NULL);
}

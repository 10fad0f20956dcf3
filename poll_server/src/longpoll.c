/* longpoll.c -- the conditional and long-poll policy (longpoll.h). */
#include <stddef.h>
#include <sys/time.h>

#include <event2/event.h>

#include "etag.h"
#include "log.h"
#include "longpoll.h"
#include "settings.h"

int fp_longpoll_wait(struct conn *c, const struct fp_http_head *hd,
                     unsigned max_wait)
{
    long w = fp_wait_param(hd->target, hd->target_len, max_wait);

    if (w < 0)
        return -1;
    /* nginx's plain-poll route gives up on a poller after 5 s and
     * marks it failed: such a request is never held, whatever its
     * query says (docs/api.md, "`wait`"). */
    c->wait_s = hd->route == FP_ROUTE_PLAIN ? 0 : (unsigned)w;
    return 0;
}

void fp_longpoll_read_starts(struct conn *c, const struct fp_hold *ho)
{
    /* Before the read starts: an announcement of this key from now on may
     * come after the cache answered the read (fp_hold_add). */
    c->ann_seq = fp_hold_seq(ho);
}

/* Held polls that end get a pace of 0 plus the jitter of interval_ms: ask
 * again at once, spread out (docs/api.md, "Poll-Interval-Ms"). */
static unsigned held_pace(const struct fp_settings *s)
{
    return fp_pace_ms(s->poll_interval_ms, s->poll_jitter_pct) -
           s->poll_interval_ms;
}

unsigned fp_longpoll_held_pace(const struct conn *c)
{
    return held_pace(c->h->s);
}

int fp_longpoll_tagged(struct conn *c, uint64_t tag)
{
    const struct fp_settings *s = c->h->s;
    int changed = !c->cond || !fp_inm_match(&c->inm, tag);

    c->has_tag = 1;
    c->tag = tag;
    /* A long poll with news is answered at once, and its client asks again
     * soon, as after a held poll's change: that poll is held. Paced by the
     * interval, a client of a busy key would be a second behind from then
     * on. */
    c->pace_ms = changed && c->wait_s > 0
                     ? held_pace(s)
                     : fp_pace_ms(s->poll_interval_ms, s->poll_jitter_pct);
    if (changed)
        return 200;
    return c->wait_s == 0 || c->h->draining ? 304 : 0;
}

/* The poll's If-None-Match matches the cached answer and it asked to wait:
 * hold it if a slot is free. Returns 1 if held, 0 to answer 304 now. */
static int hold_or_304(struct conn *c, struct fp_hold *ho)
{
    struct timeval tv;

    c->held.inm = &c->inm;
    if (fp_hold_add(ho, c->key, c->keylen, &c->held, c->ann_seq) != 0) {
        fp_stat_over_cap();
        fp_log(FP_LOG_DEBUG, "http: %zu polls held: answering at once",
               fp_hold_count(ho));
        return 0;
    }
    tv.tv_sec = (time_t)c->wait_s;
    tv.tv_usec = 0;
    if (evtimer_add(c->timer, &tv) != 0) {
        fp_log(FP_LOG_ERROR, "http: cannot arm a held poll's timer");
        fp_hold_remove(&c->held);
        return 0;
    }
    conn_set_state(c, CONN_HELD);
    return 1;
}

int fp_longpoll_hit(struct conn *c, struct fp_hold *ho, const char *value,
                    size_t len)
{
    int code = fp_longpoll_tagged(c, fp_etag_of(value, len));

    if (code == 0 && hold_or_304(c, ho))
        return 0;
    if (code == 200) {
        fp_stat_request(c->method, FP_STAT_HIT);
        return 200;
    }
    fp_stat_request(c->method, FP_STAT_NOT_MODIFIED);
    return 304;
}

void fp_longpoll_end(struct conn *c, enum fp_stat_wake cause)
{
    fp_hold_remove(&c->held);
    fp_stat_wake(cause);
    fp_stat_request(c->method, FP_STAT_NOT_MODIFIED);
    conn_set_state(c, CONN_READING_HEAD);
    c->pace_ms = held_pace(c->h->s);
    if (conn_answer(c, 304, NULL, 0, 1) == 0)
        conn_resume_later(c);
}

void fp_longpoll_release(struct fp_held *hd, enum fp_cache_status st,
                         const char *value, size_t len, uint64_t tag,
                         enum fp_stat_wake cause, void *arg)
{
    struct conn *c = (struct conn *)(void *)((char *)hd - offsetof(struct conn, held));
    int code = st == FP_CACHE_HIT ? 200 : st == FP_CACHE_MISS ? 404 : 503;

    (void)arg;
    fp_stat_wake(cause);
    fp_stat_request(c->method, code == 200 ? FP_STAT_HIT :
                               code == 404 ? FP_STAT_MISS :
                               st == FP_CACHE_TIMEOUT ? FP_STAT_TIMEOUT :
                               FP_STAT_BACKEND_ERROR);
    conn_set_state(c, CONN_READING_HEAD);
    c->has_tag = 1;
    c->tag = tag;
    c->pace_ms = held_pace(c->h->s);
    if (conn_answer(c, code, code == 200 ? value : NULL, code == 200 ? len : 0,
                    code == 200) == 0)
        conn_resume_later(c);
}

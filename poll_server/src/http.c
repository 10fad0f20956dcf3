/* http.c -- the poll port's request layer (http.h): a request head ->
 * method, key, signature and wait -> an answer at once, or a coalesced
 * cache read -> 200 / 304 / 404 / 503. Connections are conn.c's, answers'
 * bytes response.c's, the long-poll policy longpoll.c's, the request's
 * fields request.h's, the listeners and the server's life server.c's.
 *
 * Why not evhttp: a keep-alive hit cost it 14 mallocs, 7 callocs and 21
 * frees (request, header lists, evbuffers, URI copies), 8 system calls at
 * concurrency 1 (an ioctl(FIONREAD) per read, an epoll_ctl pair per
 * request) and 3-4 timer heap operations; working around it took three
 * reliances on libevent 2.1.12 internals (docs/benchmarks.md, "Hit path").
 * What nginx sends is small and regular, so the poll port has its own
 * HTTP/1.1 (conn.h says how a connection is served). */
#include <limits.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/time.h>

#include <event2/event.h>

#include "cache.h"
#include "chpoll.h"
#include "coalesce.h"
#include "conn.h"
#include "hold.h"
#include "http.h"
#include "httpparse.h"
#include "keys.h"
#include "log.h"
#include "longpoll.h"
#include "request.h"
#include "response.h"
#include "settings.h"
#include "sign.h"
#include "stats.h"
#include "stream.h"

static struct fp_http *http_of(const struct conn *c)
{
    return (struct fp_http *)(void *)c->h;
}

/* Holds r's stream on its key, on the answer tagged tag it last sent (its
 * watch, if still up through the change, in place: hold.h's keep). */
static void stream_hold(struct fp_http *h, struct fp_request *r, uint64_t tag,
                        uint64_t since)
{
    r->inm.star = 0;
    r->inm.ntags = 1;
    r->inm.tags[0] = tag;
    r->held.inm = &r->inm;
    if (r->held.key == NULL &&
        fp_hold_add(h->hold, r->key, r->keylen, &r->held, since) != 0) {
        fp_stat_over_cap();
        fp_stream_end(r, FP_STAT_STREAM_OVER_CAP);
    }
}

/* A stream's first read of its key found value: the stream starts. */
static void stream_hit(struct fp_http *h, struct fp_request *r,
                       const char *value, size_t len)
{
    uint64_t tag = fp_etag_of(value, len);

    if (fp_stream_open(r, value, len, tag) == 1)
        stream_hold(h, r, tag, r->ann_seq);
}

/* hold.c's release callback: a held poll's or stream's answer changed, its
 * key is gone, or a change could not be read. */
static void on_release(struct fp_held *hd, enum fp_cache_status st,
                       const char *value, size_t len, uint64_t tag,
                       enum fp_stat_wake cause, void *arg)
{
    struct fp_request *r = (struct fp_request *)(void *)((char *)hd -
                               offsetof(struct fp_request, held));
    struct fp_http *h = arg;

    if (!r->stream) {
        fp_longpoll_release(hd, st, value, len, tag, cause, arg);
        return;
    }
    fp_stat_wake(cause);
    if (st != FP_CACHE_HIT) {
        /* Its client reconnects, and falls back as a poll does. */
        fp_hold_remove(hd);
        fp_stream_end(r, FP_STAT_STREAM_CACHE);
        return;
    }
    if (fp_stream_send(r, value, len, tag) == 0)
        stream_hold(h, r, tag, fp_hold_seq(h->hold));
}

static void on_answer(struct fp_waiter *w, enum fp_cache_status st,
                      const char *value, size_t len, void *arg)
{
    struct fp_request *r = (struct fp_request *)(void *)((char *)w -
                               offsetof(struct fp_request, w));
    struct fp_http *h = http_of(&r->c);
    int code = 503;

    (void)arg;
    switch (st) {
    case FP_CACHE_HIT:
        if (r->stream) {
            stream_hit(h, r, value, len);
            return;
        }
        if ((code = fp_longpoll_hit(r, h->hold, value, len)) == 0)
            return; /* held */
        break;
    case FP_CACHE_MISS:
        fp_stat_request(r->method, FP_STAT_MISS);
        code = 404;
        break;
    case FP_CACHE_TIMEOUT:
        fp_stat_request(r->method, FP_STAT_TIMEOUT);
        break;
    case FP_CACHE_ERROR:
    default:
        fp_stat_request(r->method, FP_STAT_BACKEND_ERROR);
        break;
    }
    conn_finish(&r->c, code, code == 200 ? value : NULL,
                code == 200 ? len : 0,
                code == 200 || code == 304 ? &r->ans : NULL);
}

/* fp_conn_ops.dispatch */
static int dispatch(struct conn *c)
{
    struct fp_http *h = http_of(c);
    struct fp_request *r = fp_request_of(c);

    conn_request_counted(c);
    if (fp_chpoll_pending(h->chp, r))
        return fp_chpoll_dispatch(h->chp, r);
    if (r->verdict != 0) {
        const char *body;
        size_t len;

        fp_stat_request(r->method, r->outcome);
        body = fp_resp_body(r->verdict, &len);
        return conn_answer(c, r->verdict, body, len, NULL);
    }
    fp_longpoll_read_starts(r, h->hold);
    /* Its answer comes from the loop, never from inside the get: the
     * connection waits from here. */
    if (fp_coalesce_get(h->co, r->key, r->keylen, &r->w) < 0) {
        fp_log(FP_LOG_DEBUG, "http: cache get failed for %s", r->key);
        fp_stat_request(r->method, FP_STAT_BACKEND_ERROR);
        return conn_answer(c, 503, NULL, 0, NULL);
    }
    conn_wait(c);
    fp_log(FP_LOG_DEBUG, "http: %s waits for %s", c->head_only ? "HEAD" :
           r->method == FP_STAT_POST ? "POST" : "GET", r->key);
    return 1;
}

/* fp_conn_ops.start */
static int start_request(struct conn *c, const struct fp_http_head *hd)
{
    struct fp_http *h = http_of(c);
    struct fp_request *r = fp_request_of(c);
    const struct fp_settings *s = h->cs.s;
    struct timeval now;
    long long now_s = LLONG_MAX; /* no clock: every signature expired */
    ssize_t keylen;
    int st;

    r->method = hd->method == FP_HM_GET ? FP_STAT_GET :
                hd->method == FP_HM_HEAD ? FP_STAT_HEAD :
                hd->method == FP_HM_POST ? FP_STAT_POST : FP_STAT_OTHER;
    r->verdict = 0;
    r->ans.has_tag = 0;
    r->wait_s = 0;
    r->stream = fp_stream_wanted(hd);
    r->streaming = 0;
    r->held.keep = r->stream; /* its watch stays up through its events */
    if (hd->method == FP_HM_OTHER) {
        r->verdict = 405;
        r->outcome = FP_STAT_METHOD_NOT_ALLOWED;
        return 0;
    }
    /* POST polls are not evaluated (docs/api.md, "If-None-Match"). */
    r->cond = hd->method != FP_HM_POST && hd->ninm <= FP_HTTP_MAX_INM &&
              fp_inm_parse(hd->inm, hd->inm_len, hd->ninm, &r->inm);
    if (fp_longpoll_wait(r, hd, s->poll_max_wait) != 0) {
        r->verdict = 400;
        r->outcome = FP_STAT_BAD_REQUEST;
        return 0;
    }
    if (r->stream)
        r->wait_s = 0; /* a stream is held for its lifetime, not a wait */
    keylen = key_derive(s->key_prefix, s->key_params, s->nkey_params,
                        hd->target, hd->target_len, r->key, sizeof(r->key));
    if (event_base_gettimeofday_cached(h->cs.base, &now) == 0)
        now_s = (long long)now.tv_sec;
    /* A poll with channels (ch=): its signature, key and channels. */
    if ((st = fp_chpoll_start(h->chp, r, hd, keylen, h->signer, now_s,
                              &r->outcome)) != 0) {
        if (st == FP_CHPOLL_OK)
            r->keylen = (size_t)keylen;
        else
            r->verdict = st;
        return 0;
    }
    if (h->signer != NULL) {
        /* Before the cache: a request without a key cannot be signed. */
        if (keylen < 0 ||
            fp_sign_check(h->signer, hd->target, hd->target_len, r->key,
                          (size_t)keylen, now_s) != 0) {
            fp_log(FP_LOG_DEBUG, "http: no valid signature on %.*s",
                   (int)(hd->target_len > 200 ? 200 : hd->target_len),
                   hd->target);
            r->verdict = 403;
            r->outcome = FP_STAT_FORBIDDEN;
            return 0;
        }
    }
    if (keylen < 0) {
        /* Never sent to a cache: the app is the authority on odd requests. */
        fp_log(FP_LOG_DEBUG, "http: no key for %.*s",
               (int)(hd->target_len > 200 ? 200 : hd->target_len), hd->target);
        r->verdict = 404;
        r->outcome = FP_STAT_INVALID_KEY;
        return 0;
    }
    r->keylen = (size_t)keylen;
    return 0;
}

/* Ends a held poll, with or without channels. */
static void end_held(struct fp_request *r, enum fp_stat_wake cause)
{
    if (fp_chpoll_is(r))
        fp_chpoll_end(r, cause);
    else
        fp_longpoll_end(r, cause);
}

/* Ends a stream: its keys let go of, then the end's retry hint. */
static void end_stream(struct fp_request *r, enum fp_stat_stream_end why)
{
    if (fp_chpoll_is(r))
        fp_chpoll_stream_release(r);
    else
        fp_hold_remove(&r->held);
    fp_stream_end(r, why);
}

/* fp_conn_ops.stream_tick */
static void stream_tick(struct conn *c)
{
    struct fp_request *r = fp_request_of(c);

    if (fp_stream_tick(r) == 1)
        end_stream(r, FP_STAT_STREAM_LIFETIME);
}

/* fp_conn_ops.hold_expired */
static void hold_expired(struct conn *c)
{
    end_held(fp_request_of(c), FP_STAT_WAKE_TIMEOUT);
}

/* fp_conn_ops.abandon: the client went away while its request waited for
 * the cache or was held; a held poll's slot is free at once. */
static void abandon(struct conn *c)
{
    struct fp_request *r = fp_request_of(c);

    if (c->state == CONN_STREAMING) {
        fp_hold_remove(&r->held);
        fp_stream_gone(r);
        return;
    }
    fp_stat_request(r->method, FP_STAT_CLIENT_CLOSED);
    if (c->state == CONN_WAITING_CACHE) {
        fp_coalesce_detach(&r->w);
        fp_log(FP_LOG_DEBUG, "http: connection closed with a request waiting "
               "for the cache");
    } else {
        fp_hold_remove(&r->held);
    }
}

static const struct fp_conn_ops http_ops = {
    sizeof(struct fp_request), start_request, dispatch, hold_expired,
    stream_tick, abandon
};

int fp_http_init(struct fp_http *h, struct event_base *base,
                 const struct fp_settings *s, struct fp_cache *cache,
                 struct fp_accept_guard *guard)
{
    if (fp_conns_init(&h->cs, base, s, &http_ops, guard) != 0)
        return -1;
    if ((h->co = fp_coalesce_new(cache, on_answer, h)) == NULL ||
        (h->hold = fp_hold_new(base, s, cache, on_release, h)) == NULL ||
        (h->chp = fp_chpolls_new(cache, h->hold, s)) == NULL ||
        (s->nsign_secrets > 0 &&
         (h->signer = fp_signer_new(s->sign_secrets, s->nsign_secrets)) == NULL)) {
        fp_log(FP_LOG_ERROR, "http: out of memory");
        fp_http_release(h);
        return -1;
    }
    if (h->signer == NULL)
        fp_log(FP_LOG_WARN, "http: no [signing] secret_file: poll URLs are "
               "not checked, any client can read any user's answers");
    return 0;
}


void fp_http_drain(struct fp_http *h, void (*done)(void *arg), void *arg)
{
    struct conn *c, *next;

    fp_conns_drain(&h->cs, done, arg);
    /* Held polls are answered now (304, Connection: close): nothing would
     * wake them before the drain's limit. */
    for (c = LIST_FIRST(&h->cs.conns); c != NULL; c = next) {
        next = LIST_NEXT(c, link);
        if (c->state == CONN_HELD)
            end_held(fp_request_of(c), FP_STAT_WAKE_SHUTDOWN);
        else if (c->state == CONN_STREAMING)
            end_stream(fp_request_of(c), FP_STAT_STREAM_DRAIN);
    }
    fp_conns_check_drained(&h->cs);
}

void fp_http_abort_waiting(struct fp_http *h)
{
    fp_coalesce_fail_all(h->co, FP_CACHE_TIMEOUT);
    fp_chpolls_fail_all(h->chp, FP_CACHE_TIMEOUT);
}

unsigned long fp_http_inflight(const struct fp_http *h)
{
    return h->cs.inflight;
}

void fp_http_coalesce_stats(const struct fp_http *h,
                            struct fp_coalesce_stats *out)
{
    fp_coalesce_stats(h->co, out);
    fp_chpolls_coalesce_stats(h->chp, out);
}

void fp_http_release(struct fp_http *h)
{
    fp_conns_free(&h->cs);
    fp_coalesce_free(h->co);
    fp_chpolls_free(h->chp);
    fp_hold_free(h->hold);
    fp_signer_free(h->signer);
}

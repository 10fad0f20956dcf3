/* http.c -- the poll port's request layer (http.h): a request head ->
 * method, key, signature and wait -> an answer at once, or a coalesced
 * cache read -> 200 / 304 / 404 / 503; and the server's life (listeners,
 * drain, free). Connections are conn.c's, answers' bytes response.c's, the
 * long-poll policy longpoll.c's, the listening sockets listen.c's.
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
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/time.h>

#include <event2/event.h>
#include <event2/listener.h>
#include <event2/util.h>

#include "accept.h"
#include "cache.h"
#include "chpoll.h"
#include "coalesce.h"
#include "conn.h"
#include "hold.h"
#include "http.h"
#include "httpparse.h"
#include "keys.h"
#include "listen.h"
#include "log.h"
#include "longpoll.h"
#include "response.h"
#include "settings.h"
#include "sign.h"
#include "stats.h"

struct fp_http {
    struct fp_conns cs;         /* first: a connection's c->h */
    struct evconnlistener *lev;       /* TCP listener, or NULL */
    struct evconnlistener *lev_unix;  /* unix socket listener, or NULL */
    struct fp_unix_sock unix_sock;    /* ours to unlink at exit */
    struct fp_coalesce *co;
    struct fp_hold *hold;       /* held long polls */
    struct fp_chpolls *chp;     /* polls with channels (chpoll.c) */
    struct fp_signer *signer;   /* NULL: poll URLs are not signed */
    struct fp_accept_guard *guard; /* pauses accepting on EMFILE */
};

static struct fp_http *http_of(const struct conn *c)
{
    return (struct fp_http *)(void *)c->h;
}

static void on_answer(struct fp_waiter *w, enum fp_cache_status st,
                      const char *value, size_t len, void *arg)
{
    struct conn *c = (struct conn *)(void *)w;
    int code = 503;

    (void)arg;
    switch (st) {
    case FP_CACHE_HIT:
        if ((code = fp_longpoll_hit(c, http_of(c)->hold, value, len)) == 0)
            return; /* held */
        break;
    case FP_CACHE_MISS:
        fp_stat_request(c->method, FP_STAT_MISS);
        code = 404;
        break;
    case FP_CACHE_TIMEOUT:
        fp_stat_request(c->method, FP_STAT_TIMEOUT);
        break;
    case FP_CACHE_ERROR:
    default:
        fp_stat_request(c->method, FP_STAT_BACKEND_ERROR);
        break;
    }
    /* Not waiting any more (conn_close must not detach). */
    conn_set_state(c, CONN_READING_HEAD);
    if (conn_answer(c, code, code == 200 ? value : NULL, code == 200 ? len : 0,
                    code == 200 || code == 304) != 0)
        return;
    conn_resume_later(c);
}

/* fp_conn_ops.dispatch */
static int dispatch(struct conn *c)
{
    struct fp_http *h = http_of(c);

    conn_request_counted(c);
    if (fp_chpoll_pending(h->chp, c))
        return fp_chpoll_dispatch(h->chp, c);
    if (c->verdict != 0) {
        const char *body;
        size_t len;

        fp_stat_request(c->method, c->outcome);
        body = fp_resp_body(c->verdict, &len);
        return conn_answer(c, c->verdict, body, len, 0);
    }
    conn_set_state(c, CONN_WAITING_CACHE);
    fp_longpoll_read_starts(c, h->hold);
    if (fp_coalesce_get(h->co, c->key, c->keylen, &c->w) < 0) {
        fp_log(FP_LOG_DEBUG, "http: cache get failed for %s", c->key);
        fp_stat_request(c->method, FP_STAT_BACKEND_ERROR);
        conn_set_state(c, CONN_READING_HEAD);
        return conn_answer(c, 503, NULL, 0, 0);
    }
    fp_log(FP_LOG_DEBUG, "http: %s waits for %s", c->head_only ? "HEAD" :
           c->method == FP_STAT_POST ? "POST" : "GET", c->key);
    return 1;
}

/* fp_conn_ops.start */
static int start_request(struct conn *c, const char *buf, size_t len)
{
    struct fp_http *h = http_of(c);
    const struct fp_settings *s = h->cs.s;
    struct fp_http_head hd;
    struct timeval now;
    long long now_s = LLONG_MAX; /* no clock: every signature expired */
    ssize_t keylen;
    int st;

    c->minor = 1;
    if ((st = fp_http_parse_head(buf, len, &hd)) != 0)
        return st;
    c->minor = hd.minor;
    c->keep_alive = hd.keep_alive;
    c->head_only = hd.method == FP_HM_HEAD;
    c->method = hd.method == FP_HM_GET ? FP_STAT_GET :
                hd.method == FP_HM_HEAD ? FP_STAT_HEAD :
                hd.method == FP_HM_POST ? FP_STAT_POST : FP_STAT_OTHER;
    c->chunked = hd.chunked;
    c->body_left = hd.has_length ? hd.content_length : 0;
    c->too_large = hd.has_length && hd.content_length > s->max_body_size;
    if (c->chunked)
        fp_chunked_init(&c->ch);
    c->verdict = 0;
    c->has_tag = 0;
    c->wait_s = 0;
    if (hd.method == FP_HM_OTHER) {
        c->verdict = 405;
        c->outcome = FP_STAT_METHOD_NOT_ALLOWED;
        return 0;
    }
    /* POST polls are not evaluated (docs/api.md, "If-None-Match"). */
    c->cond = hd.method != FP_HM_POST && hd.ninm <= FP_HTTP_MAX_INM &&
              fp_inm_parse(hd.inm, hd.inm_len, hd.ninm, &c->inm);
    if (fp_longpoll_wait(c, &hd, s->poll_max_wait) != 0) {
        c->verdict = 400;
        c->outcome = FP_STAT_BAD_REQUEST;
        return 0;
    }
    keylen = key_derive(s->key_prefix, s->key_params, s->nkey_params,
                        hd.target, hd.target_len, c->key, sizeof(c->key));
    if (event_base_gettimeofday_cached(h->cs.base, &now) == 0)
        now_s = (long long)now.tv_sec;
    /* A poll with channels (ch=): its signature, key and channels. */
    if ((st = fp_chpoll_start(h->chp, c, &hd, keylen, h->signer, now_s,
                              &c->outcome)) != 0) {
        if (st == FP_CHPOLL_OK)
            c->keylen = (size_t)keylen;
        else
            c->verdict = st;
        return 0;
    }
    if (h->signer != NULL) {
        /* Before the cache: a request without a key cannot be signed. */
        if (keylen < 0 ||
            fp_sign_check(h->signer, hd.target, hd.target_len, c->key,
                          (size_t)keylen, now_s) != 0) {
            fp_log(FP_LOG_DEBUG, "http: no valid signature on %.*s",
                   (int)(hd.target_len > 200 ? 200 : hd.target_len), hd.target);
            c->verdict = 403;
            c->outcome = FP_STAT_FORBIDDEN;
            return 0;
        }
    }
    if (keylen < 0) {
        /* Never sent to a cache: the app is the authority on odd requests. */
        fp_log(FP_LOG_DEBUG, "http: no key for %.*s",
               (int)(hd.target_len > 200 ? 200 : hd.target_len), hd.target);
        c->verdict = 404;
        c->outcome = FP_STAT_INVALID_KEY;
        return 0;
    }
    c->keylen = (size_t)keylen;
    return 0;
}

/* Ends a held poll, with or without channels. */
static void end_held(struct conn *c, enum fp_stat_wake cause)
{
    if (fp_chpoll_is(c))
        fp_chpoll_end(c, cause);
    else
        fp_longpoll_end(c, cause);
}

/* fp_conn_ops.hold_expired */
static void hold_expired(struct conn *c)
{
    end_held(c, FP_STAT_WAKE_TIMEOUT);
}

static const struct fp_conn_ops http_ops = { start_request, dispatch,
                                             hold_expired };

static void on_accept(struct evconnlistener *lev, evutil_socket_t fd,
                      struct sockaddr *sa, int salen, void *arg)
{
    struct fp_http *h = arg;

    (void)lev;
    (void)salen;
    fp_conns_accepted(&h->cs, fd, sa);
}

/* Accepts on fd (listening already) into on_accept; closed with the
 * listener. NULL on error (fd is then closed). */
static struct evconnlistener *accept_on(struct fp_http *h, evutil_socket_t fd)
{
    struct evconnlistener *lev;

    /* backlog 0: the socket listens already (with FP_LISTEN_BACKLOG). */
    lev = evconnlistener_new(h->cs.base, on_accept, h,
                             LEV_OPT_CLOSE_ON_FREE | LEV_OPT_CLOSE_ON_EXEC, 0, fd);
    if (lev == NULL)
        evutil_closesocket(fd);
    return lev;
}

struct fp_http *fp_http_start(struct event_base *base,
                              const struct fp_settings *s,
                              struct fp_cache *cache)
{
    struct fp_http *h = calloc(1, sizeof(*h));
    evutil_socket_t fd;

    if (h == NULL) {
        fp_log(FP_LOG_ERROR, "http: out of memory");
        return NULL;
    }
    if ((h->guard = fp_accept_guard_new(base, "http")) == NULL) {
        fp_log(FP_LOG_ERROR, "http: out of memory");
        free(h);
        return NULL;
    }
    if (fp_conns_init(&h->cs, base, s, &http_ops, h->guard) != 0) {
        fp_accept_guard_free(h->guard);
        free(h);
        return NULL;
    }
    if ((h->co = fp_coalesce_new(cache, on_answer, h)) == NULL ||
        (h->hold = fp_hold_new(base, s, cache, fp_longpoll_release, h)) == NULL ||
        (h->chp = fp_chpolls_new(cache, h->hold, s)) == NULL ||
        (s->nsign_secrets > 0 &&
         (h->signer = fp_signer_new(s->sign_secrets, s->nsign_secrets)) == NULL)) {
        fp_log(FP_LOG_ERROR, "http: out of memory");
        goto fail;
    }
    if (h->signer == NULL)
        fp_log(FP_LOG_WARN, "http: no [signing] secret_file: poll URLs are "
               "not checked, any client can read any user's answers");

    if (s->listen != NULL) {
        if ((fd = fp_listen_tcp(s->listen, s->port)) < 0)
            goto fail;
        if ((h->lev = accept_on(h, fd)) == NULL) {
            fp_log(FP_LOG_ERROR, "http: cannot accept on %s:%u", s->listen,
                   (unsigned)s->port);
            goto fail;
        }
        if (fp_accept_guard_add(h->guard, h->lev) != 0)
            fp_log(FP_LOG_WARN, "http: accept errors on %s:%u are not guarded",
                   s->listen, (unsigned)s->port);
    }
    if (s->listen_unix != NULL) {
        if ((fd = fp_listen_unix(s->listen_unix, s->unix_mode,
                                 &h->unix_sock)) < 0)
            goto fail;
        if ((h->lev_unix = accept_on(h, fd)) == NULL) {
            fp_log(FP_LOG_ERROR, "http: cannot accept on unix:%s", s->listen_unix);
            goto fail;
        }
        if (fp_accept_guard_add(h->guard, h->lev_unix) != 0)
            fp_log(FP_LOG_WARN, "http: accept errors on unix:%s are not guarded",
                   s->listen_unix);
    }
    return h;
fail:
    fp_listen_unix_release(&h->unix_sock);
    if (h->lev != NULL)
        evconnlistener_free(h->lev);
    if (h->lev_unix != NULL)
        evconnlistener_free(h->lev_unix);
    fp_coalesce_free(h->co);
    fp_chpolls_free(h->chp);
    fp_hold_free(h->hold);
    fp_signer_free(h->signer);
    fp_accept_guard_free(h->guard);
    free(h);
    return NULL;
}

static void stop_listening(struct fp_http *h)
{
    fp_accept_guard_stop(h->guard);
    if (h->lev != NULL) {
        evconnlistener_free(h->lev);
        h->lev = NULL;
    }
    if (h->lev_unix != NULL) {
        evconnlistener_free(h->lev_unix);
        h->lev_unix = NULL;
    }
    fp_listen_unix_release(&h->unix_sock); /* nginx gets ECONNREFUSED/ENOENT: the next poller */
}

void fp_http_drain(struct fp_http *h, void (*done)(void *arg), void *arg)
{
    struct conn *c, *next;

    stop_listening(h);
    fp_conns_drain(&h->cs, done, arg);
    /* Held polls are answered now (304, Connection: close): nothing would
     * wake them before the drain's limit. */
    for (c = LIST_FIRST(&h->cs.conns); c != NULL; c = next) {
        next = LIST_NEXT(c, link);
        if (c->state == CONN_HELD)
            end_held(c, FP_STAT_WAKE_SHUTDOWN);
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

void fp_http_free(struct fp_http *h)
{
    if (h == NULL)
        return;
    stop_listening(h);
    fp_conns_free(&h->cs);
    fp_accept_guard_free(h->guard);
    fp_coalesce_free(h->co);
    fp_chpolls_free(h->chp);
    fp_hold_free(h->hold);
    fp_signer_free(h->signer);
    free(h);
}

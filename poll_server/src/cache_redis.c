/* cache_redis.c -- Redis backend: hiredis 0.14 async API on the libevent
 * loop (hiredis/adapters/libevent.h), one connection, TCP or unix socket.
 *
 * hiredis 0.14 has no command timeout, so every request has its own timer.
 * Ownership of a request: hiredis holds its pointer (privdata) from
 * redisAsyncCommand() until it calls reply_cb() -- with a reply, or with
 * NULL when the context is freed. The request is freed only when the user
 * callback has run AND hiredis has let go, so neither a late reply nor a
 * timer can touch freed memory or answer twice.
 *
 * A request that times out means Redis is hung (or gone): we redisAsyncFree()
 * the context -- not redisAsyncDisconnect(), which waits for the pending
 * replies forever. In 0.14 redisAsyncFree() runs every pending callback with
 * a NULL reply before it returns (when not called from inside a hiredis
 * callback, which we never do), so the others get ERROR at once. Then we
 * reconnect after a backoff (100 ms doubling to 2 s); requests arriving
 * meanwhile fail fast with ERROR. A lost connection that had been answering
 * is retried at once (restart, idle timeout), then with the same backoff.
 */
#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 200809L /* getaddrinfo under -std=c11 */
#endif
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/queue.h>
#include <sys/socket.h>

#include <event2/event.h>
#include <hiredis/async.h>
#include <hiredis/hiredis.h>
#include <hiredis/adapters/libevent.h>

#include "cache_redis.h"
#include "log.h"
#include "settings.h"
#include "stats.h"

#define RD_MAX_PENDING    10000
#define RD_BACKOFF_MIN_MS 100
#define RD_BACKOFF_MAX_MS 2000

enum rd_log_state { RD_LOG_NONE, RD_LOG_UP, RD_LOG_DOWN };

struct fp_redis;

struct rd_req {
    TAILQ_ENTRY(rd_req) link;   /* on r->failq only */
    struct fp_redis *r;
    struct event *timer;        /* deadline, or the deferred failure */
    fp_cache_cb *cb;
    void *arg;
    uint64_t sent;              /* fp_stat_now() when queued, 0 if never */
    int answered;               /* user callback has run */
    int in_hiredis;             /* hiredis still holds the pointer */
    int failfast;               /* never sent: timer delivers ERROR */
};

TAILQ_HEAD(rd_reqq, rd_req);

struct fp_redis {
    struct event_base *base;
    redisAsyncContext *ac;      /* NULL while down */
    struct event *retry;
    char name[300];             /* for the log */
    char ip[64];                /* numeric, resolved at startup */
    int port;
    char *unix_path;
    char *password;
    int db;
    const struct timeval *timeout;
    struct timeval timeout_tv;
    enum rd_log_state logged;
    int hung;                   /* last failure was a timeout */
    unsigned backoff_ms;        /* 0 after a reply */
    size_t inflight;            /* requests hiredis holds */
    struct rd_reqq failq;
    int closing;
};

static void log_up(struct fp_redis *r)
{
    if (r->logged != RD_LOG_UP)
        fp_log(FP_LOG_INFO, "redis %s: connected", r->name);
    r->logged = RD_LOG_UP;
    fp_stat_backend_up(0, 1);
}

static void log_down(struct fp_redis *r, const char *why)
{
    fp_log(r->logged != RD_LOG_DOWN ? FP_LOG_WARN : FP_LOG_DEBUG,
           "redis %s: %s", r->name, why);
    r->logged = RD_LOG_DOWN;
    fp_stat_backend_up(0, 0);
}

/* A connection that was answering and drops (restart, idle close) is
 * retried at once; then, and after a timeout, 100 ms doubling to 2 s until
 * the next reply resets it. */
static void schedule_retry(struct fp_redis *r)
{
    struct timeval tv;
    unsigned delay;

    if (r->closing)
        return;
    if (r->backoff_ms == 0 && r->hung)
        r->backoff_ms = RD_BACKOFF_MIN_MS;
    delay = r->backoff_ms;
    r->backoff_ms = r->backoff_ms == 0 ? RD_BACKOFF_MIN_MS :
                    r->backoff_ms * 2 > RD_BACKOFF_MAX_MS ? RD_BACKOFF_MAX_MS :
                    r->backoff_ms * 2;
    tv.tv_sec = delay / 1000;
    tv.tv_usec = (suseconds_t)(delay % 1000) * 1000;
    if (evtimer_add(r->retry, &tv) != 0)
        fp_log(FP_LOG_ERROR, "redis %s: cannot arm reconnect timer", r->name);
}

/* Frees the request once nobody can reach it any more. */
static void req_release(struct rd_req *q)
{
    if (q->answered && !q->in_hiredis) {
        event_free(q->timer);
        free(q);
    }
}

/* Runs the user callback exactly once. */
static void req_answer(struct rd_req *q, enum fp_cache_status st,
                       const char *val, size_t len)
{
    if (q->answered)
        return;
    q->answered = 1;
    (void)event_del(q->timer);
    fp_stat_backend_done(0, st, q->sent);
    q->cb(st, val, len, q->arg);
}

/* Drops the current context (if any); hiredis answers its pending
 * callbacks with NULL, i.e. ERROR, before this returns. Never called from
 * inside a hiredis callback. */
static void drop_context(struct fp_redis *r)
{
    redisAsyncContext *ac = r->ac;

    r->ac = NULL;               /* disconnect_cb and new gets see it down */
    if (ac != NULL)
        redisAsyncFree(ac);
    schedule_retry(r);
}

static void reply_cb(redisAsyncContext *ac, void *reply, void *priv)
{
    struct rd_req *q = priv;
    struct fp_redis *r = q->r;
    redisReply *rep = reply;

    (void)ac;
    q->in_hiredis = 0;
    r->inflight--;
    if (rep != NULL) {
        /* Any reply, even an error, proves the server is alive. */
        r->hung = 0;
        r->backoff_ms = 0;
        log_up(r);
    }
    if (rep == NULL)
        req_answer(q, FP_CACHE_ERROR, NULL, 0);
    else if (rep->type == REDIS_REPLY_NIL)
        req_answer(q, FP_CACHE_MISS, NULL, 0);
    else if (rep->type == REDIS_REPLY_STRING)
        req_answer(q, FP_CACHE_HIT, rep->str, rep->len);
    else {
        if (rep->type == REDIS_REPLY_ERROR)
            fp_log(FP_LOG_DEBUG, "redis %s: GET: %.*s", r->name,
                   (int)rep->len, rep->str);
        req_answer(q, FP_CACHE_ERROR, NULL, 0);
    }
    req_release(q);
}

/* AUTH and SELECT: privdata is the backend itself. An error reply leaves
 * the connection up; the GETs then get errors (-> ERROR -> fallback). */
static void setup_cb(redisAsyncContext *ac, void *reply, void *priv)
{
    struct fp_redis *r = priv;
    redisReply *rep = reply;

    (void)ac;
    if (rep != NULL && rep->type == REDIS_REPLY_ERROR)
        fp_log(FP_LOG_ERROR, "redis %s: setup command failed: %.*s", r->name,
               (int)rep->len, rep->str);
}

static void connect_cb(const redisAsyncContext *ac, int status)
{
    struct fp_redis *r = ac->data;
    char why[200];

    if (r->ac != ac)
        return;
    if (status == REDIS_OK) {
        /* A stopped server's kernel still accepts: after a timeout, wait
         * for a reply before calling it up. */
        if (!r->hung)
            log_up(r);
        return;
    }
    /* hiredis frees the context after this returns and answers the
     * pending callbacks with NULL; disconnect_cb is not called. */
    (void)snprintf(why, sizeof(why), "connect failed: %s", ac->errstr);
    log_down(r, why);
    r->ac = NULL;
    schedule_retry(r);
}

static void disconnect_cb(const redisAsyncContext *ac, int status)
{
    struct fp_redis *r = ac->data;
    char why[200];

    if (r->ac != ac)            /* we dropped it ourselves */
        return;
    (void)snprintf(why, sizeof(why), "connection lost: %s",
             status == REDIS_OK ? "closed" : ac->errstr);
    log_down(r, why);
    r->ac = NULL;
    schedule_retry(r);
}

static void do_connect(struct fp_redis *r)
{
    redisAsyncContext *ac;
    char why[200];

    /* Numeric address or unix path: hiredis's connect does not block. */
    if (r->unix_path != NULL)
        ac = redisAsyncConnectUnix(r->unix_path);
    else
        ac = redisAsyncConnect(r->ip, r->port);
    if (ac == NULL) {
        log_down(r, "cannot allocate a context");
        schedule_retry(r);
        return;
    }
    if (ac->err) {
        (void)snprintf(why, sizeof(why), "connect failed: %s", ac->errstr);
        log_down(r, why);
        redisAsyncFree(ac);
        schedule_retry(r);
        return;
    }
    ac->data = r;
    if (redisLibeventAttach(ac, r->base) != REDIS_OK ||
        redisAsyncSetConnectCallback(ac, connect_cb) != REDIS_OK ||
        redisAsyncSetDisconnectCallback(ac, disconnect_cb) != REDIS_OK) {
        log_down(r, "cannot attach to the event loop");
        redisAsyncFree(ac);
        schedule_retry(r);
        return;
    }
    r->ac = ac;
    /* Queued before any GET, so they go first on the wire. */
    if ((r->password != NULL &&
         redisAsyncCommand(ac, setup_cb, r, "AUTH %s", r->password) !=
             REDIS_OK) ||
        (r->db != 0 &&
         redisAsyncCommand(ac, setup_cb, r, "SELECT %d", r->db) != REDIS_OK)) {
        log_down(r, "cannot queue AUTH/SELECT");
        drop_context(r);
    }
}

static void retry_cb(evutil_socket_t fd, short what, void *arg)
{
    struct fp_redis *r = arg;

    (void)fd;
    (void)what;
    if (r->ac == NULL && !r->closing)
        do_connect(r);
}

static void timer_cb(evutil_socket_t fd, short what, void *arg)
{
    struct rd_req *q = arg;
    struct fp_redis *r = q->r;
    char why[96];

    (void)fd;
    (void)what;
    if (q->failfast) {
        TAILQ_REMOVE(&r->failq, q, link);
        req_answer(q, FP_CACHE_ERROR, NULL, 0);
        req_release(q);
        return;
    }
    /* Answer first: drop_context() then only releases our request (its
     * reply_cb sees it answered) and fails the others with ERROR. */
    req_answer(q, FP_CACHE_TIMEOUT, NULL, 0);
    if (!q->in_hiredis) {
        req_release(q);
        return;
    }
    if (r->ac != NULL) {
        r->hung = 1;
        (void)snprintf(why, sizeof(why), "no reply within %u ms, reconnecting",
                 (unsigned)(r->timeout_tv.tv_sec * 1000 +
                            r->timeout_tv.tv_usec / 1000));
        log_down(r, why);
        drop_context(r);        /* reply_cb(q, NULL) frees q */
    }
    /* else hiredis still holds q and will release it when it calls back */
}

int fp_redis_get(struct fp_redis *r, const char *key, size_t keylen,
                 fp_cache_cb *cb, void *arg)
{
    struct rd_req *q;

    if (r->closing)
        return -1;
    q = calloc(1, sizeof(*q));
    if (q == NULL)
        return -1;
    q->r = r;
    q->cb = cb;
    q->arg = arg;
    q->timer = evtimer_new(r->base, timer_cb, q);
    if (q->timer == NULL) {
        free(q);
        return -1;
    }
    if (keylen == 0 || keylen > FP_MAX_KEY_LEN || r->ac == NULL ||
        r->inflight >= RD_MAX_PENDING)
        goto fail_fast;
    if (evtimer_add(q->timer, r->timeout) != 0)
        goto fail_fast;
    /* %b: binary-safe, hiredis formats the RESP length itself. */
    if (redisAsyncCommand(r->ac, reply_cb, q, "GET %b", key, keylen) !=
        REDIS_OK) {
        (void)event_del(q->timer);
        goto fail_fast;
    }
    q->in_hiredis = 1;
    q->sent = fp_stat_now();
    r->inflight++;
    return 0;

fail_fast:
    /* Never call back from inside fp_cache_get(): defer to the loop. */
    q->failfast = 1;
    TAILQ_INSERT_TAIL(&r->failq, q, link);
    event_active(q->timer, EV_TIMEOUT, 1);
    return 0;
}

static int resolve(struct fp_redis *r, const char *host, uint16_t port)
{
    struct addrinfo hints, *res = NULL;
    char ps[8];
    int rc;

    memset(&hints, 0, sizeof(hints));
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_NUMERICSERV;
    (void)snprintf(ps, sizeof(ps), "%u", (unsigned)port);
    rc = getaddrinfo(host, ps, &hints, &res);
    if (rc == 0 && res != NULL)
        rc = getnameinfo(res->ai_addr, res->ai_addrlen, r->ip, sizeof(r->ip),
                         NULL, 0, NI_NUMERICHOST);
    else if (rc == 0)
        rc = EAI_NONAME;
    if (res != NULL)
        freeaddrinfo(res);
    if (rc != 0) {
        fp_log(FP_LOG_ERROR, "redis %s: cannot resolve: %s", r->name,
               gai_strerror(rc));
        return -1;
    }
    r->port = port;
    return 0;
}

struct fp_redis *fp_redis_create(struct event_base *base,
                                 const struct fp_settings *st)
{
    struct fp_redis *r = calloc(1, sizeof(*r));

    if (r == NULL)
        return NULL;
    r->base = base;
    r->db = st->redis_db;
    TAILQ_INIT(&r->failq);
    r->timeout_tv.tv_sec = st->cache_timeout_ms / 1000;
    r->timeout_tv.tv_usec = (suseconds_t)(st->cache_timeout_ms % 1000) * 1000;
    r->timeout = event_base_init_common_timeout(base, &r->timeout_tv);
    if (r->timeout == NULL)
        r->timeout = &r->timeout_tv;
    r->retry = evtimer_new(base, retry_cb, r);
    if (r->retry == NULL)
        goto fail;
    if (st->redis_password != NULL &&
        (r->password = strdup(st->redis_password)) == NULL)
        goto fail;
    if (st->redis.unix_path != NULL) {
        (void)snprintf(r->name, sizeof(r->name), "unix:%s", st->redis.unix_path);
        if ((r->unix_path = strdup(st->redis.unix_path)) == NULL)
            goto fail;
    } else if (st->redis.host != NULL) {
        (void)snprintf(r->name, sizeof(r->name), "%s:%u", st->redis.host,
                 (unsigned)st->redis.port);
        /* getaddrinfo blocks, but the loop is not running yet. */
        if (resolve(r, st->redis.host, st->redis.port) != 0)
            goto fail;
    } else {
        fp_log(FP_LOG_ERROR, "redis: no server configured");
        goto fail;
    }
    fp_stats_backend_name(0, r->name);
    /* Connect now (non-blocking); a failure arms the retry timer. */
    do_connect(r);
    return r;

fail:
    fp_redis_free(r);
    return NULL;
}

void fp_redis_free(struct fp_redis *r)
{
    struct rd_req *q;
    redisAsyncContext *ac;

    if (r == NULL)
        return;
    r->closing = 1;
    ac = r->ac;
    r->ac = NULL;
    if (ac != NULL)
        redisAsyncFree(ac);     /* pending GETs: reply_cb(NULL) -> ERROR */
    while ((q = TAILQ_FIRST(&r->failq)) != NULL) {
        TAILQ_REMOVE(&r->failq, q, link);
        req_answer(q, FP_CACHE_ERROR, NULL, 0);
        req_release(q);
    }
    if (r->retry != NULL)
        event_free(r->retry);
    free(r->password);
    free(r->unix_path);
    free(r);
}

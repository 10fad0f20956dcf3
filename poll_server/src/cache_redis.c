/* cache_redis.c -- Redis backend: hiredis 0.14 async API on the libevent
 * loop (hiredis/adapters/libevent.h), one connection, TCP or unix socket,
 * to a fixed server or to the master Redis Sentinel names.
 *
 * hiredis 0.14 has no command timeout, so every request has its own timer.
 * Ownership of a request: hiredis holds its pointer (privdata) from
 * redisAsyncCommand() until it calls reply_cb() -- with a reply, or with
 * NULL when the context is freed. The request is freed only when the user
 * callback has run AND hiredis has let go, so neither a late reply nor a
 * timer can touch freed memory or answer twice.
 *
 * Failure model: health.h, the same as memcached's. A request not answered
 * in time gets TIMEOUT alone while replies still come; only silence for
 * timeout_ms marks Redis hung: then we redisAsyncFree() the context (not
 * redisAsyncDisconnect(), which waits for the pending replies forever),
 * which in 0.14 runs every pending callback with a NULL reply (ERROR)
 * before it returns when not called from a hiredis callback (we never do:
 * a drop decided inside one is deferred to the `drop` event). Only a value
 * or a nil resets the backoff; an error reply does not ("-ERR max number of
 * clients reached" comes on connect, before the server closes).
 *
 * Setup, queued before any GET on a new connection: AUTH [username]
 * password, SELECT db, and with Sentinel ROLE (the server must say it is
 * the master). A failed one drops the connection with the backoff, and
 * every reply after it on that connection is an ERROR: a failed SELECT
 * must not serve database 0's values.
 *
 * Sentinel ([redis] sentinels, master_name): before each connection the
 * sentinels are asked in turn (SENTINEL get-master-addr-by-name, each given
 * SENTINEL_TIMEOUT_MS); the first answer names the master. A lost or hung
 * master, or one whose ROLE is not master, is asked for again; a round
 * where no sentinel answers waits the backoff. The sentinel that answered
 * is kept subscribed to +switch-master: a failover for our master name
 * drops the connection and connects to the new address at once. Sentinels
 * with requirepass get AUTH first ([redis] sentinel_password_file). */
#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 200809L /* getaddrinfo under -std=c11 */
#endif
#include <arpa/inet.h>
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
#include "health.h"
#include "log.h"
#include "resolve.h"
#include "settings.h"
#include "stats.h"

#define RD_MAX_PENDING      10000
#define SENTINEL_TIMEOUT_MS 1000

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

struct rd_sentinel {
    char host[256];
    int port;
};

struct fp_redis {
    struct event_base *base;
    redisAsyncContext *ac;      /* NULL while down */
    int setup_failed;           /* on ac: every later reply is an ERROR */
    struct event *drop;         /* drops ac from outside hiredis */
    const char *drop_why;
    struct event *retry;
    char name[300];             /* for the log */
    char ip[64];                /* numeric, resolved at startup or given
                                 * by a sentinel */
    int port;
    char *unix_path;
    char *username, *password;
    int db;
    const struct timeval *timeout;
    struct timeval timeout_tv;
    unsigned timeout_ms;
    enum rd_log_state logged;
    struct fp_health health;
    size_t inflight;            /* requests hiredis holds */
    struct rd_reqq failq;
    int closing;

    /* Sentinel; nsentinels == 0: a fixed server. */
    struct rd_sentinel sentinels[FP_MAX_SENTINELS];
    size_t nsentinels;
    char *master_name;
    char *sentinel_password;    /* AUTH to each sentinel, or NULL */
    redisAsyncContext *sq;      /* the sentinel being asked, or NULL */
    size_t sq_index;            /* which one */
    size_t sq_tried;            /* in this round */
    struct event *sq_timer;
    redisAsyncContext *sub;     /* subscribed to +switch-master, or NULL */
    size_t sub_index;
};

static void do_connect(struct fp_redis *r);
static void ask_next_sentinel(struct fp_redis *r);

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

/* Reconnects after health.h's delay: at once after a connection that was
 * answering, else the jittered backoff. */
static void schedule_retry(struct fp_redis *r)
{
    struct timeval tv;
    unsigned delay;

    if (r->closing)
        return;
    delay = fp_health_next_delay(&r->health);
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
 * inside a hiredis callback (see drop_later). */
static void drop_context(struct fp_redis *r)
{
    redisAsyncContext *ac = r->ac;

    r->ac = NULL;               /* disconnect_cb and new gets see it down */
    (void)event_del(r->drop);
    if (ac != NULL)
        redisAsyncFree(ac);
    schedule_retry(r);
}

/* From inside a hiredis callback: the connection is useless (failed setup,
 * a switch of master). Replies still read on it are ERRORs meanwhile. */
static void drop_later(struct fp_redis *r, const char *why)
{
    fp_health_bad(&r->health);
    r->setup_failed = 1;
    r->drop_why = why;
    event_active(r->drop, EV_TIMEOUT, 1);
}

static void drop_cb(evutil_socket_t fd, short what, void *arg)
{
    struct fp_redis *r = arg;

    (void)fd;
    (void)what;
    if (r->ac == NULL)
        return;
    log_down(r, r->drop_why != NULL ? r->drop_why : "dropped");
    drop_context(r);
}

/* cppcheck-suppress constParameter ; hiredis's redisCallbackFn type */
static void reply_cb(redisAsyncContext *ac, void *reply, void *priv)
{
    struct rd_req *q = priv;
    struct fp_redis *r = q->r;
    redisReply *rep = reply;

    q->in_hiredis = 0;
    r->inflight--;
    if (rep != NULL)
        fp_health_rx(&r->health); /* late or not, Redis is sending */
    if (rep == NULL || (ac == r->ac && r->setup_failed)) {
        req_answer(q, FP_CACHE_ERROR, NULL, 0);
    } else if (rep->type == REDIS_REPLY_NIL || rep->type == REDIS_REPLY_STRING) {
        /* Only a real answer proves Redis serves: reset the backoff. */
        fp_health_good(&r->health);
        log_up(r);
        if (rep->type == REDIS_REPLY_NIL)
            req_answer(q, FP_CACHE_MISS, NULL, 0);
        else
            req_answer(q, FP_CACHE_HIT, rep->str, rep->len);
    } else {
        if (rep->type == REDIS_REPLY_ERROR)
            fp_log(FP_LOG_DEBUG, "redis %s: GET: %.*s", r->name,
                   (int)rep->len, rep->str);
        req_answer(q, FP_CACHE_ERROR, NULL, 0);
    }
    req_release(q);
}

/* AUTH, SELECT, ROLE: privdata is the backend. The first failure drops the
 * connection (deferred) and poisons the GETs queued behind it. */
/* cppcheck-suppress constParameter ; hiredis's redisCallbackFn type */
static void setup_cb(redisAsyncContext *ac, void *reply, void *priv)
{
    struct fp_redis *r = priv;
    redisReply *rep = reply;
    static char why[200];

    if (rep == NULL || ac != r->ac || r->setup_failed)
        return;
    fp_health_rx(&r->health);
    if (rep->type == REDIS_REPLY_ERROR) {
        (void)snprintf(why, sizeof(why), "setup command refused: %.*s",
                       (int)(rep->len < 150 ? rep->len : 150), rep->str);
        fp_log(FP_LOG_ERROR, "redis %s: %s", r->name, why);
        drop_later(r, why);
        return;
    }
    if (rep->type == REDIS_REPLY_ARRAY) { /* ROLE: "master", ... */
        if (rep->elements < 1 || rep->element[0]->type != REDIS_REPLY_STRING ||
            strcmp(rep->element[0]->str, "master") != 0) {
            fp_log(FP_LOG_WARN, "redis %s: not the master (ROLE %s), asking "
                   "the sentinels again", r->name,
                   rep->elements > 0 && rep->element[0]->type == REDIS_REPLY_STRING
                       ? rep->element[0]->str : "?");
            drop_later(r, "not the master");
        }
    }
}

static void connect_cb(const redisAsyncContext *ac, int status)
{
    struct fp_redis *r = ac->data;
    char why[200];

    if (r->ac != ac)
        return;
    if (status == REDIS_OK) {
        /* A stopped server's kernel still accepts: after a failure, wait
         * for a reply before calling it up. */
        if (!r->health.hung)
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

/* Queues the setup commands, before any GET. 0 or -1. */
static int queue_setup(struct fp_redis *r, redisAsyncContext *ac)
{
    if (r->password != NULL && r->username != NULL &&
        redisAsyncCommand(ac, setup_cb, r, "AUTH %s %s", r->username,
                          r->password) != REDIS_OK)
        return -1;
    if (r->password != NULL && r->username == NULL &&
        redisAsyncCommand(ac, setup_cb, r, "AUTH %s", r->password) != REDIS_OK)
        return -1;
    if (r->db != 0 &&
        redisAsyncCommand(ac, setup_cb, r, "SELECT %d", r->db) != REDIS_OK)
        return -1;
    if (r->nsentinels > 0 &&
        redisAsyncCommand(ac, setup_cb, r, "ROLE") != REDIS_OK)
        return -1;
    return 0;
}

/* Connects to the server (r->ip/port or unix_path): never blocks. */
static void do_connect(struct fp_redis *r)
{
    redisAsyncContext *ac;
    char why[200];

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
    r->setup_failed = 0;
    if (queue_setup(r, ac) != 0) {
        log_down(r, "cannot queue the setup commands");
        fp_health_bad(&r->health);
        drop_context(r);
    }
}

/* ---- Sentinel ---------------------------------------------------------- */

/* A master address from a sentinel: 0 or -1. Numeric only: a host name
 * (sentinels with announce-hostnames) would make redisAsyncConnect() call
 * getaddrinfo(), blocking the loop on DNS. */
static int set_master(struct fp_redis *r, const char *ip, const char *port)
{
    char *end;
    long p = strtol(port, &end, 10);
    unsigned char addr[sizeof(struct in6_addr)];

    if (*end != '\0' || p <= 0 || p > 65535 || strlen(ip) >= sizeof(r->ip))
        return -1;
    if (inet_pton(AF_INET, ip, addr) != 1 && inet_pton(AF_INET6, ip, addr) != 1) {
        fp_log(FP_LOG_WARN, "redis: sentinel gave master %s as %s, not an IP "
               "address (resolving it would block): asking again", r->master_name, ip);
        return -1;
    }
    if (strcmp(r->ip, ip) != 0 || r->port != (int)p)
        fp_log(FP_LOG_INFO, "redis: sentinel says master %s is %s:%ld",
               r->master_name, ip, p);
    memcpy(r->ip, ip, strlen(ip) + 1);
    r->port = (int)p;
    (void)snprintf(r->name, sizeof(r->name), "%s (master %s)", r->master_name,
                   ip);
    (void)snprintf(r->name + strlen(r->name), sizeof(r->name) - strlen(r->name),
                   ":%ld", p);
    return 0;
}

/* A sentinel connection that failed is freed by hiredis after this
 * returns (no disconnect callback): forget it, ask the next one. */
static void sentinel_ctx_cb(const redisAsyncContext *ac, int status)
{
    struct fp_redis *r = ac->data;

    if (status == REDIS_OK)
        return;
    if (ac == r->sub)
        r->sub = NULL;
    if (ac == r->sq) {
        r->sq = NULL;
        r->sq_index = (r->sq_index + 1) % r->nsentinels;
        event_active(r->sq_timer, EV_TIMEOUT, 1);
    }
}

static redisAsyncContext *sentinel_connect(struct fp_redis *r, size_t i)
{
    redisAsyncContext *ac = redisAsyncConnect(r->sentinels[i].host,
                                              r->sentinels[i].port);

    if (ac == NULL)
        return NULL;
    if (ac->err) {
        redisAsyncFree(ac);
        return NULL;
    }
    ac->data = r;
    if (redisLibeventAttach(ac, r->base) != REDIS_OK ||
        redisAsyncSetConnectCallback(ac, sentinel_ctx_cb) != REDIS_OK ||
        (r->sentinel_password != NULL &&
         redisAsyncCommand(ac, NULL, NULL, "AUTH %s",
                           r->sentinel_password) != REDIS_OK)) {
        redisAsyncFree(ac);
        return NULL;
    }
    return ac;
}

static void sub_disconnect_cb(const redisAsyncContext *ac, int status)
{
    struct fp_redis *r = ac->data;

    (void)status;
    if (r->sub == ac)
        r->sub = NULL; /* subscribed again after the next answer */
}

/* "+switch-master" messages: "<name> <old ip> <old port> <new ip> <new port>". */
/* cppcheck-suppress constParameter ; hiredis's redisCallbackFn type */
static void switch_cb(redisAsyncContext *ac, void *reply, void *priv)
{
    struct fp_redis *r = priv;
    redisReply *rep = reply;
    char name[130], oip[64], oport[8], nip[64], nport[8];
    const char *msg;

    if (rep == NULL || ac != r->sub || rep->type != REDIS_REPLY_ARRAY ||
        rep->elements != 3 || rep->element[2]->type != REDIS_REPLY_STRING)
        return;
    msg = rep->element[2]->str;
    if (sscanf(msg, "%129s %63s %7s %63s %7s", name, oip, oport, nip, nport) != 5 ||
        strcmp(name, r->master_name) != 0)
        return;
    fp_log(FP_LOG_WARN, "redis: sentinel: +switch-master %s", msg);
    if (set_master(r, nip, nport) != 0)
        return;
    if (r->ac != NULL)
        drop_later(r, "the master changed");
    /* The next connection goes to the new address at once, unasked. */
    r->health.backoff_ms = 0;
    r->health.hung = 0;
    r->sq_tried = SIZE_MAX;
    if (r->ac == NULL && r->sq == NULL)
        event_active(r->retry, EV_TIMEOUT, 1);
}

static void subscribe(struct fp_redis *r, size_t i)
{
    redisAsyncContext *ac;

    if (r->sub != NULL || (ac = sentinel_connect(r, i)) == NULL)
        return;
    if (redisAsyncSetDisconnectCallback(ac, sub_disconnect_cb) != REDIS_OK ||
        redisAsyncCommand(ac, switch_cb, r, "SUBSCRIBE +switch-master") != REDIS_OK) {
        redisAsyncFree(ac);
        return;
    }
    r->sub = ac;
    r->sub_index = i;
}

/* Ends the current question (answered or not); the context is closed
 * once hiredis is done with it. */
static void sentinel_done(struct fp_redis *r, int from_callback)
{
    redisAsyncContext *sq = r->sq;

    r->sq = NULL;
    if (r->sq_timer != NULL)
        (void)event_del(r->sq_timer);
    if (sq == NULL)
        return;
    if (from_callback)
        redisAsyncDisconnect(sq);
    else
        redisAsyncFree(sq);
}

/* cppcheck-suppress constParameter ; hiredis's redisCallbackFn type */
static void sentinel_reply_cb(redisAsyncContext *ac, void *reply, void *priv)
{
    struct fp_redis *r = priv;
    redisReply *rep = reply;

    if (ac != r->sq || rep == NULL)
        return; /* freed: the timer or a failed connect moved on */
    if (rep->type == REDIS_REPLY_ARRAY && rep->elements == 2 &&
        rep->element[0]->type == REDIS_REPLY_STRING &&
        rep->element[1]->type == REDIS_REPLY_STRING &&
        set_master(r, rep->element[0]->str, rep->element[1]->str) == 0) {
        size_t i = r->sq_index;

        sentinel_done(r, 1);
        subscribe(r, i);
        do_connect(r);
        return;
    }
    fp_log(FP_LOG_WARN, "redis: sentinel %s:%d does not know master %s%s%s",
           r->sentinels[r->sq_index].host, r->sentinels[r->sq_index].port,
           r->master_name, rep->type == REDIS_REPLY_ERROR ? ": " : "",
           rep->type == REDIS_REPLY_ERROR ? rep->str : "");
    sentinel_done(r, 1);
    r->sq_index = (r->sq_index + 1) % r->nsentinels;
    /* Not from inside this callback: the next one is asked from the loop. */
    event_active(r->sq_timer, EV_TIMEOUT, 1);
}

static void sentinel_lost_cb(const redisAsyncContext *ac, int status)
{
    struct fp_redis *r = ac->data;

    (void)status;
    if (ac != r->sq)
        return;
    /* hiredis frees it after this returns. */
    r->sq = NULL;
    r->sq_index = (r->sq_index + 1) % r->nsentinels;
    event_active(r->sq_timer, EV_TIMEOUT, 1);
}

static void sentinel_timer_cb(evutil_socket_t fd, short what, void *arg)
{
    struct fp_redis *r = arg;

    (void)fd;
    (void)what;
    if (r->sq != NULL) { /* no answer in time */
        fp_log(FP_LOG_WARN, "redis: sentinel %s:%d: no answer within %d ms",
               r->sentinels[r->sq_index].host, r->sentinels[r->sq_index].port,
               SENTINEL_TIMEOUT_MS);
        sentinel_done(r, 0);
        r->sq_index = (r->sq_index + 1) % r->nsentinels;
    }
    ask_next_sentinel(r);
}

/* Asks the next sentinel of this round; after all of them, the backoff. */
static void ask_next_sentinel(struct fp_redis *r)
{
    struct timeval tv = { SENTINEL_TIMEOUT_MS / 1000,
                          (suseconds_t)(SENTINEL_TIMEOUT_MS % 1000) * 1000 };
    redisAsyncContext *ac;

    while (r->sq_tried < r->nsentinels && !r->closing) {
        size_t i = r->sq_index;

        r->sq_tried++;
        if ((ac = sentinel_connect(r, i)) == NULL ||
            redisAsyncSetDisconnectCallback(ac, sentinel_lost_cb) != REDIS_OK ||
            redisAsyncCommand(ac, sentinel_reply_cb, r,
                              "SENTINEL get-master-addr-by-name %s",
                              r->master_name) != REDIS_OK) {
            if (ac != NULL)
                redisAsyncFree(ac);
            r->sq_index = (i + 1) % r->nsentinels;
            continue;
        }
        r->sq = ac;
        if (evtimer_add(r->sq_timer, &tv) != 0)
            fp_log(FP_LOG_ERROR, "redis: cannot arm the sentinel timer");
        return;
    }
    if (r->closing)
        return;
    log_down(r, "no sentinel named the master");
    fp_health_bad(&r->health);
    schedule_retry(r);
}

/* ---- connecting, the loop's side ---------------------------------------- */

static void retry_cb(evutil_socket_t fd, short what, void *arg)
{
    struct fp_redis *r = arg;

    (void)fd;
    (void)what;
    if (r->ac != NULL || r->closing || r->sq != NULL)
        return;
    if (r->nsentinels > 0 && r->sq_tried != SIZE_MAX) {
        r->sq_tried = 0; /* a new round, starting where the last one ended */
        ask_next_sentinel(r);
        return;
    }
    if (r->nsentinels > 0)
        r->sq_tried = 0; /* +switch-master gave the address: ask next time */
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
    /* Still replying, only not to this one in time: it alone is late,
     * hiredis keeps it until its reply comes. */
    if (r->ac == NULL || !fp_health_silent(&r->health, r->timeout_ms))
        return;
    fp_health_bad(&r->health);
    (void)snprintf(why, sizeof(why), "no reply within %u ms, reconnecting",
                   r->timeout_ms);
    log_down(r, why);
    drop_context(r);            /* reply_cb(q, NULL) frees q */
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
        r->setup_failed || r->inflight >= RD_MAX_PENDING)
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
    int rc = fp_resolve_numeric(host, port, r->ip, sizeof(r->ip));

    if (rc != 0) {
        fp_log(FP_LOG_ERROR, "redis %s: cannot resolve: %s", r->name,
               gai_strerror(rc));
        return -1;
    }
    r->port = port;
    return 0;
}

/* The sentinels, resolved once at start-up (the loop is not running). */
static int setup_sentinels(struct fp_redis *r, const struct fp_settings *st)
{
    for (size_t i = 0; i < st->nredis_sentinels; i++) {
        const struct fp_server_addr *a = &st->redis_sentinels[i];

        (void)snprintf(r->name, sizeof(r->name), "sentinel %s:%u", a->host,
                       (unsigned)a->port);
        if (resolve(r, a->host, a->port) != 0)
            return -1;
        (void)snprintf(r->sentinels[i].host, sizeof(r->sentinels[i].host),
                       "%s", r->ip);
        r->sentinels[i].port = a->port;
    }
    r->nsentinels = st->nredis_sentinels;
    r->ip[0] = '\0';
    r->port = 0;
    (void)snprintf(r->name, sizeof(r->name), "%s (via sentinels)",
                   st->redis_master_name);
    if ((r->master_name = strdup(st->redis_master_name)) == NULL ||
        (st->redis_sentinel_password != NULL &&
         (r->sentinel_password = strdup(st->redis_sentinel_password)) == NULL) ||
        (r->sq_timer = evtimer_new(r->base, sentinel_timer_cb, r)) == NULL)
        return -1;
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
    r->timeout_ms = st->cache_timeout_ms;
    r->timeout_tv.tv_sec = st->cache_timeout_ms / 1000;
    r->timeout_tv.tv_usec = (suseconds_t)(st->cache_timeout_ms % 1000) * 1000;
    r->timeout = event_base_init_common_timeout(base, &r->timeout_tv);
    if (r->timeout == NULL)
        r->timeout = &r->timeout_tv;
    r->retry = evtimer_new(base, retry_cb, r);
    r->drop = event_new(base, -1, 0, drop_cb, r);
    if (r->retry == NULL || r->drop == NULL)
        goto fail;
    if ((st->redis_password != NULL &&
         (r->password = strdup(st->redis_password)) == NULL) ||
        (st->redis_username != NULL &&
         (r->username = strdup(st->redis_username)) == NULL))
        goto fail;
    if (st->nredis_sentinels > 0 && st->redis_master_name != NULL) {
        if (setup_sentinels(r, st) != 0)
            goto fail;
    } else if (st->redis.unix_path != NULL) {
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
    fp_stats_backend_name(0, r->nsentinels > 0 ? st->redis_master_name : r->name);
    /* Connect (or ask) now, without blocking; a failure arms the retry. */
    if (r->nsentinels > 0)
        ask_next_sentinel(r);
    else
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
    sentinel_done(r, 0);
    if (r->sub != NULL) {
        ac = r->sub;
        r->sub = NULL;
        redisAsyncFree(ac);
    }
    while ((q = TAILQ_FIRST(&r->failq)) != NULL) {
        TAILQ_REMOVE(&r->failq, q, link);
        req_answer(q, FP_CACHE_ERROR, NULL, 0);
        req_release(q);
    }
    if (r->retry != NULL)
        event_free(r->retry);
    if (r->drop != NULL)
        event_free(r->drop);
    if (r->sq_timer != NULL)
        event_free(r->sq_timer);
    if (r->sentinel_password != NULL) {
        explicit_bzero(r->sentinel_password, strlen(r->sentinel_password));
        free(r->sentinel_password);
    }
    if (r->password != NULL) {
        explicit_bzero(r->password, strlen(r->password));
        free(r->password);
    }
    free(r->username);
    free(r->master_name);
    free(r->unix_path);
    free(r);
}

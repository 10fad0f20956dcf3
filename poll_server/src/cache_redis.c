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
 * in time gets TIMEOUT alone unless Redis has been silent long enough to
 * be hung (health.h; a late request's Redis is checked again when that
 * silence would be reached): then we redisAsyncFree() the context (not
 * redisAsyncDisconnect(), which waits for the pending replies forever),
 * which in 0.14 runs every pending callback with a NULL reply (ERROR)
 * before it returns when not called from a hiredis callback (we never do:
 * a drop decided inside one is deferred to the `drop` event). Only a value
 * or a nil resets the backoff; an error reply does not ("-ERR max number of
 * clients reached" comes on connect, before the server closes).
 *
 * Batches, as for memcached (cache_memcached.c): at most
 * RD_BATCHES_IN_FLIGHT (one) batch of GETs awaits its replies; a GET asked
 * for meanwhile is held on our queue, and the held ones are handed to
 * hiredis together (one write) when that batch's replies are all in, one
 * of them times out, or the connection goes. With nothing in flight a GET
 * is handed over at the end of its loop turn: no added wait when idle.
 *
 * Setup, queued before any GET on a new connection: AUTH [username]
 * password, SELECT db, and with Sentinel ROLE (the server must say it is
 * the master). A failed one drops the connection with the backoff, and
 * every reply after it on that connection is an ERROR: a failed SELECT
 * must not serve database 0's values.
 *
 * Sentinel ([redis] sentinels, master_name): before each connection the
 * sentinels are asked in turn (sentinel.c); the first answer names the
 * master. A lost or hung
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
#include "link.h"
#include "log.h"
#include "resolve.h"
#include "sentinel.h"
#include "settings.h"
#include "stats.h"

#define RD_MAX_PENDING      10000
/* Batches awaiting their replies on the connection; GETs asked for
 * meanwhile are held (ours, not yet hiredis's) and handed over together
 * when one is over. One, as for memcached (cache_memcached.c): a batch
 * then carries everything that arrived during the previous round trip. */
#define RD_BATCHES_IN_FLIGHT 1

struct fp_redis;

struct rd_req {
    TAILQ_ENTRY(rd_req) link;   /* on r->failq or r->heldq */
    struct fp_redis *r;
    struct event *timer;        /* deadline, or the deferred failure */
    fp_cache_cb *cb;
    void *arg;
    uint64_t sent;              /* fp_stat_now() when queued, 0 if never */
    int answered;               /* user callback has run */
    int in_hiredis;             /* hiredis still holds the pointer */
    int failfast;               /* never sent: timer delivers ERROR */
    int held;                   /* on r->heldq, not yet hiredis's */
    uint64_t batch;             /* its batch's number, once handed over */
    size_t keylen;
    char key[FP_MAX_KEY_LEN];
};

TAILQ_HEAD(rd_reqq, rd_req);

struct fp_redis {
    struct event_base *base;
    redisAsyncContext *ac;      /* NULL while down */
    int setup_failed;           /* on ac: every later reply is an ERROR */
    struct event *drop;         /* drops ac from outside hiredis */
    const char *drop_why;
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
    struct fp_link link;        /* up/down log, backoff, retry, hang check */
    size_t inflight;            /* requests hiredis holds */
    struct rd_reqq failq;
    int closing;

    /* Batches (the top of the file): a GET asked for while
     * RD_BATCHES_IN_FLIGHT batches await their replies waits on heldq
     * until one is over; the flush event hands the held ones to hiredis,
     * which writes them in one go. Batch numbers grow by one per batch;
     * batch_first > batch_seq: none in flight. */
    struct rd_reqq heldq;
    size_t nheld;
    struct event *flush;
    int flush_active;
    uint64_t batch_seq;         /* the last batch handed over */
    uint64_t batch_first;       /* the oldest batch in flight */
    size_t batch_left[RD_BATCHES_IN_FLIGHT]; /* batch b's unanswered GETs */

    /* Sentinel; sn.n == 0: a fixed server. */
    struct fp_sentinels sn;
    int use_known;              /* +switch-master gave the address: connect
                                 * to it without asking */
    redisAsyncContext *sub;     /* subscribed to +switch-master, or NULL */
    size_t sub_index;
};

static void do_connect(struct fp_redis *r);

/* Reconnects after health.h's delay, unless closing. */
static void schedule_retry(struct fp_redis *r)
{
    if (!r->closing)
        fp_link_retry(&r->link);
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

/* ---- batches: at most RD_BATCHES_IN_FLIGHT on the connection ---------- */

static void reply_cb(redisAsyncContext *ac, void *reply, void *priv);

static size_t flights(const struct fp_redis *r)
{
    return (size_t)(r->batch_seq + 1 - r->batch_first);
}

/* Batch b's unanswered GETs (b is in flight). */
static size_t *batch_left(struct fp_redis *r, uint64_t b)
{
    /* cppcheck-suppress moduloofone ; RD_BATCHES_IN_FLIGHT may be raised */
    return &r->batch_left[b % RD_BATCHES_IN_FLIGHT];
}

/* The held GETs go at the end of this loop turn, with every GET the
 * callbacks still to run in it ask for, if a batch may be sent (or fail,
 * if the connection is gone). */
static void flush_soon(struct fp_redis *r)
{
    if (r->nheld == 0 || r->flush_active ||
        flights(r) >= RD_BATCHES_IN_FLIGHT)
        return;
    event_active(r->flush, EV_TIMEOUT, 1);
    r->flush_active = 1;
}

/* Batch b is over: its replies are all in, or one of them timed out. The
 * older ones are over too (replies come in order, deadlines expire in
 * order). */
static void batch_over(struct fp_redis *r, uint64_t b)
{
    if (b < r->batch_first || b > r->batch_seq)
        return;
    r->batch_first = b + 1;
    flush_soon(r);
}

/* Hands every held GET to hiredis as the next batch (hiredis writes them
 * together when the socket is writable); without a usable connection
 * they fail. The queue is detached first: callbacks run here may ask for
 * GETs, which wait for the next batch. */
static void flush_cb(evutil_socket_t fd, short what, void *arg)
{
    struct fp_redis *r = arg;
    struct rd_reqq q;
    struct rd_req *x;
    size_t n = 0;

    (void)fd;
    (void)what;
    r->flush_active = 0;
    if (flights(r) >= RD_BATCHES_IN_FLIGHT)
        return;
    TAILQ_INIT(&q);
    TAILQ_CONCAT(&q, &r->heldq, link);
    r->nheld = 0;
    r->batch_seq++;
    while ((x = TAILQ_FIRST(&q)) != NULL) {
        TAILQ_REMOVE(&q, x, link);
        x->held = 0;
        /* %b: binary-safe, hiredis formats the RESP length itself. */
        if (r->ac == NULL || r->setup_failed ||
            redisAsyncCommand(r->ac, reply_cb, x, "GET %b", x->key,
                              x->keylen) != REDIS_OK) {
            req_answer(x, FP_CACHE_ERROR, NULL, 0);
            req_release(x);
            continue;
        }
        x->in_hiredis = 1;
        x->batch = r->batch_seq;
        r->inflight++;
        n++;
    }
    *batch_left(r, r->batch_seq) = n;
    if (n > 0)
        fp_stat_backend_batch(0, n);
    else
        batch_over(r, r->batch_seq); /* nothing went: nothing to wait for */
}

/* Drops the current context (if any); hiredis answers its pending
 * callbacks with NULL, i.e. ERROR, before this returns. Never called from
 * inside a hiredis callback (see drop_later). */
static void drop_context(struct fp_redis *r)
{
    redisAsyncContext *ac = r->ac;

    r->ac = NULL;               /* disconnect_cb and new gets see it down */
    (void)event_del(r->drop);
    (void)event_del(r->link.hangcheck);
    if (ac != NULL)
        redisAsyncFree(ac);
    schedule_retry(r);
}

/* From inside a hiredis callback: the connection is useless (failed setup,
 * a switch of master). Replies still read on it are ERRORs meanwhile. */
static void drop_later(struct fp_redis *r, const char *why)
{
    fp_health_bad(&r->link.health);
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
    fp_link_down(&r->link, r->drop_why != NULL ? r->drop_why : "dropped");
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
    if (q->batch >= r->batch_first && q->batch <= r->batch_seq &&
        --*batch_left(r, q->batch) == 0)
        batch_over(r, q->batch);
    if (rep != NULL)
        fp_health_rx(&r->link.health); /* late or not, Redis is sending */
    if (rep == NULL || (ac == r->ac && r->setup_failed)) {
        req_answer(q, FP_CACHE_ERROR, NULL, 0);
    } else if (rep->type == REDIS_REPLY_NIL || rep->type == REDIS_REPLY_STRING) {
        /* Only a real answer proves Redis serves: reset the backoff. */
        fp_health_good(&r->link.health);
        fp_link_up(&r->link, NULL);
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
    fp_health_rx(&r->link.health);
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
        if (!r->link.health.hung)
            fp_link_up(&r->link, NULL);
        return;
    }
    /* hiredis frees the context after this returns and answers the
     * pending callbacks with NULL; disconnect_cb is not called. */
    (void)snprintf(why, sizeof(why), "connect failed: %s", ac->errstr);
    fp_link_down(&r->link, why);
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
    fp_link_down(&r->link, why);
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
    if (r->sn.n > 0 &&
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
        fp_link_down(&r->link, "cannot allocate a context");
        schedule_retry(r);
        return;
    }
    if (ac->err) {
        (void)snprintf(why, sizeof(why), "connect failed: %s", ac->errstr);
        fp_link_down(&r->link, why);
        redisAsyncFree(ac);
        schedule_retry(r);
        return;
    }
    ac->data = r;
    if (redisLibeventAttach(ac, r->base) != REDIS_OK ||
        redisAsyncSetConnectCallback(ac, connect_cb) != REDIS_OK ||
        redisAsyncSetDisconnectCallback(ac, disconnect_cb) != REDIS_OK) {
        fp_link_down(&r->link, "cannot attach to the event loop");
        redisAsyncFree(ac);
        schedule_retry(r);
        return;
    }
    r->ac = ac;
    r->setup_failed = 0;
    r->batch_first = r->batch_seq + 1; /* nothing in flight on it */
    if (queue_setup(r, ac) != 0) {
        fp_link_down(&r->link, "cannot queue the setup commands");
        fp_health_bad(&r->link.health);
        drop_context(r);
    }
}

/* ---- Sentinel ---------------------------------------------------------- */

/* The master's address, numeric (a sentinel's answer or +switch-master). */
static void set_master(struct fp_redis *r, const char *ip, int port)
{
    if (strcmp(r->ip, ip) != 0 || r->port != port)
        fp_log(FP_LOG_INFO, "redis: sentinel says master %s is %s:%d",
               r->sn.master_name, ip, port);
    (void)snprintf(r->ip, sizeof(r->ip), "%s", ip);
    r->port = port;
    (void)snprintf(r->name, sizeof(r->name), "%s (master %s:%d)",
                   r->sn.master_name, ip, port);
}

/* The +switch-master connection failed: hiredis frees it after this
 * returns (no disconnect callback); subscribed again after the next
 * answer. */
static void sub_connect_cb(const redisAsyncContext *ac, int status)
{
    struct fp_redis *r = ac->data;

    if (status != REDIS_OK && ac == r->sub)
        r->sub = NULL;
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
    int port;

    if (rep == NULL || ac != r->sub || rep->type != REDIS_REPLY_ARRAY ||
        rep->elements != 3 || rep->element[2]->type != REDIS_REPLY_STRING)
        return;
    msg = rep->element[2]->str;
    if (sscanf(msg, "%129s %63s %7s %63s %7s", name, oip, oport, nip, nport) != 5 ||
        strcmp(name, r->sn.master_name) != 0)
        return;
    fp_log(FP_LOG_WARN, "redis: sentinel: +switch-master %s", msg);
    if (fp_sentinel_address(nip, nport, &port) != 0) {
        fp_log(FP_LOG_WARN, "redis: +switch-master names %s, not an IP address "
               "(resolving it would block): asking the sentinels again", nip);
        return;
    }
    set_master(r, nip, port);
    if (r->ac != NULL)
        drop_later(r, "the master changed");
    /* The next connection goes to the new address at once, unasked. */
    r->link.health.backoff_ms = 0;
    r->link.health.hung = 0;
    r->use_known = 1;
    if (r->ac == NULL && !fp_sentinels_asking(&r->sn))
        event_active(r->link.retry, EV_TIMEOUT, 1);
}

static void subscribe(struct fp_redis *r, size_t i)
{
    redisAsyncContext *ac;

    if (r->sub != NULL ||
        (ac = fp_sentinel_connect(&r->sn, i, r, sub_connect_cb)) == NULL)
        return;
    if (redisAsyncSetDisconnectCallback(ac, sub_disconnect_cb) != REDIS_OK ||
        redisAsyncCommand(ac, switch_cb, r, "SUBSCRIBE +switch-master") != REDIS_OK) {
        redisAsyncFree(ac);
        return;
    }
    r->sub = ac;
    r->sub_index = i;
}

/* The end of a round of questions (sentinel.h). */
static void sentinel_answer(void *arg, const char *ip, int port, size_t i)
{
    struct fp_redis *r = arg;

    if (r->closing)
        return;
    if (ip == NULL) {
        fp_link_down(&r->link, "no sentinel named the master");
        fp_health_bad(&r->link.health);
        schedule_retry(r);
        return;
    }
    set_master(r, ip, port);
    subscribe(r, i);
    do_connect(r);
}

/* ---- connecting, the loop's side ---------------------------------------- */

static void retry_cb(evutil_socket_t fd, short what, void *arg)
{
    struct fp_redis *r = arg;

    (void)fd;
    (void)what;
    if (r->ac != NULL || r->closing || fp_sentinels_asking(&r->sn))
        return;
    if (r->sn.n > 0 && !r->use_known) {
        fp_sentinels_ask(&r->sn);
        return;
    }
    r->use_known = 0;           /* asked again next time */
    do_connect(r);
}

/* The link's questions (link.h): a stall costs its late requests, a hang
 * the connection. */
static int waiting(void *arg)
{
    const struct fp_redis *r = arg;

    return !r->closing && r->ac != NULL && r->inflight > 0;
}

static void hung(void *arg, const char *why)
{
    struct fp_redis *r = arg;

    fp_link_down(&r->link, why);
    drop_context(r);            /* reply_cb(q, NULL) frees what hiredis held */
}

static const struct fp_link_ops redis_link = {
    "redis", "reply", "reconnecting", waiting, hung
};

static void timer_cb(evutil_socket_t fd, short what, void *arg)
{
    struct rd_req *q = arg;
    struct fp_redis *r = q->r;
    char why[160];

    (void)fd;
    (void)what;
    if (q->failfast) {
        TAILQ_REMOVE(&r->failq, q, link);
        req_answer(q, FP_CACHE_ERROR, NULL, 0);
        req_release(q);
        return;
    }
    if (q->held) {              /* never sent: it alone times out */
        TAILQ_REMOVE(&r->heldq, q, link);
        r->nheld--;
        q->held = 0;
        req_answer(q, FP_CACHE_TIMEOUT, NULL, 0);
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
    /* Still replying, or silent for less than a hang: it alone is late,
     * hiredis keeps it until its reply comes, and its batch is over (the
     * GETs held behind it go rather than wait for it). */
    if (r->ac != NULL && fp_link_late(&r->link, why, sizeof(why)) != 0)
        hung(r, why);
    else
        batch_over(r, q->batch);
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
    /* Stalled (health.h): not queued behind the late ones. */
    if (keylen == 0 || keylen > FP_MAX_KEY_LEN || r->ac == NULL ||
        r->setup_failed || r->inflight + r->nheld >= RD_MAX_PENDING ||
        r->link.health.stalled)
        goto fail_fast;
    if (evtimer_add(q->timer, r->timeout) != 0)
        goto fail_fast;
    /* Held for the next batch: nothing in flight, it goes at the end of
     * this loop turn (no added wait); else when a batch is over. */
    memcpy(q->key, key, keylen);
    q->keylen = keylen;
    q->held = 1;
    q->sent = fp_stat_now();
    TAILQ_INSERT_TAIL(&r->heldq, q, link);
    r->nheld++;
    flush_soon(r);
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

struct fp_redis *fp_redis_create(struct event_base *base,
                                 const struct fp_settings *st)
{
    struct fp_redis *r = calloc(1, sizeof(*r));

    if (r == NULL)
        return NULL;
    r->base = base;
    r->db = st->redis_db;
    TAILQ_INIT(&r->failq);
    TAILQ_INIT(&r->heldq);
    r->batch_first = 1;         /* batch_seq 0: none sent, none in flight */
    r->timeout_ms = st->cache_timeout_ms;
    r->timeout_tv.tv_sec = st->cache_timeout_ms / 1000;
    r->timeout_tv.tv_usec = (suseconds_t)(st->cache_timeout_ms % 1000) * 1000;
    r->timeout = event_base_init_common_timeout(base, &r->timeout_tv);
    if (r->timeout == NULL)
        r->timeout = &r->timeout_tv;
    r->drop = event_new(base, -1, 0, drop_cb, r);
    r->flush = event_new(base, -1, 0, flush_cb, r);
    if (fp_link_init(&r->link, base, &redis_link, r->name, 0, r->timeout_ms,
                     r, retry_cb) != 0 || r->drop == NULL || r->flush == NULL)
        goto fail;
    if ((st->redis_password != NULL &&
         (r->password = strdup(st->redis_password)) == NULL) ||
        (st->redis_username != NULL &&
         (r->username = strdup(st->redis_username)) == NULL))
        goto fail;
    if (st->nredis_sentinels > 0 && st->redis_master_name != NULL) {
        if (fp_sentinels_init(&r->sn, base, st, "redis", sentinel_answer, r) != 0)
            goto fail;
        (void)snprintf(r->name, sizeof(r->name), "%s (via sentinels)",
                       st->redis_master_name);
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
    fp_stats_backend_name(0, r->sn.n > 0 ? st->redis_master_name : r->name);
    /* Connect (or ask) now, without blocking; a failure arms the retry. */
    if (r->sn.n > 0)
        fp_sentinels_ask(&r->sn);
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
    fp_sentinels_clear(&r->sn);
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
    while ((q = TAILQ_FIRST(&r->heldq)) != NULL) {
        TAILQ_REMOVE(&r->heldq, q, link);
        r->nheld--;
        q->held = 0;
        req_answer(q, FP_CACHE_ERROR, NULL, 0);
        req_release(q);
    }
    fp_link_free(&r->link);
    if (r->drop != NULL)
        event_free(r->drop);
    if (r->flush != NULL)
        event_free(r->flush);
    if (r->password != NULL) {
        explicit_bzero(r->password, strlen(r->password));
        free(r->password);
    }
    free(r->username);
    free(r->unix_path);
    free(r);
}

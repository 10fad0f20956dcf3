/* announce.c -- SUBSCRIBE to the app's announcements (announce.h).
 *
 * Pub/sub is at most once: a message published while we are not
 * subscribed is lost. So every (re)subscription tells hold.c, which reads
 * every held key again; between connections the periodic re-check covers.
 * Setup on a new connection: AUTH [username] password if configured, then
 * SUBSCRIBE; a connection not subscribed within SETUP_MS (a server that
 * accepts and never answers) is dropped and tried again, with a backoff
 * from RETRY_MIN_MS doubling to RETRY_MAX_MS. A host name is resolved once,
 * at start-up: redisAsyncConnect() with a name calls getaddrinfo(), which
 * would block the loop on DNS at every reconnect.
 *
 * Alive or not: a Redis that is stopped, or a connection whose peer
 * vanished without a reset, looks subscribed forever while announcements
 * are lost. So while subscribed, Redis is asked something every [server]
 * announce_ping_ms, and a connection from which nothing at all (an answer,
 * an announcement) came for announce_timeout_ms is dropped (the metric says
 * 0 at once) and reconnected. The question is SUBSCRIBE to the channel
 * again, not PING: Redis answers it in subscribe mode (a no-op,
 * ["subscribe", channel, 1]) and hiredis hands that answer to the channel's
 * callback, while hiredis 0.14 (Debian 12) passes the ["pong", ""] answer
 * of a PING to no callback and keeps the PING's callback queued until the
 * connection ends, one per ping. TCP keepalive is on as well (the kernel's
 * own check, should the loop be blocked).
 *
 * Sentinel ([redis] sentinels and master_name, no [announce] server): the
 * app publishes on the master the sentinels name, so before each
 * connection the sentinels are asked in turn (sentinel.c, AUTH first with
 * [redis] sentinel_password_file) and the subscriber connects to the
 * address the first answer gives. A failover kills the old
 * master (or Sentinel kills its pub/sub clients as it demotes it): the
 * connection is lost, the sentinels are asked again, and the subscription
 * on the new master is a gap like any other (hold.c reads every held key
 * again). The backoff stops at SENTINEL_RETRY_MAX_MS: the sentinels name
 * the new master only once they have promoted it, and the sooner we ask
 * after that, the shorter the gap. */
#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 200809L /* getaddrinfo under -std=c11 */
#endif
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include <event2/event.h>
#include <hiredis/adapters/libevent.h>
#include <hiredis/async.h>
#include <hiredis/hiredis.h>

#include "announce.h"
#include "health.h"
#include "log.h"
#include "resolve.h"
#include "sentinel.h"
#include "settings.h"
#include "stats.h"

#define SETUP_MS     2000
#define RETRY_MIN_MS 100
#define RETRY_MAX_MS 5000
#define KEEPALIVE_S  5      /* TCP keepalive: idle, then probes 1 s apart */
#define KEEPALIVE_N  3
#define SENTINEL_RETRY_MAX_MS 1000

struct fp_announce {
    struct event_base *base;
    const char *host, *unix_path, *password, *username, *channel;
    unsigned port;
    char name[300];             /* for messages */
    char ip[NI_MAXHOST];        /* host, resolved at start-up */
    redisAsyncContext *ac;      /* NULL while down */
    int subscribed;
    int logged_down;            /* a failure was logged since the last up */
    unsigned backoff_ms, retry_max_ms;
    struct event *retry;        /* reconnect */
    struct event *setup;        /* not subscribed in time */
    struct event *drop;         /* drop the context, outside hiredis */
    struct event *ping;         /* while subscribed: asks, checks liveness */
    unsigned ping_ms, timeout_ms;
    uint64_t last_rx_ms;        /* fp_mono_ms() of the last reply */
    fp_announce_msg *msg;
    fp_announce_state *state;
    void *arg;

    struct fp_sentinels sn;     /* sn.n == 0: a fixed server */
};

static void ms_tv(unsigned ms, struct timeval *tv)
{
    tv->tv_sec = (time_t)(ms / 1000);
    tv->tv_usec = (suseconds_t)(ms % 1000) * 1000;
}

static void went_down(struct fp_announce *a, const char *why)
{
    struct timeval tv;

    int was = a->subscribed;

    if (was || !a->logged_down)
        fp_log(FP_LOG_WARN, "announce %s: %s; held polls rely on the "
               "re-check until subscribed again", a->name, why);
    a->logged_down = 1;
    a->subscribed = 0;
    fp_stat_subscriber(0);
    if (was)
        a->state(a->arg, 0);
    (void)event_del(a->setup);
    (void)event_del(a->ping);
    ms_tv(a->backoff_ms, &tv);
    if (evtimer_add(a->retry, &tv) != 0)
        fp_log(FP_LOG_ERROR, "announce: cannot arm the reconnect timer");
    a->backoff_ms = a->backoff_ms * 2 > a->retry_max_ms ? a->retry_max_ms
                                                         : a->backoff_ms * 2;
}

static void sub_cb(redisAsyncContext *ac, void *reply, void *priv);

/* Drops the context ourselves (never from inside a hiredis callback). */
static void drop_now(struct fp_announce *a, const char *why)
{
    redisAsyncContext *ac = a->ac;

    a->ac = NULL;               /* disconnect_cb sees it is not ours */
    (void)event_del(a->drop);
    if (ac != NULL)
        redisAsyncFree(ac);
    went_down(a, why);
}

static void drop_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    drop_now(arg, "dropped (AUTH or SUBSCRIBE refused)");
}

/* Every ping_ms while subscribed: dead if silent for timeout_ms, else ask
 * again (see the top of the file). */
static void ping_cb(evutil_socket_t fd, short what, void *arg)
{
    struct fp_announce *a = arg;
    char why[96];

    (void)fd;
    (void)what;
    if (a->ac == NULL || !a->subscribed)
        return;
    if (fp_mono_ms() - a->last_rx_ms >= a->timeout_ms) {
        (void)snprintf(why, sizeof(why), "nothing received for %u ms "
                       "(announce_timeout_ms), connection dropped",
                       a->timeout_ms);
        drop_now(a, why);
        return;
    }
    if (redisAsyncCommand(a->ac, sub_cb, a, "SUBSCRIBE %s", a->channel) !=
        REDIS_OK)
        drop_now(a, "cannot queue the liveness SUBSCRIBE");
}

static void setup_timeout(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    drop_now(arg, "not subscribed within 2 s");
}

/* cppcheck-suppress constParameter ; hiredis's redisCallbackFn type */
static void auth_cb(redisAsyncContext *ac, void *reply, void *priv)
{
    struct fp_announce *a = priv;
    const redisReply *r = reply;

    if (r == NULL || ac != a->ac)
        return;
    if (r->type == REDIS_REPLY_ERROR) {
        fp_log(FP_LOG_ERROR, "announce %s: AUTH: %s", a->name, r->str);
        event_active(a->drop, EV_TIMEOUT, 1);
    }
}

/* Subscription replies: ["subscribe", channel, n] once, then
 * ["message", channel, key] per announcement. */
/* cppcheck-suppress constParameter ; hiredis's redisCallbackFn type */
static void sub_cb(redisAsyncContext *ac, void *reply, void *priv)
{
    struct fp_announce *a = priv;
    const redisReply *r = reply;
    const redisReply *kind;

    if (r == NULL || ac != a->ac)
        return;
    a->last_rx_ms = fp_mono_ms();
    if (r->type == REDIS_REPLY_ERROR) {
        fp_log(FP_LOG_ERROR, "announce %s: SUBSCRIBE: %s", a->name, r->str);
        event_active(a->drop, EV_TIMEOUT, 1);
        return;
    }
    if (r->type != REDIS_REPLY_ARRAY || r->elements != 3 ||
        (kind = r->element[0])->type != REDIS_REPLY_STRING)
        return;
    if (strcmp(kind->str, "subscribe") == 0) {
        struct timeval tv;

        if (a->subscribed)
            return;             /* the answer to a liveness SUBSCRIBE */
        (void)event_del(a->setup);
        ms_tv(a->ping_ms, &tv);
        if (evtimer_add(a->ping, &tv) != 0)
            fp_log(FP_LOG_ERROR, "announce: cannot arm the liveness timer");
        a->subscribed = 1;
        a->logged_down = 0;
        a->backoff_ms = RETRY_MIN_MS;
        fp_stat_subscriber(1);
        fp_log(FP_LOG_INFO, "announce %s: subscribed to %s", a->name,
               a->channel);
        a->state(a->arg, 1);
    } else if (strcmp(kind->str, "message") == 0 &&
               r->element[2]->type == REDIS_REPLY_STRING) {
        size_t keylen;
        uint64_t published_ms;

        fp_stat_announcement();
        if (fp_announce_parse(r->element[2]->str, r->element[2]->len, &keylen,
                              &published_ms) != 0)
            fp_stat_announce_malformed();
        a->msg(a->arg, r->element[2]->str, keylen, published_ms);
    }
}

int fp_announce_parse(const char *msg, size_t len, size_t *keylen,
                      uint64_t *published_ms)
{
    const char *sp = memchr(msg, ' ', len);
    size_t i, n;
    uint64_t v = 0;

    *published_ms = 0;
    if (sp == NULL) {           /* an app from before the time suffix */
        *keylen = len;
        return 0;
    }
    *keylen = (size_t)(sp - msg);
    n = len - *keylen - 1;
    /* 15 digits: far past any date, and v cannot overflow. */
    if (n == 0 || n > 15)
        return -1;
    for (i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)sp[1 + i];

        if (ch < '0' || ch > '9')
            return -1;
        v = v * 10 + (uint64_t)(ch - '0');
    }
    *published_ms = v;
    return 0;
}

static void connect_cb(const redisAsyncContext *ac, int status)
{
    struct fp_announce *a = ac->data;

    if (a == NULL || ac != a->ac || status == REDIS_OK)
        return;
    /* hiredis frees the context after this returns. */
    a->ac = NULL;
    went_down(a, "connect failed");
}

static void disconnect_cb(const redisAsyncContext *ac, int status)
{
    struct fp_announce *a = ac->data;

    (void)status;
    if (a == NULL || ac != a->ac)
        return;                 /* we dropped it ourselves */
    a->ac = NULL;
    went_down(a, "connection lost");
}

/* TCP keepalive on the subscriber's socket: the kernel's own check of a
 * vanished peer, besides ping_cb's. */
static void keepalive(const struct fp_announce *a, int fd)
{
    int on = 1, idle = KEEPALIVE_S, intvl = 1, cnt = KEEPALIVE_N;

    if (setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &on, sizeof(on)) != 0 ||
        setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof(idle)) != 0 ||
        setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &intvl, sizeof(intvl)) != 0 ||
        setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof(cnt)) != 0)
        fp_log(FP_LOG_WARN, "announce %s: cannot enable TCP keepalive",
               a->name);
}

/* Connects to the server (a fixed one, or the master a sentinel named) and
 * queues AUTH and SUBSCRIBE. */
static void connect_server(struct fp_announce *a)
{
    redisAsyncContext *ac;
    struct timeval tv;
    int rc;

    ac = a->unix_path != NULL ? redisAsyncConnectUnix(a->unix_path)
                              : redisAsyncConnect(a->ip, (int)a->port);
    if (ac == NULL || ac->err) {
        if (ac != NULL)
            redisAsyncFree(ac);
        went_down(a, "connect failed");
        return;
    }
    ac->data = a;
    if (redisLibeventAttach(ac, a->base) != REDIS_OK ||
        redisAsyncSetConnectCallback(ac, connect_cb) != REDIS_OK ||
        redisAsyncSetDisconnectCallback(ac, disconnect_cb) != REDIS_OK) {
        redisAsyncFree(ac);
        went_down(a, "cannot attach to the event loop");
        return;
    }
    a->ac = ac;
    if (a->unix_path == NULL)
        keepalive(a, ac->c.fd);
    if (a->password != NULL && a->username != NULL)
        rc = redisAsyncCommand(ac, auth_cb, a, "AUTH %s %s", a->username,
                               a->password);
    else if (a->password != NULL)
        rc = redisAsyncCommand(ac, auth_cb, a, "AUTH %s", a->password);
    else
        rc = REDIS_OK;
    if (rc != REDIS_OK ||
        redisAsyncCommand(ac, sub_cb, a, "SUBSCRIBE %s", a->channel) != REDIS_OK) {
        drop_now(a, "cannot queue SUBSCRIBE");
        return;
    }
    ms_tv(SETUP_MS, &tv);
    if (evtimer_add(a->setup, &tv) != 0)
        fp_log(FP_LOG_ERROR, "announce: cannot arm the setup timer");
}

/* The end of a round of questions to the sentinels (sentinel.h). */
static void sentinel_answer(void *arg, const char *ip, int port, size_t i)
{
    struct fp_announce *a = arg;

    (void)i;
    if (ip == NULL) {
        went_down(a, "no sentinel named the master");
        return;
    }
    if (strcmp(a->ip, ip) != 0 || a->port != (unsigned)port)
        fp_log(FP_LOG_INFO, "announce: sentinel says master %s is %s:%d",
               a->sn.master_name, ip, port);
    (void)snprintf(a->ip, sizeof(a->ip), "%s", ip);
    a->port = (unsigned)port;
    (void)snprintf(a->name, sizeof(a->name), "%s (master %s:%d)",
                   a->sn.master_name, ip, port);
    connect_server(a);
}

/* The retry timer: a fixed server is connected to, the sentinels are
 * asked first (a new round, from where the last one ended). */
static void do_connect(evutil_socket_t fd, short what, void *arg)
{
    struct fp_announce *a = arg;

    (void)fd;
    (void)what;
    if (a->ac != NULL || fp_sentinels_asking(&a->sn))
        return;
    if (a->sn.n == 0)
        connect_server(a);
    else
        fp_sentinels_ask(&a->sn);
}

/* host -> a->ip, numeric (getaddrinfo blocks: the loop is not running). */
static int resolve(struct fp_announce *a)
{
    int rc = fp_resolve_numeric(a->host, a->port, a->ip, sizeof(a->ip));

    if (rc != 0) {
        fp_log(FP_LOG_ERROR, "announce %s: cannot resolve: %s", a->name,
               gai_strerror(rc));
        return -1;
    }
    return 0;
}

int fp_announce_new(struct event_base *base, const struct fp_settings *s,
                    fp_announce_msg *msg, fp_announce_state *state, void *arg,
                    struct fp_announce **out)
{
    struct fp_announce *a;
    const struct fp_server_addr *addr;

    *out = NULL;
    if (s->announce.host != NULL || s->announce.unix_path != NULL) {
        addr = &s->announce;
    } else if (s->nredis_sentinels > 0 || s->backend == FP_BACKEND_REDIS) {
        addr = &s->redis;       /* with sentinels: only its credentials */
    } else {
        fp_log(FP_LOG_INFO, "announce: no [announce] server nor [redis] "
               "sentinels: held polls learn of changes by the re-check alone");
        return 0;
    }
    if ((a = calloc(1, sizeof(*a))) == NULL)
        return -1;
    a->base = base;
    a->host = addr->host;
    a->port = addr->port;
    a->unix_path = addr->unix_path;
    if (addr == &s->announce) {
        a->password = s->announce_password;
        a->username = s->announce_username;
    } else {
        a->password = s->redis_password;
        a->username = s->redis_username;
    }
    a->channel = s->announce_channel != NULL ? s->announce_channel
                                             : "fastpoll:announce";
    if (a->unix_path != NULL)
        (void)snprintf(a->name, sizeof(a->name), "unix:%s", a->unix_path);
    else
        (void)snprintf(a->name, sizeof(a->name), "%s:%u",
                       a->host != NULL ? a->host : "?", a->port);
    a->msg = msg;
    a->state = state;
    a->arg = arg;
    a->backoff_ms = RETRY_MIN_MS;
    a->retry_max_ms = RETRY_MAX_MS;
    a->ping_ms = s->announce_ping_ms;
    a->timeout_ms = s->announce_timeout_ms;
    if (addr == &s->redis && s->nredis_sentinels > 0) {
        a->unix_path = NULL;
        a->retry_max_ms = SENTINEL_RETRY_MAX_MS;
        (void)snprintf(a->name, sizeof(a->name), "%s (via sentinels)",
                       s->redis_master_name);
        if (fp_sentinels_init(&a->sn, base, s, "announce", sentinel_answer,
                              a) != 0) {
            fp_announce_free(a);
            return -1;
        }
    } else if (a->unix_path == NULL && (a->host == NULL || resolve(a) != 0)) {
        fp_announce_free(a);
        return -1;
    }
    a->retry = evtimer_new(base, do_connect, a);
    a->setup = evtimer_new(base, setup_timeout, a);
    a->drop = event_new(base, -1, 0, drop_cb, a);
    a->ping = event_new(base, -1, EV_PERSIST, ping_cb, a);
    if (a->retry == NULL || a->setup == NULL || a->drop == NULL ||
        a->ping == NULL) {
        fp_announce_free(a);
        return -1;
    }
    event_active(a->retry, EV_TIMEOUT, 1); /* connect from the loop */
    *out = a;
    return 0;
}

int fp_announce_subscribed(const struct fp_announce *a)
{
    return a != NULL && a->subscribed;
}

void fp_announce_free(struct fp_announce *a)
{
    redisAsyncContext *ac;

    if (a == NULL)
        return;
    ac = a->ac;
    a->ac = NULL;               /* callbacks from the free are not ours */
    if (ac != NULL)
        redisAsyncFree(ac);
    fp_sentinels_clear(&a->sn);
    if (a->retry != NULL)
        event_free(a->retry);
    if (a->setup != NULL)
        event_free(a->setup);
    if (a->drop != NULL)
        event_free(a->drop);
    if (a->ping != NULL)
        event_free(a->ping);
    fp_stat_subscriber(0);
    free(a);
}

/* sentinel.c -- asking Redis Sentinels which server is the master
 * (sentinel.h).
 *
 * A round asks the sentinels in turn, starting after the last one asked:
 * a connection (AUTH first when they take a password), SENTINEL
 * get-master-addr-by-name, SENTINEL_TIMEOUT_MS for the answer. The first
 * usable answer ends the round; a refused connection, an error, a host
 * name instead of an address or silence moves on to the next sentinel,
 * always from the loop, never from inside the failed context's callback.
 * When every sentinel has failed, the round ends with no address and the
 * caller waits its own backoff. */
#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 200809L /* getaddrinfo under -std=c11 */
#endif
#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <hiredis/adapters/libevent.h>
#include <hiredis/hiredis.h>

#include "log.h"
#include "resolve.h"
#include "sentinel.h"

#define SENTINEL_TIMEOUT_MS 1000

static void ask_next(struct fp_sentinels *sn);

int fp_sentinel_address(const char *ip, const char *port, int *out)
{
    unsigned char addr[sizeof(struct in6_addr)];
    char *end;
    long p = strtol(port, &end, 10);

    if (*end != '\0' || p <= 0 || p > 65535 || strlen(ip) >= 64 ||
        (inet_pton(AF_INET, ip, addr) != 1 &&
         inet_pton(AF_INET6, ip, addr) != 1))
        return -1;
    *out = (int)p;
    return 0;
}

redisAsyncContext *fp_sentinel_connect(const struct fp_sentinels *sn,
                                       size_t i, void *data,
                                       redisConnectCallback *connected)
{
    redisAsyncContext *ac = redisAsyncConnect(sn->at[i].host, sn->at[i].port);

    if (ac == NULL)
        return NULL;
    if (ac->err) {
        redisAsyncFree(ac);
        return NULL;
    }
    ac->data = data;
    if (redisLibeventAttach(ac, sn->base) != REDIS_OK ||
        redisAsyncSetConnectCallback(ac, connected) != REDIS_OK ||
        (sn->password != NULL &&
         redisAsyncCommand(ac, NULL, NULL, "AUTH %s", sn->password) != REDIS_OK)) {
        redisAsyncFree(ac);
        return NULL;
    }
    return ac;
}

/* Ends the current question; from_callback: inside one of its context's
 * callbacks, where hiredis closes it once done instead. */
static void done(struct fp_sentinels *sn, int from_callback)
{
    redisAsyncContext *sq = sn->sq;

    sn->sq = NULL;
    if (sn->timer != NULL)
        (void)event_del(sn->timer);
    if (sq == NULL)
        return;
    if (from_callback)
        redisAsyncDisconnect(sq);
    else
        redisAsyncFree(sq);
}

/* The next sentinel, asked from the loop. */
static void move_on(struct fp_sentinels *sn)
{
    sn->index = (sn->index + 1) % sn->n;
    event_active(sn->timer, EV_TIMEOUT, 1);
}

/* The question's connection failed or was lost: hiredis frees it after
 * this returns. */
static void gone(const redisAsyncContext *ac)
{
    struct fp_sentinels *sn = ac->data;

    if (ac != sn->sq)
        return;
    sn->sq = NULL;
    move_on(sn);
}

static void connect_cb(const redisAsyncContext *ac, int status)
{
    if (status != REDIS_OK)
        gone(ac);
}

static void lost_cb(const redisAsyncContext *ac, int status)
{
    (void)status;
    gone(ac);
}

/* cppcheck-suppress constParameter ; hiredis's redisCallbackFn type */
static void reply_cb(redisAsyncContext *ac, void *reply, void *priv)
{
    struct fp_sentinels *sn = priv;
    const redisReply *r = reply;
    size_t i = sn->index;
    int port;

    if (ac != sn->sq || r == NULL)
        return;                 /* freed: the timer moved on */
    if (r->type == REDIS_REPLY_ARRAY && r->elements == 2 &&
        r->element[0]->type == REDIS_REPLY_STRING &&
        r->element[1]->type == REDIS_REPLY_STRING &&
        fp_sentinel_address(r->element[0]->str, r->element[1]->str,
                            &port) == 0) {
        done(sn, 1);
        sn->answer(sn->arg, r->element[0]->str, port, i);
        return;
    }
    fp_log(FP_LOG_WARN, "%s: sentinel %s:%d does not name master %s: %s",
           sn->who, sn->at[i].host, sn->at[i].port, sn->master_name,
           r->type == REDIS_REPLY_ERROR ? r->str
           : r->type == REDIS_REPLY_ARRAY && r->elements == 2
               ? "not an IP address (resolving it would block)"
               : "unknown to it");
    done(sn, 1);
    move_on(sn);
}

static void timer_cb(evutil_socket_t fd, short what, void *arg)
{
    struct fp_sentinels *sn = arg;

    (void)fd;
    (void)what;
    if (sn->sq != NULL) {       /* no answer in time */
        fp_log(FP_LOG_WARN, "%s: sentinel %s:%d: no answer within %d ms",
               sn->who, sn->at[sn->index].host, sn->at[sn->index].port,
               SENTINEL_TIMEOUT_MS);
        done(sn, 0);
        sn->index = (sn->index + 1) % sn->n;
    }
    ask_next(sn);
}

static void ask_next(struct fp_sentinels *sn)
{
    struct timeval tv = { SENTINEL_TIMEOUT_MS / 1000,
                          (suseconds_t)(SENTINEL_TIMEOUT_MS % 1000) * 1000 };
    redisAsyncContext *ac;

    while (sn->tried < sn->n) {
        size_t i = sn->index;

        sn->tried++;
        if ((ac = fp_sentinel_connect(sn, i, sn, connect_cb)) == NULL ||
            redisAsyncSetDisconnectCallback(ac, lost_cb) != REDIS_OK ||
            redisAsyncCommand(ac, reply_cb, sn,
                              "SENTINEL get-master-addr-by-name %s",
                              sn->master_name) != REDIS_OK) {
            if (ac != NULL)
                redisAsyncFree(ac);
            sn->index = (i + 1) % sn->n;
            continue;
        }
        sn->sq = ac;
        if (evtimer_add(sn->timer, &tv) != 0)
            fp_log(FP_LOG_ERROR, "%s: cannot arm the sentinel timer", sn->who);
        return;
    }
    sn->answer(sn->arg, NULL, 0, 0);
}

void fp_sentinels_ask(struct fp_sentinels *sn)
{
    if (sn->sq != NULL)
        return;                 /* a round is under way */
    sn->tried = 0;
    ask_next(sn);
}

int fp_sentinels_asking(const struct fp_sentinels *sn)
{
    return sn->sq != NULL;
}

int fp_sentinels_init(struct fp_sentinels *sn, struct event_base *base,
                      const struct fp_settings *s, const char *who,
                      fp_sentinel_answer *answer, void *arg)
{
    memset(sn, 0, sizeof(*sn));
    sn->base = base;
    sn->who = who;
    sn->answer = answer;
    sn->arg = arg;
    for (size_t i = 0; i < s->nredis_sentinels; i++) {
        const struct fp_server_addr *a = &s->redis_sentinels[i];
        int rc = fp_resolve_numeric(a->host, a->port, sn->at[i].host,
                                    sizeof(sn->at[i].host));

        if (rc != 0) {
            fp_log(FP_LOG_ERROR, "%s: sentinel %s:%u: cannot resolve: %s",
                   who, a->host, (unsigned)a->port, gai_strerror(rc));
            return -1;
        }
        sn->at[i].port = a->port;
    }
    sn->n = s->nredis_sentinels;
    if ((sn->master_name = strdup(s->redis_master_name)) == NULL ||
        (s->redis_sentinel_password != NULL &&
         (sn->password = strdup(s->redis_sentinel_password)) == NULL) ||
        (sn->timer = evtimer_new(base, timer_cb, sn)) == NULL) {
        fp_sentinels_clear(sn);
        return -1;
    }
    return 0;
}

void fp_sentinels_clear(struct fp_sentinels *sn)
{
    done(sn, 0);
    if (sn->timer != NULL)
        event_free(sn->timer);
    sn->timer = NULL;
    free(sn->master_name);
    sn->master_name = NULL;
    if (sn->password != NULL) {
        explicit_bzero(sn->password, strlen(sn->password));
        free(sn->password);
        sn->password = NULL;
    }
    sn->n = 0;
}

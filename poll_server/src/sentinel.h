/* sentinel.h -- asking Redis Sentinels which server is the master, on the
 * event loop: the cache's Redis client (cache_redis.c) and the
 * announcement subscriber (announce.c) share it. */
#ifndef FP_SENTINEL_H
#define FP_SENTINEL_H

#include <stddef.h>

#include <event2/event.h>
#include <hiredis/async.h>

#include "settings.h"

/* The end of a round: the master's numeric address and the index of the
 * sentinel that named it, or ip == NULL when none did (then called from
 * the loop). A context must not be freed from inside this callback: it
 * may run inside a hiredis callback. */
typedef void fp_sentinel_answer(void *arg, const char *ip, int port,
                                size_t index);

struct fp_sentinels {
    struct event_base *base;
    struct { char host[64]; int port; } at[FP_MAX_SENTINELS]; /* numeric */
    size_t n;                   /* 0: no Sentinel configured */
    const char *who;            /* the log's prefix */
    char *master_name;
    char *password;             /* AUTH to each sentinel, or NULL */
    redisAsyncContext *sq;      /* the sentinel being asked, or NULL */
    size_t index, tried;        /* which one; how many in this round */
    struct event *timer;        /* its answer's deadline; the next one */
    fp_sentinel_answer *answer;
    void *arg;
};

/* [redis] sentinels, master_name, sentinel_password_file: resolved once
 * (getaddrinfo blocks: call it before the loop runs). 0 or -1. */
int fp_sentinels_init(struct fp_sentinels *sn, struct event_base *base,
                      const struct fp_settings *s, const char *who,
                      fp_sentinel_answer *answer, void *arg);

/* Starts a round, from the sentinel after the last one asked: each is
 * given SENTINEL_TIMEOUT_MS; the round ends in one call of answer. */
void fp_sentinels_ask(struct fp_sentinels *sn);

int fp_sentinels_asking(const struct fp_sentinels *sn);

/* A connection to sentinel i, attached to the loop, with AUTH queued when
 * they take a password; ac->data = data. NULL on failure. */
redisAsyncContext *fp_sentinel_connect(const struct fp_sentinels *sn,
                                       size_t i, void *data,
                                       redisConnectCallback *connected);

/* A master's address as a sentinel gives it: 0 if ip is numeric (a host
 * name would make hiredis resolve it on the loop) and port valid. */
int fp_sentinel_address(const char *ip, const char *port, int *out);

/* Ends any question and frees what init made (the struct stays). */
void fp_sentinels_clear(struct fp_sentinels *sn);

#endif

/* cache_driver.c -- drives the cache backends against real servers, and
 * checks cache.h's contract on every answer: exactly once, never from
 * inside fp_cache_get(), never later than timeout_ms (+ slack).
 *
 *   cache_driver -b memcached -s "127.0.0.1:P1 127.0.0.1:P2" [-T ms]
 *   cache_driver -b redis -r 127.0.0.1:P | unix:/path [-a passfile] [-d db]
 *
 * Reads commands on stdin, one per line, answers on stdout:
 *   get KEY           -> "get KEY STATUS LEN MS VALUE" (value \xNN-escaped)
 *   mget N PREFIX     -> N gets PREFIX0..PREFIX<N-1> at once, then
 *                        "mget hit=.. miss=.. error=.. timeout=.. maxms=.."
 *                        followed by "notfound KEY" for each non-hit
 *   chain N KEY       -> gets KEY again from inside its own callback, N
 *                        times (re-entrant use, as coalesce.c does), then
 *                        "chain KEY STATUS..." with every answer's status
 *   hash KEY          -> "hash KEY INDEX" (memcached ketama server index)
 *   sleep MS          -> "slept MS" after MS on the loop
 *   stats             -> "stats I round_trips=.. keys_sent=.." per backend
 *   free              -> fp_cache_free() with requests in flight, "freed"
 *   quit              -> wait for all answers, free, exit 0 if no contract
 *                        violation was seen (else 1)
 * Not part of the poll server; built by hand or by the tests. */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <libmemcached/memcached.h>

#include "../src/cache.h"
#include "../src/log.h"
#include "../src/settings.h"
#include "../src/stats.h"

#define SLACK_MS 30

static struct event_base *base;
static struct fp_cache *cache;
static struct fp_settings st;
static memcached_st *memc;
static int in_get;
static long outstanding;
static int violations;
static int quitting;

struct mget {
    long left, hit, miss, err, tmo;
    double maxms;
    char **missing;
    long nmissing;
};

struct dreq {
    char key[FP_MAX_KEY_LEN + 1];
    struct timespec t0;
    int done;
    struct mget *m;
    int chain;                   /* a chain request */
    int chain_left;              /* chain: gets still to issue */
    char chain_log[256];
};

static double now_ms_since(const struct timespec *t0)
{
    struct timespec t;

    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)(t.tv_sec - t0->tv_sec) * 1e3 +
           (double)(t.tv_nsec - t0->tv_nsec) / 1e6;
}

static const char *stname(enum fp_cache_status s)
{
    switch (s) {
    case FP_CACHE_HIT: return "HIT";
    case FP_CACHE_MISS: return "MISS";
    case FP_CACHE_ERROR: return "ERROR";
    case FP_CACHE_TIMEOUT: return "TIMEOUT";
    }
    return "?";
}

static void maybe_exit(void)
{
    if (quitting && outstanding == 0)
        event_base_loopexit(base, NULL);
}

static void on_answer(enum fp_cache_status s, const char *val, size_t len,
                      void *arg)
{
    struct dreq *d = arg;
    double ms = now_ms_since(&d->t0);
    size_t i;

    if (in_get) {
        printf("VIOLATION callback inside fp_cache_get %s\n", d->key);
        violations++;
    }
    if (d->done) {
        printf("VIOLATION second callback %s\n", d->key);
        violations++;
        return;
    }
    d->done = 1;
    if (d->chain) {
        size_t used = strlen(d->chain_log);
        snprintf(d->chain_log + used, sizeof(d->chain_log) - used, " %s",
                 stname(s));
        if (d->chain_left > 0) {
            /* Re-entrant: a new get from inside this callback. */
            struct dreq *n = calloc(1, sizeof(*n));
            if (n != NULL) {
                memcpy(n, d, sizeof(*n));
                n->done = 0;
                n->chain_left--;
                clock_gettime(CLOCK_MONOTONIC, &n->t0);
                in_get = 1;
                if (fp_cache_get(cache, n->key, strlen(n->key), on_answer,
                                 n) == 0) {
                    in_get = 0;
                    free(d);
                    return;     /* outstanding stays: n replaces d */
                }
                in_get = 0;
                free(n);
            }
        }
        printf("chain %s%s\n", d->key, d->chain_log);
        fflush(stdout);
        free(d);
        outstanding--;
        maybe_exit();
        return;
    }
    if (ms > st.cache_timeout_ms + SLACK_MS) {
        printf("VIOLATION late answer %s %.1f ms\n", d->key, ms);
        violations++;
    }
    if ((s == FP_CACHE_HIT) != (val != NULL) && !(s == FP_CACHE_HIT && len == 0)) {
        printf("VIOLATION value pointer vs status %s\n", d->key);
        violations++;
    }
    if (d->m != NULL) {
        struct mget *m = d->m;
        switch (s) {
        case FP_CACHE_HIT: m->hit++; break;
        case FP_CACHE_MISS: m->miss++; break;
        case FP_CACHE_ERROR: m->err++; break;
        case FP_CACHE_TIMEOUT: m->tmo++; break;
        }
        if (s != FP_CACHE_HIT)
            m->missing[m->nmissing++] = strdup(d->key);
        if (ms > m->maxms)
            m->maxms = ms;
        if (--m->left == 0) {
            long j;
            printf("mget hit=%ld miss=%ld error=%ld timeout=%ld maxms=%.1f\n",
                   m->hit, m->miss, m->err, m->tmo, m->maxms);
            for (j = 0; j < m->nmissing; j++) {
                printf("notfound %s\n", m->missing[j] ? m->missing[j] : "?");
                free(m->missing[j]);
            }
            free(m->missing);
            free(m);
        }
    } else {
        printf("get %s %s %zu %.1f ", d->key, stname(s), len, ms);
        for (i = 0; i < len; i++) {
            unsigned char c = (unsigned char)val[i];
            if (c > 0x20 && c < 0x7F && c != '\\')
                putchar(c);
            else
                printf("\\x%02X", c);
        }
        putchar('\n');
    }
    fflush(stdout);
    free(d);
    outstanding--;
    maybe_exit();
}

static int start_get(const char *key, struct mget *m)
{
    struct dreq *d = calloc(1, sizeof(*d));
    int rc;

    if (d == NULL)
        return -1;
    snprintf(d->key, sizeof(d->key), "%s", key);
    d->m = m;
    clock_gettime(CLOCK_MONOTONIC, &d->t0);
    outstanding++;
    in_get = 1;
    rc = fp_cache_get(cache, key, strlen(key), on_answer, d);
    in_get = 0;
    if (rc != 0) {
        outstanding--;
        free(d);
        printf("get %s QUEUEFAIL\n", key);
        return -1;
    }
    return 0;
}

static void slept(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    printf("slept %ld\n", (long)(intptr_t)arg);
    fflush(stdout);
}

static void on_line(char *line)
{
    char key[512];
    long n;

    if (sscanf(line, "get %511s", key) == 1) {
        (void)start_get(key, NULL);
    } else if (sscanf(line, "mget %ld %400s", &n, key) == 2 && n > 0) {
        struct mget *m = calloc(1, sizeof(*m));
        long i;
        char k[600];
        if (m == NULL)
            return;
        m->missing = calloc((size_t)n, sizeof(char *));
        m->left = n;
        for (i = 0; i < n; i++) {
            snprintf(k, sizeof(k), "%s%ld", key, i);
            if (start_get(k, m) != 0)
                m->left--;
        }
    } else if (sscanf(line, "chain %ld %250s", &n, key) == 2 && n > 0 &&
               n < 40) {
        struct dreq *d = calloc(1, sizeof(*d));
        if (d == NULL)
            return;
        snprintf(d->key, sizeof(d->key), "%.250s", key);
        d->chain = 1;
        d->chain_left = (int)n - 1;
        d->chain_log[0] = '\0';
        clock_gettime(CLOCK_MONOTONIC, &d->t0);
        outstanding++;
        in_get = 1;
        if (fp_cache_get(cache, key, strlen(key), on_answer, d) != 0) {
            outstanding--;
            free(d);
        }
        in_get = 0;
    } else if (sscanf(line, "hash %511s", key) == 1) {
        printf("hash %s %u\n", key,
               memc ? memcached_generate_hash(memc, key, strlen(key)) : 0);
    } else if (sscanf(line, "sleep %ld", &n) == 1) {
        struct timeval tv = {n / 1000, (n % 1000) * 1000};
        if (event_base_once(base, -1, EV_TIMEOUT, slept, (void *)(intptr_t)n,
                            &tv) != 0)
            printf("sleep failed\n");
    } else if (strcmp(line, "stats") == 0) {
        size_t i;
        for (i = 0; i < fp_stats.nbackends; i++)
            printf("stats %zu round_trips=%llu keys_sent=%llu\n", i,
                   (unsigned long long)fp_stats.backends[i].round_trips,
                   (unsigned long long)fp_stats.backends[i].keys_sent);
    } else if (strcmp(line, "free") == 0) {
        fp_cache_free(cache);
        cache = NULL;
        printf("freed outstanding=%ld\n", outstanding);
        if (outstanding != 0)
            violations++;
        quitting = 1;
        event_base_loopexit(base, NULL);
    } else if (strcmp(line, "quit") == 0) {
        quitting = 1;
        maybe_exit();
    } else if (line[0] != '\0') {
        printf("unknown command: %s\n", line);
    }
    fflush(stdout);
}

static void stdin_read(struct bufferevent *bev, void *arg)
{
    struct evbuffer *in = bufferevent_get_input(bev);
    char *line;
    size_t n;

    (void)arg;
    while ((line = evbuffer_readln(in, &n, EVBUFFER_EOL_LF)) != NULL) {
        on_line(line);
        free(line);
    }
}

static void stdin_event(struct bufferevent *bev, short what, void *arg)
{
    (void)bev;
    (void)what;
    (void)arg;
    quitting = 1;
    maybe_exit();
}

static int add_server(const char *hp, struct fp_server_addr *a)
{
    const char *colon;

    memset(a, 0, sizeof(*a));
    if (strncmp(hp, "unix:", 5) == 0) {
        a->unix_path = strdup(hp + 5);
        return a->unix_path ? 0 : -1;
    }
    colon = strrchr(hp, ':');
    if (colon == NULL)
        return -1;
    a->host = strndup(hp, (size_t)(colon - hp));
    a->port = (uint16_t)atoi(colon + 1);
    return a->host ? 0 : -1;
}

static char *read_first_line(const char *path)
{
    char buf[512];
    FILE *f = fopen(path, "r");

    if (f == NULL || fgets(buf, sizeof(buf), f) == NULL) {
        if (f)
            fclose(f);
        return NULL;
    }
    fclose(f);
    buf[strcspn(buf, "\r\n")] = '\0';
    return strdup(buf);
}

int main(int argc, char **argv)
{
    int c;
    struct bufferevent *in;
    char *list = NULL, *tok, *save = NULL;
    size_t i;

    st.backend = FP_BACKEND_MEMCACHED;
    st.cache_timeout_ms = 100;
    while ((c = getopt(argc, argv, "b:s:r:a:d:T:q")) != -1) {
        switch (c) {
        case 'b':
            st.backend = strcmp(optarg, "redis") == 0 ? FP_BACKEND_REDIS
                                                      : FP_BACKEND_MEMCACHED;
            break;
        case 's': list = optarg; break;
        case 'r':
            if (add_server(optarg, &st.redis) != 0)
                return 2;
            break;
        case 'a':
            st.redis_password = read_first_line(optarg);
            if (st.redis_password == NULL)
                return 2;
            break;
        case 'd': st.redis_db = atoi(optarg); break;
        case 'T': st.cache_timeout_ms = (unsigned)atoi(optarg); break;
        case 'q': fp_log_set_level(FP_LOG_INFO); break;
        default: return 2;
        }
    }
    if (list != NULL) {
        for (tok = strtok_r(list, " ,", &save); tok != NULL;
             tok = strtok_r(NULL, " ,", &save)) {
            if (st.nmc_servers == FP_MAX_SERVERS ||
                add_server(tok, &st.mc_servers[st.nmc_servers++]) != 0)
                return 2;
        }
        /* An independent ketama instance, to print a key's server. */
        memc = memcached_create(NULL);
        for (i = 0; i < st.nmc_servers; i++)
            (void)memcached_server_add(memc, st.mc_servers[i].host,
                                       st.mc_servers[i].port);
        (void)memcached_behavior_set(memc, MEMCACHED_BEHAVIOR_KETAMA, 1);
    }

    base = event_base_new();
    if (base == NULL)
        return 1;
    cache = fp_cache_create(base, &st);
    if (cache == NULL) {
        fprintf(stderr, "fp_cache_create failed\n");
        return 1;
    }
    in = bufferevent_socket_new(base, 0, 0);
    bufferevent_setcb(in, stdin_read, NULL, stdin_event, NULL);
    bufferevent_enable(in, EV_READ);
    (void)event_base_dispatch(base);

    fp_cache_free(cache);
    if (outstanding != 0) {
        printf("VIOLATION %ld requests never answered\n", outstanding);
        violations++;
    }
    bufferevent_free(in);
    event_base_free(base);
    if (memc)
        memcached_free(memc);
    for (i = 0; i < st.nmc_servers; i++)
        free(st.mc_servers[i].host);
    free(st.redis.host);
    free(st.redis.unix_path);
    free(st.redis_password);
    printf("exit violations=%d\n", violations);
    return violations ? 1 : 0;
}

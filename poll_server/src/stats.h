/* stats.h -- the poll server's counters, read by admin.c for /metrics.
 *
 * The process is single-threaded, so a counter is a plain uint64_t in one
 * global struct (Redis's server.stat_* style): an increment on the hot path
 * is one add to memory that is already in cache. No atomics, no locks, no
 * allocation. Build with -DFP_NO_STATS to compile every hook below out (the
 * benchmark's "metrics off" build); the admin listener then serves zeros. */
#ifndef FP_STATS_H
#define FP_STATS_H

#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include "cache.h"
#include "settings.h"

enum fp_stat_method {
    FP_STAT_GET, FP_STAT_HEAD, FP_STAT_POST, FP_STAT_OTHER, FP_STAT_NMETHODS
};

/* How a request left the poll server. */
enum fp_stat_outcome {
    FP_STAT_HIT,                /* 200 from the cache */
    FP_STAT_MISS,               /* 404: the cache has no such key */
    FP_STAT_INVALID_KEY,        /* 404: no valid key, never sent to a cache */
    FP_STAT_BACKEND_ERROR,      /* 503: cache down, refused, protocol error */
    FP_STAT_TIMEOUT,            /* 503: no answer within [cache] timeout_ms */
    FP_STAT_METHOD_NOT_ALLOWED, /* 405 */
    FP_STAT_FORBIDDEN,          /* 403: [signing] on, no valid signature */
    FP_STAT_CLIENT_CLOSED,      /* the connection went away before the answer */
    FP_STAT_NOT_MODIFIED,       /* 304: If-None-Match matched (at once or held) */
    FP_STAT_BAD_REQUEST,        /* 400: a bad wait= */
    FP_STAT_NOUTCOMES
};

/* Why accept() failed (accept.c). */
enum fp_stat_accept {
    FP_STAT_ACCEPT_EMFILE, FP_STAT_ACCEPT_ENFILE, FP_STAT_ACCEPT_NOMEM,
    FP_STAT_ACCEPT_OTHER, FP_STAT_NACCEPT
};

/* Why a held poll was answered (hold.c). */
enum fp_stat_wake {
    FP_STAT_WAKE_ANNOUNCEMENT,  /* an announcement, then a read: changed */
    FP_STAT_WAKE_RECHECK,       /* the periodic re-check read: changed */
    FP_STAT_WAKE_TIMEOUT,       /* the wait ended: 304 */
    FP_STAT_WAKE_SHUTDOWN,      /* SIGTERM's drain: 304 */
    FP_STAT_NWAKE
};

/* Why an event stream ended (stream.c). */
enum fp_stat_stream_end {
    FP_STAT_STREAM_CLIENT,      /* the client went away */
    FP_STAT_STREAM_LIFETIME,    /* [stream] lifetime_s */
    FP_STAT_STREAM_DRAIN,       /* SIGTERM's drain */
    FP_STAT_STREAM_CACHE,       /* its key missed or a change could not be
                                 * read: the client falls back and resumes */
    FP_STAT_STREAM_SLOW,        /* its reader fell [stream] max_buffered
                                 * behind */
    FP_STAT_STREAM_OVER_CAP,    /* [stream] max were held: one event */
    FP_STAT_NSTREAM_END
};

/* Backend latency buckets, upper bounds in microseconds (+Inf is implied). */
#define FP_STAT_LATENCY_BUCKETS \
    { 100, 250, 500, 1000, 2500, 5000, 10000, 25000, 50000, 100000, 250000, \
      500000, 1000000 }
#define FP_STAT_NBUCKETS 13

/* Publish-to-delivery buckets, upper bounds in milliseconds (+Inf implied):
 * 1 ms (same host, idle) to 30 s (the longest default wait). */
#define FP_STAT_DELIVERY_BUCKETS \
    { 1, 2, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000 }
#define FP_STAT_NDELIVERY 14

/* One cache server: memcached nodes in config order, or the Redis server. */
struct fp_stat_backend {
    char name[300];             /* host:port or unix:/path, the metric label */
    int up;                     /* answering now (1) or not (0) */
    uint64_t results[4];        /* gets by enum fp_cache_status */
    uint64_t buckets[FP_STAT_NBUCKETS + 1]; /* answered gets, not cumulative */
    uint64_t sum_ns;            /* of answered gets */
    uint64_t replica_reads;     /* gets sent here as a key's replica */
    uint64_t round_trips;       /* batches of gets written (one each) */
    uint64_t keys_sent;         /* the gets in them: keys per round trip =
                                 * keys_sent / round_trips */
    uint64_t recover_until_ms;  /* CLOCK_MONOTONIC ms: read through replicas
                                 * until then (back from down or hung) */
};

struct fp_stats {
    uint64_t requests[FP_STAT_NMETHODS][FP_STAT_NOUTCOMES];
    /* The event loop, counted around epoll_wait (stats.c): one call is one
     * iteration; `active` sums the descriptors it returned ready and
     * `registered` the descriptors in the epoll set at the call. */
    uint64_t loop_iterations, loop_active_fds, loop_registered_fds;
    uint64_t registered_fds_now;
    uint64_t accept_errors[FP_STAT_NACCEPT];
    uint64_t open_connections;  /* client connections accepted, not closed */
    struct fp_stat_backend backends[FP_MAX_SERVERS];
    size_t nbackends;
    /* Conditional and long polls (hold.c, announce.c). */
    uint64_t held_now;          /* wait= polls held now */
    uint64_t wakeups[FP_STAT_NWAKE];
    uint64_t held_over_cap;     /* answered at once: [server] max_held reached */
    /* Event streams (stream.c). */
    uint64_t streams_now;
    uint64_t stream_events;     /* events written (not heartbeats) */
    uint64_t stream_heartbeats;
    uint64_t stream_ends[FP_STAT_NSTREAM_END];
    uint64_t announcements;     /* messages received on [announce] channel */
    int subscriber_up;          /* subscribed to the channel now */
    uint64_t announce_malformed; /* a time suffix that did not parse */
    /* Held polls answered with a new body after a timed announcement:
     * delivery - publish (wall clocks of two hosts, hence the clamp). */
    uint64_t delivery_buckets[FP_STAT_NDELIVERY + 1]; /* not cumulative */
    uint64_t delivery_sum_ms;
    uint64_t delivery_negative; /* publish after delivery: counted as 0 */
    struct timespec started;    /* CLOCK_MONOTONIC */
    time_t started_wall;
};

extern struct fp_stats fp_stats;

/* At start-up, before the event base is created. */
void fp_stats_init(void);

/* At exit, after the event base is freed. */
void fp_stats_free(void);

/* Backend i (0-based, config order) is called `name` (copied, truncated). */
void fp_stats_backend_name(size_t i, const char *name);

#ifdef FP_NO_STATS

#define fp_stat_request(m, o) ((void)(m), (void)(o))
#define fp_stat_backend_up(i, v) ((void)(i), (void)(v))
#define fp_stat_now() ((uint64_t)0)
#define fp_stat_backend_done(i, st, t0) ((void)(i), (void)(st), (void)(t0))
#define fp_stat_replica_read(i) ((void)(i))
#define fp_stat_backend_batch(i, n) ((void)(i), (void)(n))
#define fp_stat_backend_recovering(i, until) ((void)(i), (void)(until))
#define fp_stat_accept_error(r) ((void)(r))
#define fp_stat_conn_open() ((void)0)
#define fp_stat_conn_closed() ((void)0)
#define fp_stat_held(d) ((void)(d))
#define fp_stat_wake(c) ((void)(c))
#define fp_stat_stream_open() ((void)0)
#define fp_stat_stream_end(w) ((void)(w))
#define fp_stat_stream_event() ((void)0)
#define fp_stat_stream_heartbeat() ((void)0)
#define fp_stat_over_cap() ((void)0)
#define fp_stat_announcement() ((void)0)
#define fp_stat_subscriber(up) ((void)(up))
#define fp_stat_announce_malformed() ((void)0)
#define fp_stat_delivered(pub, now) ((void)(pub), (void)(now))

#else

static inline void fp_stat_request(enum fp_stat_method m,
                                   enum fp_stat_outcome o)
{
    fp_stats.requests[m][o]++;
}

static inline void fp_stat_backend_up(size_t i, int up)
{
    if (i < FP_MAX_SERVERS)
        fp_stats.backends[i].up = up;
}

/* A get for a key whose primary cannot answer went to backend i, its
 * replica (docs/design.md, "Replicas"). */
static inline void fp_stat_replica_read(size_t i)
{
    if (i < FP_MAX_SERVERS)
        fp_stats.backends[i].replica_reads++;
}

/* A batch of n gets went to backend i: one round trip (cache_memcached.c,
 * cache_redis.c; health probes are not counted). */
static inline void fp_stat_backend_batch(size_t i, size_t n)
{
    if (i < FP_MAX_SERVERS) {
        fp_stats.backends[i].round_trips++;
        fp_stats.backends[i].keys_sent += n;
    }
}

static inline void fp_stat_backend_recovering(size_t i, uint64_t until_ms)
{
    if (i < FP_MAX_SERVERS)
        fp_stats.backends[i].recover_until_ms = until_ms;
}

static inline void fp_stat_accept_error(enum fp_stat_accept r)
{
    fp_stats.accept_errors[r]++;
}

static inline void fp_stat_conn_open(void)
{
    fp_stats.open_connections++;
}

static inline void fp_stat_conn_closed(void)
{
    if (fp_stats.open_connections > 0)
        fp_stats.open_connections--;
}

/* A poll started (+1) or stopped (-1) being held. */
static inline void fp_stat_held(int d)
{
    if (d > 0)
        fp_stats.held_now++;
    else if (fp_stats.held_now > 0)
        fp_stats.held_now--;
}

static inline void fp_stat_wake(enum fp_stat_wake c)
{
    fp_stats.wakeups[c]++;
}

static inline void fp_stat_stream_open(void)
{
    fp_stats.streams_now++;
}

static inline void fp_stat_stream_end(enum fp_stat_stream_end w)
{
    fp_stats.stream_ends[w]++;
    if (fp_stats.streams_now > 0)
        fp_stats.streams_now--;
}

static inline void fp_stat_stream_event(void)
{
    fp_stats.stream_events++;
}

static inline void fp_stat_stream_heartbeat(void)
{
    fp_stats.stream_heartbeats++;
}

static inline void fp_stat_over_cap(void)
{
    fp_stats.held_over_cap++;
}

static inline void fp_stat_announcement(void)
{
    fp_stats.announcements++;
}

static inline void fp_stat_subscriber(int up)
{
    fp_stats.subscriber_up = up;
}

static inline void fp_stat_announce_malformed(void)
{
    fp_stats.announce_malformed++;
}

/* A held poll got a new body at now_ms (Unix ms) for a write the app
 * published at published_ms. */
void fp_stat_delivered(uint64_t published_ms, uint64_t now_ms);

/* Monotonic nanoseconds (vDSO clock_gettime: no system call). */
static inline uint64_t fp_stat_now(void)
{
    struct timespec ts;

    if (clock_gettime(CLOCK_MONOTONIC, &ts) != 0)
        return 0;
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* A get on backend i ended with st. t0: fp_stat_now() when it was sent,
 * 0 if it never was; the latency is recorded for answers (hit or miss). */
void fp_stat_backend_done(size_t i, enum fp_cache_status st, uint64_t t0);

#endif

#endif

/* admin.c -- the admin listener and the Prometheus text exposition.
 *
 * Everything here runs only when scraped: it reads the counters of stats.c
 * and a few gauges (requests in flight, coalescer, open connections), and
 * writes them as text format 0.0.4. Open client connections are counted
 * where they are accepted and closed (conn.c), so unix socket and TCP
 * connections alike; only process_open_fds walks /proc/self/fd. */
#include <dirent.h>
#include <stdarg.h>
#include <stddef.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <event2/buffer.h>
#include <event2/event.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>

#include "accept.h"
#include "admin.h"
#include "coalesce.h"
#include "http.h"
#include "log.h"
#include "settings.h"
#include "stats.h"
#include "version.h"

#define ADMIN_TIMEOUT_S 10

struct fp_admin {
    const struct fp_settings *s;
    const struct fp_http *http;
    struct evhttp *evh;
    struct fp_accept_guard *guard;
    int draining;
};

static const char *const method_names[FP_STAT_NMETHODS] = {
    "GET", "HEAD", "POST", "other"
};
static const char *const outcome_names[FP_STAT_NOUTCOMES] = {
    "hit", "miss", "invalid_key", "backend_error", "timeout",
    "method_not_allowed", "forbidden", "client_closed", "not_modified",
    "bad_request"
};
static const char *const wake_names[FP_STAT_NWAKE] = {
    "announcement", "recheck", "timeout", "shutdown"
};
static const char *const accept_names[FP_STAT_NACCEPT] = {
    "emfile", "enfile", "nomem", "other"
};
static const char *const result_names[4] = { "hit", "miss", "error", "timeout" };
static const unsigned long long bucket_us[FP_STAT_NBUCKETS] =
    FP_STAT_LATENCY_BUCKETS;
static const unsigned long long delivery_ms[FP_STAT_NDELIVERY] =
    FP_STAT_DELIVERY_BUCKETS;

/* Which outcomes a method can have: 405 is for the other methods only. */
static int outcome_possible(int m, int o)
{
    if (m == FP_STAT_OTHER)
        return o == FP_STAT_METHOD_NOT_ALLOWED;
    return o != FP_STAT_METHOD_NOT_ALLOWED;
}

struct scan {
    long fds;                   /* every open descriptor */
};

/* -1 when /proc is not there. */
static void scan_fds(struct scan *out)
{
    DIR *d = opendir("/proc/self/fd");
    struct dirent *e;

    out->fds = -1;
    if (d == NULL)
        return;
    out->fds = 0;
    while ((e = readdir(d)) != NULL)
        if (e->d_name[0] >= '0' && e->d_name[0] <= '9')
            out->fds++;
    out->fds--; /* the directory's own */
    if (closedir(d) != 0)
        fp_log(FP_LOG_DEBUG, "admin: closedir /proc/self/fd failed");
}

/* The exposition being written; any failed append makes the scrape a 500
 * rather than a truncated page. */
struct out {
    struct evbuffer *b;
    int failed;
};

static void out_printf(struct out *o, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

static void out_printf(struct out *o, const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    if (evbuffer_add_vprintf(o->b, fmt, ap) < 0)
        o->failed = 1;
    va_end(ap);
}

/* A label value, escaped as the text format wants. */
static void out_label(struct out *o, const char *v)
{
    for (; *v != '\0'; v++) {
        int rc;

        if (*v == '\\' || *v == '"')
            rc = evbuffer_add_printf(o->b, "\\%c", *v);
        else if (*v == '\n')
            rc = evbuffer_add(o->b, "\\n", 2);
        else
            rc = evbuffer_add(o->b, v, 1);
        if (rc < 0)
            o->failed = 1;
    }
}

static void head(struct out *o, const char *name, const char *type,
                 const char *help)
{
    out_printf(o, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

static void metric_u64(struct out *o, const char *name, const char *type,
                       const char *help, unsigned long long v)
{
    head(o, name, type, help);
    out_printf(o, "%s %llu\n", name, v);
}

static double since(const struct timespec *t0)
{
    struct timespec now;

    if (clock_gettime(CLOCK_MONOTONIC, &now) != 0)
        return 0;
    return (double)(now.tv_sec - t0->tv_sec) +
           (double)(now.tv_nsec - t0->tv_nsec) / 1e9;
}

static void write_requests(struct out *o)
{
    head(o, "fastpoll_requests_total", "counter",
         "Requests answered, by method and outcome (hit 200, miss and "
         "invalid_key 404, backend_error and timeout 503, method_not_allowed "
         "405, forbidden 403 (bad signature), client_closed: gone before the "
         "answer, not_modified 304, bad_request 400 (a bad wait=)).");
    for (int m = 0; m < FP_STAT_NMETHODS; m++)
        for (int k = 0; k < FP_STAT_NOUTCOMES; k++)
            if (outcome_possible(m, k))
                out_printf(o, "fastpoll_requests_total{method=\"%s\","
                           "outcome=\"%s\"} %llu\n", method_names[m],
                           outcome_names[k],
                           (unsigned long long)fp_stats.requests[m][k]);
}

static const char *const stream_end_names[FP_STAT_NSTREAM_END] = {
    "client", "lifetime", "drain", "cache", "slow", "over_cap"
};

static void write_holds(struct out *o)
{
    metric_u64(o, "fastpoll_held_requests", "gauge",
               "Long polls (wait=) held now, waiting for their answer to change.",
               fp_stats.held_now);
    head(o, "fastpoll_held_wakeups_total", "counter",
         "Held polls answered, by cause: announcement or recheck (the answer "
         "changed: 200, or 404 if the key is gone), timeout and shutdown (304).");
    for (int k = 0; k < FP_STAT_NWAKE; k++)
        out_printf(o, "fastpoll_held_wakeups_total{cause=\"%s\"} %llu\n",
                   wake_names[k], (unsigned long long)fp_stats.wakeups[k]);
    metric_u64(o, "fastpoll_held_over_cap_total", "counter",
               "Long polls answered at once because [server] max_held were held.",
               fp_stats.held_over_cap);
    metric_u64(o, "fastpoll_streams", "gauge",
               "Event streams (Accept: text/event-stream) held open now.",
               fp_stats.streams_now);
    metric_u64(o, "fastpoll_stream_events_total", "counter",
               "Events written to streams (the first answer and each change).",
               fp_stats.stream_events);
    metric_u64(o, "fastpoll_stream_heartbeats_total", "counter",
               "Heartbeat comments written to streams.",
               fp_stats.stream_heartbeats);
    head(o, "fastpoll_stream_ends_total", "counter",
         "Streams ended, by reason: client (went away), lifetime, drain, "
         "cache (a miss or a failed read: the client falls back and resumes), "
         "slow (its reader fell max_buffered behind), over_cap (one event, "
         "[stream] max were held).");
    for (int k = 0; k < FP_STAT_NSTREAM_END; k++)
        out_printf(o, "fastpoll_stream_ends_total{reason=\"%s\"} %llu\n",
                   stream_end_names[k],
                   (unsigned long long)fp_stats.stream_ends[k]);
    metric_u64(o, "fastpoll_announcements_total", "counter",
               "Announcements (written keys) received on [announce] channel.",
               fp_stats.announcements);
    metric_u64(o, "fastpoll_announce_subscribed", "gauge",
               "1 while subscribed to [announce] channel, else 0 (none "
               "configured, or connecting).", fp_stats.subscriber_up ? 1 : 0);
    metric_u64(o, "fastpoll_announcements_malformed_total", "counter",
               "Announcements whose publish time (after the key) did not parse: "
               "the key was used, the time ignored.",
               fp_stats.announce_malformed);
    head(o, "fastpoll_publish_to_delivery_seconds", "histogram",
         "Held polls answered with a new body after an announcement that "
         "carried its publish time: this host's clock at the answer minus the "
         "app's at the publish.");
    {
        unsigned long long cum = 0;

        for (int k = 0; k <= FP_STAT_NDELIVERY; k++) {
            cum += fp_stats.delivery_buckets[k];
            if (k < FP_STAT_NDELIVERY)
                out_printf(o, "fastpoll_publish_to_delivery_seconds_bucket"
                           "{le=\"%g\"} %llu\n", (double)delivery_ms[k] / 1e3, cum);
            else
                out_printf(o, "fastpoll_publish_to_delivery_seconds_bucket"
                           "{le=\"+Inf\"} %llu\n", cum);
        }
        out_printf(o, "fastpoll_publish_to_delivery_seconds_sum %.3f\n"
                   "fastpoll_publish_to_delivery_seconds_count %llu\n",
                   (double)fp_stats.delivery_sum_ms / 1e3, cum);
    }
    metric_u64(o, "fastpoll_publish_to_delivery_negative_total", "counter",
               "Deliveries timed before their publish (the app's clock ahead "
               "of this host's): counted as 0 s in the histogram.",
               fp_stats.delivery_negative);
}

/* `name{server="<server>"` : the caller adds the other labels and "}". */
static void series(struct out *o, const char *name, const char *server)
{
    out_printf(o, "%s{server=\"", name);
    out_label(o, server);
    out_printf(o, "\"");
}

/* One uint64_t counter of every cache server, `field` its offset in
 * struct fp_stat_backend. */
static void backend_counter(struct out *o, const char *name, const char *help,
                            size_t field)
{
    size_t i;

    head(o, name, "counter", help);
    for (i = 0; i < fp_stats.nbackends; i++) {
        const char *b = (const char *)&fp_stats.backends[i];
        uint64_t v;

        memcpy(&v, b + field, sizeof(v));
        series(o, name, fp_stats.backends[i].name);
        out_printf(o, "} %llu\n", (unsigned long long)v);
    }
}

static uint64_t admin_mono_ms(void)
{
    struct timespec ts;

    if (clock_gettime(CLOCK_MONOTONIC, &ts) != 0)
        return 0;
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static void write_backends(struct out *o)
{
    uint64_t now_ms;
    size_t i;
    int k;

    head(o, "fastpoll_backend_up", "gauge",
         "1 while the cache server answers; 0 when down, connecting, or hung "
         "(timed out and not answered since).");
    for (i = 0; i < fp_stats.nbackends; i++) {
        series(o, "fastpoll_backend_up", fp_stats.backends[i].name);
        out_printf(o, "} %d\n", fp_stats.backends[i].up ? 1 : 0);
    }
    head(o, "fastpoll_backend_recovering", "gauge",
         "1 while a memcached node that was down or hung is back but still "
         "read through its keys' replicas ([memcached] recovery_ms).");
    now_ms = admin_mono_ms();
    for (i = 0; i < fp_stats.nbackends; i++) {
        series(o, "fastpoll_backend_recovering", fp_stats.backends[i].name);
        out_printf(o, "} %d\n", fp_stats.backends[i].recover_until_ms > now_ms);
    }
    backend_counter(o, "fastpoll_replica_reads_total",
                    "Gets sent to this memcached node as the replica of a key "
                    "whose primary was down, hung, recovering, or failed the "
                    "get.",
                    offsetof(struct fp_stat_backend, replica_reads));
    backend_counter(o, "fastpoll_backend_round_trips_total",
                    "Batches of gets written to the cache server, one round "
                    "trip each: the gets queued while the previous batch "
                    "awaited its answers.",
                    offsetof(struct fp_stat_backend, round_trips));
    backend_counter(o, "fastpoll_backend_keys_sent_total",
                    "Gets written to the cache server in those batches; "
                    "divided by fastpoll_backend_round_trips_total, the keys "
                    "per round trip.",
                    offsetof(struct fp_stat_backend, keys_sent));
    head(o, "fastpoll_backend_gets_total", "counter",
         "Cache gets by server and result; error includes gets failed fast "
         "while the server was down.");
    for (i = 0; i < fp_stats.nbackends; i++) {
        for (k = 0; k < 4; k++) {
            series(o, "fastpoll_backend_gets_total", fp_stats.backends[i].name);
            out_printf(o, ",result=\"%s\"} %llu\n", result_names[k],
                       (unsigned long long)fp_stats.backends[i].results[k]);
        }
    }
    head(o, "fastpoll_backend_latency_seconds", "histogram",
         "Round trip of the gets a cache server answered (hit or miss), from "
         "queueing the command to parsing the answer.");
    for (i = 0; i < fp_stats.nbackends; i++) {
        const struct fp_stat_backend *be = &fp_stats.backends[i];
        unsigned long long cum = 0;

        for (k = 0; k <= FP_STAT_NBUCKETS; k++) {
            cum += be->buckets[k];
            series(o, "fastpoll_backend_latency_seconds_bucket", be->name);
            if (k < FP_STAT_NBUCKETS)
                out_printf(o, ",le=\"%g\"} %llu\n",
                           (double)bucket_us[k] / 1e6, cum);
            else
                out_printf(o, ",le=\"+Inf\"} %llu\n", cum);
        }
        series(o, "fastpoll_backend_latency_seconds_sum", be->name);
        out_printf(o, "} %.9f\n", (double)be->sum_ns / 1e9);
        series(o, "fastpoll_backend_latency_seconds_count", be->name);
        out_printf(o, "} %llu\n", cum);
    }
}

static void write_process(struct out *o, const struct scan *sc)
{
    struct rusage ru;
    struct rlimit rl;
    FILE *f;
    long pages = 0, rss = 0, pagesize = sysconf(_SC_PAGESIZE);

    if (getrusage(RUSAGE_SELF, &ru) == 0) {
        head(o, "process_cpu_seconds_total", "counter",
             "User and system CPU time spent.");
        out_printf(o, "process_cpu_seconds_total %.6f\n",
                   (double)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
                   (double)(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6);
    }
    if ((f = fopen("/proc/self/statm", "r")) != NULL) {
        /* The kernel writes these counts; a short read skips the metric.
         * NOLINTNEXTLINE(cert-err34-c) */
        if (fscanf(f, "%ld %ld", &pages, &rss) == 2 && pagesize > 0) {
            head(o, "process_resident_memory_bytes", "gauge",
                 "Resident memory size.");
            out_printf(o, "process_resident_memory_bytes %lld\n",
                       (long long)rss * pagesize);
        }
        if (fclose(f) != 0)
            fp_log(FP_LOG_DEBUG, "admin: fclose /proc/self/statm failed");
    }
    if (sc->fds >= 0) {
        head(o, "process_open_fds", "gauge", "Open file descriptors.");
        out_printf(o, "process_open_fds %ld\n", sc->fds);
    }
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY) {
        head(o, "process_max_fds", "gauge", "Open file descriptor limit.");
        out_printf(o, "process_max_fds %llu\n", (unsigned long long)rl.rlim_cur);
    }
    head(o, "process_start_time_seconds", "gauge",
         "Start time since the Unix epoch.");
    out_printf(o, "process_start_time_seconds %lld\n",
               (long long)fp_stats.started_wall);
}

/* Returns 0, or -1 if the page could not be built (out of memory). */
static int write_metrics(const struct fp_admin *a, struct evbuffer *b)
{
    struct out o = { b, 0 };
    struct fp_coalesce_stats co;
    struct scan sc;

    scan_fds(&sc);
    fp_http_coalesce_stats(a->http, &co);

    write_requests(&o);
    write_holds(&o);
    metric_u64(&o, "fastpoll_coalesced_requests_total", "counter",
               "Requests that waited for another request's cache get instead "
               "of costing a round trip of their own (requests - gets).",
               co.requests >= co.gets ? co.requests - co.gets : 0);
    metric_u64(&o, "fastpoll_cache_gets_total", "counter",
               "Cache gets started for requests (after coalescing).", co.gets);
    metric_u64(&o, "fastpoll_requests_in_flight", "gauge",
               "Requests waiting for the cache or for their answer to be "
               "written.", fp_http_inflight(a->http));
    metric_u64(&o, "fastpoll_coalesce_keys", "gauge",
               "Keys with a cache get in flight.", co.keys);
    metric_u64(&o, "fastpoll_open_connections", "gauge",
               "Client (nginx) connections open on the poll listeners (TCP and "
               "unix socket), counted at accept and close.",
               fp_stats.open_connections);
    head(&o, "fastpoll_accept_errors_total", "counter",
         "accept() failures on the poll and admin listeners, by reason; out "
         "of descriptors or memory pauses accepting for 100 ms.");
    for (int k = 0; k < FP_STAT_NACCEPT; k++)
        out_printf(&o, "fastpoll_accept_errors_total{reason=\"%s\"} %llu\n",
                   accept_names[k], (unsigned long long)fp_stats.accept_errors[k]);
    write_backends(&o);
    metric_u64(&o, "fastpoll_loop_iterations_total", "counter",
               "Event loop iterations (epoll_wait calls).",
               fp_stats.loop_iterations);
    metric_u64(&o, "fastpoll_loop_active_fds_total", "counter",
               "Descriptors epoll_wait returned ready, summed over iterations.",
               fp_stats.loop_active_fds);
    metric_u64(&o, "fastpoll_loop_registered_fds_total", "counter",
               "Descriptors in the epoll set, summed over iterations. ATR = "
               "rate(active) / rate(registered).",
               fp_stats.loop_registered_fds);
    metric_u64(&o, "fastpoll_loop_registered_fds", "gauge",
               "Descriptors in the epoll set now.", fp_stats.registered_fds_now);
    head(&o, "fastpoll_uptime_seconds", "gauge", "Seconds since start.");
    out_printf(&o, "fastpoll_uptime_seconds %.3f\n", since(&fp_stats.started));
    metric_u64(&o, "fastpoll_draining", "gauge",
               "1 after SIGTERM, while requests in flight finish.",
               (unsigned long long)a->draining);
    head(&o, "fastpoll_build_info", "gauge",
         "Version of the poll server, its libevent, and the cache backend.");
    out_printf(&o, "fastpoll_build_info{version=\"%s\",libevent=\"", FP_VERSION);
    out_label(&o, event_get_version());
    out_printf(&o, "\",backend=\"%s\"} 1\n",
               a->s->backend == FP_BACKEND_REDIS ? "redis" : "memcached");
    head(&o, "fastpoll_config_info", "gauge",
         "SHA-256 of the config file's bytes as loaded (empty: no file).");
    out_printf(&o, "fastpoll_config_info{sha256=\"%s\"} 1\n", a->s->config_sha256);
    write_process(&o, &sc);
    return o.failed ? -1 : 0;
}

/* failed: the body could not be built; answer 500 without it. */
static void send_text(struct evhttp_request *req, int code, const char *reason,
                      const char *type, int failed)
{
    struct evkeyvalq *hdr = evhttp_request_get_output_headers(req);
    struct evbuffer *out = evhttp_request_get_output_buffer(req);

    if (failed || evhttp_add_header(hdr, "Content-Type", type) != 0 ||
        evhttp_add_header(hdr, "Cache-Control", "no-store") != 0) {
        /* evhttp_send_error appends its page to what is there. */
        if (evbuffer_drain(out, evbuffer_get_length(out)) != 0)
            fp_log(FP_LOG_ERROR, "admin: cannot drain a failed reply");
        evhttp_clear_headers(hdr);
        evhttp_send_error(req, 500, NULL);
        return;
    }
    evhttp_send_reply(req, code, reason, NULL);
}

static void on_admin(struct evhttp_request *req, void *arg)
{
    struct fp_admin *a = arg;
    struct evbuffer *out = evhttp_request_get_output_buffer(req);
    const struct evhttp_uri *uri = evhttp_request_get_evhttp_uri(req);
    const char *path = uri != NULL ? evhttp_uri_get_path(uri) : NULL;
    enum evhttp_cmd_type cmd = evhttp_request_get_command(req);
    int failed;

    if (cmd != EVHTTP_REQ_GET && cmd != EVHTTP_REQ_HEAD) {
        if (evhttp_add_header(evhttp_request_get_output_headers(req), "Allow",
                              "GET, HEAD") != 0)
            fp_log(FP_LOG_DEBUG, "admin: out of memory");
        evhttp_send_reply(req, 405, "Method Not Allowed", NULL);
        return;
    }
    if (path != NULL && strcmp(path, "/metrics") == 0) {
        failed = write_metrics(a, out) < 0;
        send_text(req, 200, "OK", "text/plain; version=0.0.4; charset=utf-8",
                  failed);
    } else if (path != NULL && strcmp(path, "/healthz") == 0) {
        failed = evbuffer_add_printf(out, "%s\n",
                                     a->draining ? "draining" : "ok") < 0;
        send_text(req, a->draining ? 503 : 200,
                  a->draining ? "Service Unavailable" : "OK", "text/plain",
                  failed);
    } else {
        failed = evbuffer_add_printf(out, "try /metrics or /healthz\n") < 0;
        send_text(req, 404, "Not Found", "text/plain", failed);
    }
}

struct fp_admin *fp_admin_start(struct event_base *base,
                                const struct fp_settings *s,
                                const struct fp_http *http)
{
    struct fp_admin *a = calloc(1, sizeof(*a));
    struct evhttp_bound_socket *bound;

    if (a == NULL || (a->evh = evhttp_new(base)) == NULL) {
        fp_log(FP_LOG_ERROR, "admin: out of memory");
        free(a);
        return NULL;
    }
    a->s = s;
    a->http = http;
    evhttp_set_timeout(a->evh, ADMIN_TIMEOUT_S);
    evhttp_set_max_headers_size(a->evh, 8192);
    evhttp_set_max_body_size(a->evh, 0);
    evhttp_set_allowed_methods(a->evh, 0xFFFF);
    evhttp_set_gencb(a->evh, on_admin, a);
    if ((bound = evhttp_bind_socket_with_handle(a->evh, s->admin_listen,
                                                s->admin_port)) == NULL) {
        fp_log(FP_LOG_ERROR, "admin: cannot listen on %s:%u", s->admin_listen,
               (unsigned)s->admin_port);
        evhttp_free(a->evh);
        free(a);
        return NULL;
    }
    if ((a->guard = fp_accept_guard_new(base, "admin")) == NULL ||
        fp_accept_guard_add(a->guard, evhttp_bound_socket_get_listener(bound)) != 0)
        fp_log(FP_LOG_WARN, "admin: accept errors are not guarded");
    fp_log(FP_LOG_INFO, "admin: /metrics and /healthz on %s:%u",
           s->admin_listen, (unsigned)s->admin_port);
    return a;
}

void fp_admin_set_draining(struct fp_admin *a)
{
    if (a != NULL)
        a->draining = 1;
}

void fp_admin_free(struct fp_admin *a)
{
    if (a == NULL)
        return;
    fp_accept_guard_stop(a->guard);
    evhttp_free(a->evh);
    fp_accept_guard_free(a->guard);
    free(a);
}

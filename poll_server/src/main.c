/* main.c -- poll_server: configuration, one event loop, graceful shutdown.
 *
 * SIGHUP: reopen [log] file (logrotate); nothing else changes.
 * SIGTERM/SIGINT: stop accepting, let the requests in flight finish (at
 * most shutdown_timeout_ms), then free everything and exit 0. A second
 * signal during the drain stops at once. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>

#include <event2/event.h>

#include "admin.h"
#include "cache.h"
#include "config.h"
#include "http.h"
#include "log.h"
#include "server.h"
#include "settings.h"
#include "stats.h"
#include "version.h"

struct app {
    struct event_base *base;
    struct fp_server *srv;
    struct fp_http *http;       /* srv's request layer */
    struct fp_admin *admin;     /* NULL: [admin] port = 0 */
    struct event *sigterm, *sigint, *sighup, *drain_timer;
    const struct fp_settings *s;
    int stopping, flushing;
};

static void drained(void *arg)
{
    struct app *a = arg;

    fp_log(FP_LOG_INFO, "shutdown: no request left in flight");
    if (event_base_loopexit(a->base, NULL) != 0)
        fp_log(FP_LOG_ERROR, "shutdown: cannot leave the event loop");
}

#define FLUSH_MS 200 /* after the drain limit: time to write the 503s */

static void drain_timeout(evutil_socket_t fd, short what, void *arg)
{
    struct app *a = arg;
    struct timeval tv = { 0, (suseconds_t)FLUSH_MS * 1000 };

    (void)fd;
    (void)what;
    if (a->flushing) {
        fp_log(FP_LOG_WARN, "shutdown: %lu answers not written after %d ms "
               "more, closing their connections", fp_http_inflight(a->http),
               FLUSH_MS);
        if (event_base_loopexit(a->base, NULL) != 0)
            fp_log(FP_LOG_ERROR, "shutdown: cannot leave the event loop");
        return;
    }
    /* Waiting longer helps nobody: 503 lets nginx fall back to the app. */
    fp_log(FP_LOG_WARN, "shutdown: %lu requests still in flight after %u ms, "
           "answering 503", fp_http_inflight(a->http),
           a->s->shutdown_timeout_ms);
    a->flushing = 1;
    if (evtimer_add(a->drain_timer, &tv) != 0 &&
        event_base_loopexit(a->base, NULL) != 0)
        fp_log(FP_LOG_ERROR, "shutdown: cannot leave the event loop");
    fp_http_abort_waiting(a->http); /* may call drained() */
}

static void on_hup(evutil_socket_t sig, short what, void *arg)
{
    (void)sig;
    (void)what;
    (void)arg;
    fp_log_reopen();
}

static void on_signal(evutil_socket_t sig, short what, void *arg)
{
    struct app *a = arg;
    struct timeval tv;

    (void)what;
    if (a->stopping) {
        fp_log(FP_LOG_WARN, "shutdown: signal %d again, stopping now", (int)sig);
        if (event_base_loopbreak(a->base) != 0)
            fp_log(FP_LOG_ERROR, "shutdown: cannot leave the event loop");
        return;
    }
    a->stopping = 1;
    fp_admin_set_draining(a->admin);
    fp_log(FP_LOG_INFO, "shutdown: signal %d, no longer accepting; %lu "
           "requests in flight", (int)sig, fp_http_inflight(a->http));
    tv.tv_sec = (time_t)(a->s->shutdown_timeout_ms / 1000);
    tv.tv_usec = (suseconds_t)(a->s->shutdown_timeout_ms % 1000) * 1000;
    if (evtimer_add(a->drain_timer, &tv) != 0) {
        fp_log(FP_LOG_ERROR, "shutdown: cannot arm the drain timer");
        if (event_base_loopexit(a->base, NULL) != 0)
            fp_log(FP_LOG_ERROR, "shutdown: cannot leave the event loop");
        return;
    }
    fp_server_drain(a->srv, drained, a);
}

static void log_startup(const struct fp_settings *s, const char *config)
{
    char servers[512], where[400];
    size_t n = 0;

    servers[0] = '\0';
    if (s->backend == FP_BACKEND_MEMCACHED) {
        for (size_t i = 0; i < s->nmc_servers && n < sizeof(servers); i++) {
            int r = snprintf(servers + n, sizeof(servers) - n, "%s%s:%u",
                             i ? " " : "", s->mc_servers[i].host,
                             (unsigned)s->mc_servers[i].port);
            if (r < 0)
                break;
            n += (size_t)r;
        }
        if (n >= sizeof(servers))
            memcpy(servers + sizeof(servers) - 4, "...", 4);
    } else if (s->nredis_sentinels > 0 && s->redis_master_name != NULL) {
        (void)snprintf(servers, sizeof(servers), "master %s from %zu sentinels (first "
                 "%s:%u) db %d%s", s->redis_master_name, s->nredis_sentinels,
                 s->redis_sentinels[0].host, (unsigned)s->redis_sentinels[0].port,
                 s->redis_db, s->redis_password ? " (AUTH)" : "");
    } else if (s->redis.unix_path != NULL) {
        (void)snprintf(servers, sizeof(servers), "unix:%s db %d%s", s->redis.unix_path,
                 s->redis_db, s->redis_password ? " (AUTH)" : "");
    } else {
        (void)snprintf(servers, sizeof(servers), "%s:%u db %d%s", s->redis.host,
                 (unsigned)s->redis.port, s->redis_db,
                 s->redis_password ? " (AUTH)" : "");
    }
    if (s->listen != NULL && s->listen_unix != NULL)
        (void)snprintf(where, sizeof(where), "%s:%u and unix:%s (mode %04o)",
                 s->listen, (unsigned)s->port, s->listen_unix, s->unix_mode);
    else if (s->listen != NULL)
        (void)snprintf(where, sizeof(where), "%s:%u", s->listen, (unsigned)s->port);
    else
        (void)snprintf(where, sizeof(where), "unix:%s (mode %04o)", s->listen_unix,
                 s->unix_mode);
    fp_log(FP_LOG_INFO, "poll_server %s (libevent %s) listening on %s, "
           "config %s (sha256 %.12s), backend %s: %s, timeout %u ms, log level %s",
           FP_VERSION, event_get_version(), where,
           config ? config : "(defaults)", s->config_sha256,
           s->backend == FP_BACKEND_MEMCACHED ? "memcached" : "redis",
           servers, s->cache_timeout_ms, fp_config_level_name(s->log_level));
}

int main(int argc, char **argv)
{
    struct fp_settings s;
    struct fp_cli cli;
    struct fp_cache *cache = NULL;
    struct event_config *cfg = NULL;
    struct app a;
    struct sigaction sa;
    char err[FP_CONFIG_ERRLEN];
    int rc = 1;

    memset(&a, 0, sizeof(a));
    if (fp_config_from_args(&s, &cli, argc, argv, err, sizeof(err)) < 0) {
        if (cli.test_only) {
            (void)fprintf(stderr, "%s\n", err);
        } else {
            fp_log(FP_LOG_ERROR, "config: %s", err);
        }
        goto out;
    }
    if (cli.help) {
        fp_config_usage(stdout, "poll_server");
        rc = 0;
        goto out;
    }
    if (cli.dump_config != NULL) {
        if (fp_config_dump(stdout, cli.dump_config, err, sizeof(err)) < 0) {
            (void)fprintf(stderr, "%s\n", err);
            goto out;
        }
        rc = 0;
        goto out;
    }
    if (cli.version) {
        printf("poll_server %s\n", FP_VERSION);
        rc = 0;
        goto out;
    }
    if (cli.test_only) {
        printf("config OK\n");
        rc = 0;
        goto out;
    }
    fp_log_set_level(s.log_level);
    fp_log_set_format(s.log_format);
    if (fp_log_open(s.log_file) != 0)
        goto out;
    event_set_log_callback(fp_log_libevent);
    a.s = &s;

    /* A client gone mid-write must be an error return, not a signal. */
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = SIG_IGN;
    if (sigemptyset(&sa.sa_mask) != 0 || sigaction(SIGPIPE, &sa, NULL) != 0) {
        fp_log(FP_LOG_ERROR, "cannot ignore SIGPIPE");
        goto out;
    }

    fp_stats_init(); /* before the event base: it counts its epoll calls */

    /* The changelist merges the epoll_ctl calls made when an event is
     * toggled within one loop turn (the cache's connections, the admin
     * listener's evhttp). Its caveat, dup()ed descriptors, does not apply:
     * none are. */
    if ((cfg = event_config_new()) == NULL ||
        event_config_set_flag(cfg, EVENT_BASE_FLAG_EPOLL_USE_CHANGELIST) != 0 ||
        (a.base = event_base_new_with_config(cfg)) == NULL) {
        fp_log(FP_LOG_ERROR, "cannot create the event loop");
        goto out;
    }
    if ((cache = fp_cache_create(a.base, &s)) == NULL)
        goto out; /* logged by the backend */
    if ((a.srv = fp_server_start(a.base, &s, cache)) == NULL)
        goto out;
    a.http = fp_server_http(a.srv);
    if (s.admin_port != 0 &&
        (a.admin = fp_admin_start(a.base, &s, a.http)) == NULL)
        goto out;
    a.sigterm = evsignal_new(a.base, SIGTERM, on_signal, &a);
    a.sigint = evsignal_new(a.base, SIGINT, on_signal, &a);
    a.sighup = evsignal_new(a.base, SIGHUP, on_hup, &a);
    a.drain_timer = evtimer_new(a.base, drain_timeout, &a);
    if (a.sigterm == NULL || a.sigint == NULL || a.sighup == NULL ||
        a.drain_timer == NULL || evsignal_add(a.sigterm, NULL) != 0 ||
        evsignal_add(a.sigint, NULL) != 0 || evsignal_add(a.sighup, NULL) != 0) {
        fp_log(FP_LOG_ERROR, "cannot install signal handlers");
        goto out;
    }
    log_startup(&s, cli.config_path);

    if (event_base_dispatch(a.base) < 0) {
        fp_log(FP_LOG_ERROR, "event loop failed");
        goto out;
    }
    rc = 0;
out:
    /* The cache first: it answers every waiting request (503), which the
     * HTTP side can still route; then the connections go. */
    fp_cache_free(cache);
    fp_admin_free(a.admin);
    fp_server_free(a.srv);
    if (a.drain_timer != NULL)
        event_free(a.drain_timer);
    if (a.sigint != NULL)
        event_free(a.sigint);
    if (a.sighup != NULL)
        event_free(a.sighup);
    if (a.sigterm != NULL)
        event_free(a.sigterm);
    if (a.base != NULL)
        event_base_free(a.base);
    if (cfg != NULL)
        event_config_free(cfg);
    fp_stats_free();
    if (a.stopping)
        fp_log(FP_LOG_INFO, "shutdown: done, exit %d", rc);
    fp_log_close();
    fp_config_free(&s);
    return rc;
}

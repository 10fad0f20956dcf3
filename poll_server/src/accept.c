/* accept.c -- pause accepting when accept() fails (accept.h). */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "accept.h"
#include "health.h"
#include "log.h"
#include "stats.h"

#define GUARD_MAX_LISTENERS 4
#define MAX_WATCHED 8

struct fp_accept_guard {
    const char *name;                       /* "http", "admin": for the log */
    struct evconnlistener *lev[GUARD_MAX_LISTENERS];
    size_t nlev;
    struct event *timer;
    int paused, stopped;
    uint64_t logged_ms;                     /* last line, 0: none yet */
    unsigned long long unlogged;            /* errors since that line */
};

/* The error callback gets the listener's own argument (the fp_server of the
 * poll port, the admin listener's evhttp): the guard of each listener is
 * found here (a handful, one process). */
static struct {
    const struct evconnlistener *lev;
    struct fp_accept_guard *g;
} watched[MAX_WATCHED];

static struct fp_accept_guard *guard_of(const struct evconnlistener *lev)
{
    for (size_t i = 0; i < MAX_WATCHED; i++)
        if (watched[i].lev == lev)
            return watched[i].g;
    return NULL;
}

static void resume(struct fp_accept_guard *g)
{
    if (!g->paused || g->stopped)
        return;
    g->paused = 0;
    (void)event_del(g->timer);
    for (size_t i = 0; i < g->nlev; i++)
        if (evconnlistener_enable(g->lev[i]) != 0)
            fp_log(FP_LOG_ERROR, "%s: cannot accept connections again", g->name);
}

static void on_timer(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    resume(arg);
}

static enum fp_stat_accept reason_of(int err)
{
    switch (err) {
    case EMFILE: return FP_STAT_ACCEPT_EMFILE;
    case ENFILE: return FP_STAT_ACCEPT_ENFILE;
    case ENOBUFS:
    case ENOMEM: return FP_STAT_ACCEPT_NOMEM;
    default: return FP_STAT_ACCEPT_OTHER;
    }
}

static void on_error(struct evconnlistener *lev, void *arg)
{
    struct fp_accept_guard *g = guard_of(lev);
    int err = EVUTIL_SOCKET_ERROR();
    enum fp_stat_accept why = reason_of(err);
    struct timeval tv = { 0, (suseconds_t)FP_ACCEPT_PAUSE_MS * 1000 };
    uint64_t now = fp_mono_ms();

    (void)arg;
    fp_stat_accept_error(why);
    if (g == NULL)
        return;
    g->unlogged++;
    if (g->logged_ms == 0 || now - g->logged_ms >= FP_ACCEPT_LOG_MS) {
        fp_log(FP_LOG_WARN, "%s: accept failed: %s (%llu failed accepts since "
               "the last such line)%s", g->name, strerror(err), g->unlogged,
               why == FP_STAT_ACCEPT_OTHER ? "" :
               "; not accepting for 100 ms or until a connection closes");
        g->logged_ms = now;
        g->unlogged = 0;
    }
    if (why == FP_STAT_ACCEPT_OTHER || g->paused || g->stopped)
        return;
    /* The connection waits in the backlog: do not wake up for it again
     * until a descriptor may be free. */
    for (size_t i = 0; i < g->nlev; i++)
        if (evconnlistener_disable(g->lev[i]) != 0)
            fp_log(FP_LOG_ERROR, "%s: cannot pause accepting", g->name);
    g->paused = 1;
    if (evtimer_add(g->timer, &tv) != 0) {
        fp_log(FP_LOG_ERROR, "%s: cannot arm the accept pause", g->name);
        resume(g);
    }
}

struct fp_accept_guard *fp_accept_guard_new(struct event_base *base,
                                            const char *name)
{
    struct fp_accept_guard *g = calloc(1, sizeof(*g));

    if (g == NULL)
        return NULL;
    g->name = name;
    if ((g->timer = evtimer_new(base, on_timer, g)) == NULL) {
        free(g);
        return NULL;
    }
    return g;
}

void fp_accept_guard_free(struct fp_accept_guard *g)
{
    if (g == NULL)
        return;
    for (size_t i = 0; i < MAX_WATCHED; i++)
        if (watched[i].g == g) {
            watched[i].lev = NULL;
            watched[i].g = NULL;
        }
    event_free(g->timer);
    free(g);
}

int fp_accept_guard_add(struct fp_accept_guard *g, struct evconnlistener *lev)
{
    size_t i;

    if (lev == NULL || g->nlev == GUARD_MAX_LISTENERS)
        return -1;
    for (i = 0; i < MAX_WATCHED && watched[i].lev != NULL; i++)
        ;
    if (i == MAX_WATCHED)
        return -1;
    watched[i].lev = lev;
    watched[i].g = g;
    g->lev[g->nlev++] = lev;
    evconnlistener_set_error_cb(lev, on_error);
    return 0;
}

void fp_accept_guard_closed(struct fp_accept_guard *g)
{
    if (g != NULL)
        resume(g);
}

void fp_accept_guard_stop(struct fp_accept_guard *g)
{
    if (g == NULL)
        return;
    g->stopped = 1;
    (void)event_del(g->timer);
}

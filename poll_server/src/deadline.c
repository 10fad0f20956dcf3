/* deadline.c -- a total time limit on receiving each request (deadline.h).
 *
 * libevent 2.1.12 has no hook for "a connection was accepted" that hands us
 * the evhttp_connection, only evhttp_set_bevcb, called before evhttp makes
 * it. So the bevcb makes the bufferevent, keeps a reference to it and
 * activates a timer that runs before the loop polls again (so before any
 * byte is read): by then evhttp has made the connection and set itself as
 * the bufferevent's callback argument, which is how we find the connection
 * ("adoption"). If evhttp already let go of the bufferevent (its callbacks
 * are cleared when it frees it), we drop our reference and track nothing.
 * From then on the same timer is the connection's deadline, and the
 * connection's close callback is ours whenever http.c holds no request.
 *
 * Every connection tracked here is counted from its accept (the bevcb) to
 * its close (fastpoll_open_connections), whatever the socket family. */
#include <stdlib.h>
#include <string.h>

#include <event2/bufferevent.h>

#include "deadline.h"
#include "evcompat.h"
#include "log.h"
#include "stats.h"

/* uthash: a failed allocation must not exit the server. */
static int hash_oom;
#define HASH_NONFATAL_OOM 1
#define uthash_nonfatal_oom(obj) do { (void)(obj); hash_oom = 1; } while (0)
#include <uthash.h>

struct dl_conn {
    UT_hash_handle hh;                  /* by evcon, once adopted */
    struct evhttp_connection *evcon;
    struct bufferevent *bev;            /* our reference, until adopted */
    struct event *timer;                /* adoption, then the deadline */
    struct fp_deadlines *d;
    struct dl_conn *prev, *next;        /* every conn, for fp_deadlines_free */
};

struct fp_deadlines {
    struct event_base *base;
    struct timeval first, next;
    struct dl_conn *table;              /* adopted, by evcon */
    struct dl_conn *all;
    unsigned long long expired;
    void (*closed)(void *arg);          /* a connection closed, or NULL */
    void *closed_arg;
};

/* Frees c without touching the list of all conns. */
static void conn_release(struct dl_conn *c)
{
    if (c->evcon != NULL)
        HASH_DELETE(hh, c->d->table, c);
    if (c->bev != NULL)
        bufferevent_decref(c->bev);
    event_free(c->timer);
    free(c);
    fp_stat_conn_closed();
}

static void conn_free(struct dl_conn *c)
{
    struct fp_deadlines *d = c->d;
    void (*closed)(void *) = d->closed;
    void *closed_arg = d->closed_arg;

    if (c->prev != NULL)
        c->prev->next = c->next;
    else
        d->all = c->next;
    if (c->next != NULL)
        c->next->prev = c->prev;
    conn_release(c);
    if (closed != NULL)
        closed(closed_arg);
}

static struct dl_conn *conn_find(struct fp_deadlines *d,
                                 struct evhttp_connection *evcon)
{
    struct dl_conn *c = NULL;

    if (d != NULL && evcon != NULL)
        HASH_FIND_PTR(d->table, &evcon, c);
    return c;
}

/* evhttp frees the connection between two requests. */
static void on_closed(struct evhttp_connection *evcon, void *arg)
{
    (void)evcon;
    conn_free(arg);
}

static void arm(struct dl_conn *c, const struct timeval *tv)
{
    if (evtimer_add(c->timer, tv) != 0)
        fp_log(FP_LOG_ERROR, "http: cannot arm a request deadline");
}

static void adopt(struct dl_conn *c)
{
    struct fp_deadlines *d = c->d;
    bufferevent_data_cb readcb = NULL;
    void *cbarg = NULL;

    bufferevent_getcb(c->bev, &readcb, NULL, NULL, &cbarg);
    if (readcb == NULL || cbarg == NULL) {
        conn_free(c); /* evhttp let go of it already */
        return;
    }
    c->evcon = cbarg;
    hash_oom = 0;
    HASH_ADD_PTR(d->table, evcon, c);
    if (hash_oom) {
        c->evcon = NULL; /* not in the table */
        conn_free(c);
        return;
    }
    /* evhttp holds the bufferevent as long as the connection lives. */
    bufferevent_decref(c->bev);
    c->bev = NULL;
    evhttp_connection_set_closecb(c->evcon, on_closed, c);
    arm(c, &d->first);
}

static void on_timer(evutil_socket_t fd, short what, void *arg)
{
    struct dl_conn *c = arg;
    struct evhttp_connection *evcon = c->evcon;

    (void)fd;
    (void)what;
    if (evcon == NULL) {
        adopt(c);
        return;
    }
    /* Not in within the limit: close it, as evhttp does on its own
     * timeouts (the half-read request goes with it). */
    c->d->expired++;
    fp_log(FP_LOG_DEBUG, "http: request not received within the limit, "
           "closing the connection");
    evhttp_connection_set_closecb(evcon, NULL, NULL);
    conn_free(c);
    evhttp_connection_free(evcon);
}

struct bufferevent *fp_deadline_bevcb(struct event_base *base, void *arg)
{
    struct fp_deadlines *d = arg;
    struct bufferevent *bev;
    struct dl_conn *c;

    bev = bufferevent_socket_new(base, -1, BEV_OPT_CLOSE_ON_FREE);
    if (bev == NULL)
        return NULL; /* evhttp makes its own; that connection has no clock */
    c = calloc(1, sizeof(*c));
    if (c == NULL || (c->timer = evtimer_new(base, on_timer, c)) == NULL) {
        free(c);
        fp_log(FP_LOG_ERROR, "http: out of memory for a request deadline");
        return bev;
    }
    c->d = d;
    c->bev = bev;
    fp_stat_conn_open();
    bufferevent_incref(bev);
    c->next = d->all;
    if (d->all != NULL)
        d->all->prev = c;
    d->all = c;
    /* Runs after evhttp has set the connection up, before any read. */
    event_active(c->timer, EV_TIMEOUT, 1);
    return bev;
}

void fp_deadline_request_in(struct fp_deadlines *d,
                            struct evhttp_connection *evcon)
{
    struct dl_conn *c = conn_find(d, evcon);

    if (c != NULL && event_del(c->timer) != 0)
        fp_log(FP_LOG_ERROR, "http: cannot stop a request deadline");
}

void fp_deadline_next(struct fp_deadlines *d, struct evhttp_connection *evcon)
{
    struct dl_conn *c = conn_find(d, evcon);

    if (c == NULL) {
        if (evcon != NULL)
            evhttp_connection_set_closecb(evcon, NULL, NULL);
        return;
    }
    evhttp_connection_set_closecb(evcon, on_closed, c);
    arm(c, &d->next);
}

void fp_deadline_gone(struct fp_deadlines *d, struct evhttp_connection *evcon)
{
    struct dl_conn *c = conn_find(d, evcon);

    if (c != NULL)
        conn_free(c);
}

struct fp_deadlines *fp_deadlines_new(struct event_base *base,
                                      const struct timeval *first,
                                      const struct timeval *next)
{
    struct fp_deadlines *d = calloc(1, sizeof(*d));

    if (d == NULL)
        return NULL;
    d->base = base;
    d->first = *first;
    d->next = *next;
    return d;
}

void fp_deadlines_free(struct fp_deadlines *d)
{
    struct dl_conn *c, *next;

    if (d == NULL)
        return;
    /* Left: connections accepted but not yet adopted. */
    for (c = d->all; c != NULL; c = next) {
        next = c->next;
        conn_release(c);
    }
    free(d);
}

void fp_deadlines_on_close(struct fp_deadlines *d, void (*closed)(void *arg),
                           void *arg)
{
    d->closed = closed;
    d->closed_arg = arg;
}

unsigned long long fp_deadline_expired(const struct fp_deadlines *d)
{
    return d != NULL ? d->expired : 0;
}

/* server.c -- the poll port's server (server.h): the listening sockets
 * (TCP, unix; listen.c makes them) accepting into the request layer
 * (http.c), the accept guard, and the server's start, drain and free. */
#include <stdlib.h>
#include <sys/socket.h>

#include <event2/listener.h>
#include <event2/util.h>

#include "accept.h"
#include "conn.h"
#include "http.h"
#include "listen.h"
#include "log.h"
#include "server.h"
#include "settings.h"

struct fp_server {
    struct fp_http http;        /* first: a connection's c->h */
    struct evconnlistener *lev;       /* TCP listener, or NULL */
    struct evconnlistener *lev_unix;  /* unix socket listener, or NULL */
    struct fp_unix_sock unix_sock;    /* ours to unlink at exit */
    struct fp_accept_guard *guard; /* pauses accepting on EMFILE */
};

static void on_accept(struct evconnlistener *lev, evutil_socket_t fd,
                      struct sockaddr *sa, int salen, void *arg)
{
    struct fp_server *srv = arg;

    (void)lev;
    (void)salen;
    fp_conns_accepted(&srv->http.cs, fd, sa);
}

/* Accepts on fd (listening already) into on_accept; closed with the
 * listener. NULL on error (fd is then closed). */
static struct evconnlistener *accept_on(struct fp_server *srv,
                                        evutil_socket_t fd)
{
    struct evconnlistener *lev;

    /* backlog 0: the socket listens already (with FP_LISTEN_BACKLOG). */
    lev = evconnlistener_new(srv->http.cs.base, on_accept, srv,
                             LEV_OPT_CLOSE_ON_FREE | LEV_OPT_CLOSE_ON_EXEC, 0, fd);
    if (lev == NULL)
        evutil_closesocket(fd);
    return lev;
}

struct fp_server *fp_server_start(struct event_base *base,
                                  const struct fp_settings *s,
                                  struct fp_cache *cache)
{
    struct fp_server *srv = calloc(1, sizeof(*srv));
    evutil_socket_t fd;

    if (srv == NULL) {
        fp_log(FP_LOG_ERROR, "http: out of memory");
        return NULL;
    }
    if ((srv->guard = fp_accept_guard_new(base, "http")) == NULL) {
        fp_log(FP_LOG_ERROR, "http: out of memory");
        free(srv);
        return NULL;
    }
    if (fp_http_init(&srv->http, base, s, cache, srv->guard) != 0) {
        fp_accept_guard_free(srv->guard);
        free(srv);
        return NULL;
    }
    if (s->listen != NULL) {
        if ((fd = fp_listen_tcp(s->listen, s->port)) < 0)
            goto fail;
        if ((srv->lev = accept_on(srv, fd)) == NULL) {
            fp_log(FP_LOG_ERROR, "http: cannot accept on %s:%u", s->listen,
                   (unsigned)s->port);
            goto fail;
        }
        if (fp_accept_guard_add(srv->guard, srv->lev) != 0)
            fp_log(FP_LOG_WARN, "http: accept errors on %s:%u are not guarded",
                   s->listen, (unsigned)s->port);
    }
    if (s->listen_unix != NULL) {
        if ((fd = fp_listen_unix(s->listen_unix, s->unix_mode,
                                 &srv->unix_sock)) < 0)
            goto fail;
        if ((srv->lev_unix = accept_on(srv, fd)) == NULL) {
            fp_log(FP_LOG_ERROR, "http: cannot accept on unix:%s", s->listen_unix);
            goto fail;
        }
        if (fp_accept_guard_add(srv->guard, srv->lev_unix) != 0)
            fp_log(FP_LOG_WARN, "http: accept errors on unix:%s are not guarded",
                   s->listen_unix);
    }
    return srv;
fail:
    fp_listen_unix_release(&srv->unix_sock);
    if (srv->lev != NULL)
        evconnlistener_free(srv->lev);
    if (srv->lev_unix != NULL)
        evconnlistener_free(srv->lev_unix);
    fp_http_release(&srv->http);
    fp_accept_guard_free(srv->guard);
    free(srv);
    return NULL;
}

struct fp_http *fp_server_http(struct fp_server *srv)
{
    return &srv->http;
}

static void stop_listening(struct fp_server *srv)
{
    fp_accept_guard_stop(srv->guard);
    if (srv->lev != NULL) {
        evconnlistener_free(srv->lev);
        srv->lev = NULL;
    }
    if (srv->lev_unix != NULL) {
        evconnlistener_free(srv->lev_unix);
        srv->lev_unix = NULL;
    }
    fp_listen_unix_release(&srv->unix_sock); /* nginx gets ECONNREFUSED/ENOENT: the next poller */
}

void fp_server_drain(struct fp_server *srv, void (*done)(void *arg),
                     void *arg)
{
    stop_listening(srv);
    fp_http_drain(&srv->http, done, arg);
}

void fp_server_free(struct fp_server *srv)
{
    if (srv == NULL)
        return;
    stop_listening(srv);
    fp_http_release(&srv->http);
    fp_accept_guard_free(srv->guard);
    free(srv);
}

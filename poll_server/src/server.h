/* server.h -- the poll port's server (server.c): its listening sockets
 * (listen.c) accepting into the request layer (http.h), and its life:
 * start, drain, free. */
#ifndef FP_SERVER_H
#define FP_SERVER_H

struct event_base;
struct fp_settings;
struct fp_cache;
struct fp_http;
struct fp_server;

/* Binds settings->listen:port (and the unix socket) and starts serving on
 * base. NULL on error (logged). The settings and the cache must outlive
 * the server. */
struct fp_server *fp_server_start(struct event_base *base,
                                  const struct fp_settings *settings,
                                  struct fp_cache *cache);

/* Its request layer (in flight, abort, counters). */
struct fp_http *fp_server_http(struct fp_server *srv);

/* Stops accepting (closes the listening sockets), then drains the request
 * layer (fp_http_drain: done once no request is in flight). */
void fp_server_drain(struct fp_server *srv, void (*done)(void *arg),
                     void *arg);

/* Closes every connection and frees the server; NULL is ok. Free the cache
 * first, so that every waiting request has been answered (fp_cache_free
 * calls back). */
void fp_server_free(struct fp_server *srv);

#endif

/* deadline.h -- a total time limit on receiving each request.
 *
 * libevent 2.1's connection timeout is an inactivity timeout: a client that
 * sends one byte every few seconds (slowloris) keeps a connection, and a
 * request half-read, for as long as it likes. Here every connection gets a
 * clock: its first request must be in (headers and body) within `first` of
 * the accept, each later one within `next` of the previous answer. When the
 * clock runs out the connection is closed. http.c tells it when a request is
 * in, when it was answered and when a connection goes away while it holds a
 * request; between requests the connection's close callback is ours. */
#ifndef FP_DEADLINE_H
#define FP_DEADLINE_H

#include <sys/time.h>

#include <event2/event.h>
#include <event2/http.h>

struct fp_deadlines;

struct fp_deadlines *fp_deadlines_new(struct event_base *base,
                                      const struct timeval *first,
                                      const struct timeval *next);

/* Closes nothing: call after evhttp_free, which frees every connection. */
void fp_deadlines_free(struct fp_deadlines *d);

/* For evhttp_set_bevcb(http, fp_deadline_bevcb, d): makes each connection's
 * bufferevent and starts its clock once evhttp has set the connection up. */
struct bufferevent *fp_deadline_bevcb(struct event_base *base, void *arg);

/* The request on evcon is in (gencb): stop the clock. The caller then owns
 * the connection's close callback until fp_deadline_next or _gone. */
void fp_deadline_request_in(struct fp_deadlines *d,
                            struct evhttp_connection *evcon);

/* Its answer is written and evcon stays open: the next request's clock
 * starts, and the close callback is ours again. */
void fp_deadline_next(struct fp_deadlines *d, struct evhttp_connection *evcon);

/* evcon is being freed while the caller held its close callback. */
void fp_deadline_gone(struct fp_deadlines *d, struct evhttp_connection *evcon);

/* closed(arg) runs after each connection tracked here is gone. */
void fp_deadlines_on_close(struct fp_deadlines *d, void (*closed)(void *arg),
                           void *arg);

/* Connections closed because their clock ran out, since the start. */
unsigned long long fp_deadline_expired(const struct fp_deadlines *d);

#endif

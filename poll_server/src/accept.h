/* accept.h -- what a listener does when accept() fails.
 *
 * Out of descriptors (EMFILE, ENFILE) or memory (ENOBUFS, ENOMEM), the
 * pending connection stays in the backlog and the listening socket stays
 * readable: a listener that only logs and returns is woken again at once,
 * spinning a core and flooding the log. Instead, as nginx does, every
 * listener of the guard stops accepting for FP_ACCEPT_PAUSE_MS, or until
 * one of our connections closes (a descriptor is free again). Each error is
 * counted (fastpoll_accept_errors_total) and logged at most once per
 * FP_ACCEPT_LOG_MS with the number since the last line. */
#ifndef FP_ACCEPT_H
#define FP_ACCEPT_H

#include <event2/event.h>
#include <event2/listener.h>

#define FP_ACCEPT_PAUSE_MS 100
#define FP_ACCEPT_LOG_MS   10000

struct fp_accept_guard;

struct fp_accept_guard *fp_accept_guard_new(struct event_base *base,
                                            const char *name);
void fp_accept_guard_free(struct fp_accept_guard *g);

/* Watches lev's accept errors (up to 4 listeners per guard). 0 or -1. */
int fp_accept_guard_add(struct fp_accept_guard *g, struct evconnlistener *lev);

/* One of our connections closed: accept again now if paused. */
void fp_accept_guard_closed(struct fp_accept_guard *g);

/* Stops resuming (shutdown: the listeners are going away). */
void fp_accept_guard_stop(struct fp_accept_guard *g);

#endif

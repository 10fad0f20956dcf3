/* admin.h -- the admin listener: GET /metrics (Prometheus text format
 * 0.0.4) and GET /healthz, on its own address and port ([admin] listen and
 * port, loopback by default), served by libevent's evhttp on the poll
 * port's event loop (the poll port is http.c's own server). Nothing on it
 * is reachable through the poll port. */
#ifndef FP_ADMIN_H
#define FP_ADMIN_H

struct event_base;
struct fp_settings;
struct fp_http;
struct fp_admin;

/* Binds [admin] listen:port and serves on base. NULL on error (logged).
 * The settings and the HTTP front must outlive it. */
struct fp_admin *fp_admin_start(struct event_base *base,
                                const struct fp_settings *settings,
                                const struct fp_http *http);

/* From now on /healthz answers 503 "draining" (SIGTERM received). */
void fp_admin_set_draining(struct fp_admin *a);

/* Closes its connections and frees it; before fp_server_free(). NULL is ok. */
void fp_admin_free(struct fp_admin *a);

#endif

/* http.c -- the poll server's HTTP side on libevent 2.1 evhttp.
 *
 * Every request we are handed gets a `struct request` (from a free list)
 * that lives until its answer has been written or its connection is gone:
 *
 *   on_request   -> 405 / 404 right away, or WAITING on the coalescer
 *   on_answer    -> WAITING -> ANSWERED: written at once (send_now)
 *   on_complete  -> reply written (evhttp_send_done): release
 *   on_close     -> connection freed first: detach, release
 *
 * Why this never touches a freed evhttp_request (libevent 2.1.12 http.c):
 * - While a request waits for the cache, its connection is still read,
 *   with no read callback (keep_reading): a client's FIN/RST or the read
 *   timeout fails the connection at once. evhttp then unlinks the request,
 *   which is not answered yet (userdone == 0), sets req->evcon = NULL and
 *   frees the connection; on_close sees that orphan, detaches it from the
 *   coalescer and frees it. Verified with clients that close or reset
 *   mid-wait under ASan (tests/http_check.py).
 * - An answer from the loop is written by send_now and completed at once
 *   by evhttp_send_reply_end (evhttp_send_done frees the request, with
 *   on_complete just before); what the kernel did not take is written by
 *   the bufferevent, and evhttp_send_done or, if the write fails,
 *   evhttp_connection_free (with on_close just before) follow as after
 *   evhttp_send_reply, which the answers made inside on_request still use.
 * - evhttp_free (shutdown) frees every connection, each running on_close
 *   first, with the request still queued on it.
 * In every case on_close detaches the request from the coalescer, which
 * only ever knows our struct, never the evhttp_request.
 *
 * Timeouts: libevent 2.1.12 has one inactivity timeout per connection (the
 * bufferevent's read/write timeout, evhttp_connection_set_timeout_tv), and
 * no hook for "the first byte of the next request". So: a new connection
 * runs under request_timeout_ms (no pause longer than that until its first
 * request is in, and while its reply is written); once a reply is written
 * the connection switches to idle_timeout_ms, which then also bounds pauses
 * inside later requests on that keep-alive connection. */
#include <errno.h>
#include <netdb.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <unistd.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <event2/http.h>
#include <event2/http_struct.h> /* the request's HTTP version (2.1 has no getter) */
#include <event2/keyvalq_struct.h>

#include "accept.h"
#include "cache.h"
#include "coalesce.h"
#include "deadline.h"
#include "evcompat.h"
#include "http.h"
#include "keys.h"
#include "log.h"
#include "settings.h"
#include "sign.h"
#include "stats.h"

#define FREE_REQ_MAX 4096 /* recycled request objects kept */
/* evhttp_bind_socket listens with a backlog of 128: when nginx opens
 * hundreds of upstream connections at once, SYNs beyond it are dropped and
 * retried after a second. The kernel caps this at net.core.somaxconn. */
#define LISTEN_BACKLOG 4096
/* A poll URL without a valid signature (docs/security.md). */
static const char forbidden_body[] =
    "{\"error\":\"missing, invalid or expired signature\"}\n";

enum req_state { REQ_IDLE, REQ_WAITING, REQ_ANSWERED };

struct request {
    struct fp_waiter w;            /* first: the coalescer's handle */
    struct evhttp_request *req;
    struct fp_http *h;
    struct request *free_next;
    enum req_state state;
    int head;                      /* HEAD: headers only */
    int from_loop;                 /* answered from the loop (the cache), not
                                    * from inside evhttp's read callback */
    enum fp_stat_method method;    /* for the request counters */
};

struct fp_http {
    struct event_base *base;
    const struct fp_settings *s;
    struct evhttp *http;
    struct evhttp_bound_socket *bound;      /* TCP listener, or NULL */
    struct evhttp_bound_socket *bound_unix; /* unix socket listener, or NULL */
    const char *unix_path;      /* ours to unlink at exit, or NULL */
    dev_t unix_dev;             /* ... if it is still the one we bound */
    ino_t unix_ino;
    struct fp_coalesce *co;
    struct fp_signer *signer;   /* NULL: poll URLs are not signed */
    struct fp_deadlines *dl;    /* total time limit per request (slowloris) */
    struct fp_accept_guard *guard; /* pauses accepting on EMFILE */
    struct request *free_list;
    size_t nfree;
    unsigned long inflight;
    int draining;
    void (*drained)(void *arg);
    void *drained_arg;
    struct timeval request_tv, idle_tv;
    time_t date_sec;            /* date holds this second's Date header */
    char date[64];
};

static void ms_to_tv(unsigned ms, struct timeval *tv)
{
    tv->tv_sec = (time_t)(ms / 1000);
    tv->tv_usec = (suseconds_t)(ms % 1000) * 1000;
}

static struct request *request_get(struct fp_http *h)
{
    struct request *r = h->free_list;

    if (r != NULL) {
        h->free_list = r->free_next;
        h->nfree--;
    } else if ((r = malloc(sizeof(*r))) == NULL) {
        return NULL;
    }
    memset(r, 0, sizeof(*r));
    r->h = h;
    h->inflight++;
    return r;
}

static void request_put(struct request *r)
{
    struct fp_http *h = r->h;

    if (h->nfree < FREE_REQ_MAX) {
        r->free_next = h->free_list;
        h->free_list = r;
        h->nfree++;
    } else {
        free(r);
    }
    h->inflight--;
    if (h->draining && h->inflight == 0 && h->drained != NULL) {
        void (*cb)(void *) = h->drained;
        h->drained = NULL;
        cb(h->drained_arg);
    }
}

/* The Date header, formatted once a second. */
static const char *date_now(struct fp_http *h)
{
    struct timeval now;
    struct tm tm;

    if (event_base_gettimeofday_cached(h->base, &now) != 0)
        now.tv_sec = time(NULL);
    if (now.tv_sec != h->date_sec || h->date[0] == '\0') {
        if (gmtime_r(&now.tv_sec, &tm) == NULL ||
            evutil_date_rfc1123(h->date, sizeof(h->date), &tm) <= 0)
            return NULL;
        h->date_sec = now.tv_sec;
    }
    return h->date;
}

static char *put(char *p, const char *end, const char *s, size_t n)
{
    if (p == NULL || n > (size_t)(end - p))
        return NULL;
    memcpy(p, s, n);
    return p + n;
}

static char *put_str(char *p, const char *end, const char *s)
{
    return put(p, end, s, strlen(s));
}

static char *put_num(char *p, const char *end, size_t v)
{
    char digits[24];
    size_t i = sizeof(digits);

    do
        digits[--i] = (char)('0' + v % 10);
    while ((v /= 10) != 0 && i > 0);
    return put(p, end, digits + i, sizeof(digits) - i);
}

/* Writes an answer made from the loop (the cache's, or a shutdown 503)
 * straight to the socket, and completes the request on the spot.
 *
 * evhttp_send_reply would only queue it: its bufferevent enables EV_WRITE
 * (epoll_ctl), waits a loop turn for it (epoll_wait), writes and disables
 * it again; and building the answer costs an allocation per header and a
 * printf per line. Here the status line and headers are formatted into one
 * buffer and sent with the value in one writev, the value straight from
 * the cache's buffer. Then evhttp_send_reply_end, finding the connection's
 * output empty, runs evhttp_send_done: on_complete, the request is freed,
 * the next one is read (libevent 2.1.12 http.c). The answer is the one
 * evhttp would make (its status line, Date, Content-Length, our headers);
 * the keep-alive decision stays evhttp's, so "Connection" is written here
 * to match it: close when the client asked for it, when we drain (also
 * set on the request, which evhttp checks), or on HTTP/1.0 without
 * keep-alive; keep-alive on HTTP/1.0 with it.
 * What the kernel does not take goes to the connection's output, written
 * by the bufferevent; evhttp's write callback then completes the request,
 * as after evhttp_send_reply. A write error takes the same way, and the
 * bufferevent reports it through the usual close path.
 * Returns -1 (nothing sent) if the answer does not fit our buffer. */
static int send_now(struct request *r, int code, const char *reason,
                    const char *body, size_t len, int from_cache)
{
    struct evhttp_request *req = r->req;
    struct evhttp_connection *evcon = evhttp_request_get_connection(req);
    struct bufferevent *bev;
    const char *conn, *date;
    char head[1024], *p = head;
    const char *end = head + sizeof(head);
    struct iovec iov[2];
    size_t hlen, blen = r->head ? 0 : len;
    ssize_t n;
    int before_11, keep_alive, close_it;

    if (evcon == NULL || (bev = evhttp_connection_get_bufferevent(evcon)) == NULL)
        return -1;
    /* evhttp_send_done's rule: close after HTTP/1.0 (or older) without
     * keep-alive, or when either side says "Connection: close". */
    conn = evhttp_find_header(evhttp_request_get_input_headers(req), "Connection");
    before_11 = req->major < 1 || (req->major == 1 && req->minor < 1);
    keep_alive = conn != NULL && evutil_ascii_strncasecmp(conn, "keep-alive", 10) == 0;
    close_it = r->h->draining || (before_11 && !keep_alive) ||
               (conn != NULL && evutil_ascii_strcasecmp(conn, "close") == 0);
    /* evhttp_send_done decides on the request's headers: tell it. */
    if (r->h->draining &&
        evhttp_add_header(evhttp_request_get_output_headers(req), "Connection",
                          "close") != 0)
        return -1;

    p = put(p, end, "HTTP/", 5);
    p = put_num(p, end, (size_t)(unsigned char)req->major);
    p = put(p, end, ".", 1);
    p = put_num(p, end, (size_t)(unsigned char)req->minor);
    p = put(p, end, " ", 1);
    p = put_num(p, end, (size_t)code);
    p = put(p, end, " ", 1);
    p = put_str(p, end, reason);
    p = put(p, end, "\r\nContent-Length: ", 18);
    p = put_num(p, end, len);
    if (from_cache) {
        p = put(p, end, "\r\nContent-Type: ", 16);
        p = put_str(p, end, r->h->s->content_type);
        p = put(p, end, "\r\nX-Poll-Source: cache", 22);
    }
    if ((date = date_now(r->h)) != NULL) {
        p = put(p, end, "\r\nDate: ", 8);
        p = put_str(p, end, date);
    }
    if (close_it)
        p = put(p, end, "\r\nConnection: close", 19);
    else if (before_11)
        p = put(p, end, "\r\nConnection: keep-alive", 24);
    p = put(p, end, "\r\n\r\n", 4);
    if (p == NULL)
        return -1;
    hlen = (size_t)(p - head);

    r->state = REQ_ANSWERED;
    iov[0].iov_base = head;
    iov[0].iov_len = hlen;
    /* iovec has no const; writev only reads it.
     * NOLINTNEXTLINE(performance-no-int-to-ptr) */
    iov[1].iov_base = (void *)(uintptr_t)body;
    iov[1].iov_len = blen;
    do
        n = writev(bufferevent_getfd(bev), iov, blen > 0 ? 2 : 1);
    while (n < 0 && errno == EINTR);
    if (n < 0)
        n = 0; /* EAGAIN, or an error the bufferevent will meet again */
    if ((size_t)n < hlen + blen) {
        /* The rest is evhttp's to write (it then calls evhttp_send_done),
         * as evhttp_write_buffer would set it up: no read callback while
         * writing, EV_WRITE on. */
        struct evbuffer *out = bufferevent_get_output(bev);
        bufferevent_data_cb wcb;
        bufferevent_event_cb ecb;
        void *cbarg;
        int ok;

        if ((size_t)n < hlen)
            ok = evbuffer_add(out, head + n, hlen - (size_t)n) == 0 &&
                 evbuffer_add(out, body, blen) == 0;
        else
            ok = evbuffer_add(out, body + ((size_t)n - hlen),
                              blen - ((size_t)n - hlen)) == 0;
        if (!ok) {
            /* Half an answer went out: the connection cannot be reused. */
            fp_log(FP_LOG_ERROR, "http: out of memory writing an answer");
            evhttp_connection_free(evcon); /* on_close releases r */
            return 0;
        }
        bufferevent_getcb(bev, NULL, &wcb, &ecb, &cbarg);
        bufferevent_setcb(bev, NULL, wcb, ecb, cbarg);
        if (bufferevent_enable(bev, EV_WRITE) != 0)
            fp_log(FP_LOG_ERROR, "http: cannot wait to write an answer");
    }
    evhttp_send_reply_end(req);
    return 0;
}

/* Queues the answer. Content-Length is always ours: evhttp leaves it out
 * for HEAD, where it must still be the length of the body GET would get. */
static void reply(struct request *r, int code, const char *reason,
                  const char *body, size_t len, int from_cache)
{
    struct evhttp_request *req = r->req;
    struct evkeyvalq *hdr = evhttp_request_get_output_headers(req);
    char clen[24];
    int ok;

    if (r->from_loop && send_now(r, code, reason, body, len, from_cache) == 0)
        return;
    ok = snprintf(clen, sizeof(clen), "%zu", len) > 0 &&
         evhttp_add_header(hdr, "Content-Length", clen) == 0;
    if (ok && from_cache)
        ok = evhttp_add_header(hdr, "Content-Type", r->h->s->content_type) == 0 &&
             evhttp_add_header(hdr, "X-Poll-Source", "cache") == 0;
    if (ok && code == 405)
        ok = evhttp_add_header(hdr, "Allow", "GET, HEAD, POST") == 0;
    if (ok && code == 403)
        ok = evhttp_add_header(hdr, "Content-Type", "application/json") == 0;
    if (ok && r->h->draining)
        ok = evhttp_add_header(hdr, "Connection", "close") == 0;
    if (ok && !r->head && len > 0)
        ok = evbuffer_add(evhttp_request_get_output_buffer(req), body, len) == 0;
    if (!ok) {
        /* Out of memory: an empty 503 still lets nginx fall back. */
        evhttp_clear_headers(hdr);
        if (evbuffer_drain(evhttp_request_get_output_buffer(req),
                           evbuffer_get_length(evhttp_request_get_output_buffer(req))) < 0 ||
            evhttp_add_header(hdr, "Connection", "close") < 0)
            fp_log(FP_LOG_ERROR, "http: out of memory building a reply");
        code = 503;
        reason = "Service Unavailable";
    }
    r->state = REQ_ANSWERED;
    evhttp_send_reply(req, code, reason, NULL);
}

static void on_answer(struct fp_waiter *w, enum fp_cache_status st,
                      const char *value, size_t len, void *arg)
{
    struct request *r = (struct request *)(void *)w;

    (void)arg;
    r->from_loop = 1;
    switch (st) {
    case FP_CACHE_HIT:
        fp_stat_request(r->method, FP_STAT_HIT);
        reply(r, 200, "OK", value, len, 1);
        break;
    case FP_CACHE_MISS:
        fp_stat_request(r->method, FP_STAT_MISS);
        reply(r, 404, "Not Found", NULL, 0, 0);
        break;
    case FP_CACHE_TIMEOUT:
        fp_stat_request(r->method, FP_STAT_TIMEOUT);
        reply(r, 503, "Service Unavailable", NULL, 0, 0);
        break;
    case FP_CACHE_ERROR:
    default:
        fp_stat_request(r->method, FP_STAT_BACKEND_ERROR);
        reply(r, 503, "Service Unavailable", NULL, 0, 0);
        break;
    }
}

/* The reply has been written: evhttp frees req right after this. */
static void on_complete(struct evhttp_request *req, void *arg)
{
    struct request *r = arg;
    struct evhttp_connection *evcon = evhttp_request_get_connection(req);

    if (evcon != NULL) {
        struct bufferevent *bev = evhttp_connection_get_bufferevent(evcon);

        /* keep_reading's watermark bounds the wait only: evhttp moves a
         * body once all of it is in, so a body larger than that mark on
         * the next request would stall (test_bad_input.py,
         * test_keepalive_request_then_large_post). */
        if (bev != NULL)
            bufferevent_setwatermark(bev, EV_READ, 0, 0);
        /* The next request's clock starts; the close callback is its. */
        fp_deadline_next(r->h->dl, evcon);
        /* Idle until the next request: the keep-alive limit applies. */
        evhttp_connection_set_timeout_tv(evcon, &r->h->idle_tv);
    }
    request_put(r);
}

/* The connection is being freed while we still hold its request. */
static void on_close(struct evhttp_connection *evcon, void *arg)
{
    struct request *r = arg;

    fp_log(FP_LOG_DEBUG, "http: connection closed with a request %s",
           r->state == REQ_WAITING ? "waiting for the cache" :
           r->state == REQ_ANSWERED ? "answered, not yet written" : "new");
    if (r->state == REQ_WAITING) {
        fp_stat_request(r->method, FP_STAT_CLIENT_CLOSED);
        fp_coalesce_detach(&r->w);
        if (evhttp_request_get_connection(r->req) != evcon)
            evhttp_request_free(r->req); /* orphaned: ours to free */
    }
    /* ANSWERED (or never attached): still queued on evcon, evhttp frees it. */
    evhttp_connection_set_closecb(evcon, NULL, NULL);
    fp_deadline_gone(r->h->dl, evcon);
    request_put(r);
}

/* evhttp stops reading a connection when it hands us a request and starts
 * again once the answer is written: an epoll_ctl DEL and ADD per request,
 * in different loop turns, so the changelist cannot merge them. Instead the
 * connection goes on reading while its request waits, with no read
 * callback, exactly as evhttp itself does while it writes an answer
 * (evhttp_write_buffer, libevent 2.1.12): evhttp_read_cb must not run now,
 * it aborts in this state. Bytes that come meanwhile (a pipelined request)
 * wait in the input, bounded by the read watermark, until evhttp_start_read_
 * restores its callback and reads them. EOF, an error or the read timeout
 * now fail the connection at once: evhttp detaches the request (it is not
 * answered yet, userdone == 0) and frees the connection; on_close sees an
 * orphaned request and frees it. Called within evhttp's read callback, so
 * the DEL it queued and this ADD cancel out in the changelist. */
static void keep_reading(struct fp_http *h, struct evhttp_connection *evcon)
{
    struct bufferevent *bev = evhttp_connection_get_bufferevent(evcon);
    bufferevent_data_cb wcb;
    bufferevent_event_cb ecb;
    void *cbarg;

    if (bev == NULL)
        return;
    bufferevent_getcb(bev, NULL, &wcb, &ecb, &cbarg);
    bufferevent_setcb(bev, NULL, wcb, ecb, cbarg);
    bufferevent_setwatermark(bev, EV_READ, 0, h->s->max_header_size + 4096);
    if (bufferevent_enable(bev, EV_READ) != 0)
        fp_log(FP_LOG_DEBUG, "http: cannot keep reading a connection");
}

static void on_request(struct evhttp_request *req, void *arg)
{
    struct fp_http *h = arg;
    const struct fp_settings *s = h->s;
    struct evhttp_connection *evcon = evhttp_request_get_connection(req);
    enum evhttp_cmd_type cmd = evhttp_request_get_command(req);
    char key[FP_MAX_KEY_LEN + 1];
    const char *uri;
    struct request *r;
    ssize_t keylen;

    if ((r = request_get(h)) == NULL) {
        fp_log(FP_LOG_ERROR, "http: out of memory");
        evhttp_send_error(req, 503, NULL);
        return;
    }
    r->req = req;
    r->head = cmd == EVHTTP_REQ_HEAD;
    fp_deadline_request_in(h->dl, evcon);
    r->method = cmd == EVHTTP_REQ_GET ? FP_STAT_GET :
                cmd == EVHTTP_REQ_HEAD ? FP_STAT_HEAD :
                cmd == EVHTTP_REQ_POST ? FP_STAT_POST : FP_STAT_OTHER;
    evhttp_connection_set_closecb(evcon, on_close, r);
    evhttp_request_set_on_complete_cb(req, on_complete, r);
    /* Until the answer is written, the request limit applies. */
    evhttp_connection_set_timeout_tv(evcon, &h->request_tv);

    if (cmd != EVHTTP_REQ_GET && cmd != EVHTTP_REQ_HEAD &&
        cmd != EVHTTP_REQ_POST) {
        fp_stat_request(r->method, FP_STAT_METHOD_NOT_ALLOWED);
        reply(r, 405, "Method Not Allowed", NULL, 0, 0);
        return;
    }
    if (cmd == EVHTTP_REQ_POST) { /* read (bounded by evhttp), unused */
        struct evbuffer *in = evhttp_request_get_input_buffer(req);
        if (evbuffer_drain(in, evbuffer_get_length(in)) < 0)
            fp_log(FP_LOG_DEBUG, "http: cannot drain a POST body");
    }

    uri = evhttp_request_get_uri(req);
    keylen = uri == NULL ? -1 :
        key_derive(s->key_prefix, s->key_params, s->nkey_params, uri,
                   strlen(uri), key, sizeof(key));
    if (h->signer != NULL) {
        /* Before the cache: a request without a key cannot be signed. */
        struct timeval now;
        if (keylen < 0 ||
            event_base_gettimeofday_cached(h->base, &now) != 0 ||
            fp_sign_check(h->signer, uri, strlen(uri), key, (size_t)keylen,
                          (long long)now.tv_sec) != 0) {
            fp_log(FP_LOG_DEBUG, "http: no valid signature on %.200s",
                   uri ? uri : "(null)");
            fp_stat_request(r->method, FP_STAT_FORBIDDEN);
            reply(r, 403, "Forbidden", forbidden_body,
                  sizeof(forbidden_body) - 1, 0);
            return;
        }
    }
    if (keylen < 0) {
        /* Never sent to a cache: the app is the authority on odd requests. */
        fp_log(FP_LOG_DEBUG, "http: no key for %.200s", uri ? uri : "(null)");
        fp_stat_request(r->method, FP_STAT_INVALID_KEY);
        reply(r, 404, "Not Found", NULL, 0, 0);
        return;
    }
    r->state = REQ_WAITING;
    if (fp_coalesce_get(h->co, key, (size_t)keylen, &r->w) < 0) {
        fp_log(FP_LOG_DEBUG, "http: cache get failed for %s", key);
        fp_stat_request(r->method, FP_STAT_BACKEND_ERROR);
        reply(r, 503, "Service Unavailable", NULL, 0, 0);
        return;
    }
    keep_reading(h, evcon);
    fp_log(FP_LOG_DEBUG, "http: %s waits for %s",
           r->head ? "HEAD" : cmd == EVHTTP_REQ_POST ? "POST" : "GET", key);
}

/* A descriptor is free again: accept now if EMFILE paused it. */
static void on_conn_closed(void *arg)
{
    struct fp_http *h = arg;

    fp_accept_guard_closed(h->guard);
}

/* A non-blocking listening socket on host:port, or -1 (logged). */
static evutil_socket_t listen_on(const char *host, uint16_t port)
{
    struct addrinfo hints, *res = NULL, *ai;
    char portstr[8];
    evutil_socket_t fd = -1;
    int one = 1, rc, err = 0;

    memset(&hints, 0, sizeof(hints));
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE | AI_ADDRCONFIG;
    (void)snprintf(portstr, sizeof(portstr), "%u", (unsigned)port);
    if ((rc = getaddrinfo(host, portstr, &hints, &res)) != 0) {
        fp_log(FP_LOG_ERROR, "http: cannot resolve %s: %s", host,
               gai_strerror(rc));
        return -1;
    }
    for (ai = res; ai != NULL; ai = ai->ai_next) {
        fd = socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC,
                    ai->ai_protocol);
        if (fd < 0) {
            err = errno;
            continue;
        }
        if (setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) == 0 &&
            bind(fd, ai->ai_addr, ai->ai_addrlen) == 0 &&
            listen(fd, LISTEN_BACKLOG) == 0)
            break;
        err = errno;
        close(fd);
        fd = -1;
    }
    freeaddrinfo(res);
    if (fd < 0)
        fp_log(FP_LOG_ERROR, "http: cannot listen on %s:%u: %s", host,
               (unsigned)port, strerror(err));
    return fd;
}

/* Is a server listening on this unix socket? A stale file refuses the
 * connect; a live one accepts it (or is too busy to: EAGAIN). */
static int unix_in_use(const struct sockaddr_un *sa)
{
    evutil_socket_t fd;
    int rc, err;

    fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return 1; /* cannot tell: do not remove it */
    rc = connect(fd, (const struct sockaddr *)sa, sizeof(*sa));
    err = errno;
    close(fd);
    return rc == 0 || (err != ECONNREFUSED && err != ENOENT);
}

/* A non-blocking listening unix socket at path with the given mode, or -1
 * (logged). A socket file left by a server that is gone is replaced; one
 * a server still listens on, or a file that is not a socket, is not. The
 * file's identity goes to *st, so that exit removes only our own. */
static evutil_socket_t listen_unix(const char *path, unsigned mode,
                                   struct stat *st)
{
    struct sockaddr_un sa;
    struct stat old;
    evutil_socket_t fd;
    mode_t um;
    int rc;

    if (path == NULL) /* never: the caller checks (keeps -Wformat quiet) */
        return -1;
    memset(&sa, 0, sizeof(sa));
    sa.sun_family = AF_UNIX;
    if (strlen(path) >= sizeof(sa.sun_path)) {
        fp_log(FP_LOG_ERROR, "http: unix socket path too long: %s", path);
        return -1;
    }
    memcpy(sa.sun_path, path, strlen(path) + 1);
    if (lstat(path, &old) == 0) {
        if (!S_ISSOCK(old.st_mode)) {
            fp_log(FP_LOG_ERROR, "http: %s exists and is not a socket", path);
            return -1;
        }
        if (unix_in_use(&sa)) {
            fp_log(FP_LOG_ERROR, "http: a server already listens on %s", path);
            return -1;
        }
        if (unlink(path) != 0 && errno != ENOENT) {
            fp_log(FP_LOG_ERROR, "http: cannot remove the stale socket %s: %s",
                   path, strerror(errno));
            return -1;
        }
        fp_log(FP_LOG_INFO, "http: removed the stale socket %s", path);
    } else if (errno != ENOENT) {
        fp_log(FP_LOG_ERROR, "http: cannot check %s: %s", path, strerror(errno));
        return -1;
    }
    fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        fp_log(FP_LOG_ERROR, "http: cannot create a unix socket: %s",
               strerror(errno));
        return -1;
    }
    /* Created no wider than 0600, then opened up to mode: never wider than
     * asked, not even for a moment. (Start-up: no other thread.) */
    um = umask(0177);
    rc = bind(fd, (struct sockaddr *)&sa, sizeof(sa));
    umask(um);
    if (rc != 0) {
        fp_log(FP_LOG_ERROR, "http: cannot bind %s: %s", path, strerror(errno));
        close(fd);
        return -1;
    }
    if (chmod(path, (mode_t)mode) != 0 || stat(path, st) != 0 ||
        listen(fd, LISTEN_BACKLOG) != 0) {
        fp_log(FP_LOG_ERROR, "http: cannot listen on %s: %s", path,
               strerror(errno));
        (void)unlink(path);
        close(fd);
        return -1;
    }
    return fd;
}

/* Removes our socket file, if it is still ours (a restarted instance may
 * have bound a new one at the same path meanwhile). */
static void unix_release(struct fp_http *h)
{
    struct stat st;

    if (h->unix_path == NULL)
        return;
    if (stat(h->unix_path, &st) == 0 && st.st_dev == h->unix_dev &&
        st.st_ino == h->unix_ino && unlink(h->unix_path) != 0)
        fp_log(FP_LOG_WARN, "http: cannot remove %s: %s", h->unix_path,
               strerror(errno));
    h->unix_path = NULL;
}

struct fp_http *fp_http_start(struct event_base *base,
                              const struct fp_settings *s,
                              struct fp_cache *cache)
{
    struct fp_http *h = calloc(1, sizeof(*h));
    struct timeval tv;
    evutil_socket_t fd;

    if (h == NULL) {
        fp_log(FP_LOG_ERROR, "http: out of memory");
        return NULL;
    }
    h->base = base;
    h->s = s;
    ms_to_tv(s->request_timeout_ms, &h->request_tv);
    ms_to_tv(s->idle_timeout_ms, &h->idle_tv);
    /* A first request must be in within request_timeout_ms of the accept,
     * a later one within idle + request of the previous answer. */
    timeradd(&h->request_tv, &h->idle_tv, &tv);
    if ((h->dl = fp_deadlines_new(base, &h->request_tv, &tv)) == NULL) {
        fp_log(FP_LOG_ERROR, "http: out of memory");
        free(h);
        return NULL;
    }
    if ((h->co = fp_coalesce_new(cache, on_answer, h)) == NULL ||
        (h->http = evhttp_new(base)) == NULL ||
        (s->nsign_secrets > 0 &&
         (h->signer = fp_signer_new(s->sign_secrets, s->nsign_secrets)) == NULL)) {
        fp_log(FP_LOG_ERROR, "http: out of memory");
        goto fail;
    }
    if (h->signer == NULL)
        fp_log(FP_LOG_WARN, "http: no [signing] secret_file: poll URLs are "
               "not checked, any client can read any user's answers");
    evhttp_set_max_headers_size(h->http, (ev_ssize_t)s->max_header_size);
    evhttp_set_max_body_size(h->http, (ev_ssize_t)s->max_body_size);
    /* A new connection starts under the request limit; see on_request and
     * on_complete for the switches between request and idle limits. */
    tv = h->request_tv;
    evhttp_set_timeout_tv(h->http, &tv);
    /* Every method reaches on_request, which answers 405 itself. */
    evhttp_set_allowed_methods(h->http, 0xFFFF);
    /* No text/html on our empty 404/503; hits set their own type. */
    evhttp_set_default_content_type(h->http, NULL);
    /* Read the rest of an oversized body before answering 413, so the
     * client sees the 413 rather than a reset. */
    if (evhttp_set_flags(h->http, EVHTTP_SERVER_LINGERING_CLOSE) != 0)
        fp_log(FP_LOG_WARN, "http: lingering close not supported");
    evhttp_set_gencb(h->http, on_request, h);
    evhttp_set_bevcb(h->http, fp_deadline_bevcb, h->dl);
    if ((h->guard = fp_accept_guard_new(base, "http")) == NULL) {
        fp_log(FP_LOG_ERROR, "http: out of memory");
        goto fail;
    }
    fp_deadlines_on_close(h->dl, on_conn_closed, h);

    /* evhttp owns the sockets from here (closed by evhttp_del_accept_socket
     * or evhttp_free). */
    if (s->listen != NULL) {
        if ((fd = listen_on(s->listen, s->port)) < 0)
            goto fail;
        if ((h->bound = evhttp_accept_socket_with_handle(h->http, fd)) == NULL) {
            fp_log(FP_LOG_ERROR, "http: cannot accept on %s:%u", s->listen,
                   (unsigned)s->port);
            close(fd);
            goto fail;
        }
        if (fp_accept_guard_add(h->guard, evhttp_bound_socket_get_listener(h->bound)) != 0)
            fp_log(FP_LOG_WARN, "http: accept errors on %s:%u are not guarded",
                   s->listen, (unsigned)s->port);
    }
    if (s->listen_unix != NULL) {
        struct stat st;
        if ((fd = listen_unix(s->listen_unix, s->unix_mode, &st)) < 0)
            goto fail;
        h->unix_path = s->listen_unix;
        h->unix_dev = st.st_dev;
        h->unix_ino = st.st_ino;
        if ((h->bound_unix = evhttp_accept_socket_with_handle(h->http, fd)) == NULL) {
            fp_log(FP_LOG_ERROR, "http: cannot accept on unix:%s", s->listen_unix);
            close(fd);
            goto fail;
        }
        if (fp_accept_guard_add(h->guard,
                                evhttp_bound_socket_get_listener(h->bound_unix)) != 0)
            fp_log(FP_LOG_WARN, "http: accept errors on unix:%s are not guarded",
                   s->listen_unix);
    }
    return h;
fail:
    unix_release(h);
    if (h->http != NULL)
        evhttp_free(h->http);
    fp_coalesce_free(h->co);
    fp_signer_free(h->signer);
    fp_deadlines_free(h->dl);
    fp_accept_guard_free(h->guard);
    free(h);
    return NULL;
}

void fp_http_drain(struct fp_http *h, void (*done)(void *arg), void *arg)
{
    fp_accept_guard_stop(h->guard);
    if (h->bound != NULL) {
        evhttp_del_accept_socket(h->http, h->bound);
        h->bound = NULL;
    }
    if (h->bound_unix != NULL) {
        evhttp_del_accept_socket(h->http, h->bound_unix);
        h->bound_unix = NULL;
    }
    unix_release(h); /* nginx gets ECONNREFUSED/ENOENT: the next poller */
    h->draining = 1;
    h->drained = done;
    h->drained_arg = arg;
    if (h->inflight == 0 && done != NULL) {
        h->drained = NULL;
        done(arg);
    }
}

void fp_http_abort_waiting(struct fp_http *h)
{
    fp_coalesce_fail_all(h->co, FP_CACHE_TIMEOUT);
}

unsigned long fp_http_inflight(const struct fp_http *h)
{
    return h->inflight;
}

void fp_http_coalesce_stats(const struct fp_http *h,
                            struct fp_coalesce_stats *out)
{
    fp_coalesce_stats(h->co, out);
}

void fp_http_free(struct fp_http *h)
{
    struct request *r;

    if (h == NULL)
        return;
    h->drained = NULL;
    unix_release(h);
    fp_accept_guard_stop(h->guard);
    /* Runs on_close for every request still held, which detaches it. */
    evhttp_free(h->http);
    fp_deadlines_free(h->dl); /* after evhttp_free: its closes free ours */
    fp_accept_guard_free(h->guard);
    fp_coalesce_free(h->co);
    fp_signer_free(h->signer);
    while ((r = h->free_list) != NULL) {
        h->free_list = r->free_next;
        free(r);
    }
    if (h->inflight != 0)
        fp_log(FP_LOG_WARN, "http: %lu requests still in flight at exit",
               h->inflight);
    free(h);
}

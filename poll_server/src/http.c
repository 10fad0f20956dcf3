/* http.c -- the poll server's HTTP front, on libevent's event loop and its
 * public API only (event_assign, evconnlistener, common timeouts).
 *
 * Why not evhttp: a keep-alive hit cost it 14 mallocs, 7 callocs and 21
 * frees (request, header lists, evbuffers, URI copies), 8 system calls at
 * concurrency 1 (an ioctl(FIONREAD) per read, an epoll_ctl pair per
 * request) and 3-4 timer heap operations; working around it took three
 * reliances on libevent 2.1.12 internals (docs/benchmarks.md, "Hit path").
 * What nginx sends is small and regular, so here:
 *
 * - A connection is a `struct conn` from a free list, with its three
 *   events (read, write, timer) and a small input buffer of its own
 *   (IN_SMALL bytes: what nginx sends is 100-400). A head that does not fit
 *   gets a buffer of max_header_size from a pool until the connection's
 *   input is empty again, so an idle connection holds the small one only
 *   (a fixed 8 KB buffer doubled the memory of an idle keep-alive
 *   connection). Nothing is allocated per request in steady state. An
 *   answer the socket does not take at once is the one exception (a copy of
 *   what is left, then freed).
 * - One read per readiness; a request head is parsed in place once its
 *   empty line is in (httpparse.c); a body is read and discarded as it
 *   comes. One request per connection at a time: pipelined ones wait in
 *   the buffer, answered in order; when they fill it while a request waits
 *   or is held, only the client's close is watched (watch_close).
 * - An answer is one writev of the head (formatted into a stack buffer) and
 *   the value, straight from the cache's buffer.
 * - The connection stays in the epoll set from accept to close (EV_PERSIST):
 *   no epoll_ctl per request, and a client that hangs up while its request
 *   waits for the cache is seen at once (EOF) and let go.
 * - One timer per connection, on libevent's common timeouts (a queue per
 *   duration, O(1) to re-arm): the first request must be in within
 *   request_timeout_ms of the accept, each later one within idle_timeout_ms
 *   + request_timeout_ms of the previous answer (a total limit, so a
 *   slowloris client cannot hold a connection by trickling bytes); a
 *   blocked write and a lingering close get request_timeout_ms. While a
 *   request waits for the cache the timer is ignored: the cache's own
 *   timeout bounds the wait.
 * - An answer that ends the connection (an error, Connection: close, a
 *   drain) is followed by a lingering close: shutdown(SHUT_WR), then input
 *   is read and dropped until the client closes or request_timeout_ms, so
 *   that unread bytes do not turn our close into a reset that destroys the
 *   answer before the client reads it. */
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <event2/event.h>
#include <event2/listener.h>
#include <event2/util.h>

#include "accept.h"
#include "cache.h"
#include "coalesce.h"
#include "etag.h"
#include "hold.h"
#include "http.h"
#include "httpparse.h"
#include "keys.h"
#include "log.h"
#include "settings.h"
#include "sign.h"
#include "stats.h"

#define FREE_CONN_MAX 4096 /* recycled connections kept */
/* The kernel caps this at net.core.somaxconn. When nginx opens hundreds of
 * upstream connections at once, SYNs beyond the backlog are dropped and
 * retried after a second. */
#define LISTEN_BACKLOG 4096
#define OUT_KEEP 65536     /* a slow answer's buffer is kept up to this */
/* Each connection's own input buffer. nginx's requests to a poller are a
 * request line (the URI with its signature), Host and at most one
 * If-None-Match: 100-400 bytes (docs/benchmarks.md, "Hit path"). */
#define IN_SMALL 1024
#define BIG_KEEP 64        /* pooled max_header_size buffers kept */
/* A poll URL without a valid signature (docs/security.md). */
static const char forbidden_body[] =
    "{\"error\":\"missing, invalid or expired signature\"}\n";

enum conn_state {
    C_HEAD,     /* reading a request head */
    C_BODY,     /* reading (and discarding) its body */
    C_WAIT,     /* the request waits for the cache */
    C_HOLD,     /* a long poll waits for its answer to change (hold.c) */
    C_WRITE,    /* its answer is being written */
    C_LINGER    /* answered, closing: input is dropped until EOF */
};

struct conn {
    struct fp_waiter w;             /* first: the coalescer's handle */
    struct fp_http *h;
    struct conn *prev, *next;       /* open connections, or the free list */
    evutil_socket_t fd;
    struct event *rev, *wev, *timer;
    enum conn_state state;
    int reading;                    /* rev is added */
    int edge;                       /* rev is edge-triggered (watch_close) */
    int resume;                     /* rev was activated to parse, not read */
    int counted;                    /* the request is in h->inflight */
    /* The request being read or answered. */
    enum fp_stat_method method;
    int head_only, keep_alive, minor, chunked, too_large;
    int verdict;                    /* 0: ask the cache; else answer this */
    enum fp_stat_outcome outcome;   /* ... counted as this */
    unsigned long long body_left;   /* Content-Length bytes to read */
    struct fp_chunked ch;
    size_t keylen;
    char key[FP_MAX_KEY_LEN + 1];
    /* Conditional and long polls (etag.h, hold.h). */
    struct fp_inm inm;              /* If-None-Match, if cond */
    int cond;                       /* GET/HEAD with a valid If-None-Match */
    unsigned wait_s;                /* wait=, clamped; 0: not a long poll */
    uint64_t ann_seq;               /* fp_hold_seq() before its cache read */
    int has_tag;                    /* the answer from the cache has ... */
    uint64_t tag;                   /* ... this ETag */
    unsigned pace_ms;               /* ... and this Poll-Interval-Ms */
    struct fp_held held;
    /* Input: in[in_off, in_len) not parsed yet; `scanned` bytes of it were
     * searched for the end of a head already. `in` is `small` (in_cap:
     * h->in_small) or, while a long head is read, a pooled buffer of
     * h->in_max bytes. */
    char *in;
    size_t in_cap, in_off, in_len, scanned;
    /* What the socket did not take of an answer (the slow path). */
    char *out;
    size_t out_off, out_len, out_cap;
    char small[];                   /* h->in_small bytes */
};

struct fp_http {
    struct event_base *base;
    const struct fp_settings *s;
    struct evconnlistener *lev;       /* TCP listener, or NULL */
    struct evconnlistener *lev_unix;  /* unix socket listener, or NULL */
    const char *unix_path;      /* ours to unlink at exit, or NULL */
    dev_t unix_dev;             /* ... if it is still the one we bound */
    ino_t unix_ino;
    struct fp_coalesce *co;
    struct fp_hold *hold;       /* held long polls */
    struct fp_signer *signer;   /* NULL: poll URLs are not signed */
    struct fp_accept_guard *guard; /* pauses accepting on EMFILE */
    struct conn *conns;         /* open */
    struct conn *free_list;
    size_t nfree;
    size_t in_small, in_max;    /* input buffer sizes (see struct conn) */
    char *big_free;             /* pooled in_max buffers, linked through */
    size_t nbig;                /* ... their first bytes; how many */
    unsigned long inflight;
    int draining;
    void (*drained)(void *arg);
    void *drained_arg;
    /* Common timeouts (event_base_init_common_timeout): O(1) timers. */
    const struct timeval *request_tv, *next_tv;
    time_t date_sec;            /* date holds this second's Date header */
    char date[64];
};

static void ms_to_tv(unsigned ms, struct timeval *tv)
{
    tv->tv_sec = (time_t)(ms / 1000);
    tv->tv_usec = (suseconds_t)(ms % 1000) * 1000;
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

static void on_read(evutil_socket_t fd, short what, void *arg);
static void on_write(evutil_socket_t fd, short what, void *arg);
static void on_timer(evutil_socket_t fd, short what, void *arg);
static void process(struct conn *c);

static void arm(struct conn *c, const struct timeval *tv)
{
    if (evtimer_add(c->timer, tv) != 0)
        fp_log(FP_LOG_ERROR, "http: cannot arm a connection timer");
}

/* Back to the level-triggered read event (watch_close undone); reading
 * is off after it. */
static void unwatch(struct conn *c)
{
    if (!c->edge)
        return;
    c->edge = 0;
    c->reading = 0;
    if (event_del(c->rev) != 0 ||
        event_assign(c->rev, c->h->base, c->fd, EV_READ | EV_PERSIST, on_read,
                     c) != 0)
        fp_log(FP_LOG_ERROR, "http: cannot reset a connection's read event");
}

static void read_on(struct conn *c)
{
    unwatch(c);
    if (c->reading)
        return;
    if (event_add(c->rev, NULL) != 0) {
        fp_log(FP_LOG_ERROR, "http: cannot read a connection");
        return;
    }
    c->reading = 1;
}

static void read_off(struct conn *c)
{
    if (!c->reading)
        return;
    if (event_del(c->rev) != 0)
        fp_log(FP_LOG_ERROR, "http: cannot stop reading a connection");
    c->reading = 0;
}

/* The input is full while the request waits for the cache or is held:
 * pipelined requests must wait their turn unread, but a client that goes
 * away must still be seen (a held poll would keep its slot for its whole
 * wait). The read event turns edge-triggered, so it fires once per change
 * (more bytes, FIN, RST) rather than while bytes wait, and each time the
 * socket is asked whether the peer has gone (peer_gone), reading nothing.
 * answer() undoes it before anything is written (a level-triggered write
 * event would make the fd level-triggered again). */
static void watch_close(struct conn *c)
{
    read_off(c);
    if (event_assign(c->rev, c->h->base, c->fd, EV_READ | EV_ET | EV_PERSIST,
                     on_read, c) != 0 ||
        event_add(c->rev, NULL) != 0) {
        fp_log(FP_LOG_ERROR, "http: cannot watch a connection for its close");
        (void)event_assign(c->rev, c->h->base, c->fd, EV_READ | EV_PERSIST,
                           on_read, c);
        return;
    }
    c->edge = 1;
    c->reading = 1;
}

/* Has the peer shut down its side or reset the connection? Pending input
 * does not hide it (a read would see the EOF only after it): POLLRDHUP is
 * set on the FIN's arrival, for TCP and unix sockets alike. */
static int peer_gone(evutil_socket_t fd)
{
    struct pollfd p;

    p.fd = fd;
    p.events = POLLRDHUP;
    p.revents = 0;
    if (poll(&p, 1, 0) <= 0)
        return 0;
    return (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0;
}

/* A head does not fit the small buffer: move the input to a buffer of
 * in_max bytes (pooled). Returns 0, or -1 if out of memory. */
static int in_grow(struct conn *c)
{
    struct fp_http *h = c->h;
    char *b = h->big_free;

    if (b != NULL) {
        memcpy(&h->big_free, b, sizeof(h->big_free));
        h->nbig--;
    } else if ((b = malloc(h->in_max)) == NULL) {
        return -1;
    }
    memcpy(b, c->in + c->in_off, c->in_len - c->in_off);
    c->in_len -= c->in_off;
    c->in_off = 0;
    c->in = b;
    c->in_cap = h->in_max;
    return 0;
}

/* The input is empty: a big buffer goes back to the pool (or is freed when
 * the pool is full) and the connection reads into its small one again. */
static void in_shrink(struct conn *c)
{
    struct fp_http *h = c->h;

    c->in_off = c->in_len = 0;
    if (c->in == c->small)
        return;
    if (h->nbig < BIG_KEEP) {
        memcpy(c->in, &h->big_free, sizeof(h->big_free));
        h->big_free = c->in;
        h->nbig++;
    } else {
        free(c->in);
    }
    c->in = c->small;
    c->in_cap = h->in_small;
}

/* A connection for fd, from the free list or new; NULL if out of memory. */
static struct conn *conn_get(struct fp_http *h, evutil_socket_t fd)
{
    struct conn *c = h->free_list;

    if (c != NULL) {
        h->free_list = c->next;
        h->nfree--;
    } else {
        if ((c = malloc(sizeof(*c) + h->in_small)) == NULL)
            return NULL;
        memset(c, 0, sizeof(*c));
        c->rev = event_new(h->base, -1, 0, on_read, c);
        c->wev = event_new(h->base, -1, 0, on_write, c);
        c->timer = evtimer_new(h->base, on_timer, c);
        if (c->rev == NULL || c->wev == NULL || c->timer == NULL) {
            if (c->rev != NULL)
                event_free(c->rev);
            if (c->wev != NULL)
                event_free(c->wev);
            if (c->timer != NULL)
                event_free(c->timer);
            free(c);
            return NULL;
        }
    }
    /* Events not pending (conn_put deleted them) may be reassigned. */
    if (event_assign(c->rev, h->base, fd, EV_READ | EV_PERSIST, on_read, c) != 0 ||
        event_assign(c->wev, h->base, fd, EV_WRITE | EV_PERSIST, on_write, c) != 0) {
        event_free(c->rev);
        event_free(c->wev);
        event_free(c->timer);
        free(c);
        return NULL;
    }
    c->h = h;
    c->fd = fd;
    c->state = C_HEAD;
    c->reading = c->resume = c->counted = c->edge = 0;
    c->in = c->small;
    c->in_cap = h->in_small;
    c->in_off = c->in_len = c->scanned = 0;
    c->out_off = c->out_len = 0;
    memset(&c->w, 0, sizeof(c->w));
    c->prev = NULL;
    c->next = h->conns;
    if (h->conns != NULL)
        h->conns->prev = c;
    h->conns = c;
    return c;
}

static void conn_destroy(struct conn *c)
{
    event_free(c->rev);
    event_free(c->wev);
    event_free(c->timer);
    free(c->out);
    free(c);
}

static void check_drained(struct fp_http *h)
{
    if (h->draining && h->inflight == 0 && h->drained != NULL) {
        void (*cb)(void *) = h->drained;
        h->drained = NULL;
        cb(h->drained_arg);
    }
}

static void request_done(struct conn *c)
{
    if (!c->counted)
        return;
    c->counted = 0;
    c->h->inflight--;
    check_drained(c->h);
}

/* Closes the connection and recycles it. c is gone after this. */
static void conn_close(struct conn *c)
{
    struct fp_http *h = c->h;

    if (c->state == C_WAIT) {
        fp_stat_request(c->method, FP_STAT_CLIENT_CLOSED);
        fp_coalesce_detach(&c->w);
        fp_log(FP_LOG_DEBUG, "http: connection closed with a request waiting "
               "for the cache");
    } else if (c->state == C_HOLD) {
        /* The client of a held poll went away: its slot is free at once. */
        fp_stat_request(c->method, FP_STAT_CLIENT_CLOSED);
        fp_hold_remove(&c->held);
    }
    /* Deleting events that are not pending is a no-op. */
    if (event_del(c->rev) != 0 || event_del(c->wev) != 0 ||
        event_del(c->timer) != 0)
        fp_log(FP_LOG_ERROR, "http: cannot remove a connection's events");
    if (evutil_closesocket(c->fd) != 0)
        fp_log(FP_LOG_DEBUG, "http: close: %s", strerror(errno));
    if (c->prev != NULL)
        c->prev->next = c->next;
    else
        h->conns = c->next;
    if (c->next != NULL)
        c->next->prev = c->prev;
    fp_stat_conn_closed();
    in_shrink(c);
    if (c->out_cap > OUT_KEEP) {
        free(c->out);
        c->out = NULL;
        c->out_cap = 0;
    }
    {
        int counted = c->counted;

        c->counted = 0;
        if (h->nfree < FREE_CONN_MAX) {
            c->next = h->free_list;
            h->free_list = c;
            h->nfree++;
        } else {
            conn_destroy(c);
        }
        if (counted) {
            h->inflight--;
            check_drained(h);
        }
    }
    fp_accept_guard_closed(h->guard); /* a descriptor is free again */
}

/* The answer is out and the connection ends: see the top of the file. */
static void linger(struct conn *c)
{
    if (shutdown(c->fd, SHUT_WR) != 0) {
        conn_close(c);
        return;
    }
    c->state = C_LINGER;
    in_shrink(c);
    read_on(c);
    arm(c, c->h->request_tv);
}

/* The answer is written. Returns 0 if the connection goes on with its next
 * request, 1 if not (it lingers, or is gone). */
static int answered(struct conn *c)
{
    int keep = c->keep_alive && !c->h->draining;

    request_done(c);
    if (!keep) {
        linger(c);
        return 1;
    }
    c->state = C_HEAD;
    c->scanned = 0;
    read_on(c);
    arm(c, c->h->next_tv);
    return 0;
}

static const char *reason_of(int code)
{
    switch (code) {
    case 200: return "OK";
    case 304: return "Not Modified";
    case 400: return "Bad Request";
    case 403: return "Forbidden";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 413: return "Payload Too Large";
    case 431: return "Request Header Fields Too Large";
    case 501: return "Not Implemented";
    default: return "Service Unavailable";
    }
}

/* Formats the head of an answer into buf. Returns its length, 0 if it
 * does not fit. */
static size_t format_head(struct conn *c, char *buf, size_t cap, int code,
                          size_t len, int from_cache)
{
    const char *end = buf + cap, *date;
    char *p = buf;
    int close_it = !c->keep_alive || c->h->draining;

    p = put(p, end, c->minor == 0 ? "HTTP/1.0 " : "HTTP/1.1 ", 9);
    p = put_num(p, end, (size_t)code);
    p = put(p, end, " ", 1);
    p = put_str(p, end, reason_of(code));
    if (code != 304) { /* RFC 9110 15.4.5: a 304 has no content headers */
        p = put(p, end, "\r\nContent-Length: ", 18);
        p = put_num(p, end, len);
    }
    if (from_cache) {
        if (code != 304) {
            p = put(p, end, "\r\nContent-Type: ", 16);
            p = put_str(p, end, c->h->s->content_type);
        }
        p = put(p, end, "\r\nX-Poll-Source: cache", 22);
        if (c->has_tag) {
            char tag[18];

            fp_etag_format(c->tag, tag);
            p = put(p, end, "\r\nETag: ", 8);
            p = put(p, end, tag, sizeof(tag));
        }
        p = put(p, end, "\r\nPoll-Interval-Ms: ", 20);
        p = put_num(p, end, c->pace_ms);
    } else if (code == 403) {
        p = put_str(p, end, "\r\nContent-Type: application/json");
    } else if (code == 405) {
        p = put_str(p, end, "\r\nAllow: GET, HEAD, POST");
    }
    if ((date = date_now(c->h)) != NULL) {
        p = put(p, end, "\r\nDate: ", 8);
        p = put_str(p, end, date);
    }
    if (close_it)
        p = put(p, end, "\r\nConnection: close", 19);
    else if (c->minor == 0)
        p = put(p, end, "\r\nConnection: keep-alive", 24);
    p = put(p, end, "\r\n\r\n", 4);
    return p == NULL ? 0 : (size_t)(p - buf);
}

/* Keeps what the socket did not take of head + body (from `sent` on), to
 * be written when it can. -1 if out of memory. */
static int keep_rest(struct conn *c, const char *head, size_t hlen,
                     const char *body, size_t blen, size_t sent)
{
    size_t need = hlen + blen - sent;

    if (need > c->out_cap) {
        char *p = realloc(c->out, need);
        if (p == NULL)
            return -1;
        c->out = p;
        c->out_cap = need;
    }
    if (sent < hlen) {
        memcpy(c->out, head + sent, hlen - sent);
        if (blen > 0 && body != NULL)
            memcpy(c->out + hlen - sent, body, blen);
    } else if (body != NULL) { /* never NULL: something is left */
        memcpy(c->out, body + (sent - hlen), need);
    }
    c->out_off = 0;
    c->out_len = need;
    return 0;
}

/* Writes an answer: one writev of the head and the body. Returns 0 if the
 * connection goes on with its next request, 1 if not (the answer is still
 * being written, or the connection lingers or is gone). */
static int answer(struct conn *c, int code, const char *body, size_t len,
                  int from_cache)
{
    char head[1024];
    struct iovec iov[2];
    size_t hlen, blen = c->head_only ? 0 : len;
    ssize_t n;

    unwatch(c);
    if ((hlen = format_head(c, head, sizeof(head), code, len, from_cache)) == 0) {
        /* Never with a content_type of at most 255 bytes (config.c). */
        fp_log(FP_LOG_ERROR, "http: an answer's head does not fit");
        c->keep_alive = 0;
        hlen = format_head(c, head, sizeof(head), 503, 0, 0);
        blen = 0;
    }
    iov[0].iov_base = head;
    iov[0].iov_len = hlen;
    /* iovec has no const; writev only reads it.
     * NOLINTNEXTLINE(performance-no-int-to-ptr) */
    iov[1].iov_base = (void *)(uintptr_t)body;
    iov[1].iov_len = blen;
    do
        n = writev(c->fd, iov, blen > 0 ? 2 : 1);
    while (n < 0 && errno == EINTR);
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK) {
        fp_log(FP_LOG_DEBUG, "http: write: %s", strerror(errno));
        conn_close(c);
        return 1;
    }
    if (n < 0)
        n = 0;
    if ((size_t)n == hlen + blen)
        return answered(c);
    if (keep_rest(c, head, hlen, body, blen, (size_t)n) != 0) {
        /* Half an answer went out: the connection cannot be reused. */
        fp_log(FP_LOG_ERROR, "http: out of memory writing an answer");
        conn_close(c);
        return 1;
    }
    c->state = C_WRITE;
    if (event_add(c->wev, NULL) != 0) {
        fp_log(FP_LOG_ERROR, "http: cannot wait to write an answer");
        conn_close(c);
        return 1;
    }
    arm(c, c->h->request_tv); /* a write that makes no progress ends */
    return 1;
}

/* A request we will not serve: answered, then the connection ends. */
static void refuse(struct conn *c, int code)
{
    fp_log(FP_LOG_DEBUG, "http: refusing a request: %d", code);
    c->keep_alive = 0;
    c->head_only = 0;
    (void)answer(c, code, NULL, 0, 0);
}

static void on_write(evutil_socket_t fd, short what, void *arg)
{
    struct conn *c = arg;
    ssize_t n;

    (void)what;
    n = write(fd, c->out + c->out_off, c->out_len - c->out_off);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
        return;
    if (n < 0) {
        fp_log(FP_LOG_DEBUG, "http: write: %s", strerror(errno));
        conn_close(c);
        return;
    }
    c->out_off += (size_t)n;
    if (c->out_off < c->out_len)
        return;
    c->out_off = c->out_len = 0;
    if (event_del(c->wev) != 0)
        fp_log(FP_LOG_ERROR, "http: cannot stop writing a connection");
    if (c->out_cap > OUT_KEEP) {
        free(c->out);
        c->out = NULL;
        c->out_cap = 0;
    }
    if (answered(c) == 0)
        process(c);
}

/* Pipelined requests are parsed from the loop, not from inside a
 * delivery (the coalescer's or hold.c's). */
static void resume_later(struct conn *c)
{
    if (c->in_len > c->in_off) {
        c->resume = 1;
        event_active(c->rev, EV_READ, 1);
    }
}

/* Held polls that end get a pace of 0 plus the jitter of interval_ms: ask
 * again at once, spread out (docs/api.md, "Poll-Interval-Ms"). */
static unsigned held_pace(const struct fp_settings *s)
{
    return fp_pace_ms(s->poll_interval_ms, s->poll_jitter_pct) -
           s->poll_interval_ms;
}

/* The poll's If-None-Match matches the cached answer: hold it if it asked
 * to wait and a slot is free. Returns 1 if held, 0 to answer 304 now. */
static int hold_or_304(struct conn *c)
{
    struct fp_http *h = c->h;
    struct timeval tv;

    if (c->wait_s == 0 || h->draining)
        return 0;
    c->held.inm = &c->inm;
    if (fp_hold_add(h->hold, c->key, c->keylen, &c->held, c->ann_seq) != 0) {
        fp_stat_over_cap();
        fp_log(FP_LOG_DEBUG, "http: %zu polls held: answering at once",
               fp_hold_count(h->hold));
        return 0;
    }
    c->state = C_HOLD;
    tv.tv_sec = (time_t)c->wait_s;
    tv.tv_usec = 0;
    if (evtimer_add(c->timer, &tv) != 0) {
        fp_log(FP_LOG_ERROR, "http: cannot arm a held poll's timer");
        fp_hold_remove(&c->held);
        c->state = C_WAIT;
        return 0;
    }
    return 1;
}

/* A held poll ends with 304: its wait is over, or the server drains. */
static void end_hold(struct conn *c, enum fp_stat_wake cause)
{
    fp_hold_remove(&c->held);
    fp_stat_wake(cause);
    fp_stat_request(c->method, FP_STAT_NOT_MODIFIED);
    c->state = C_HEAD;
    c->pace_ms = held_pace(c->h->s);
    if (answer(c, 304, NULL, 0, 1) == 0)
        resume_later(c);
}

/* hold.c: a held poll's answer changed (200), or its key is gone (404:
 * nginx asks the app). */
static void on_release(struct fp_held *hd, enum fp_cache_status st,
                       const char *value, size_t len, uint64_t tag,
                       enum fp_stat_wake cause, void *arg)
{
    struct conn *c = (struct conn *)(void *)((char *)hd - offsetof(struct conn, held));
    int code = st == FP_CACHE_HIT ? 200 : 404;

    (void)arg;
    fp_stat_wake(cause);
    fp_stat_request(c->method, code == 200 ? FP_STAT_HIT : FP_STAT_MISS);
    c->state = C_HEAD;
    c->has_tag = 1;
    c->tag = tag;
    c->pace_ms = held_pace(c->h->s);
    if (answer(c, code, code == 200 ? value : NULL, code == 200 ? len : 0,
               code == 200) == 0)
        resume_later(c);
}

static void on_answer(struct fp_waiter *w, enum fp_cache_status st,
                      const char *value, size_t len, void *arg)
{
    struct conn *c = (struct conn *)(void *)w;
    int code = 503;

    (void)arg;
    switch (st) {
    case FP_CACHE_HIT:
        c->has_tag = 1;
        c->tag = fp_etag_of(value, len);
        c->pace_ms = fp_pace_ms(c->h->s->poll_interval_ms,
                                c->h->s->poll_jitter_pct);
        if (c->cond && fp_inm_match(&c->inm, c->tag)) {
            if (hold_or_304(c))
                return;
            fp_stat_request(c->method, FP_STAT_NOT_MODIFIED);
            code = 304;
            break;
        }
        fp_stat_request(c->method, FP_STAT_HIT);
        code = 200;
        break;
    case FP_CACHE_MISS:
        fp_stat_request(c->method, FP_STAT_MISS);
        code = 404;
        break;
    case FP_CACHE_TIMEOUT:
        fp_stat_request(c->method, FP_STAT_TIMEOUT);
        break;
    case FP_CACHE_ERROR:
    default:
        fp_stat_request(c->method, FP_STAT_BACKEND_ERROR);
        break;
    }
    c->state = C_HEAD; /* not waiting any more (conn_close must not detach) */
    if (answer(c, code, code == 200 ? value : NULL, code == 200 ? len : 0,
               code == 200 || code == 304) != 0)
        return;
    resume_later(c);
}

/* The request is in (head and body): answer it, or ask the cache. Returns
 * 0 if the connection goes on with its next request, 1 if not. */
static int dispatch(struct conn *c)
{
    struct fp_http *h = c->h;

    c->counted = 1;
    h->inflight++;
    if (c->verdict != 0) {
        fp_stat_request(c->method, c->outcome);
        return answer(c, c->verdict, c->verdict == 403 ? forbidden_body : NULL,
                      c->verdict == 403 ? sizeof(forbidden_body) - 1 : 0, 0);
    }
    c->state = C_WAIT;
    /* Before the read starts: an announcement of this key from now on may
     * come after the cache answered the read (fp_hold_add). */
    c->ann_seq = fp_hold_seq(h->hold);
    if (fp_coalesce_get(h->co, c->key, c->keylen, &c->w) < 0) {
        fp_log(FP_LOG_DEBUG, "http: cache get failed for %s", c->key);
        fp_stat_request(c->method, FP_STAT_BACKEND_ERROR);
        c->state = C_HEAD;
        return answer(c, 503, NULL, 0, 0);
    }
    fp_log(FP_LOG_DEBUG, "http: %s waits for %s", c->head_only ? "HEAD" :
           c->method == FP_STAT_POST ? "POST" : "GET", c->key);
    return 1;
}

/* The head buf[0..len) is in: parse it and decide the answer (before the
 * body, which is dropped: the head's bytes may go with it). Returns 0, or
 * the status to refuse the request with. */
static int start_request(struct conn *c, const char *buf, size_t len)
{
    struct fp_http *h = c->h;
    const struct fp_settings *s = h->s;
    struct fp_http_head hd;
    ssize_t keylen;
    int st;

    c->minor = 1;
    if ((st = fp_http_parse_head(buf, len, &hd)) != 0)
        return st;
    c->minor = hd.minor;
    c->keep_alive = hd.keep_alive;
    c->head_only = hd.method == FP_HM_HEAD;
    c->method = hd.method == FP_HM_GET ? FP_STAT_GET :
                hd.method == FP_HM_HEAD ? FP_STAT_HEAD :
                hd.method == FP_HM_POST ? FP_STAT_POST : FP_STAT_OTHER;
    c->chunked = hd.chunked;
    c->body_left = hd.has_length ? hd.content_length : 0;
    c->too_large = hd.has_length && hd.content_length > s->max_body_size;
    if (c->chunked)
        fp_chunked_init(&c->ch);
    c->verdict = 0;
    c->has_tag = 0;
    c->wait_s = 0;
    if (hd.method == FP_HM_OTHER) {
        c->verdict = 405;
        c->outcome = FP_STAT_METHOD_NOT_ALLOWED;
        return 0;
    }
    /* POST polls are not evaluated (docs/api.md, "If-None-Match"). */
    c->cond = hd.method != FP_HM_POST && hd.ninm <= FP_HTTP_MAX_INM &&
              fp_inm_parse(hd.inm, hd.inm_len, hd.ninm, &c->inm);
    {
        long w = fp_wait_param(hd.target, hd.target_len, s->poll_max_wait);

        if (w < 0) {
            c->verdict = 400;
            c->outcome = FP_STAT_BAD_REQUEST;
            return 0;
        }
        /* nginx's plain-poll route gives up on a poller after 5 s and
         * marks it failed: such a request is never held, whatever its
         * query says (docs/api.md, "`wait`"). */
        c->wait_s = hd.route == FP_ROUTE_PLAIN ? 0 : (unsigned)w;
    }
    keylen = key_derive(s->key_prefix, s->key_params, s->nkey_params,
                        hd.target, hd.target_len, c->key, sizeof(c->key));
    if (h->signer != NULL) {
        /* Before the cache: a request without a key cannot be signed. */
        struct timeval now;
        if (keylen < 0 || event_base_gettimeofday_cached(h->base, &now) != 0 ||
            fp_sign_check(h->signer, hd.target, hd.target_len, c->key,
                          (size_t)keylen, (long long)now.tv_sec) != 0) {
            fp_log(FP_LOG_DEBUG, "http: no valid signature on %.*s",
                   (int)(hd.target_len > 200 ? 200 : hd.target_len), hd.target);
            c->verdict = 403;
            c->outcome = FP_STAT_FORBIDDEN;
            return 0;
        }
    }
    if (keylen < 0) {
        /* Never sent to a cache: the app is the authority on odd requests. */
        fp_log(FP_LOG_DEBUG, "http: no key for %.*s",
               (int)(hd.target_len > 200 ? 200 : hd.target_len), hd.target);
        c->verdict = 404;
        c->outcome = FP_STAT_INVALID_KEY;
        return 0;
    }
    c->keylen = (size_t)keylen;
    return 0;
}

/* Parses and serves what the input holds, request after request, until it
 * runs out, a request waits, or the connection ends. */
static void process(struct conn *c)
{
    struct fp_http *h = c->h;

    while (c->state == C_HEAD || c->state == C_BODY) {
        const char *p = c->in + c->in_off;
        size_t avail = c->in_len - c->in_off, end;
        int done, st;

        if (avail == 0) {
            in_shrink(c);
            return;
        }
        if (c->state == C_HEAD) {
            /* RFC 9112 2.2: empty lines before a request are ignored. */
            if (c->scanned == 0 && avail >= 2 && p[0] == '\r' && p[1] == '\n') {
                c->in_off += 2;
                continue;
            }
            if ((end = fp_http_head_end(p, avail, c->scanned)) == 0) {
                if (avail >= h->in_max) {
                    refuse(c, 431);
                    return;
                }
                c->scanned = avail;
                return;
            }
            c->scanned = 0;
            st = start_request(c, p, end);
            c->in_off += end;
            if (st != 0) {
                refuse(c, st);
                return;
            }
            if (c->chunked || c->body_left > 0) {
                c->state = C_BODY;
                continue;
            }
        } else if (c->chunked) {
            ssize_t n = fp_chunked_feed(&c->ch, p, avail, &done);

            if (n < 0) {
                refuse(c, 400);
                return;
            }
            c->in_off += (size_t)n;
            if (c->ch.total > h->s->max_body_size)
                c->too_large = 1;
            if (!done)
                continue;
        } else {
            size_t n = avail < c->body_left ? avail : (size_t)c->body_left;

            c->in_off += n;
            c->body_left -= n;
            if (c->body_left > 0)
                continue;
        }
        /* Head and body are in. A body over the limit was read to the end
         * so that the client sees the 413, not a reset. */
        if (c->too_large) {
            refuse(c, 413);
            return;
        }
        c->state = C_HEAD;
        if (dispatch(c) != 0)
            return;
    }
}

static void on_read(evutil_socket_t fd, short what, void *arg)
{
    struct conn *c = arg;
    struct fp_http *h = c->h;
    ssize_t n;

    (void)what;
    if (c->edge) {
        /* watch_close: nothing is read until the request is answered. */
        if (peer_gone(fd)) {
            fp_log(FP_LOG_DEBUG, "http: client gone while its input was full");
            conn_close(c);
        }
        return;
    }
    if (c->resume) {
        /* on_answer activated us: parse what came pipelined. */
        c->resume = 0;
        if (c->in_len > c->in_off) {
            process(c);
            return;
        }
    }
    if (c->in_off > 0) {
        memmove(c->in, c->in + c->in_off, c->in_len - c->in_off);
        c->in_len -= c->in_off;
        c->in_off = 0;
    }
    if (c->in_len == c->in_cap) {
        if (c->state != C_HEAD || c->in_cap == h->in_max) {
            /* Full while a request waits or is written: read again once it
             * is answered (answered() turns reading back on). */
            if (c->state == C_WAIT || c->state == C_HOLD)
                watch_close(c);
            else
                read_off(c);
            return;
        }
        /* A head longer than the small buffer (process() refuses one
         * longer than in_max). */
        if (in_grow(c) != 0) {
            fp_log(FP_LOG_ERROR, "http: out of memory for a request head");
            conn_close(c);
            return;
        }
    }
    n = read(fd, c->in + c->in_len, c->in_cap - c->in_len);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
        return;
    if (n <= 0) {
        /* EOF or an error: the client is gone, whatever it had sent. */
        if (n < 0)
            fp_log(FP_LOG_DEBUG, "http: read: %s", strerror(errno));
        conn_close(c);
        return;
    }
    if (c->state == C_LINGER) {
        c->in_len = 0;
        return;
    }
    c->in_len += (size_t)n;
    process(c);
}

static void on_timer(evutil_socket_t fd, short what, void *arg)
{
    struct conn *c = arg;

    (void)fd;
    (void)what;
    switch (c->state) {
    case C_WAIT:
        return; /* the cache's timeout bounds it; re-armed once answered */
    case C_HOLD:
        end_hold(c, FP_STAT_WAKE_TIMEOUT);
        return;
    case C_HEAD:
    case C_BODY:
        /* Not in within the limit: closed, with no answer. */
        fp_log(FP_LOG_DEBUG, "http: request not received within the limit, "
               "closing the connection");
        break;
    case C_WRITE:
        fp_log(FP_LOG_DEBUG, "http: answer not written within the limit, "
               "closing the connection");
        break;
    case C_LINGER:
    default:
        break;
    }
    conn_close(c);
}

static void on_accept(struct evconnlistener *lev, evutil_socket_t fd,
                      struct sockaddr *sa, int salen, void *arg)
{
    struct fp_http *h = arg;
    struct conn *c;

    (void)lev;
    (void)salen;
    if ((c = conn_get(h, fd)) == NULL) {
        fp_log(FP_LOG_ERROR, "http: out of memory for a connection");
        evutil_closesocket(fd);
        return;
    }
    fp_stat_conn_open();
    if (sa != NULL && sa->sa_family != AF_UNIX) {
        /* Answers are written whole: never hold one back for an ACK. */
        int one = 1;
        if (setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one)) != 0)
            fp_log(FP_LOG_DEBUG, "http: TCP_NODELAY: %s", strerror(errno));
    }
    read_on(c);
    arm(c, h->request_tv);
    if (!c->reading)
        conn_close(c);
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

/* Accepts on fd (listening already) into on_accept; closed with the
 * listener. NULL on error (fd is then closed). */
static struct evconnlistener *accept_on(struct fp_http *h, evutil_socket_t fd)
{
    struct evconnlistener *lev;

    /* backlog 0: the socket listens already (with LISTEN_BACKLOG). */
    lev = evconnlistener_new(h->base, on_accept, h,
                             LEV_OPT_CLOSE_ON_FREE | LEV_OPT_CLOSE_ON_EXEC, 0, fd);
    if (lev == NULL)
        evutil_closesocket(fd);
    return lev;
}

struct fp_http *fp_http_start(struct event_base *base,
                              const struct fp_settings *s,
                              struct fp_cache *cache)
{
    struct fp_http *h = calloc(1, sizeof(*h));
    struct timeval req, idle, next;
    evutil_socket_t fd;

    if (h == NULL) {
        fp_log(FP_LOG_ERROR, "http: out of memory");
        return NULL;
    }
    h->base = base;
    h->s = s;
    h->in_max = s->max_header_size;
    h->in_small = h->in_max < IN_SMALL ? h->in_max : IN_SMALL;
    ms_to_tv(s->request_timeout_ms, &req);
    ms_to_tv(s->idle_timeout_ms, &idle);
    /* A first request must be in within request_timeout_ms of the accept,
     * a later one within idle + request of the previous answer. */
    timeradd(&req, &idle, &next);
    if ((h->request_tv = event_base_init_common_timeout(base, &req)) == NULL ||
        (h->next_tv = event_base_init_common_timeout(base, &next)) == NULL) {
        fp_log(FP_LOG_ERROR, "http: cannot set up the connection timers");
        free(h);
        return NULL;
    }
    if ((h->co = fp_coalesce_new(cache, on_answer, h)) == NULL ||
        (h->hold = fp_hold_new(base, s, cache, on_release, h)) == NULL ||
        (s->nsign_secrets > 0 &&
         (h->signer = fp_signer_new(s->sign_secrets, s->nsign_secrets)) == NULL) ||
        (h->guard = fp_accept_guard_new(base, "http")) == NULL) {
        fp_log(FP_LOG_ERROR, "http: out of memory");
        goto fail;
    }
    if (h->signer == NULL)
        fp_log(FP_LOG_WARN, "http: no [signing] secret_file: poll URLs are "
               "not checked, any client can read any user's answers");

    if (s->listen != NULL) {
        if ((fd = listen_on(s->listen, s->port)) < 0)
            goto fail;
        if ((h->lev = accept_on(h, fd)) == NULL) {
            fp_log(FP_LOG_ERROR, "http: cannot accept on %s:%u", s->listen,
                   (unsigned)s->port);
            goto fail;
        }
        if (fp_accept_guard_add(h->guard, h->lev) != 0)
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
        if ((h->lev_unix = accept_on(h, fd)) == NULL) {
            fp_log(FP_LOG_ERROR, "http: cannot accept on unix:%s", s->listen_unix);
            goto fail;
        }
        if (fp_accept_guard_add(h->guard, h->lev_unix) != 0)
            fp_log(FP_LOG_WARN, "http: accept errors on unix:%s are not guarded",
                   s->listen_unix);
    }
    return h;
fail:
    unix_release(h);
    if (h->lev != NULL)
        evconnlistener_free(h->lev);
    if (h->lev_unix != NULL)
        evconnlistener_free(h->lev_unix);
    fp_coalesce_free(h->co);
    fp_hold_free(h->hold);
    fp_signer_free(h->signer);
    fp_accept_guard_free(h->guard);
    free(h);
    return NULL;
}

static void stop_listening(struct fp_http *h)
{
    fp_accept_guard_stop(h->guard);
    if (h->lev != NULL) {
        evconnlistener_free(h->lev);
        h->lev = NULL;
    }
    if (h->lev_unix != NULL) {
        evconnlistener_free(h->lev_unix);
        h->lev_unix = NULL;
    }
    unix_release(h); /* nginx gets ECONNREFUSED/ENOENT: the next poller */
}

void fp_http_drain(struct fp_http *h, void (*done)(void *arg), void *arg)
{
    struct conn *c, *next;

    stop_listening(h);
    h->draining = 1;
    h->drained = done;
    h->drained_arg = arg;
    /* Held polls are answered now (304, Connection: close): nothing would
     * wake them before the drain's limit. */
    for (c = h->conns; c != NULL; c = next) {
        next = c->next;
        if (c->state == C_HOLD)
            end_hold(c, FP_STAT_WAKE_SHUTDOWN);
    }
    check_drained(h);
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
    struct conn *c, *next;

    if (h == NULL)
        return;
    h->drained = NULL;
    stop_listening(h);
    for (c = h->conns; c != NULL; c = next) {
        next = c->next;
        conn_close(c); /* detaches a waiting request */
    }
    if (h->inflight != 0)
        fp_log(FP_LOG_WARN, "http: %lu requests still in flight at exit",
               h->inflight);
    while ((c = h->free_list) != NULL) {
        h->free_list = c->next;
        conn_destroy(c);
    }
    while (h->big_free != NULL) {
        char *b = h->big_free;

        memcpy(&h->big_free, b, sizeof(h->big_free));
        free(b);
    }
    fp_accept_guard_free(h->guard);
    fp_coalesce_free(h->co);
    fp_hold_free(h->hold);
    fp_signer_free(h->signer);
    free(h);
}

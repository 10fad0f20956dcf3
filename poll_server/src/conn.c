/* conn.c -- the poll port's connections (conn.h): lifecycle, buffers,
 * read/write/timer events and the per-connection state machine, on
 * libevent's event loop and its public API only (event_assign, common
 * timeouts). See conn.h for how a connection is served. */
#include <assert.h>
#include <errno.h>
#include <limits.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/uio.h>
#include <unistd.h>

#include <event2/event.h>
#include <event2/util.h>

#include "accept.h"
#include "conn.h"
#include "log.h"
#include "settings.h"
#include "stats.h"

#define FREE_CONN_MAX 4096 /* recycled connections kept */
#define OUT_KEEP 65536     /* a slow answer's buffer is kept up to this */
/* Each connection's own input buffer. nginx's requests to a poller are a
 * request line (the URI with its signature), Host and at most one
 * If-None-Match: 100-400 bytes (docs/benchmarks.md, "Hit path"). */
#define IN_SMALL 1024
#define BIG_KEEP 64        /* pooled max_header_size buffers kept */

static void ms_to_tv(unsigned ms, struct timeval *tv)
{
    tv->tv_sec = (time_t)(ms / 1000);
    tv->tv_usec = (suseconds_t)(ms % 1000) * 1000;
}

static void on_read(evutil_socket_t fd, short what, void *arg);
static void on_write(evutil_socket_t fd, short what, void *arg);
static void on_timer(evutil_socket_t fd, short what, void *arg);
static void process(struct conn *c);

/* The legal transitions, from -> to (docs/design.md, "The connection state
 * machine"), made by this file's functions only. An answer is written from
 * READING_HEAD (or READING_BODY, a refusal): a request leaves WAITING_CACHE
 * or HELD for it first (conn_finish), and conn_answer then goes on to the
 * next request, WRITING or LINGERING. A poll with channels is held from its
 * dispatch (READING_HEAD -> HELD). A stream's head goes out from where its
 * answer was found (READING_HEAD, WAITING_CACHE, HELD: conn_stream_start),
 * and it ends by writing what is left (WRITING) or lingering. Every state
 * but FREE may close (FREE). */
#define T(s) (1u << (s))
static const unsigned legal_next[CONN_NSTATES] = {
    [CONN_FREE] = T(CONN_READING_HEAD),
    [CONN_READING_HEAD] = T(CONN_READING_HEAD) | T(CONN_READING_BODY) |
                          T(CONN_WAITING_CACHE) | T(CONN_HELD) |
                          T(CONN_STREAMING) | T(CONN_WRITING) |
                          T(CONN_LINGERING) | T(CONN_FREE),
    [CONN_READING_BODY] = T(CONN_READING_HEAD) | T(CONN_WRITING) |
                          T(CONN_LINGERING) | T(CONN_FREE),
    [CONN_WAITING_CACHE] = T(CONN_HELD) | T(CONN_READING_HEAD) |
                           T(CONN_STREAMING) | T(CONN_FREE),
    [CONN_HELD] = T(CONN_READING_HEAD) | T(CONN_STREAMING) | T(CONN_FREE),
    [CONN_STREAMING] = T(CONN_WRITING) | T(CONN_LINGERING) | T(CONN_FREE),
    [CONN_WRITING] = T(CONN_READING_HEAD) | T(CONN_LINGERING) | T(CONN_FREE),
    [CONN_LINGERING] = T(CONN_FREE),
};
#undef T

int conn_transition_legal(enum conn_state from, enum conn_state to)
{
    return from < CONN_NSTATES && to < CONN_NSTATES &&
           (legal_next[from] & (1u << to)) != 0;
}

static void conn_set_state(struct conn *c, enum conn_state next)
{
    assert(conn_transition_legal(c->state, next));
    c->state = next;
}

static void arm(struct conn *c, const struct timeval *tv)
{
    if (evtimer_add(c->timer, tv) != 0)
        fp_log(FP_LOG_ERROR, "http: cannot arm a connection timer");
}

/* Back to the level-triggered read event (watch_close undone); reading
 * is off after it. */
static void unwatch(struct conn *c)
{
    if (c->rd != CONN_READ_WATCH)
        return;
    c->rd = CONN_READ_OFF;
    if (event_del(c->rev) != 0 ||
        event_assign(c->rev, c->h->base, c->fd, EV_READ | EV_PERSIST, on_read,
                     c) != 0)
        fp_log(FP_LOG_ERROR, "http: cannot reset a connection's read event");
}

static void read_on(struct conn *c)
{
    unwatch(c);
    if (c->rd == CONN_READ_ON)
        return;
    if (event_add(c->rev, NULL) != 0) {
        fp_log(FP_LOG_ERROR, "http: cannot read a connection");
        return;
    }
    c->rd = CONN_READ_ON;
}

static void read_off(struct conn *c)
{
    if (c->rd == CONN_READ_OFF)
        return;
    if (event_del(c->rev) != 0)
        fp_log(FP_LOG_ERROR, "http: cannot stop reading a connection");
    c->rd = CONN_READ_OFF;
}

/* The input is full while the request waits for the cache or is held:
 * pipelined requests must wait their turn unread, but a client that goes
 * away must still be seen (a held poll would keep its slot for its whole
 * wait). The read event turns edge-triggered, so it fires once per change
 * (more bytes, FIN, RST) rather than while bytes wait, and each time the
 * socket is asked whether the peer has gone (peer_gone), reading nothing.
 * conn_answer() undoes it before anything is written (a level-triggered write
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
    c->rd = CONN_READ_WATCH;
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
    struct fp_conns *h = c->h;
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
    struct fp_conns *h = c->h;

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

/* Frees what conn_get made (events possibly NULL, on its failure path). */
static void conn_destroy(struct conn *c)
{
    if (c->rev != NULL)
        event_free(c->rev);
    if (c->wev != NULL)
        event_free(c->wev);
    if (c->timer != NULL)
        event_free(c->timer);
    free(c->small);
    free(c->out);
    free(c);
}

/* A connection for fd, from the free list or new; NULL if out of memory. */
static struct conn *conn_get(struct fp_conns *h, evutil_socket_t fd)
{
    struct conn *c = SLIST_FIRST(&h->free_list);

    if (c != NULL) {
        SLIST_REMOVE_HEAD(&h->free_list, free_link);
        h->nfree--;
    } else {
        if ((c = malloc(h->size)) == NULL)
            return NULL;
        memset(c, 0, h->size);
        c->rev = event_new(h->base, -1, 0, on_read, c);
        c->wev = event_new(h->base, -1, 0, on_write, c);
        c->timer = evtimer_new(h->base, on_timer, c);
        if (c->rev == NULL || c->wev == NULL || c->timer == NULL) {
            conn_destroy(c);
            return NULL;
        }
    }
    /* A stream gave its small buffer back (conn_stream_start). Events not
     * pending (conn_close deleted them) may be reassigned. */
    if ((c->small == NULL && (c->small = malloc(h->in_small)) == NULL) ||
        event_assign(c->rev, h->base, fd, EV_READ | EV_PERSIST, on_read, c) != 0 ||
        event_assign(c->wev, h->base, fd, EV_WRITE | EV_PERSIST, on_write, c) != 0) {
        conn_destroy(c);
        return NULL;
    }
    c->h = h;
    c->fd = fd;
    c->rd = CONN_READ_OFF;
    c->resume = c->counted = 0;
    conn_set_state(c, CONN_READING_HEAD);
    c->in = c->small;
    c->in_cap = h->in_small;
    c->in_off = c->in_len = c->scanned = 0;
    c->out_off = c->out_len = 0;
    c->out_moved = c->slow = 0;
    LIST_INSERT_HEAD(&h->conns, c, link);
    return c;
}

void fp_conns_check_drained(struct fp_conns *h)
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
    fp_conns_check_drained(c->h);
}

void conn_close(struct conn *c)
{
    struct fp_conns *h = c->h;

    if (c->state == CONN_WAITING_CACHE || c->state == CONN_HELD ||
        c->state == CONN_STREAMING)
        h->ops->abandon(c);
    conn_set_state(c, CONN_FREE);
    /* Deleting events that are not pending is a no-op. */
    if (event_del(c->rev) != 0 || event_del(c->wev) != 0 ||
        event_del(c->timer) != 0)
        fp_log(FP_LOG_ERROR, "http: cannot remove a connection's events");
    if (evutil_closesocket(c->fd) != 0)
        fp_log(FP_LOG_DEBUG, "http: close: %s", strerror(errno));
    LIST_REMOVE(c, link);
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
            SLIST_INSERT_HEAD(&h->free_list, c, free_link);
            h->nfree++;
        } else {
            conn_destroy(c);
        }
        if (counted) {
            h->inflight--;
            fp_conns_check_drained(h);
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
    conn_set_state(c, CONN_LINGERING);
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
    conn_set_state(c, CONN_READING_HEAD);
    c->scanned = 0;
    read_on(c);
    arm(c, c->h->next_tv);
    return 0;
}

/* Formats the head of c's answer into buf (response.c). Returns its
 * length, 0 if it does not fit. */
static size_t format_head(struct conn *c, char *buf, size_t cap, int code,
                          size_t len, const struct fp_resp_meta *cached,
                          int stream)
{
    struct fp_resp r;

    r.code = code;
    r.minor = c->minor;
    r.close = !c->keep_alive || c->h->draining;
    r.len = len;
    r.from_cache = cached != NULL;
    r.content_type = c->h->s->content_type;
    r.has_tag = cached != NULL && cached->has_tag;
    r.tag = cached != NULL ? cached->tag : 0;
    r.pace_ms = cached != NULL ? cached->pace_ms : 0;
    r.date = fp_resp_date_now(&c->h->date, c->h->base);
    r.stream = stream;
    return fp_resp_format(buf, cap, &r);
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

int conn_answer(struct conn *c, int code, const char *body, size_t len,
                const struct fp_resp_meta *cached)
{
    char head[1024];
    struct iovec iov[2];
    size_t hlen, blen = c->head_only ? 0 : len;
    ssize_t n;

    unwatch(c);
    if ((hlen = format_head(c, head, sizeof(head), code, len, cached, 0)) == 0) {
        /* Never with a content_type of at most 255 bytes (config.c). */
        fp_log(FP_LOG_ERROR, "http: an answer's head does not fit");
        c->keep_alive = 0;
        hlen = format_head(c, head, sizeof(head), 503, 0, NULL, 0);
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
    conn_set_state(c, CONN_WRITING);
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
    (void)conn_answer(c, code, NULL, 0, NULL);
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
    c->out_moved = 1;
    if (c->out_off < c->out_len)
        return;
    c->out_off = c->out_len = 0;
    if (event_del(c->wev) != 0)
        fp_log(FP_LOG_ERROR, "http: cannot stop writing a connection");
    if (c->state == CONN_STREAMING)
        return; /* caught up: the next event is written at once */
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

void conn_wait(struct conn *c)
{
    conn_set_state(c, CONN_WAITING_CACHE);
}

int conn_hold(struct conn *c, unsigned wait_ms)
{
    struct timeval tv;

    ms_to_tv(wait_ms, &tv);
    if (evtimer_add(c->timer, &tv) != 0)
        return -1;
    conn_set_state(c, CONN_HELD);
    return 0;
}

void conn_finish(struct conn *c, int code, const char *body, size_t len,
                 const struct fp_resp_meta *cached)
{
    assert(c->state == CONN_WAITING_CACHE || c->state == CONN_HELD);
    conn_set_state(c, CONN_READING_HEAD);
    if (conn_answer(c, code, body, len, cached) == 0)
        resume_later(c);
}

/* Appends iov[from..n), less the first `skip` bytes, to the output
 * buffer, if the buffer stays within max. -1 if it would not, or out of
 * memory. */
static int out_append(struct conn *c, const struct iovec *iov, int n,
                      size_t skip, size_t max)
{
    size_t need = c->out_len - c->out_off;
    int i;

    for (i = 0; i < n; i++)
        need += iov[i].iov_len;
    need -= skip;
    if (need > max)
        return -1;
    if (c->out_off > 0) {
        memmove(c->out, c->out + c->out_off, c->out_len - c->out_off);
        c->out_len -= c->out_off;
        c->out_off = 0;
    }
    if (need > c->out_cap) {
        char *p = realloc(c->out, need);

        if (p == NULL)
            return -1;
        c->out = p;
        c->out_cap = need;
    }
    for (i = 0; i < n; i++) {
        size_t l = iov[i].iov_len;
        const char *b = iov[i].iov_base;

        if (skip >= l) {
            skip -= l;
            continue;
        }
        memcpy(c->out + c->out_len, b + skip, l - skip);
        c->out_len += l - skip;
        skip = 0;
    }
    return 0;
}

int conn_stream_send(struct conn *c, const struct iovec *iov, int n)
{
    size_t total = 0;
    ssize_t w = 0;
    int i;

    assert(c->state == CONN_STREAMING);
    for (i = 0; i < n; i++)
        total += iov[i].iov_len;
    if (c->out_len == c->out_off) {
        /* One piece (most events): send(), shorter in the kernel than
         * writev's file path. */
        do
            w = n == 1 ? send(c->fd, iov[0].iov_base, iov[0].iov_len, MSG_NOSIGNAL)
                       : writev(c->fd, iov, n);
        while (w < 0 && errno == EINTR);
        if (w < 0 && errno != EAGAIN && errno != EWOULDBLOCK) {
            fp_log(FP_LOG_DEBUG, "http: write: %s", strerror(errno));
            conn_close(c);
            return -1;
        }
        if (w < 0)
            w = 0;
        if ((size_t)w == total)
            return 0;
        if (event_add(c->wev, NULL) != 0) {
            fp_log(FP_LOG_ERROR, "http: cannot wait to write a stream");
            conn_close(c);
            return -1;
        }
    }
    /* Behind: the rest waits, within the bound. */
    if (out_append(c, iov, n, (size_t)w, c->h->s->stream_max_buffered) != 0) {
        fp_log(FP_LOG_DEBUG, "http: a stream's reader left more than %zu "
               "bytes unread, closing", c->h->s->stream_max_buffered);
        c->slow = 1;
        conn_close(c);
        return -1;
    }
    return 0;
}

int conn_stream_start(struct conn *c, const struct iovec *data, int n,
                      unsigned tick_ms)
{
    char head[512];
    struct iovec iov[1 + CONN_STREAM_IOV];
    size_t hlen;
    struct timeval tv;

    assert(c->state == CONN_READING_HEAD || c->state == CONN_WAITING_CACHE ||
           c->state == CONN_HELD);
    assert(n >= 0 && n <= CONN_STREAM_IOV);
    c->keep_alive = 0; /* the body ends with the connection */
    if ((hlen = format_head(c, head, sizeof(head), 200, 0, NULL, 1)) == 0) {
        conn_close(c);
        return -1;
    }
    /* A stream lives long: the kernel's share of what its reader leaves
     * unread is bounded as ours is (autotuning would let it grow to
     * tcp_wmem's maximum, megabytes per stream). */
    {
        int sndbuf = c->h->s->stream_max_buffered > INT_MAX / 2
                         ? INT_MAX / 2 : (int)c->h->s->stream_max_buffered;

        if (setsockopt(c->fd, SOL_SOCKET, SO_SNDBUF, &sndbuf, sizeof(sndbuf)) != 0)
            fp_log(FP_LOG_DEBUG, "http: SO_SNDBUF: %s", strerror(errno));
    }
    conn_set_state(c, CONN_STREAMING);
    /* Pipelined requests are not served after a stream: dropped. Nothing
     * more is read into its buffer (discard()): a held stream keeps none. */
    in_shrink(c);
    free(c->small);
    c->small = c->in = NULL;
    c->in_cap = 0;
    read_on(c);
    c->out_moved = 0;
    ms_to_tv(tick_ms, &tv);
    if (c->rd != CONN_READ_ON || evtimer_add(c->timer, &tv) != 0) {
        fp_log(FP_LOG_ERROR, "http: cannot start a stream's events");
        conn_close(c);
        return -1;
    }
    iov[0].iov_base = head;
    iov[0].iov_len = hlen;
    memcpy(iov + 1, data, (size_t)n * sizeof(*data));
    return conn_stream_send(c, iov, 1 + n);
}

void conn_stream_tick(struct conn *c, unsigned ms)
{
    struct timeval tv;

    ms_to_tv(ms, &tv);
    arm(c, &tv);
}

void conn_stream_end(struct conn *c)
{
    assert(c->state == CONN_STREAMING);
    if (c->out_len > c->out_off) {
        /* on_write ends it once the rest is out (answered(): linger). */
        conn_set_state(c, CONN_WRITING);
        arm(c, c->h->request_tv);
        return;
    }
    request_done(c);
    linger(c);
}

/* The head buf[0..len) of a request is in: its framing, then the request
 * layer's start(). Returns 0, or the status to refuse it with. */
static int start(struct conn *c, const char *buf, size_t len)
{
    struct fp_http_head hd;
    int st;

    c->minor = 1;
    if ((st = fp_http_parse_head(buf, len, &hd)) != 0)
        return st;
    c->minor = hd.minor;
    c->keep_alive = hd.keep_alive;
    c->head_only = hd.method == FP_HM_HEAD;
    c->chunked = hd.chunked;
    c->body_left = hd.has_length ? hd.content_length : 0;
    c->too_large = hd.has_length &&
                   hd.content_length > c->h->s->max_body_size;
    if (c->chunked)
        fp_chunked_init(&c->ch);
    return c->h->ops->start(c, &hd);
}

/* Parses and serves what the input holds, request after request, until it
 * runs out, a request waits, or the connection ends. */
static void process(struct conn *c)
{
    struct fp_conns *h = c->h;

    while (c->state == CONN_READING_HEAD || c->state == CONN_READING_BODY) {
        const char *p = c->in + c->in_off;
        size_t avail = c->in_len - c->in_off, end;
        int done, st;

        if (avail == 0) {
            in_shrink(c);
            return;
        }
        if (c->state == CONN_READING_HEAD) {
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
            st = start(c, p, end);
            c->in_off += end;
            if (st != 0) {
                refuse(c, st);
                return;
            }
            if (c->chunked || c->body_left > 0) {
                conn_set_state(c, CONN_READING_BODY);
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
        conn_set_state(c, CONN_READING_HEAD);
        if (h->ops->dispatch(c) != 0)
            return;
    }
}

/* One read into buf: the bytes read, 0 if none yet, or -1 when the client
 * is gone (EOF or an error, whatever it had sent): c is closed. */
static ssize_t read_in(struct conn *c, evutil_socket_t fd, char *buf, size_t cap)
{
    ssize_t n = read(fd, buf, cap);

    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
        return 0;
    if (n <= 0) {
        if (n < 0)
            fp_log(FP_LOG_DEBUG, "http: read: %s", strerror(errno));
        conn_close(c);
        return -1;
    }
    return n;
}

/* Nothing more is served on a lingering or streaming connection: what its
 * client sends is read and dropped, to see it go. */
static void discard(struct conn *c, evutil_socket_t fd)
{
    char scratch[512];

    (void)read_in(c, fd, scratch, sizeof(scratch));
}

static void on_read(evutil_socket_t fd, short what, void *arg)
{
    struct conn *c = arg;
    struct fp_conns *h = c->h;
    ssize_t n;

    (void)what;
    if (c->state == CONN_LINGERING || c->state == CONN_STREAMING) {
        discard(c, fd);
        return;
    }
    if (c->rd == CONN_READ_WATCH) {
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
        if (c->state != CONN_READING_HEAD || c->in_cap == h->in_max) {
            /* Full while a request waits or is written: read again once it
             * is answered (answered() turns reading back on). */
            if (c->state == CONN_WAITING_CACHE || c->state == CONN_HELD)
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
    if ((n = read_in(c, fd, c->in + c->in_len, c->in_cap - c->in_len)) <= 0)
        return;
    c->in_len += (size_t)n;
    process(c);
}

static void on_timer(evutil_socket_t fd, short what, void *arg)
{
    struct conn *c = arg;

    (void)fd;
    (void)what;
    switch (c->state) {
    case CONN_WAITING_CACHE:
        return; /* the cache's timeout bounds it; re-armed once answered */
    case CONN_HELD:
        c->h->ops->hold_expired(c);
        return;
    case CONN_STREAMING:
        if (c->out_len > c->out_off && !c->out_moved) {
            fp_log(FP_LOG_DEBUG, "http: a stream's reader took nothing "
                   "since the last tick, closing");
            c->slow = 1;
            break;
        }
        c->out_moved = 0;
        c->h->ops->stream_tick(c);
        return;
    case CONN_READING_HEAD:
    case CONN_READING_BODY:
        /* Not in within the limit: closed, with no answer. */
        fp_log(FP_LOG_DEBUG, "http: request not received within the limit, "
               "closing the connection");
        break;
    case CONN_WRITING:
        fp_log(FP_LOG_DEBUG, "http: answer not written within the limit, "
               "closing the connection");
        break;
    case CONN_LINGERING:
    case CONN_FREE:
    case CONN_NSTATES:
    default:
        break;
    }
    conn_close(c);
}

void fp_conns_accepted(struct fp_conns *h, evutil_socket_t fd,
                       const struct sockaddr *sa)
{
    struct conn *c;

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
    if (c->rd != CONN_READ_ON)
        conn_close(c);
}

void conn_request_counted(struct conn *c)
{
    c->counted = 1;
    c->h->inflight++;
}

int fp_conns_init(struct fp_conns *h, struct event_base *base,
                  const struct fp_settings *s, const struct fp_conn_ops *ops,
                  struct fp_accept_guard *guard)
{
    struct timeval req, idle, next;

    h->base = base;
    h->s = s;
    h->ops = ops;
    h->guard = guard;
    h->size = ops->size;
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
        return -1;
    }
    return 0;
}

void fp_conns_drain(struct fp_conns *h, void (*done)(void *arg), void *arg)
{
    h->draining = 1;
    h->drained = done;
    h->drained_arg = arg;
}

void fp_conns_free(struct fp_conns *h)
{
    struct conn *c, *next;

    h->drained = NULL;
    for (c = LIST_FIRST(&h->conns); c != NULL; c = next) {
        next = LIST_NEXT(c, link);
        conn_close(c); /* detaches a waiting request */
    }
    if (h->inflight != 0)
        fp_log(FP_LOG_WARN, "http: %lu requests still in flight at exit",
               h->inflight);
    while ((c = SLIST_FIRST(&h->free_list)) != NULL) {
        SLIST_REMOVE_HEAD(&h->free_list, free_link);
        conn_destroy(c);
    }
    while (h->big_free != NULL) {
        char *b = h->big_free;

        memcpy(&h->big_free, b, sizeof(h->big_free));
        free(b);
    }
}

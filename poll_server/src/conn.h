/* conn.h -- the poll port's connections: their lifecycle, input and output
 * buffers, read/write/timer events and state (conn.c). The request layer
 * above (http.c, longpoll.c, chpoll.c; its fields: request.h) decides what
 * to answer; this layer reads the requests in, writes the answers out and
 * closes, and knows of a waiting request only that it waits.
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
 * - An answer is one writev of the head (formatted into a stack buffer by
 *   response.c) and the value, straight from the cache's buffer.
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
#ifndef FP_CONN_H
#define FP_CONN_H

#include <stddef.h>
#include <sys/queue.h>

#include <event2/util.h>

#include "httpparse.h"
#include "response.h"

struct event;
struct event_base;
struct iovec;
struct sockaddr;
struct fp_accept_guard;
struct fp_settings;
struct fp_conns;

/* A connection's state (conn.c's table has the legal transitions, made by
 * conn.c's functions only; see docs/design.md, "The connection state
 * machine"). */
enum conn_state {
    CONN_FREE,          /* not serving: new, or on the free list */
    CONN_READING_HEAD,  /* reading a request head (or between requests) */
    CONN_READING_BODY,  /* reading (and discarding) its body */
    CONN_WAITING_CACHE, /* the request waits for the cache (conn_wait) */
    CONN_HELD,          /* a long poll waits for its answer to change, its
                         * timer the wait (conn_hold) */
    CONN_STREAMING,     /* an event stream: its head is out, events go
                         * out as they come, its timer the heartbeat
                         * (conn_stream_start) */
    CONN_WRITING,       /* the rest of an answer waits for the socket */
    CONN_LINGERING,     /* answered, closing: input is dropped until EOF */
    CONN_NSTATES
};

/* What the read event does (conn.c: read_on, read_off, watch_close). */
enum conn_read {
    CONN_READ_OFF,      /* not added: input waits in the socket */
    CONN_READ_ON,       /* level-triggered: input is read as it comes */
    CONN_READ_WATCH     /* edge-triggered, nothing read: only the client's
                         * close is watched (the input is full while a
                         * request waits or is held) */
};

/* The request layer's object (fp_conn_ops.size bytes) starts with it: see
 * request.h. */
struct conn {
    struct fp_conns *h;
    union {                         /* on one list at a time */
        LIST_ENTRY(conn) link;      /* open connections */
        SLIST_ENTRY(conn) free_link; /* the free list */
    };
    evutil_socket_t fd;
    struct event *rev, *wev, *timer;
    enum conn_state state;          /* changed in conn.c only */
    enum conn_read rd;
    int resume;                     /* rev was activated to parse, not read */
    int counted;                    /* the request is in h->inflight (from
                                     * dispatch to its answer written) */
    /* The framing of the request being read or answered, from its head. */
    int head_only, keep_alive, minor, chunked, too_large;
    unsigned long long body_left;   /* Content-Length bytes to read */
    struct fp_chunked ch;
    /* Input: in[in_off, in_len) not parsed yet; `scanned` bytes of it were
     * searched for the end of a head already. `in` is `small` (in_cap:
     * h->in_small; NULL once streaming: a stream reads nothing more, and
     * this buffer was 1 KB of the 3.4 a held stream cost) or, while a long head
     * is read, a pooled buffer of h->in_max bytes. */
    char *in, *small;
    size_t in_cap, in_off, in_len, scanned;
    /* What the socket did not take of an answer (the slow path). */
    char *out;
    size_t out_off, out_len, out_cap;
    int out_moved;                  /* STREAMING: the socket took some of
                                     * out since the last tick */
    int slow;                       /* ... closed: its reader was too slow */
};

/* The request layer's part, called from this one. */
struct fp_conn_ops {
    /* Bytes of the request layer's object, a struct conn first. */
    size_t size;
    /* The head of a request is in, parsed (its framing in c): decide the
     * answer (before the body, which is dropped: the head's bytes may go
     * with it). Returns 0, or the status to refuse the request with. */
    int (*start)(struct conn *c, const struct fp_http_head *hd);
    /* The request is in (head and body): answer it, or ask the cache.
     * Returns 0 if the connection goes on with its next request, 1 if not. */
    int (*dispatch)(struct conn *c);
    /* A held poll's wait is over (its timer fired). */
    void (*hold_expired)(struct conn *c);
    /* A stream's timer fired: its heartbeat, or the end of its life. */
    void (*stream_tick)(struct conn *c);
    /* The connection closes while its request waits or is held: let go of
     * what the request holds (c->state says which). */
    void (*abandon)(struct conn *c);
};

LIST_HEAD(fp_conn_list, conn);
SLIST_HEAD(fp_conn_free, conn);

/* Every connection of the poll port, with their pools and timers. */
struct fp_conns {
    struct event_base *base;
    const struct fp_settings *s;
    const struct fp_conn_ops *ops;
    struct fp_accept_guard *guard; /* told when a descriptor is free */
    size_t size;                /* a connection's object (ops->size) */
    struct fp_conn_list conns;  /* open */
    struct fp_conn_free free_list;
    size_t nfree;
    size_t in_small, in_max;    /* input buffer sizes (see struct conn) */
    char *big_free;             /* pooled in_max buffers, linked through */
    size_t nbig;                /* ... their first bytes; how many */
    unsigned long inflight;     /* requests in flight */
    int draining;               /* every answer says Connection: close */
    void (*drained)(void *arg);
    void *drained_arg;
    /* Common timeouts (event_base_init_common_timeout): O(1) timers. */
    const struct timeval *request_tv, *next_tv;
    struct fp_resp_date date;
};

/* Sets up cs (zeroed by the caller) on base. 0, or -1 (logged). */
int fp_conns_init(struct fp_conns *cs, struct event_base *base,
                  const struct fp_settings *s, const struct fp_conn_ops *ops,
                  struct fp_accept_guard *guard);

/* A connection was accepted on fd: serve it (or close fd). */
void fp_conns_accepted(struct fp_conns *cs, evutil_socket_t fd,
                       const struct sockaddr *sa);

/* From now on every answer says Connection: close; done(arg) is called
 * once no request is in flight (see fp_conns_check_drained). */
void fp_conns_drain(struct fp_conns *cs, void (*done)(void *arg), void *arg);

/* Calls the drain's done() if no request is in flight any more. */
void fp_conns_check_drained(struct fp_conns *cs);

/* Closes every connection and frees the pools. */
void fp_conns_free(struct fp_conns *cs);

/* Is from -> to one of the legal transitions (conn.c's table)? */
int conn_transition_legal(enum conn_state from, enum conn_state to);

/* The request is counted in flight until it is answered. */
void conn_request_counted(struct conn *c);

/* Writes an answer from READING_HEAD or READING_BODY: one writev of the
 * head and the body; cached, if not NULL, is what an answer from the cache
 * says of itself. Returns 0 if the connection goes on with its next
 * request, 1 if not (the answer is still being written, or the connection
 * lingers or is gone). */
int conn_answer(struct conn *c, int code, const char *body, size_t len,
                const struct fp_resp_meta *cached);

/* The request waits for the cache: READING_HEAD -> WAITING_CACHE. */
void conn_wait(struct conn *c);

/* The request is held for up to wait_ms (the connection's timer, then
 * fp_conn_ops.hold_expired): READING_HEAD or WAITING_CACHE -> HELD. 0, or
 * -1 if the timer cannot be armed (nothing changed). */
int conn_hold(struct conn *c, unsigned wait_ms);

/* A waiting or held request is answered (as conn_answer): it leaves its
 * state, and the requests pipelined after it are parsed from the loop, not
 * from inside the delivery (the coalescer's or hold.c's). */
void conn_finish(struct conn *c, int code, const char *body, size_t len,
                 const struct fp_resp_meta *cached);

/* The request is answered with an event stream (docs/api.md, "Event
 * streams"): the stream's head and data[0..n) go out, and the
 * connection is STREAMING until conn_stream_end or its close (input is
 * read and dropped; the client's close is seen). Its timer fires every
 * tick_ms (fp_conn_ops.stream_tick, which re-arms it with conn_stream_tick).
 * From READING_HEAD, WAITING_CACHE or HELD. Returns 0, or -1 if the
 * connection is gone (closed: the caller let go of what it held first). */
#define CONN_STREAM_IOV 3 /* pieces of a stream's first bytes at most */
int conn_stream_start(struct conn *c, const struct iovec *data, int n,
                      unsigned tick_ms);

/* Writes iov[0..n) to a STREAMING connection. What the socket does not
 * take waits in the output buffer, [stream] max_buffered bytes at most:
 * past that, or when a tick finds it has not moved since the last one,
 * the reader is too slow and the connection is closed. Returns 0, or -1 if
 * it is gone (fp_conn_ops.abandon was called). */
int conn_stream_send(struct conn *c, const struct iovec *iov, int n);

/* Re-arms a STREAMING connection's timer. */
void conn_stream_tick(struct conn *c, unsigned ms);

/* Ends a stream (the request layer let go of it): what is buffered is
 * written, then the connection closes as after any answer that ends it. */
void conn_stream_end(struct conn *c);

/* Closes the connection and recycles it. c is gone after this. */
void conn_close(struct conn *c);

#endif

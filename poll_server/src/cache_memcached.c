/* cache_memcached.c -- memcached backend.
 *
 * libmemcached is used only to pick the server for a key (ketama, exactly as
 * pylibmc does with behaviors={"ketama": True}), because its own I/O blocks.
 * The I/O is ours and never blocks: one TCP connection per server, gets
 * pipelined, answers matched to a FIFO of outstanding requests by a
 * streaming parser. Each connection first sends "mn": memcached >= 1.6
 * answers "MN", and gets then go out as meta commands ("mg <key> v k f",
 * answered "VA <len> k<key> f<flags>" + data, or "EN"), whose pipelined answers
 * memcached sends in one write; an older server answers "ERROR", and gets
 * go out as classic "get <key>" ("VALUE ..." + data + "END", or "END").
 *
 * Syscalls per request are the cost that matters here, so the socket is
 * driven by hand rather than through a bufferevent (which waits a loop turn
 * for EV_WRITE before every write, toggles it with epoll_ctl, and asks
 * FIONREAD before every read):
 * - gets go out in batches, at most MC_BATCHES_IN_FLIGHT (one) awaiting
 *   its answers per connection. A get queued while none is in flight goes
 *   out at the end of its loop turn, with every get queued in that turn, in
 *   one send() made by a flush event (no added wait when idle). A get
 *   queued while one is in flight is held in the output buffer; when that
 *   batch's answers are all read, or one of them times out, or the
 *   connection fails, everything held goes out as the next batch. So a
 *   batch holds what arrived during one round trip: it grows with load
 *   (arrival rate x round trip), and memcached reads and writes once per
 *   batch. The held gets count in MC_MAX_PENDING and MC_OUT_MAX like the
 *   sent ones: a full queue fails the get fast. EV_WRITE is registered
 *   only while the kernel refuses more (EAGAIN) or connecting;
 * - the read event stays registered (EV_PERSIST) for the connection's life,
 *   and reads go into our own bounded buffer, parsed in place: a value is
 *   handed to the callback straight from that buffer.
 *
 * Failure policy, per server, so a sick node only hurts its own keys: the
 * model of health.h, shared with the Redis backend.
 * - refused / reset / EOF: pending requests get ERROR, the connection is
 *   dropped and retried (at once if it had been answering, then with the
 *   backoff); requests arriving while it is down fail fast with ERROR.
 * - garbage or an ERROR line: the stream cannot be trusted; as above, but
 *   the retry always waits the backoff.
 * - a value over MC_MAX_VALUE is read past (never buffered) and its request
 *   alone gets ERROR; CLIENT_ERROR / SERVER_ERROR fail their request alone.
 *   The connection stays.
 * - a request not answered within cache_timeout_ms: TIMEOUT alone, unless
 *   the server has been silent long enough to be hung (health.h); a late
 *   request's node is checked again when that silence would be reached.
 *
 * Replicas ([memcached] replicas = 1; docs/design.md, "Replicas"):
 * the app writes every key to its ketama node and to the node ketama picks
 * over the other servers. A get goes to the primary; when the primary is
 * down, back from a hang but silent, recovering, or the get fails (ERROR,
 * TIMEOUT), the same request is sent once to the replica with a deadline
 * of its own. A miss on the primary is a miss.
 *
 * Recovery ([memcached] recovery_ms; docs/design.md, "A node back from a
 * failure"): a node that comes back after being down or hung may hold
 * answers older than publishes acknowledged meanwhile (the app's write
 * failed; its outbox rewrites the key within about a second). For
 * recovery_ms it serves no hit: with replicas its keys are read through
 * their replicas, and it is no replica; without one (a single node, make
 * up's default) the get fails (ERROR: a 503, and nginx asks the app, which
 * answers from the database). A get that was queued on it before and is
 * answered inside the window counts the same. Every idle node is probed
 * every MC_PROBE_MS, so a hang is seen by every poll server, busy or not.
 *
 * The decisions of both (which node takes a get, the recovery window, the
 * replica instead of the primary, a failed read retried on the replica)
 * are node_health.c's; server_serves() is the one test of a node here.
 */
#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 200809L /* getaddrinfo under -std=c11 */
#endif
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/queue.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <event2/event.h>
#include <libmemcached/memcached.h>

#include "cache_memcached.h"
#include "health.h"
#include "link.h"
#include "node_health.h"
#include "log.h"
#include "mcproto.h"
#include "resolve.h"
#include "settings.h"
#include "stats.h"

#define MC_MAX_VALUE      (1024UL * 1024UL) /* larger: skipped, ERROR */
#define MC_SKIP_LOG_MS    10000         /* one warning per server per 10 s */
#define MC_MAX_PENDING    10000         /* per server, beyond: fail fast */
#define MC_LEN(lit)       (sizeof(lit) - 1)
#define MC_MN             "mn\r\n"
#define MC_CMD_MAX        (MC_LEN("mg ") + FP_MAX_KEY_LEN + MC_LEN(" v k f\r\n")) /* mc_get_cmd[1] */
#define MC_IN_MIN         ((size_t)64 * 1024) /* read buffer kept per connection */
#define MC_IN_MAX         (MC_MAX_VALUE + 7 + MC_IN_MIN) /* a whole answer */
#define MC_READ_MIN       4096          /* room asked for before each recv */
#define MC_OUT_MIN        4096
#define MC_OUT_KEEP       ((size_t)64 * 1024) /* more is given back once sent */
#define MC_OUT_MAX        ((size_t)MC_MAX_PENDING * MC_CMD_MAX)
#define MC_READS_PER_CB   8             /* reads per event when they fill up */
#define MC_FREE_REQ_MAX   4096          /* recycled request objects kept */
/* Batches awaiting their answers per connection; gets queued meanwhile are
 * held and go out together when one is over. One: a batch then carries
 * everything that arrived during the previous round trip, so its size
 * follows load and each round trip costs memcached one read and one write
 * however many gets it holds. Measured with wrk on 2 cores (nginx, poll
 * servers and 3 memcached on one host, 7 interleaved rounds): one and two
 * in flight served the same req/s within the run's noise (+-25%), at c50
 * and c1,000, on 100,000 keys and on one; a batch per loop turn carried
 * 4.0 and 3.6 keys at c50 and c1,000, one in flight 5.0 and 5.5, two 5.0
 * and 5.1. */
#define MC_BATCHES_IN_FLIGHT 1
/* An idle node is asked this often: a hang longer than this plus
 * [cache] timeout_ms is seen, traffic or not (an app write times out after
 * 1 s: a shorter hang loses no acknowledged write). */
#define MC_PROBE_MS       500
#define MC_PROBE_KEY      "fastpoll:probe" /* a key no one writes */

enum mc_conn_state { MC_DOWN, MC_CONNECTING, MC_UP };
/* What a connection speaks, learnt from its answer to "mn" (meta no-op):
 * "MN" from memcached >= 1.6 (meta commands), "ERROR" from older ones. */
enum mc_proto { MC_PROTO_PROBING, MC_PROTO_CLASSIC, MC_PROTO_META };

struct fp_mc;
struct mc_server;

struct mc_req {
    TAILQ_ENTRY(mc_req) link;
    struct fp_mc *mc;
    struct mc_server *srv;    /* NULL while on mc->failq */
    struct event *timer;      /* deadline, or the deferred failure; kept
                               * with the object when it is recycled */
    struct mc_req *free_next;
    fp_cache_cb *cb;
    void *arg;
    size_t srv_index;         /* for the stats; SIZE_MAX: no server chosen */
    int failover;             /* a primary read: on ERROR/TIMEOUT, ask the
                               * key's replica before calling back */
    uint64_t sent;            /* fp_stat_now() when queued, 0 if never */
    int late;                 /* got TIMEOUT already; its answer is dropped */
    uint64_t batch;           /* its batch's number (struct mc_server) */
    int meta;                 /* sent as "mg" (else as classic "get") */
    int probe;                /* server_probe_cb's: "mn" on a meta
                               * connection (no get counted), else a get */
    size_t keylen;
    char key[FP_MAX_KEY_LEN];
};

TAILQ_HEAD(mc_reqq, mc_req);

/* Bytes data[off..len) are pending; cap bytes are allocated. */
struct mc_buf {
    char *data;
    size_t off, len, cap;
};

struct mc_server {
    struct fp_mc *mc;
    char name[300];                 /* host:port, for the log */
    struct sockaddr_storage addr;
    socklen_t addrlen;
    evutil_socket_t fd;             /* -1 when down */
    struct event *rev;              /* EV_READ|EV_PERSIST, while fd is open */
    struct event *wev;              /* EV_WRITE|EV_PERSIST, added only while
                                     * connecting or the kernel says EAGAIN */
    struct event *flush;            /* no fd: made active by the first get of
                                     * a loop turn, writes them all at once */
    int wev_added, flush_active;
    struct mc_buf in, out;
    /* Batches (the top of the file). A get queued while
     * MC_BATCHES_IN_FLIGHT batches await their answers is held: its
     * command is among the last `held` bytes of `out`, which no write
     * sends until they become the next batch (server_release). Batch
     * numbers grow by one per batch sent; batch_first > batch_seq: none in
     * flight. */
    size_t held, nheld, nheld_keys;   /* bytes, gets, gets not probes */
    uint64_t batch_seq;             /* the last batch sent; held gets are
                                     * the next one */
    uint64_t batch_first;           /* the oldest batch in flight */
    size_t batch_left[MC_BATCHES_IN_FLIGHT]; /* batch b's unanswered gets,
                                     * at [b % MC_BATCHES_IN_FLIGHT] */
    unsigned gen;                   /* bumped by every reset */
    enum mc_conn_state state;
    struct fp_link link;            /* up/down log, backoff, retry, hang check */
    struct mc_reqq pending;         /* sent, in answer order */
    size_t npending;
    struct fp_mcp mcp;              /* the answers' parse state */
    uint64_t skip_logged_ms;        /* rate limit of the warning */
    enum mc_proto proto;            /* of this connection */
    enum mc_proto logged_proto;
    struct fp_node_recovery recovery; /* its window (node_health.h): its
                                       * keys are read through replicas */
    struct event *probe;            /* asks it when idle */
};

struct fp_mc {
    struct event_base *base;
    memcached_st *memc;
    const struct timeval *timeout;  /* common timeout of cache_timeout_ms */
    struct timeval timeout_tv;
    unsigned timeout_ms;
    struct mc_server *servers;
    size_t nservers;
    memcached_st **excl;            /* [i]: ketama over every server but i
                                     * (the replica of i's keys); or NULL */
    size_t nexcl;                   /* entries of excl */
    int replicas;                   /* [memcached] replicas */
    unsigned recovery_ms;
    struct mc_reqq failq;           /* failed fast, callback not yet run */
    struct mc_req *free_reqs;       /* recycled, each with its timer */
    size_t nfree_reqs;
    int closing;
};

static void server_connect(struct mc_server *s);

static int req_failover(struct mc_req *r);
static int server_recovering(struct mc_server *s);

static void req_release(struct fp_mc *mc, struct mc_req *r)
{
    if (mc->nfree_reqs < MC_FREE_REQ_MAX && !mc->closing) {
        r->free_next = mc->free_reqs;
        mc->free_reqs = r;
        mc->nfree_reqs++;
    } else {
        event_free(r->timer);
        free(r);
    }
}

/* Runs the callback exactly once and recycles the request. The caller has
 * already unlinked it from its queue. */
static void req_finish(struct mc_req *r, enum fp_cache_status st,
                       const char *val, size_t len)
{
    fp_cache_cb *cb = r->cb;
    void *arg = r->arg;
    int late = r->late;

    if (!late) /* a late one was counted, and called back, at its TIMEOUT */
        fp_stat_backend_done(r->srv_index, st, r->sent);
    (void)event_del(r->timer);
    if (!late && fp_node_fails_over(st, r->failover) && req_failover(r) == 0)
        late = 1; /* the replica's get calls back instead */
    req_release(r->mc, r);
    if (!late)
        cb(st, val, len, arg);
}

/* Room for n more bytes after data[len], moving pending bytes to the front
 * or growing (doubling, at most max). Returns 0 or -1. */
static int buf_reserve(struct mc_buf *b, size_t n, size_t min, size_t max)
{
    size_t pending = b->len - b->off, cap;
    char *p;

    if (b->cap - b->len >= n)
        return 0;
    if (b->off > 0) {
        memmove(b->data, b->data + b->off, pending);
        b->off = 0;
        b->len = pending;
        if (b->cap - b->len >= n)
            return 0;
    }
    if (n > max - pending)
        return -1;
    cap = b->cap ? b->cap : min;
    while (cap - pending < n)
        cap = cap > max / 2 ? max : cap * 2;
    if ((p = realloc(b->data, cap)) == NULL)
        return -1;
    b->data = p;
    b->cap = cap;
    return 0;
}

/* Empties the buffer; one that grew past min is given back. */
static void buf_reset(struct mc_buf *b, size_t min)
{
    b->off = b->len = 0;
    if (b->cap > min) {
        free(b->data);
        b->data = NULL;
        b->cap = 0;
    }
}

/* ---- batches: at most MC_BATCHES_IN_FLIGHT per connection ------------- */

static size_t server_flights(const struct mc_server *s)
{
    return (size_t)(s->batch_seq + 1 - s->batch_first);
}

/* Batch b's unanswered gets (b is in flight). */
static size_t *server_batch_left(struct mc_server *s, uint64_t b)
{
    /* cppcheck-suppress moduloofone ; MC_BATCHES_IN_FLIGHT may be raised */
    return &s->batch_left[b % MC_BATCHES_IN_FLIGHT];
}

/* The held gets go out at the end of this loop turn, with every get the
 * callbacks still to run in it queue, if a batch may be sent. */
static void server_flush_soon(struct mc_server *s)
{
    if (s->state != MC_UP || s->nheld == 0 || s->flush_active ||
        server_flights(s) >= MC_BATCHES_IN_FLIGHT)
        return;
    event_active(s->flush, EV_TIMEOUT, 1);
    s->flush_active = 1;
}

/* The held gets become the next batch, in flight: their bytes join what
 * server_write sends. The caller checked that a batch may be sent. */
static void server_release(struct mc_server *s)
{
    if (s->nheld == 0)
        return;
    s->batch_seq++;
    *server_batch_left(s, s->batch_seq) = s->nheld;
    if (s->nheld_keys > 0)
        fp_stat_backend_batch((size_t)(s - s->mc->servers), s->nheld_keys);
    s->held = s->nheld = s->nheld_keys = 0;
}

/* Batch b is over: its answers are all read, or one of them timed out
 * (the others are read, or dropped, as they come). The older ones are
 * over too: answers come in order, deadlines expire in order. */
static void server_batch_over(struct mc_server *s, uint64_t b)
{
    if (b < s->batch_first || b > s->batch_seq)
        return;
    s->batch_first = b + 1;
    server_flush_soon(s);
}

/* Nothing in flight, nothing held: a reset, or a new connection. */
static void server_batches_clear(struct mc_server *s)
{
    s->held = s->nheld = s->nheld_keys = 0;
    s->batch_first = s->batch_seq + 1;
}

static void server_log_up(struct mc_server *s)
{
    struct fp_mc *mc = s->mc;
    char note[160];

    if (fp_node_back(&s->recovery, fp_link_was_down(&s->link),
                     mc->recovery_ms)) {
        /* Back from down or hung: it may hold answers older than publishes
         * made meanwhile, until the app's outbox rewrites them. */
        fp_stat_backend_recovering((size_t)(s - mc->servers),
                                   s->recovery.until_ms);
        (void)snprintf(note, sizeof(note), "; no hit is served from it for "
                       "%u ms (recovery_ms): %s", mc->recovery_ms,
                       mc->replicas ? "its keys are read from their replicas"
                                    : "its keys fall back to the app");
        fp_link_up(&s->link, note);
    } else {
        fp_link_up(&s->link, NULL);
    }
}

/* Drops the connection and answers everything pending on it: `first`
 * (if any) gets `first_st`, the others ERROR. The queue is detached before
 * any callback runs, so a callback that calls fp_cache_get() sees a server
 * that is down and is failed fast. `why` NULL: do not log (shutdown).
 * Never called from inside fp_mc_get(): that would run callbacks there. */
static void server_reset(struct mc_server *s, const char *why,
                         struct mc_req *first, enum fp_cache_status first_st)
{
    struct mc_reqq q;
    struct mc_req *r;

    if (why != NULL)
        fp_link_down(&s->link, why);
    if (s->rev != NULL) {
        event_free(s->rev);
        s->rev = NULL;
    }
    if (s->wev != NULL) {
        event_free(s->wev);
        s->wev = NULL;
    }
    if (s->fd >= 0) {
        evutil_closesocket(s->fd);
        s->fd = -1;
    }
    if (s->flush_active)
        (void)event_del(s->flush);
    if (s->link.hangcheck != NULL)
        (void)event_del(s->link.hangcheck);
    s->wev_added = s->flush_active = 0;
    buf_reset(&s->in, MC_IN_MIN);
    buf_reset(&s->out, MC_OUT_KEEP);
    server_batches_clear(s);
    s->link.health.last_rx_ms = 0;
    s->link.health.stalled = 0;
    fp_mcp_init(&s->mcp, MC_MAX_VALUE);
    s->gen++;
    s->state = MC_DOWN;
    TAILQ_INIT(&q);
    TAILQ_CONCAT(&q, &s->pending, link);
    s->npending = 0;
    if (!s->mc->closing)
        fp_link_retry(&s->link);

    if (first != NULL) {
        TAILQ_REMOVE(&q, first, link);
        req_finish(first, first_st, NULL, 0);
    }
    while ((r = TAILQ_FIRST(&q)) != NULL) {
        TAILQ_REMOVE(&q, r, link);
        req_finish(r, FP_CACHE_ERROR, NULL, 0);
    }
}

/* The stream cannot be trusted: drop it, and retry only after the backoff
 * (a server that answers garbage at once must not be hammered). */
static void server_bad(struct mc_server *s, const char *why,
                       struct mc_req *first)
{
    fp_health_bad(&s->link.health);
    server_reset(s, why, first, FP_CACHE_ERROR);
}

/* A value too big for us: mcproto.c reads its bytes past as they come,
 * then checks its trailer as for any value; its request gets ERROR. */
static void log_skip(struct mc_server *s, const struct fp_mcp_head *h,
                     size_t len)
{
    uint64_t now = fp_mono_ms();

    if (s->skip_logged_ms == 0 || now - s->skip_logged_ms >= MC_SKIP_LOG_MS) {
        fp_log(FP_LOG_WARN, "memcached %s: value of %llu bytes for %.*s is "
               "over the %lu byte limit: skipped, the poll falls back "
               "(logged once per %d s)", s->name, (unsigned long long)len,
               (int)h->keylen, h->key, MC_MAX_VALUE, MC_SKIP_LOG_MS / 1000);
        s->skip_logged_ms = now;
    }
}

/* Pops the head request, answered. */
static struct mc_req *server_pop(struct mc_server *s)
{
    struct mc_req *r = TAILQ_FIRST(&s->pending);

    TAILQ_REMOVE(&s->pending, r, link);
    s->npending--;
    if (r->batch >= s->batch_first && r->batch <= s->batch_seq &&
        --*server_batch_left(s, r->batch) == 0)
        server_batch_over(s, r->batch);
    return r;
}

/* Consumes every complete answer in the input buffer, in place
 * (mcproto.c parses, this acts). Returns 0, or -1 after the server was
 * reset (the buffers are then gone). Callbacks run from here may queue
 * gets (output only): the input stays put. Only a complete hit or miss
 * resets the backoff (health.h). */
static int server_parse(struct mc_server *s)
{
    unsigned gen = s->gen;
    struct fp_mcp_head head = { NULL, 0, 0, 0 };
    struct fp_mcp_event ev;
    struct mc_req *r;

    for (;;) {
        r = TAILQ_FIRST(&s->pending);
        if (r != NULL) {
            /* r is this turn's TAILQ_FIRST; clang-analyzer does not see
             * TAILQ_REMOVE update the head through tqe_prev and takes it
             * for the request finished last turn.
             * NOLINTBEGIN(clang-analyzer-unix.Malloc) */
            head.key = r->key;
            head.keylen = r->keylen;
            head.meta = r->meta;
            head.mn = r->probe && r->meta;
            /* NOLINTEND(clang-analyzer-unix.Malloc) */
        }
        s->in.off += fp_mcp_parse(&s->mcp, s->in.data + s->in.off,
                                  s->in.len - s->in.off,
                                  r != NULL ? &head : NULL, &ev);
        switch (ev.type) {
        case FP_MCP_MORE:
            return 0;
        case FP_MCP_BAD:
            server_bad(s, ev.why, NULL);
            return -1;
        case FP_MCP_PROTO_META:
        case FP_MCP_PROTO_CLASSIC:
            /* It proves the server is there, not that it answers gets: no
             * backoff reset. */
            s->proto = ev.type == FP_MCP_PROTO_META ? MC_PROTO_META
                                                    : MC_PROTO_CLASSIC;
            if (s->proto != s->logged_proto)
                fp_log(FP_LOG_INFO, "memcached %s: %s", s->name,
                       s->proto == MC_PROTO_META ? "meta commands (mg)"
                                                 : "classic get (no meta commands)");
            s->logged_proto = s->proto;
            server_log_up(s);
            continue;
        case FP_MCP_TOO_BIG:
            log_skip(s, &head, ev.len);
            continue;
        case FP_MCP_MISS:
            fp_health_good(&s->link.health);
            server_log_up(s);
            req_finish(server_pop(s), FP_CACHE_MISS, NULL, 0);
            break;
        case FP_MCP_HIT:
            r = server_pop(s);
            fp_health_good(&s->link.health);
            server_log_up(s);
            /* Asked before its recovery window began, answered in it:
             * the value may be older than an acknowledged write. */
            if (server_recovering(s))
                req_finish(r, FP_CACHE_ERROR, NULL, 0);
            else
                req_finish(r, FP_CACHE_HIT, ev.val, ev.len);
            break;
        case FP_MCP_SKIPPED:
            req_finish(server_pop(s), FP_CACHE_ERROR, NULL, 0);
            break;
        case FP_MCP_REFUSED:
        default:
            /* Out of memory, a key it did not like: that request falls
             * back, the stream stays in sync. */
            fp_log(FP_LOG_DEBUG, "memcached %s: %.*s", s->name,
                   (int)(ev.len < 200 ? ev.len : 200), ev.val);
            req_finish(server_pop(s), FP_CACHE_ERROR, NULL, 0);
            break;
        }
        if (s->gen != gen)
            return -1;
    }
}

static void server_lost(struct mc_server *s, const char *what, int err)
{
    char why[128];

    (void)snprintf(why, sizeof(why), "%s: %s", what,
             evutil_socket_error_to_string(err));
    server_reset(s, why, NULL, FP_CACHE_ERROR);
}

/* Reads what the kernel has (one recv as a rule: a second would mostly say
 * EAGAIN) and parses it in place. */
static void server_read_cb(evutil_socket_t fd, short what, void *arg)
{
    struct mc_server *s = arg;
    size_t room, want, have;
    ssize_t n;
    int i;

    (void)what;
    for (i = 0; i < MC_READS_PER_CB; i++) {
        /* Room for a good read, and for the whole answer being parsed. */
        want = MC_READ_MIN;
        have = s->in.len - s->in.off;
        if (fp_mcp_need(&s->mcp) > have + want)
            want = fp_mcp_need(&s->mcp) - have;
        if (buf_reserve(&s->in, want, MC_IN_MIN, MC_IN_MAX) != 0) {
            server_reset(s, "out of memory", NULL, FP_CACHE_ERROR);
            return;
        }
        room = s->in.cap - s->in.len;
        do
            n = recv(fd, s->in.data + s->in.len, room, 0);
        while (n < 0 && errno == EINTR);
        if (n == 0) {
            server_reset(s, "connection closed by server", NULL,
                         FP_CACHE_ERROR);
            return;
        }
        if (n < 0) {
            if (errno != EAGAIN && errno != EWOULDBLOCK)
                server_lost(s, "connection lost", errno);
            return;
        }
        s->in.len += (size_t)n;
        fp_health_rx(&s->link.health);
        if (server_parse(s) < 0)
            return;
        if (s->in.off == s->in.len)
            buf_reset(&s->in, MC_IN_MIN); /* gives back a big value's room */
        if ((size_t)n < room)
            return;
    }
}

/* Writes the batches sent (all but the held gets). A short write means the
 * kernel's buffer is full: wait for EV_WRITE rather than ask again. Returns
 * 0, or -1 after a reset. Never called from inside fp_mc_get() (a reset
 * runs callbacks). */
static int server_write(struct mc_server *s)
{
    size_t left = s->out.len - s->out.off - s->held;
    ssize_t n;

    while (left > 0) {
        n = send(s->fd, s->out.data + s->out.off, left, MSG_NOSIGNAL);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK) {
            server_lost(s, "connection lost", errno);
            return -1;
        }
        if (n > 0)
            s->out.off += (size_t)n;
        if (n < 0 || (size_t)n < left) {
            if (!s->wev_added) {
                if (event_add(s->wev, NULL) != 0) {
                    server_reset(s, "cannot wait for the socket", NULL,
                                 FP_CACHE_ERROR);
                    return -1;
                }
                s->wev_added = 1;
            }
            return 0;
        }
        left = 0;
    }
    if (s->held == 0)
        buf_reset(&s->out, MC_OUT_KEEP);
    if (s->wev_added) {
        (void)event_del(s->wev);
        s->wev_added = 0;
    }
    return 0;
}

static void server_flush_cb(evutil_socket_t fd, short what, void *arg)
{
    struct mc_server *s = arg;

    (void)fd;
    (void)what;
    s->flush_active = 0;
    if (s->state != MC_UP || server_flights(s) >= MC_BATCHES_IN_FLIGHT)
        return;
    server_release(s);
    if (!s->wev_added)
        (void)server_write(s);
}

/* The connection is usable: start reading, send what queued up (as one
 * batch: nothing was in flight on a connection that was down). */
static void server_connected(struct mc_server *s)
{
    s->state = MC_UP;
    server_release(s);
    /* A stopped server's kernel still completes the handshake: after a
     * timeout, wait for an answer before calling it up. */
    if (!s->link.health.hung)
        server_log_up(s);
    if (event_add(s->rev, NULL) != 0) {
        server_reset(s, "cannot wait for the socket", NULL, FP_CACHE_ERROR);
        return;
    }
    (void)server_write(s);
}

static void server_write_cb(evutil_socket_t fd, short what, void *arg)
{
    struct mc_server *s = arg;
    int err = 0;
    socklen_t len = sizeof(err);

    (void)what;
    if (s->state != MC_CONNECTING) {
        (void)server_write(s);
        return;
    }
    if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0)
        err = errno;
    if (err != 0) {
        server_lost(s, "connect failed", err);
        return;
    }
    server_connected(s);
}

static void server_connect(struct mc_server *s)
{
    struct event_base *base = s->mc->base;
    evutil_socket_t fd;
    int one = 1;

    fd = socket(s->addr.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC,
                0);
    if (fd < 0) {
        fp_link_down(&s->link, "cannot create socket");
        goto fail;
    }
    if (setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one)) != 0) {
        fp_link_down(&s->link, "cannot set socket options");
        evutil_closesocket(fd);
        goto fail;
    }
    s->fd = fd;
    s->rev = event_new(base, fd, EV_READ | EV_PERSIST, server_read_cb, s);
    s->wev = event_new(base, fd, EV_WRITE | EV_PERSIST, server_write_cb, s);
    if (s->rev == NULL || s->wev == NULL) {
        fp_link_down(&s->link, "cannot create events");
        goto fail_fd;
    }
    fp_mcp_init(&s->mcp, MC_MAX_VALUE);
    /* Ask first whether it speaks meta commands: pipelined "mg" answers go
     * out in one write, pipelined classic "get"s in one write each (about
     * 3 instead of 8 us of memcached's CPU per get in batches of 5). Gets
     * queued before the answer go out as classic ones. The buffer is empty
     * (the server was down) and MC_OUT_MIN holds it. */
    s->proto = MC_PROTO_PROBING;
    if (buf_reserve(&s->out, MC_LEN(MC_MN), MC_OUT_MIN, MC_OUT_MAX) != 0) {
        fp_link_down(&s->link, "out of memory");
        goto fail_fd;
    }
    memcpy(s->out.data + s->out.len, MC_MN, MC_LEN(MC_MN)); /* NOLINT(bugprone-not-null-terminated-result) */
    s->out.len += MC_LEN(MC_MN);
    if (connect(fd, (struct sockaddr *)&s->addr, s->addrlen) == 0) {
        server_connected(s);
        return;
    }
    if (errno != EINPROGRESS) {
        char why[128];
        (void)snprintf(why, sizeof(why), "connect failed: %s", strerror(errno));
        fp_link_down(&s->link, why);
        goto fail_fd;
    }
    /* Non-blocking; the outcome shows up as EV_WRITE (server_write_cb). */
    if (event_add(s->wev, NULL) != 0) {
        fp_link_down(&s->link, "cannot wait for the socket");
        goto fail_fd;
    }
    s->wev_added = 1;
    s->state = MC_CONNECTING;
    return;

fail_fd:
    /* Nothing is pending on a server that was down: no callbacks run. */
    server_reset(s, NULL, NULL, FP_CACHE_ERROR);
    return;
fail:
    s->state = MC_DOWN;
    fp_link_retry(&s->link);
}

static void server_retry_cb(evutil_socket_t fd, short what, void *arg)
{
    struct mc_server *s = arg;

    (void)fd;
    (void)what;
    if (s->state == MC_DOWN && !s->mc->closing)
        server_connect(s);
}

/* The link's questions (link.h): a stall (a starved CPU, a deep pipeline)
 * costs its late requests, a hang the connection and the recovery window. */
static int server_waiting(void *arg)
{
    const struct mc_server *s = arg;

    return !s->mc->closing && s->state == MC_UP && s->npending > 0;
}

static void server_hung(void *arg, const char *why)
{
    server_reset(arg, why, NULL, FP_CACHE_TIMEOUT);
}

static const struct fp_link_ops server_link = {
    "memcached", "answer", "closing", server_waiting, server_hung
};

static void req_timer_cb(evutil_socket_t fd, short what, void *arg)
{
    struct mc_req *r = arg;
    struct mc_server *s = r->srv;
    char why[160];

    (void)fd;
    (void)what;
    if (s == NULL) {            /* failed fast in fp_mc_get */
        TAILQ_REMOVE(&r->mc->failq, r, link);
        req_finish(r, FP_CACHE_ERROR, NULL, 0);
        return;
    }
    if (fp_link_late(&s->link, why, sizeof(why)) != 0) {
        server_reset(s, why, r, FP_CACHE_TIMEOUT);
        return;
    }
    /* Answering, or silent for less than a hang: it alone gets TIMEOUT and
     * keeps its place in the FIFO until its answer is read. Its batch is
     * over: the gets held behind it go out rather than wait for it. */
    r->late = 1;
    server_batch_over(s, r->batch);
    fp_stat_backend_done(r->srv_index, FP_CACHE_TIMEOUT, r->sent);
    if (!fp_node_fails_over(FP_CACHE_TIMEOUT, r->failover) ||
        req_failover(r) != 0)
        r->cb(FP_CACHE_TIMEOUT, NULL, 0, r->arg);
}

/* The last line of defence against protocol injection: keys.c only hands
 * out keys like this, but nothing else may ever reach the wire. */
static int key_is_safe(const char *key, size_t len)
{
    size_t i;

    if (len == 0 || len > FP_MAX_KEY_LEN)
        return 0;
    for (i = 0; i < len; i++) {
        unsigned char c = (unsigned char)key[i];
        if (c <= 0x20 || c == 0x7F)
            return 0;
    }
    return 1;
}

/* Takes gets, unless it is down, full, or back from a hang and not yet
 * answering (a stopped server's kernel accepts the connection): with
 * replicas, its keys go to their replicas meanwhile instead of waiting for
 * a timeout. */
static int server_ready(const struct mc_server *s)
{
    return fp_node_ready(s->state == MC_DOWN, s->npending, MC_MAX_PENDING,
                         s->mc->replicas, &s->link.health);
}

/* In its recovery window (server_log_up): neither primary nor replica. */
static int server_recovering(struct mc_server *s)
{
    int ended;

    if (fp_node_recovering(&s->recovery, &ended))
        return 1;
    if (!ended)
        return 0;
    fp_stat_backend_recovering((size_t)(s - s->mc->servers), 0);
    fp_log(FP_LOG_INFO, "memcached %s: recovery window over, reading its "
           "keys from it again", s->name);
    return 0;
}

/* The replica of a key whose primary is server p: ketama over the list
 * without p, as the app computes it (fastpoll_app/cache.py). */
static size_t replica_of(const struct fp_mc *mc, const char *key,
                         size_t keylen, size_t p)
{
    size_t j = memcached_generate_hash(mc->excl[p], key, keylen) %
               (mc->nservers - 1);

    return j < p ? j : j + 1;
}

/* The one test of whether a node serves a get, as primary or replica. */
static int server_serves(struct mc_server *s)
{
    return server_ready(s) && !server_recovering(s);
}

/* fp_node_pick's question about a key's replica (found only if asked). */
struct replica_pick {
    struct fp_mc *mc;
    const char *key;
    size_t keylen, p, i;
};

static int replica_serves(void *arg)
{
    struct replica_pick *k = arg;

    k->i = replica_of(k->mc, k->key, k->keylen, k->p);
    return server_serves(&k->mc->servers[k->i]);
}

static struct mc_req *req_alloc(struct fp_mc *mc)
{
    struct mc_req *r;

    if ((r = mc->free_reqs) != NULL) {
        mc->free_reqs = r->free_next;
        mc->nfree_reqs--;
    } else {
        if ((r = malloc(sizeof(*r))) == NULL)
            return NULL;
        if ((r->timer = evtimer_new(mc->base, req_timer_cb, r)) == NULL) {
            free(r);
            return NULL;
        }
    }
    r->mc = mc;
    r->srv = NULL;
    r->srv_index = SIZE_MAX;
    r->sent = 0;
    r->late = 0;
    r->batch = 0;
    r->failover = 0;
    r->probe = 0;
    r->keylen = 0;
    return r;
}

/* A get's bytes around its key, by r->meta: classic "get <key>", meta
 * "mg <key> v k f" (value, key, client flags). */
struct mc_get_cmd {
    const char *head, *tail;
    size_t hlen, tlen;
};
static const struct mc_get_cmd mc_get_cmd[2] = {
    {"get ", "\r\n", MC_LEN("get "), MC_LEN("\r\n")},
    {"mg ", " v k f\r\n", MC_LEN("mg "), MC_LEN(" v k f\r\n")},
};

/* Queues r's get (r->key) on s. Returns 0, or -1 with nothing written. */
static int req_queue(struct mc_req *r, struct mc_server *s)
{
    struct fp_mc *mc = r->mc;
    size_t keylen = r->keylen, cmdlen;
    const struct mc_get_cmd *g;
    char *cmd;

    /* Room first, then the deadline, then the command in one piece, so a
     * failure leaves nothing half-written on the stream. */
    r->meta = s->proto == MC_PROTO_META;
    g = &mc_get_cmd[r->meta];
    cmdlen = r->probe && r->meta ? MC_LEN(MC_MN) : g->hlen + keylen + g->tlen;
    if (buf_reserve(&s->out, cmdlen, MC_OUT_MIN, MC_OUT_MAX) != 0 ||
        evtimer_add(r->timer, mc->timeout) != 0)
        return -1;
    cmd = s->out.data + s->out.len;
    /* Bytes for the wire, not C strings: */
    if (r->probe && r->meta) {
        memcpy(cmd, MC_MN, MC_LEN(MC_MN)); /* NOLINT(bugprone-not-null-terminated-result) */
    } else {
        memcpy(cmd, g->head, g->hlen);
        memcpy(cmd + g->hlen, r->key, keylen);
        memcpy(cmd + g->hlen + keylen, g->tail, g->tlen);
    }
    s->out.len += cmdlen;
    r->srv = s;
    r->srv_index = (size_t)(s - mc->servers);
    r->sent = fp_stat_now();
    TAILQ_INSERT_TAIL(&s->pending, r, link);
    s->npending++;
    /* Held for the next batch. Nothing in flight: it goes out at the end
     * of this loop turn, with every get the callbacks still active in it
     * queue (no added wait). Else when a batch is over (server_pop, the
     * timer), with everything queued until then. While connecting, the
     * connect sends it. */
    r->batch = s->batch_seq + 1;
    s->held += cmdlen;
    s->nheld++;
    s->nheld_keys += !r->probe;
    server_flush_soon(s);
    return 0;
}

/* The primary read r failed: the same get goes to the key's replica, whose
 * answer (or failure) calls r's callback. Returns 0, or -1 (no usable
 * replica) and r's failure stands. Runs on the loop, never inside
 * fp_mc_get. */
static int req_failover(struct mc_req *r)
{
    struct fp_mc *mc = r->mc;
    struct mc_server *s;
    struct mc_req *r2;
    size_t i;

    if (mc->closing || r->srv_index >= mc->nservers)
        return -1;
    i = replica_of(mc, r->key, r->keylen, r->srv_index);
    s = &mc->servers[i];
    if (!server_serves(s))
        return -1;
    if ((r2 = req_alloc(mc)) == NULL)
        return -1;
    r2->cb = r->cb;
    r2->arg = r->arg;
    memcpy(r2->key, r->key, r->keylen);
    r2->keylen = r->keylen;
    if (req_queue(r2, s) != 0) {
        req_release(mc, r2);
        return -1;
    }
    fp_stat_replica_read(i);
    return 0;
}

static void probe_done(enum fp_cache_status st, const char *val, size_t len,
                       void *arg)
{
    (void)st;
    (void)val;
    (void)len;
    (void)arg;
}

/* A node must be seen to hang even when no poll asks it: a poll server
 * that sent it nothing during a hang would not start its recovery window,
 * and could read answers older than publishes made meanwhile. So an idle
 * node is asked every MC_PROBE_MS: "mn" (meta no-op) when it speaks meta
 * commands, else a get of a key no one writes; its timeout is the hang
 * detection. Not counted in stats. */
static void server_probe_cb(evutil_socket_t fd, short what, void *arg)
{
    struct mc_server *s = arg;
    struct mc_req *r;

    (void)fd;
    (void)what;
    if (s->mc->closing || s->state != MC_UP || s->npending > 0 ||
        !server_ready(s))
        return;
    /* Without replicas only a memcached >= 1.6 is probed ("mn", which
     * counts no get): a classic one gets a real get, as with replicas. */
    if (!s->mc->replicas && s->proto != MC_PROTO_META)
        return;
    if ((r = req_alloc(s->mc)) == NULL)
        return;
    r->probe = 1;
    r->cb = probe_done;
    r->arg = NULL;
    r->keylen = sizeof(MC_PROBE_KEY) - 1;
    memcpy(r->key, MC_PROBE_KEY, r->keylen);
    if (req_queue(r, s) != 0) {
        req_release(s->mc, r);
        return;
    }
    r->srv_index = SIZE_MAX; /* not a poll: no stats */
}

int fp_mc_get(struct fp_mc *mc, const char *key, size_t keylen,
              fp_cache_cb *cb, void *arg)
{
    struct mc_req *r;
    struct mc_server *s;
    struct replica_pick pick;
    size_t p;

    if (mc->closing)
        return -1;
    if ((r = req_alloc(mc)) == NULL)
        return -1;
    r->cb = cb;
    r->arg = arg;

    if (!key_is_safe(key, keylen)) {
        fp_log(FP_LOG_ERROR, "memcached: refusing an unsafe key (%zu bytes)",
               keylen);
        goto fail_fast;
    }
    memcpy(r->key, key, keylen);
    r->keylen = keylen;

    p = memcached_generate_hash(mc->memc, key, keylen) % mc->nservers;
    s = &mc->servers[p];
    r->srv_index = p;
    pick.mc = mc;
    pick.key = key;
    pick.keylen = keylen;
    pick.p = p;
    switch (fp_node_pick(mc->replicas, server_serves(s), replica_serves,
                         &pick)) {
    case FP_NODE_PRIMARY:
        r->failover = mc->replicas != 0; /* retried on the replica */
        break;
    case FP_NODE_REPLICA:
        s = &mc->servers[pick.i];
        r->srv_index = pick.i;
        fp_stat_replica_read(pick.i);
        break;
    case FP_NODE_NONE:
    default:
        /* Counted on the primary; without replicas the app answers. */
        goto fail_fast;
    }
    if (req_queue(r, s) != 0)
        goto fail_fast;
    return 0;

fail_fast:
    /* Never call back from inside fp_cache_get(): defer to the loop. */
    r->srv = NULL;
    r->failover = 0;
    TAILQ_INSERT_TAIL(&mc->failq, r, link);
    event_active(r->timer, EV_TIMEOUT, 1);
    return 0;
}

/* Resolves host:port once, at startup (getaddrinfo blocks, but the loop is
 * not running yet). The first address wins. */
static int server_resolve(struct mc_server *s, const struct fp_server_addr *a)
{
    int rc = fp_resolve(a->host, a->port, &s->addr, &s->addrlen);

    if (rc != 0) {
        fp_log(FP_LOG_ERROR, "memcached %s: cannot resolve: %s", s->name,
               gai_strerror(rc));
        return -1;
    }
    return 0;
}

/* libmemcached's ketama over the configured servers in order, without
 * server `skip` (SIZE_MAX: all): used only for memcached_generate_hash. */
static memcached_st *ketama_new(const struct fp_settings *st, size_t skip)
{
    memcached_st *m = memcached_create(NULL);
    size_t i;

    if (m == NULL)
        return NULL;
    /* The order of the servers matters: it must be the app's order. */
    for (i = 0; i < st->nmc_servers; i++) {
        const struct fp_server_addr *a = &st->mc_servers[i];
        if (i == skip)
            continue;
        if (a->host == NULL ||
            memcached_server_add(m, a->host, a->port) != MEMCACHED_SUCCESS) {
            fp_log(FP_LOG_ERROR, "memcached: cannot add server %s:%u",
                   a->host ? a->host : "(null)", (unsigned)a->port);
            memcached_free(m);
            return NULL;
        }
    }
    if (memcached_behavior_set(m, MEMCACHED_BEHAVIOR_KETAMA, 1) !=
        MEMCACHED_SUCCESS) {
        fp_log(FP_LOG_ERROR, "memcached: cannot enable ketama");
        memcached_free(m);
        return NULL;
    }
    return m;
}

struct fp_mc *fp_mc_create(struct event_base *base, const struct fp_settings *st)
{
    struct fp_mc *mc;
    struct mc_server *s;
    size_t i;

    if (st->nmc_servers == 0 || st->nmc_servers > FP_MAX_SERVERS) {
        fp_log(FP_LOG_ERROR, "memcached: no servers configured");
        return NULL;
    }
    mc = calloc(1, sizeof(*mc));
    if (mc == NULL)
        return NULL;
    mc->base = base;
    TAILQ_INIT(&mc->failq);
    mc->timeout_tv.tv_sec = st->cache_timeout_ms / 1000;
    mc->timeout_tv.tv_usec = (suseconds_t)(st->cache_timeout_ms % 1000) * 1000;
    mc->timeout_ms = st->cache_timeout_ms;
    /* All requests share one timeout: libevent keeps them in a queue. */
    mc->timeout = event_base_init_common_timeout(base, &mc->timeout_tv);
    if (mc->timeout == NULL)
        mc->timeout = &mc->timeout_tv;

    if ((mc->memc = ketama_new(st, SIZE_MAX)) == NULL)
        goto fail;
    mc->replicas = st->mc_replicas < 0 ? st->nmc_servers >= 2
                                       : st->mc_replicas;
    mc->recovery_ms = st->mc_recovery_ms;
    if (mc->replicas && st->nmc_servers < 2) {
        fp_log(FP_LOG_ERROR, "memcached: replicas need at least 2 servers");
        goto fail;
    }
    if (mc->replicas) {
        mc->excl = calloc(st->nmc_servers, sizeof(memcached_st *));
        if (mc->excl == NULL)
            goto fail;
        mc->nexcl = st->nmc_servers;
        for (i = 0; i < st->nmc_servers; i++)
            if ((mc->excl[i] = ketama_new(st, i)) == NULL)
                goto fail;
    }

    mc->servers = calloc(st->nmc_servers, sizeof(*mc->servers));
    if (mc->servers == NULL)
        goto fail;
    mc->nservers = st->nmc_servers;
    for (i = 0; i < mc->nservers; i++) {
        s = &mc->servers[i];
        s->mc = mc;
        s->fd = -1;
        s->state = MC_DOWN;
        s->batch_first = 1;     /* batch_seq 0: none sent, none in flight */
        TAILQ_INIT(&s->pending);
        (void)snprintf(s->name, sizeof(s->name), "%s:%u", st->mc_servers[i].host,
                 (unsigned)st->mc_servers[i].port);
        fp_stats_backend_name(i, s->name);
        s->flush = event_new(base, -1, 0, server_flush_cb, s);
        if (fp_link_init(&s->link, base, &server_link, s->name, i,
                         mc->timeout_ms, s, server_retry_cb) != 0 ||
            s->flush == NULL || server_resolve(s, &st->mc_servers[i]) != 0)
            goto fail;
        {
            struct timeval tv = { MC_PROBE_MS / 1000,
                                  (suseconds_t)(MC_PROBE_MS % 1000) * 1000 };

            s->probe = event_new(base, -1, EV_PERSIST, server_probe_cb, s);
            if (s->probe == NULL || event_add(s->probe, &tv) != 0)
                goto fail;
        }
    }
    /* Start connecting now (non-blocking) so the first poll finds a
     * connection; a failure just arms the retry timer. */
    for (i = 0; i < mc->nservers; i++)
        server_connect(&mc->servers[i]);
    return mc;

fail:
    fp_mc_free(mc);
    return NULL;
}

void fp_mc_free(struct fp_mc *mc)
{
    struct mc_req *r;
    size_t i;

    if (mc == NULL)
        return;
    mc->closing = 1;
    for (i = 0; i < mc->nservers; i++) {
        struct mc_server *s = &mc->servers[i];
        if (s->fd >= 0 || !TAILQ_EMPTY(&s->pending))
            server_reset(s, NULL, NULL, FP_CACHE_ERROR);
        fp_link_free(&s->link);
        if (s->probe != NULL)
            event_free(s->probe);
        if (s->flush != NULL)
            event_free(s->flush);
        free(s->in.data);
        free(s->out.data);
    }
    while ((r = TAILQ_FIRST(&mc->failq)) != NULL) {
        TAILQ_REMOVE(&mc->failq, r, link);
        req_finish(r, FP_CACHE_ERROR, NULL, 0);
    }
    while ((r = mc->free_reqs) != NULL) {
        mc->free_reqs = r->free_next;
        event_free(r->timer);
        free(r);
    }
    free(mc->servers);
    if (mc->excl != NULL) {
        for (i = 0; i < mc->nexcl; i++)
            if (mc->excl[i] != NULL)
                memcached_free(mc->excl[i]);
        free(mc->excl);
    }
    if (mc->memc != NULL)
        memcached_free(mc->memc);
    free(mc);
}

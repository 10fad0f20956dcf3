/* httpparse.h -- a strict parser for the HTTP/1.x requests a poll server
 * is sent (by nginx: a request line, a few headers, sometimes a body).
 *
 * No allocation, no copies: the head is parsed in the caller's buffer once
 * its end (an empty line) is there. Only what the poll server acts on is
 * kept: method, target, version, keep-alive, If-None-Match (Last-Event-ID
 * is one more of its lines), whether Accept names text/event-stream, nginx's
 * X-Fastpoll-Route, and the body's framing (Content-Length or chunked),
 * which must be unambiguous. Anything outside
 * RFC 9112's grammar is refused rather than guessed at: bare LF, obsolete
 * line folding, spaces around the colon or in the target, control bytes
 * (but in If-None-Match, which is then ignored), two lengths, a length
 * with chunked. Fuzzed (fuzz/fuzz_http.c). */
#ifndef FP_HTTPPARSE_H
#define FP_HTTPPARSE_H

#include <stddef.h>
#include <sys/types.h>

#define FP_HTTP_MAX_HEADERS 100 /* header lines per request */
/* If-None-Match lines kept (etag.h): all a head may have, so that several
 * lines are one list as the app reads them; the 1,024-byte bound on the
 * joined value (FP_INM_MAX) is what limits them. */
#define FP_HTTP_MAX_INM FP_HTTP_MAX_HEADERS

enum fp_hmethod { FP_HM_GET, FP_HM_HEAD, FP_HM_POST, FP_HM_OTHER };

/* X-Fastpoll-Route, set by nginx on the request it proxies (docs/api.md,
 * "`wait`"): on its plain-poll route (a 5 s read timeout, retried on the
 * next poller) a poll must never be held, whatever its query says. */
enum fp_route {
    FP_ROUTE_NONE,      /* no header (direct access): `wait` decides */
    FP_ROUTE_HELD,      /* `held` (any case) on every line */
    FP_ROUTE_STREAM,    /* `stream` on every line: an event stream's route
                         * (read timeout above the heartbeat, unbuffered) */
    FP_ROUTE_PLAIN      /* `plain`, or any other value: never held */
};

struct fp_http_head {
    enum fp_hmethod method;
    const char *target;         /* in the caller's buffer, not terminated */
    size_t target_len;
    int minor;                  /* HTTP/1.minor: 0 or 1 */
    int keep_alive;             /* by the version and Connection */
    enum fp_route route;        /* X-Fastpoll-Route */
    int accept_stream;          /* an Accept line names text/event-stream */
    int chunked;                /* Transfer-Encoding: chunked */
    int has_length;             /* Content-Length given */
    unsigned long long content_length;
    /* If-None-Match values (trimmed), in the caller's buffer, and
     * Last-Event-ID's (an event's id is its answer's ETag); ninm counts
     * every line (never more than FP_HTTP_MAX_INM: a head with more header
     * lines is refused). */
    const char *inm[FP_HTTP_MAX_INM];
    size_t inm_len[FP_HTTP_MAX_INM];
    size_t ninm;
};

/* Where the head that starts at buf ends: the offset just past its empty
 * line, or just past a bare LF (which fp_http_parse_head refuses), or 0 if
 * it is not all in buf[0..len). `from` is how far an earlier call looked
 * (0 at first): the search resumes there. */
size_t fp_http_head_end(const char *buf, size_t len, size_t from);

/* Parses the head buf[0..len) (len from fp_http_head_end). Returns 0, or
 * the status to refuse it with: 400 (malformed), 431 (too many header
 * lines), 501 (a transfer coding other than chunked). */
int fp_http_parse_head(const char *buf, size_t len, struct fp_http_head *out);

/* A chunked body, read and discarded as it comes in. */
struct fp_chunked {
    int state;
    int ndigits;
    unsigned long long left;    /* data bytes left in this chunk */
    unsigned long long total;   /* data bytes so far */
};

/* Starts a body. */
void fp_chunked_init(struct fp_chunked *c);

/* Consumes up to len bytes of the body; returns how many (all of them, or
 * fewer when the body ends: the rest is the next request), or -1 if the
 * framing is malformed. *done is set once the last chunk and its trailer
 * are in. */
ssize_t fp_chunked_feed(struct fp_chunked *c, const char *p, size_t len,
                        int *done);

#endif

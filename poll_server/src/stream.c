/* stream.c -- event streams (stream.h, docs/api.md, "Event streams").
 *
 * An event is `id: "<tag>"\ndata: <the answer>\n\n`, written with one
 * writev of its fields and the value as the cache gave it: an answer is
 * one line (compact JSON), so it is sent as it is; one with line ends is
 * copied with each line as a data line of its own (the client joins them
 * with LF). The first event carries `retry:` with the pace of a poll, and
 * a stream that ends sends a new one, spread over 0..retry_spread_ms for
 * the ends that come to many streams at once (a rollout's drain, their
 * lifetimes, a cache that fails), so that their clients do not all come
 * back in the same millisecond. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <sys/uio.h>

#include <event2/event.h>

#include "conn.h"
#include "etag.h"
#include "log.h"
#include "settings.h"
#include "stream.h"
#include "wait.h"

/* "retry: " digits "\n" "id: " tag "\n" "data: " and a NUL */
#define PREFIX_MAX (7 + 10 + 1 + 4 + 18 + 1 + 6 + 1)
/* An event up to this is copied into one buffer and written in one piece
 * (a socket's shortest write path), else as its three pieces. */
#define EVENT_SMALL 4096

/* Fixed pieces of the events (writev takes no const). */
static char event_end[] = "\n\n";
static char retry_end[] = "\n";
static char heartbeat[] = ":\n";
static char empty_data[] = "\ndata: ";

int fp_stream_wanted(const struct fp_http_head *hd)
{
    if (hd->method != FP_HM_GET || !hd->accept_stream)
        return 0;
    return hd->route == FP_ROUTE_STREAM || hd->route == FP_ROUTE_NONE;
}

static uint64_t now_ms(const struct fp_request *r)
{
    struct timeval tv;

    if (event_base_gettimeofday_cached(r->c.h->base, &tv) != 0)
        return 0;
    return (uint64_t)tv.tv_sec * 1000u + (uint64_t)tv.tv_usec / 1000u;
}

/* random(): a spread only, no security use. */
static unsigned spread(unsigned max)
{
    return (unsigned)((unsigned long long)random() % ((unsigned long long)max + 1));
}

static size_t put_retry(char *p, unsigned ms)
{
    int n = snprintf(p, 7 + 10 + 2, "retry: %u\n", ms);

    return n > 0 ? (size_t)n : 0;
}

static size_t put_id(char *p, uint64_t tag)
{
    /* Copied with their NULs (PREFIX_MAX counts one), never sent. */
    memcpy(p, "id: ", 5);
    fp_etag_format(tag, p + 4);
    memcpy(p + 4 + 18, "\ndata: ", 8);
    return 4 + 18 + 7;
}

/* value with each line end (CRLF, CR or LF) made "\ndata: ": a malloc'd
 * copy in *out, its length returned; 0 if out of memory. */
static size_t split_lines(const char *value, size_t len, char **out)
{
    size_t ends = 0, n = 0;
    char *b;

    for (size_t i = 0; i < len; i++)
        if (value[i] == '\n' || value[i] == '\r')
            ends++;
    if ((b = malloc(len + ends * 7 + 1)) == NULL)
        return 0;
    for (size_t i = 0; i < len; i++) {
        if (value[i] == '\r' || value[i] == '\n') {
            if (value[i] == '\r' && i + 1 < len && value[i + 1] == '\n')
                i++;
            memcpy(b + n, "\ndata: ", 8); /* its NUL overwritten next */
            n += 7;
        } else {
            b[n++] = value[i];
        }
    }
    *out = b;
    return n;
}

/* Writes an event (retry_ms: a retry field first, if not 0 ... or with
 * has_retry) for (value, tag); starting the stream if `open`. 0, or -1 if
 * the connection is gone. */
static int write_event(struct fp_request *r, const char *value, size_t len,
                       uint64_t tag, int has_event, int has_retry,
                       unsigned retry_ms, int open)
{
    char pre[PREFIX_MAX], one[EVENT_SMALL], *copy = NULL;
    struct iovec iov[3];
    size_t plen = 0;
    int n = 0, rc;

    if (has_retry)
        plen += put_retry(pre, retry_ms);
    if (has_event) {
        plen += put_id(pre + plen, tag);
        /* An EventSource delivers no event with empty data: the empty
         * answer is two empty data lines (data "\n"). */
        if (len == 0) {
            value = empty_data;
            len = sizeof(empty_data) - 1;
        } else if (memchr(value, '\n', len) != NULL || memchr(value, '\r', len) != NULL) {
            if ((len = split_lines(value, len, &copy)) == 0) {
                fp_log(FP_LOG_ERROR, "http: out of memory for a stream's event");
                conn_close(&r->c);
                return -1;
            }
            value = copy;
        }
    }
    iov[n].iov_base = pre;
    iov[n++].iov_len = plen;
    if (has_event) {
        /* NOLINTNEXTLINE(performance-no-int-to-ptr) */
        iov[n].iov_base = (void *)(uintptr_t)value;
        iov[n++].iov_len = len;
        iov[n].iov_base = event_end;
        iov[n++].iov_len = sizeof(event_end) - 1;
    } else if (has_retry) {
        iov[n].iov_base = retry_end;
        iov[n++].iov_len = sizeof(retry_end) - 1;
    }
    if (n == 3 && plen + len + iov[2].iov_len <= sizeof(one)) {
        memcpy(one, pre, plen);
        memcpy(one + plen, value, len);
        memcpy(one + plen + len, event_end, iov[2].iov_len);
        iov[0].iov_base = one;
        iov[0].iov_len = plen + len + iov[2].iov_len;
        n = 1;
    }
    rc = open ? conn_stream_start(&r->c, iov, n, r->c.h->s->stream_heartbeat_ms)
              : conn_stream_send(&r->c, iov, n);
    free(copy);
    if (rc == 0 && has_event) {
        r->stream_tag = tag;
        fp_stat_stream_event();
    }
    return rc;
}

int fp_stream_open(struct fp_request *r, const char *value, size_t len,
                   uint64_t tag)
{
    const struct fp_settings *s = r->c.h->s;
    int seen = r->cond && fp_inm_match(&r->inm, tag);
    int over = fp_stats.streams_now >= s->stream_max;
    int drain = r->c.h->draining;
    unsigned life = s->stream_lifetime_s;
    uint64_t left;

    fp_stat_request(r->method, seen ? FP_STAT_NOT_MODIFIED : FP_STAT_HIT);
    r->stream_tag = tag;
    if (write_event(r, value, len, tag, !seen, 1,
                    fp_pace_ms(s->poll_interval_ms, s->poll_jitter_pct), 1) != 0)
        return -1;
    fp_stat_stream_open();
    if (over || drain) {
        /* One event, and the client comes back at a poll's pace. */
        fp_log(FP_LOG_DEBUG, "http: %s: a stream answered with one event",
               over ? "[stream] max streams held" : "draining");
        fp_stat_stream_end(over ? FP_STAT_STREAM_OVER_CAP : FP_STAT_STREAM_DRAIN);
        conn_stream_end(&r->c);
        return 0;
    }
    r->streaming = 1;
    left = (uint64_t)life * 1000u + spread(life * 100u);
    r->stream_end_ms = now_ms(r) + left;
    if (left < s->stream_heartbeat_ms)
        conn_stream_tick(&r->c, (unsigned)left);
    return 1;
}

int fp_stream_send(struct fp_request *r, const char *value, size_t len,
                   uint64_t tag)
{
    if (tag == r->stream_tag)
        return 0;
    return write_event(r, value, len, tag, 1, 0, 0, 0);
}

void fp_stream_end(struct fp_request *r, enum fp_stat_stream_end why)
{
    const struct fp_settings *s = r->c.h->s;
    char pre[PREFIX_MAX + 1];
    struct iovec iov;
    size_t n;

    if (r->streaming) {
        r->streaming = 0;
        fp_stat_stream_end(why);
    }
    n = put_retry(pre, spread(s->stream_retry_spread_ms));
    pre[n++] = '\n';
    iov.iov_base = pre;
    iov.iov_len = n;
    if (conn_stream_send(&r->c, &iov, 1) == 0)
        conn_stream_end(&r->c);
}

int fp_stream_tick(struct fp_request *r)
{
    const struct fp_settings *s = r->c.h->s;
    uint64_t now = now_ms(r), left;
    struct iovec iov;

    if (now >= r->stream_end_ms)
        return 1;
    iov.iov_base = heartbeat;
    iov.iov_len = sizeof(heartbeat) - 1;
    if (conn_stream_send(&r->c, &iov, 1) != 0)
        return -1;
    fp_stat_stream_heartbeat();
    left = r->stream_end_ms - now;
    conn_stream_tick(&r->c, left < s->stream_heartbeat_ms ? (unsigned)left
                                                          : s->stream_heartbeat_ms);
    return 0;
}

void fp_stream_gone(struct fp_request *r)
{
    if (!r->streaming)
        return;
    r->streaming = 0;
    fp_stat_stream_end(r->c.slow ? FP_STAT_STREAM_SLOW : FP_STAT_STREAM_CLIENT);
}

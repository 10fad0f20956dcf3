/* response.c -- HTTP formatting of the poll port's answers (response.h). */
#include <stdio.h>
#include <string.h>
#include <sys/time.h>

#include <event2/event.h>
#include <event2/util.h>

#include "etag.h"
#include "response.h"

/* A poll URL without a valid signature (docs/security.md). */
static const char forbidden_body[] =
    "{\"error\":\"missing, invalid or expired signature\"}\n";

const char *fp_resp_body(int code, size_t *len)
{
    if (code == 403) {
        *len = sizeof(forbidden_body) - 1;
        return forbidden_body;
    }
    *len = 0;
    return NULL;
}

const char *fp_resp_date_now(struct fp_resp_date *d, struct event_base *base)
{
    struct timeval now;
    struct tm tm;

    if (event_base_gettimeofday_cached(base, &now) != 0)
        now.tv_sec = time(NULL);
    if (now.tv_sec != d->sec || d->text[0] == '\0') {
        if (gmtime_r(&now.tv_sec, &tm) == NULL ||
            evutil_date_rfc1123(d->text, sizeof(d->text), &tm) <= 0)
            return NULL;
        d->sec = now.tv_sec;
    }
    return d->text;
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

size_t fp_resp_format(char *buf, size_t cap, const struct fp_resp *r)
{
    const char *end = buf + cap;
    char *p = buf;

    p = put(p, end, r->minor == 0 ? "HTTP/1.0 " : "HTTP/1.1 ", 9);
    p = put_num(p, end, (size_t)r->code);
    p = put(p, end, " ", 1);
    p = put_str(p, end, reason_of(r->code));
    if (r->stream) {
        /* Unbuffered through nginx (X-Accel-Buffering), never cached. */
        p = put_str(p, end, "\r\nContent-Type: text/event-stream"
                            "\r\nCache-Control: no-store"
                            "\r\nX-Accel-Buffering: no"
                            "\r\nX-Poll-Source: cache");
    } else if (r->code != 304) { /* RFC 9110 15.4.5: a 304 has no content headers */
        p = put(p, end, "\r\nContent-Length: ", 18);
        p = put_num(p, end, r->len);
    }
    if (r->from_cache) {
        if (r->code != 304) {
            p = put(p, end, "\r\nContent-Type: ", 16);
            p = put_str(p, end, r->content_type);
        }
        p = put(p, end, "\r\nX-Poll-Source: cache", 22);
        if (r->has_tag) {
            char tag[18];

            fp_etag_format(r->tag, tag);
            p = put(p, end, "\r\nETag: ", 8);
            p = put(p, end, tag, sizeof(tag));
        }
        p = put(p, end, "\r\nPoll-Interval-Ms: ", 20);
        p = put_num(p, end, r->pace_ms);
    } else if (r->code == 403) {
        p = put_str(p, end, "\r\nContent-Type: application/json");
    } else if (r->code == 405) {
        p = put_str(p, end, "\r\nAllow: GET, HEAD, POST");
    }
    if (r->date != NULL) {
        p = put(p, end, "\r\nDate: ", 8);
        p = put_str(p, end, r->date);
    }
    if (r->close)
        p = put(p, end, "\r\nConnection: close", 19);
    else if (r->minor == 0)
        p = put(p, end, "\r\nConnection: keep-alive", 24);
    p = put(p, end, "\r\n\r\n", 4);
    return p == NULL ? 0 : (size_t)(p - buf);
}

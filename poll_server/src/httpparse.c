/* httpparse.c -- the request parser (httpparse.h). RFC 9112's grammar,
 * with no leniency: the only sender we serve in production is nginx, and a
 * request two parsers could read differently is refused. */
#include <string.h>

#include "httpparse.h"

/* RFC 9110 tchar: the bytes of a token (method, header name). */
static int is_tchar(unsigned char ch)
{
    if ((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
        (ch >= '0' && ch <= '9'))
        return 1;
    return ch != '\0' && strchr("!#$%&'*+-.^_`|~", ch) != NULL;
}

/* A header value's bytes: visible, space, tab, obs-text; no controls. */
static int is_vbyte(unsigned char ch)
{
    return ch == '\t' || (ch >= 0x20 && ch != 0x7f);
}

/* An If-None-Match value's bytes: a control byte (but CR, LF, NUL, which
 * end or break the line) is taken in, so that etag.c ignores the header as
 * docs/api.md says (nginx passes such a value on; a 400 would reach the
 * client, since nginx's error_page does not cover it). */
static int is_inm_byte(unsigned char ch)
{
    return ch != '\r' && ch != '\n' && ch != '\0';
}

/* Case-insensitive equality of a[0..n) and the lower-case literal b. */
static int eq_lower(const char *a, size_t n, const char *b)
{
    size_t i;

    if (strlen(b) != n)
        return 0;
    for (i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)a[i];
        if (ch >= 'A' && ch <= 'Z')
            ch = (unsigned char)(ch - 'A' + 'a');
        if (ch != (unsigned char)b[i])
            return 0;
    }
    return 1;
}

size_t fp_http_head_end(const char *buf, size_t len, size_t from)
{
    const char *p, *lf;

    /* An end may straddle the previous look: back up 3 bytes. */
    from = from > 3 ? from - 3 : 0;
    if (from >= len)
        return 0;
    p = buf + from;
    while ((lf = memchr(p, '\n', len - (size_t)(p - buf))) != NULL) {
        size_t i = (size_t)(lf - buf);

        /* A bare LF ends the head too: the parser refuses it (400) now,
         * rather than when the request time limit runs out. */
        if (i == 0 || buf[i - 1] != '\r')
            return i + 1;
        if (i >= 3 && buf[i - 2] == '\n' && buf[i - 3] == '\r')
            return i + 1;
        p = lf + 1;
    }
    return 0;
}

/* Does the list v[0..n) have the element lit (lower case, compared in any
 * case)? Elements end at a comma, a ';' (a media range's parameters), a
 * space or a tab: Connection's tokens, and Accept's media types. */
static int list_has(const char *v, size_t n, const char *lit)
{
    size_t i = 0;

    while (i < n) {
        size_t s;

        while (i < n && (v[i] == ' ' || v[i] == '\t' || v[i] == ',' || v[i] == ';'))
            i++;
        s = i;
        while (i < n && v[i] != ',' && v[i] != ';' && v[i] != ' ' && v[i] != '\t')
            i++;
        if (eq_lower(v + s, i - s, lit))
            return 1;
    }
    return 0;
}

/* The request line: METHOD SP target SP HTTP/1.x CRLF. Returns the offset
 * past it, or 0 if malformed. */
static size_t request_line(const char *buf, size_t len,
                           struct fp_http_head *out)
{
    size_t i = 0, m;

    while (i < len && buf[i] >= 'A' && buf[i] <= 'Z')
        i++;
    m = i;
    if (m == 0 || m > 16 || i >= len || buf[i] != ' ')
        return 0;
    if (m == 3 && memcmp(buf, "GET", 3) == 0)
        out->method = FP_HM_GET;
    else if (m == 4 && memcmp(buf, "HEAD", 4) == 0)
        out->method = FP_HM_HEAD;
    else if (m == 4 && memcmp(buf, "POST", 4) == 0)
        out->method = FP_HM_POST;
    else
        out->method = FP_HM_OTHER;
    i++;
    out->target = buf + i;
    while (i < len && (unsigned char)buf[i] > 0x20 && (unsigned char)buf[i] < 0x7f)
        i++;
    out->target_len = (size_t)(buf + i - out->target);
    if (out->target_len == 0 || i >= len || buf[i] != ' ')
        return 0;
    i++;
    if (len - i < 10 || memcmp(buf + i, "HTTP/1.", 7) != 0 ||
        (buf[i + 7] != '0' && buf[i + 7] != '1') ||
        buf[i + 8] != '\r' || buf[i + 9] != '\n')
        return 0;
    out->minor = buf[i + 7] - '0';
    return i + 10;
}

int fp_http_parse_head(const char *buf, size_t len, struct fp_http_head *out)
{
    size_t i, nheaders = 0;
    int close_it = 0, ka = 0, has_te = 0;

    memset(out, 0, sizeof(*out));
    if ((i = request_line(buf, len, out)) == 0)
        return 400;
    for (;;) {
        size_t name, name_len, v, ve;
        int is_inm;

        if (len - i < 2)
            return 400; /* never: the caller found the empty line */
        if (buf[i] == '\r' && buf[i + 1] == '\n') {
            i += 2;
            break;
        }
        if (++nheaders > FP_HTTP_MAX_HEADERS)
            return 431;
        name = i;
        while (i < len && is_tchar((unsigned char)buf[i]))
            i++;
        name_len = i - name;
        /* No name (this includes obs-fold's leading space), or anything
         * but a colon right after it. */
        if (name_len == 0 || i >= len || buf[i] != ':')
            return 400;
        i++;
        while (i < len && (buf[i] == ' ' || buf[i] == '\t'))
            i++;
        v = i;
        is_inm = eq_lower(buf + name, name_len, "if-none-match") ||
                 eq_lower(buf + name, name_len, "last-event-id");
        while (i < len && (is_inm ? is_inm_byte((unsigned char)buf[i])
                                  : is_vbyte((unsigned char)buf[i])))
            i++;
        if (i + 1 >= len || buf[i] != '\r' || buf[i + 1] != '\n')
            return 400;
        ve = i;
        while (ve > v && (buf[ve - 1] == ' ' || buf[ve - 1] == '\t'))
            ve--;
        i += 2;
        if (eq_lower(buf + name, name_len, "content-length")) {
            unsigned long long n = 0;
            size_t k;

            if (out->has_length || ve == v || ve - v > 18)
                return 400;
            for (k = v; k < ve; k++) {
                if (buf[k] < '0' || buf[k] > '9')
                    return 400;
                n = n * 10 + (unsigned long long)(buf[k] - '0');
            }
            out->has_length = 1;
            out->content_length = n;
        } else if (eq_lower(buf + name, name_len, "transfer-encoding")) {
            if (has_te)
                return 400;
            has_te = 1;
            if (!eq_lower(buf + v, ve - v, "chunked"))
                return 501;
            out->chunked = 1;
        } else if (eq_lower(buf + name, name_len, "connection")) {
            /* close and keep-alive count; others (upgrade, TE) not. */
            close_it |= list_has(buf + v, ve - v, "close");
            ka |= list_has(buf + v, ve - v, "keep-alive");
        } else if (eq_lower(buf + name, name_len, "x-fastpoll-route")) {
            /* nginx's route (proxy_set_header: clients cannot send it).
             * Anything but `held` on every line means "never hold". */
            enum fp_route r = eq_lower(buf + v, ve - v, "held") ? FP_ROUTE_HELD :
                              eq_lower(buf + v, ve - v, "stream") ? FP_ROUTE_STREAM :
                              FP_ROUTE_PLAIN;

            if (out->route == FP_ROUTE_NONE)
                out->route = r;
            else if (out->route != r)
                out->route = FP_ROUTE_PLAIN;
        } else if (eq_lower(buf + name, name_len, "accept")) {
            if (list_has(buf + v, ve - v, "text/event-stream"))
                out->accept_stream = 1;
        } else if (is_inm) {
            if (out->ninm < FP_HTTP_MAX_INM) {
                out->inm[out->ninm] = buf + v;
                out->inm_len[out->ninm] = ve - v;
            }
            out->ninm++;
        }
    }
    if (i != len)
        return 400; /* never: the head ends at its first empty line */
    /* Both framings: a request smuggling attempt (RFC 9112 6.3). */
    if (out->chunked && out->has_length)
        return 400;
    /* HTTP/1.0 has no chunked coding. */
    if (out->chunked && out->minor == 0)
        return 400;
    out->keep_alive = !close_it && (out->minor == 1 || ka);
    return 0;
}

enum {
    CH_SIZE,        /* hex digits of a chunk size */
    CH_EXT,         /* ;extensions, up to CR */
    CH_SIZE_LF,     /* LF after the size line's CR */
    CH_DATA,
    CH_DATA_CR,     /* CRLF after the data */
    CH_DATA_LF,
    CH_TRAILER,     /* start of a trailer line, or the final CRLF */
    CH_TRAILER_LINE,
    CH_TRAILER_LF,
    CH_END_LF,
    CH_DONE
};

void fp_chunked_init(struct fp_chunked *c)
{
    memset(c, 0, sizeof(*c));
    c->state = CH_SIZE;
}

static int hexval(unsigned char ch)
{
    if (ch >= '0' && ch <= '9')
        return ch - '0';
    if (ch >= 'a' && ch <= 'f')
        return ch - 'a' + 10;
    if (ch >= 'A' && ch <= 'F')
        return ch - 'A' + 10;
    return -1;
}

ssize_t fp_chunked_feed(struct fp_chunked *c, const char *p, size_t len,
                        int *done)
{
    size_t i = 0;

    *done = c->state == CH_DONE;
    while (i < len && c->state != CH_DONE) {
        unsigned char ch = (unsigned char)p[i];
        int h;

        switch (c->state) {
        case CH_SIZE:
            if ((h = hexval(ch)) >= 0) {
                if (++c->ndigits > 15) /* no overflow, and far past any limit */
                    return -1;
                c->left = c->left * 16 + (unsigned long long)h;
            } else if (c->ndigits > 0 && (ch == ';' || ch == '\r')) {
                c->state = ch == ';' ? CH_EXT : CH_SIZE_LF;
            } else {
                return -1; /* no digits, or not a size */
            }
            i++;
            break;
        case CH_EXT:
            if (ch == '\r')
                c->state = CH_SIZE_LF;
            else if (!is_vbyte(ch))
                return -1;
            i++;
            break;
        case CH_SIZE_LF:
            if (ch != '\n')
                return -1;
            c->ndigits = 0;
            c->state = c->left == 0 ? CH_TRAILER : CH_DATA;
            i++;
            break;
        case CH_DATA: {
            size_t n = len - i;

            if (n > c->left)
                n = (size_t)c->left;
            c->left -= n;
            c->total += n;
            i += n;
            if (c->left == 0)
                c->state = CH_DATA_CR;
            break;
        }
        case CH_DATA_CR:
            if (ch != '\r')
                return -1;
            c->state = CH_DATA_LF;
            i++;
            break;
        case CH_DATA_LF:
            if (ch != '\n')
                return -1;
            c->state = CH_SIZE;
            i++;
            break;
        case CH_TRAILER:
            if (ch == '\r')
                c->state = CH_END_LF;
            else if (is_tchar(ch))
                c->state = CH_TRAILER_LINE;
            else
                return -1;
            i++;
            break;
        case CH_TRAILER_LINE:
            if (ch == '\r')
                c->state = CH_TRAILER_LF;
            else if (!is_vbyte(ch))
                return -1;
            i++;
            break;
        case CH_TRAILER_LF:
            if (ch != '\n')
                return -1;
            c->state = CH_TRAILER;
            i++;
            break;
        case CH_END_LF:
            if (ch != '\n')
                return -1;
            c->state = CH_DONE;
            i++;
            break;
        default:
            return -1;
        }
    }
    *done = c->state == CH_DONE;
    return (ssize_t)i;
}

/* mcproto.c -- the memcached text protocol's answers (mcproto.h). Strict:
 * anything memcached would not send is FP_MCP_BAD, since a stream we
 * misread once would hand one key's value to another's request. */
#include <limits.h>
#include <stdint.h>
#include <string.h>

#include "mcproto.h"

void fp_mcp_init(struct fp_mcp *p, unsigned long long max_value)
{
    memset(p, 0, sizeof(*p));
    p->state = FP_MCP_LINE;
    p->probing = 1;
    p->max_value = max_value;
}

size_t fp_mcp_need(const struct fp_mcp *p)
{
    return p->state == FP_MCP_DATA ? p->want + 7 : 0;
}

/* Strict unsigned decimal, no sign, no spaces, bounded by max. */
static int parse_num(const char *p, size_t n, unsigned long long max,
                     unsigned long long *out)
{
    unsigned long long v = 0;
    size_t i;

    if (n == 0 || n > 20)
        return -1;
    for (i = 0; i < n; i++) {
        if (p[i] < '0' || p[i] > '9')
            return -1;
        if (v > (ULLONG_MAX - (unsigned)(p[i] - '0')) / 10)
            return -1;
        v = v * 10 + (unsigned)(p[i] - '0');
    }
    if (v > max)
        return -1;
    *out = v;
    return 0;
}

static int starts_with(const char *line, size_t n, const char *word)
{
    size_t w = strlen(word);

    return n >= w && memcmp(line, word, w) == 0 &&
           (n == w || line[w] == ' ');
}

/* Splits an answer line into at most max tokens separated by single
 * spaces. Returns the count, or -1 for more tokens, an empty one (double
 * space) or a trailing space: memcached never sends those. */
static int split_line(const char *line, size_t n, const char **tok,
                      size_t *toklen, size_t max)
{
    size_t ntok = 0, i = 0, start;

    while (i < n) {
        if (ntok == max)
            return -1;
        start = i;
        while (i < n && line[i] != ' ')
            i++;
        if (i == start)
            return -1;
        tok[ntok] = line + start;
        toklen[ntok] = i - start;
        ntok++;
        if (i < n && ++i == n)
            return -1;
    }
    return (int)ntok;
}

/* "VALUE <key> <flags> <bytes>[ <cas>]" for the head's key: 0, the value
 * length and its flags, or -1 on any mismatch. */
static int parse_value_line(const char *line, size_t n,
                            const struct fp_mcp_head *h,
                            unsigned long long *len, unsigned long long *flags)
{
    const char *tok[5];
    size_t toklen[5];
    unsigned long long cas;
    int ntok = split_line(line, n, tok, toklen, 5);

    if (ntok != 4 && ntok != 5)
        return -1;
    if (toklen[1] != h->keylen || memcmp(tok[1], h->key, h->keylen) != 0)
        return -1;
    if (parse_num(tok[2], toklen[2], UINT32_MAX, flags) != 0 ||
        parse_num(tok[3], toklen[3], FP_MCP_SKIP_MAX, len) != 0 ||
        (ntok == 5 && parse_num(tok[4], toklen[4], ULLONG_MAX, &cas) != 0))
        return -1;
    return 0;
}

/* "VA <bytes> <flags>*" (a hit) or "EN <flags>*" (a miss) for the head:
 * the k flag must give its key back (1.6.18 returns it on a miss too;
 * older 1.6 do not), f its client flags (0 if absent). 0 and the value
 * length (0 for a miss), or -1. */
static int parse_meta_line(const char *line, size_t n,
                           const struct fp_mcp_head *h, int hit,
                           unsigned long long *len, unsigned long long *flags)
{
    const char *tok[8];
    size_t toklen[8];
    int ntok = split_line(line, n, tok, toklen, 8);
    int first_flag = hit ? 2 : 1, key_ok = !hit;

    *len = 0;
    *flags = 0;
    if (ntok < 0 || (hit && (ntok < 3 ||
                             parse_num(tok[1], toklen[1], FP_MCP_SKIP_MAX, len) != 0)))
        return -1;
    for (int i = first_flag; i < ntok; i++) {
        if (tok[i][0] == 'k')
            key_ok = toklen[i] - 1 == h->keylen &&
                     memcmp(tok[i] + 1, h->key, h->keylen) == 0;
        else if (tok[i][0] == 'f' &&
                 parse_num(tok[i] + 1, toklen[i] - 1, UINT32_MAX, flags) != 0)
            return -1;
    }
    return key_ok ? 0 : -1;
}

/* One complete line (n bytes, without its CRLF) for the head request. */
static enum fp_mcp_type parse_line(struct fp_mcp *p, const char *line,
                                   size_t n, const struct fp_mcp_head *h,
                                   struct fp_mcp_event *ev)
{
    unsigned long long vlen, flags;
    int bad;

    if (h->mn) /* a probe's "mn": "MN" proves the node answers */
        return n == 2 && memcmp(line, "MN", 2) == 0 ? FP_MCP_MISS : FP_MCP_BAD;
    if (h->meta ? starts_with(line, n, "EN") &&
                      parse_meta_line(line, n, h, 0, &vlen, &flags) == 0
                : n == 3 && memcmp(line, "END", 3) == 0)
        return FP_MCP_MISS;
    if (h->meta ? starts_with(line, n, "VA") : starts_with(line, n, "VALUE")) {
        bad = h->meta ? parse_meta_line(line, n, h, 1, &vlen, &flags)
                      : parse_value_line(line, n, h, &vlen, &flags);
        if (bad != 0) {
            ev->why = h->meta ? "protocol error: bad VA line"
                              : "protocol error: bad VALUE line";
            return FP_MCP_BAD;
        }
        p->meta = h->meta;
        p->marker = flags != 0;
        if (vlen > p->max_value) {
            p->skip = vlen;
            p->state = FP_MCP_SKIP;
            ev->len = (size_t)vlen;
            return FP_MCP_TOO_BIG;
        }
        p->want = (size_t)vlen;
        p->state = FP_MCP_DATA;
        return FP_MCP_MORE;
    }
    if (starts_with(line, n, "SERVER_ERROR") ||
        starts_with(line, n, "CLIENT_ERROR")) {
        /* One line for the one command: the stream stays in sync. */
        ev->val = line;
        ev->len = n;
        return FP_MCP_REFUSED;
    }
    /* ERROR or garbage: we only send valid gets. */
    return FP_MCP_BAD;
}

/* One step: an event, or FP_MCP_MORE with *used > 0 when the step only
 * moved the state on (a VALUE line read, a skip done) and more may parse. */
static enum fp_mcp_type step(struct fp_mcp *p, const char *buf, size_t len,
                             const struct fp_mcp_head *head,
                             struct fp_mcp_event *ev, size_t *used)
{
    size_t n, need;
    const char *eol;
    enum fp_mcp_type t;

    *used = 0;
    if (p->state == FP_MCP_SKIP) {
        n = len < p->skip ? len : (size_t)p->skip;
        *used = n;
        p->skip -= n;
        if (p->skip == 0) {
            p->state = FP_MCP_DATA;
            p->want = 0;
            p->skipped = 1;
        }
        return FP_MCP_MORE;
    }
    if (p->state == FP_MCP_DATA) {
        /* classic: data \r\n END\r\n; meta: data \r\n */
        need = p->want + (p->meta ? 2 : 7);
        if (len < need)
            return FP_MCP_MORE;
        if (memcmp(buf + p->want, "\r\nEND\r\n", need - p->want) != 0) {
            ev->why = "protocol error after value";
            return FP_MCP_BAD;
        }
        ev->val = buf;
        ev->len = p->want;
        t = p->skipped ? FP_MCP_SKIPPED : p->marker ? FP_MCP_MISS : FP_MCP_HIT;
        p->state = FP_MCP_LINE;
        p->skipped = 0;
        p->marker = 0;
        p->want = 0;
        *used = need;
        return t;
    }

    if (len == 0)
        return FP_MCP_MORE;
    eol = memmem(buf, len < FP_MCP_MAX_LINE + 2 ? len : FP_MCP_MAX_LINE + 2,
                 "\r\n", 2);
    if (eol == NULL) {
        if (len < FP_MCP_MAX_LINE + 2)
            return FP_MCP_MORE;
        ev->why = "protocol error: line too long";
        return FP_MCP_BAD;
    }
    n = (size_t)(eol - buf);
    *used = n + 2;
    if (p->probing) {
        /* The first answer on a connection is to "mn". */
        p->probing = 0;
        if (n == 2 && memcmp(buf, "MN", 2) == 0)
            return FP_MCP_PROTO_META;
        if (n == 5 && memcmp(buf, "ERROR", 5) == 0)
            return FP_MCP_PROTO_CLASSIC;
        ev->why = "protocol error: unexpected answer to mn";
        return FP_MCP_BAD;
    }
    if (head == NULL) {
        ev->why = "protocol error: unsolicited answer";
        return FP_MCP_BAD;
    }
    t = parse_line(p, buf, n, head, ev);
    if (t == FP_MCP_BAD && ev->why == NULL)
        ev->why = head->mn ? "protocol error: unexpected answer to mn"
                           : "protocol error: unexpected answer";
    return t;
}

size_t fp_mcp_parse(struct fp_mcp *p, const char *buf, size_t len,
                    const struct fp_mcp_head *head, struct fp_mcp_event *ev)
{
    size_t off = 0, used;
    enum fp_mcp_type t;

    do {
        ev->val = NULL;
        ev->len = 0;
        ev->why = NULL;
        /* buf may be NULL when len is 0: no arithmetic on it then. */
        t = step(p, off == 0 ? buf : buf + off, len - off, head, ev, &used);
        off += used;
    } while (t == FP_MCP_MORE && used > 0);
    ev->type = t;
    return off;
}

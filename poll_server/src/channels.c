/* channels.c -- `ch`, channel keys and the composed answer (channels.h,
 * docs/channels.md). The value is decoded twice: a first pass finds a
 * malformed escape and counts the names (the checks that come before the
 * names'), a second decodes into out->value and checks each name as it
 * ends. Every name before the first bad one is at most 64 bytes and there
 * are at most max of them, so a valid value always fits its buffer. Too
 * many names (up to FP_MAX_CHANNELS) are still decoded: the app, with a
 * larger max, may have signed them, and a signed refusal goes to it. */
#include <string.h>
#include <strings.h>

#include "channels.h"
#include "keys.h"

static int is_name_byte(int c)
{
    return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') ||
           (c >= '0' && c <= '9') || c == '_' || c == '.' || c == '-';
}

int fp_ch_name_valid(const char *name, size_t len)
{
    if (len == 0 || len > FP_MAX_CHANNEL_NAME)
        return 0;
    for (size_t i = 0; i < len; i++)
        if (!is_name_byte((unsigned char)name[i]))
            return 0;
    return 1;
}

/* Finds the one `ch` of the query: *val, *vlen (empty without '='). Returns
 * FP_CH_NONE, FP_CH_OK or FP_CH_TWICE. */
static int find_ch(const char *target, size_t len, const char **val,
                   size_t *vlen)
{
    const char *q = memchr(target, '?', len), *end = target + len;
    int found = 0;

    if (q == NULL)
        return FP_CH_NONE;
    for (q++;;) {
        const char *amp = memchr(q, '&', (size_t)(end - q));
        const char *pe = amp != NULL ? amp : end;
        const char *eq = memchr(q, '=', (size_t)(pe - q));
        const char *ne = eq != NULL ? eq : pe;

        /* The raw name, never decoded, in any ASCII case (as wait). */
        if (ne - q == 2 && strncasecmp(q, "ch", 2) == 0) {
            if (found)
                return FP_CH_TWICE;
            found = 1;
            *val = eq != NULL ? eq + 1 : pe;
            *vlen = eq != NULL ? (size_t)(pe - eq - 1) : 0;
        }
        if (amp == NULL)
            break;
        q = amp + 1;
    }
    return found ? FP_CH_OK : FP_CH_NONE;
}

/* The name value[start..start+nlen) against the one before it (prev, plen):
 * 0 if it is fine, else the refusal. */
static int check_name(const struct fp_ch *out, size_t start, size_t nlen,
                      int bad_byte, int has_prev, size_t prev, size_t plen)
{
    int c;

    if (nlen == 0)
        return FP_CH_EMPTY_NAME;
    if (bad_byte || nlen > FP_MAX_CHANNEL_NAME)
        return FP_CH_BAD_NAME;
    if (!has_prev)
        return 0;
    c = memcmp(out->value + prev, out->value + start, plen < nlen ? plen : nlen);
    if (c > 0 || (c == 0 && plen >= nlen))
        return FP_CH_ORDER;
    return 0;
}

int fp_ch_parse(const char *target, size_t len, unsigned max, struct fp_ch *out)
{
    const char *val = NULL;
    size_t vlen = 0, i, o = 0, names = 1, start = 0, cur = 0, prev = 0;
    int rc, err = 0, bad_byte = 0, fits = 1;

    out->len = 0;
    out->n = 0;
    if ((rc = find_ch(target, len, &val, &vlen)) != FP_CH_OK)
        return rc;
    for (i = 0; i < vlen;) {
        int c = key_decode_byte(val, vlen, &i, 1);
        if (c < 0)
            return FP_CH_ESCAPE;
        names += c == ',';
    }
    if (vlen == 0)
        return FP_CH_EMPTY;
    if (names > FP_MAX_CHANNELS)
        return FP_CH_TOO_MANY;
    /* Refused before any name's check, but decoded for the signature. */
    if (names > max)
        err = FP_CH_TOO_MANY;
    for (i = 0;;) {
        int at_end = i >= vlen;
        int c = at_end ? ',' : key_decode_byte(val, vlen, &i, 1);

        if (c == ',') {
            /* A name ends: the first refusal is kept, in the names' order. */
            if (err == 0)
                err = check_name(out, start, cur, bad_byte, out->n > 0, prev,
                                 out->n > 0 ? out->nlen[out->n - 1] : 0);
            if (err == 0) {
                out->off[out->n] = (uint16_t)start;
                out->nlen[out->n] = (uint8_t)cur;
                prev = start;
                out->n++;
            }
            if (at_end)
                break;
            bad_byte = 0;
            cur = 0;
        } else {
            bad_byte |= !is_name_byte(c);
            cur++;
        }
        /* The decoded value, kept while it fits (a signature covers it). */
        if (fits && o < FP_CH_VALUE_MAX)
            out->value[o++] = (char)c;
        else
            fits = 0;
        if (c == ',')
            start = o;
    }
    out->len = fits ? o : 0;
    if (err != 0) {
        out->n = 0;
        return err;
    }
    return FP_CH_OK;
}

const char *fp_ch_strerror(int result)
{
    switch (result) {
    case FP_CH_NONE: return "no ch";
    case FP_CH_OK: return "ok";
    case FP_CH_TWICE: return "ch given more than once";
    case FP_CH_ESCAPE: return "ch has a malformed %-escape";
    case FP_CH_EMPTY: return "ch is empty";
    case FP_CH_TOO_MANY: return "ch names more channels than [channels] max";
    case FP_CH_EMPTY_NAME: return "ch has an empty channel name";
    case FP_CH_BAD_NAME:
        return "a channel name is 1-64 bytes of A-Z a-z 0-9 _ . -";
    case FP_CH_ORDER:
        return "ch must list channels in strictly ascending byte order, "
               "each once";
    default: return "?";
    }
}

ssize_t fp_ch_key(const char *prefix, const char *name, size_t nlen, char *out,
                  size_t cap)
{
    size_t plen = strlen(prefix);

    if (plen + 1 + nlen + 1 > cap)
        return -1;
    memcpy(out, prefix, plen);
    out[plen] = '#';
    memcpy(out + plen + 1, name, nlen);
    out[plen + 1 + nlen] = '\0';
    return (ssize_t)(plen + 1 + nlen);
}

/* Output cursor: counts every byte, writes those that fit. */
struct cbuf {
    char *p;
    size_t len, cap;
};

static void put(struct cbuf *b, const char *s, size_t n)
{
    if (b->p != NULL && n <= b->cap && b->len <= b->cap - n)
        memcpy(b->p + b->len, s, n);
    b->len += n;
}

static void put_value(struct cbuf *b, const struct fp_ch_part *p)
{
    if (p->len == 0)
        put(b, "null", 4);
    else
        put(b, p->value, p->len);
}

size_t fp_ch_compose(const struct fp_ch_part *user,
                     const struct fp_ch_part *chans, size_t n, char *out,
                     size_t cap)
{
    struct cbuf b = { out, 0, cap };

    put(&b, "{\"user\":", 8);
    put_value(&b, user);
    put(&b, ",\"channels\":{", 13);
    for (size_t i = 0; i < n; i++) {
        if (i > 0)
            put(&b, ",", 1);
        put(&b, "\"", 1);
        put(&b, chans[i].name, chans[i].nlen);
        put(&b, "\":", 2);
        put_value(&b, &chans[i]);
    }
    put(&b, "}}", 2);
    return b.len;
}

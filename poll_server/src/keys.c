/* keys.c -- the key scheme of docs/keys.md, step by step. One pass over the
 * path (decode, check, encode straight into out), one pass over the query to
 * find the keyed parameters, then their values are decoded, checked and
 * encoded in the order of the (sorted) names. Bounded by outcap throughout;
 * no allocation. */
#include <string.h>

#include "keys.h"

/* Output cursor: writes fail (and stay failed) once cap is reached. */
struct kbuf {
    char *p;
    size_t len, cap; /* cap excludes the NUL */
};

static int put(struct kbuf *b, char c)
{
    if (b->len >= b->cap)
        return -1;
    b->p[b->len++] = c;
    return 0;
}

static int puts_n(struct kbuf *b, const char *s, size_t n)
{
    if (n > b->cap - b->len)
        return -1;
    memcpy(b->p + b->len, s, n);
    b->len += n;
    return 0;
}

static int hexval(unsigned char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

int key_decode_byte(const char *s, size_t n, size_t *i, int plus)
{
    unsigned char c = (unsigned char)s[*i];
    int hi, lo;

    if (c == '%') {
        if (n - *i < 3)
            return -1;
        hi = hexval((unsigned char)s[*i + 1]);
        lo = hexval((unsigned char)s[*i + 2]);
        if (hi < 0 || lo < 0)
            return -1;
        *i += 3;
        return hi << 4 | lo;
    }
    *i += 1;
    if (c == '+' && plus)
        return ' ';
    return c;
}

static int is_unreserved(unsigned char c)
{
    return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') ||
           (c >= '0' && c <= '9') || c == '-' || c == '.' || c == '_' ||
           c == '~';
}

static int bad_byte(unsigned char c)
{
    return c <= 0x20 || c == 0x7F;
}

static int put_encoded(struct kbuf *b, unsigned char c, int keep_slash)
{
    static const char hex[] = "0123456789ABCDEF";

    if (is_unreserved(c) || (keep_slash && c == '/'))
        return put(b, (char)c);
    if (put(b, '%') < 0 || put(b, hex[c >> 4]) < 0 || put(b, hex[c & 15]) < 0)
        return -1;
    return 0;
}

/* Step 3 and 5 for the path: decode, refuse control bytes and dot segments,
 * encode. */
static int encode_path(struct kbuf *b, const char *s, size_t n)
{
    size_t i = 0, seglen = 0;
    int seg_dots = 1; /* the current segment is only dots so far */

    while (i < n) {
        int c = key_decode_byte(s, n, &i, 0);
        if (c < 0 || bad_byte((unsigned char)c))
            return -1;
        if (c == '/') {
            if (seg_dots && (seglen == 1 || seglen == 2))
                return -1;
            seglen = 0;
            seg_dots = 1;
        } else {
            seglen++;
            if (c != '.')
                seg_dots = 0;
        }
        if (put_encoded(b, (unsigned char)c, 1) < 0)
            return -1;
    }
    if (seg_dots && (seglen == 1 || seglen == 2))
        return -1;
    return 0;
}

/* Step 4 and 5 for a keyed value: form-decode, refuse control bytes (so also
 * '+'), encode with '/' escaped. */
static int encode_value(struct kbuf *b, const char *s, size_t n)
{
    size_t i = 0;

    while (i < n) {
        int c = key_decode_byte(s, n, &i, 1);
        if (c < 0 || bad_byte((unsigned char)c))
            return -1;
        if (put_encoded(b, (unsigned char)c, 0) < 0)
            return -1;
    }
    return 0;
}

/* Index of the keyed parameter named by the raw (form-encoded) name, or -1
 * if it names none, malformed escapes included. */
static int match_param(char *const *params, size_t nparams,
                       const char *s, size_t n)
{
    char name[FP_MAX_PARAM_LEN];
    size_t i = 0, len = 0;

    if (n == 0) /* "=x": no parameter has an empty name */
        return -1;
    while (i < n) {
        int c = key_decode_byte(s, n, &i, 1);
        if (c < 0 || len == sizeof(name))
            return -1;
        name[len++] = (char)c;
    }
    for (size_t k = 0; k < nparams; k++)
        if (strlen(params[k]) == len && memcmp(params[k], name, len) == 0)
            return (int)k;
    return -1;
}

ssize_t key_derive(const char *prefix, char *const *params, size_t nparams,
                   const char *target, size_t target_len,
                   char *out, size_t outcap)
{
    const char *val[FP_MAX_PARAMS];
    size_t vlen[FP_MAX_PARAMS];
    unsigned char seen[FP_MAX_PARAMS] = { 0 };
    const char *query = NULL, *q;
    size_t pathlen, qlen = 0;
    struct kbuf b;
    int first = 1;

    if (out == NULL || outcap == 0 || nparams > FP_MAX_PARAMS)
        return -1;
    out[0] = '\0';
    b.p = out;
    b.len = 0;
    b.cap = outcap - 1 < FP_MAX_KEY_LEN ? outcap - 1 : FP_MAX_KEY_LEN;

    /* Step 1: origin-form only, no fragment. */
    if (target == NULL || target_len == 0 || target[0] != '/' ||
        memchr(target, '#', target_len) != NULL)
        return -1;

    /* Step 2: split at the first '?'. */
    q = memchr(target, '?', target_len);
    if (q != NULL) {
        pathlen = (size_t)(q - target);
        query = q + 1;
        qlen = target_len - pathlen - 1;
    } else {
        pathlen = target_len;
    }

    if (puts_n(&b, prefix, strlen(prefix)) < 0 ||
        encode_path(&b, target, pathlen) < 0)
        return -1;

    /* Step 4: find the keyed parameters; everything else is ignored. */
    for (size_t i = 0; i < qlen;) {
        const char *piece = query + i, *amp, *eq;
        size_t plen, nlen;
        int k;

        amp = memchr(piece, '&', qlen - i);
        plen = amp ? (size_t)(amp - piece) : qlen - i;
        i += plen + 1;
        if (plen == 0)
            continue;
        eq = memchr(piece, '=', plen);
        nlen = eq ? (size_t)(eq - piece) : plen;
        k = match_param(params, nparams, piece, nlen);
        if (k < 0)
            continue;
        if (seen[k])
            return -1; /* a repeat: app and server could disagree */
        seen[k] = 1;
        val[k] = eq ? eq + 1 : piece + plen;
        vlen[k] = eq ? plen - nlen - 1 : 0;
    }

    /* Step 6: pairs in bytewise order of the names (params are sorted). */
    for (size_t k = 0; k < nparams; k++) {
        if (!seen[k])
            continue;
        if (put(&b, first ? '?' : '&') < 0 ||
            puts_n(&b, params[k], strlen(params[k])) < 0 ||
            put(&b, '=') < 0 || encode_value(&b, val[k], vlen[k]) < 0)
            return -1;
        first = 0;
    }

    /* Step 7 is b.cap: nothing longer than FP_MAX_KEY_LEN was written. */
    out[b.len] = '\0';
    return (ssize_t)b.len;
}

/* etag.c -- the ETag and If-None-Match (etag.h).
 *
 * The tag is XXH3-64 of the answer's bytes, the same the app computes, so
 * an answer has one tag whoever served it. Since every tag we give out is
 * 16 lowercase hex digits, an If-None-Match is kept as the 64-bit values
 * of its tags of that form: any other tag can never match one of ours, and
 * the parsed form outlives the request head's bytes (a held poll). */
#include <string.h>

#include <xxhash.h>

#include "etag.h"

uint64_t fp_etag_of(const char *body, size_t len)
{
    return (uint64_t)XXH3_64bits(body, len);
}

void fp_etag_format(uint64_t tag, char out[18])
{
    static const char hex[] = "0123456789abcdef";

    out[0] = '"';
    for (int i = 0; i < 16; i++)
        out[1 + i] = hex[(tag >> (60 - 4 * i)) & 0xf];
    out[17] = '"';
}

/* RFC 9110 8.8.3: etagc = %x21 / %x23-7E / obs-text. */
static int is_etagc(unsigned char ch)
{
    return ch == 0x21 || (ch >= 0x23 && ch <= 0x7e) || ch >= 0x80;
}

static int hexval(unsigned char ch)
{
    if (ch >= '0' && ch <= '9')
        return ch - '0';
    if (ch >= 'a' && ch <= 'f')
        return ch - 'a' + 10;
    return -1;
}

/* One list element p[0..n) (not empty after trimming): an entity tag or
 * not. Returns 0 and, for a 16-lowercase-hex opaque tag, adds it to out;
 * -1 if the element is not an entity tag. */
static int one_tag(const char *p, size_t n, struct fp_inm *out)
{
    size_t i = 0, j;
    uint64_t v = 0;

    if (n >= 2 && p[0] == 'W' && p[1] == '/')
        i = 2;
    if (n - i < 2 || p[i] != '"' || p[n - 1] != '"')
        return -1;
    for (j = i + 1; j < n - 1; j++)
        if (!is_etagc((unsigned char)p[j]))
            return -1;
    if (n - i - 2 != 16)
        return 0; /* a tag, but never one of ours */
    for (j = i + 1; j < n - 1; j++) {
        int h = hexval((unsigned char)p[j]);
        if (h < 0)
            return 0;
        v = (v << 4) | (uint64_t)h;
    }
    if (out->ntags < FP_INM_TAGS)
        out->tags[out->ntags++] = v;
    return 0;
}

/* One header line's list into out. Returns the number of elements, or -1
 * if one is not an entity tag; *star is set when an element is `*`. Split
 * at every comma, as the app does (a tag holding a comma is malformed to
 * both). */
static int one_line(const char *p, size_t n, struct fp_inm *out, int *star)
{
    size_t i = 0;
    int count = 0;

    while (i <= n) {
        const char *c = memchr(p + i, ',', n - i);
        size_t s = i, e = c != NULL ? (size_t)(c - p) : n;

        i = e + 1;
        while (s < e && (p[s] == ' ' || p[s] == '\t'))
            s++;
        while (e > s && (p[e - 1] == ' ' || p[e - 1] == '\t'))
            e--;
        if (e == s)
            continue; /* RFC 9110 5.6.1: empty elements are ignored */
        count++;
        if (e - s == 1 && p[s] == '*')
            *star = 1;
        else if (one_tag(p + s, e - s, out) < 0)
            return -1;
    }
    return count;
}

int fp_inm_parse(const char *const *lines, const size_t *lens, size_t nlines,
                 struct fp_inm *out)
{
    size_t total = 0;
    int count = 0, star = 0;

    memset(out, 0, sizeof(*out));
    if (nlines == 0)
        return 0;
    for (size_t k = 0; k < nlines; k++)
        total += lens[k] + (k > 0 ? 2 : 0);
    if (total == 0 || total > FP_INM_MAX)
        return 0;
    for (size_t k = 0; k < nlines; k++) {
        int n = one_line(lines[k], lens[k], out, &star);
        if (n < 0)
            goto ignored;
        count += n;
    }
    /* `*` is valid alone only: the whole value, one line. */
    if (count == 0 || (star && (count > 1 || nlines > 1 ||
                                lens[0] != 1 || lines[0][0] != '*')))
        goto ignored;
    out->star = star;
    return 1;
ignored:
    memset(out, 0, sizeof(*out));
    return 0;
}

int fp_inm_match(const struct fp_inm *inm, uint64_t tag)
{
    if (inm->star)
        return 1;
    for (unsigned i = 0; i < inm->ntags; i++)
        if (inm->tags[i] == tag)
            return 1;
    return 0;
}

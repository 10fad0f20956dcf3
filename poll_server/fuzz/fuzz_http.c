/* fuzz_http.c -- libFuzzer target: the request parser (httpparse.c) as
 * conn.c drives it: the end of a head searched for as bytes arrive, the head
 * parsed, a chunked body fed in pieces.
 *
 * Input: one byte choosing the piece size the bytes arrive in, then the
 * stream. Each piece is copied into a buffer of exactly its size, so that
 * ASan sees any read past what has arrived. Properties checked, beyond "no
 * crash, no sanitizer report":
 * - the head's end found piece by piece is where a search of the whole
 *   stream finds it;
 * - a parsed head has its target inside the head, of visible ASCII only
 *   (no space, control or 8-bit byte: nothing a cache command could split
 *   on), HTTP/1.0 or 1.1, never both Content-Length and chunked, no chunked
 *   on 1.0;
 * - a refusal is 400, 431 or 501;
 * - a chunked body fed in pieces ends (or fails) where one call over the
 *   whole of it does, and counts the same data bytes. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../src/etag.h"
#include "../src/httpparse.h"
#include "../src/wait.h"

static void check(int ok, const char *what, size_t size)
{
    if (ok)
        return;
    fprintf(stderr, "property failed: %s (%zu bytes of input)\n", what, size);
    abort();
}

/* Feeds a chunked body in pieces of `piece` bytes; returns the bytes
 * consumed, or -1 on a framing error. */
static ssize_t feed(const uint8_t *p, size_t len, size_t piece, int *done,
                    unsigned long long *total)
{
    struct fp_chunked c;
    size_t off = 0;

    fp_chunked_init(&c);
    *done = 0;
    while (off < len && !*done) {
        size_t n = len - off < piece ? len - off : piece;
        char *copy = malloc(n);
        ssize_t got;

        if (copy == NULL)
            abort();
        memcpy(copy, p + off, n);
        got = fp_chunked_feed(&c, copy, n, done);
        free(copy);
        if (got < 0)
            return -1;
        check((size_t)got <= n, "chunked: consumed more than given", len);
        check((size_t)got == n || *done, "chunked: stopped short of the end", len);
        off += (size_t)got;
    }
    *total = c.total;
    return (ssize_t)off;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct fp_http_head hd;
    size_t piece, have, scanned = 0, end = 0, whole;
    char *buf;
    int st;

    if (size < 1 || size > 65536)
        return 0;
    piece = (size_t)data[0] % 64 + 1;
    data++;
    size--;

    /* The head's end, as bytes arrive. */
    for (have = 0; have < size && end == 0;) {
        have += size - have < piece ? size - have : piece;
        if ((buf = malloc(have)) == NULL)
            abort();
        memcpy(buf, data, have);
        end = fp_http_head_end(buf, have, scanned);
        free(buf);
        scanned = have;
    }
    if ((buf = malloc(size > 0 ? size : 1)) == NULL)
        abort();
    memcpy(buf, data, size);
    whole = fp_http_head_end(buf, size, 0);
    free(buf);
    check(end == whole, "head end piecewise differs from the whole", size);
    if (end == 0)
        return 0;

    if ((buf = malloc(end)) == NULL)
        abort();
    memcpy(buf, data, end);
    st = fp_http_parse_head(buf, end, &hd);
    if (st != 0) {
        check(st == 400 || st == 431 || st == 501, "unexpected refusal", size);
    } else {
        size_t i;

        check(hd.target >= buf && hd.target + hd.target_len <= buf + end &&
              hd.target_len > 0, "target outside the head", size);
        for (i = 0; i < hd.target_len; i++)
            check((unsigned char)hd.target[i] > 0x20 &&
                  (unsigned char)hd.target[i] < 0x7f, "target byte", size);
        check(hd.minor == 0 || hd.minor == 1, "version", size);
        check(!(hd.chunked && hd.has_length), "two framings", size);
        check(!(hd.chunked && hd.minor == 0), "chunked on 1.0", size);
        /* What http.c does next with the head: If-None-Match and wait=. */
        if (hd.ninm <= FP_HTTP_MAX_INM) {
            struct fp_inm inm;
            size_t k;

            for (k = 0; k < hd.ninm; k++)
                check(hd.inm[k] >= buf && hd.inm[k] + hd.inm_len[k] <= buf + end,
                      "If-None-Match outside the head", size);
            if (fp_inm_parse(hd.inm, hd.inm_len, hd.ninm, &inm))
                check(inm.ntags <= FP_INM_TAGS && (!inm.star || inm.ntags == 0),
                      "If-None-Match parsed", size);
            else
                check(!fp_inm_match(&inm, 0) && inm.ntags == 0, "ignored matches", size);
        }
        check(fp_wait_param(hd.target, hd.target_len, 30) <= 30, "wait clamped", size);
    }
    free(buf);

    if (st == 0 && hd.chunked) {
        int d1, d2;
        unsigned long long t1, t2;
        ssize_t a = feed(data + end, size - end, piece, &d1, &t1);
        ssize_t b = feed(data + end, size - end, size - end + 1, &d2, &t2);

        check(a == b, "chunked: pieces and whole end differently", size);
        if (a >= 0)
            check(d1 == d2 && t1 == t2, "chunked: pieces and whole differ", size);
    }
    return 0;
}

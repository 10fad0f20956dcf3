/* fuzz_mcproto.c -- libFuzzer target: the memcached answer parser
 * (mcproto.c) as cache_memcached.c drives it: bytes arrive in pieces, what
 * was not consumed is given again with what follows, and each event pops
 * the request it answers.
 *
 * Input: a byte choosing the connection (bit 0: gets sent as "mg", bit 1:
 * the opening "mn" not answered yet, bit 2: the requests are probes' "mn",
 * bits 3-4: the value limit, bits 5-7: how many requests wait, 7 for no
 * limit), a byte choosing the piece size, then the server's stream. Each
 * piece is copied into a buffer of exactly its size, so that ASan sees any
 * read past what has arrived. Properties checked, beyond "no crash, no
 * sanitizer report":
 * - consumed <= the bytes given; a value lies inside them and is no longer
 *   than the limit; what the driver must make room for is bounded;
 * - the stream fed whole, in pieces and byte by byte gives the same events
 *   at the same stream offsets (values at the same place and length), and
 *   stops at the same offset. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../src/mcproto.h"

#define MAX_EVENTS 32768 /* each event takes 4 bytes or more */

struct rec {
    enum fp_mcp_type type;
    size_t end;                 /* stream offset after the event */
    size_t val_off, len;        /* value or line, as stream offsets */
    const char *why;
};

struct trace {
    struct rec ev[MAX_EVENTS];
    size_t n, end;
};

static struct trace whole, pieces, bytes;

static void check(int ok, const char *what, size_t size)
{
    if (ok)
        return;
    fprintf(stderr, "property failed: %s (%zu bytes of input)\n", what, size);
    abort();
}

static const unsigned long long limits[4] = { 0, 4, 64, 1024 * 1024 };

/* Feeds the stream `piece` bytes at a time (0: whole) into t. */
static void feed(const uint8_t *cfg, const uint8_t *s, size_t len, size_t piece,
                 struct trace *t)
{
    struct fp_mcp p;
    struct fp_mcp_event ev;
    struct fp_mcp_head head = { "k1", 2, cfg[0] & 1, (cfg[0] & 5) == 5 };
    unsigned waiting = cfg[0] >> 5;
    unsigned long long max = limits[(cfg[0] >> 3) & 3];
    size_t off = 0, have = piece == 0 ? len : 0, n, used;
    char *copy;

    if (head.mn) {
        head.key = "fastpoll:probe";
        head.keylen = 14;
    }
    fp_mcp_init(&p, max);
    p.probing = (cfg[0] & 2) != 0;
    t->n = 0;
    for (;;) {
        n = have - off;
        if ((copy = malloc(n ? n : 1)) == NULL)
            abort();
        memcpy(copy, s + off, n);
        used = fp_mcp_parse(&p, n ? copy : NULL, n,
                            waiting > 0 ? &head : NULL, &ev);
        check(used <= n, "consumed more than given", len);
        check(fp_mcp_need(&p) <= max + 7, "room asked for over the limit", len);
        if (ev.type == FP_MCP_HIT || ev.type == FP_MCP_REFUSED ||
            ev.type == FP_MCP_SKIPPED) {
            check(ev.val >= copy && ev.len <= n &&
                  (size_t)(ev.val - copy) <= n - ev.len, "value outside the input",
                  len);
            check(ev.type != FP_MCP_HIT || ev.len <= max, "value over the limit",
                  len);
        }
        if (ev.type != FP_MCP_MORE) {
            struct rec *r;

            check(t->n < MAX_EVENTS, "too many events", len);
            r = &t->ev[t->n++];
            r->type = ev.type;
            r->end = off + used;
            r->len = ev.len;
            r->val_off = ev.val != NULL ? off + (size_t)(ev.val - copy) : 0;
            r->why = ev.why;
        }
        free(copy);
        off += used;
        if (ev.type == FP_MCP_BAD)
            break;
        if (ev.type == FP_MCP_MORE) {
            if (have == len)
                break;
            have = len - have < piece ? len : have + piece;
            continue;
        }
        check(used > 0, "an event that used nothing", len);
        if (ev.type == FP_MCP_HIT || ev.type == FP_MCP_MISS ||
            ev.type == FP_MCP_SKIPPED || ev.type == FP_MCP_REFUSED) {
            if (waiting > 0 && waiting < 7)
                waiting--;
        }
    }
    t->end = off;
}

static void same(const struct trace *a, const struct trace *b, size_t size)
{
    check(a->n == b->n, "pieces: another number of events", size);
    check(a->end == b->end, "pieces: stopped elsewhere", size);
    for (size_t i = 0; i < a->n; i++) {
        const struct rec *x = &a->ev[i], *y = &b->ev[i];

        check(x->type == y->type && x->end == y->end && x->len == y->len &&
              x->val_off == y->val_off &&
              (x->why == NULL) == (y->why == NULL) &&
              (x->why == NULL || strcmp(x->why, y->why) == 0),
              "pieces: another event", size);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 2 || size > 65536)
        return 0;
    feed(data, data + 2, size - 2, 0, &whole);
    feed(data, data + 2, size - 2, (size_t)data[1] % 64 + 1, &pieces);
    same(&whole, &pieces, size);
    if (size <= 4096) {
        feed(data, data + 2, size - 2, 1, &bytes);
        same(&whole, &bytes, size);
    }
    return 0;
}

/* test_mcproto.c -- the memcached answer parser (mcproto.c): what memcached
 * sends to "mn", "get" and "mg" is read right, in one piece or byte by
 * byte; anything else is refused with the reason cache_memcached.c logs. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <string.h>

#include "../src/mcproto.h"

static const struct fp_mcp_head classic = { "k1", 2, 0, 0 };
static const struct fp_mcp_head meta = { "k1", 2, 1, 0 };
static const struct fp_mcp_head mn = { "fastpoll:probe", 14, 1, 1 };

/* The events of a stream that arrives `piece` bytes at a time (0: all at
 * once), as cache_memcached.c reads it: unconsumed bytes are given again
 * with what follows. One word each, joined by spaces; stops at BAD. */
static const char *run(const char *in, size_t len, const struct fp_mcp_head *h,
                       int probing, unsigned long long max, size_t piece)
{
    static char out[1024];
    static const char *names[] = { "MORE", "META", "CLASSIC", "TOO_BIG", "HIT",
                                   "MISS", "SKIPPED", "REFUSED", "BAD" };
    struct fp_mcp p;
    struct fp_mcp_event ev;
    size_t off = 0, have = piece == 0 ? len : 0, used = 0;

    fp_mcp_init(&p, max);
    p.probing = probing;
    out[0] = '\0';
    for (;;) {
        off += fp_mcp_parse(&p, in + off, have - off, h, &ev);
        assert_true(off <= have);
        if (ev.type == FP_MCP_MORE) {
            if (have == len)
                break;
            have = have + piece < len ? have + piece : len;
            continue;
        }
        used += (size_t)snprintf(out + used, sizeof(out) - used, "%s%s",
                                 used ? " " : "", names[ev.type]);
        if (ev.type == FP_MCP_HIT || ev.type == FP_MCP_REFUSED)
            used += (size_t)snprintf(out + used, sizeof(out) - used, "(%.*s)",
                                     (int)ev.len, ev.val);
        else if (ev.type == FP_MCP_TOO_BIG)
            used += (size_t)snprintf(out + used, sizeof(out) - used, "(%zu)",
                                     ev.len);
        else if (ev.type == FP_MCP_BAD) {
            (void)snprintf(out + used, sizeof(out) - used, "(%s)", ev.why);
            break;
        }
    }
    return out;
}

/* The same events in one piece and byte by byte. */
static void expect(const char *in, const struct fp_mcp_head *h, int probing,
                   unsigned long long max, const char *want)
{
    assert_string_equal(run(in, strlen(in), h, probing, max, 0), want);
    assert_string_equal(run(in, strlen(in), h, probing, max, 1), want);
    assert_string_equal(run(in, strlen(in), h, probing, max, 7), want);
}

static void test_opening_mn(void **state)
{
    (void)state;
    expect("MN\r\n", NULL, 1, 1024, "META");
    expect("ERROR\r\nEND\r\n", &classic, 1, 1024, "CLASSIC MISS");
    expect("MN \r\n", NULL, 1, 1024, "BAD(protocol error: unexpected answer to mn)");
    expect("MN\r\n", NULL, 0, 1024, "BAD(protocol error: unsolicited answer)");
}

static void test_classic(void **state)
{
    (void)state;
    expect("VALUE k1 0 5\r\nhello\r\nEND\r\nEND\r\n", &classic, 0, 1024,
           "HIT(hello) MISS");
    expect("VALUE k1 0 0 123\r\n\r\nEND\r\n", &classic, 0, 1024, "HIT()");
    /* Client flags not 0: the app's marker of a key it cannot cache, a miss
     * (its data read, the stream in step for the next answer). */
    expect("VALUE k1 4294967295 0 123\r\n\r\nEND\r\n", &classic, 0, 1024, "MISS");
    expect("VALUE k1 1 2\r\nok\r\nEND\r\nVALUE k1 0 2\r\nok\r\nEND\r\n", &classic, 0,
           1024, "MISS HIT(ok)");
    /* Binary-safe: the value may hold the terminator. */
    expect("VALUE k1 0 7\r\n\r\nEND\r\n\r\nEND\r\n", &classic, 0, 1024,
           "HIT(\r\nEND\r\n)");
    expect("VALUE k1 0 5\r\nhello\r\nEnD\r\n", &classic, 0, 1024,
           "BAD(protocol error after value)");
}

/* Another key, a flags word over 32 bits, a double space, a sign, a
 * length over memcached's 1 GiB cap, a trailing space. */
static void test_bad_value_lines(void **state)
{
    static const char *bad[] = {
        "VALUE k2 0 5\r\nhello\r\nEND\r\n", "VALUE k1 4294967296 5\r\n",
        "VALUE k1  0 5\r\n", "VALUE k1 0 -5\r\n", "VALUE k1 0 1073741825\r\n",
        "VALUE k1 0 5 \r\n", "VALUE k1 0\r\n",
    };

    (void)state;
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        expect(bad[i], &classic, 0, 1024, "BAD(protocol error: bad VALUE line)");
}

static void test_classic_garbage(void **state)
{
    (void)state;
    expect("ERROR\r\n", &classic, 0, 1024, "BAD(protocol error: unexpected answer)");
    /* A meta answer to a classic get is garbage. */
    expect("EN\r\n", &classic, 0, 1024, "BAD(protocol error: unexpected answer)");
}

static void test_meta(void **state)
{
    (void)state;
    expect("VA 5 kk1\r\nhello\r\nEN\r\nEN kk1\r\n", &meta, 0, 1024,
           "HIT(hello) MISS MISS");
    expect("VA 5 f0 kk1\r\nhello\r\n", &meta, 0, 1024, "HIT(hello)");
    expect("VA 0 kk1 f1\r\n\r\nVA 2 f0 kk1\r\nok\r\n", &meta, 0, 1024, "MISS HIT(ok)");
    expect("VA 2 f4294967295 kk1\r\nok\r\n", &meta, 0, 1024, "MISS");
    expect("VA 2 kk1 fx\r\nok\r\n", &meta, 0, 1024, "BAD(protocol error: bad VA line)");
    expect("VA 2 kk1 f4294967296\r\nok\r\n", &meta, 0, 1024,
           "BAD(protocol error: bad VA line)");
    expect("VA 5\r\nhello\r\n", &meta, 0, 1024, "BAD(protocol error: bad VA line)");
    expect("VA 5 kk2\r\nhello\r\n", &meta, 0, 1024, "BAD(protocol error: bad VA line)");
    expect("EN kk2\r\n", &meta, 0, 1024, "BAD(protocol error: unexpected answer)");
    expect("VA 5 kk1\r\nhelloEN\r\n", &meta, 0, 1024,
           "BAD(protocol error after value)");
    expect("END\r\n", &meta, 0, 1024, "BAD(protocol error: unexpected answer)");
}

static void test_probe_mn(void **state)
{
    (void)state;
    expect("MN\r\n", &mn, 0, 1024, "MISS");
    expect("EN\r\n", &mn, 0, 1024, "BAD(protocol error: unexpected answer to mn)");
}

static void test_refused(void **state)
{
    (void)state;
    expect("SERVER_ERROR out of memory\r\nCLIENT_ERROR bad\r\nSERVER_ERRORS\r\n",
           &classic, 0, 1024,
           "REFUSED(SERVER_ERROR out of memory) REFUSED(CLIENT_ERROR bad) "
           "BAD(protocol error: unexpected answer)");
}

/* Over max_value: read past as it comes, never kept, trailer checked. */
static void test_too_big(void **state)
{
    (void)state;
    expect("VALUE k1 0 10\r\n0123456789\r\nEND\r\nVALUE k1 0 4\r\nabcd\r\nEND\r\n",
           &classic, 0, 4, "TOO_BIG(10) SKIPPED HIT(abcd)");
    expect("VA 10 kk1\r\n0123456789\r\n", &meta, 0, 4, "TOO_BIG(10) SKIPPED");
    expect("VALUE k1 0 10\r\n0123456789\r\nXND\r\n", &classic, 0, 4,
           "TOO_BIG(10) BAD(protocol error after value)");
}

static void test_line_limit(void **state)
{
    char line[FP_MCP_MAX_LINE + 3];
    struct fp_mcp p;
    struct fp_mcp_event ev;

    (void)state;
    memset(line, 'x', sizeof(line));
    fp_mcp_init(&p, 1024);
    p.probing = 0;
    /* 513 bytes with no CRLF may still end in one: wait. */
    assert_int_equal(fp_mcp_parse(&p, line, FP_MCP_MAX_LINE + 1, &classic, &ev), 0);
    assert_int_equal(ev.type, FP_MCP_MORE);
    (void)fp_mcp_parse(&p, line, FP_MCP_MAX_LINE + 2, &classic, &ev);
    assert_int_equal(ev.type, FP_MCP_BAD);
    assert_string_equal(ev.why, "protocol error: line too long");
}

/* What is consumed, and what the driver must make room for. */
static void test_consumed_and_need(void **state)
{
    static const char in[] = "VALUE k1 0 5\r\nhel";
    struct fp_mcp p;
    struct fp_mcp_event ev;

    (void)state;
    fp_mcp_init(&p, 1024);
    assert_int_equal(fp_mcp_need(&p), 0);
    p.probing = 0;
    assert_int_equal(fp_mcp_parse(&p, in, strlen(in), &classic, &ev), 14);
    assert_int_equal(ev.type, FP_MCP_MORE);
    assert_int_equal(fp_mcp_need(&p), 5 + 7);
    assert_int_equal(fp_mcp_parse(&p, NULL, 0, &classic, &ev), 0);
    assert_int_equal(ev.type, FP_MCP_MORE);
    assert_int_equal(fp_mcp_parse(&p, "hello\r\nEND\r\nEN", 14, &classic, &ev), 12);
    assert_int_equal(ev.type, FP_MCP_HIT);
    assert_int_equal(fp_mcp_need(&p), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_opening_mn),
        cmocka_unit_test(test_classic),
        cmocka_unit_test(test_bad_value_lines),
        cmocka_unit_test(test_classic_garbage),
        cmocka_unit_test(test_meta),
        cmocka_unit_test(test_probe_mn),
        cmocka_unit_test(test_refused),
        cmocka_unit_test(test_too_big),
        cmocka_unit_test(test_line_limit),
        cmocka_unit_test(test_consumed_and_need),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}

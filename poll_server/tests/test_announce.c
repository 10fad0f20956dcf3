/* test_announce.c -- an announcement's `<key> <unix_ms>` split strictly
 * (announce.c: a bare key from an older app, a malformed time ignored and
 * reported, never a key cut short of its bytes), and the publish-to-delivery
 * histogram's buckets and clamp (stats.c). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>

#include "../src/announce.h"
#include "../src/stats.h"

/* Parses msg; returns fp_announce_parse's result, the key length and time. */
static int parse(const char *msg, size_t *keylen, uint64_t *ms)
{
    return fp_announce_parse(msg, strlen(msg), keylen, ms);
}

static void test_parse(void **state)
{
    size_t kl;
    uint64_t ms;
    static const char *const bad[] = {
        "/k ", "/k 12x", "/k x12", "/k -1", "/k +1", "/k 1 2", "/k  1",
        "/k 1234567890123456", "/k 1\n", "/k 0x10",
    };
    (void)state;

    assert_int_equal(parse("/Poll/getMessages?user_id=42 1795000000123", &kl, &ms), 0);
    assert_int_equal(kl, strlen("/Poll/getMessages?user_id=42"));
    assert_true(ms == 1795000000123ULL);
    /* An app from before the suffix: the whole message is the key. */
    assert_int_equal(parse("/Poll/getMessages?user_id=42", &kl, &ms), 0);
    assert_int_equal(kl, strlen("/Poll/getMessages?user_id=42"));
    assert_true(ms == 0);
    assert_int_equal(parse("/k 999999999999999", &kl, &ms), 0); /* 15 digits */
    assert_true(ms == 999999999999999ULL && kl == 2);
    assert_int_equal(parse("", &kl, &ms), 0);
    assert_true(kl == 0 && ms == 0);
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        ms = 7;
        assert_int_equal(parse(bad[i], &kl, &ms), -1);
        assert_int_equal(kl, 2); /* the key stops at the space */
        assert_true(ms == 0);
    }
    /* Not NUL-terminated: only len bytes are read. */
    assert_int_equal(fp_announce_parse("/k 12345", 6, &kl, &ms), 0);
    assert_true(kl == 2 && ms == 123);
}

static void test_histogram(void **state)
{
    const uint64_t t = 1795000000000ULL;
    (void)state;

    memset(&fp_stats, 0, sizeof(fp_stats));
    fp_stat_delivered(t, t);          /* 0 ms: the first bucket (1 ms) */
    fp_stat_delivered(t, t + 1);      /* on a bound: that bucket */
    fp_stat_delivered(t, t + 2);      /* 2 ms */
    fp_stat_delivered(t, t + 740);    /* 1 s */
    fp_stat_delivered(t, t + 30000);  /* 30 s, the last bound */
    fp_stat_delivered(t, t + 30001);  /* +Inf */
    fp_stat_delivered(t + 5, t);      /* a clock ahead: 0, counted */
    assert_true(fp_stats.delivery_buckets[0] == 3);
    assert_true(fp_stats.delivery_buckets[1] == 1);
    assert_true(fp_stats.delivery_buckets[9] == 1);
    assert_true(fp_stats.delivery_buckets[FP_STAT_NDELIVERY - 1] == 1);
    assert_true(fp_stats.delivery_buckets[FP_STAT_NDELIVERY] == 1);
    assert_true(fp_stats.delivery_negative == 1);
    assert_true(fp_stats.delivery_sum_ms == 1 + 2 + 740 + 30000 + 30001);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parse),
        cmocka_unit_test(test_histogram),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

/* test_health.c -- the failure model both backends share (src/health.c):
 * the backoff's steps and jitter, what resets it, late vs hung. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>
#include <time.h>

#include "../src/health.h"

/* A connection that had been answering is retried at once; the next
 * attempts wait 50..100% of 100, 200, 400 ... 2000 ms. */
static void test_backoff_steps_and_jitter(void **state)
{
    struct fp_health h;
    unsigned base[] = { 0, 100, 200, 400, 800, 1600, 2000, 2000 };

    (void)state;
    memset(&h, 0, sizeof(h));
    for (size_t i = 0; i < sizeof(base) / sizeof(base[0]); i++) {
        unsigned d = fp_health_next_delay(&h);
        assert_true(d >= base[i] / 2 && d <= base[i]);
    }
}

/* After a hang (or garbage) even the first retry waits. */
static void test_bad_waits_from_the_first_retry(void **state)
{
    struct fp_health h;
    unsigned d;

    (void)state;
    memset(&h, 0, sizeof(h));
    fp_health_bad(&h);
    d = fp_health_next_delay(&h);
    assert_true(d >= FP_BACKOFF_MIN_MS / 2 && d <= FP_BACKOFF_MIN_MS);
}

/* Only a good answer resets; the delays then start over at once. */
static void test_good_resets(void **state)
{
    struct fp_health h;

    (void)state;
    memset(&h, 0, sizeof(h));
    for (int i = 0; i < 5; i++)
        (void)fp_health_next_delay(&h);
    assert_true(h.backoff_ms > FP_BACKOFF_MIN_MS);
    fp_health_bad(&h);
    fp_health_good(&h);
    assert_int_equal(h.hung, 0);
    assert_int_equal(fp_health_next_delay(&h), 0);
}

/* The jitter differs between calls (pollers must not reconnect in step). */
static void test_jitter_varies(void **state)
{
    struct fp_health h;
    unsigned seen[2001] = { 0 }, distinct = 0;

    (void)state;
    for (int i = 0; i < 200; i++) {
        unsigned d;

        memset(&h, 0, sizeof(h));
        h.backoff_ms = FP_BACKOFF_MAX_MS;
        d = fp_health_next_delay(&h);
        assert_true(d >= FP_BACKOFF_MAX_MS / 2 && d <= FP_BACKOFF_MAX_MS);
        if (seen[d]++ == 0)
            distinct++;
    }
    assert_true(distinct > 20);
}

/* Silent: nothing for timeout_ms, or nothing since the connection. */
static void test_silence(void **state)
{
    struct fp_health h;

    (void)state;
    memset(&h, 0, sizeof(h));
    assert_true(fp_health_silent(&h, 100));
    fp_health_rx(&h);
    assert_false(fp_health_silent(&h, 100));
    h.last_rx_ms -= 150;
    assert_true(fp_health_silent(&h, 100));
    (void)fp_health_next_delay(&h); /* a new connection forgets */
    assert_int_equal(h.last_rx_ms, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_backoff_steps_and_jitter),
        cmocka_unit_test(test_bad_waits_from_the_first_retry),
        cmocka_unit_test(test_good_resets),
        cmocka_unit_test(test_jitter_varies),
        cmocka_unit_test(test_silence),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}

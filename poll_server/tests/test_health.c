/* test_health.c -- the failure model both backends share (src/health.c):
 * the backoff's steps and jitter, what resets it, late vs hung. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>
#include <time.h>

#include <event2/event.h>

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

/* Hung: silent for FP_HUNG_MIN_MS, or timeout_ms if longer; or nothing
 * since the connection. A shorter silence is a stall, not a hang. */
static void test_silence(void **state)
{
    struct fp_health h;
    unsigned in;

    (void)state;
    memset(&h, 0, sizeof(h));
    assert_int_equal(fp_health_hung_in(&h, 100), 0);
    fp_health_rx(&h);
    in = fp_health_hung_in(&h, 100);
    assert_true(in > FP_HUNG_MIN_MS - 50 && in <= FP_HUNG_MIN_MS);
    h.last_rx_ms -= 150;                /* late, not hung */
    in = fp_health_hung_in(&h, 100);
    assert_true(in > FP_HUNG_MIN_MS - 200 && in <= FP_HUNG_MIN_MS - 150);
    h.last_rx_ms -= FP_HUNG_MIN_MS;
    assert_int_equal(fp_health_hung_in(&h, 100), 0);
    fp_health_rx(&h);                   /* a longer timeout_ms rules */
    h.last_rx_ms -= FP_HUNG_MIN_MS + 100;
    in = fp_health_hung_in(&h, 2000);
    assert_true(in > 1300 && in <= 1400);
    (void)fp_health_next_delay(&h); /* a new connection forgets */
    assert_int_equal(h.last_rx_ms, 0);
}

static void noop_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    (void)arg;
}

/* Late: the check armed for the moment the silence would mark a hang. */
static void test_late_arms_the_check(void **state)
{
    struct fp_health h;
    struct event_base *base = event_base_new();
    struct event *check;
    struct timeval tv;

    (void)state;
    assert_non_null(base);
    check = evtimer_new(base, noop_cb, NULL);
    assert_non_null(check);
    memset(&h, 0, sizeof(h));
    assert_int_not_equal(fp_health_late(&h, 100, check), 0); /* never answered */
    assert_false(evtimer_pending(check, NULL));
    fp_health_rx(&h);
    h.last_rx_ms -= 50;                 /* late, but bytes came lately */
    assert_int_equal(fp_health_late(&h, 100, check), 0);
    assert_false(h.stalled);
    h.last_rx_ms -= 100;                /* late, nothing for 150 ms */
    assert_int_equal(fp_health_late(&h, 100, check), 0);
    assert_true(h.stalled);
    assert_true(evtimer_pending(check, &tv));
    assert_int_equal(fp_health_late(&h, 100, check), 0);  /* armed once */
    h.last_rx_ms -= FP_HUNG_MIN_MS;
    assert_int_not_equal(fp_health_late(&h, 100, check), 0);
    fp_health_rx(&h);                   /* any bytes end a stall */
    assert_false(h.stalled);
    event_free(check);
    event_base_free(base);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_backoff_steps_and_jitter),
        cmocka_unit_test(test_bad_waits_from_the_first_retry),
        cmocka_unit_test(test_good_resets),
        cmocka_unit_test(test_jitter_varies),
        cmocka_unit_test(test_late_arms_the_check),
        cmocka_unit_test(test_silence),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}

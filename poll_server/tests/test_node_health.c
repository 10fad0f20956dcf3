/* test_node_health.c -- a memcached node's health decisions
 * (src/node_health.c): the recovery window's start and end, which nodes
 * take gets, where a get goes and when a failed read tries the replica. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>

#include "../src/node_health.h"

/* Back after being down: the window opens; a node that was never down, or
 * recovery_ms 0, gets none. */
static void test_window_starts_only_after_down(void **state)
{
    struct fp_node_recovery rw = { 0 };
    int ended;

    (void)state;
    assert_int_equal(fp_node_back(&rw, 0, 3000), 0);
    assert_false(fp_node_recovering(&rw, &ended));
    assert_false(ended);
    assert_int_equal(fp_node_back(&rw, 1, 0), 0);
    assert_false(fp_node_recovering(&rw, &ended));
    assert_int_equal(fp_node_back(&rw, 1, 3000), 1);
    assert_true(rw.until_ms >= fp_mono_ms() + 2000);
    assert_true(fp_node_recovering(&rw, &ended));
    assert_false(ended);
}

/* The window's end is reported once, then the node serves again. */
static void test_window_ends_once(void **state)
{
    struct fp_node_recovery rw;
    int ended;

    (void)state;
    rw.until_ms = fp_mono_ms() - 1; /* over */
    assert_false(fp_node_recovering(&rw, &ended));
    assert_true(ended);
    assert_int_equal(rw.until_ms, 0);
    assert_false(fp_node_recovering(&rw, &ended));
    assert_false(ended);
}

/* Down, full or stalled: no gets. Back from a hang with nothing heard: no
 * gets with replicas (they read the replica), but without replicas it is
 * asked. */
static void test_ready(void **state)
{
    struct fp_health h;

    (void)state;
    memset(&h, 0, sizeof(h));
    assert_true(fp_node_ready(0, 0, 8, 1, &h));
    assert_false(fp_node_ready(1, 0, 8, 1, &h));
    assert_false(fp_node_ready(0, 8, 8, 1, &h));
    h.hung = 1;
    assert_false(fp_node_ready(0, 0, 8, 1, &h));
    assert_true(fp_node_ready(0, 0, 8, 0, &h));
    h.last_rx_ms = 1; /* it answered since */
    assert_true(fp_node_ready(0, 0, 8, 1, &h));
    h.stalled = 1;    /* a request late, nothing for timeout_ms */
    assert_false(fp_node_ready(0, 0, 8, 1, &h));
    assert_false(fp_node_ready(0, 0, 8, 0, &h));
    fp_health_rx(&h); /* any bytes end the stall */
    assert_true(fp_node_ready(0, 0, 8, 0, &h));
}

/* Only an ERROR or TIMEOUT of a primary read marked for failover retries. */
static void test_fails_over(void **state)
{
    (void)state;
    assert_true(fp_node_fails_over(FP_CACHE_ERROR, 1));
    assert_true(fp_node_fails_over(FP_CACHE_TIMEOUT, 1));
    assert_false(fp_node_fails_over(FP_CACHE_HIT, 1));
    assert_false(fp_node_fails_over(FP_CACHE_MISS, 1));
    assert_false(fp_node_fails_over(FP_CACHE_ERROR, 0));
}

static int asked;

static int replica_yes(void *arg)
{
    (void)arg;
    asked++;
    return 1;
}

static int replica_no(void *arg)
{
    (void)arg;
    asked++;
    return 0;
}

/* The primary when it serves (the replica not even looked up); else the
 * replica if there are replicas and it serves; else fail fast. */
static void test_pick(void **state)
{
    (void)state;
    asked = 0;
    assert_int_equal(fp_node_pick(1, 1, replica_yes, NULL), FP_NODE_PRIMARY);
    assert_int_equal(fp_node_pick(0, 1, replica_yes, NULL), FP_NODE_PRIMARY);
    assert_int_equal(fp_node_pick(0, 0, replica_yes, NULL), FP_NODE_NONE);
    assert_int_equal(asked, 0);
    assert_int_equal(fp_node_pick(1, 0, replica_yes, NULL), FP_NODE_REPLICA);
    assert_int_equal(fp_node_pick(1, 0, replica_no, NULL), FP_NODE_NONE);
    assert_int_equal(asked, 2);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_window_starts_only_after_down),
        cmocka_unit_test(test_window_ends_once),
        cmocka_unit_test(test_ready),
        cmocka_unit_test(test_fails_over),
        cmocka_unit_test(test_pick),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

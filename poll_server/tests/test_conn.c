/* test_conn.c -- the connection state machine (src/conn.c's table of
 * legal transitions, docs/design.md "The connection state machine"). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "../src/conn.h"

/* A request's whole life: accepted, head, body, the cache, held, answered
 * with a partial write, the next request, a poll with channels (held from
 * its dispatch), then the lingering close. */
static void test_a_request_lifecycle_is_legal(void **state)
{
    static const enum conn_state path[] = {
        CONN_FREE, CONN_READING_HEAD, CONN_READING_BODY, CONN_READING_HEAD,
        CONN_WAITING_CACHE, CONN_HELD, CONN_READING_HEAD, CONN_WRITING,
        CONN_READING_HEAD, CONN_WAITING_CACHE, CONN_READING_HEAD,
        CONN_HELD, CONN_READING_HEAD, CONN_LINGERING, CONN_FREE,
    };

    (void)state;
    for (size_t i = 1; i < sizeof(path) / sizeof(path[0]); i++)
        assert_true(conn_transition_legal(path[i - 1], path[i]));
}

/* Every state in service may close; a free connection only starts. */
static void test_close_from_every_state(void **state)
{
    (void)state;
    for (int s = CONN_READING_HEAD; s < CONN_NSTATES; s++)
        assert_true(conn_transition_legal((enum conn_state)s, CONN_FREE));
    for (int s = 0; s < CONN_NSTATES; s++)
        assert_int_equal(conn_transition_legal(CONN_FREE, (enum conn_state)s),
                         s == CONN_READING_HEAD);
}

/* The unwritten rules: an answer is written from READING_HEAD (a waiting,
 * held or body-reading request leaves its state first); a request is held
 * once its head and body are in; a lingering connection only closes. */
static void test_illegal_transitions(void **state)
{
    (void)state;
    assert_false(conn_transition_legal(CONN_WAITING_CACHE, CONN_WRITING));
    /* A stream never goes back to serving requests on its connection. */
    assert_false(conn_transition_legal(CONN_STREAMING, CONN_READING_HEAD));
    assert_false(conn_transition_legal(CONN_STREAMING, CONN_HELD));
    assert_false(conn_transition_legal(CONN_READING_BODY, CONN_STREAMING));
    assert_true(conn_transition_legal(CONN_HELD, CONN_STREAMING));
    assert_true(conn_transition_legal(CONN_STREAMING, CONN_WRITING));
    assert_false(conn_transition_legal(CONN_HELD, CONN_WRITING));
    assert_false(conn_transition_legal(CONN_HELD, CONN_WAITING_CACHE));
    assert_false(conn_transition_legal(CONN_READING_BODY, CONN_HELD));
    assert_false(conn_transition_legal(CONN_READING_BODY, CONN_WAITING_CACHE));
    assert_false(conn_transition_legal(CONN_WRITING, CONN_WRITING));
    assert_false(conn_transition_legal(CONN_LINGERING, CONN_READING_HEAD));
    assert_false(conn_transition_legal(CONN_NSTATES, CONN_FREE));
    assert_false(conn_transition_legal(CONN_FREE, CONN_NSTATES));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_a_request_lifecycle_is_legal),
        cmocka_unit_test(test_close_from_every_state),
        cmocka_unit_test(test_illegal_transitions),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

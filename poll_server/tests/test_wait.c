/* test_wait.c -- wait.c: wait= (digits, clamped, repeated or bad refused;
 * every case of the shared vectors, tests/vectors/wait.json, which nginx and
 * the app run too) and the pace. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cJSON.h>

#include "read_file.h"
#include "../src/wait.h"

#define WAIT_VECTORS_DEFAULT "../../tests/vectors/wait.json"

static long w(const char *target, unsigned max)
{
    return fp_wait_param(target, strlen(target), max);
}

static void test_wait(void **state)
{
    (void)state;

    assert_int_equal(w("/getMessages?user_id=1", 30), 0);
    assert_int_equal(w("/getMessages", 30), 0);
    assert_int_equal(w("/getMessages?user_id=1&wait=25", 30), 25);
    assert_int_equal(w("/getMessages?wait=0&user_id=1", 30), 0);
    assert_int_equal(w("/getMessages?wait=999999", 30), 30);  /* clamped */
    assert_int_equal(w("/getMessages?waiting=5&await=3", 30), 0);
    assert_int_equal(w("/getMessages?wait=1234567", 30), -1);
    assert_int_equal(w("/getMessages?wait=", 30), -1);
    assert_int_equal(w("/getMessages?wait", 30), -1);
    assert_int_equal(w("/getMessages?wait=-1", 30), -1);
    assert_int_equal(w("/getMessages?wait=1.5", 30), -1);
    assert_int_equal(w("/getMessages?wait=1&wait=1", 30), -1);
    /* The name in any case, never decoded; every occurrence counts. */
    assert_int_equal(w("/getMessages?WAIT=5", 30), 5);
    assert_int_equal(w("/getMessages?Wait=5&user_id=1", 30), 5);
    assert_int_equal(w("/getMessages?WAIT=0&wait=30", 30), -1);
    assert_int_equal(w("/getMessages?wait=30&WAIT=0", 30), -1);
    assert_int_equal(w("/getMessages?wAiT=1&wait", 30), -1);
    assert_int_equal(w("/getMessages?wait&WAIT=1", 30), -1);
    assert_int_equal(w("/getMessages?WAIT", 30), -1);
    assert_int_equal(w("/getMessages?w%61it=5", 30), 0);
    assert_int_equal(w("/getMessages?wait=%31", 30), -1);
    assert_int_equal(w("/getMessages?wait==1", 30), -1);
    assert_int_equal(w("/getMessages?wait=x&wait=1", 30), -1);
}

/* Every case of the one definition of `wait`, as nginx and the app read it. */
static void test_wait_vectors(void **state)
{
    const char *path = getenv("FP_WAIT_VECTORS");
    char *text, target[1024];
    cJSON *root;
    const cJSON *cases, *c, *max;
    size_t n = 0;
    (void)state;

    text = read_file(path ? path : WAIT_VECTORS_DEFAULT);
    assert_non_null(text);
    root = cJSON_Parse(text);
    assert_non_null(root);
    max = cJSON_GetObjectItemCaseSensitive(root, "max_wait");
    cases = cJSON_GetObjectItemCaseSensitive(root, "cases");
    assert_true(cJSON_IsNumber(max) && cJSON_IsArray(cases));
    cJSON_ArrayForEach(c, cases) {
        const cJSON *q = cJSON_GetObjectItemCaseSensitive(c, "query");
        const cJSON *e = cJSON_GetObjectItemCaseSensitive(c, "expect");
        long want, got;
        int len;

        assert_true(cJSON_IsString(q));
        if (cJSON_IsString(e) && strcmp(e->valuestring, "refuse") == 0)
            want = -1;
        else if (cJSON_IsNumber(e))
            want = (long)e->valuedouble;
        else
            fail_msg("case %zu: expect is neither a number nor \"refuse\"", n);
        len = snprintf(target, sizeof(target), "/getMessages?%s", q->valuestring);
        assert_true(len > 0 && (size_t)len < sizeof(target));
        got = fp_wait_param(target, (size_t)len, (unsigned)max->valuedouble);
        if (got != want)
            fail_msg("case %zu (%s): %ld, not %ld", n, q->valuestring, got, want);
        n++;
    }
    assert_true(n >= 30);
    printf("%zu wait vectors\n", n);
    cJSON_Delete(root);
    free(text);
}

static void test_pace(void **state)
{
    unsigned lo = ~0u, hi = 0;
    (void)state;

    assert_int_equal(fp_pace_ms(1000, 0), 1000);
    assert_int_equal(fp_pace_ms(0, 20), 0);
    for (int i = 0; i < 2000; i++) {
        unsigned p = fp_pace_ms(1000, 20);
        lo = p < lo ? p : lo;
        hi = p > hi ? p : hi;
    }
    assert_true(lo >= 1000 && hi <= 1200);
    assert_true(hi - lo > 100); /* it does spread */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_wait),
        cmocka_unit_test(test_wait_vectors),
        cmocka_unit_test(test_pace),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

/* test_coalesce.c -- coalesce.c against a fake cache that answers only when
 * the test says so: one get per key at a time, late requests wait for the
 * next get after a hit but share a miss or an error, detach, failures. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "../src/cache.h"
#include "../src/coalesce.h"

/* ---- fake cache: records gets, the test completes them ---------------- */

#define MAX_GETS 64

struct fake_get {
    char key[256];
    fp_cache_cb *cb;
    void *arg;
    int done;
};

static struct fake_get gets[MAX_GETS];
static int ngets;
static int fail_next_get;

struct fp_cache *fp_cache_create(struct event_base *base,
                                 const struct fp_settings *settings)
{
    (void)base;
    (void)settings;
    return NULL;
}

int fp_cache_get(struct fp_cache *cache, const char *key, size_t keylen,
                 fp_cache_cb *cb, void *arg)
{
    (void)cache;
    if (fail_next_get) {
        fail_next_get = 0;
        return -1;
    }
    assert_true(ngets < MAX_GETS);
    assert_true(keylen < sizeof(gets[0].key));
    memcpy(gets[ngets].key, key, keylen);
    gets[ngets].key[keylen] = '\0';
    gets[ngets].cb = cb;
    gets[ngets].arg = arg;
    gets[ngets].done = 0;
    ngets++;
    return 0;
}

void fp_cache_free(struct fp_cache *cache)
{
    (void)cache;
}

static void answer(int i, enum fp_cache_status st, const char *value)
{
    assert_true(i < ngets);
    assert_false(gets[i].done);
    gets[i].done = 1;
    gets[i].cb(st, value, value ? strlen(value) : 0, gets[i].arg);
}

/* ---- waiters ---------------------------------------------------------- */

struct waiter {
    struct fp_waiter w; /* first */
    int delivered;
    enum fp_cache_status st;
    char value[32];
};

static void deliver(struct fp_waiter *fw, enum fp_cache_status st,
                    const char *value, size_t len, void *arg)
{
    struct waiter *w = (struct waiter *)(void *)fw;

    assert_ptr_equal(arg, &gets); /* the arg given to fp_coalesce_new */
    assert_null(fw->list);        /* detached before delivery */
    w->delivered++;
    w->st = st;
    assert_true(len < sizeof(w->value));
    memcpy(w->value, value ? value : "", len);
    w->value[len] = '\0';
}

static struct fp_coalesce *co;

static int setup(void **state)
{
    (void)state;
    memset(gets, 0, sizeof(gets));
    ngets = 0;
    fail_next_get = 0;
    co = fp_coalesce_new(NULL, deliver, &gets);
    return co == NULL;
}

static int teardown(void **state)
{
    (void)state;
    fp_coalesce_free(co);
    co = NULL;
    return 0;
}

static int get(const char *key, struct waiter *w)
{
    memset(w, 0, sizeof(*w));
    return fp_coalesce_get(co, key, strlen(key), &w->w);
}

static void test_one_get_per_key(void **state)
{
    struct waiter a, b, c;
    struct fp_coalesce_stats st;
    (void)state;

    assert_int_equal(get("k1", &a), 0);
    assert_int_equal(get("k2", &b), 0);
    assert_int_equal(ngets, 2);
    assert_string_equal(gets[0].key, "k1");
    assert_string_equal(gets[1].key, "k2");
    answer(0, FP_CACHE_HIT, "v1");
    assert_int_equal(a.delivered, 1);
    assert_int_equal(a.st, FP_CACHE_HIT);
    assert_string_equal(a.value, "v1");
    assert_int_equal(b.delivered, 0);
    answer(1, FP_CACHE_MISS, NULL);
    assert_int_equal(b.st, FP_CACHE_MISS);
    /* The key is free again: a new request starts a new get. */
    assert_int_equal(get("k1", &c), 0);
    assert_int_equal(ngets, 3);
    answer(2, FP_CACHE_HIT, "");
    assert_int_equal(c.st, FP_CACHE_HIT);
    assert_string_equal(c.value, "");
    fp_coalesce_stats(co, &st);
    assert_int_equal(st.gets, 3);
    assert_int_equal(st.keys, 0);
    assert_int_equal(st.waiting, 0);
}

/* A hit is not shared with requests that arrived after the get started:
 * they get the next get, and there is still one get at a time. */
static void test_late_requests_wait_for_next_get(void **state)
{
    struct waiter first, late[100];
    struct fp_coalesce_stats st;
    (void)state;

    assert_int_equal(get("hot", &first), 0);
    for (int i = 0; i < 100; i++)
        assert_int_equal(get("hot", &late[i]), 0);
    assert_int_equal(ngets, 1);
    fp_coalesce_stats(co, &st);
    assert_int_equal(st.waiting, 101);
    assert_int_equal(st.keys, 1);

    answer(0, FP_CACHE_HIT, "old");
    assert_int_equal(first.delivered, 1);
    assert_string_equal(first.value, "old");
    for (int i = 0; i < 100; i++)
        assert_int_equal(late[i].delivered, 0);
    assert_int_equal(ngets, 2); /* the next get started at once */
    assert_string_equal(gets[1].key, "hot");

    answer(1, FP_CACHE_HIT, "new");
    for (int i = 0; i < 100; i++) {
        assert_int_equal(late[i].delivered, 1);
        assert_string_equal(late[i].value, "new");
    }
    assert_int_equal(ngets, 2);
    fp_coalesce_stats(co, &st);
    assert_int_equal(st.keys, 0);
    assert_int_equal(st.waiting, 0);
    assert_int_equal(st.requests, 101);
}

/* A miss or a failure carries no stale data: everyone gets it at once. */
static void test_miss_and_errors_are_shared(void **state)
{
    enum fp_cache_status sts[] = { FP_CACHE_MISS, FP_CACHE_ERROR,
                                   FP_CACHE_TIMEOUT };
    (void)state;

    for (size_t k = 0; k < 3; k++) {
        struct waiter a, b, c;
        int base = ngets;

        assert_int_equal(get("key", &a), 0);
        assert_int_equal(get("key", &b), 0);
        assert_int_equal(get("key", &c), 0);
        assert_int_equal(ngets, base + 1);
        answer(base, sts[k], NULL);
        assert_int_equal(a.st, sts[k]);
        assert_int_equal(b.st, sts[k]);
        assert_int_equal(c.st, sts[k]);
        assert_int_equal(a.delivered + b.delivered + c.delivered, 3);
        assert_int_equal(ngets, base + 1);
    }
}

static void test_detach(void **state)
{
    struct waiter a, b, c, d;
    struct fp_coalesce_stats st;
    (void)state;

    assert_int_equal(get("k", &a), 0);
    assert_int_equal(get("k", &b), 0);
    assert_int_equal(get("k", &c), 0);
    fp_coalesce_detach(&a.w); /* from the current list */
    fp_coalesce_detach(&b.w); /* from the next list */
    fp_coalesce_detach(&b.w); /* twice is a no-op */
    fp_coalesce_stats(co, &st);
    assert_int_equal(st.waiting, 1);
    answer(0, FP_CACHE_HIT, "x");
    assert_int_equal(a.delivered, 0);
    assert_int_equal(b.delivered, 0);
    assert_int_equal(c.delivered, 0);
    assert_int_equal(ngets, 2);
    fp_coalesce_detach(&c.w);
    /* A get nobody waits for any more still completes cleanly. */
    answer(1, FP_CACHE_HIT, "y");
    assert_int_equal(c.delivered, 0);
    fp_coalesce_stats(co, &st);
    assert_int_equal(st.keys, 0);
    assert_int_equal(st.waiting, 0);

    /* Everyone detached while the first get runs: the get ends, no next. */
    assert_int_equal(get("k", &d), 0);
    fp_coalesce_detach(&d.w);
    answer(2, FP_CACHE_HIT, "z");
    assert_int_equal(ngets, 3);
    assert_int_equal(d.delivered, 0);
}

static void test_cache_refuses(void **state)
{
    struct waiter a, b, c;
    struct fp_coalesce_stats st;
    (void)state;

    fail_next_get = 1;
    assert_int_equal(get("k", &a), -1);
    assert_null(a.w.list);
    fp_coalesce_stats(co, &st);
    assert_int_equal(st.keys, 0);

    /* The next get for late waiters is refused: they get an error. */
    assert_int_equal(get("k", &a), 0);
    assert_int_equal(get("k", &b), 0);
    assert_int_equal(get("k", &c), 0);
    fail_next_get = 1;
    answer(0, FP_CACHE_HIT, "v");
    assert_int_equal(a.st, FP_CACHE_HIT);
    assert_int_equal(b.st, FP_CACHE_ERROR);
    assert_int_equal(c.st, FP_CACHE_ERROR);
    fp_coalesce_stats(co, &st);
    assert_int_equal(st.keys, 0);
    assert_int_equal(st.waiting, 0);

    /* Keys longer than any valid key are refused outright. */
    {
        char big[300];
        memset(big, 'a', sizeof(big) - 1);
        big[sizeof(big) - 1] = '\0';
        assert_int_equal(get(big, &a), -1);
    }
}

/* Binary-safe keys: equal prefixes, different lengths are different keys. */
static void test_key_identity(void **state)
{
    struct waiter a, b;
    (void)state;

    assert_int_equal(get("/Poll/x?user_id=1", &a), 0);
    assert_int_equal(get("/Poll/x?user_id=10", &b), 0);
    assert_int_equal(ngets, 2);
    answer(1, FP_CACHE_HIT, "ten");
    answer(0, FP_CACHE_HIT, "one");
    assert_string_equal(a.value, "one");
    assert_string_equal(b.value, "ten");
}

static void test_fail_all(void **state)
{
    struct waiter a, b, c;
    struct fp_coalesce_stats st;
    (void)state;

    assert_int_equal(get("k1", &a), 0);
    assert_int_equal(get("k1", &b), 0);
    assert_int_equal(get("k2", &c), 0);
    fp_coalesce_fail_all(co, FP_CACHE_TIMEOUT);
    assert_int_equal(a.st, FP_CACHE_TIMEOUT);
    assert_int_equal(b.st, FP_CACHE_TIMEOUT);
    assert_int_equal(c.st, FP_CACHE_TIMEOUT);
    fp_coalesce_stats(co, &st);
    assert_int_equal(st.waiting, 0);
    assert_int_equal(st.keys, 2); /* the gets are still out */
    answer(0, FP_CACHE_HIT, "late");
    answer(1, FP_CACHE_HIT, "late");
    assert_int_equal(a.delivered + b.delivered + c.delivered, 3);
    assert_int_equal(ngets, 2);
    fp_coalesce_stats(co, &st);
    assert_int_equal(st.keys, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_one_get_per_key, setup, teardown),
        cmocka_unit_test_setup_teardown(test_late_requests_wait_for_next_get,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(test_miss_and_errors_are_shared,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(test_detach, setup, teardown),
        cmocka_unit_test_setup_teardown(test_cache_refuses, setup, teardown),
        cmocka_unit_test_setup_teardown(test_key_identity, setup, teardown),
        cmocka_unit_test_setup_teardown(test_fail_all, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

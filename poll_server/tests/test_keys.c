/* test_keys.c -- key_derive() against every case of the shared vectors
 * (tests/vectors/keys.json, also run by the Python side), plus edge cases
 * the vectors do not cover: bounds, embedded NUL, raw high bytes. */
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
#include "../src/keys.h"

#define VECTORS_DEFAULT "../../tests/vectors/keys.json"

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Fills names[] from a JSON array of strings, sorted as config.c does. */
static size_t load_params(const cJSON *arr, char **names)
{
    size_t n = 0;
    const cJSON *it;

    assert_true(cJSON_IsArray(arr));
    cJSON_ArrayForEach(it, arr) {
        assert_true(cJSON_IsString(it));
        assert_true(n < FP_MAX_PARAMS);
        names[n++] = it->valuestring;
    }
    qsort(names, n, sizeof(*names), cmp_str);
    return n;
}

static void test_vectors(void **state)
{
    const char *path = getenv("FP_KEY_VECTORS");
    char *text, *params[FP_MAX_PARAMS];
    cJSON *root, *cases, *c;
    const cJSON *prefix;
    size_t nparams, ncases = 0, ninvalid = 0;
    (void)state;

    text = read_file(path ? path : VECTORS_DEFAULT);
    assert_non_null(text);
    root = cJSON_Parse(text);
    assert_non_null(root);
    prefix = cJSON_GetObjectItemCaseSensitive(root, "prefix");
    assert_true(cJSON_IsString(prefix));
    nparams = load_params(cJSON_GetObjectItemCaseSensitive(root, "params"), params);
    cases = cJSON_GetObjectItemCaseSensitive(root, "cases");
    assert_true(cJSON_IsArray(cases));

    cJSON_ArrayForEach(c, cases) {
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(c, "target");
        const cJSON *k = cJSON_GetObjectItemCaseSensitive(c, "key");
        const cJSON *why = cJSON_GetObjectItemCaseSensitive(c, "why");
        const cJSON *cp = cJSON_GetObjectItemCaseSensitive(c, "prefix");
        const cJSON *cpar = cJSON_GetObjectItemCaseSensitive(c, "params");
        char *cparams[FP_MAX_PARAMS];
        char *const *use_params = params;
        size_t use_n = nparams;
        const char *use_prefix = prefix->valuestring;
        char out[FP_MAX_KEY_LEN + 1];
        ssize_t r;

        assert_true(cJSON_IsString(t));
        if (cp != NULL) {
            assert_true(cJSON_IsString(cp));
            use_prefix = cp->valuestring;
        }
        if (cpar != NULL) {
            use_n = load_params(cpar, cparams);
            use_params = cparams;
        }
        r = key_derive(use_prefix, use_params, use_n, t->valuestring,
                       strlen(t->valuestring), out, sizeof(out));
        if (cJSON_IsNull(k)) {
            if (r != -1)
                fail_msg("%s: \"%s\" should be invalid, got \"%s\"",
                         why ? why->valuestring : "?", t->valuestring, out);
            ninvalid++;
        } else {
            assert_true(cJSON_IsString(k));
            if (r < 0 || strcmp(out, k->valuestring) != 0 ||
                (size_t)r != strlen(k->valuestring))
                fail_msg("%s: \"%s\" -> %s, want \"%s\"",
                         why ? why->valuestring : "?", t->valuestring,
                         r < 0 ? "invalid" : out, k->valuestring);
        }
        ncases++;
    }
    print_message("%zu vectors (%zu invalid)\n", ncases, ninvalid);
    assert_true(ncases > 40);
    cJSON_Delete(root);
    free(text);
}

static char *one_param[] = { "user_id" };

static ssize_t derive(const char *target, char *out, size_t cap)
{
    return key_derive("/Poll", one_param, 1, target, strlen(target), out, cap);
}

static void test_bounds(void **state)
{
    char buf[FP_MAX_KEY_LEN + 64];
    char target[600];
    ssize_t r;
    (void)state;

    /* Never writes past outcap, even when the key would be longer. */
    memset(buf, 'Z', sizeof(buf));
    r = derive("/getMessages?user_id=1", buf, 10);
    assert_int_equal(r, -1);
    for (size_t i = 10; i < sizeof(buf); i++)
        assert_int_equal(buf[i], 'Z');

    /* Exactly fits: 27 bytes + NUL. */
    r = derive("/getMessages?user_id=1", buf, 28);
    assert_int_equal(r, 27);
    assert_string_equal(buf, "/Poll/getMessages?user_id=1");
    assert_int_equal(derive("/getMessages?user_id=1", buf, 27), -1);

    /* A huge outcap still caps the key at FP_MAX_KEY_LEN. */
    target[0] = '/';
    memset(target + 1, 'a', 245); /* 5 + 1 + 245 = 251 */
    target[246] = '\0';
    assert_int_equal(derive(target, buf, sizeof(buf)), -1);
    target[245] = '\0';
    assert_int_equal(derive(target, buf, sizeof(buf)), 250);

    /* outcap 0 and NULL out are refused without writing. */
    assert_int_equal(derive("/x", buf, 0), -1);
    assert_int_equal(key_derive("/Poll", one_param, 1, "/x", 2, NULL, 10), -1);
}

static void test_edges(void **state)
{
    char out[FP_MAX_KEY_LEN + 1];
    char *many[FP_MAX_PARAMS + 1];
    (void)state;

    /* target_len is honoured: an embedded NUL is a control byte. */
    assert_int_equal(key_derive("/Poll", one_param, 1, "/a\0b", 4, out,
                                sizeof(out)), -1);
    /* ... and bytes after target_len are not read. */
    assert_int_equal(key_derive("/Poll", one_param, 1, "/ab?user_id=9", 3,
                                out, sizeof(out)), 8);
    assert_string_equal(out, "/Poll/ab");

    /* Raw (unescaped) high bytes are encoded like escaped ones. */
    assert_true(derive("/caf\xc3\xa9?user_id=\xc3\xa9", out, sizeof(out)) > 0);
    assert_string_equal(out, "/Poll/caf%C3%A9?user_id=%C3%A9");

    /* Raw control bytes, tab and DEL. */
    assert_int_equal(derive("/a\tb", out, sizeof(out)), -1);
    assert_int_equal(derive("/a\x7f", out, sizeof(out)), -1);
    assert_int_equal(derive("/x?user_id=a\x01", out, sizeof(out)), -1);

    /* Separators inside the path are just bytes. */
    assert_true(derive("/a&b=c", out, sizeof(out)) > 0);
    assert_string_equal(out, "/Poll/a%26b%3Dc");

    /* Dot segments: only whole segments count; "..." is a name. */
    assert_int_equal(derive("/a/.", out, sizeof(out)), -1);
    assert_int_equal(derive("/a/%2e/", out, sizeof(out)), -1);
    assert_true(derive("/a/.../b", out, sizeof(out)) > 0);
    assert_true(derive("/.a/b.", out, sizeof(out)) > 0);
    /* An encoded slash becomes a real one, so it cannot hide a "..". */
    assert_int_equal(derive("/a%2F..%2Fb", out, sizeof(out)), -1);
    /* Empty segments are kept as they are. */
    assert_true(derive("//x//", out, sizeof(out)) > 0);
    assert_string_equal(out, "/Poll//x//");

    /* Ignored parameters may be anything, keyed ones may be empty. */
    assert_true(derive("/x?a=%&b=%zz&+=+&user_id", out, sizeof(out)) > 0);
    assert_string_equal(out, "/Poll/x?user_id=");
    /* '=' inside a value, after the first one, is data. */
    assert_true(derive("/x?user_id=a=b", out, sizeof(out)) > 0);
    assert_string_equal(out, "/Poll/x?user_id=a%3Db");
    /* A name longer than any parameter can be is simply not keyed. */
    assert_true(derive("/x?user_idxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx=1",
                       out, sizeof(out)) > 0);
    assert_string_equal(out, "/Poll/x");
    /* Malformed escape in a keyed name: not that name, so ignored. */
    assert_true(derive("/x?user_id%=1", out, sizeof(out)) > 0);
    assert_string_equal(out, "/Poll/x");

    /* More params than FP_MAX_PARAMS is refused. */
    for (size_t i = 0; i <= FP_MAX_PARAMS; i++)
        many[i] = "p";
    assert_int_equal(key_derive("/Poll", many, FP_MAX_PARAMS + 1, "/x", 2, out,
                                sizeof(out)), -1);
    /* No params: the query does not matter. */
    assert_int_equal(key_derive("", NULL, 0, "/x?user_id=1", 12, out,
                                sizeof(out)), 2);
    assert_string_equal(out, "/x");
}

static void test_param_order(void **state)
{
    char *params[] = { "a", "a.b", "a_b", "b" }; /* bytewise sorted */
    const char *t = "/p?b=4&a_b=3&a.b=2&a=1";
    char out[FP_MAX_KEY_LEN + 1];
    (void)state;

    assert_true(key_derive("k:", params, 4, t, strlen(t), out, sizeof(out)) > 0);
    assert_string_equal(out, "k:/p?a=1&a.b=2&a_b=3&b=4");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_vectors),
        cmocka_unit_test(test_bounds),
        cmocka_unit_test(test_edges),
        cmocka_unit_test(test_param_order),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

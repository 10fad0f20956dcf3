/* test_channels.c -- channels.c and the channel signature (sign.c) against
 * the shared vectors (tests/vectors/channels.json, also run by the app's
 * fallback_app/tests/test_channels.py), plus bounds the vectors do not
 * cover: 255 names, over-long values, a small compose buffer. */
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
#include "../src/channels.h"
#include "../src/etag.h"
#include "../src/sign.h"

#define VECTORS_DEFAULT "../../tests/vectors/channels.json"

static cJSON *root;

static int setup(void **state)
{
    const char *path = getenv("FP_CHANNEL_VECTORS");
    char *text = read_file(path ? path : VECTORS_DEFAULT);

    (void)state;
    if (text == NULL)
        return -1;
    root = cJSON_Parse(text);
    free(text);
    return root == NULL ? -1 : 0;
}

static int teardown(void **state)
{
    (void)state;
    cJSON_Delete(root);
    return 0;
}

static const cJSON *item(const cJSON *obj, const char *name)
{
    return cJSON_GetObjectItemCaseSensitive(obj, name);
}

static const char *str(const cJSON *obj, const char *name)
{
    const cJSON *v = item(obj, name);

    assert_true(cJSON_IsString(v));
    return v->valuestring;
}

static void test_names(void **state)
{
    const cJSON *c;
    size_t n = 0;
    (void)state;

    cJSON_ArrayForEach(c, item(root, "names")) {
        const char *name = str(c, "name");
        int want = cJSON_IsTrue(item(c, "valid"));

        if (fp_ch_name_valid(name, strlen(name)) != want)
            fail_msg("name \"%s\" (%s): want %s", name, str(c, "why"),
                     want ? "valid" : "invalid");
        n++;
    }
    assert_true(n >= 10);
}

/* The app's message for our refusal: the same words but for the max. */
static void check_refusal(int rc, const char *want, const char *why)
{
    const char *got = fp_ch_strerror(rc);

    if (rc == FP_CH_TOO_MANY) {
        if (strncmp(want, "ch names more than ", 19) != 0)
            fail_msg("%s: refused as too many, the app says \"%s\"", why, want);
    } else if (strcmp(got, want) != 0) {
        fail_msg("%s: refused with \"%s\", the app says \"%s\"", why, got, want);
    }
}

static void test_ch(void **state)
{
    const cJSON *c;
    size_t n = 0, nrefused = 0;
    (void)state;

    cJSON_ArrayForEach(c, item(root, "ch")) {
        static struct fp_ch ch; /* 17 KB: not on the stack */
        char target[4096];
        const char *why = str(c, "why");
        const cJSON *err = item(c, "error"), *want = item(c, "ch"), *name;
        int rc, len;
        size_t k = 0;

        len = snprintf(target, sizeof(target), "/getMessages?%s", str(c, "query"));
        assert_true(len > 0 && (size_t)len < sizeof(target));
        assert_true(cJSON_IsNumber(item(c, "max")));
        rc = fp_ch_parse(target, (size_t)len, (unsigned)item(c, "max")->valueint,
                         &ch);
        n++;
        if (cJSON_IsString(err)) {
            if (rc >= 0)
                fail_msg("%s: accepted (%d), want \"%s\"", why, rc, err->valuestring);
            check_refusal(rc, err->valuestring, why);
            nrefused++;
            continue;
        }
        if (cJSON_IsNull(want)) {
            if (rc != FP_CH_NONE)
                fail_msg("%s: %d (%s), want no ch", why, rc, fp_ch_strerror(rc));
            continue;
        }
        if (rc != FP_CH_OK)
            fail_msg("%s: refused: %s", why, fp_ch_strerror(rc));
        assert_true(cJSON_IsString(want));
        assert_int_equal(ch.len, strlen(want->valuestring));
        assert_memory_equal(ch.value, want->valuestring, ch.len);
        cJSON_ArrayForEach(name, item(c, "channels")) {
            assert_true(k < ch.n);
            assert_int_equal(ch.nlen[k], strlen(name->valuestring));
            assert_memory_equal(ch.value + ch.off[k], name->valuestring, ch.nlen[k]);
            k++;
        }
        assert_int_equal(k, ch.n);
    }
    assert_true(n > 30 && nrefused > 10);
}

static void test_keys(void **state)
{
    const cJSON *c;
    char key[FP_CH_KEY_MAX + 1];
    size_t n = 0;
    (void)state;

    cJSON_ArrayForEach(c, item(root, "keys")) {
        const char *name = str(c, "name"), *want = str(c, "key");
        ssize_t len = fp_ch_key(str(c, "prefix"), name, strlen(name), key,
                                sizeof(key));

        assert_int_equal(len, (ssize_t)strlen(want));
        assert_string_equal(key, want);
        n++;
    }
    assert_true(n > 0);
    /* One byte short of the NUL: refused, nothing written past cap. */
    assert_int_equal(fp_ch_key("/Poll", "room.a", 6, key, 12), -1);
    assert_int_equal(fp_ch_key("/Poll", "room.a", 6, key, 13), 12);
}

static void test_sign(void **state)
{
    const cJSON *c;
    size_t n = 0;
    (void)state;

    cJSON_ArrayForEach(c, item(root, "sign")) {
        char *secret = (char *)str(c, "secret");
        const char *exp = str(c, "exp"), *key = str(c, "key");
        const cJSON *ch = item(c, "ch");
        struct fp_signer *sg = fp_signer_new(&secret, 1);
        char out[FP_SIG_LEN + 1], target[512];
        int len;

        assert_non_null(sg);
        if (cJSON_IsString(ch))
            fp_sign_ch(sg, exp, strlen(exp), key, strlen(key), ch->valuestring,
                       strlen(ch->valuestring), out);
        else
            fp_sign(sg, exp, strlen(exp), key, strlen(key), out);
        assert_string_equal(out, str(c, "sig"));
        /* The check accepts it for exactly this ch, and no other. */
        len = snprintf(target, sizeof(target), "/g?exp=%s&sig=%s", exp, out);
        assert_true(len > 0 && (size_t)len < sizeof(target));
        if (cJSON_IsString(ch)) {
            assert_int_equal(fp_sign_check_ch(sg, target, (size_t)len, key,
                                              strlen(key), ch->valuestring,
                                              strlen(ch->valuestring), 0), 0);
            assert_int_equal(fp_sign_check_ch(sg, target, (size_t)len, key,
                                              strlen(key), ch->valuestring,
                                              strlen(ch->valuestring) - 1, 0), -1);
            assert_int_equal(fp_sign_check(sg, target, (size_t)len, key,
                                           strlen(key), 0), -1);
        } else {
            assert_int_equal(fp_sign_check(sg, target, (size_t)len, key,
                                           strlen(key), 0), 0);
            assert_int_equal(fp_sign_check_ch(sg, target, (size_t)len, key,
                                              strlen(key), "", 0, 0), -1);
        }
        fp_signer_free(sg);
        n++;
    }
    assert_true(n >= 3);
}

static void test_compose(void **state)
{
    const cJSON *c;
    size_t n = 0;
    (void)state;

    cJSON_ArrayForEach(c, item(root, "compose")) {
        struct fp_ch_part user = { NULL, 0, NULL, 0 }, parts[FP_MAX_CHANNELS];
        const char *body = str(c, "body");
        const cJSON *pair;
        size_t np = 0, len, blen = strlen(body);
        char *out, tag[18];

        user.value = str(c, "user");
        user.len = strlen(user.value);
        cJSON_ArrayForEach(pair, item(c, "channels")) {
            assert_true(np < FP_MAX_CHANNELS && cJSON_GetArraySize(pair) == 2);
            parts[np].name = cJSON_GetArrayItem(pair, 0)->valuestring;
            parts[np].nlen = strlen(parts[np].name);
            parts[np].value = cJSON_GetArrayItem(pair, 1)->valuestring;
            parts[np].len = strlen(parts[np].value);
            np++;
        }
        len = fp_ch_compose(&user, parts, np, NULL, 0);
        assert_int_equal(len, blen);
        out = malloc(len);
        assert_non_null(out);
        /* Too small by one: the length, nothing past cap. */
        assert_int_equal(fp_ch_compose(&user, parts, np, out, len - 1), len);
        assert_int_equal(fp_ch_compose(&user, parts, np, out, len), len);
        assert_memory_equal(out, body, len);
        fp_etag_format(fp_etag_of(out, len), tag);
        assert_memory_equal(tag, str(c, "etag"), sizeof(tag));
        free(out);
        n++;
    }
    assert_true(n >= 3);
}

/* Bounds: FP_MAX_CHANNELS names of 64 bytes fit; one more name, a 65th
 * byte, or a value past the buffer are refused without overflow. */
static void test_bounds(void **state)
{
    static char target[3 * FP_CH_VALUE_MAX + 64];
    static struct fp_ch ch;
    size_t o;
    (void)state;

    o = (size_t)snprintf(target, sizeof(target), "/g?ch=");
    for (unsigned i = 0; i < FP_MAX_CHANNELS; i++) {
        o += (size_t)snprintf(target + o, sizeof(target) - o, "%s%03u", i ? "," : "", i);
        memset(target + o, 'x', 61);
        o += 61;
    }
    assert_int_equal(fp_ch_parse(target, o, FP_MAX_CHANNELS, &ch), FP_CH_OK);
    assert_int_equal(ch.n, FP_MAX_CHANNELS);
    assert_int_equal(ch.len, FP_CH_VALUE_MAX);
    assert_int_equal(fp_ch_parse(target, o, FP_MAX_CHANNELS - 1, &ch), FP_CH_TOO_MANY);
    /* Still decoded: a signature over them sends the poll to the app. */
    assert_int_equal(ch.len, FP_CH_VALUE_MAX);
    assert_int_equal(ch.n, 0);
    /* The last name one byte longer: the value overflows its buffer. */
    target[o] = 'x';
    assert_int_equal(fp_ch_parse(target, o + 1, FP_MAX_CHANNELS, &ch), FP_CH_BAD_NAME);
    assert_int_equal(ch.len, 0);
    /* The same bytes percent-encoded: three times as long, the same value. */
    o = (size_t)snprintf(target, sizeof(target), "/g?x=1&Ch=");
    for (unsigned i = 0; i < 20; i++)
        o += (size_t)snprintf(target + o, sizeof(target) - o, "%%%02X", 'a' + i);
    assert_int_equal(fp_ch_parse(target, o, 16, &ch), FP_CH_OK);
    assert_int_equal(ch.n, 1);
    assert_memory_equal(ch.value, "abcdefghijklmnopqrst", 20);
    /* No query, an empty query, a lone '&', a name in another case. */
    assert_int_equal(fp_ch_parse("/g", 2, 16, &ch), FP_CH_NONE);
    assert_int_equal(fp_ch_parse("/g?", 3, 16, &ch), FP_CH_NONE);
    assert_int_equal(fp_ch_parse("/g?&", 4, 16, &ch), FP_CH_NONE);
    assert_int_equal(fp_ch_parse("/g?cH=a&", 8, 16, &ch), FP_CH_OK);
    /* A target cut before its end is judged on the bytes given only. */
    assert_int_equal(fp_ch_parse("/g?ch=a&ch=b", 8, 16, &ch), FP_CH_OK);
    /* A bad value after a refused name: the first refusal counts. */
    assert_int_equal(fp_ch_parse("/g?ch=b,a,c%20", 14, 16, &ch), FP_CH_ORDER);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_names),
        cmocka_unit_test(test_ch),
        cmocka_unit_test(test_keys),
        cmocka_unit_test(test_sign),
        cmocka_unit_test(test_compose),
        cmocka_unit_test(test_bounds),
    };

    return cmocka_run_group_tests(tests, setup, teardown);
}

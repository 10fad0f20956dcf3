/* test_sign.c -- fp_sign()/fp_sign_check() against the shared vectors
 * (tests/vectors/signing.json, also run by the Python side), plus bounds
 * the vectors do not cover. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cJSON.h>

#include <sys/stat.h>
#include <unistd.h>

#include "read_file.h"
#include "../src/config.h"
#include "../src/sign.h"

#define VECTORS_DEFAULT "../../tests/vectors/signing.json"

static const char *str(const cJSON *obj, const char *name)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, name);

    assert_true(cJSON_IsString(v));
    return v->valuestring;
}

static cJSON *load(void)
{
    const char *path = getenv("FP_SIGN_VECTORS");
    char *text = read_file(path ? path : VECTORS_DEFAULT);
    cJSON *root;

    assert_non_null(text);
    root = cJSON_Parse(text);
    free(text);
    assert_non_null(root);
    return root;
}

static void test_sign_vectors(void **state)
{
    cJSON *root = load(), *c;
    size_t n = 0;
    (void)state;

    cJSON_ArrayForEach(c, cJSON_GetObjectItemCaseSensitive(root, "sign")) {
        char *secret = (char *)str(c, "secret");
        const char *exp = str(c, "exp"), *key = str(c, "key");
        struct fp_signer *sg = fp_signer_new(&secret, 1);
        char out[FP_SIG_LEN + 1];

        assert_non_null(sg);
        fp_sign(sg, exp, strlen(exp), key, strlen(key), out);
        assert_string_equal(out, str(c, "sig"));
        fp_signer_free(sg);
        n++;
    }
    assert_true(n > 0);
    cJSON_Delete(root);
}

static void test_check_vectors(void **state)
{
    cJSON *root = load(), *c;
    size_t n = 0, nvalid = 0;
    (void)state;

    cJSON_ArrayForEach(c, cJSON_GetObjectItemCaseSensitive(root, "check")) {
        char *secrets[FP_MAX_SIGN_SECRETS];
        size_t ns = 0;
        const cJSON *s;
        const char *target = str(c, "target"), *key = str(c, "key");
        const cJSON *now = cJSON_GetObjectItemCaseSensitive(c, "now");
        int want = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(c, "valid"));
        struct fp_signer *sg;
        int got;

        cJSON_ArrayForEach(s, cJSON_GetObjectItemCaseSensitive(c, "secrets")) {
            assert_true(ns < FP_MAX_SIGN_SECRETS && cJSON_IsString(s));
            secrets[ns++] = s->valuestring;
        }
        assert_true(cJSON_IsNumber(now));
        sg = fp_signer_new(secrets, ns);
        assert_non_null(sg);
        got = fp_sign_check(sg, target, strlen(target), key, strlen(key),
                            (long long)now->valuedouble) == 0;
        if (got != want)
            fail_msg("%s: %s: want %s", str(c, "why"), target,
                     want ? "valid" : "invalid");
        fp_signer_free(sg);
        n++;
        nvalid += (size_t)want;
    }
    assert_true(n > 10 && nvalid > 0 && nvalid < n);
    cJSON_Delete(root);
}

static void test_bounds(void **state)
{
    char secret[] = "0123456789abcdef0123456789abcdef";
    char *secrets[FP_MAX_SIGN_SECRETS + 1] = { secret, secret, secret, secret,
                                              secret };
    struct fp_signer *sg;
    char sig[FP_SIG_LEN + 1], target[256];
    const char *key = "/Poll/getMessages?user_id=1";
    (void)state;

    assert_null(fp_signer_new(secrets, 0));
    assert_null(fp_signer_new(secrets, FP_MAX_SIGN_SECRETS + 1));
    sg = fp_signer_new(secrets, 1);
    assert_non_null(sg);
    fp_sign(sg, "100", 3, key, strlen(key), sig);
    assert_int_equal(strlen(sig), FP_SIG_LEN);
    snprintf(target, sizeof(target), "/getMessages?user_id=1&exp=100&sig=%s", sig);
    assert_int_equal(fp_sign_check(sg, target, strlen(target), key, strlen(key), 99), 0);
    /* A target cut before its end is judged on the bytes given only. */
    assert_int_equal(fp_sign_check(sg, target, strlen(target) - 1, key,
                                   strlen(key), 99), -1);
    assert_int_equal(fp_sign_check(NULL, target, strlen(target), key,
                                   strlen(key), 99), -1);
    assert_int_equal(fp_sign_check(sg, NULL, 0, key, strlen(key), 99), -1);
    /* A NUL inside the signature does not end the comparison early. */
    target[strlen(target) - 5] = '\0';
    assert_int_equal(fp_sign_check(sg, target, strlen(target) + 5 , key,
                                   strlen(key), 99), -1);
    fp_signer_free(sg);
    fp_signer_free(NULL);
}

/* Writes text to a fresh file with the given mode; returns its path. */
static const char *secret_file(const char *text, mode_t mode)
{
    static char path[] = "/tmp/fp_test_secret_XXXXXX";
    int fd;

    strcpy(path, "/tmp/fp_test_secret_XXXXXX");
    fd = mkstemp(path);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, text, strlen(text)), (ssize_t)strlen(text));
    assert_int_equal(fchmod(fd, mode), 0);
    assert_int_equal(close(fd), 0);
    return path;
}

static int set_secret(struct fp_settings *s, const char *text, mode_t mode,
                      char *why, size_t whylen)
{
    const char *path = secret_file(text, mode);
    int rc = fp_config_set(s, "signing", "secret_file", path, why, whylen);

    assert_int_equal(unlink(path), 0);
    return rc;
}

#define S32 "0123456789abcdef0123456789abcdef"

static void test_config(void **state)
{
    struct fp_settings s;
    char err[FP_CONFIG_ERRLEN], why[256];
    (void)state;

    assert_int_equal(fp_config_defaults(&s, err, sizeof(err)), 0);
    assert_int_equal(s.nsign_secrets, 0); /* off unless configured */

    assert_int_equal(set_secret(&s, S32 "\n", 0600, why, sizeof(why)), 0);
    assert_int_equal(s.nsign_secrets, 1);
    assert_string_equal(s.sign_secrets[0], S32);
    assert_int_equal(set_secret(&s, S32 "a\r\n\n" S32 "b\n", 0640, why,
                                sizeof(why)), 0);
    assert_int_equal(s.nsign_secrets, 2);
    assert_string_equal(s.sign_secrets[1], S32 "b");

    /* Refused, and the old secrets stay: */
    assert_int_equal(set_secret(&s, S32 "\n", 0644, why, sizeof(why)), -1);
    assert_non_null(strstr(why, "0644"));
    assert_int_equal(set_secret(&s, S32 "\n", 0620, why, sizeof(why)), -1);
    assert_int_equal(set_secret(&s, "short\n", 0600, why, sizeof(why)), -1);
    assert_non_null(strstr(why, "line 1"));
    assert_null(strstr(why, "short")); /* never echo a secret */
    assert_int_equal(set_secret(&s, S32 " x\n", 0600, why, sizeof(why)), -1);
    assert_int_equal(set_secret(&s, "\n\n", 0600, why, sizeof(why)), -1);
    assert_int_equal(set_secret(&s, S32 "\n" S32 "\n" S32 "\n" S32 "\n" S32
                                "\n", 0600, why, sizeof(why)), -1);
    assert_int_equal(s.nsign_secrets, 2);
    assert_int_equal(fp_config_set(&s, "signing", "secret_file",
                                   "/nonexistent/x", why, sizeof(why)), -1);
    assert_int_equal(fp_config_set(&s, "signing", "ttl", "0", why,
                                   sizeof(why)), -1);
    assert_int_equal(fp_config_set(&s, "signing", "ttl", "3600", why,
                                   sizeof(why)), 0);

    /* exp and sig can never be keyed parameters. */
    assert_int_equal(fp_config_set(&s, "keys", "params", "user_id exp", why,
                                   sizeof(why)), -1);
    assert_int_equal(fp_config_set(&s, "keys", "params", "sig", why,
                                   sizeof(why)), -1);
    assert_int_equal(fp_config_set(&s, "keys", "params", "expires sigma", why,
                                   sizeof(why)), 0);

    /* Listeners: loopback or private addresses only. */
    {
        static const char *const ok[] = {
            "127.0.0.1", "127.8.9.10", "10.0.0.1", "172.16.0.1", "172.31.255.254",
            "192.168.1.1", "169.254.1.1", "100.64.0.1", "::1", "fd00::1",
            "fe80::1", "::ffff:10.1.2.3", "localhost",
        };
        static const char *const refused[] = {
            "0.0.0.0", "::", "8.8.8.8", "172.32.0.1", "172.15.255.255",
            "192.169.0.1", "100.128.0.1", "11.0.0.1", "2001:db8::1",
            "::ffff:8.8.8.8", "example.com", "poller1.internal",
        };
        for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++) {
            if (fp_config_set(&s, "server", "listen", ok[i], why, sizeof(why)) != 0)
                fail_msg("listen %s refused: %s", ok[i], why);
            assert_int_equal(fp_config_set(&s, "admin", "listen", ok[i], why,
                                           sizeof(why)), 0);
        }
        for (size_t i = 0; i < sizeof(refused) / sizeof(refused[0]); i++) {
            if (fp_config_set(&s, "server", "listen", refused[i], why,
                              sizeof(why)) == 0)
                fail_msg("listen %s accepted", refused[i]);
            assert_non_null(strstr(why, "private"));
            assert_int_equal(fp_config_set(&s, "admin", "listen", refused[i],
                                           why, sizeof(why)), -1);
        }
        /* A unix socket next to a private address is still fine. */
        assert_int_equal(fp_config_set(&s, "server", "listen",
                                       "10.0.0.1 unix:/run/p.sock", why,
                                       sizeof(why)), 0);
    }

    /* Empty: not signed. */
    assert_int_equal(fp_config_set(&s, "signing", "secret_file", "", why,
                                   sizeof(why)), 0);
    assert_int_equal(s.nsign_secrets, 0);
    fp_config_free(&s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sign_vectors),
        cmocka_unit_test(test_check_vectors),
        cmocka_unit_test(test_bounds),
        cmocka_unit_test(test_config),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

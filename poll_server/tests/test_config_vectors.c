/* test_config_vectors.c -- config.c against every case of the shared config
 * vectors (tests/vectors/config.json, also run by the app's reader in
 * fallback_app/tests/test_config_vectors.py): each INI text is written to a
 * file next to the vectors' secret files and loaded as main() loads it
 * (defaults, the file, fp_config_finish); a refusal must name the line and
 * the key. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cJSON.h>

#include "read_file.h"
#include "../src/config.h"

#define VECTORS_DEFAULT "../../tests/vectors/config.json"

static char dir[] = "/tmp/fp_config_vectors.XXXXXX";

static void write_file(const char *name, const char *text, mode_t mode)
{
    char path[256];
    size_t n = strlen(text);
    int fd;

    assert_true(snprintf(path, sizeof(path), "%s/%s", dir, name) <
                (int)sizeof(path));
    fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, text, n), (ssize_t)n);
    assert_int_equal(fchmod(fd, mode), 0); /* exact, whatever the umask */
    assert_int_equal(close(fd), 0);
}

/* The case's INI with every "{dir}" replaced (free it). */
static char *expand(const char *ini)
{
    size_t dl = strlen(dir), n = 0;
    char *out = malloc(strlen(ini) * (dl + 1) + 1);
    const char *p = ini;

    assert_non_null(out);
    while (*p) {
        if (strncmp(p, "{dir}", 5) == 0) {
            memcpy(out + n, dir, dl);
            n += dl;
            p += 5;
        } else {
            out[n++] = *p++;
        }
    }
    out[n] = '\0';
    return out;
}

/* Loads one case; returns the problem as text, or NULL if it went as
 * expected. */
static const char *run_case(const cJSON *c, const char *ini_path, char *err,
                            size_t errlen)
{
    const char *sides = cJSON_GetObjectItemCaseSensitive(c, "sides")->valuestring;
    const char *expect = cJSON_GetObjectItemCaseSensitive(c, "expect")->valuestring;
    const cJSON *key = cJSON_GetObjectItemCaseSensitive(c, "key");
    const cJSON *line = cJSON_GetObjectItemCaseSensitive(c, "line");
    /* app-only: a rule or section of the app's alone, which we must accept. */
    int want_ok = strcmp(expect, "accept") == 0 || strcmp(sides, "app-only") == 0;
    struct fp_settings s;
    char where[300];
    int rc;

    err[0] = '\0';
    assert_int_equal(fp_config_defaults(&s, err, errlen), 0);
    rc = fp_config_load_file(&s, ini_path, err, errlen);
    if (rc == 0)
        rc = fp_config_finish(&s, ini_path, err, errlen);
    fp_config_free(&s);
    if (want_ok)
        return rc == 0 ? NULL : "refused";
    if (rc == 0)
        return "accepted";
    assert_true(cJSON_IsNumber(line));
    (void)snprintf(where, sizeof(where), "%s:%d:", ini_path, line->valueint);
    if (strstr(err, where) == NULL)
        return "the message lacks the path and line";
    if (cJSON_IsString(key) && strstr(err, key->valuestring) == NULL)
        return "the message lacks the key";
    return NULL;
}

static void test_vectors(void **state)
{
    const char *path = getenv("FP_CONFIG_VECTORS");
    char *text, ini_path[256], err[FP_CONFIG_ERRLEN];
    cJSON *root, *files, *cases, *c;
    size_t ncases = 0, nfailed = 0;
    (void)state;

    text = read_file(path ? path : VECTORS_DEFAULT);
    assert_non_null(text);
    root = cJSON_Parse(text);
    assert_non_null(root);
    assert_non_null(mkdtemp(dir));
    files = cJSON_GetObjectItemCaseSensitive(root, "files");
    cJSON_ArrayForEach(c, files) {
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(c, "text");
        const cJSON *m = cJSON_GetObjectItemCaseSensitive(c, "mode");
        assert_true(cJSON_IsString(t) && cJSON_IsString(m));
        write_file(c->string, t->valuestring,
                   (mode_t)strtoul(m->valuestring, NULL, 8));
    }
    assert_true(snprintf(ini_path, sizeof(ini_path), "%s/fastpoll.ini", dir) <
                (int)sizeof(ini_path));
    cases = cJSON_GetObjectItemCaseSensitive(root, "cases");
    assert_true(cJSON_IsArray(cases));
    cJSON_ArrayForEach(c, cases) {
        const cJSON *ini = cJSON_GetObjectItemCaseSensitive(c, "ini");
        const cJSON *why = cJSON_GetObjectItemCaseSensitive(c, "why");
        const char *problem;
        char *expanded;

        assert_true(cJSON_IsString(ini) && cJSON_IsString(why));
        expanded = expand(ini->valuestring);
        write_file("fastpoll.ini", expanded, 0600);
        free(expanded);
        problem = run_case(c, ini_path, err, sizeof(err));
        if (problem != NULL) {
            /* Every failing case is listed before the test fails. */
            print_error("case \"%s\": %s (message: %s)\n", why->valuestring,
                        problem, err);
            nfailed++;
        }
        ncases++;
    }
    cJSON_ArrayForEach(c, files) {
        char p[256];
        (void)snprintf(p, sizeof(p), "%s/%s", dir, c->string);
        assert_int_equal(unlink(p), 0);
    }
    assert_int_equal(unlink(ini_path), 0);
    assert_int_equal(rmdir(dir), 0);
    cJSON_Delete(root);
    free(text);
    assert_true(ncases > 40);
    assert_int_equal(nfailed, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_vectors),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}

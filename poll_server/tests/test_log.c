/* test_log.c -- log.c: the time (ISO 8601, local, with its UTC offset), the
 * text line, and the JSON line ([log] format = json) read back by a JSON
 * parser: quotes, backslashes, control bytes and bytes that are not UTF-8
 * in the message, a message cut to fit, and a line written by fp_log to a
 * file. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cJSON.h>

#include "read_file.h"
#include "../src/log.h"

static void set_tz(const char *tz)
{
    assert_int_equal(setenv("TZ", tz, 1), 0);
    tzset();
}

/* The line parsed as one JSON object and nothing else (freed by the caller). */
static cJSON *parse_line(const char *line)
{
    cJSON *doc = cJSON_ParseWithOpts(line, NULL, 1);

    if (doc == NULL || !cJSON_IsObject(doc))
        fail_msg("not one JSON object: %s", line);
    return doc;
}

static const char *member(const cJSON *doc, const char *name)
{
    const cJSON *m = cJSON_GetObjectItemCaseSensitive(doc, name);

    if (!cJSON_IsString(m))
        fail_msg("no string member %s", name);
    return m->valuestring;
}

static void test_time_has_its_offset(void **state)
{
    char line[256];
    (void)state;

    set_tz("CET-1"); /* UTC+1, no summer time */
    fp_log_format_line(line, sizeof(line), FP_LOG_TEXT, 0, 123456, 42, FP_LOG_INFO, "hi");
    assert_string_equal(line, "1970-01-01T01:00:00.123+01:00 [42] info: hi");
    set_tz("EST5");
    fp_log_format_line(line, sizeof(line), FP_LOG_TEXT, 0, 0, 7, FP_LOG_ERROR, "x");
    assert_string_equal(line, "1969-12-31T19:00:00.000-05:00 [7] error: x");
    set_tz("IST-5:30");
    fp_log_format_line(line, sizeof(line), FP_LOG_TEXT, 1700000000, 999999, 1, FP_LOG_WARN, "");
    assert_string_equal(line, "2023-11-15T03:43:20.999+05:30 [1] warn: ");
    set_tz("UTC0");
    fp_log_format_line(line, sizeof(line), FP_LOG_TEXT, 0, 0, 1, FP_LOG_DEBUG, "a\nb\rc");
    assert_string_equal(line, "1970-01-01T00:00:00.000+00:00 [1] debug: a b c");
}

static void test_json_line_parses(void **state)
{
    char line[512];
    const char *msg = "say \"hi\" \\ now\nnext\tcol \x01\x1f\x7f caf\xc3\xa9 \xe2\x82\xac "
                      "\xf0\x9f\x98\x80 bad:\xff\xc0\xaf\xed\xa0\x80\xe2\x82 end";
    const char *want = "say \"hi\" \\ now\nnext\tcol \x01\x1f\x7f caf\xc3\xa9 \xe2\x82\xac "
                       "\xf0\x9f\x98\x80 bad:\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd"
                       "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd end";
    size_t n;
    cJSON *doc;
    (void)state;

    set_tz("CET-1");
    n = fp_log_format_line(line, sizeof(line), FP_LOG_JSON, 0, 5000, 4242, FP_LOG_WARN, msg);
    assert_int_equal(n, strlen(line));
    assert_null(strchr(line, '\n'));
    doc = parse_line(line);
    assert_string_equal(member(doc, "time"), "1970-01-01T01:00:00.005+01:00");
    assert_string_equal(member(doc, "level"), "warn");
    assert_string_equal(member(doc, "msg"), want);
    assert_true(cJSON_IsNumber(cJSON_GetObjectItemCaseSensitive(doc, "pid")));
    assert_int_equal(cJSON_GetObjectItemCaseSensitive(doc, "pid")->valueint, 4242);
    cJSON_Delete(doc);
}

/* A message longer than the line: cut between characters and escapes,
 * and the object still closed. */
static void test_json_cut_stays_valid(void **state)
{
    char line[160], big[3000];
    const char *m;
    size_t n;
    cJSON *doc;
    (void)state;

    set_tz("UTC0");
    memset(big, '"', sizeof(big) - 1);
    big[sizeof(big) - 1] = '\0';
    n = fp_log_format_line(line, sizeof(line), FP_LOG_JSON, 0, 0, 1, FP_LOG_INFO, big);
    assert_true(n < sizeof(line));
    doc = parse_line(line);
    m = member(doc, "msg");
    assert_true(strlen(m) > 10);
    assert_int_equal(strspn(m, "\""), strlen(m));
    cJSON_Delete(doc);

    for (size_t i = 0; i + 2 < sizeof(big); i += 2)
        memcpy(big + i, "\xc3\xa9", 2);
    big[sizeof(big) - 2] = '\0';
    for (size_t len = 100; len < sizeof(line); len++) { /* every cut point */
        n = fp_log_format_line(line, len, FP_LOG_JSON, 0, 0, 1, FP_LOG_INFO, big);
        assert_true(n < len);
        doc = parse_line(line);
        m = member(doc, "msg");
        assert_int_equal(strlen(m) % 2, 0);
        for (size_t i = 0; m[i] != '\0'; i += 2)
            assert_memory_equal(m + i, "\xc3\xa9", 2);
        cJSON_Delete(doc);
    }
}

/* fp_log itself, to a file: each event one line, each line one object. */
static void test_fp_log_writes_json_lines(void **state)
{
    char path[] = "/tmp/fp-test-log-XXXXXX";
    char *text, *nl, *line;
    int fd, lines = 0;
    cJSON *doc;
    (void)state;

    fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    assert_int_equal(fp_log_open(path), 0);
    fp_log_set_level(FP_LOG_INFO);
    fp_log_set_format(FP_LOG_JSON);
    fp_log(FP_LOG_DEBUG, "not logged below the level");
    fp_log(FP_LOG_WARN, "cache %s: \"%s\"\n", "127.0.0.1:11211", "gone");
    fp_log(FP_LOG_ERROR, "%d%%", 100);
    fp_log_set_format(FP_LOG_TEXT);
    fp_log(FP_LOG_INFO, "plain again");
    fp_log_close();
    text = read_file(path);
    assert_non_null(text);
    unlink(path);

    for (line = text; (nl = strchr(line, '\n')) != NULL; line = nl + 1, lines++) {
        *nl = '\0';
        if (lines == 2) {
            assert_non_null(strstr(line, "] info: plain again"));
            assert_true(line[0] == '2' && line[10] == 'T');
            continue;
        }
        doc = parse_line(line);
        assert_string_equal(member(doc, "level"), lines == 0 ? "warn" : "error");
        assert_string_equal(member(doc, "msg"),
                            lines == 0 ? "cache 127.0.0.1:11211: \"gone\"\n" : "100%");
        assert_int_equal(cJSON_GetObjectItemCaseSensitive(doc, "pid")->valueint,
                         (int)getpid());
        cJSON_Delete(doc);
    }
    assert_int_equal(lines, 3);
    assert_string_equal(line, "");
    free(text);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_time_has_its_offset),
        cmocka_unit_test(test_json_line_parses),
        cmocka_unit_test(test_json_cut_stays_valid),
        cmocka_unit_test(test_fp_log_writes_json_lines),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

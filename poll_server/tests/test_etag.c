/* test_etag.c -- etag.c: the tag of known bodies (the same as the app's
 * xxhash.xxh3_64_hexdigest) and If-None-Match as the app reads it (weak
 * comparison, lists, several lines, `*`; malformed or over 1,024 bytes
 * ignored). wait= and the pace: test_wait.c. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "../src/etag.h"

/* xxhash.xxh3_64_hexdigest(b"hello") and of b"" (docs/api.md). */
#define HELLO 0x9555e8555c62dcfdULL
#define EMPTY 0x2d06800538d394c2ULL

static void test_tag(void **state)
{
    char out[18];
    (void)state;

    assert_true(fp_etag_of("hello", 5) == HELLO);
    assert_true(fp_etag_of("", 0) == EMPTY);
    fp_etag_format(HELLO, out);
    assert_memory_equal(out, "\"9555e8555c62dcfd\"", 18);
    fp_etag_format(0x0102ULL, out);
    assert_memory_equal(out, "\"0000000000000102\"", 18);
}

/* Parses one header line; returns 1 if evaluated and matching HELLO,
 * 0 if evaluated and not matching, -1 if ignored. */
static int inm1(const char *v)
{
    struct fp_inm inm;
    const char *lines[1] = { v };
    size_t lens[1] = { strlen(v) };

    if (!fp_inm_parse(lines, lens, 1, &inm)) {
        assert_int_equal(fp_inm_match(&inm, HELLO), 0);
        return -1;
    }
    return fp_inm_match(&inm, HELLO);
}

static void test_if_none_match(void **state)
{
    (void)state;

    assert_int_equal(inm1("\"9555e8555c62dcfd\""), 1);
    assert_int_equal(inm1("W/\"9555e8555c62dcfd\""), 1);
    assert_int_equal(inm1("\"x\", W/\"9555e8555c62dcfd\""), 1);
    assert_int_equal(inm1(" , \"9555e8555c62dcfd\" ,"), 1);
    assert_int_equal(inm1("*"), 1);
    assert_int_equal(inm1("\"x\""), 0);
    assert_int_equal(inm1("\"9555E8555C62DCFD\""), 0);  /* opaque: bytes */
    assert_int_equal(inm1("\"9555e8555c62dcf\""), 0);
    assert_int_equal(inm1("\"\""), 0);
    /* Malformed: ignored. */
    assert_int_equal(inm1("9555e8555c62dcfd"), -1);
    assert_int_equal(inm1("w/\"9555e8555c62dcfd\""), -1);
    assert_int_equal(inm1("W/ \"9555e8555c62dcfd\""), -1);
    assert_int_equal(inm1("*, \"9555e8555c62dcfd\""), -1);
    assert_int_equal(inm1("\"a b\", \"9555e8555c62dcfd\""), -1);
    assert_int_equal(inm1("\"a\"b\""), -1);
    assert_int_equal(inm1("\""), -1);
    assert_int_equal(inm1(","), -1);
    assert_int_equal(inm1(""), -1);
    /* Control bytes anywhere (the parser lets them through): ignored. */
    assert_int_equal(inm1("\"9555e8555c62dcfd\x01\""), -1);
    assert_int_equal(inm1("\x7f\"9555e8555c62dcfd\""), -1);
    assert_int_equal(inm1("\"9555e8555c62dcfd\", \x01"), -1);
    assert_int_equal(inm1("*\x01"), -1);
    assert_int_equal(inm1("\x01"), -1);
}

static void test_lines_and_size(void **state)
{
    struct fp_inm inm;
    const char *lines[2] = { "\"a\"", "\"9555e8555c62dcfd\"" };
    size_t lens[2] = { 3, 18 };
    char *big;
    size_t n;
    (void)state;

    assert_int_equal(fp_inm_parse(lines, lens, 2, &inm), 1);
    assert_int_equal(fp_inm_match(&inm, HELLO), 1);
    /* `*` on one of several lines: "*, ..." joined, malformed. */
    lines[0] = "*";
    lens[0] = 1;
    assert_int_equal(fp_inm_parse(lines, lens, 2, &inm), 0);
    /* 1,024 bytes in all is evaluated, 1,025 ignored. */
    big = malloc(FP_INM_MAX + 2);
    assert_non_null(big);
    memcpy(big, "\"9555e8555c62dcfd\", \"", 21);
    n = FP_INM_MAX - 1;
    memset(big + 21, 'x', n - 21);
    big[n] = '"';
    lines[0] = big;
    lens[0] = n + 1;
    assert_int_equal(fp_inm_parse(lines, lens, 1, &inm), 1);
    assert_int_equal(fp_inm_match(&inm, HELLO), 1);
    big[n] = 'x';
    big[n + 1] = '"';
    lens[0] = n + 2;
    assert_int_equal(fp_inm_parse(lines, lens, 1, &inm), 0);
    free(big);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tag),
        cmocka_unit_test(test_if_none_match),
        cmocka_unit_test(test_lines_and_size),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

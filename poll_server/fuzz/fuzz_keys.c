/* fuzz_keys.c -- libFuzzer target: the request-target -> cache key function
 * (keys.c) and the signature check that runs on the same bytes (sign.c).
 *
 * Input: one byte choosing the output capacity, then the request-target.
 * Properties checked on every input, beyond "no crash, no sanitizer report":
 * - a key is at most FP_MAX_KEY_LEN bytes, NUL-terminated at its length,
 *   starts with the prefix and holds only 0x21..0x7E: nothing a memcached
 *   or Redis command line could split on;
 * - a key is canonical: the key without its prefix, as a target, derives
 *   the same key (so app and server cannot disagree on a re-encoded URL);
 * - a smaller output buffer never gives a different key, only none;
 * - the signature check never accepts a signature it did not make. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../src/keys.h"
#include "../src/sign.h"

#define PREFIX "/Poll"

static char *params[] = { "channel", "user_id" }; /* sorted, as config.c keeps them */
static struct fp_signer *signer;

static void check(int ok, const char *what, const uint8_t *data, size_t size)
{
    if (ok)
        return;
    fprintf(stderr, "property failed: %s (%zu bytes of input)\n", what, size);
    (void)data;
    abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char key[FP_MAX_KEY_LEN + 1], again[FP_MAX_KEY_LEN + 1];
    char small[FP_MAX_KEY_LEN + 1];
    const char *target;
    size_t tlen, cap;
    ssize_t n, m;

    if (signer == NULL) {
        char *secrets[] = { "fuzz-secret-0123456789abcdef0123456789" };
        signer = fp_signer_new(secrets, 1);
        if (signer == NULL)
            abort();
    }
    if (size < 1)
        return 0;
    cap = (size_t)data[0] % (FP_MAX_KEY_LEN + 2); /* 0 .. 251 */
    target = (const char *)data + 1;
    tlen = size - 1;

    n = key_derive(PREFIX, params, 2, target, tlen, key, sizeof(key));
    if (n >= 0) {
        check((size_t)n <= FP_MAX_KEY_LEN, "key too long", data, size);
        check(strlen(key) == (size_t)n, "key length", data, size);
        check(strncmp(key, PREFIX, strlen(PREFIX)) == 0, "prefix", data, size);
        for (ssize_t i = 0; i < n; i++)
            check(key[i] > 0x20 && key[i] < 0x7F, "key byte", data, size);
        m = key_derive(PREFIX, params, 2, key + strlen(PREFIX),
                       (size_t)n - strlen(PREFIX), again, sizeof(again));
        check(m == n && memcmp(key, again, (size_t)n) == 0, "canonical", data,
              size);
    }

    /* A smaller buffer: the same key if it fits, else none. */
    if (cap > 0) {
        m = key_derive(PREFIX, params, 2, target, tlen, small, cap);
        if (m >= 0)
            check(n == m && memcmp(key, small, (size_t)m + 1) == 0,
                  "small buffer", data, size);
        else
            check(n < 0 || (size_t)n >= cap, "small buffer refused", data, size);
    }

    /* The check parses the query of the same bytes; a fuzzer cannot guess
     * an HMAC, so it must never accept. */
    if (n >= 0)
        check(fp_sign_check(signer, target, tlen, key, (size_t)n, 0) != 0,
              "forged signature accepted", data, size);
    return 0;
}

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
 * - the signature check never accepts a signature it did not make;
 * - `ch` (channels.c): a value it accepts is 1..FP_MAX_CHANNELS valid
 *   names, strictly ascending, that joined with ',' are the decoded value;
 *   their keys are printable without spaces; nothing is read or written
 *   outside the buffers whatever the value (ASan). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../src/channels.h"
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

/* The properties of an accepted `ch` (see the top of the file). */
static void check_ch(const char *target, size_t tlen, unsigned max,
                     const uint8_t *data, size_t size)
{
    static struct fp_ch ch;
    char key[FP_CH_KEY_MAX + 1];
    size_t joined = 0;
    int rc = fp_ch_parse(target, tlen, max, &ch);

    check(rc >= FP_CH_ORDER && rc <= FP_CH_OK, "ch result", data, size);
    check(ch.len <= FP_CH_VALUE_MAX, "ch value length", data, size);
    if (rc != FP_CH_OK) {
        check(ch.n == 0, "ch names on a refusal", data, size);
        return;
    }
    check(ch.n >= 1 && ch.n <= max, "ch count", data, size);
    for (size_t i = 0; i < ch.n; i++) {
        const char *name = ch.value + ch.off[i];
        ssize_t kl;

        check(fp_ch_name_valid(name, ch.nlen[i]), "ch name", data, size);
        check(ch.off[i] == joined, "ch names joined", data, size);
        joined += ch.nlen[i] + 1;
        if (i > 0) {
            const char *p = ch.value + ch.off[i - 1];
            size_t pl = ch.nlen[i - 1], m = pl < ch.nlen[i] ? pl : ch.nlen[i];
            int c = memcmp(p, name, m);
            check(c < 0 || (c == 0 && pl < ch.nlen[i]), "ch order", data, size);
            check(ch.value[ch.off[i] - 1] == ',', "ch comma", data, size);
        }
        kl = fp_ch_key(PREFIX, name, ch.nlen[i], key, sizeof(key));
        check(kl > 0 && (size_t)kl <= FP_CH_KEY_MAX, "ch key length", data, size);
        for (ssize_t k = 0; k < kl; k++)
            check(key[k] > 0x20 && key[k] < 0x7F, "ch key byte", data, size);
    }
    check(joined - 1 == ch.len, "ch value is the names", data, size);
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

    /* The same bytes' `ch`, under a max the first byte picks. */
    check_ch(target, tlen, 1u + (unsigned)data[0] % FP_MAX_CHANNELS, data, size);
    return 0;
}

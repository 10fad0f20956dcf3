/* sign.c -- HMAC-SHA256 poll URL signatures (sign.h, docs/security.md).
 * Nettle's HMAC: a keyed context is computed once per secret and copied per
 * request, so a check costs two SHA-256 compressions and no allocation. */
#include <stdlib.h>
#include <string.h>

#include <nettle/hmac.h>
#include <nettle/memops.h>

#include "sign.h"

struct fp_signer {
    size_t n;
    struct hmac_sha256_ctx keyed[FP_MAX_SIGN_SECRETS];
};

struct fp_signer *fp_signer_new(char *const *secrets, size_t nsecrets)
{
    struct fp_signer *sg;

    if (nsecrets == 0 || nsecrets > FP_MAX_SIGN_SECRETS)
        return NULL;
    if ((sg = calloc(1, sizeof(*sg))) == NULL)
        return NULL;
    sg->n = nsecrets;
    for (size_t i = 0; i < nsecrets; i++)
        hmac_sha256_set_key(&sg->keyed[i], strlen(secrets[i]),
                            (const uint8_t *)secrets[i]);
    return sg;
}

void fp_signer_free(struct fp_signer *sg)
{
    if (sg == NULL)
        return;
    /* The keyed contexts are as good as the secrets. */
    explicit_bzero(sg, sizeof(*sg));
    free(sg);
}

/* 32 bytes -> 43 characters of base64url, no padding, and a NUL. */
static void b64url(const uint8_t d[SHA256_DIGEST_SIZE], char out[FP_SIG_LEN + 1])
{
    static const char tab[] =
        "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    size_t i, o = 0;

    for (i = 0; i + 3 <= SHA256_DIGEST_SIZE; i += 3) {
        unsigned v = (unsigned)d[i] << 16 | (unsigned)d[i + 1] << 8 | d[i + 2];
        out[o++] = tab[v >> 18 & 63];
        out[o++] = tab[v >> 12 & 63];
        out[o++] = tab[v >> 6 & 63];
        out[o++] = tab[v & 63];
    }
    /* 32 = 30 + 2: the last two bytes give three characters. */
    {
        unsigned v = (unsigned)d[30] << 8 | d[31];
        out[o++] = tab[v >> 10 & 63];
        out[o++] = tab[v >> 4 & 63];
        out[o++] = tab[(v << 2) & 63];
    }
    out[o] = '\0';
}

/* "<exp>:<key>", or "<exp>:<key> <ch>" with channels (docs/channels.md):
 * a key has no space, so the two forms cannot be confused. */
static void sign_with(const struct hmac_sha256_ctx *keyed, const char *exp,
                      size_t exp_len, const char *key, size_t keylen,
                      const char *ch, size_t ch_len, char out[FP_SIG_LEN + 1])
{
    struct hmac_sha256_ctx c = *keyed;
    uint8_t d[SHA256_DIGEST_SIZE];

    hmac_sha256_update(&c, exp_len, (const uint8_t *)exp);
    hmac_sha256_update(&c, 1, (const uint8_t *)":");
    hmac_sha256_update(&c, keylen, (const uint8_t *)key);
    if (ch != NULL) {
        hmac_sha256_update(&c, 1, (const uint8_t *)" ");
        hmac_sha256_update(&c, ch_len, (const uint8_t *)ch);
    }
    hmac_sha256_digest(&c, sizeof(d), d);
    b64url(d, out);
}

void fp_sign(const struct fp_signer *sg, const char *exp, size_t exp_len,
             const char *key, size_t keylen, char out[FP_SIG_LEN + 1])
{
    sign_with(&sg->keyed[0], exp, exp_len, key, keylen, NULL, 0, out);
}

void fp_sign_ch(const struct fp_signer *sg, const char *exp, size_t exp_len,
                const char *key, size_t keylen, const char *ch, size_t ch_len,
                char out[FP_SIG_LEN + 1])
{
    sign_with(&sg->keyed[0], exp, exp_len, key, keylen, ch, ch_len, out);
}

/* exp: 1..19 decimal digits, later than now. */
static int exp_valid(const char *s, size_t n, long long now)
{
    unsigned long long v = 0;

    if (n == 0 || n > FP_MAX_EXP_DIGITS)
        return 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9')
            return 0;
        v = v * 10 + (unsigned)(s[i] - '0'); /* 19 digits cannot overflow */
    }
    return v > (unsigned long long)(now < 0 ? 0 : now);
}

int fp_sign_check(const struct fp_signer *sg, const char *target,
                  size_t target_len, const char *key, size_t keylen,
                  long long now)
{
    return fp_sign_check_ch(sg, target, target_len, key, keylen, NULL, 0, now);
}

int fp_sign_check_ch(const struct fp_signer *sg, const char *target,
                     size_t target_len, const char *key, size_t keylen,
                     const char *ch, size_t ch_len, long long now)
{
    const char *q, *exp = NULL, *sig = NULL;
    size_t qlen, exp_len = 0, sig_len = 0;
    char want[FP_SIG_LEN + 1];
    int ok = 0;

    if (sg == NULL || target == NULL)
        return -1;
    q = memchr(target, '?', target_len);
    if (q == NULL)
        return -1;
    q++;
    qlen = target_len - (size_t)(q - target);

    /* Raw names, no decoding: the app writes exactly "exp=" and "sig=". */
    for (size_t i = 0; i < qlen;) {
        const char *piece = q + i, *amp = memchr(piece, '&', qlen - i);
        size_t plen = amp ? (size_t)(amp - piece) : qlen - i;

        i += plen + 1;
        if (plen >= 4 && memcmp(piece, "exp=", 4) == 0) {
            if (exp != NULL)
                return -1; /* a repeat: which one would count? */
            exp = piece + 4;
            exp_len = plen - 4;
        } else if (plen >= 4 && memcmp(piece, "sig=", 4) == 0) {
            if (sig != NULL)
                return -1;
            sig = piece + 4;
            sig_len = plen - 4;
        }
    }
    if (exp == NULL || sig == NULL || sig_len != FP_SIG_LEN ||
        !exp_valid(exp, exp_len, now))
        return -1;
    for (size_t k = 0; k < sg->n; k++) {
        sign_with(&sg->keyed[k], exp, exp_len, key, keylen, ch, ch_len, want);
        ok |= memeql_sec(want, sig, FP_SIG_LEN);
    }
    explicit_bzero(want, sizeof(want));
    return ok ? 0 : -1;
}

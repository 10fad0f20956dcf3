/* sign.h -- signed, expiring poll URLs (docs/security.md).
 *
 * The app hands each client a poll URL that carries
 *     exp=<unix seconds>&sig=<base64url(HMAC-SHA256(secret, "<exp>:<key>"))>
 * where <key> is the cache key the request derives (docs/keys.md). The
 * poll server checks it before the cache sees the request; the app checks
 * it on the fallback path. exp and sig are not keyed parameters, so they
 * never enter the key. A poll with channels (docs/channels.md) signs
 * "<exp>:<key> <ch>" instead. The Python twin is fallback_app/fastpoll_app/
 * signing.py; both run tests/vectors/signing.json and channels.json. */
#ifndef FP_SIGN_H
#define FP_SIGN_H

#include <stddef.h>

#include "settings.h"

#define FP_SIG_LEN          43  /* base64url of 32 bytes, no padding */
#define FP_SIGN_SECRET_MIN  32
#define FP_SIGN_SECRET_MAX  1024
#define FP_MAX_EXP_DIGITS   19

struct fp_signer;

/* Precomputes one HMAC context per secret (NUL-terminated strings).
 * Returns NULL when nsecrets is 0 or out of range, or out of memory. */
struct fp_signer *fp_signer_new(char *const *secrets, size_t nsecrets);

void fp_signer_free(struct fp_signer *sg);

/* The signature of key until exp (decimal text, exp_len bytes) with the
 * first secret: FP_SIG_LEN characters and a NUL into out. */
void fp_sign(const struct fp_signer *sg, const char *exp, size_t exp_len,
             const char *key, size_t keylen, char out[FP_SIG_LEN + 1]);

/* The same with channels: the signature of key and ch (the decoded `ch`
 * value, docs/channels.md), "<exp>:<key> <ch>". */
void fp_sign_ch(const struct fp_signer *sg, const char *exp, size_t exp_len,
                const char *key, size_t keylen, const char *ch, size_t ch_len,
                char out[FP_SIG_LEN + 1]);

/* 0 if the query of target (raw request-target, target_len bytes) carries
 * exactly one exp and one sig, exp is 1..19 digits later than now, and sig
 * is the signature of key under one of the secrets; -1 otherwise. No
 * allocation; constant-time comparison. */
int fp_sign_check(const struct fp_signer *sg, const char *target,
                  size_t target_len, const char *key, size_t keylen,
                  long long now);

/* fp_sign_check of a poll with channels: sig must be the signature of key
 * and ch; ch NULL is fp_sign_check. */
int fp_sign_check_ch(const struct fp_signer *sg, const char *target,
                     size_t target_len, const char *key, size_t keylen,
                     const char *ch, size_t ch_len, long long now);

#endif

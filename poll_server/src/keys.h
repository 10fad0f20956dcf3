/* keys.h -- request-target -> cache key, as specified in docs/keys.md.
 * The Python twin is fallback_app/fastpoll_app/keys.py (derive_key); both
 * run tests/vectors/keys.json. */
#ifndef FP_KEYS_H
#define FP_KEYS_H

#include <stddef.h>
#include <sys/types.h>

#include "settings.h"

/* Derives the cache key of `target` (the raw request-target, target_len
 * bytes, need not be NUL-terminated).
 *   prefix:  0..FP_MAX_PREFIX_LEN bytes of 0x21-0x7E, NUL-terminated.
 *   params:  nparams (<= FP_MAX_PARAMS) distinct names of 1..FP_MAX_PARAM_LEN
 *            bytes of [A-Za-z0-9_.-], sorted bytewise (strcmp); config.c
 *            guarantees this.
 *   out:     outcap bytes; outcap >= FP_MAX_KEY_LEN + 1 always suffices.
 * Returns the key length (<= FP_MAX_KEY_LEN) with out NUL-terminated, or -1
 * if the request is invalid (or the key does not fit in outcap).
 * No allocation, no state: safe to call on the hot path. */
ssize_t key_derive(const char *prefix, char *const *params, size_t nparams,
                   const char *target, size_t target_len,
                   char *out, size_t outcap);

/* Decodes the byte at s[*i] (s has n bytes, *i < n): %XX (either case of
 * hex digit), or '+' as a space if `plus`. Returns the byte, or -1 on a
 * malformed escape. Advances *i past what it read. */
int key_decode_byte(const char *s, size_t n, size_t *i, int plus);

#endif

/* channels.h -- a poll for a user and the channels (rooms) it reads
 * (docs/channels.md): the `ch` parameter, channel keys and the composed
 * answer. Pure functions on the caller's buffers, no allocation. The
 * Python twin is fallback_app/fastpoll_app/channels.py; both run
 * tests/vectors/channels.json. The request flow is chpoll.c's. */
#ifndef FP_CHANNELS_H
#define FP_CHANNELS_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "settings.h"

/* The longest valid decoded `ch`: FP_MAX_CHANNELS names of the longest
 * length and the commas between them. */
#define FP_CH_VALUE_MAX (FP_MAX_CHANNELS * (FP_MAX_CHANNEL_NAME + 1) - 1)
/* A channel key: prefix, '#', name. */
#define FP_CH_KEY_MAX   (FP_MAX_PREFIX_LEN + 1 + FP_MAX_CHANNEL_NAME)

/* fp_ch_parse's results: none, valid, or why it is refused (in the order
 * docs/channels.md checks). */
enum fp_ch_result {
    FP_CH_NONE = 0,     /* no ch: a plain poll */
    FP_CH_OK = 1,
    FP_CH_TWICE = -1,   /* given more than once, in any case */
    FP_CH_ESCAPE = -2,  /* a malformed %-escape */
    FP_CH_EMPTY = -3,   /* empty, or without '=' */
    FP_CH_TOO_MANY = -4,/* more than [channels] max names */
    FP_CH_EMPTY_NAME = -5,
    FP_CH_BAD_NAME = -6,/* not 1..64 bytes of [A-Za-z0-9_.-] */
    FP_CH_ORDER = -7    /* not strictly ascending bytewise */
};

/* A parsed `ch`: its decoded value (what a signature covers) and the
 * names in it. */
struct fp_ch {
    size_t len;                 /* of value; 0 if not decoded */
    char value[FP_CH_VALUE_MAX + 1];
    size_t n;                   /* names, when FP_CH_OK */
    uint16_t off[FP_MAX_CHANNELS];
    uint8_t nlen[FP_MAX_CHANNELS];
};

/* Reads `ch` from the query of target (the raw request-target, len bytes):
 * pieces split on '&', a piece is ch when its raw name (up to the first
 * '=') is "ch" in any ASCII case; the value is form-decoded (%XX, '+' is a
 * space), split on ',' and checked against max (1..FP_MAX_CHANNELS).
 * Returns an enum fp_ch_result. out->value holds the decoded value unless
 * ch is absent, repeated, malformed, of more than FP_MAX_CHANNELS names or
 * longer than FP_CH_VALUE_MAX (more than max names: it does, for the
 * signature; out->n is 0). */
int fp_ch_parse(const char *target, size_t len, unsigned max, struct fp_ch *out);

/* The refusal's words, for the log. */
const char *fp_ch_strerror(int result);

/* Is name[0..len) a valid channel name? */
int fp_ch_name_valid(const char *name, size_t len);

/* The channel's cache key, prefix + '#' + name, NUL-terminated into out.
 * Returns its length, or -1 if it does not fit in cap. */
ssize_t fp_ch_key(const char *prefix, const char *name, size_t nlen, char *out,
                  size_t cap);

/* One part of a composed answer: the name (unused for the user's part)
 * and the value's bytes as cached; an empty value is written `null`. */
struct fp_ch_part {
    const char *name;
    size_t nlen;
    const char *value;
    size_t len;
};

/* The composed answer {"user":U,"channels":{"a":A,...}} of the user's part
 * and n channel parts, in their order, into out (cap bytes; out may be
 * NULL with cap 0 to size it). Returns its length; it was written only if
 * that is at most cap. */
size_t fp_ch_compose(const struct fp_ch_part *user,
                     const struct fp_ch_part *chans, size_t n, char *out,
                     size_t cap);

#endif

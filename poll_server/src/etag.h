/* etag.h -- conditional polls (docs/api.md, "Conditional and long polls"):
 * the ETag of an answer and If-None-Match (wait= and the pace: wait.h).
 * Pure functions on the caller's buffers: no allocation. */
#ifndef FP_ETAG_H
#define FP_ETAG_H

#include <stddef.h>
#include <stdint.h>

/* The whole If-None-Match (its lines joined with ", ") longer than this is
 * ignored, as the app does (fallback_app/fastpoll_app/conditional.py). */
#define FP_INM_MAX 1024
/* Tags of ours kept from one If-None-Match: a client sends one. Kept small
 * because a held poll keeps its parsed list (51 would fit in 1,024 bytes);
 * a 9th tag and later ones are not compared, so such a list can only miss
 * a 304 and get the full answer, never a wrong 304 (docs/api.md). */
#define FP_INM_TAGS 8

/* A parsed If-None-Match, kept with the request (the head's bytes may move
 * while a poll is held). */
struct fp_inm {
    int star;                   /* "*": matches any current answer */
    unsigned ntags;
    uint64_t tags[FP_INM_TAGS]; /* opaque tags that are 16 lowercase hex */
};

/* XXH3-64 of the body (seed 0). */
uint64_t fp_etag_of(const char *body, size_t len);

/* Writes the header value `"<16 lowercase hex>"` (18 bytes, no NUL). */
void fp_etag_format(uint64_t tag, char out[18]);

/* Parses the If-None-Match lines (values without the name, trimmed) into
 * *out. Returns 1 if the header is to be evaluated, 0 if it is absent,
 * malformed or over FP_INM_MAX (then it is ignored: *out matches nothing). */
int fp_inm_parse(const char *const *lines, const size_t *lens, size_t nlines,
                 struct fp_inm *out);

/* Does the parsed If-None-Match match the answer tagged `tag`? (Weak
 * comparison: W/ was disregarded by fp_inm_parse.) */
int fp_inm_match(const struct fp_inm *inm, uint64_t tag);

#endif

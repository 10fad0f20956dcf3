/* announce.h -- the subscriber to the app's announcements (docs/api.md,
 * "Announcements"): one hiredis async connection per process, SUBSCRIBEd
 * to [announce] channel on [announce] server, or on [redis] server with the
 * Redis backend. Each message is a cache key the app has just written, and
 * (since the publish-to-delivery metric) when it was published. */
#ifndef FP_ANNOUNCE_H
#define FP_ANNOUNCE_H

#include <stddef.h>
#include <stdint.h>

struct event_base;
struct fp_settings;
struct fp_announce;

/* A message: the key's bytes (not terminated; len may be anything), and
 * when the app published it (Unix ms), 0 if the message does not say. */
typedef void fp_announce_msg(void *arg, const char *key, size_t len,
                             uint64_t published_ms);
/* The subscription is (re)established (subscribed 1: announcements may have
 * been lost meanwhile) or lost (0). */
typedef void fp_announce_state(void *arg, int subscribed);

/* Starts subscribing (connects lazily, never blocks, reconnects forever).
 * Returns 0 with *out set, or with *out NULL when there is nothing to
 * subscribe to (memcached without [announce] server); -1 if out of memory
 * or the host cannot be resolved (once, here: never on the loop). */
int fp_announce_new(struct event_base *base, const struct fp_settings *s,
                    fp_announce_msg *msg, fp_announce_state *state, void *arg,
                    struct fp_announce **out);

/* Splits a message, `<key>` or `<key> <unix_ms>` (keys never hold a space;
 * unix_ms is 1-15 decimal digits, nothing else): *keylen is the key's
 * length and *published_ms the time, or 0. Returns 0, or -1 if a suffix is
 * there but malformed (it is ignored: *keylen stops at the space, and
 * *published_ms is 0). */
int fp_announce_parse(const char *msg, size_t len, size_t *keylen,
                      uint64_t *published_ms);

/* 1 while subscribed; 0 while down, and for NULL (nothing to subscribe to). */
int fp_announce_subscribed(const struct fp_announce *a);

/* Closes the connection; no callback after this. NULL is a no-op. */
void fp_announce_free(struct fp_announce *a);

#endif

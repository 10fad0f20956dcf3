/* announce.h -- the subscriber to the app's announcements (docs/api.md,
 * "Announcements"): one hiredis async connection per process, SUBSCRIBEd
 * to [announce] channel on [announce] server, or on [redis] server with the
 * Redis backend. Each message is a cache key the app has just written. */
#ifndef FP_ANNOUNCE_H
#define FP_ANNOUNCE_H

#include <stddef.h>

struct event_base;
struct fp_settings;
struct fp_announce;

/* A message: the key's bytes (not terminated; len may be anything). */
typedef void fp_announce_msg(void *arg, const char *key, size_t len);
/* The subscription is (re)established: announcements may have been lost. */
typedef void fp_announce_up(void *arg);

/* Starts subscribing (connects lazily, never blocks, reconnects forever).
 * Returns 0 with *out set, or with *out NULL when there is nothing to
 * subscribe to (memcached without [announce] server); -1 if out of memory. */
int fp_announce_new(struct event_base *base, const struct fp_settings *s,
                    fp_announce_msg *msg, fp_announce_up *up, void *arg,
                    struct fp_announce **out);

/* Closes the connection; no callback after this. NULL is a no-op. */
void fp_announce_free(struct fp_announce *a);

#endif

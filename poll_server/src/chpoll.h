/* chpoll.h -- polls with channels (docs/channels.md): a poll URL with `ch`
 * reads the user's key and each channel's key in the same loop turn (one
 * multi-get once the cache batches a turn's gets), through a coalescer of
 * their own, and answers the composed body of the parts (channels.c) with
 * its ETag: 200, 304, or held on every part's key (hold.c's sets) until one
 * changes, then all parts are read again. A part that misses sends the
 * whole poll to the app (404), one that fails 503 (nginx asks the app too).
 *
 * The connection is HELD from the dispatch to the answer, its timer armed
 * (the wait, or request_timeout_ms as a bound it never reaches: the cache
 * answers within its timeout): http.c's abandon() lets go of a held poll
 * through its hold slot, so a client that goes away while the parts are
 * read lets go of their waiters too (fp_hold_remove(&r->held) -> the set's
 * ended()). */
#ifndef FP_CHPOLL_H
#define FP_CHPOLL_H

#include <stddef.h>
#include <sys/types.h>

#include "cache.h"
#include "hold.h"
#include "httpparse.h"
#include "request.h"
#include "stats.h"

struct fp_coalesce_stats;
struct fp_settings;
struct fp_signer;
struct fp_chpolls;

struct fp_chpolls *fp_chpolls_new(struct fp_cache *cache, struct fp_hold *ho,
                                  const struct fp_settings *s);

/* Frees them; every connection must have been closed (fp_conns_free) and
 * the cache freed first. */
void fp_chpolls_free(struct fp_chpolls *cp);

/* The request head hd of r (whose user key is r->key, keylen < 0 if none)
 * is in: reads its `ch`. Returns 0 for a poll without `ch` (the caller goes
 * on as before), else the verdict: 0 is not possible then; FP_CHPOLL_OK
 * for a valid poll with channels (answered by fp_chpoll_dispatch, which
 * must come next, in the same turn), or the refusal 403 (no valid
 * signature of key and ch while signer is set) or 404 (a refused ch:
 * nginx asks the app, which says why; never sent to a cache). */
#define FP_CHPOLL_OK 1
int fp_chpoll_start(struct fp_chpolls *cp, struct fp_request *r,
                    const struct fp_http_head *hd, ssize_t keylen,
                    const struct fp_signer *signer, long long now,
                    enum fp_stat_outcome *outcome);

/* Is r the poll fp_chpoll_start just accepted? (Forgets it.) */
int fp_chpoll_pending(struct fp_chpolls *cp, const struct fp_request *r);

/* Serves r (counted in flight already): reads its parts. Returns as
 * fp_conn_ops.dispatch (1: the connection waits). */
int fp_chpoll_dispatch(struct fp_chpolls *cp, struct fp_request *r);

/* Is r a poll with channels being served? */
int fp_chpoll_is(const struct fp_request *r);

/* r's wait is over, or the server drains: a poll held on its parts is
 * answered 304 now; one whose parts are being read is answered when they
 * are, and is not held then. */
void fp_chpoll_end(struct fp_request *r, enum fp_stat_wake cause);

/* r's stream ends (chpoll's poll with channels, its head out): lets go
 * of its parts' reads and watches. */
void fp_chpoll_stream_release(struct fp_request *r);

/* Adds the counters of the parts' coalescer to *out (admin.c's /metrics). */
void fp_chpolls_coalesce_stats(const struct fp_chpolls *cp,
                               struct fp_coalesce_stats *out);

/* Answers every poll whose parts are being read with status (a shutdown
 * that stops waiting for the cache). */
void fp_chpolls_fail_all(struct fp_chpolls *cp, enum fp_cache_status status);

#endif

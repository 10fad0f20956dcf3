/* health.h -- the failure model both cache backends share (one server's
 * view of another; docs/design.md, "Failure model").
 *
 * - A request not answered within timeout_ms fails alone (TIMEOUT) if
 *   anything came from the server during the last timeout_ms: it is slow,
 *   not gone; its answer is read and dropped when it comes.
 * - Only total silence for timeout_ms marks the server hung: the
 *   connection is dropped and retried after the backoff.
 * - A connection that was answering and drops is retried at once; every
 *   later attempt waits the backoff: 100 ms doubling to 2 s, each delay
 *   jittered (a random 50..100% of it) so that a fleet of pollers does
 *   not reconnect in step.
 * - Only a good, fully parsed answer resets the backoff: not a connect (a
 *   stopped server's kernel still accepts), not an error reply (Redis's
 *   "max number of clients"), not a value we had to skip. */
#ifndef FP_HEALTH_H
#define FP_HEALTH_H

#include <stdint.h>

#define FP_BACKOFF_MIN_MS 100
#define FP_BACKOFF_MAX_MS 2000

struct fp_health {
    unsigned backoff_ms;   /* the next delay before jitter; 0: at once */
    int hung;              /* the last failure was silence or a bad answer */
    uint64_t last_rx_ms;   /* fp_mono_ms() when bytes last came, 0: none */
};

uint64_t fp_mono_ms(void);

/* Bytes came from the server (any: a late answer counts). */
void fp_health_rx(struct fp_health *h);

/* A good answer was parsed in full: the server is well. */
void fp_health_good(struct fp_health *h);

/* The connection failed in a way that must not be retried at once (hung,
 * refused setup, garbage, an error reply at connect). */
void fp_health_bad(struct fp_health *h);

/* 1 when nothing came from the server for timeout_ms: hung. */
int fp_health_silent(const struct fp_health *h, unsigned timeout_ms);

/* The delay before the next connection attempt, in ms (jittered), and
 * advances the backoff. A new connection forgets last_rx_ms. */
unsigned fp_health_next_delay(struct fp_health *h);

#endif

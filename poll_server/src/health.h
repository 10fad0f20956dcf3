/* health.h -- the failure model both cache backends share (one server's
 * view of another; docs/design.md, "Failure model").
 *
 * - A request not answered within timeout_ms fails alone (TIMEOUT) if
 *   anything came from the server during the last timeout_ms: it is slow,
 *   not gone; its answer is read and dropped when it comes.
 * - Only total silence for FP_HUNG_MIN_MS (or timeout_ms, if longer)
 *   marks the server hung: the connection is dropped and retried after
 *   the backoff. A shorter silence is a stall (a starved CPU, a deep
 *   pipeline), whose late requests alone fail; while a request is late
 *   and nothing came for timeout_ms the server is stalled, and new
 *   requests do not queue behind it (they fail over, or fail fast).
 * - A connection that was answering and drops is retried at once; every
 *   later attempt waits the backoff: 100 ms doubling to 2 s, each delay
 *   jittered (a random 50..100% of it) so that a fleet of pollers does
 *   not reconnect in step.
 * - Only a good, fully parsed answer resets the backoff: not a connect (a
 *   stopped server's kernel still accepts), not an error reply (Redis's
 *   "max number of clients"), not a value we had to skip. */
#ifndef FP_HEALTH_H
#define FP_HEALTH_H

#include <stddef.h>
#include <stdint.h>

#define FP_BACKOFF_MIN_MS 100
#define FP_BACKOFF_MAX_MS 2000
/* Half the app's shortest publish write timeout (MIN_PUBLISH_TIMEOUT_MS,
 * 1 s): a silence that fails an acknowledged write is always seen as a
 * hang, and so starts the node's recovery window (docs/design.md). */
#define FP_HUNG_MIN_MS    500

struct fp_health {
    unsigned backoff_ms;   /* the next delay before jitter; 0: at once */
    int hung;              /* the last failure was silence or a bad answer */
    int stalled;           /* a request is late and nothing came for
                            * timeout_ms; cleared by any bytes */
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

struct event;

/* The ms until the server's silence marks it hung (0: hung now, or it
 * never sent anything on this connection). */
unsigned fp_health_hung_in(const struct fp_health *h, unsigned timeout_ms);

/* A request timed out, or `check` (the server's timer) fired while requests
 * wait: 0 when the server is not silent for a hang yet, with `check` armed
 * for the moment it would be (so a hang is seen even if no other request
 * comes) and `stalled` set if nothing came for timeout_ms; else hung now,
 * or a timer that cannot be armed (taken for hung). */
int fp_health_late(struct fp_health *h, unsigned timeout_ms,
                   struct event *check);

/* The server's silence, for the log: "nothing from it for 503 ms", or
 * "nothing from it since connecting". */
void fp_health_silence(const struct fp_health *h, char *buf, size_t len);

/* The delay before the next connection attempt, in ms (jittered), and
 * advances the backoff. A new connection forgets last_rx_ms. */
unsigned fp_health_next_delay(struct fp_health *h);

#endif

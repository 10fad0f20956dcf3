/* node_health.h -- a memcached node's health as the poll server decides it
 * (docs/design.md, "Replicas" and "A node back from a failure"): whether a
 * node takes gets, its recovery window, where a get goes (its primary or
 * its replica) and when a failed primary read is retried on the replica.
 * Decisions only: cache_memcached.c does the I/O, the logging and the
 * counting. */
#ifndef FP_NODE_HEALTH_H
#define FP_NODE_HEALTH_H

#include <stddef.h>
#include <stdint.h>

#include "cache.h"
#include "health.h"

/* A node back after being down or hung may hold answers older than
 * publishes made meanwhile: for recovery_ms it serves no hit. */
struct fp_node_recovery {
    uint64_t until_ms;          /* fp_mono_ms() clock; 0: not recovering */
};

/* The node answers again. Its window starts (returns 1) if it was marked
 * down and recovery_ms > 0; else nothing changes (0). */
int fp_node_back(struct fp_node_recovery *rw, int was_down,
                 unsigned recovery_ms);

/* 1 while the node is in its window. The first call after the window
 * returns 0 with *ended set (the caller logs it); otherwise *ended is 0.
 * The clock is read only while a window is open (the hit path). */
int fp_node_recovering(struct fp_node_recovery *rw, int *ended);

/* The node takes gets: connected, not full, not stalled (health.h), and,
 * with replicas, not back from a hang with nothing heard yet (a stopped
 * server's kernel accepts the connection): its keys go to their replicas
 * meanwhile (or fail fast, without them) rather than wait for a timeout. */
int fp_node_ready(int down, size_t npending, size_t max_pending, int replicas,
                  const struct fp_health *h);

/* A primary read marked `failover` ended with st: is it sent again to the
 * key's replica? */
int fp_node_fails_over(enum fp_cache_status st, int failover);

/* Where a get goes. */
enum fp_node_pick {
    FP_NODE_PRIMARY,    /* the primary, retried on the replica if replicas */
    FP_NODE_REPLICA,    /* the replica (the primary does not serve) */
    FP_NODE_NONE        /* fail fast: the app answers */
};

/* primary_serves: ready and not recovering. replica_serves(arg) is asked
 * only when the primary does not serve and there are replicas. */
enum fp_node_pick fp_node_pick(int replicas, int primary_serves,
                               int (*replica_serves)(void *arg), void *arg);

#endif

/* node_health.c -- a memcached node's health decisions (node_health.h). */
#include "node_health.h"

int fp_node_back(struct fp_node_recovery *rw, int was_down,
                 unsigned recovery_ms)
{
    if (!was_down || recovery_ms == 0)
        return 0;
    rw->until_ms = fp_mono_ms() + recovery_ms;
    return 1;
}

int fp_node_recovering(struct fp_node_recovery *rw, int *ended)
{
    *ended = 0;
    if (rw->until_ms == 0)
        return 0;
    if (fp_mono_ms() < rw->until_ms)
        return 1;
    rw->until_ms = 0;
    *ended = 1;
    return 0;
}

int fp_node_ready(int down, size_t npending, size_t max_pending, int replicas,
                  const struct fp_health *h)
{
    if (down || npending >= max_pending || h->stalled)
        return 0;
    return !(replicas && h->hung && h->last_rx_ms == 0);
}

int fp_node_fails_over(enum fp_cache_status st, int failover)
{
    return failover && (st == FP_CACHE_ERROR || st == FP_CACHE_TIMEOUT);
}

enum fp_node_pick fp_node_pick(int replicas, int primary_serves,
                               int (*replica_serves)(void *arg), void *arg)
{
    if (primary_serves)
        return FP_NODE_PRIMARY;
    if (!replicas)
        return FP_NODE_NONE; /* no replica to read instead */
    return replica_serves(arg) ? FP_NODE_REPLICA : FP_NODE_NONE;
}

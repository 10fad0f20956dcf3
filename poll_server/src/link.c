/* link.c -- a cache server connection's shared mechanics (link.h). */
#include <stdio.h>
#include <sys/time.h>

#include "link.h"
#include "log.h"
#include "stats.h"

/* The hang check fired: hung now, or re-armed for when it would be. */
static void hangcheck_cb(evutil_socket_t fd, short what, void *arg)
{
    struct fp_link *l = arg;
    char why[160];

    (void)fd;
    (void)what;
    if (!l->ops->waiting(l->arg))
        return;
    if (fp_link_late(l, why, sizeof(why)) != 0)
        l->ops->hung(l->arg, why);
}

int fp_link_init(struct fp_link *l, struct event_base *base,
                 const struct fp_link_ops *ops, const char *name, size_t index,
                 unsigned timeout_ms, void *arg, event_callback_fn retry_cb)
{
    l->ops = ops;
    l->name = name;
    l->index = index;
    l->timeout_ms = timeout_ms;
    l->arg = arg;
    l->retry = evtimer_new(base, retry_cb, l->arg);
    l->hangcheck = evtimer_new(base, hangcheck_cb, l);
    return l->retry != NULL && l->hangcheck != NULL ? 0 : -1;
}

void fp_link_free(struct fp_link *l)
{
    if (l->retry != NULL)
        event_free(l->retry);
    if (l->hangcheck != NULL)
        event_free(l->hangcheck);
    l->retry = l->hangcheck = NULL;
}

void fp_link_up(struct fp_link *l, const char *note)
{
    if (note != NULL || l->logged != FP_LINK_LOG_UP)
        fp_log(FP_LOG_INFO, "%s %s: connected%s", l->ops->kind, l->name,
               note != NULL ? note : "");
    l->logged = FP_LINK_LOG_UP;
    fp_stat_backend_up(l->index, 1);
}

void fp_link_down(struct fp_link *l, const char *why)
{
    fp_log(l->logged != FP_LINK_LOG_DOWN ? FP_LOG_WARN : FP_LOG_DEBUG,
           "%s %s: %s", l->ops->kind, l->name, why);
    l->logged = FP_LINK_LOG_DOWN;
    fp_stat_backend_up(l->index, 0);
}

int fp_link_was_down(const struct fp_link *l)
{
    return l->logged == FP_LINK_LOG_DOWN;
}

void fp_link_retry(struct fp_link *l)
{
    struct timeval tv;
    unsigned delay = fp_health_next_delay(&l->health);

    tv.tv_sec = delay / 1000;
    tv.tv_usec = (suseconds_t)(delay % 1000) * 1000;
    if (evtimer_add(l->retry, &tv) != 0)
        fp_log(FP_LOG_ERROR, "%s %s: cannot arm reconnect timer", l->ops->kind,
               l->name);
}

int fp_link_late(struct fp_link *l, char *why, size_t len)
{
    char quiet[64];

    if (fp_health_late(&l->health, l->timeout_ms, l->hangcheck) == 0)
        return 0;
    fp_health_silence(&l->health, quiet, sizeof(quiet));
    (void)snprintf(why, len, "no %s within %u ms and %s, %s", l->ops->answer,
                   l->timeout_ms, quiet, l->ops->then);
    fp_health_bad(&l->health);
    return -1;
}

/* health.c -- the failure model both cache backends share (health.h). */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include <event2/event.h>

#include "health.h"

uint64_t fp_mono_ms(void)
{
    struct timespec ts;

    if (clock_gettime(CLOCK_MONOTONIC, &ts) != 0)
        return 0;
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

void fp_health_rx(struct fp_health *h)
{
    h->last_rx_ms = fp_mono_ms();
    h->stalled = 0;
}

void fp_health_good(struct fp_health *h)
{
    h->hung = 0;
    h->backoff_ms = 0;
}

void fp_health_bad(struct fp_health *h)
{
    h->hung = 1;
}

/* The silence that marks a server hung. */
static unsigned hung_limit(unsigned timeout_ms)
{
    return timeout_ms > FP_HUNG_MIN_MS ? timeout_ms : FP_HUNG_MIN_MS;
}

unsigned fp_health_hung_in(const struct fp_health *h, unsigned timeout_ms)
{
    uint64_t limit = hung_limit(timeout_ms), quiet;

    if (h->last_rx_ms == 0)
        return 0;
    quiet = fp_mono_ms() - h->last_rx_ms;
    return quiet >= limit ? 0 : (unsigned)(limit - quiet);
}

int fp_health_late(struct fp_health *h, unsigned timeout_ms,
                   struct event *check)
{
    unsigned in = fp_health_hung_in(h, timeout_ms);
    struct timeval tv = { (time_t)(in / 1000), (suseconds_t)(in % 1000) * 1000 };

    if (in == 0)
        return -1;
    if (hung_limit(timeout_ms) - in >= timeout_ms) /* the silence so far */
        h->stalled = 1;
    if (evtimer_pending(check, NULL))
        return 0;
    return evtimer_add(check, &tv) == 0 ? 0 : -1;
}

void fp_health_silence(const struct fp_health *h, char *buf, size_t len)
{
    if (h->last_rx_ms == 0)
        (void)snprintf(buf, len, "nothing from it since connecting");
    else
        (void)snprintf(buf, len, "nothing from it for %llu ms",
                       (unsigned long long)(fp_mono_ms() - h->last_rx_ms));
}

/* xorshift64*, seeded once per process: the jitter only has to differ
 * between pollers, not be unpredictable. */
static unsigned jitter_pct(void)
{
    static uint64_t x;

    if (x == 0)
        x = (fp_mono_ms() << 20) ^ (uint64_t)getpid() ^ 0x9E3779B97F4A7C15ULL;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    return (unsigned)(((x * 0x2545F4914F6CDD1DULL) >> 33) % 51) + 50;
}

unsigned fp_health_next_delay(struct fp_health *h)
{
    unsigned delay;

    if (h->backoff_ms == 0 && h->hung)
        h->backoff_ms = FP_BACKOFF_MIN_MS;
    delay = h->backoff_ms;
    h->backoff_ms = h->backoff_ms == 0 ? FP_BACKOFF_MIN_MS :
                    h->backoff_ms * 2 > FP_BACKOFF_MAX_MS ? FP_BACKOFF_MAX_MS :
                    h->backoff_ms * 2;
    h->last_rx_ms = 0;
    h->stalled = 0;
    return delay * jitter_pct() / 100;
}

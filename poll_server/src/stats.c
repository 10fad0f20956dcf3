/* stats.c -- counter storage, the backend latency histogram, and the event
 * loop probe behind the active-to-total ratio (ATR).
 *
 * The ATR (seed 001) is, per poll call, how many of the polled descriptors
 * had work. libevent 2.1 has no hook between its epoll_wait and the
 * callbacks (2.2's evwatch prepare/check is what would do it), and
 * event_base_get_num_events() counts events, not descriptors: an fd event
 * with a timeout counts twice, a pending timer once. So the probe sits where
 * the seed put its counters, around the system call: this executable defines
 * epoll_wait() and epoll_ctl(), which libevent's calls bind to (an
 * executable's symbols come first in the dynamic lookup), and forwards to
 * the next definition (libc, or ASan's interceptor) found with
 * dlsym(RTLD_NEXT). Per call that is a few adds around a system call.
 * - epoll_wait: one call is one loop iteration; its return value is the
 *   number of ready descriptors; the size of the epoll set at that moment is
 *   added to the registered total.
 * - epoll_ctl: keeps that size, one bit per descriptor, following what the
 *   kernel was told (a DEL after close() fails with EBADF, but the kernel
 *   dropped the descriptor with the close, so it counts as removed).
 * ATR = rate(active) / rate(registered). The process has one event base, so
 * one epoll set; the probe counts whatever epoll the process does. */
#include <dlfcn.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "log.h"
#include "stats.h"

struct fp_stats fp_stats;

#ifndef FP_NO_STATS

#define FD_BITS_MAX ((size_t)16 * 1024 * 1024) /* descriptors tracked, at most */

static const uint64_t bucket_us[FP_STAT_NBUCKETS] = FP_STAT_LATENCY_BUCKETS;

typedef int epoll_wait_fn(int, struct epoll_event *, int, int);
typedef int epoll_ctl_fn(int, int, int, struct epoll_event *);

static epoll_wait_fn *next_wait;
static epoll_ctl_fn *next_ctl;
static unsigned char *fd_bits;  /* descriptor in the epoll set */
static size_t fd_nbits;

static void *next_symbol(const char *name)
{
    return dlsym(RTLD_NEXT, name);
}

static void resolve(void)
{
    void *w = next_symbol("epoll_wait"), *c = next_symbol("epoll_ctl");

    /* POSIX allows converting dlsym's void * to a function pointer. */
    if (w != NULL)
        memcpy(&next_wait, &w, sizeof(w));
    if (c != NULL)
        memcpy(&next_ctl, &c, sizeof(c));
}

int epoll_wait(int epfd, struct epoll_event *events, int maxevents,
               int timeout)
{
    int n;

    if (next_wait == NULL)
        resolve();
    if (next_wait != NULL)
        n = next_wait(epfd, events, maxevents, timeout);
    else
        n = epoll_pwait(epfd, events, maxevents, timeout, NULL);
    if (n >= 0) {
        fp_stats.loop_iterations++;
        fp_stats.loop_active_fds += (uint64_t)n;
        fp_stats.loop_registered_fds += fp_stats.registered_fds_now;
    }
    return n;
}

static void fd_mark(int fd, int in)
{
    unsigned char bit, *byte;

    if (fd < 0 || (size_t)fd >= fd_nbits)
        return;
    byte = &fd_bits[(size_t)fd / 8];
    bit = (unsigned char)(1u << ((unsigned)fd % 8));
    if (in && !(*byte & bit)) {
        *byte |= bit;
        fp_stats.registered_fds_now++;
    } else if (!in && (*byte & bit)) {
        *byte &= (unsigned char)~bit;
        fp_stats.registered_fds_now--;
    }
}

int epoll_ctl(int epfd, int op, int fd, struct epoll_event *event)
{
    int rc, err;

    if (next_ctl == NULL)
        resolve();
    if (next_ctl != NULL)
        rc = next_ctl(epfd, op, fd, event);
    else
        rc = (int)syscall(SYS_epoll_ctl, epfd, op, fd, event);
    err = errno;
    if (op == EPOLL_CTL_DEL ||
        (rc != 0 && op == EPOLL_CTL_MOD && err == ENOENT))
        fd_mark(fd, 0);
    else if (rc == 0 || (op == EPOLL_CTL_ADD && err == EEXIST))
        fd_mark(fd, 1);
    errno = err;
    return rc;
}

static const uint64_t delivery_ms[FP_STAT_NDELIVERY] = FP_STAT_DELIVERY_BUCKETS;

void fp_stat_delivered(uint64_t published_ms, uint64_t now_ms)
{
    uint64_t d = 0;
    size_t k;

    if (now_ms >= published_ms)
        d = now_ms - published_ms;
    else
        fp_stats.delivery_negative++;
    fp_stats.delivery_sum_ms += d;
    for (k = 0; k < FP_STAT_NDELIVERY && d > delivery_ms[k]; k++)
        ;
    fp_stats.delivery_buckets[k]++;
}

void fp_stat_backend_done(size_t i, enum fp_cache_status st, uint64_t t0)
{
    struct fp_stat_backend *b;
    uint64_t now, us;
    size_t k;

    if (i >= FP_MAX_SERVERS || (unsigned)st > FP_CACHE_TIMEOUT)
        return;
    b = &fp_stats.backends[i];
    b->results[st]++;
    if (t0 == 0 || (st != FP_CACHE_HIT && st != FP_CACHE_MISS))
        return;
    now = fp_stat_now();
    if (now < t0)
        return;
    b->sum_ns += now - t0;
    us = (now - t0) / 1000;
    for (k = 0; k < FP_STAT_NBUCKETS && us > bucket_us[k]; k++)
        ;
    b->buckets[k]++;
}

#endif /* FP_NO_STATS */

void fp_stats_init(void)
{
#ifndef FP_NO_STATS
    struct rlimit rl;
    size_t nbits = 65536;
    unsigned char *bits;

    /* Sized once from the hard descriptor limit (the soft one may be
     * raised up to it); a descriptor beyond it is not counted. */
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0)
        nbits = rl.rlim_max == RLIM_INFINITY || rl.rlim_max > FD_BITS_MAX ?
                FD_BITS_MAX : (size_t)rl.rlim_max;
    if (nbits < 1024)
        nbits = 1024;
    if (fd_bits == NULL) {
        if ((bits = calloc(nbits / 8 + 1, 1)) == NULL) {
            fp_log(FP_LOG_WARN, "stats: out of memory, descriptors in the "
                   "epoll set are not counted");
        } else {
            fd_bits = bits;
            fd_nbits = nbits;
        }
    }
    resolve();
#endif
    if (clock_gettime(CLOCK_MONOTONIC, &fp_stats.started) != 0)
        memset(&fp_stats.started, 0, sizeof(fp_stats.started));
    fp_stats.started_wall = time(NULL);
}

void fp_stats_free(void)
{
#ifndef FP_NO_STATS
    free(fd_bits);
    fd_bits = NULL;
    fd_nbits = 0;
#endif
}

void fp_stats_backend_name(size_t i, const char *name)
{
    struct fp_stat_backend *b;
    size_t n;

    if (i >= FP_MAX_SERVERS)
        return;
    b = &fp_stats.backends[i];
    n = strlen(name);
    if (n >= sizeof(b->name))
        n = sizeof(b->name) - 1;
    memcpy(b->name, name, n);
    b->name[n] = '\0';
    if (i + 1 > fp_stats.nbackends)
        fp_stats.nbackends = i + 1;
}

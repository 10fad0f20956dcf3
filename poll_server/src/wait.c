/* wait.c -- how long a poll waits and when its client asks again (wait.h):
 * the wait= parameter and the Poll-Interval-Ms pace. */
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "wait.h"

/* Is q[0..n) the name `wait` in any case? ASCII only, as nginx's
 * $arg_wait compares it (strncasecmp in the "C" locale: the server never
 * calls setlocale), and never percent-decoded. */
static int is_wait(const char *q, size_t n)
{
    return n == 4 && strncasecmp(q, "wait", 4) == 0;
}

long fp_wait_param(const char *target, size_t len, unsigned max_wait)
{
    const char *q = memchr(target, '?', len), *end = target + len;
    long found = -2; /* -2: not seen */
    int bad = 0;

    if (q == NULL)
        return 0;
    q++;
    while (q < end) {
        const char *amp = memchr(q, '&', (size_t)(end - q));
        const char *pe = amp != NULL ? amp : end;
        const char *eq = memchr(q, '=', (size_t)(pe - q));
        const char *ne = eq != NULL ? eq : pe;

        /* Every occurrence counts, `wait` without '=' too: a second one in
         * any case makes the request ambiguous, whichever one another
         * reader would take. */
        if (is_wait(q, (size_t)(ne - q))) {
            const char *d;
            long n = 0;

            if (found != -2)
                return -1;
            if (eq == NULL || pe - eq - 1 < 1 || pe - eq - 1 > 6)
                bad = 1; /* no value, or more than 6 digits */
            for (d = eq != NULL ? eq + 1 : pe; !bad && d < pe; d++) {
                if (*d < '0' || *d > '9')
                    bad = 1;
                else
                    n = n * 10 + (*d - '0');
            }
            found = n;
        }
        q = pe + 1;
    }
    if (bad)
        return -1;
    if (found == -2)
        return 0;
    return found > (long)max_wait ? (long)max_wait : found;
}

unsigned fp_pace_ms(unsigned interval_ms, unsigned jitter_pct)
{
    unsigned long long extra = (unsigned long long)interval_ms * jitter_pct / 100;

    if (extra == 0)
        return interval_ms;
    /* random(): statistical spread only (no security use); the loop is one
     * thread. NOLINTNEXTLINE(cert-msc30-c,cert-msc50-cpp) */
    return interval_ms + (unsigned)((unsigned long long)random() % (extra + 1));
}

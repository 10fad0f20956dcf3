/* log.c -- one line per event on stderr: time, pid, level, message.
 * The whole line is formatted first and written with one write(2), so lines
 * from several processes sharing a stderr do not interleave. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "log.h"

static int log_level = FP_LOG_INFO;

static const char *const level_names[] = { "debug", "info", "warn", "error" };

void fp_log_set_level(int level)
{
    if (level < FP_LOG_DEBUG)
        level = FP_LOG_DEBUG;
    if (level > FP_LOG_ERROR)
        level = FP_LOG_ERROR;
    log_level = level;
}

void fp_log(int level, const char *fmt, ...)
{
    char line[1024];
    struct timeval tv;
    struct tm tm;
    size_t n;
    int r;
    va_list ap;

    if (level < log_level)
        return;
    if (level > FP_LOG_ERROR)
        level = FP_LOG_ERROR;
    if (level < FP_LOG_DEBUG)
        level = FP_LOG_DEBUG;

    if (gettimeofday(&tv, NULL) != 0 || localtime_r(&tv.tv_sec, &tm) == NULL) {
        memset(&tm, 0, sizeof(tm));
        tv.tv_usec = 0;
    }
    n = strftime(line, sizeof(line), "%Y-%m-%dT%H:%M:%S", &tm);
    r = snprintf(line + n, sizeof(line) - n, ".%03ld [%ld] %s: ",
                 (long)tv.tv_usec / 1000, (long)getpid(), level_names[level]);
    if (r < 0)
        return;
    n += (size_t)r < sizeof(line) - n ? (size_t)r : sizeof(line) - n - 1;

    va_start(ap, fmt);
    r = vsnprintf(line + n, sizeof(line) - n, fmt, ap);
    va_end(ap);
    if (r < 0)
        return;
    n += (size_t)r < sizeof(line) - n ? (size_t)r : sizeof(line) - n - 1;

    /* Keep one event on one line, even if a message carries a newline. */
    for (size_t i = 0; i < n; i++)
        if (line[i] == '\n' || line[i] == '\r')
            line[i] = ' ';
    if (n >= sizeof(line) - 1)
        n = sizeof(line) - 2;
    line[n++] = '\n';

    /* Nothing sensible to do if stderr is gone. */
    if (write(STDERR_FILENO, line, n) < 0)
        return;
}

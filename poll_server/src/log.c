/* log.c -- one line per event on stderr, or appended to [log] file: time,
 * pid, level, message. The whole line is formatted first and written with
 * one write(2) (O_APPEND for a file), so lines from several processes
 * sharing a log do not interleave. fp_log_reopen (SIGHUP) opens the file
 * again after logrotate moved it. */
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "log.h"

static int log_level = FP_LOG_INFO;
static int log_fd = STDERR_FILENO;
static const char *log_path;   /* NULL: stderr */

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

    /* Nothing sensible to do if the log is gone. */
    if (write(log_fd, line, n) < 0)
        return;
}

int fp_log_open(const char *path)
{
    int fd;

    if (path == NULL)
        return 0;
    fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0640);
    if (fd < 0) {
        fp_log(FP_LOG_ERROR, "log: cannot open %s: %s", path, strerror(errno));
        return -1;
    }
    if (log_fd != STDERR_FILENO)
        (void)close(log_fd);
    log_fd = fd;
    log_path = path;
    return 0;
}

void fp_log_reopen(void)
{
    if (log_path == NULL) {
        fp_log(FP_LOG_INFO, "log: SIGHUP: logging to stderr, nothing to reopen");
        return;
    }
    /* On failure the old file stays in use: lines still go somewhere. */
    if (fp_log_open(log_path) == 0)
        fp_log(FP_LOG_INFO, "log: SIGHUP: reopened %s", log_path);
}

void fp_log_close(void)
{
    if (log_fd != STDERR_FILENO)
        (void)close(log_fd);
    log_fd = STDERR_FILENO;
    log_path = NULL;
}

/* libevent's own messages (event_set_log_callback), at our levels. */
void fp_log_libevent(int severity, const char *msg)
{
    int level = severity <= 0 ? FP_LOG_DEBUG : severity == 1 ? FP_LOG_INFO :
                severity == 2 ? FP_LOG_WARN : FP_LOG_ERROR;

    fp_log(level, "libevent: %s", msg);
}

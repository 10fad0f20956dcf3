/* log.h -- one logging function with levels; one line per event on stderr. */
#ifndef FP_LOG_H
#define FP_LOG_H

#include <stddef.h>
#include <time.h>

enum { FP_LOG_DEBUG, FP_LOG_INFO, FP_LOG_WARN, FP_LOG_ERROR };

/* [log] format: text (time pid level: message) or json (one object a line). */
enum { FP_LOG_TEXT, FP_LOG_JSON };

void fp_log_set_level(int level);
void fp_log_set_format(int format);

/* Appends to path from now on (the path is kept, not copied). 0 or -1. */
int fp_log_open(const char *path);

/* SIGHUP: opens the same path again (logrotate). */
void fp_log_reopen(void);

/* Back to stderr. */
void fp_log_close(void);

/* For event_set_log_callback(). */
void fp_log_libevent(int severity, const char *msg);
/* One log line for an event at (sec, usec), without its newline, into
 * out[outlen] (NUL-terminated); returns its length (always < outlen). The
 * time is local, ISO 8601 with its UTC offset: 2026-01-31T14:05:09.123+01:00.
 * JSON: {"time":...,"pid":...,"level":...,"msg":...}, the message escaped
 * (quotes, backslashes, control bytes; a byte that is not UTF-8 becomes
 * U+FFFD), and closed even when the message had to be cut. What fp_log
 * writes; exposed for the tests. */
size_t fp_log_format_line(char *out, size_t outlen, int format, time_t sec,
                          long usec, long pid, int level, const char *msg);

void fp_log(int level, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

#endif

/* log.h -- one logging function with levels; one line per event on stderr. */
#ifndef FP_LOG_H
#define FP_LOG_H

enum { FP_LOG_DEBUG, FP_LOG_INFO, FP_LOG_WARN, FP_LOG_ERROR };

void fp_log_set_level(int level);

/* Appends to path from now on (the path is kept, not copied). 0 or -1. */
int fp_log_open(const char *path);

/* SIGHUP: opens the same path again (logrotate). */
void fp_log_reopen(void);

/* Back to stderr. */
void fp_log_close(void);

/* For event_set_log_callback(). */
void fp_log_libevent(int severity, const char *msg);
void fp_log(int level, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

#endif

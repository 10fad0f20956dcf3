/* log.h -- one logging function with levels; one line per event on stderr. */
#ifndef FP_LOG_H
#define FP_LOG_H

enum { FP_LOG_DEBUG, FP_LOG_INFO, FP_LOG_WARN, FP_LOG_ERROR };

void fp_log_set_level(int level);
void fp_log(int level, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

#endif

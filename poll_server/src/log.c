/* log.c -- one line per event on stderr, or appended to [log] file: time
 * (local, ISO 8601 with its UTC offset), pid, level, message; or, with
 * [log] format = json, one JSON object a line with those four members. The
 * whole line is formatted first and written with one write(2) (O_APPEND for
 * a file), so lines from several processes sharing a log do not interleave.
 * fp_log_reopen (SIGHUP) opens the file again after logrotate moved it. */
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
static int log_format = FP_LOG_TEXT;
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

void fp_log_set_format(int format)
{
    log_format = format == FP_LOG_JSON ? FP_LOG_JSON : FP_LOG_TEXT;
}

/* Appends what snprintf makes at out[*n], cut to fit (out stays terminated). */
static void append(char *out, size_t outlen, size_t *n, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static void append(char *out, size_t outlen, size_t *n, const char *fmt, ...)
{
    va_list ap;
    int r;

    if (*n >= outlen - 1)
        return;
    va_start(ap, fmt);
    r = vsnprintf(out + *n, outlen - *n, fmt, ap);
    va_end(ap);
    if (r < 0)
        out[*n] = '\0';
    else
        *n += (size_t)r < outlen - *n ? (size_t)r : outlen - *n - 1;
}

/* 2026-01-31T14:05:09.123+01:00 (local time and its offset from UTC). */
static void put_time(char *out, size_t outlen, size_t *n, time_t sec, long usec)
{
    struct tm tm;
    long off;
    size_t w;

    if (localtime_r(&sec, &tm) == NULL) {
        memset(&tm, 0, sizeof(tm));
        tm.tm_mday = 1;
        tm.tm_year = 70;
        usec = 0;
    }
    w = strftime(out + *n, outlen - *n, "%Y-%m-%dT%H:%M:%S", &tm);
    if (w == 0)
        out[*n] = '\0';
    *n += w;
    off = tm.tm_gmtoff / 60;
    append(out, outlen, n, ".%03ld%c%02ld:%02ld", usec / 1000, off < 0 ? '-' : '+',
           (off < 0 ? -off : off) / 60, (off < 0 ? -off : off) % 60);
}

/* The length of the well-formed UTF-8 sequence at p (at most left bytes),
 * or 0: a stray continuation byte, a truncated, overlong or surrogate
 * sequence, or one above U+10FFFF. */
static size_t utf8_len(const unsigned char *p, size_t left)
{
    size_t len;
    unsigned cp;

    if (p[0] < 0x80)
        return 1;
    if (p[0] >= 0xc2 && p[0] <= 0xdf) {
        len = 2;
        cp = p[0] & 0x1fu;
    } else if (p[0] >= 0xe0 && p[0] <= 0xef) {
        len = 3;
        cp = p[0] & 0x0fu;
    } else if (p[0] >= 0xf0 && p[0] <= 0xf4) {
        len = 4;
        cp = p[0] & 0x07u;
    } else {
        return 0;
    }
    if (len > left)
        return 0;
    for (size_t i = 1; i < len; i++) {
        if ((p[i] & 0xc0u) != 0x80u)
            return 0;
        cp = (cp << 6) | (p[i] & 0x3fu);
    }
    if ((len == 3 && (cp < 0x800 || (cp >= 0xd800 && cp <= 0xdfff))) ||
        (len == 4 && (cp < 0x10000 || cp > 0x10ffff)))
        return 0;
    return len;
}

/* msg as the inside of a JSON string at out[*n], never past out[limit]. A
 * piece (a character or its escape) that does not fit ends the string, so
 * a cut never leaves half an escape or half a character. */
static void put_json_text(char *out, size_t limit, size_t *n, const char *msg)
{
    const unsigned char *p = (const unsigned char *)msg;
    size_t left = strlen(msg);
    char esc[8];
    const char *piece;
    size_t plen, used;

    while (left > 0) {
        used = 1;
        piece = esc;
        if (*p == '"' || *p == '\\') {
            esc[0] = '\\';
            esc[1] = (char)*p;
            plen = 2;
        } else if (*p == '\n' || *p == '\r' || *p == '\t') {
            esc[0] = '\\';
            esc[1] = (char)(*p == '\n' ? 'n' : *p == '\r' ? 'r' : 't');
            plen = 2;
        } else if (*p < 0x20 || *p == 0x7f) {
            (void)snprintf(esc, sizeof(esc), "\\u%04x", *p);
            plen = 6;
        } else if ((used = utf8_len(p, left)) == 0) {
            piece = "\\ufffd";
            plen = 6;
            used = 1;
        } else {
            piece = (const char *)p;
            plen = used;
        }
        if (*n + plen > limit)
            break;
        memcpy(out + *n, piece, plen);
        *n += plen;
        p += used;
        left -= used;
    }
    out[*n] = '\0';
}

size_t fp_log_format_line(char *out, size_t outlen, int format, time_t sec,
                          long usec, long pid, int level, const char *msg)
{
    size_t n = 0;

    if (outlen == 0)
        return 0;
    out[0] = '\0';
    if (level > FP_LOG_ERROR)
        level = FP_LOG_ERROR;
    if (level < FP_LOG_DEBUG)
        level = FP_LOG_DEBUG;
    if (format == FP_LOG_JSON) {
        append(out, outlen, &n, "{\"time\":\"");
        put_time(out, outlen, &n, sec, usec);
        append(out, outlen, &n, "\",\"pid\":%ld,\"level\":\"%s\",\"msg\":\"", pid,
               level_names[level]);
        if (n + 3 > outlen) { /* no room for even the closing: nothing valid */
            out[0] = '\0';
            return 0;
        }
        put_json_text(out, outlen - 3, &n, msg);
        memcpy(out + n, "\"}", 3);
        return n + 2;
    }
    put_time(out, outlen, &n, sec, usec);
    append(out, outlen, &n, " [%ld] %s: %s", pid, level_names[level], msg);
    /* Keep one event on one line, even if a message carries a newline. */
    for (size_t i = 0; i < n; i++)
        if (out[i] == '\n' || out[i] == '\r')
            out[i] = ' ';
    return n;
}

void fp_log(int level, const char *fmt, ...)
{
    /* The message is cut at 1 KiB; escaped (JSON), the line may be longer. */
    char msg[1024], line[2048];
    struct timeval tv;
    size_t n;
    va_list ap;

    if (level < log_level)
        return;
    va_start(ap, fmt);
    if (vsnprintf(msg, sizeof(msg), fmt, ap) < 0)
        msg[0] = '\0';
    va_end(ap);
    if (gettimeofday(&tv, NULL) != 0) {
        tv.tv_sec = 0;
        tv.tv_usec = 0;
    }
    n = fp_log_format_line(line, sizeof(line) - 1, log_format, tv.tv_sec,
                           (long)tv.tv_usec, (long)getpid(), level, msg);
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

/* config.c -- settings from defaults, fastpoll.ini and flags.
 *
 * One table names every key the poll server knows (Redis's config.c style):
 * its section, name, kind, field, bounds, default and a line of help. The
 * defaults, the setters, fp_config_free() and --dump-config (config_dump.c:
 * the example INI, docs/configuration.md's tables, JSON for the tests) all
 * read it, so a new key is one row. The INI handler, the command-line flags and the tests
 * all go through fp_config_set(), so a value is checked the same way
 * wherever it comes from.
 *
 * The file dialect is the one the Python app reads too (docs/configuration.md;
 * tests/vectors/config.json holds the cases both readers are tested with):
 * `[section]`, `key = value`, comments starting with ';' or '#' at the start
 * of a line or after whitespace, no continuation lines, names case-sensitive.
 * Debian's libinih reads lines into a 200-byte buffer (INI_MAX_LINE, a compile
 * time constant there): a line over 198 bytes (line end excluded) is an error
 * naming the line, as in the app, and a long memcached server list is written
 * as several `servers =` lines, which append. */
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

#include <arpa/inet.h>
#include <ini.h>
#include <nettle/sha2.h>

#include "config.h"
#include "config_table.h"
#include "log.h"
#include "sign.h"

#define HOST_MAX     253
#define UNIX_PATH_MAX_ 107 /* sizeof(sun_path) - 1 */

/* ---- small helpers ---------------------------------------------------- */

static void fmt(char *buf, size_t len, const char *f, ...)
    __attribute__((format(printf, 3, 4)));

static void fmt(char *buf, size_t len, const char *f, ...)
{
    va_list ap;

    if (buf == NULL || len == 0)
        return;
    va_start(ap, f);
    if (vsnprintf(buf, len, f, ap) < 0)
        buf[0] = '\0';
    va_end(ap);
}

/* Quotes a value for an error message: bounded, non-printables escaped. */
static void quote(char *out, size_t outlen, const char *v)
{
    size_t o = 0, i;

    if (outlen < 8) {
        if (outlen > 0)
            out[0] = '\0';
        return;
    }
    if (v == NULL)
        v = "";
    out[o++] = '"';
    /* Room is kept for "..." + '"' + NUL (5 bytes) after every piece;
     * found by fuzz/fuzz_config.c: an escape as the last piece before the
     * "..." wrote two bytes past out. */
    for (i = 0; v[i] != '\0'; i++) {
        unsigned char c = (unsigned char)v[i];
        int esc = c < 0x20 || c >= 0x7F || c == '"' || c == '\\';
        if (o + (esc ? 4 : 1) + 5 > outlen)
            break;
        if (esc) {
            if (snprintf(out + o, outlen - o, "\\x%02X", c) != 4)
                break;
            o += 4;
        } else {
            out[o++] = (char)c;
        }
    }
    if (v[i] != '\0') {
        out[o++] = '.';
        out[o++] = '.';
        out[o++] = '.';
    }
    out[o++] = '"';
    out[o] = '\0';
}

static char *dupn(const char *s, size_t n)
{
    char *p = malloc(n + 1);

    if (p != NULL) {
        memcpy(p, s, n);
        p[n] = '\0';
    }
    return p;
}

/* Strict unsigned decimal of len bytes: digits only, within [min, max].
 * Leading zeros are allowed however many (as in the app); the overflow check
 * alone bounds the value. */
static int parse_ulln(const char *v, size_t len, unsigned long long min,
                      unsigned long long max, unsigned long long *out)
{
    unsigned long long n = 0;

    if (len == 0)
        return -1;
    for (size_t i = 0; i < len; i++) {
        if (v[i] < '0' || v[i] > '9')
            return -1;
        if (n > (ULLONG_MAX - (unsigned)(v[i] - '0')) / 10)
            return -1;
        n = n * 10 + (unsigned)(v[i] - '0');
    }
    if (n < min || n > max)
        return -1;
    *out = n;
    return 0;
}

static int parse_ull(const char *v, unsigned long long min,
                     unsigned long long max, unsigned long long *out)
{
    return parse_ulln(v, strlen(v), min, max, out);
}

static int is_host_char(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
           (c >= '0' && c <= '9') || c == '.' || c == '-';
}

static int valid_host(const char *h, size_t n)
{
    if (n == 0 || n > HOST_MAX)
        return 0;
    for (size_t i = 0; i < n; i++)
        if (!is_host_char(h[i]))
            return 0;
    return 1;
}

/* "host:port" (n bytes) -> addr. The host is what the app spells the same
 * way: [A-Za-z0-9.-]+ (names, IPv4). */
static int parse_host_port(const char *v, size_t n, struct fp_server_addr *a,
                           char *why, size_t whylen)
{
    const char *colon = NULL;
    unsigned long long p;

    for (size_t i = 0; i < n; i++)
        if (v[i] == ':')
            colon = v + i;
    if (colon == NULL) {
        fmt(why, whylen, "expected host:port");
        return -1;
    }
    if (!valid_host(v, (size_t)(colon - v))) {
        fmt(why, whylen, "bad host (expected [A-Za-z0-9.-], 1..%d bytes)",
            HOST_MAX);
        return -1;
    }
    if (parse_ulln(colon + 1, (size_t)(v + n - colon - 1), 1, 65535, &p) < 0) {
        fmt(why, whylen, "port not an integer in 1..65535");
        return -1;
    }
    a->host = dupn(v, (size_t)(colon - v));
    if (a->host == NULL) {
        fmt(why, whylen, "out of memory");
        return -1;
    }
    a->port = (uint16_t)p;
    a->unix_path = NULL;
    return 0;
}

static void addr_free(struct fp_server_addr *a)
{
    free(a->host);
    free(a->unix_path);
    a->host = NULL;
    a->unix_path = NULL;
    a->port = 0;
}

static int replace_str(char **field, const char *v, char *why, size_t whylen)
{
    char *p = dupn(v, strlen(v));

    if (p == NULL) {
        fmt(why, whylen, "out of memory");
        return -1;
    }
    free(*field);
    *field = p;
    return 0;
}


/* ---- the option table ------------------------------------------------ */

/* The field a row names, as the kind's type. */
#define FIELD(s, o, type) ((type *)(void *)((char *)(s) + (o)->offset))

/* ---- the custom setters and their helpers ---------------------------- */

/* A name or IPv4 literal, or an IPv6 literal such as ::1. */
/* Loopback, private (RFC 1918, RFC 4193), shared (RFC 6598) or link-local:
 * addresses the internet cannot reach. Names other than localhost are not
 * resolved here, so they cannot be checked: refused. */
static int private_address(const char *v)
{
    struct in_addr a4;
    struct in6_addr a6;
    uint32_t a;

    if (strcmp(v, "localhost") == 0)
        return 1;
    if (inet_pton(AF_INET6, v, &a6) == 1) {
        if (!IN6_IS_ADDR_V4MAPPED(&a6))
            return IN6_IS_ADDR_LOOPBACK(&a6) || IN6_IS_ADDR_LINKLOCAL(&a6) ||
                   (a6.s6_addr[0] & 0xFE) == 0xFC;
        memcpy(&a4, &a6.s6_addr[12], sizeof(a4));
    } else if (inet_pton(AF_INET, v, &a4) != 1) {
        return 0;
    }
    a = ntohl(a4.s_addr);
    return a >> 24 == 127 || a >> 24 == 10 || a >> 20 == 0xAC1 ||
           a >> 16 == 0xC0A8 || a >> 16 == 0xA9FE || a >> 22 == 0x191;
}

static int set_address(char **field, const char *v, char *why, size_t whylen)
{
    size_t n = strlen(v);

    if (n == 0 || n > HOST_MAX) {
        fmt(why, whylen, "not an address or host name");
        return -1;
    }
    for (size_t i = 0; i < n; i++) {
        if (!is_host_char(v[i]) && v[i] != ':') {
            fmt(why, whylen, "not an address or host name");
            return -1;
        }
    }
    /* Only nginx (and the monitoring agent) may reach a poll server. */
    if (!private_address(v)) {
        fmt(why, whylen, "not a loopback or private IP address (or localhost): "
            "nothing but nginx may reach a poll server (docs/security.md)");
        return -1;
    }
    return replace_str(field, v, why, whylen);
}

/* An absolute path a unix socket can be bound to. */
static int check_unix_path(const char *path, char *why, size_t whylen)
{
    if (path[0] != '/') {
        fmt(why, whylen, "unix: needs an absolute path");
        return -1;
    }
    if (strlen(path) > UNIX_PATH_MAX_) {
        fmt(why, whylen, "unix socket path longer than %d bytes", UNIX_PATH_MAX_);
        return -1;
    }
    for (const char *p = path; *p; p++) {
        if ((unsigned char)*p <= 0x20 || (unsigned char)*p == 0x7F) {
            fmt(why, whylen, "unix socket path with a space or control character");
            return -1;
        }
    }
    return 0;
}

/* "ADDR", "unix:/path" or both, separated by spaces: a TCP address (bound
 * with `port`) and/or a unix socket. nginx on the same host reaches the
 * poller cheaper through the socket; the TCP one stays for direct use. */
static int set_listen(struct fp_settings *s, const struct option_def *o,
                      const char *v, char *why, size_t whylen)
{
    char *host = NULL, *path = NULL, *tok, *save = NULL, *copy;
    int rc = -1;

    (void)o;
    if ((copy = dupn(v, strlen(v))) == NULL) {
        fmt(why, whylen, "out of memory");
        return -1;
    }
    for (tok = strtok_r(copy, " \t", &save); tok != NULL;
         tok = strtok_r(NULL, " \t", &save)) {
        if (strncmp(tok, "unix:", 5) == 0) {
            if (path != NULL) {
                fmt(why, whylen, "more than one unix: path");
                goto out;
            }
            if (check_unix_path(tok + 5, why, whylen) < 0)
                goto out;
            if ((path = dupn(tok + 5, strlen(tok + 5))) == NULL) {
                fmt(why, whylen, "out of memory");
                goto out;
            }
        } else {
            if (host != NULL) {
                fmt(why, whylen, "more than one address (one address and "
                    "one unix:/path at most)");
                goto out;
            }
            if (set_address(&host, tok, why, whylen) < 0)
                goto out;
        }
    }
    if (host == NULL && path == NULL) {
        fmt(why, whylen, "not an address or host name");
        goto out;
    }
    free(s->listen);
    free(s->listen_unix);
    s->listen = host;
    s->listen_unix = path;
    host = path = NULL;
    rc = 0;
out:
    free(host);
    free(path);
    free(copy);
    return rc;
}

/* Octal permissions, e.g. 0660; 0..0777. */
static int set_mode(struct fp_settings *s, const struct option_def *o,
                    const char *v, char *why, size_t whylen)
{
    unsigned m = 0;
    size_t n = strlen(v);

    (void)o;
    if (n == 0 || n > 4) {
        fmt(why, whylen, "not octal permissions such as 0660");
        return -1;
    }
    for (size_t i = 0; i < n; i++) {
        if (v[i] < '0' || v[i] > '7') {
            fmt(why, whylen, "not octal permissions such as 0660");
            return -1;
        }
        m = m * 8 + (unsigned)(v[i] - '0');
    }
    if (m > 0777) {
        fmt(why, whylen, "not octal permissions in 0..0777");
        return -1;
    }
    s->unix_mode = m;
    return 0;
}

static int is_param_char(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
           (c >= '0' && c <= '9') || c == '_' || c == '.' || c == '-';
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static int is_sep(char c)
{
    return c == ' ' || c == '\t' || c == ',';
}

/* Space- or comma-separated names, kept sorted bytewise and unique. */
static int set_params(struct fp_settings *s, const struct option_def *o,
                      const char *v, char *why, size_t whylen)
{
    char *names[FP_MAX_PARAMS] = { 0 };
    size_t n = 0, i;
    const char *p = v;
    int rc = -1;

    (void)o;
    while (*p) {
        const char *start;
        size_t len;

        while (is_sep(*p))
            p++;
        if (*p == '\0')
            break;
        start = p;
        while (*p && !is_sep(*p))
            p++;
        len = (size_t)(p - start);
        for (i = 0; i < len; i++)
            if (!is_param_char(start[i]))
                break;
        if (i < len || len > FP_MAX_PARAM_LEN) {
            char name[80];
            char *tmp = dupn(start, len < 64 ? len : 64);
            quote(name, sizeof(name), tmp ? tmp : "");
            free(tmp);
            fmt(why, whylen, "bad parameter name %s (expected [A-Za-z0-9_.-], "
                "1..%d bytes)", name, FP_MAX_PARAM_LEN);
            goto out;
        }
        if ((len == 3 && memcmp(start, "exp", 3) == 0) ||
            (len == 3 && memcmp(start, "sig", 3) == 0)) {
            fmt(why, whylen, "exp and sig are reserved for signed poll URLs");
            goto out;
        }
        if (len == 2 && strncasecmp(start, "ch", 2) == 0) {
            /* docs/channels.md: ch names a poll's channels, read in any
             * case; as a key's parameter it would be both. */
            fmt(why, whylen, "ch is the channels' parameter, never a key's");
            goto out;
        }
        if (len == 4 && strncasecmp(start, "wait", 4) == 0) {
            /* docs/api.md: the long poll's wait is never part of a key, in
             * any case (every reader of wait ignores its case). */
            fmt(why, whylen, "wait is the long poll's parameter, never a key's");
            goto out;
        }
        /* A repeated name counts once, as in the app. */
        for (i = 0; i < n; i++)
            if (strlen(names[i]) == len && memcmp(names[i], start, len) == 0)
                break;
        if (i < n)
            continue;
        if (n == FP_MAX_PARAMS) {
            fmt(why, whylen, "more than %d parameters", FP_MAX_PARAMS);
            goto out;
        }
        if ((names[n] = dupn(start, len)) == NULL) {
            fmt(why, whylen, "out of memory");
            goto out;
        }
        n++;
    }
    qsort(names, n, sizeof(names[0]), cmp_str);
    for (i = 0; i < s->nkey_params; i++)
        free(s->key_params[i]);
    memcpy(s->key_params, names, n * sizeof(names[0]));
    s->nkey_params = n;
    n = 0;
    rc = 0;
out:
    for (i = 0; i < n; i++)
        free(names[i]);
    return rc;
}

/* Appends host:port entries; the caller clears the list first when a
 * new source (file or -s) starts. */
static int append_servers(struct fp_settings *s, const char *v, char *why,
                          size_t whylen)
{
    const char *p = v;
    size_t added = 0;

    while (*p) {
        const char *start;
        size_t len;
        char ewhy[160], item[96];

        while (is_sep(*p))
            p++;
        if (*p == '\0')
            break;
        start = p;
        while (*p && !is_sep(*p))
            p++;
        len = (size_t)(p - start);
        if (s->nmc_servers == FP_MAX_SERVERS) {
            fmt(why, whylen, "more than %d servers", FP_MAX_SERVERS);
            return -1;
        }
        if (parse_host_port(start, len, &s->mc_servers[s->nmc_servers], ewhy,
                            sizeof(ewhy)) < 0) {
            char *tmp = dupn(start, len < 80 ? len : 80);
            quote(item, sizeof(item), tmp ? tmp : "");
            free(tmp);
            fmt(why, whylen, "%s: %s", item, ewhy);
            return -1;
        }
        s->nmc_servers++;
        added++;
    }
    if (added == 0) {
        fmt(why, whylen, "no host:port given");
        return -1;
    }
    return 0;
}

static void clear_servers(struct fp_settings *s)
{
    for (size_t i = 0; i < s->nmc_servers; i++)
        addr_free(&s->mc_servers[i]);
    s->nmc_servers = 0;
}

static int set_servers(struct fp_settings *s, const struct option_def *o,
                       const char *v, char *why, size_t whylen)
{
    (void)o;
    return append_servers(s, v, why, whylen);
}

/* [memcached] previous_servers: the app's list before a membership change
 * (docs/operations.md). The app writes both placements while it is set; the
 * poll server reads the current list only, so it checks the entries and
 * keeps nothing. */
static int set_previous_servers(struct fp_settings *s,
                                const struct option_def *o, const char *v,
                                char *why, size_t whylen)
{
    struct fp_settings tmp;
    int rc;

    (void)s;
    (void)o;
    memset(&tmp, 0, sizeof(tmp));
    rc = append_servers(&tmp, v, why, whylen);
    clear_servers(&tmp);
    return rc;
}

static int set_replicas(struct fp_settings *s, const struct option_def *o,
                        const char *v, char *why, size_t whylen)
{
    unsigned long long n;

    (void)o;
    if (parse_ull(v, 0, 1, &n) < 0) {
        fmt(why, whylen, "not 0 or 1");
        return -1;
    }
    s->mc_replicas = (int)n;
    return 0;
}

/* host:port or unix:/path into *field (replaced). */
static int set_redis_addr(struct fp_server_addr *field, const char *v,
                          char *why, size_t whylen)
{
    struct fp_server_addr a = { NULL, 0, NULL };

    if (strncmp(v, "unix:", 5) == 0) {
        const char *path = v + 5;
        if (path[0] != '/') {
            fmt(why, whylen, "unix: needs an absolute path");
            return -1;
        }
        if (strlen(path) > UNIX_PATH_MAX_) {
            fmt(why, whylen, "unix socket path longer than %d bytes",
                UNIX_PATH_MAX_);
            return -1;
        }
        if ((a.unix_path = dupn(path, strlen(path))) == NULL) {
            fmt(why, whylen, "out of memory");
            return -1;
        }
    } else if (parse_host_port(v, strlen(v), &a, why, whylen) < 0) {
        char inner[160];
        fmt(inner, sizeof(inner), "%s", why);
        fmt(why, whylen, "%s (expected host:port or unix:/path)", inner);
        return -1;
    }
    addr_free(field);
    *field = a;
    return 0;
}

/* The password is the first line of the file, without its line end. */
static int read_password_file(char **field, const char *v, char *why,
                              size_t whylen)
{
    char line[PASSWORD_MAX + 2];
    FILE *f;
    size_t n;
    int rc = -1;

    if (*v == '\0') { /* empty: no password */
        free(*field);
        *field = NULL;
        return 0;
    }
    if ((f = fopen(v, "r")) == NULL) {
        fmt(why, whylen, "cannot read: %s", strerror(errno));
        return -1;
    }
    if (fgets(line, sizeof(line), f) == NULL) {
        if (ferror(f))
            fmt(why, whylen, "cannot read: %s", strerror(errno));
        else
            fmt(why, whylen, "file is empty");
        goto out;
    }
    n = strlen(line);
    if (n > 0 && line[n - 1] == '\n')
        line[--n] = '\0';
    else if (n > PASSWORD_MAX)
        goto toolong;
    if (n > 0 && line[n - 1] == '\r')
        line[--n] = '\0';
    if (n > PASSWORD_MAX)
        goto toolong;
    if (n == 0) {
        fmt(why, whylen, "first line is empty");
        goto out;
    }
    if (*field != NULL)
        explicit_bzero(*field, strlen(*field));
    rc = replace_str(field, line, why, whylen);
    goto out;
toolong:
    fmt(why, whylen, "first line longer than %d bytes", PASSWORD_MAX);
out:
    explicit_bzero(line, sizeof(line));
    (void)fclose(f);
    return rc;
}

static void clear_secrets(struct fp_settings *s)
{
    for (size_t i = 0; i < s->nsign_secrets; i++) {
        explicit_bzero(s->sign_secrets[i], strlen(s->sign_secrets[i]));
        free(s->sign_secrets[i]);
        s->sign_secrets[i] = NULL;
    }
    s->nsign_secrets = 0;
}

/* Every non-empty line is a secret (the first signs, all verify, so a new
 * one can be rolled in). The file must not be readable by others nor
 * writable by the group; errors never show its content. */
static int set_sign_secret_file(struct fp_settings *s,
                                const struct option_def *o, const char *v,
                                char *why, size_t whylen)
{
    char line[FP_SIGN_SECRET_MAX + 3];
    char *got[FP_MAX_SIGN_SECRETS] = { 0 };
    struct stat st;
    size_t n, ngot = 0, lineno = 0;
    FILE *f;
    int rc = -1;

    (void)o;
    if (*v == '\0') { /* empty: poll URLs are not signed */
        clear_secrets(s);
        return 0;
    }
    if ((f = fopen(v, "r")) == NULL) {
        fmt(why, whylen, "cannot read: %s", strerror(errno));
        return -1;
    }
    if (fstat(fileno(f), &st) != 0 || !S_ISREG(st.st_mode)) {
        fmt(why, whylen, "not a regular file");
        goto out;
    }
    if (st.st_mode & (S_IWGRP | S_IRWXO)) {
        fmt(why, whylen, "mode %04o: must not be readable by others nor "
            "writable by the group (use 0600 or 0640)",
            (unsigned)(st.st_mode & 07777));
        goto out;
    }
    while (fgets(line, sizeof(line), f) != NULL) {
        lineno++;
        n = strlen(line);
        if (n > 0 && line[n - 1] == '\n')
            line[--n] = '\0';
        else if (!feof(f)) {
            fmt(why, whylen, "line %zu longer than %d bytes", lineno,
                FP_SIGN_SECRET_MAX);
            goto out;
        }
        if (n > 0 && line[n - 1] == '\r')
            line[--n] = '\0';
        if (n == 0)
            continue;
        if (n < FP_SIGN_SECRET_MIN || n > FP_SIGN_SECRET_MAX) {
            fmt(why, whylen, "line %zu: a secret is %d..%d bytes", lineno,
                FP_SIGN_SECRET_MIN, FP_SIGN_SECRET_MAX);
            goto out;
        }
        for (size_t i = 0; i < n; i++) {
            if ((unsigned char)line[i] < 0x21 || (unsigned char)line[i] > 0x7E) {
                fmt(why, whylen, "line %zu: only printable ASCII without "
                    "spaces (e.g. openssl rand -hex 32)", lineno);
                goto out;
            }
        }
        if (ngot == FP_MAX_SIGN_SECRETS) {
            fmt(why, whylen, "more than %d secrets", FP_MAX_SIGN_SECRETS);
            goto out;
        }
        if ((got[ngot] = dupn(line, n)) == NULL) {
            fmt(why, whylen, "out of memory");
            goto out;
        }
        ngot++;
    }
    if (ferror(f)) {
        fmt(why, whylen, "cannot read: %s", strerror(errno));
        goto out;
    }
    if (ngot == 0) {
        fmt(why, whylen, "no secret in the file");
        goto out;
    }
    clear_secrets(s);
    memcpy(s->sign_secrets, got, sizeof(got));
    s->nsign_secrets = ngot;
    ngot = 0;
    rc = 0;
out:
    for (size_t i = 0; i < ngot; i++) {
        explicit_bzero(got[i], strlen(got[i]));
        free(got[i]);
    }
    explicit_bzero(line, sizeof(line));
    (void)fclose(f);
    return rc;
}

/* A name for the wire (AUTH user, SENTINEL master): printable, no spaces. */
static int set_name(char **field, const char *v, size_t max, char *why,
                    size_t whylen)
{
    size_t n = strlen(v);

    if (n == 0) { /* empty: not set */
        free(*field);
        *field = NULL;
        return 0;
    }
    if (n > max) {
        fmt(why, whylen, "longer than %zu bytes", max);
        return -1;
    }
    for (size_t i = 0; i < n; i++) {
        if ((unsigned char)v[i] <= 0x20 || (unsigned char)v[i] > 0x7E) {
            fmt(why, whylen, "only printable ASCII without spaces");
            return -1;
        }
    }
    return replace_str(field, v, why, whylen);
}

static void clear_sentinels(struct fp_settings *s)
{
    for (size_t i = 0; i < s->nredis_sentinels; i++)
        addr_free(&s->redis_sentinels[i]);
    s->nredis_sentinels = 0;
}

/* host:port list, space- or comma-separated; replaces the previous one. */
static int set_sentinels(struct fp_settings *s, const struct option_def *o,
                         const char *v, char *why, size_t whylen)
{
    const char *p = v;

    (void)o;
    clear_sentinels(s);
    while (*p) {
        const char *start;
        char ewhy[160];

        while (is_sep(*p))
            p++;
        if (*p == '\0')
            break;
        start = p;
        while (*p && !is_sep(*p))
            p++;
        if (s->nredis_sentinels == FP_MAX_SENTINELS) {
            fmt(why, whylen, "more than %d sentinels", FP_MAX_SENTINELS);
            return -1;
        }
        if (parse_host_port(start, (size_t)(p - start),
                            &s->redis_sentinels[s->nredis_sentinels], ewhy,
                            sizeof(ewhy)) < 0) {
            fmt(why, whylen, "%s", ewhy);
            return -1;
        }
        s->nredis_sentinels++;
    }
    return 0;
}

/* ---- the kinds' setters ------------------------------------------------ */

static int set_number(struct fp_settings *s, const struct option_def *o,
                      const char *v, char *why, size_t whylen)
{
    unsigned long long n;

    if (parse_ull(v, o->min, o->max, &n) < 0) {
        fmt(why, whylen, "not an integer in %llu..%llu", o->min, o->max);
        return -1;
    }
    if (o->offset == NO_FIELD)
        return 0;
    switch (o->kind) {
    case OPT_UINT: *FIELD(s, o, unsigned) = (unsigned)n; break;
    case OPT_SIZE: *FIELD(s, o, size_t) = (size_t)n; break;
    case OPT_INT:  *FIELD(s, o, int) = (int)n; break;
    case OPT_PORT: *FIELD(s, o, uint16_t) = (uint16_t)n; break;
    default: return -1;
    }
    return 0;
}

void fp_config_join_names(const struct option_def *o, const char *q, char *out,
                       size_t outlen)
{
    size_t n = 0;

    out[0] = '\0';
    for (unsigned long long i = 0; i <= o->max && n < outlen; i++) {
        const char *sep = i == 0 ? "" : i == o->max ? " or " : ", ";
        int r = snprintf(out + n, outlen - n, "%s%s%s%s", sep, q, o->names[i],
                         q);
        if (r < 0)
            break;
        n += (size_t)r;
    }
}

/* The enums' fields are int (enum fp_backend is stored as one too). */
_Static_assert(sizeof(enum fp_backend) == sizeof(int), "backend is an int");

static int set_enum(struct fp_settings *s, const struct option_def *o,
                    const char *v, char *why, size_t whylen)
{
    char names[128];

    for (unsigned long long i = 0; i <= o->max; i++) {
        if (strcmp(v, o->names[i]) == 0) {
            int n = (int)i;
            memcpy(FIELD(s, o, char), &n, sizeof(n));
            return 0;
        }
    }
    fp_config_join_names(o, "", names, sizeof(names));
    fmt(why, whylen, "not %s", names);
    return -1;
}

/* Printable ASCII of min..max bytes; it may go into a header (content_type)
 * or a key (prefix): no control bytes. */
static int set_text(struct fp_settings *s, const struct option_def *o,
                    const char *v, char *why, size_t whylen)
{
    size_t n = strlen(v);
    unsigned char lo = (o->flags & OPT_SPACES) ? 0x20 : 0x21;

    if (n < o->min || n > o->max) {
        if (o->min == 0)
            fmt(why, whylen, "longer than %llu bytes", o->max);
        else
            fmt(why, whylen, "must be %llu..%llu bytes", o->min, o->max);
        return -1;
    }
    for (size_t i = 0; i < n; i++) {
        if ((unsigned char)v[i] < lo || (unsigned char)v[i] > 0x7E) {
            fmt(why, whylen, "only printable ASCII%s (0x%02X-0x7E)",
                lo == 0x21 ? " without spaces" : "", lo);
            return -1;
        }
    }
    return replace_str(FIELD(s, o, char *), v, why, whylen);
}

static int set_path(struct fp_settings *s, const struct option_def *o,
                    const char *v, char *why, size_t whylen)
{
    char **field = FIELD(s, o, char *);

    if (*v == '\0') { /* empty: unset (the log goes to stderr) */
        free(*field);
        *field = NULL;
        return 0;
    }
    if (v[0] != '/') {
        fmt(why, whylen, "needs an absolute path");
        return -1;
    }
    return replace_str(field, v, why, whylen);
}

static int set_value(struct fp_settings *s, const struct option_def *o,
                     const char *v, char *why, size_t whylen)
{
    switch (o->kind) {
    case OPT_UINT:
    case OPT_SIZE:
    case OPT_INT:
    case OPT_PORT:
        return set_number(s, o, v, why, whylen);
    case OPT_ENUM:
        return set_enum(s, o, v, why, whylen);
    case OPT_TEXT:
        return set_text(s, o, v, why, whylen);
    case OPT_NAME:
        /* The app refuses an empty channel too. */
        if (*v == '\0' && (o->flags & OPT_REQUIRED)) {
            fmt(why, whylen, "empty (expected 1..%llu printable ASCII bytes)",
                o->max);
            return -1;
        }
        return set_name(FIELD(s, o, char *), v, (size_t)o->max, why, whylen);
    case OPT_ADDRESS:
        return set_address(FIELD(s, o, char *), v, why, whylen);
    case OPT_SERVER:
        if (*v == '\0' && (o->flags & OPT_UNSET)) {
            addr_free(FIELD(s, o, struct fp_server_addr));
            return 0;
        }
        return set_redis_addr(FIELD(s, o, struct fp_server_addr), v, why,
                              whylen);
    case OPT_SECRET:
        return read_password_file(FIELD(s, o, char *), v, why, whylen);
    case OPT_PATH:
        return set_path(s, o, v, why, whylen);
    case OPT_CUSTOM:
        return o->custom(s, o, v, why, whylen);
    }
    fmt(why, whylen, "unknown kind");
    return -1;
}

static const char *const level_names[] = { "debug", "info", "warn", "error" };
static const char *const format_names[] = { "text", "json" };
static const char *const backend_names[] = { "memcached", "redis" };

_Static_assert(FP_LOG_DEBUG == 0 && FP_LOG_ERROR == 3, "level_names");
_Static_assert(FP_LOG_TEXT == 0 && FP_LOG_JSON == 1, "format_names");
_Static_assert(FP_BACKEND_MEMCACHED == 0 && FP_BACKEND_REDIS == 1,
               "backend_names");

const char *fp_config_level_name(int level)
{
    if (level < FP_LOG_DEBUG || level > FP_LOG_ERROR)
        return "?";
    return level_names[level];
}

#define F(field) offsetof(struct fp_settings, field)
#define NAMES(a) .names = (a), .max = sizeof(a) / sizeof((a)[0]) - 1

/* Rows: section, key, kind, field, min, max, default, help, then extras. */
#define ROW(sec, key, kind_, off, lo, hi, dflt, text, ...)                   \
    { .section = (sec), .name = (key), .kind = (kind_), .offset = (off),     \
      .min = (lo), .max = (hi), .def = (dflt), .help = (text), __VA_ARGS__ }
#define NUM(kind_, sec, key, field, lo, hi, dflt, text)                      \
    ROW(sec, key, kind_, F(field), lo, hi, dflt, text)
#define ENUM(sec, key, field, names_, dflt, text)                             \
    { .section = (sec), .name = (key), .kind = OPT_ENUM, .offset = F(field),  \
      .def = (dflt), .help = (text), NAMES(names_) }
#define CUSTOM(sec, key, fn, dflt, bounds, text, ...)                         \
    ROW(sec, key, OPT_CUSTOM, NO_FIELD, 0, 0, dflt, text, .custom = (fn),    \
        .shown_bounds = (bounds), __VA_ARGS__)

/* The app's keys in shared sections: checked, not kept. */
#define APP(sec, key, lo, hi, dflt, text)                                     \
    ROW(sec, key, OPT_UINT, NO_FIELD, lo, hi, dflt, text, .flags = OPT_UNUSED)

#define SERVERS_BOUNDS "1..64 host:port, space- or comma-separated"

/* Every key of the sections the poll server reads, in the example's order.
 * [cache] ttl and item_max_bytes, [signing] ttl, [poll] fallback_interval_ms
 * and [memcached] previous_servers belong to the app but live in shared
 * sections: checked the same way, not kept (NO_FIELD). [channels] history is
 * the app's alone, its range too (config.json's app-only cases): any
 * integer here. */
static const struct option_def options[] = {
    CUSTOM("server", "listen", set_listen, "127.0.0.1",
           "a loopback or private address, or localhost; and/or unix:/path",
           "address to bind (with port), unix:/path of a socket, or both: "
           "nothing but nginx may reach a poll server"),
    NUM(OPT_PORT, "server", "port", port, 1, 65535, "8101",
        "TCP port; one instance per core, each on its own port (usually set "
        "with -p)"),
    CUSTOM("server", "unix_mode", set_mode, "0660", "octal, 0..0777",
           "permissions of listen's unix: socket"),
    NUM(OPT_SIZE, "server", "max_header_size", max_header_size, 256, 1048576,
        "8192", "a larger request head (request line and headers) gets 431 "
        "and the connection is closed (bytes)"),
    NUM(OPT_SIZE, "server", "max_body_size", max_body_size, 0, 67108864,
        "65536", "a POST body is read up to this size and discarded; larger "
        "gets 413 (bytes)"),
    NUM(OPT_UINT, "server", "request_timeout_ms", request_timeout_ms, 1,
        3600000, "10000", "a connection's first request must be in within "
        "this of the accept, each later one within idle_timeout_ms plus this "
        "(ms)"),
    NUM(OPT_UINT, "server", "idle_timeout_ms", idle_timeout_ms, 1, 3600000,
        "60000", "an idle keep-alive connection is closed after this time "
        "(ms)"),
    NUM(OPT_UINT, "server", "shutdown_timeout_ms", shutdown_timeout_ms, 0,
        600000, "5000", "after SIGTERM, requests in flight get this long to "
        "finish (ms); held long polls get 304 at once"),
    NUM(OPT_UINT, "server", "max_held", max_held, 0, 1000000, "20000",
        "long polls (wait=) held at once; past it a poll is answered at once "
        "(304)"),
    NUM(OPT_UINT, "server", "recheck_ms", recheck_ms, 100, 600000, "2000",
        "every held key is read again at least this often while announcements "
        "are not subscribed (ms)"),
    NUM(OPT_UINT, "server", "recheck_subscribed_ms", recheck_subscribed_ms,
        100, 600000, "10000", "... and while they are: only an announcement "
        "lost without a disconnect needs it (ms)"),
    NUM(OPT_UINT, "server", "announce_ping_ms", announce_ping_ms, 100, 60000,
        "1000", "the announcement subscriber asks Redis this often whether "
        "the connection is alive (ms)"),
    NUM(OPT_UINT, "server", "announce_timeout_ms", announce_timeout_ms, 200,
        600000, "3000", "... and reconnects one silent this long; larger than "
        "announce_ping_ms (ms)"),

    ROW("keys", "prefix", OPT_TEXT, F(key_prefix), 0, FP_MAX_PREFIX_LEN,
        "/Poll", "prepended to the path to make the cache key"),
    CUSTOM("keys", "params", set_params, "user_id",
           "1..16 names of [A-Za-z0-9_.-], 1..64 bytes each",
           "query parameters that select the answer, space- or "
           "comma-separated (the app needs user_id)"),

    NUM(OPT_UINT, "channels", "max", channels_max, 1, FP_MAX_CHANNELS, "16",
        "the most channels one poll's ch= may name; more is refused (400)"),
    APP("channels", "history", 0, UINT_MAX, "20",
        "app: how many of a channel's newest messages its cached answer holds "
        "(the app's range: 1..1000)"),

    ENUM("cache", "backend", backend, backend_names, "memcached",
         "the cache both programs use"),
    NUM(OPT_UINT, "cache", "timeout_ms", cache_timeout_ms, 1, 60000, "100",
        "poll server: a cache answer later than this is a 503, nginx then "
        "falls back (ms)"),
    ROW("cache", "content_type", OPT_TEXT, F(content_type), 1, 255,
        "application/json", "Content-Type of a poll answer, from the cache "
        "and from the app", .flags = OPT_SPACES),
    APP("cache", "ttl", 0, 2592000, "300",
        "app: seconds a filled poll answer lives in the cache (0: no expiry)"),
    APP("cache", "item_max_bytes", 1024, 1048576,
        "1048576", "app: the largest value the cache stores (memcached -I); a "
        "room's and a user's answer must fit"),

    CUSTOM("memcached", "servers", set_servers, "127.0.0.1:11211",
           SERVERS_BOUNDS, "the order matters (ketama); repeat the key to "
           "append", .flags = OPT_REPEAT),
    CUSTOM("memcached", "previous_servers", set_previous_servers, NULL,
           SERVERS_BOUNDS, "app: the list before a membership change; every "
           "key is written to both placements while it is set",
           .flags = OPT_REPEAT | OPT_UNUSED),
    ROW("memcached", "replicas", OPT_CUSTOM, NO_FIELD, 0, 1, NULL,
        "1: every key also on its replica, read when the key's node is down, "
        "hung or recovering", .custom = set_replicas, .flags = OPT_NUMERIC,
        .shown_def = "`1` with 2+ servers, else `0`", .example = "1"),
    NUM(OPT_UINT, "memcached", "recovery_ms", mc_recovery_ms, 0, 600000,
        "5000", "poll server: a node back from down or hung serves no hit "
        "this long (ms)"),

    ROW("redis", "server", OPT_SERVER, F(redis), 0, 0, "127.0.0.1:6379",
        "host:port, or unix:/path/to/redis.sock"),
    ROW("redis", "password_file", OPT_SECRET, F(redis_password), 0, 0, NULL,
        "file whose first line is the AUTH password (mode 0600/0640); empty: "
        "no AUTH"),
    NUM(OPT_INT, "redis", "db", redis_db, 0, 65535, "0",
        "database number (SELECT)"),
    ROW("redis", "username", OPT_NAME, F(redis_username), 0, 256, NULL,
        "a Redis ACL user: AUTH username password (needs password_file)",
        .example = "fastpoll"),
    CUSTOM("redis", "sentinels", set_sentinels, NULL,
           "1..8 host:port, space- or comma-separated",
           "ask these Redis Sentinels for master_name's address instead of "
           "using server", .example = "10.0.0.5:26379,10.0.0.6:26379"),
    ROW("redis", "master_name", OPT_NAME, F(redis_master_name), 0, 128, NULL,
        "the name the sentinels monitor the master under (needs sentinels)",
        .example = "mymaster"),
    ROW("redis", "sentinel_password_file", OPT_SECRET,
        F(redis_sentinel_password), 0, 0, NULL, "file whose first line is the "
        "sentinels' own password (their requirepass); empty: no AUTH"),

    CUSTOM("signing", "secret_file", set_sign_secret_file, NULL,
           "file of 1..4 lines of 32..1024 printable bytes, mode 0600/0640",
           "secrets, one a line: the first signs poll URLs, all verify; "
           "unset: poll URLs are not signed"),
    APP("signing", "ttl", 1, 31536000, "3600",
        "app: seconds a URL from POST /api/poll-url stays valid"),

    NUM(OPT_UINT, "poll", "interval_ms", poll_interval_ms, 0, 3600000, "1000",
        "Poll-Interval-Ms of a poll server's 200 and 304, plus 0..jitter_pct "
        "% of it (ms)"),
    APP("poll", "fallback_interval_ms", 0, 3600000,
        "3000", "the app's Poll-Interval-Ms when the cache could not answer "
        "(ms)"),
    NUM(OPT_UINT, "poll", "jitter_pct", poll_jitter_pct, 0, 100, "20",
        "each Poll-Interval-Ms gets up to this % of its interval added"),
    NUM(OPT_UINT, "poll", "max_wait", poll_max_wait, 0, 300, "30",
        "the longest wait= honoured (seconds); larger values are clamped"),

    NUM(OPT_UINT, "stream", "max", stream_max, 0, 1000000, "20000",
        "event streams held at once; past it a stream gets its answer as one "
        "event and ends, and its client reconnects after the retry hint"),
    NUM(OPT_UINT, "stream", "heartbeat_ms", stream_heartbeat_ms, 1000,
        600000, "15000", "every stream gets a comment line this often; the "
        "edge's read timeout for streams must be above it (ms)"),
    NUM(OPT_UINT, "stream", "lifetime_s", stream_lifetime_s, 1, 86400, "600",
        "a stream ends after this plus 0..10 % of it; its client reconnects "
        "with Last-Event-ID (seconds)"),
    NUM(OPT_UINT, "stream", "retry_spread_ms", stream_retry_spread_ms, 0,
        600000, "5000", "a stream ended by its lifetime, a drain or its "
        "cache tells its client to reconnect after 0..this (ms)"),
    NUM(OPT_SIZE, "stream", "max_buffered", stream_max_buffered, 1024,
        16777216, "65536", "bytes a stream's reader may leave unread (and its "
        "socket's send buffer); more and the stream is dropped (its client "
        "resumes from its last id)"),

    ROW("announce", "server", OPT_SERVER, F(announce), 0, 0, NULL,
        "Redis pub/sub of written keys; unset: the sentinels' master, else "
        "[redis] with the Redis backend, else none", .flags = OPT_UNSET,
        .example = "127.0.0.1:6379"),
    ROW("announce", "password_file", OPT_SECRET, F(announce_password), 0, 0,
        NULL, "file whose first line is the AUTH password; needs server"),
    ROW("announce", "username", OPT_NAME, F(announce_username), 0, 256, NULL,
        "ACL user for AUTH username password; needs password_file"),
    ROW("announce", "channel", OPT_NAME, F(announce_channel), 1, 128,
        "fastpoll:announce", "the app publishes each written key there, each "
        "poll server subscribes", .flags = OPT_REQUIRED),

    ROW("admin", "listen", OPT_ADDRESS, F(admin_listen), 0, 0, "127.0.0.1",
        "address of /metrics and /healthz: keep it loopback"),
    NUM(OPT_UINT, "admin", "port", admin_port, 0, 65535, "0",
        "TCP port of /metrics and /healthz (usually set with -A); 0: no admin "
        "listener"),

    ENUM("log", "level", log_level, level_names, "info",
         "nothing is logged per request unless debug"),
    ROW("log", "file", OPT_PATH, F(log_file), 0, 0, NULL,
        "append here instead of stderr; SIGHUP reopens it (logrotate)",
        .shown_def = "(none: stderr)",
        .example = "/var/log/fastpoll/poller.log"),
    ENUM("log", "format", log_format, format_names, "text",
         "text (time pid level: message) or json (one JSON object a line)"),
};

#define NOPTIONS (sizeof(options) / sizeof(options[0]))

const struct option_def *fp_config_options(size_t *n)
{
    *n = NOPTIONS;
    return options;
}

static int known_section(const char *section)
{
    for (size_t i = 0; i < NOPTIONS; i++)
        if (strcmp(section, options[i].section) == 0)
            return 1;
    return 0;
}

static const struct option_def *find_option(const char *section,
                                            const char *name)
{
    for (size_t i = 0; i < NOPTIONS; i++)
        if (strcmp(options[i].section, section) == 0 &&
            strcmp(options[i].name, name) == 0)
            return &options[i];
    return NULL;
}

/* ---- public: defaults, set, free -------------------------------------- */

void fp_config_free(struct fp_settings *s)
{
    for (size_t i = 0; i < NOPTIONS; i++) {
        const struct option_def *o = &options[i];

        if (o->offset == NO_FIELD)
            continue;
        switch (o->kind) {
        case OPT_TEXT:
        case OPT_NAME:
        case OPT_ADDRESS:
        case OPT_PATH:
            free(*FIELD(s, o, char *));
            break;
        case OPT_SECRET: {
            char *p = *FIELD(s, o, char *);
            if (p != NULL) {
                explicit_bzero(p, strlen(p));
                free(p);
            }
            break;
        }
        case OPT_SERVER:
            addr_free(FIELD(s, o, struct fp_server_addr));
            break;
        default:
            break;
        }
    }
    /* What the custom rows own. */
    free(s->listen);
    free(s->listen_unix);
    for (size_t i = 0; i < s->nkey_params; i++)
        free(s->key_params[i]);
    clear_servers(s);
    clear_sentinels(s);
    clear_secrets(s);
    memset(s, 0, sizeof(*s));
}

int fp_config_defaults(struct fp_settings *s, char *err, size_t errlen)
{
    memset(s, 0, sizeof(*s));
    s->mc_replicas = -1; /* unset: fp_config_finish follows the servers */
    for (size_t i = 0; i < NOPTIONS; i++) {
        const struct option_def *o = &options[i];
        char why[256];

        if (o->def == NULL)
            continue;
        if (set_value(s, o, o->def, why, sizeof(why)) < 0) {
            fmt(err, errlen, "[%s] %s default \"%s\": %s", o->section, o->name,
                o->def, why);
            fp_config_free(s);
            return -1;
        }
    }
    return 0;
}

int fp_config_set(struct fp_settings *s, const char *section, const char *key,
                  const char *value, char *why, size_t whylen)
{
    const struct option_def *o = find_option(section, key);

    if (o == NULL) {
        fmt(why, whylen, "unknown key");
        return -1;
    }
    return set_value(s, o, value, why, whylen);
}

/* ---- the INI file ----------------------------------------------------- */

struct ini_ctx {
    struct fp_settings *s;
    const char *name;
    FILE *f;
    int lineno;                 /* lines handed to libinih so far */
    int err_line;               /* first error we found, 0 = none */
    char *err;
    size_t errlen;
    int set_line[NOPTIONS];     /* where each key was first set */
    bool servers_seen;
};

/* isspace() in the C locale, as libinih trims. */
static int is_ini_space(char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\v' || c == '\f' ||
           c == '\r';
}

/* Nothing, or a comment after whitespace: what may follow a "]". */
static int blank_or_comment(const char *p)
{
    const char *q = p;

    while (is_ini_space(*q))
        q++;
    return *q == '\0' || (q > p && (*q == ';' || *q == '#'));
}

/* The lines libinih reads without a word, refused as the app refuses them
 * (fallback_app config.py, tests/vectors/config.json): a section header is
 * "[name]" with at most a comment after it and names a section one of the
 * two programs reads; any other line that is not a comment needs "=" or ":"
 * before a comment. libinih's own syntax error could not name the key. */
static int check_line(struct ini_ctx *c, const char *line)
{
    const char *p = line, *end;
    char text[INI_MAX_LINE], q[96];
    size_t n;

    if (c->lineno == 1 && strncmp(p, "\xEF\xBB\xBF", 3) == 0)
        p += 3; /* libinih skips a UTF-8 byte order mark there */
    while (is_ini_space(*p))
        p++;
    if (*p == '\0' || *p == ';' || *p == '#')
        return 0;
    n = strlen(p);
    while (n > 0 && (p[n - 1] == '\n' || p[n - 1] == '\r'))
        n--;
    if (n >= sizeof(text))
        n = sizeof(text) - 1;
    memcpy(text, p, n);
    text[n] = '\0';
    if (*p == '[') {
        end = strchr(p + 1, ']');
        if (end == NULL || !blank_or_comment(end + 1)) {
            quote(q, sizeof(q), text);
            fmt(c->err, c->errlen, "%s:%d: malformed section header %s "
                "(expected \"[name]\", then nothing or a comment)", c->name,
                c->lineno, q);
            goto fail;
        }
        text[end - p + 1] = '\0';
        quote(q, sizeof(q), text);
        text[end - p] = '\0'; /* the name alone, for the lookup */
        if (!known_section(text + 1) && strcmp(text + 1, "app") != 0) {
            fmt(c->err, c->errlen, "%s:%d: unknown section %s (neither the "
                "poll server nor the app reads it)", c->name, c->lineno, q);
            goto fail;
        }
        return 0;
    }
    for (end = p; *end != '\0' && *end != '=' && *end != ':'; end++)
        if (is_ini_space(end[0]) && (end[1] == ';' || end[1] == '#'))
            break;
    if (*end == '=' || *end == ':')
        return 0;
    quote(q, sizeof(q), text);
    fmt(c->err, c->errlen, "%s:%d: syntax error: expected \"key = value\", "
        "\"[section]\" or a comment, got %s", c->name, c->lineno, q);
fail:
    c->err_line = c->lineno;
    return -1;
}

/* libinih's reader: fgets plus line counting, so that the handler knows the
 * line (Debian builds inih without INI_HANDLER_LINENO) and an over-long
 * line is an error instead of being split into two. */
static char *fp_ini_reader(char *str, int num, void *stream)
{
    struct ini_ctx *c = stream;
    size_t n, content;
    int overlong = 0;

    if (c->err_line != 0)       /* stop at our first error */
        return NULL;
    if (fgets(str, num, c->f) == NULL)
        return NULL;
    c->lineno++;
    n = strlen(str);
    if (n == (size_t)num - 1 && str[n - 1] != '\n') {
        /* The buffer is full: the line ends here, or it is too long. */
        int ch = fgetc(c->f);
        if (ch == '\r')
            ch = fgetc(c->f) == '\n' ? '\n' : 'x';
        if (ch != EOF && ch != '\n') {
            overlong = 1;
            while (ch != EOF && ch != '\n')
                ch = fgetc(c->f);
        }
    }
    content = n;
    if (content > 0 && str[content - 1] == '\n')
        content--;
    if (content > 0 && str[content - 1] == '\r')
        content--;
    /* The app refuses the same lines (fallback_app config.py MAX_LINE). */
    if (overlong || content > (size_t)num - 2) {
        c->err_line = c->lineno;
        fmt(c->err, c->errlen, "%s:%d: line longer than %d bytes (the "
            "limit of Debian's libinih); split a long [memcached] "
            "servers list over several \"servers =\" lines",
            c->name, c->lineno, num - 2);
        str[0] = '\0';
    } else if (check_line(c, str) < 0) {
        str[0] = '\0';
    }
    return str;
}

static int fp_ini_handler(void *user, const char *section, const char *name,
                       const char *value)
{
    struct ini_ctx *c = user;
    const struct option_def *o;
    char why[256], q[128];
    size_t idx;

    if (c->err_line != 0)
        return 0;
    if (section[0] == '\0') {
        fmt(c->err, c->errlen, "%s:%d: key \"%s\" outside of any [section]",
            c->name, c->lineno, name);
        goto fail;
    }
    if (!known_section(section))
        return 1; /* [app] and other programs' sections */
    o = find_option(section, name);
    if (o == NULL) {
        quote(q, sizeof(q), name);
        fmt(c->err, c->errlen, "%s:%d: unknown key %s in [%s]", c->name,
            c->lineno, q, section);
        goto fail;
    }
    idx = (size_t)(o - options);
    if (c->set_line[idx] != 0 && !(o->flags & OPT_REPEAT)) {
        fmt(c->err, c->errlen, "%s:%d: [%s] %s given twice (first on line %d)",
            c->name, c->lineno, section, name, c->set_line[idx]);
        goto fail;
    }
    if (c->set_line[idx] == 0)
        c->set_line[idx] = c->lineno;
    if (o->custom == set_servers && !c->servers_seen) {
        clear_servers(c->s); /* the file's list replaces the default */
        c->servers_seen = true;
    }
    if (set_value(c->s, o, value, why, sizeof(why)) < 0) {
        quote(q, sizeof(q), value);
        fmt(c->err, c->errlen, "%s:%d: [%s] %s = %s: %s", c->name, c->lineno,
            section, name, q, why);
        goto fail;
    }
    if (o->custom == set_replicas)
        c->s->mc_replicas_line = c->lineno;
    return 1;
fail:
    c->err_line = c->lineno;
    return 0;
}

/* Where the file set section/key, 0 if it did not. */
static int line_of(const struct ini_ctx *c, const char *section,
                   const char *key)
{
    const struct option_def *o = find_option(section, key);

    return o != NULL ? c->set_line[o - options] : 0;
}

/* Rules between keys, once the whole file is read; the error names the
 * line of the key that breaks the rule. Returns 0 or -1. */
static int check_together(const struct ini_ctx *c)
{
    const struct fp_settings *s = c->s;
    int ls = line_of(c, "redis", "sentinels");
    int lm = line_of(c, "redis", "master_name");
    int lu = line_of(c, "redis", "username");

    /* No rule between request_timeout_ms and [cache] timeout_ms: a request
     * waiting for the cache is bounded by the cache's timeout alone (http.c
     * ignores its connection timer meanwhile). */
    if (s->announce_timeout_ms <= s->announce_ping_ms) {
        int lt = line_of(c, "server", "announce_timeout_ms");
        fmt(c->err, c->errlen, "%s:%d: [server] announce_timeout_ms = %u must "
            "be larger than announce_ping_ms = %u", c->name,
            lt != 0 ? lt : line_of(c, "server", "announce_ping_ms"),
            s->announce_timeout_ms, s->announce_ping_ms);
        return -1;
    }
    if ((s->nredis_sentinels > 0) != (s->redis_master_name != NULL)) {
        fmt(c->err, c->errlen, "%s:%d: [redis] %s needs [redis] %s too",
            c->name, ls != 0 ? ls : lm,
            s->nredis_sentinels > 0 ? "sentinels" : "master_name",
            s->nredis_sentinels > 0 ? "master_name" : "sentinels");
        return -1;
    }
    if (s->redis_sentinel_password != NULL && s->nredis_sentinels == 0) {
        fmt(c->err, c->errlen, "%s:%d: [redis] sentinel_password_file needs "
            "[redis] sentinels", c->name,
            line_of(c, "redis", "sentinel_password_file"));
        return -1;
    }
    if (s->redis_username != NULL && s->redis_password == NULL) {
        fmt(c->err, c->errlen, "%s:%d: [redis] username needs [redis] "
            "password_file (AUTH username password)", c->name, lu);
        return -1;
    }
    /* As the app (config.py, _announce): the credentials go with a server. */
    if (s->announce_username != NULL && s->announce_password == NULL) {
        fmt(c->err, c->errlen, "%s:%d: [announce] username needs [announce] "
            "password_file", c->name, line_of(c, "announce", "username"));
        return -1;
    }
    if ((s->announce_password != NULL || s->announce_username != NULL) &&
        s->announce.host == NULL && s->announce.unix_path == NULL) {
        int lp = line_of(c, "announce", "password_file");
        fmt(c->err, c->errlen, "%s:%d: [announce] %s needs [announce] server",
            c->name, lp != 0 ? lp : line_of(c, "announce", "username"),
            lp != 0 ? "password_file" : "username");
        return -1;
    }
    return 0;
}

int fp_config_load_stream(struct fp_settings *s, FILE *f, const char *name,
                          char *err, size_t errlen)
{
    static char comment_prefixes[] = ";#";
    struct ini_ctx c;
    int r;

    memset(&c, 0, sizeof(c));
    c.s = s;
    c.name = name;
    c.f = f;
    c.err = err;
    c.errlen = errlen;

    /* Debian's libinih exposes its options as variables: match the app's
     * reader (inline ';' and '#' comments, no continuation lines). */
    ini_allow_multiline = false;
    ini_allow_inline_comments = true;
    ini_inline_comment_prefixes = comment_prefixes;

    r = ini_parse_stream(fp_ini_reader, &c, fp_ini_handler, &c);
    if (c.err_line != 0 && (r <= 0 || r >= c.err_line))
        return -1;
    if (r > 0) {
        fmt(err, errlen, "%s:%d: syntax error: expected \"key = value\", "
            "\"[section]\" or a comment", name, r);
        return -1;
    }
    if (r < 0 || ferror(f)) {
        fmt(err, errlen, "%s: read error", name);
        return -1;
    }
    return check_together(&c);
}

/* The hex SHA-256 of the whole stream, which is left rewound. */
static int hash_stream(FILE *f, char hex[65])
{
    struct sha256_ctx ctx;
    uint8_t buf[4096], d[SHA256_DIGEST_SIZE];
    size_t n;

    sha256_init(&ctx);
    while ((n = fread(buf, 1, sizeof(buf), f)) > 0)
        sha256_update(&ctx, n, buf);
    if (ferror(f) || fseek(f, 0, SEEK_SET) != 0)
        return -1;
    sha256_digest(&ctx, sizeof(d), d);
    for (size_t i = 0; i < sizeof(d); i++)
        (void)snprintf(hex + 2 * i, 3, "%02x", d[i]);
    return 0;
}

int fp_config_load_file(struct fp_settings *s, const char *path,
                        char *err, size_t errlen)
{
    FILE *f = fopen(path, "r");
    int rc;

    if (f == NULL) {
        fmt(err, errlen, "%s: cannot open: %s", path, strerror(errno));
        return -1;
    }
    /* The bytes hashed are the ones parsed: the same open file, rewound. */
    if (hash_stream(f, s->config_sha256) != 0) {
        fmt(err, errlen, "%s: read error", path);
        (void)fclose(f);
        return -1;
    }
    rc = fp_config_load_stream(s, f, path, err, errlen);
    (void)fclose(f);
    return rc;
}

int fp_config_finish(struct fp_settings *s, const char *name, char *err,
                     size_t errlen)
{
    /* A replica is the ketama choice over the other servers: one server
     * has none. Unset, replicas follow the list. */
    if (s->mc_replicas < 0) {
        s->mc_replicas = s->nmc_servers >= 2 ? 1 : 0;
    } else if (s->mc_replicas == 1 && s->nmc_servers < 2 &&
               s->backend == FP_BACKEND_MEMCACHED) {
        if (s->mc_replicas_line > 0)
            fmt(err, errlen, "%s:%d: [memcached] replicas = 1 needs at least "
                "2 servers", name ? name : "(config)", s->mc_replicas_line);
        else
            fmt(err, errlen, "[memcached] replicas = 1 needs at least 2 "
                "servers");
        return -1;
    }
    return 0;
}

/* ---- the command line ------------------------------------------------- */

struct flag_def {
    int ch;
    const char *longname;
    const char *section, *key;
};

static const struct flag_def flags[] = {
    { 'l', "listen", "server", "listen" },
    { 'p', "port", "server", "port" },
    { 'b', "backend", "cache", "backend" },
    { 's', "servers", "memcached", "servers" },
    { 'r', "redis", "redis", "server" },
    { 'L', "log-level", "log", "level" },
    { 'A', "admin-port", "admin", "port" },
};

#define NFLAGS (sizeof(flags) / sizeof(flags[0]))

void fp_config_usage(FILE *out, const char *prog)
{
    (void)fprintf(out,
        "usage: %s [-c FILE] [-t] [-l ADDR] [-p PORT] [-b memcached|redis]\n"
        "       [-s \"host:port host:port\"] [-r host:port|unix:/path]\n"
        "       [-L debug|info|warn|error] [-A PORT] [-h] [-V]\n"
        "       [--dump-config[=ini|markdown|json]]\n"
        "  -c, --config FILE     read FILE (fastpoll.ini); without it, defaults\n"
        "  -t, --test            check the configuration, print \"config OK\", exit\n"
        "  -l, --listen ADDR     [server] listen: ADDR, unix:/path or both\n"
        "  -p, --port PORT       [server] port\n"
        "  -b, --backend NAME    [cache] backend\n"
        "  -s, --servers LIST    [memcached] servers (replaces the file's list)\n"
        "  -r, --redis ADDR      [redis] server\n"
        "  -L, --log-level LEVEL [log] level\n"
        "  -A, --admin-port PORT [admin] port (0: no admin listener)\n"
        "  -h, --help            this text\n"
        "  -V, --version         print the version\n"
        "  --dump-config[=FMT]   print every key with its default, bounds and help,\n"
        "                        exit: ini (default) an example fastpoll.ini, markdown\n"
        "                        docs/configuration.md's tables, json for tools\n"
        "Flags override the file. See docs/configuration.md.\n", prog);
}

int fp_config_from_args(struct fp_settings *s, struct fp_cli *cli,
                        int argc, char **argv, char *err, size_t errlen)
{
    static const struct option longopts[] = {
        { "config", required_argument, NULL, 'c' },
        { "test", no_argument, NULL, 't' },
        { "listen", required_argument, NULL, 'l' },
        { "port", required_argument, NULL, 'p' },
        { "backend", required_argument, NULL, 'b' },
        { "servers", required_argument, NULL, 's' },
        { "redis", required_argument, NULL, 'r' },
        { "log-level", required_argument, NULL, 'L' },
        { "admin-port", required_argument, NULL, 'A' },
        { "help", no_argument, NULL, 'h' },
        { "version", no_argument, NULL, 'V' },
        { "dump-config", optional_argument, NULL, 'D' },
        { NULL, 0, NULL, 0 },
    };
    /* Flags are applied after the file, in command-line order. */
    struct { const struct flag_def *flag; const char *value; } over[64];
    size_t nover = 0;
    int ch;

    memset(cli, 0, sizeof(*cli));
    memset(s, 0, sizeof(*s));
    opterr = 0;
    optind = 1;
    while ((ch = getopt_long(argc, argv, ":c:tl:p:b:s:r:L:A:hV", longopts,
                             NULL)) != -1) {
        size_t i;

        switch (ch) {
        case 'c': cli->config_path = optarg; continue;
        case 't': cli->test_only = 1; continue;
        case 'h': cli->help = 1; return 0;
        case 'V': cli->version = 1; return 0;
        case 'D': /* long only: -D is not in the short options */
            cli->dump_config = optarg != NULL ? optarg : "ini";
            if (strcmp(cli->dump_config, "ini") != 0 &&
                strcmp(cli->dump_config, "markdown") != 0 &&
                strcmp(cli->dump_config, "json") != 0) {
                fmt(err, errlen, "--dump-config=%s: not ini, markdown or json",
                    cli->dump_config);
                return -1;
            }
            return 0;
        case ':':
            fmt(err, errlen, "option %s needs a value", argv[optind - 1]);
            return -1;
        case '?':
            if (optopt)
                fmt(err, errlen, "unknown option -%c (try -h)", optopt);
            else
                fmt(err, errlen, "unknown option %s (try -h)", argv[optind - 1]);
            return -1;
        default:
            break;
        }
        for (i = 0; i < NFLAGS; i++)
            if (flags[i].ch == ch)
                break;
        if (i == NFLAGS || nover == sizeof(over) / sizeof(over[0])) {
            fmt(err, errlen, "too many options");
            return -1;
        }
        over[nover].flag = &flags[i];
        over[nover].value = optarg;
        nover++;
    }
    if (optind < argc) {
        fmt(err, errlen, "unexpected argument \"%s\" (try -h)", argv[optind]);
        return -1;
    }

    if (fp_config_defaults(s, err, errlen) < 0)
        return -1;
    if (cli->config_path != NULL &&
        fp_config_load_file(s, cli->config_path, err, errlen) < 0)
        return -1;

    for (size_t i = 0; i < nover; i++) {
        const struct flag_def *fl = over[i].flag;
        char why[256], q[128];

        if (fl->ch == 's')
            clear_servers(s); /* -s replaces the list */
        if (fp_config_set(s, fl->section, fl->key, over[i].value, why,
                          sizeof(why)) < 0) {
            quote(q, sizeof(q), over[i].value);
            fmt(err, errlen, "-%c/--%s %s: %s ([%s] %s)", fl->ch, fl->longname,
                q, why, fl->section, fl->key);
            return -1;
        }
    }
    return fp_config_finish(s, cli->config_path, err, errlen);
}

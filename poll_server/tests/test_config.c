/* test_config.c -- config.c: defaults, a good file, every kind of bad value
 * (the error names file, line and key), unknown keys and sections, repeats,
 * libinih's line limit, the password file and command-line overrides. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <unistd.h>

#include "../src/config.h"
#include "../src/log.h"

static char err[FP_CONFIG_ERRLEN];

/* Parses `text` over the defaults; returns the load result. */
static int load(struct fp_settings *s, const char *text)
{
    FILE *f;
    int rc;

    assert_int_equal(fp_config_defaults(s, err, sizeof(err)), 0);
    f = fmemopen((void *)text, strlen(text), "r");
    assert_non_null(f);
    err[0] = '\0';
    rc = fp_config_load_stream(s, f, "fastpoll.ini", err, sizeof(err));
    fclose(f);
    return rc;
}

/* The file must be refused with an error containing every needle. */
static void expect_error(const char *text, const char *n1, const char *n2,
                         const char *n3)
{
    struct fp_settings s;
    const char *needles[] = { n1, n2, n3 };

    if (load(&s, text) == 0)
        fail_msg("accepted: %s", text);
    for (size_t i = 0; i < 3; i++)
        if (needles[i] != NULL && strstr(err, needles[i]) == NULL)
            fail_msg("error \"%s\" lacks \"%s\"", err, needles[i]);
    fp_config_free(&s);
}

static void test_defaults(void **state)
{
    struct fp_settings s;
    (void)state;

    assert_int_equal(fp_config_defaults(&s, err, sizeof(err)), 0);
    assert_string_equal(s.listen, "127.0.0.1");
    assert_int_equal(s.port, 8101);
    assert_int_equal(s.max_header_size, 8192);
    assert_int_equal(s.max_body_size, 65536);
    assert_int_equal(s.request_timeout_ms, 10000);
    assert_int_equal(s.idle_timeout_ms, 60000);
    assert_int_equal(s.shutdown_timeout_ms, 5000);
    assert_string_equal(s.key_prefix, "/Poll");
    assert_int_equal(s.nkey_params, 1);
    assert_string_equal(s.key_params[0], "user_id");
    assert_int_equal(s.backend, FP_BACKEND_MEMCACHED);
    assert_int_equal(s.cache_timeout_ms, 100);
    assert_string_equal(s.content_type, "application/json");
    assert_int_equal(s.nmc_servers, 1);
    assert_string_equal(s.mc_servers[0].host, "127.0.0.1");
    assert_int_equal(s.mc_servers[0].port, 11211);
    assert_string_equal(s.redis.host, "127.0.0.1");
    assert_int_equal(s.redis.port, 6379);
    assert_null(s.redis.unix_path);
    assert_null(s.redis_password);
    assert_int_equal(s.redis_db, 0);
    assert_int_equal(s.log_level, FP_LOG_INFO);
    assert_int_equal(s.log_format, FP_LOG_TEXT);
    fp_config_free(&s);
}

static void test_good_file(void **state)
{
    struct fp_settings s;
    (void)state;

    assert_int_equal(load(&s,
        "; fastpoll\n"
        "# both comment styles\n"
        "[server]\n"
        "listen = 10.1.2.3\n"
        "port = 9000 ; inline comment\n"
        "max_header_size = 4096\n"
        "max_body_size = 0\n"
        "request_timeout_ms = 2000\n"
        "idle_timeout_ms = 30000   # also inline\n"
        "shutdown_timeout_ms = 0\n"
        "\n"
        "[keys]\n"
        "prefix = fp:\n"
        "params = user_id, channel  user_id a.b\n"
        "[cache]\n"
        "backend = redis\n"
        "timeout_ms = 250\n"
        "content_type = application/json; charset=utf-8\n"
        "ttl = 0\n"
        "[memcached]\n"
        "servers = 10.0.0.1:11211, mc-2.example:11212\n"
        "servers: 10.0.0.3:1\n"
        "[redis]\n"
        "server = unix:/run/redis/redis.sock\n"
        "db = 3\n"
        "[log]\n"
        "level = debug\n"
        "[app]\n"
        "database = /var/lib/fastpoll.db\n"
        "anything = goes here\n"), 0);
    assert_string_equal(s.listen, "10.1.2.3");
    assert_int_equal(s.port, 9000);
    assert_int_equal(s.max_header_size, 4096);
    assert_int_equal(s.max_body_size, 0);
    assert_int_equal(s.request_timeout_ms, 2000);
    assert_int_equal(s.idle_timeout_ms, 30000);
    assert_int_equal(s.shutdown_timeout_ms, 0);
    assert_string_equal(s.key_prefix, "fp:");
    /* sorted bytewise, duplicates dropped */
    assert_int_equal(s.nkey_params, 3);
    assert_string_equal(s.key_params[0], "a.b");
    assert_string_equal(s.key_params[1], "channel");
    assert_string_equal(s.key_params[2], "user_id");
    assert_int_equal(s.backend, FP_BACKEND_REDIS);
    assert_int_equal(s.cache_timeout_ms, 250);
    assert_string_equal(s.content_type, "application/json; charset=utf-8");
    /* the file's list replaces the default; a repeated key appends */
    assert_int_equal(s.nmc_servers, 3);
    assert_string_equal(s.mc_servers[0].host, "10.0.0.1");
    assert_int_equal(s.mc_servers[0].port, 11211);
    assert_string_equal(s.mc_servers[1].host, "mc-2.example");
    assert_int_equal(s.mc_servers[1].port, 11212);
    assert_string_equal(s.mc_servers[2].host, "10.0.0.3");
    assert_int_equal(s.mc_servers[2].port, 1);
    assert_null(s.redis.host);
    assert_string_equal(s.redis.unix_path, "/run/redis/redis.sock");
    assert_int_equal(s.redis_db, 3);
    assert_int_equal(s.log_level, FP_LOG_DEBUG);
    fp_config_free(&s);
}

static void test_empty_values(void **state)
{
    struct fp_settings s;
    (void)state;

    /* An empty prefix and no keyed params are legal (see the vectors). */
    assert_int_equal(load(&s, "[keys]\nprefix =\nparams =\n"), 0);
    assert_string_equal(s.key_prefix, "");
    assert_int_equal(s.nkey_params, 0);
    fp_config_free(&s);
    assert_int_equal(load(&s, ""), 0);
    fp_config_free(&s);
}

static void test_bad_values(void **state)
{
    (void)state;
    expect_error("[cache]\n\ntimeout_ms = abc\n", "fastpoll.ini:3:",
                 "timeout_ms = \"abc\"", "not an integer in 1..60000");
    expect_error("[cache]\ntimeout_ms = 0\n", ":2:", "timeout_ms", "1..60000");
    expect_error("[cache]\ntimeout_ms = 60001\n", ":2:", "timeout_ms", NULL);
    expect_error("[cache]\ntimeout_ms = -5\n", ":2:", "timeout_ms", NULL);
    expect_error("[cache]\ntimeout_ms = 10ms\n", ":2:", "timeout_ms", NULL);
    expect_error("[cache]\ntimeout_ms = 99999999999999999999999\n", ":2:",
                 "timeout_ms", NULL);
    expect_error("[cache]\ntimeout_ms =\n", ":2:", "timeout_ms", NULL);
    expect_error("[server]\nport = 0\n", ":2:", "port", "1..65535");
    expect_error("[server]\nport = 65536\n", ":2:", "port", NULL);
    expect_error("[server]\nlisten = 127.0.0.1 x\n", ":2:", "listen", NULL);
    expect_error("[server]\nlisten =\n", ":2:", "listen", NULL);
    expect_error("[server]\nmax_header_size = 10\n", ":2:", "max_header_size", NULL);
    expect_error("[server]\nmax_body_size = 1e6\n", ":2:", "max_body_size", NULL);
    expect_error("[server]\nrequest_timeout_ms = 0\n", ":2:", "request_timeout_ms", NULL);
    expect_error("[server]\nidle_timeout_ms = x\n", ":2:", "idle_timeout_ms", NULL);
    expect_error("[server]\nshutdown_timeout_ms = 600001\n", ":2:",
                 "shutdown_timeout_ms", NULL);
    expect_error("[keys]\nprefix = has space\n", ":2:", "prefix", "0x21-0x7E");
    expect_error("[keys]\nprefix = "
                 "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\n",
                 ":2:", "prefix", "64");
    expect_error("[keys]\nprefix = caf\xc3\xa9\n", ":2:", "prefix", "\\xC3");
    expect_error("[keys]\nparams = user_id us/er\n", ":2:", "params", "us/er");
    expect_error("[keys]\nparams = "
                 "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\n",
                 ":2:", "params", "1..64");
    expect_error("[keys]\nparams = a b c d e f g h i j k l m n o p q\n", ":2:",
                 "params", "more than 16");
    expect_error("[cache]\nbackend = couchbase\n", ":2:", "backend",
                 "not memcached or redis");
    expect_error("[cache]\ncontent_type =\n", ":2:", "content_type", NULL);
    expect_error("[cache]\nttl = 2592001\n", ":2:", "ttl", "0..2592000");
    expect_error("[memcached]\nservers = 127.0.0.1\n", ":2:", "servers",
                 "host:port");
    expect_error("[memcached]\nservers = 127.0.0.1:0\n", ":2:", "servers", "1..65535");
    expect_error("[memcached]\nservers = a:1 b_c:2\n", ":2:", "servers", "b_c:2");
    expect_error("[memcached]\nservers = 127.0.0.1:11211\nservers = ,\n", ":3:",
                 "servers", "no host:port");
    expect_error("[memcached]\nservers = :11211\n", ":2:", "servers", "bad host");
    expect_error("[redis]\nserver = unix:relative.sock\n", ":2:", "server",
                 "absolute");
    expect_error("[redis]\nserver = localhost\n", ":2:", "server", "unix:/path");
    expect_error("[redis]\ndb = 65536\n", ":2:", "db", "0..65535");
    expect_error("[redis]\npassword_file = /nonexistent/fastpoll-pw\n", ":2:",
                 "password_file", "cannot read");
    expect_error("[log]\nlevel = verbose\n", ":2:", "level", "debug, info");
    expect_error("[log]\nfile = relative.log\n", ":2:", "file", "absolute");
    expect_error("[log]\nformat = yaml\n", ":2:", "format", "text or json");
    expect_error("[log]\nformat = JSON\n", ":2:", "format", "text or json");
    expect_error("[redis]\nusername = has space\n", ":2:", "username", "printable");
    expect_error("[redis]\nsentinels = 127.0.0.1\n", ":2:", "sentinels", "host:port");
    expect_error("[redis]\nmaster_name = m\n", ":2:", "master_name", "sentinels");
    /* rules between keys: the line of the key that breaks them */
    expect_error("[server]\nannounce_timeout_ms = 1000\nannounce_ping_ms = 1000\n",
                 ":2:", "announce_timeout_ms = 1000 must be larger", "1000");
    expect_error("[server]\nannounce_ping_ms = 5000\n", ":2:",
                 "announce_timeout_ms = 3000", "announce_ping_ms = 5000");
    expect_error("[server]\nannounce_ping_ms = 99\n", ":2:", "announce_ping_ms",
                 "100..60000");
}

/* request_timeout_ms bounds receiving a request, never a cache get (conn.c
 * ignores the timer while the cache is asked): smaller than the cache's
 * timeout, or than twice it with replicas, is a valid file. */
static void test_request_vs_cache_timeout(void **state)
{
    struct fp_settings s;
    (void)state;

    assert_int_equal(load(&s, "[server]\nrequest_timeout_ms = 99\n"), 0);
    assert_int_equal(s.request_timeout_ms, 99);
    fp_config_free(&s);
    assert_int_equal(load(&s, "[cache]\ntimeout_ms = 300\n[server]\n"
                              "request_timeout_ms = 200\n"), 0);
    fp_config_free(&s);
    assert_int_equal(load(&s, "[memcached]\nservers = 127.0.0.1:1 127.0.0.1:2\n"
                              "[server]\nrequest_timeout_ms = 150\n"), 0);
    assert_int_equal(s.mc_replicas, -1); /* 1 with 2 servers */
    fp_config_free(&s);
}

/* The Sentinel keys, the ACL user, the log file; the config's hash. */
static void test_redis_sentinel_and_log_file(void **state)
{
    struct fp_settings s;

    (void)state;
    assert_int_equal(load(&s, "[redis]\nsentinels = 127.0.0.1:26379, "
                              "10.0.0.2:26380\nmaster_name = mymaster\n"
                              "[log]\nfile = /var/log/fp.log\nformat = json\n"), 0);
    assert_int_equal(s.nredis_sentinels, 2);
    assert_string_equal(s.redis_sentinels[1].host, "10.0.0.2");
    assert_int_equal(s.redis_sentinels[1].port, 26380);
    assert_string_equal(s.redis_master_name, "mymaster");
    assert_string_equal(s.log_file, "/var/log/fp.log");
    assert_int_equal(s.log_format, FP_LOG_JSON);
    assert_null(s.redis_username);
    assert_string_equal(s.config_sha256, ""); /* a stream: no file, no hash */
    fp_config_free(&s);
}

/* [server] listen: an address, a unix socket, or one of each; unix_mode. */
static void test_listen_unix(void **state)
{
    struct fp_settings s;
    (void)state;

    assert_int_equal(fp_config_defaults(&s, err, sizeof(err)), 0);
    assert_null(s.listen_unix);
    assert_int_equal(s.unix_mode, 0660);
    fp_config_free(&s);

    assert_int_equal(load(&s, "[server]\nlisten = unix:/run/fastpoll/p0.sock\n"), 0);
    assert_null(s.listen);
    assert_string_equal(s.listen_unix, "/run/fastpoll/p0.sock");
    fp_config_free(&s);

    assert_int_equal(load(&s, "[server]\nlisten = 127.0.0.2   unix:/run/p.sock\n"
                              "unix_mode = 0600\n"), 0);
    assert_string_equal(s.listen, "127.0.0.2");
    assert_string_equal(s.listen_unix, "/run/p.sock");
    assert_int_equal(s.unix_mode, 0600);
    fp_config_free(&s);

    /* A value replaces both parts (-l over the file's listen). */
    assert_int_equal(load(&s, "[server]\nlisten = unix:/run/p.sock ::1\n"), 0);
    assert_string_equal(s.listen, "::1");
    assert_int_equal(fp_config_set(&s, "server", "listen", "10.0.0.1", err,
                                   sizeof(err)), 0);
    assert_string_equal(s.listen, "10.0.0.1");
    assert_null(s.listen_unix);
    fp_config_free(&s);

    expect_error("[server]\nlisten = unix:relative.sock\n", ":2:", "listen",
                 "absolute");
    expect_error("[server]\nlisten = unix:\n", ":2:", "listen", "absolute");
    expect_error("[server]\nlisten = unix:/a.sock unix:/b.sock\n", ":2:",
                 "listen", "more than one unix");
    expect_error("[server]\nlisten = unix:/" /* 108 bytes: one too many */
                 "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
                 "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\n", ":2:", "listen", "107");
    expect_error("[server]\nlisten = 127.0.0.1 ::1\n", ":2:", "listen",
                 "more than one address");
    expect_error("[server]\nlisten = unix:/a.sock b_c\n", ":2:", "listen", NULL);
    expect_error("[server]\nunix_mode = 0999\n", ":2:", "unix_mode", "octal");
    expect_error("[server]\nunix_mode = 1777\n", ":2:", "unix_mode", "0..0777");
    expect_error("[server]\nunix_mode = rw\n", ":2:", "unix_mode", NULL);
    expect_error("[server]\nunix_mode =\n", ":2:", "unix_mode", NULL);
    expect_error("[server]\nunix_mode = 00660\n", ":2:", "unix_mode", NULL);
}

static void test_unknown_and_repeats(void **state)
{
    (void)state;
    expect_error("[server]\nport = 1\n\n[cache]\nbackedn = redis\n",
                 "fastpoll.ini:5:", "unknown key \"backedn\"", "[cache]");
    expect_error("[log]\nlevel = info\nLevel = info\n", ":3:", "\"Level\"", NULL);
    expect_error("port = 1\n", ":1:", "outside", "port");
    expect_error("[cache]\ntimeout_ms = 1\ntimeout_ms = 2\n", ":3:",
                 "given twice", "line 2");
    /* No continuation lines: the app does not have them either. */
    expect_error("[memcached]\nservers = a:1\n  b:2\n", ":3:",
                 "unknown key \"b\"", NULL);
    expect_error("[memcached]\nservers = a:1\n  b\n", ":3:", "syntax", NULL);
    expect_error("[server\nport = 1\n", ":1:", "malformed section header",
                 "[server");
    /* A section neither program reads is a typo, not another program's. */
    expect_error("[server]\nport = 1\n[memcache]\n", ":3:",
                 "unknown section", "memcache");
    /* The first error wins, whichever kind it is. */
    expect_error("[server]\nport = x\nnonsense\n", ":2:", "port", NULL);
    expect_error("[server]\nnonsense\nport = x\n", ":2:", "syntax", NULL);
}

/* "[memcached]\nservers = h:1   ...   last-host:11211" + tail, where the
 * servers line is exactly `len` bytes long. */
static void long_line(char *text, size_t cap, size_t len, const char *tail)
{
    size_t n = (size_t)snprintf(text, cap, "[memcached]\nservers = h:1");

    assert_true(12 + len + strlen(tail) + 16 < cap);
    memset(text + n, ' ', 12 + len - 15 - n);
    n = 12 + len - 15;
    snprintf(text + n, cap - n, "last-host:11211%s", tail);
}

static void test_long_lines(void **state)
{
    char text[1024];
    struct fp_settings s;
    (void)state;

    /* libinih's buffer is 200 bytes: 198 bytes + line end is the limit,
     * the same as the app's (fallback_app config.py MAX_LINE). */
    long_line(text, sizeof(text), 198, "\n[log]\nlevel = warn\n");
    assert_int_equal(load(&s, text), 0);
    assert_int_equal(s.nmc_servers, 2);
    assert_string_equal(s.mc_servers[1].host, "last-host");
    assert_int_equal(s.log_level, FP_LOG_WARN);
    fp_config_free(&s);
    long_line(text, sizeof(text), 198, "\r\n");
    assert_int_equal(load(&s, text), 0);
    assert_int_equal(s.mc_servers[1].port, 11211);
    fp_config_free(&s);
    long_line(text, sizeof(text), 198, "");
    assert_int_equal(load(&s, text), 0);
    fp_config_free(&s);

    /* One byte more is an error naming the line, not a line split in two. */
    long_line(text, sizeof(text), 199, "\n");
    expect_error(text, "fastpoll.ini:2:", "longer than 198 bytes", "servers =");
    long_line(text, sizeof(text), 199, "\r\n");
    expect_error(text, "fastpoll.ini:2:", "longer than 198 bytes", NULL);
    long_line(text, sizeof(text), 199, "");
    expect_error(text, "fastpoll.ini:2:", "longer than 198 bytes", NULL);
    long_line(text, sizeof(text), 200, "\n");
    expect_error(text, "fastpoll.ini:2:", "longer than 198 bytes", NULL);
    long_line(text, sizeof(text), 500, "\n[cache]\nbackend = x\n");
    expect_error(text, "fastpoll.ini:2:", "longer than", NULL);
    /* Line counting goes on after a long line in an ignored section. */
    long_line(text, sizeof(text), 150, "\n[app]\n");
    strcat(text, "x = ");
    memset(text + strlen(text), 'x', 300);
    strcpy(text + strlen(text) + 300, "\n[cache]\nbackend = y\n");
    expect_error(text, "fastpoll.ini:4:", "longer than", NULL);
}

static void test_password_file(void **state)
{
    char path[] = "/tmp/fp-test-pw-XXXXXX";
    char text[256];
    struct fp_settings s;
    int fd;
    (void)state;

    fd = mkstemp(path);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, "s3cret\r\nsecond line\n", 20), 20);
    assert_int_equal(close(fd), 0);
    snprintf(text, sizeof(text), "[redis]\npassword_file = %s\n", path);
    assert_int_equal(load(&s, text), 0);
    assert_string_equal(s.redis_password, "s3cret");
    fp_config_free(&s);

    /* No newline at all. */
    fd = open(path, O_WRONLY | O_TRUNC);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, "pw", 2), 2);
    assert_int_equal(close(fd), 0);
    assert_int_equal(load(&s, text), 0);
    assert_string_equal(s.redis_password, "pw");
    fp_config_free(&s);

    /* Empty file: an error, not an empty AUTH. */
    fd = open(path, O_WRONLY | O_TRUNC);
    assert_true(fd >= 0);
    assert_int_equal(close(fd), 0);
    expect_error(text, ":2:", "password_file", "empty");

    assert_int_equal(unlink(path), 0);
    expect_error(text, ":2:", "password_file", "cannot read");
}

static int run_args(struct fp_settings *s, struct fp_cli *cli, int argc,
                    char **argv)
{
    err[0] = '\0';
    return fp_config_from_args(s, cli, argc, argv, err, sizeof(err));
}

static void test_flags(void **state)
{
    char path[] = "/tmp/fp-test-ini-XXXXXX";
    const char *ini =
        "[server]\nport = 9000\nlisten = 127.0.0.2\n"
        "[memcached]\nservers = a:1 b:2\n[log]\nlevel = warn\n";
    struct fp_settings s;
    struct fp_cli cli;
    int fd;
    (void)state;

    fd = mkstemp(path);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, ini, strlen(ini)), (ssize_t)strlen(ini));
    assert_int_equal(close(fd), 0);

    {   /* the file alone */
        char *argv[] = { "poll_server", "-c", path, NULL };
        assert_int_equal(run_args(&s, &cli, 3, argv), 0);
        assert_string_equal(cli.config_path, path);
        assert_int_equal(s.port, 9000);
        assert_int_equal(s.nmc_servers, 2);
        assert_int_equal(s.log_level, FP_LOG_WARN);
        fp_config_free(&s);
    }
    {   /* flags override the file, -s replaces the list */
        char *argv[] = { "poll_server", "-p", "9101", "--config", path,
                         "-s", "x:5,y:6 z:7", "-l", "::1", "-b", "redis",
                         "-r", "unix:/tmp/r.sock", "-L", "error", "-t", NULL };
        assert_int_equal(run_args(&s, &cli, 16, argv), 0);
        assert_int_equal(cli.test_only, 1);
        assert_int_equal(s.port, 9101);
        assert_string_equal(s.listen, "::1");
        assert_int_equal(s.nmc_servers, 3);
        assert_string_equal(s.mc_servers[0].host, "x");
        assert_int_equal(s.mc_servers[2].port, 7);
        assert_int_equal(s.backend, FP_BACKEND_REDIS);
        assert_string_equal(s.redis.unix_path, "/tmp/r.sock");
        assert_int_equal(s.log_level, FP_LOG_ERROR);
        fp_config_free(&s);
    }
    {   /* no file: defaults plus flags */
        char *argv[] = { "poll_server", "--port=8200", NULL };
        assert_int_equal(run_args(&s, &cli, 2, argv), 0);
        assert_int_equal(s.port, 8200);
        assert_int_equal(s.nmc_servers, 1);
        fp_config_free(&s);
    }
    {   /* -l takes a unix socket too (the stack gives each poller its own) */
        char *argv[] = { "poll_server", "-l", "127.0.0.1 unix:/tmp/p0.sock", NULL };
        assert_int_equal(run_args(&s, &cli, 3, argv), 0);
        assert_string_equal(s.listen, "127.0.0.1");
        assert_string_equal(s.listen_unix, "/tmp/p0.sock");
        fp_config_free(&s);
    }
    {   /* a bad flag value names the flag */
        char *argv[] = { "poll_server", "-c", path, "-p", "99999", NULL };
        assert_int_equal(run_args(&s, &cli, 5, argv), -1);
        assert_non_null(strstr(err, "-p/--port \"99999\""));
        assert_non_null(strstr(err, "1..65535"));
        fp_config_free(&s);
    }
    {
        char *argv[] = { "poll_server", "--servers", "nope", NULL };
        assert_int_equal(run_args(&s, &cli, 3, argv), -1);
        assert_non_null(strstr(err, "-s/--servers"));
        fp_config_free(&s);
    }
    {
        char *argv[] = { "poll_server", "-L", "loud", NULL };
        assert_int_equal(run_args(&s, &cli, 3, argv), -1);
        assert_non_null(strstr(err, "-L/--log-level"));
        fp_config_free(&s);
    }
    {   /* unknown flag, missing value, stray argument */
        char *a1[] = { "poll_server", "-x", NULL };
        char *a2[] = { "poll_server", "-p", NULL };
        char *a3[] = { "poll_server", "extra", NULL };
        char *a4[] = { "poll_server", "--bogus", NULL };
        assert_int_equal(run_args(&s, &cli, 2, a1), -1);
        assert_non_null(strstr(err, "-x"));
        fp_config_free(&s);
        assert_int_equal(run_args(&s, &cli, 2, a2), -1);
        assert_non_null(strstr(err, "-p"));
        fp_config_free(&s);
        assert_int_equal(run_args(&s, &cli, 2, a3), -1);
        assert_non_null(strstr(err, "extra"));
        fp_config_free(&s);
        assert_int_equal(run_args(&s, &cli, 2, a4), -1);
        assert_non_null(strstr(err, "--bogus"));
        fp_config_free(&s);
    }
    {   /* an error in the file is reported as such */
        char *argv[] = { "poll_server", "-c", "/nonexistent/fastpoll.ini", NULL };
        assert_int_equal(run_args(&s, &cli, 3, argv), -1);
        assert_non_null(strstr(err, "/nonexistent/fastpoll.ini: cannot open"));
        fp_config_free(&s);
    }
    {
        char *argv[] = { "poll_server", "-V", NULL };
        assert_int_equal(run_args(&s, &cli, 2, argv), 0);
        assert_int_equal(cli.version, 1);
        fp_config_free(&s);
    }
    assert_int_equal(unlink(path), 0);
}

static void test_example_file(void **state)
{
    struct fp_settings s, d;
    (void)state;

    /* etc/fastpoll.ini.example sets every key to its default. */
    assert_int_equal(fp_config_defaults(&d, err, sizeof(err)), 0);
    assert_int_equal(fp_config_defaults(&s, err, sizeof(err)), 0);
    if (fp_config_load_file(&s, "../../etc/fastpoll.ini.example", err,
                            sizeof(err)) < 0)
        fail_msg("%s", err);
    assert_string_equal(s.listen, d.listen);
    assert_int_equal(s.port, d.port);
    assert_int_equal(s.max_header_size, d.max_header_size);
    assert_int_equal(s.max_body_size, d.max_body_size);
    assert_int_equal(s.request_timeout_ms, d.request_timeout_ms);
    assert_int_equal(s.idle_timeout_ms, d.idle_timeout_ms);
    assert_int_equal(s.shutdown_timeout_ms, d.shutdown_timeout_ms);
    assert_string_equal(s.key_prefix, d.key_prefix);
    assert_int_equal(s.nkey_params, d.nkey_params);
    assert_string_equal(s.key_params[0], d.key_params[0]);
    assert_int_equal(s.backend, d.backend);
    assert_int_equal(s.cache_timeout_ms, d.cache_timeout_ms);
    assert_string_equal(s.content_type, d.content_type);
    assert_int_equal(s.nmc_servers, d.nmc_servers);
    assert_string_equal(s.mc_servers[0].host, d.mc_servers[0].host);
    assert_int_equal(s.mc_servers[0].port, d.mc_servers[0].port);
    assert_int_equal(s.mc_replicas, d.mc_replicas);
    assert_int_equal(s.mc_recovery_ms, d.mc_recovery_ms);
    assert_string_equal(s.redis.host, d.redis.host);
    assert_int_equal(s.redis.port, d.redis.port);
    assert_int_equal(s.redis_db, d.redis_db);
    assert_int_equal(s.log_level, d.log_level);
    assert_int_equal(s.log_format, d.log_format);
    assert_int_equal(s.max_held, d.max_held);
    assert_int_equal(s.recheck_ms, d.recheck_ms);
    assert_int_equal(s.recheck_subscribed_ms, d.recheck_subscribed_ms);
    assert_int_equal(s.poll_interval_ms, d.poll_interval_ms);
    assert_int_equal(s.poll_jitter_pct, d.poll_jitter_pct);
    assert_int_equal(s.poll_max_wait, d.poll_max_wait);
    assert_null(s.announce.host);
    assert_string_equal(s.announce_channel, d.announce_channel);
    fp_config_free(&s);
    fp_config_free(&d);
}

static void test_poll_and_announce(void **state)
{
    static const struct { const char *text, *n1, *n2; } bad[] = {
        { "[poll]\nmax_wait = 301\n", "fastpoll.ini:2:", "[poll] max_wait" },
        { "[poll]\njitter_pct = 101\n", ":2:", "jitter_pct" },
        { "[poll]\n\ninterval_ms = x\n", ":3:", "interval_ms" },
        { "[poll]\nfallback_interval_ms = -1\n", ":2:", "fallback_interval_ms" },
        { "[poll]\nrecheck_ms = 5\n", ":2:", "unknown key \"recheck_ms\"" },
        { "[server]\nrecheck_ms = 5\n", ":2:", "[server] recheck_ms" },
        { "[server]\n\nrecheck_subscribed_ms = 600001\n", ":3:",
          "[server] recheck_subscribed_ms" },
        { "[announce]\nserver = nohost\n", ":2:", "[announce] server" },
        { "[announce]\nchannel =\n", ":2:", "[announce] channel" },
        { "[announce]\nchannel = a b\n", ":2:", "[announce] channel" },
        { "[announce]\nusername = u\n", ":2:", "username needs [announce] password_file" },
        { "[keys]\nparams = user_id wait\n", ":2:", "wait is the long poll's" },
    };
    struct fp_settings s;
    char path[] = "/tmp/fp_test_announce_XXXXXX";
    char text[512];
    int fd;
    (void)state;

    /* Defaults, as the app's (docs/api.md, "Settings"). */
    assert_int_equal(fp_config_defaults(&s, err, sizeof(err)), 0);
    assert_int_equal(s.poll_interval_ms, 1000);
    assert_int_equal(s.poll_jitter_pct, 20);
    assert_int_equal(s.poll_max_wait, 30);
    assert_int_equal(s.max_held, 20000);
    assert_int_equal(s.recheck_ms, 2000);
    assert_int_equal(s.recheck_subscribed_ms, 10000);
    assert_null(s.announce.host);
    assert_string_equal(s.announce_channel, "fastpoll:announce");
    fp_config_free(&s);

    fd = mkstemp(path);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, "pw\n", 3), 3);
    close(fd);
    (void)snprintf(text, sizeof(text),
                   "[server]\nmax_held = 5\nrecheck_ms = 500\n"
                   "recheck_subscribed_ms = 7000\n"
                   "[poll]\ninterval_ms = 250\nfallback_interval_ms = 900\n"
                   "jitter_pct = 0\nmax_wait = 300\n"
                   "[announce]\nserver = 10.0.0.5:6380\npassword_file = %s\n"
                   "username = poller\nchannel = site:announce\n", path);
    assert_int_equal(load(&s, text), 0);
    assert_int_equal(s.max_held, 5);
    assert_int_equal(s.recheck_ms, 500);
    assert_int_equal(s.recheck_subscribed_ms, 7000);
    assert_int_equal(s.poll_interval_ms, 250);
    assert_int_equal(s.poll_jitter_pct, 0);
    assert_int_equal(s.poll_max_wait, 300);
    assert_string_equal(s.announce.host, "10.0.0.5");
    assert_int_equal(s.announce.port, 6380);
    assert_string_equal(s.announce_password, "pw");
    assert_string_equal(s.announce_username, "poller");
    assert_string_equal(s.announce_channel, "site:announce");
    fp_config_free(&s);
    assert_int_equal(load(&s, "[announce]\nserver = unix:/run/redis.sock\n"), 0);
    assert_string_equal(s.announce.unix_path, "/run/redis.sock");
    fp_config_free(&s);

    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        expect_error(bad[i].text, bad[i].n1, bad[i].n2, NULL);
    (void)snprintf(text, sizeof(text), "[announce]\n\npassword_file = %s\n", path);
    expect_error(text, ":3:", "password_file needs [announce] server", NULL);
    expect_error("[keys]\nparams = user_id wait\n", ":2:", "[keys] params", "wait");
    unlink(path);
}

/* --dump-config: the example it writes is a file both readers accept and
 * that sets every key to its default; the other formats are written whole;
 * the flag takes a format and refuses others. */
static void test_dump_config(void **state)
{
    static const char *const formats[] = { "ini", "markdown", "json" };
    struct fp_settings s, d;
    struct fp_cli cli;
    char *buf = NULL, line[256];
    size_t len = 0;
    FILE *f;
    (void)state;

    for (size_t i = 0; i < 3; i++) {
        f = open_memstream(&buf, &len);
        assert_non_null(f);
        assert_int_equal(fp_config_dump(f, formats[i], err, sizeof(err)), 0);
        assert_int_equal(fclose(f), 0);
        assert_true(len > 1000);
        if (i == 0) {
            assert_int_equal(load(&s, buf), 0);
            assert_int_equal(fp_config_finish(&s, "fastpoll.ini", err,
                                              sizeof(err)), 0);
        }
        free(buf);
        buf = NULL;
    }
    assert_int_equal(fp_config_defaults(&d, err, sizeof(err)), 0);
    assert_int_equal(fp_config_finish(&d, NULL, err, sizeof(err)), 0);
    assert_string_equal(s.listen, d.listen);
    assert_int_equal(s.unix_mode, d.unix_mode);
    assert_int_equal(s.port, d.port);
    assert_int_equal(s.max_held, d.max_held);
    assert_string_equal(s.key_prefix, d.key_prefix);
    assert_int_equal(s.nkey_params, 1);
    assert_string_equal(s.key_params[0], "user_id");
    assert_int_equal(s.nmc_servers, 1);
    assert_int_equal(s.mc_replicas, 0);
    assert_string_equal(s.content_type, d.content_type);
    assert_string_equal(s.redis.host, d.redis.host);
    assert_null(s.redis_password);
    assert_null(s.announce.host);
    assert_string_equal(s.announce_channel, "fastpoll:announce");
    assert_string_equal(s.admin_listen, d.admin_listen);
    assert_int_equal(s.log_level, FP_LOG_INFO);
    assert_int_equal(s.log_format, FP_LOG_TEXT);
    assert_null(s.log_file);
    fp_config_free(&s);
    fp_config_free(&d);

    /* No line of the example reaches libinih's limit. */
    f = open_memstream(&buf, &len);
    assert_non_null(f);
    assert_int_equal(fp_config_dump(f, "ini", err, sizeof(err)), 0);
    assert_int_equal(fclose(f), 0);
    f = fmemopen(buf, len, "r");
    assert_non_null(f);
    while (fgets(line, sizeof(line), f) != NULL)
        assert_true(strlen(line) <= 99);
    assert_int_equal(fclose(f), 0);
    free(buf);

    f = fopen("/dev/null", "w");
    assert_non_null(f);
    assert_int_equal(fp_config_dump(f, "yaml", err, sizeof(err)), -1);
    assert_non_null(strstr(err, "yaml"));
    assert_int_equal(fclose(f), 0);
    {
        char *argv[] = { "poll_server", "--dump-config", NULL };
        assert_int_equal(run_args(&s, &cli, 2, argv), 0);
        assert_string_equal(cli.dump_config, "ini");
        fp_config_free(&s);
    }
    {
        char *argv[] = { "poll_server", "--dump-config=markdown", NULL };
        assert_int_equal(run_args(&s, &cli, 2, argv), 0);
        assert_string_equal(cli.dump_config, "markdown");
        fp_config_free(&s);
    }
    {
        char *argv[] = { "poll_server", "--dump-config=yaml", NULL };
        assert_int_equal(run_args(&s, &cli, 2, argv), -1);
        assert_non_null(strstr(err, "--dump-config=yaml"));
        fp_config_free(&s);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_defaults),
        cmocka_unit_test(test_good_file),
        cmocka_unit_test(test_empty_values),
        cmocka_unit_test(test_bad_values),
        cmocka_unit_test(test_request_vs_cache_timeout),
        cmocka_unit_test(test_listen_unix),
        cmocka_unit_test(test_unknown_and_repeats),
        cmocka_unit_test(test_long_lines),
        cmocka_unit_test(test_password_file),
        cmocka_unit_test(test_flags),
        cmocka_unit_test(test_example_file),
        cmocka_unit_test(test_redis_sentinel_and_log_file),
        cmocka_unit_test(test_poll_and_announce),
        cmocka_unit_test(test_dump_config),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

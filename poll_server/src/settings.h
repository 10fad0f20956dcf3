/* settings.h -- the one settings struct, filled by config.c from the INI file
 * and the command line. Everything else reads it and never writes it. */
#ifndef FP_SETTINGS_H
#define FP_SETTINGS_H

#include <stddef.h>
#include <stdint.h>

#define FP_MAX_KEY_LEN      250  /* memcached's limit; Redis gets the same */
#define FP_MAX_PREFIX_LEN   64
#define FP_MAX_PARAMS       16
#define FP_MAX_PARAM_LEN    64
#define FP_MAX_SERVERS      64
#define FP_MAX_SIGN_SECRETS 4    /* [signing]: the first signs, all verify */
#define FP_MAX_SENTINELS    8
#define FP_MAX_CHANNELS     255  /* [channels] max's upper bound (Nchan's) */
#define FP_MAX_CHANNEL_NAME 64

enum fp_backend { FP_BACKEND_MEMCACHED, FP_BACKEND_REDIS };

struct fp_server_addr {
    char *host;          /* hostname or IP; NULL when unix_path is set */
    uint16_t port;
    char *unix_path;     /* Redis only: unix socket path, else NULL */
};

struct fp_settings {
    /* [server] */
    char *listen;                /* address to bind with port, default 127.0.0.1;
                                  * NULL: no TCP listener (unix socket only) */
    char *listen_unix;           /* unix socket path to listen on, or NULL */
    unsigned unix_mode;          /* its permissions, default 0660 */
    uint16_t port;               /* default 8101 */
    size_t max_header_size;      /* bytes, default 8192 */
    size_t max_body_size;        /* bytes, default 65536; POST bodies read and discarded */
    unsigned idle_timeout_ms;    /* keep-alive connection idle limit, default 60000 */
    unsigned request_timeout_ms; /* time to receive a whole request, default 10000 */
    unsigned shutdown_timeout_ms;/* drain limit after SIGTERM, default 5000 */
    unsigned max_held;           /* wait= polls held at once, default 20000;
                                  * past it a poll is answered at once */
    unsigned recheck_ms;         /* each held key is read again at least this
                                  * often while not subscribed, default 2000 */
    unsigned recheck_subscribed_ms; /* ... and while subscribed, default 10000 */
    unsigned announce_ping_ms;   /* the subscriber asks Redis this often, 1000 */
    unsigned announce_timeout_ms;/* ... and drops a connection silent this
                                  * long, default 3000 */

    /* [keys] */
    char *key_prefix;            /* default "/Poll" */
    char *key_params[FP_MAX_PARAMS]; /* default {"user_id"}; sorted bytewise */
    size_t nkey_params;

    /* [channels] (shared with the app: docs/channels.md) */
    unsigned channels_max;       /* names in one poll's ch, default 16 */

    /* [cache] */
    enum fp_backend backend;     /* default memcached */
    unsigned cache_timeout_ms;   /* a cache answer later than this is a 503, default 100 */
    char *content_type;          /* default "application/json" */

    /* [memcached] */
    struct fp_server_addr mc_servers[FP_MAX_SERVERS]; /* order matters: ketama */
    size_t nmc_servers;
    int mc_replicas;             /* 0 or 1; -1 until set: 1 with >= 2 servers */
    int mc_replicas_line;        /* file line that set it, for errors; 0: none */
    unsigned mc_recovery_ms;     /* a node back from down or hung serves no
                                  * hit this long (replicas, or the app, answer
                                  * its keys), default 5000 */

    /* [redis] */
    struct fp_server_addr redis;
    char *redis_password;        /* read from redis_password_file, or NULL */
    char *redis_username;        /* ACL user for AUTH, or NULL (default user) */
    int redis_db;
    struct fp_server_addr redis_sentinels[FP_MAX_SENTINELS]; /* none: no Sentinel */
    size_t nredis_sentinels;
    char *redis_master_name;     /* Sentinel's name of the master, or NULL */
    char *redis_sentinel_password; /* AUTH to the sentinels (requirepass), or
                                    * NULL */

    /* [signing] */
    char *sign_secrets[FP_MAX_SIGN_SECRETS]; /* secret_file lines; none: not signed */
    size_t nsign_secrets;

    /* [poll] (shared with the app: docs/api.md, "Conditional and long polls") */
    unsigned poll_interval_ms;   /* Poll-Interval-Ms of a hit, default 1000 */
    unsigned poll_jitter_pct;    /* ... plus 0..this % of it, default 20 */
    unsigned poll_max_wait;      /* wait= is clamped to this (s), default 30 */

    /* [stream] (docs/api.md, "Event streams") */
    unsigned stream_max;         /* streams held at once, default 20000 */
    unsigned stream_heartbeat_ms;/* a comment after this silence, 15000 */
    unsigned stream_lifetime_s;  /* a stream ends after this (+0..10%), 600 */
    unsigned stream_retry_spread_ms; /* an ended stream's retry: 0..this */
    size_t stream_max_buffered;  /* unread bytes a slow reader may leave */

    /* [announce] (shared with the app): Redis pub/sub of written keys */
    struct fp_server_addr announce; /* unset (no host, no path): [redis] with
                                     * the Redis backend or with sentinels,
                                     * else none */
    char *announce_password;     /* from password_file, or NULL */
    char *announce_username;     /* or NULL */
    char *announce_channel;      /* default "fastpoll:announce" */

    /* [admin] (poll server) */
    char *admin_listen;          /* default 127.0.0.1: never expose it */
    unsigned admin_port;         /* /metrics, /healthz; default 0 = off */

    /* [log] */
    int log_level;               /* FP_LOG_DEBUG .. FP_LOG_ERROR, default info */
    char *log_file;              /* append here (reopened on SIGHUP), or NULL: stderr */
    int log_format;              /* FP_LOG_TEXT (default) or FP_LOG_JSON */

    /* Not a key: the hex SHA-256 of the config file's bytes as loaded
     * ("" without a file), for /metrics (fastpoll_config_info). */
    char config_sha256[65];
};

#endif

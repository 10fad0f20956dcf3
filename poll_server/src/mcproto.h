/* mcproto.h -- the memcached text protocol's answers, parsed from bytes:
 * "MN"/"ERROR" to the "mn" that opens a connection or probes it, "VALUE
 * <key> <flags> <bytes>[ <cas>]" + data + "END" or "END" to a classic
 * "get", "VA <bytes> <flags>*" + data or "EN <flags>*" to "mg <key> v k f",
 * and SERVER_ERROR / CLIENT_ERROR to either. A value whose client flags
 * are not 0 is a miss: the app's marker of a key it cannot cache there
 * (fallback_app's cache.py writes answers with flags 0, and the marker in
 * place of an answer too large for the node, so that no late `add` of an
 * older answer can land where a delete would have left room). Pure: a buffer in, one event
 * and the bytes it used out; no I/O, no allocation (cache_memcached.c owns
 * the socket, the buffer and the request FIFO). */
#ifndef FP_MCPROTO_H
#define FP_MCPROTO_H

#include <stddef.h>

#define FP_MCP_MAX_LINE 512 /* a VALUE line: 6 + 250 + 3 numbers */
#define FP_MCP_SKIP_MAX (1024ULL * 1024ULL * 1024ULL) /* memcached's -I cap */

enum fp_mcp_state { FP_MCP_LINE, FP_MCP_DATA, FP_MCP_SKIP };

/* One connection's parse state, between calls. */
struct fp_mcp {
    enum fp_mcp_state state;
    int probing;                /* the next line answers the opening "mn" */
    int meta;                   /* FP_MCP_DATA: the value came as "VA" */
    int skipped;                /* FP_MCP_DATA: its bytes were read past */
    int marker;                 /* FP_MCP_DATA: flags not 0, a miss */
    size_t want;                /* FP_MCP_DATA: value length */
    unsigned long long skip;    /* FP_MCP_SKIP: value bytes left */
    unsigned long long max_value; /* larger values are read past */
};

/* What the oldest request waiting on the connection was. */
struct fp_mcp_head {
    const char *key;
    size_t keylen;
    int meta;                   /* sent as "mg" (else as classic "get") */
    int mn;                     /* a probe's "mn" on a meta connection */
};

enum fp_mcp_type {
    FP_MCP_MORE,        /* nothing complete yet: keep the bytes, read on */
    FP_MCP_PROTO_META,  /* the opening "mn" got "MN": meta commands */
    FP_MCP_PROTO_CLASSIC, /* it got "ERROR": classic gets */
    FP_MCP_TOO_BIG,     /* a value over max_value begins (len): read past */
    FP_MCP_HIT,         /* the head's value (val, len), trailer checked */
    FP_MCP_MISS,        /* the head's miss (or marker), or a probe's "MN" */
    FP_MCP_SKIPPED,     /* the head's value was too big; all of it read */
    FP_MCP_REFUSED,     /* SERVER_ERROR / CLIENT_ERROR (the line: val, len) */
    FP_MCP_BAD          /* the stream cannot be trusted (why) */
};

struct fp_mcp_event {
    enum fp_mcp_type type;
    const char *val;            /* into the buffer given */
    size_t len;
    const char *why;            /* FP_MCP_BAD: for the log */
};

/* A new connection: its first line answers "mn". */
void fp_mcp_init(struct fp_mcp *p, unsigned long long max_value);

/* Parses buf[0..len) up to the first event; head is NULL when no request
 * waits. Returns the bytes consumed (<= len; the rest must be given again,
 * with what follows). After FP_MCP_BAD the state is void: fp_mcp_init. */
size_t fp_mcp_parse(struct fp_mcp *p, const char *buf, size_t len,
                    const struct fp_mcp_head *head, struct fp_mcp_event *ev);

/* Bytes the answer being parsed needs in one piece (its value and
 * trailer), 0 if none: the buffer must have room for that many. */
size_t fp_mcp_need(const struct fp_mcp *p);

#endif

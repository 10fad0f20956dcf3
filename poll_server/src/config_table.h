/* config_table.h -- the rows of config.c's option table, for config.c (which
 * parses with them) and config_dump.c (which renders them: --dump-config).
 * Not for the rest of the server: it reads struct fp_settings. */
#ifndef FP_CONFIG_TABLE_H
#define FP_CONFIG_TABLE_H

#include <stddef.h>
#include <stdint.h>

#include "settings.h"

#define PASSWORD_MAX 1024 /* a password file's first line, bytes */

enum opt_kind {
    OPT_UINT,    /* unsigned in [min, max] */
    OPT_SIZE,    /* size_t in [min, max] */
    OPT_INT,     /* int in [min, max] */
    OPT_PORT,    /* uint16_t in [min, max] */
    OPT_ENUM,    /* int: the value's index in names[0..max] */
    OPT_TEXT,    /* char *: min..max bytes of 0x21-0x7E (0x20 too: OPT_SPACES) */
    OPT_NAME,    /* char *: up to max bytes of 0x21-0x7E; empty: NULL */
    OPT_ADDRESS, /* char *: a loopback or private address, or localhost */
    OPT_SERVER,  /* struct fp_server_addr: host:port or unix:/path */
    OPT_SECRET,  /* char *: the first line of the file named; empty: NULL */
    OPT_PATH,    /* char *: an absolute path; empty: NULL */
    OPT_CUSTOM,  /* the row's own setter */
};

#define OPT_REPEAT   0x01u /* may appear more than once (appends) */
#define OPT_SPACES   0x02u /* OPT_TEXT: spaces allowed */
#define OPT_REQUIRED 0x04u /* OPT_NAME: empty refused */
#define OPT_UNSET    0x08u /* OPT_SERVER: empty unsets it */
#define OPT_NUMERIC  0x10u /* OPT_CUSTOM: an integer in [min, max] */
#define OPT_UNUSED   0x20u /* the app's: checked here, not kept */

struct option_def;
typedef int parse_fn(struct fp_settings *s, const struct option_def *o,
                     const char *v, char *why, size_t whylen);

struct option_def {
    const char *section;
    const char *name;
    size_t offset;              /* the field; NO_FIELD: checked, not kept */
    unsigned long long min, max; /* numbers: bounds; text, names: length */
    const char *def;            /* default as the file spells it; NULL: unset */
    const char *help;           /* one line: the example's comment, the docs' */
    parse_fn *custom;           /* OPT_CUSTOM */
    const char *const *names;   /* OPT_ENUM: max + 1 names */
    const char *shown_def;      /* for the docs, when def cannot say it */
    const char *shown_bounds;   /* for the docs, when the kind cannot say them */
    const char *example;        /* an unset key's sample value, commented */
    enum opt_kind kind;
    unsigned flags;
};

#define NO_FIELD SIZE_MAX

/* The table and its length. */
const struct option_def *fp_config_options(size_t *n);

/* "a, b or c": an OPT_ENUM row's names, each wrapped in q, into out. */
void fp_config_join_names(const struct option_def *o, const char *q, char *out,
                          size_t outlen);

#endif

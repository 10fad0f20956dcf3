/* config.h -- fills struct fp_settings from defaults, the INI file (libinih)
 * and command-line flags, in that order; every value is validated the same
 * way wherever it comes from. */
#ifndef FP_CONFIG_H
#define FP_CONFIG_H

#include <stddef.h>
#include <stdio.h>

#include "settings.h"

#define FP_CONFIG_ERRLEN 512

struct fp_cli {
    const char *config_path; /* -c, or NULL: defaults and flags only */
    int test_only;           /* -t: check the config and exit */
    int help;                /* -h */
    int version;             /* -V */
    const char *dump_config; /* --dump-config: "ini", "markdown" or "json" */
};

/* Sets every default. Returns 0, or -1 (out of memory, err set). */
int fp_config_defaults(struct fp_settings *s, char *err, size_t errlen);

/* Frees what the settings own; leaves them zeroed. Safe on zeroed settings. */
void fp_config_free(struct fp_settings *s);

/* Sets one key of one section from text, as the INI file would. On error
 * returns -1 and writes the reason (without file, line or key) to why. */
int fp_config_set(struct fp_settings *s, const char *section, const char *key,
                  const char *value, char *why, size_t whylen);

/* Reads an INI stream named `name` (for messages) over the settings.
 * Returns 0, or -1 with err = "name:line: message". */
int fp_config_load_stream(struct fp_settings *s, FILE *f, const char *name,
                          char *err, size_t errlen);

/* fopen + fp_config_load_stream. */
int fp_config_load_file(struct fp_settings *s, const char *path,
                        char *err, size_t errlen);

/* Checks between keys, once every source is read: [memcached] replicas
 * (default: 1 with at least 2 servers). `name` is the file, for the line.
 * Returns 0, or -1 with err set. */
int fp_config_finish(struct fp_settings *s, const char *name, char *err,
                     size_t errlen);

/* The whole start-up path: parses argv (getopt_long), sets defaults, reads
 * -c FILE if given, then applies the overriding flags. On -h, -V or
 * --dump-config only cli is filled. Returns 0, or -1 with err set; s is always safe to
 * fp_config_free(). */
int fp_config_from_args(struct fp_settings *s, struct fp_cli *cli,
                        int argc, char **argv, char *err, size_t errlen);

void fp_config_usage(FILE *out, const char *prog);

/* Writes every key of the table with its default, bounds and help: format
 * "ini" (an example fastpoll.ini), "markdown" (docs/configuration.md's
 * tables) or "json". Returns 0, or -1 with err set (unknown format, write
 * error). */
int fp_config_dump(FILE *out, const char *format, char *err, size_t errlen);

/* "debug", "info", ... for a FP_LOG_* level. */
const char *fp_config_level_name(int level);

#endif

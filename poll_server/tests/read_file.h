/* read_file.h -- for the unit tests that read the shared vectors
 * (tests/vectors/, JSON): a whole file into a NUL-terminated buffer. */
#ifndef FP_TEST_READ_FILE_H
#define FP_TEST_READ_FILE_H

#include <stdio.h>
#include <stdlib.h>

/* The file's bytes (free them), or NULL if it cannot be read. */
static char *read_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    char *buf = NULL;
    long n;

    if (f == NULL)
        return NULL;
    if (fseek(f, 0, SEEK_END) == 0 && (n = ftell(f)) >= 0 &&
        fseek(f, 0, SEEK_SET) == 0 && (buf = malloc((size_t)n + 1)) != NULL) {
        if (fread(buf, 1, (size_t)n, f) != (size_t)n) {
            free(buf);
            buf = NULL;
        } else {
            buf[n] = '\0';
        }
    }
    fclose(f);
    return buf;
}

#endif

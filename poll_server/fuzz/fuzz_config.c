/* fuzz_config.c -- libFuzzer target: the INI reader (libinih with our line
 * reader and handler, config.c) on an in-memory file, then every value
 * through validation, then free. LeakSanitizer checks the error paths free
 * what they allocated. Files the input names (password_file, secret_file)
 * are opened for real: run it with stdin from /dev/null (the make target
 * does) so "/dev/stdin" cannot block. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../src/config.h"
#include "../src/settings.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct fp_settings s;
    char err[FP_CONFIG_ERRLEN];
    FILE *f;

    if (size == 0)
        return 0;
    if (fp_config_defaults(&s, err, sizeof(err)) != 0)
        abort();
    f = fmemopen((void *)data, size, "r");
    if (f == NULL) {
        fp_config_free(&s);
        return 0;
    }
    if (fp_config_load_stream(&s, f, "fuzz.ini", err, sizeof(err)) != 0) {
        /* An error names the file and the line, and fits its buffer. */
        if (strncmp(err, "fuzz.ini", 8) != 0 || strlen(err) >= sizeof(err))
            abort();
    }
    fclose(f);
    fp_config_free(&s);
    return 0;
}

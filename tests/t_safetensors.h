/*
 * t_safetensors.h - a minimal safetensors writer for tests that build checkpoints in a temp
 * directory (tests/test_cvt.c, tests/test_model.c). Test-only: no validation of its input.
 */
#ifndef QS_T_SAFETENSORS_H
#define QS_T_SAFETENSORS_H

#include <cjson/cJSON.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* One tensor of a safetensors file written by a test. */
struct st_entry {
    char name[128];
    const char *dtype;
    int n_dims;
    int64_t shape[2];
    void *data;   /* owned */
    size_t size;
};

/* Write a safetensors file (docs/FORMATS.md 9.1): u64 header length, JSON header padded with spaces
 * to a multiple of 8, data back to back in entry order. */
static bool write_safetensors(const char *path, const struct st_entry *e, int n)
{
    cJSON *h = cJSON_CreateObject();
    size_t off = 0;
    for (int i = 0; i < n; i++) {
        cJSON *t = cJSON_AddObjectToObject(h, e[i].name);
        cJSON_AddStringToObject(t, "dtype", e[i].dtype);
        cJSON *sh = cJSON_AddArrayToObject(t, "shape");
        for (int d = 0; d < e[i].n_dims; d++)
            cJSON_AddItemToArray(sh, cJSON_CreateNumber((double)e[i].shape[d]));
        cJSON *o = cJSON_AddArrayToObject(t, "data_offsets");
        cJSON_AddItemToArray(o, cJSON_CreateNumber((double)off));
        off += e[i].size;
        cJSON_AddItemToArray(o, cJSON_CreateNumber((double)off));
    }
    char *js = cJSON_PrintUnformatted(h);
    cJSON_Delete(h);
    FILE *f = fopen(path, "wb");
    bool ok = js && f;
    if (ok) {
        size_t len = strlen(js), padded = (len + 7) / 8 * 8;
        uint64_t hl = padded;
        ok = fwrite(&hl, 8, 1, f) == 1 && fwrite(js, 1, len, f) == len;
        for (size_t i = len; ok && i < padded; i++)
            ok = fputc(' ', f) != EOF;
        for (int i = 0; ok && i < n; i++)
            ok = fwrite(e[i].data, 1, e[i].size, f) == e[i].size;
    }
    if (f)
        ok = fclose(f) == 0 && ok;
    free(js);
    return ok;
}

#endif /* QS_T_SAFETENSORS_H */

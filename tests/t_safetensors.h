/*
 * t_safetensors.h - a minimal safetensors writer for tests that build checkpoints in a temp
 * directory (tests/test_cvt.c, tests/test_model.c), and st_read_model(), which reads a fixture's
 * tensors through the converter's reader so a test can write an edited copy. Test-only: no
 * validation of its input.
 */
#ifndef QS_T_SAFETENSORS_H
#define QS_T_SAFETENSORS_H

#include <cjson/cJSON.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cvt_src.h" /* st_read_model: the converter's checkpoint reader */

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

/* Free the data of n entries and the array. */
static inline void st_free(struct st_entry *e, int n)
{
    for (int i = 0; e && i < n; i++)
        free(e[i].data);
    free(e);
}

/* Every tensor of the checkpoint in model directory dir (any container cvt_source_open reads) as
 * entries *out[*n_out], in the reader's order, data copied (free with st_free). false if the
 * directory does not open, a tensor has more than 2 dimensions or a read fails. */
static inline bool st_read_model(const char *dir, struct st_entry **out, int *n_out)
{
    struct cvt_source *src = NULL;
    *out = NULL, *n_out = 0;
    if (cvt_source_open(dir, &src) != CVT_ERR_NONE)
        return false;
    size_t n_src = cvt_source_n_tensors(src);
    struct st_entry *e = calloc(n_src ? n_src : 1, sizeof(*e));
    bool ok = e != NULL;
    int n = 0;
    for (size_t i = 0; ok && i < n_src; i++) {
        const struct cvt_src_tensor *t = cvt_source_tensor(src, i);
        struct st_entry *x = &e[n++];
        snprintf(x->name, sizeof(x->name), "%s", t->name);
        x->dtype = cvt_dtype_str(t->dtype);
        x->n_dims = t->n_dims;
        for (int k = 0; k < t->n_dims && k < 2; k++)
            x->shape[k] = t->shape[k];
        x->size = (size_t)t->nbytes;
        x->data = malloc(x->size ? x->size : 1);
        ok = t->n_dims <= 2 && x->data &&
             cvt_source_read(src, t, x->data, x->size) == CVT_ERR_NONE;
    }
    cvt_source_close(src);
    if (!ok) {
        st_free(e, n);
        return false;
    }
    *out = e, *n_out = n;
    return true;
}

/* Remove (and free) the entries whose name starts with prefix; returns the new count. */
static inline int st_drop(struct st_entry *e, int n, const char *prefix)
{
    int k = 0;
    for (int i = 0; i < n; i++) {
        if (!strncmp(e[i].name, prefix, strlen(prefix)))
            free(e[i].data);
        else
            e[k++] = e[i];
    }
    return k;
}

/* A grouped AWQ checkpoint made per-channel (group_size -1): every 2-D `.qzeros` / `.scales`
 * entry cut to its first row (group 0's zeros and scales then serve all K rows). Returns how
 * many entries were cut. */
static inline int st_per_channel(struct st_entry *e, int n)
{
    int n_cut = 0;
    for (int i = 0; i < n; i++) {
        struct st_entry *x = &e[i];
        size_t len = strlen(x->name);
        bool zs = len > 7 && (!strcmp(x->name + len - 7, ".qzeros") ||
                              !strcmp(x->name + len - 7, ".scales"));
        if (zs && x->n_dims == 2 && x->shape[0] > 0) {
            x->size /= (size_t)x->shape[0];
            x->shape[0] = 1;
            n_cut++;
        }
    }
    return n_cut;
}

#endif /* QS_T_SAFETENSORS_H */

/*
 * cvt_write.c - what goes into each rank file before its tensors (cvt_run_int.h): the check of
 * every source the plan reads, the config section (docs/DESIGN.md section 6, with that rank's tp
 * block), the model id, the tensor table (3 tensors per packed linear, 1 otherwise, in plan
 * order) and the tokenizer and generation-config sections.
 *
 * Entry points: cvt_write_validate_sources, cvt_write_model_id, cvt_write_open.
 * Test: ./build/test_cvt (every tensor and the config of every rank against the checkpoint).
 */
#include <cjson/cJSON.h> /* the config section */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>      /* XXH3-128: model id */

#include "cvt_run_int.h"
#include "fmt_names.h" /* FMT_SUFFIX_* */
#include "qs_json.h"   /* qs_rope_type_name */
#include "qs_log.h"    /* qs_log_error */

/* --- validation before writing ------------------------------------------------------------- */

static void shape_str(char *buf, size_t n, const int64_t *shape, int n_dims)
{
    size_t at = (size_t)snprintf(buf, n, "[");
    for (int i = 0; i < n_dims && at < n; i++)
        at += (size_t)snprintf(buf + at, n - at, "%s%" PRId64, i ? ", " : "", shape[i]);
    if (at < n)
        snprintf(buf + at, n - at, "]");
}

enum cvt_err cvt_write_validate_sources(struct cvt_run_state *R)
{
    const struct cvt_plan *p = R->plan;
    unsigned seen = 0;
    R->src_t = calloc((size_t)(p->n_srcs ? p->n_srcs : 1), sizeof(*R->src_t));
    if (!R->src_t)
        return CVT_ERR_NOMEM;
    for (int i = 0; i < p->n_srcs; i++) {
        const struct cvt_plan_src *s = &p->srcs[i];
        if (s->kind == CVT_SRC_AWQ) {
            struct cvt_awq_info info;
            CVT_TRY(cvt_awq_probe(R->src, R->cfg, s->name, s->rows, s->cols, &info));
            seen |= CVT_VARIANT_BIT(info.variant);
            continue;
        }
        const struct cvt_src_tensor *t = cvt_source_find(R->src, s->name);
        if (!t) { /* the plan checked presence; a NULL here is a catalog/plan disagreement */
            qs_log_error(__func__, "tensor %s: missing from the catalog", s->name);
            return CVT_ERR_MISSING_TENSOR;
        }
        int64_t want[2];
        int nd;
        if (s->rows == 1 && !s->file_transposed) {
            want[0] = s->cols;
            nd = 1;
        } else {
            want[0] = s->file_transposed ? s->cols : s->rows;
            want[1] = s->file_transposed ? s->rows : s->cols;
            nd = 2;
        }
        bool ok = t->n_dims == nd && t->shape[0] == want[0] && (nd == 1 || t->shape[1] == want[1]);
        if (!ok) {
            char a[96], b[96];
            shape_str(a, sizeof(a), want, nd);
            shape_str(b, sizeof(b), t->shape, t->n_dims);
            qs_log_error(__func__, "file %s: tensor %s: expected shape %s from config.json, got %s",
                         cvt_source_file(R->src, t->file)->name, s->name, a, b);
            return CVT_ERR_SHAPE;
        }
        if (t->dtype != CVT_DT_F16 && t->dtype != CVT_DT_BF16 && t->dtype != CVT_DT_F32 &&
            t->dtype != CVT_DT_F64) {
            qs_log_error(__func__, "file %s: tensor %s: expected a float dtype (F16, BF16, F32), "
                                   "got %s",
                         cvt_source_file(R->src, t->file)->name, s->name, cvt_dtype_str(t->dtype));
            return CVT_ERR_DTYPE;
        }
        R->src_t[i] = t;
    }
    size_t at = 0;
    R->variant[0] = '\0';
    for (int v = CVT_VARIANT_GEMM; v <= CVT_VARIANT_CT_PACKED; v++)
        if (seen & CVT_VARIANT_BIT(v))
            at += (size_t)snprintf(R->variant + at, sizeof(R->variant) - at, "%s%s",
                                   at ? "+" : "", cvt_variant_str((enum cvt_variant)v));
    if (!seen)
        snprintf(R->variant, sizeof(R->variant), "none");
    return CVT_ERR_NONE;
}

/* --- config JSON (DESIGN 6) and model id --------------------------------------------------- */

static char *config_json(const struct cvt_run_state *R, int rank)
{
    const struct cvt_hf_config *c = R->cfg;
    const struct cvt_plan *p = R->plan;
    cJSON *j = cJSON_CreateObject(), *q, *t, *a;
    char *out = NULL;
    if (!j)
        return NULL;
    cJSON_AddNumberToObject(j, "qshard_config_version", 1);
    cJSON_AddStringToObject(j, "architecture", c->arch->name);
    cJSON_AddNumberToObject(j, "hidden_size", (double)c->hidden_size);
    cJSON_AddNumberToObject(j, "intermediate_size", (double)c->intermediate_size);
    cJSON_AddNumberToObject(j, "intermediate_size_padded", p->inter_padded);
    cJSON_AddNumberToObject(j, "num_hidden_layers", (double)c->num_hidden_layers);
    cJSON_AddNumberToObject(j, "num_attention_heads", (double)c->num_attention_heads);
    cJSON_AddNumberToObject(j, "num_key_value_heads", (double)c->num_key_value_heads);
    cJSON_AddNumberToObject(j, "head_dim", (double)c->head_dim);
    cJSON_AddNumberToObject(j, "vocab_size", (double)c->vocab_size);
    cJSON_AddNumberToObject(j, "vocab_size_per_rank", p->vocab_per_rank);
    cJSON_AddNumberToObject(j, "rms_norm_eps", c->rms_norm_eps);
    cJSON_AddNumberToObject(j, "rope_theta", c->rope_theta);
    if (c->rope_scaling.type == QS_ROPE_DEFAULT) {
        cJSON_AddNullToObject(j, "rope_scaling");
    } else {
        cJSON *rs = cJSON_AddObjectToObject(j, "rope_scaling");
        cJSON_AddStringToObject(rs, "rope_type", qs_rope_type_name(c->rope_scaling.type));
        cJSON_AddNumberToObject(rs, "factor", c->rope_scaling.factor);
        if (c->rope_scaling.type == QS_ROPE_LLAMA3) {
            cJSON_AddNumberToObject(rs, "low_freq_factor", c->rope_scaling.low_freq_factor);
            cJSON_AddNumberToObject(rs, "high_freq_factor", c->rope_scaling.high_freq_factor);
            cJSON_AddNumberToObject(rs, "original_max_position_embeddings",
                                    (double)c->rope_scaling.original_max_position_embeddings);
        }
    }
    cJSON_AddNumberToObject(j, "max_position_embeddings", (double)c->max_position_embeddings);
    cJSON_AddBoolToObject(j, "tie_word_embeddings", c->tie_word_embeddings);
    if (c->sliding_window > 0)
        cJSON_AddNumberToObject(j, "sliding_window", (double)c->sliding_window);
    else
        cJSON_AddNullToObject(j, "sliding_window");
    /* from the files, not the config: the plan knows whether q/k/v carry biases */
    cJSON_AddBoolToObject(j, "attention_bias", (p->bias_roles & CVT_ROLE_BIT(FMT_N_QKV)) != 0);
    cJSON_AddNumberToObject(j, "num_local_experts", (double)c->num_local_experts);
    cJSON_AddNumberToObject(j, "num_experts_per_tok", (double)c->num_experts_per_tok);
    if (c->num_local_experts > 0)
        cJSON_AddBoolToObject(j, "norm_topk_prob", !c->no_topk_renorm);
    if (c->alibi_bias_max > 0.0)
        cJSON_AddNumberToObject(j, "alibi_bias_max", c->alibi_bias_max);
    if (c->embed_scale > 0.0) { /* Gemma 2 / 3 (runtime/rt.h struct rt_config) */
        cJSON_AddNumberToObject(j, "embed_scale", c->embed_scale);
        cJSON_AddNumberToObject(j, "attn_scale", c->attn_scale);
        if (c->attn_softcap > 0.0) /* absent: none */
            cJSON_AddNumberToObject(j, "attn_softcap", c->attn_softcap);
        if (c->final_softcap > 0.0)
            cJSON_AddNumberToObject(j, "final_softcap", c->final_softcap);
        cJSON_AddNumberToObject(j, "sliding_window_pattern", (double)c->sliding_window_pattern);
        if (c->rope_local_theta > 0.0)
            cJSON_AddNumberToObject(j, "rope_local_theta", c->rope_local_theta);
    }
    q = cJSON_AddObjectToObject(j, "quant");
    cJSON_AddNumberToObject(q, "w_bit", c->quant.w_bit);
    cJSON_AddNumberToObject(q, "group_size", p->d.group_size);
    cJSON_AddBoolToObject(q, "zero_point", c->quant.zero_point);
    cJSON_AddStringToObject(q, "source_format", cvt_qmethod_str(c->quant.method));
    bool act = false;
    for (int i = 0; i < p->ranks[rank].n_outs; i++)
        act |= p->ranks[rank].outs[i].kind == CVT_OUT_PERM;
    cJSON_AddBoolToObject(q, "act_order", act);
    cJSON_AddStringToObject(q, "source_variant", R->variant);
    cJSON_AddStringToObject(q, "source_container", cvt_container_str(cvt_source_container(R->src)));
    a = cJSON_AddArrayToObject(q, "modules_to_not_convert");
    for (int i = 0; i < c->quant.n_modules_to_not_convert; i++)
        cJSON_AddItemToArray(a, cJSON_CreateString(c->quant.modules_to_not_convert[i]));
    if (c->has_bos)
        cJSON_AddNumberToObject(j, "bos_token_id", (double)c->bos_token_id);
    else
        cJSON_AddNullToObject(j, "bos_token_id");
    a = cJSON_AddArrayToObject(j, "eos_token_id");
    for (int i = 0; i < c->n_eos; i++)
        cJSON_AddItemToArray(a, cJSON_CreateNumber((double)c->eos_token_id[i]));
    t = cJSON_AddObjectToObject(j, "tp");
    cJSON_AddNumberToObject(t, "world_size", p->tp);
    cJSON_AddNumberToObject(t, "rank", rank);
    cJSON_AddNumberToObject(t, "heads_per_rank", p->heads_per_rank);
    cJSON_AddNumberToObject(t, "kv_heads_per_rank", p->kv_heads_per_rank);
    cJSON_AddNumberToObject(t, "kv_head_replicas", p->kv_head_replicas);
    cJSON_AddNumberToObject(t, "intermediate_per_rank", p->inter_per_rank);
    out = cJSON_Print(j);
    cJSON_Delete(j);
    return out;
}

void cvt_write_model_id(const struct cvt_run_state *R, uint8_t id[16])
{
    XXH3_state_t *st = XXH3_createState();
    uint32_t tp = (uint32_t)R->plan->tp;
    XXH128_canonical_t can;
    if (!st) { /* fall back to a one-shot hash of the config */
        XXH128_canonicalFromHash(&can, XXH3_128bits(R->cfg->config_json, R->cfg->config_json_size));
        memcpy(id, &can, 16);
        return;
    }
    XXH3_128bits_reset(st);
    XXH3_128bits_update(st, R->cfg->config_json, R->cfg->config_json_size);
    for (size_t i = 0; i < cvt_source_n_tensors(R->src); i++) {
        const struct cvt_src_tensor *t = cvt_source_tensor(R->src, i);
        int32_t dt = (int32_t)t->dtype;
        XXH3_128bits_update(st, t->name, strlen(t->name) + 1);
        XXH3_128bits_update(st, &dt, sizeof(dt));
        XXH3_128bits_update(st, t->shape, sizeof(t->shape[0]) * (size_t)t->n_dims);
    }
    XXH3_128bits_update(st, &tp, sizeof(tp));
    XXH128_canonicalFromHash(&can, XXH3_128bits_digest(st));
    memcpy(id, &can, 16);
    XXH3_freeState(st);
}

/* --- writers ------------------------------------------------------------------------------- */

/* Declare output o of a rank: 3 tensors for W4, 1 otherwise. */
static enum cvt_err declare_out(struct cvt_run_state *R, int rank, const struct cvt_out *o,
                                uint32_t *first)
{
    struct fmt_writer *w = R->w[rank];
    enum fmt_split sp = R->plan->tp == 1 ? FMT_SPLIT_NONE : o->split;
    uint64_t K = (uint64_t)o->rows, N = (uint64_t)o->cols, G = (uint64_t)o->group;
    char nm[200];
    enum fmt_err fe = FMT_ERR_NONE;
    uint32_t idx;
    if (o->kind == CVT_OUT_W4) {
        /* [K, N] and [K/G_r, N] (G_r: this output's local group size, DESIGN 4): column split
         * on axis 1, row split on axis 0 */
        uint32_t ax = o->split == FMT_SPLIT_COLUMN ? 1 : 0;
        uint64_t sq[2] = {K, N}, sg[2] = {K / G, N};
        snprintf(nm, sizeof(nm), "%s" FMT_SUFFIX_QWEIGHT, o->name);
        fe = fmt_writer_add_tensor(w, nm, FMT_DTYPE_Q4, FMT_LAYOUT_W4_MMA_T16X64, 2, sq, sp,
                                   sp ? ax : 0, first);
        snprintf(nm, sizeof(nm), "%s" FMT_SUFFIX_SCALES, o->name);
        if (!fe)
            fe = fmt_writer_add_tensor(w, nm, FMT_DTYPE_F16, FMT_LAYOUT_S_T64, 2, sg, sp,
                                       sp ? ax : 0, &idx);
        snprintf(nm, sizeof(nm), "%s" FMT_SUFFIX_QZEROS, o->name);
        if (!fe)
            fe = fmt_writer_add_tensor(w, nm, FMT_DTYPE_Q4, FMT_LAYOUT_Z4_T64, 2, sg, sp,
                                       sp ? ax : 0, &idx);
    } else if (o->kind == CVT_OUT_LINEAR_F16) {
        uint64_t sh[2] = {N, K}; /* nn.Linear order */
        uint32_t ax = o->split == FMT_SPLIT_COLUMN ? 0 : 1;
        fe = fmt_writer_add_tensor(w, o->name, FMT_DTYPE_F16, FMT_LAYOUT_ROW_MAJOR, 2, sh, sp,
                                   sp ? ax : 0, first);
    } else if (o->kind == CVT_OUT_PERM) {
        uint64_t sh[1] = {N};
        fe = fmt_writer_add_tensor(w, o->name, FMT_DTYPE_I32, FMT_LAYOUT_ROW_MAJOR, 1, sh, sp, 0,
                                   first);
    } else {
        bool vec = o->rows == 1;
        uint64_t sh[2] = {vec ? N : K, N};
        /* a vector's column split (bias) is along its only axis */
        fe = fmt_writer_add_tensor(w, o->name,
                                   o->kind == CVT_OUT_MAT_F16 ? FMT_DTYPE_F16 : FMT_DTYPE_F32,
                                   FMT_LAYOUT_ROW_MAJOR, vec ? 1 : 2, sh, sp, 0, first);
    }
    if (fe)
        return fe == FMT_ERR_NOMEM ? CVT_ERR_NOMEM : CVT_ERR_ARG; /* reported by the writer */
    return CVT_ERR_NONE;
}

enum cvt_err cvt_write_open(struct cvt_run_state *R, int rank, const uint8_t id[16])
{
    const struct cvt_plan *p = R->plan;
    char path[4096 + 64], file[64];
    struct fmt_writer_opts wo;
    memset(&wo, 0, sizeof(wo));
    wo.tp_rank = (uint32_t)rank;
    wo.world_size = (uint32_t)p->tp;
    memcpy(wo.model_id, id, 16);
    fmt_rank_file_name(file, sizeof(file), (uint32_t)rank, (uint32_t)p->tp);
    snprintf(path, sizeof(path), "%s/%s", R->stage, file);
    if (fmt_writer_open(path, &wo, &R->w[rank]))
        return CVT_ERR_IO;
    char *js = config_json(R, rank);
    if (!js)
        return CVT_ERR_NOMEM;
    enum fmt_err fe = fmt_writer_set_section(R->w[rank], FMT_SECTION_CONFIG, js, strlen(js));
    free(js);
    if (!fe) {
        const char *g = R->cfg->generation_config_json;
        fe = fmt_writer_set_section(R->w[rank], FMT_SECTION_GENERATION_CONFIG, g ? g : "{}",
                                    g ? R->cfg->generation_config_json_size : 2);
    }
    size_t nt = cvt_source_n_tokenizer_files(R->src);
    if (!fe && nt) {
        const char *names[16];
        const void *datas[16];
        size_t sizes[16];
        uint32_t n = 0;
        for (size_t i = 0; i < nt && n < 16; i++, n++) {
            const struct cvt_src_blob *bl = cvt_source_tokenizer_file(R->src, i);
            names[n] = bl->name;
            datas[n] = bl->data;
            sizes[n] = bl->size;
        }
        fe = fmt_writer_set_tokenizer_files(R->w[rank], names, datas, sizes, n);
    }
    if (fe)
        return fe == FMT_ERR_NOMEM ? CVT_ERR_NOMEM : CVT_ERR_IO;
    const struct cvt_rank_plan *rp = &p->ranks[rank];
    for (int i = 0; i < rp->n_outs; i++)
        CVT_TRY(declare_out(R, rank, &rp->outs[i], &R->idx[rank][i]));
    if (fmt_writer_begin_data(R->w[rank]))
        return CVT_ERR_IO;
    return CVT_ERR_NONE;
}

/*
 * test_cvt_config.c - the converter's config reader (convert/cvt_config.c through the
 * architecture descriptors of convert/arch/) and the source directory: real configs from
 * HuggingFace repos (tests/data/fuzz/fuzz_config/, provenance in tests/data/fuzz/README.md) and
 * hand-written bad ones, each refused with its status and a message naming the key; every
 * family's defaults against transformers' configuration classes (absent vs null keys) and its
 * own keys; the RoPE spellings of transformers 4 and 5 (rope_theta / rope_scaling /
 * rope_parameters: real configs in both spellings read alike, disagreements and unsupported
 * RoPE refused); sharded indexes and directory layouts (mixed downloads, shards missing or
 * extra, tensors in the wrong shard).
 *
 * Run: ./build/test_cvt_config (from the repo root). Builders: tests/t_cvt_src.h.
 */
#include "cvt_arch.h" /* cvt_arch_find, CVT_ROLE_BIT */
#include "t_cvt_src.h"

/* --- configs ---------------------------------------------------------------------------------------- */

static enum cvt_err cfg_parse(const char *c, const char *q, const char *z, const char *g, struct cvt_hf_config *cfg)
{
    return cvt_config_parse("test", c, c ? strlen(c) : 0, q, q ? strlen(q) : 0, z, z ? strlen(z) : 0, g, g ? strlen(g) : 0,
                            cfg);
}

static char *corpus_file(const char *name, size_t *n)
{
    char p[512];
    snprintf(p, sizeof p, "tests/data/fuzz/fuzz_config/%s", name);
    return t_slurp(p, n);
}

#define BASE_CFG "\"architectures\": [\"LlamaForCausalLM\"], \"hidden_size\": 4096, \"intermediate_size\": 11008, " \
                 "\"num_hidden_layers\": 32, \"num_attention_heads\": 32, \"vocab_size\": 32000"

static void test_configs(void)
{
    struct cvt_hf_config cfg;
    size_t n;
    /* Real configs (HuggingFace repos; see tests/data/fuzz/README.md). */
    char *t = corpus_file("Llama-3.1-70B-Instruct-AWQ-INT4.config.json", &n);
    CHECK(t != NULL);
    if (t) {
        CHECK_EQ_INT(cvt_config_parse("real", t, n, NULL, 0, NULL, 0, NULL, 0, &cfg), CVT_ERR_NONE);
        CHECK_EQ_INT(cfg.arch, cvt_arch_find("llama"));
        CHECK_EQ_INT(cfg.hidden_size, 8192);
        CHECK_EQ_INT(cfg.num_key_value_heads, 8);
        CHECK_EQ_INT(cfg.head_dim, 128);
        CHECK_EQ_INT(cfg.rope_scaling.type, QS_ROPE_LLAMA3);
        CHECK(cfg.rope_scaling.factor == 8.0 && cfg.rope_scaling.high_freq_factor == 4.0);
        CHECK_EQ_INT(cfg.rope_scaling.original_max_position_embeddings, 8192);
        CHECK(cfg.rope_theta == 500000.0);
        CHECK_EQ_INT(cfg.n_eos, 3);
        CHECK_EQ_INT(cfg.eos_token_id[2], 128009);
        CHECK_EQ_INT(cfg.quant.from, CVT_QCFG_CONFIG_JSON);
        CHECK_EQ_INT(cfg.quant.group_size, 128);
        CHECK_EQ_INT(cfg.quant.variant_mask, CVT_VARIANT_BIT(CVT_VARIANT_GEMM));
        CHECK(cfg.config_json_size == n && memcmp(cfg.config_json, t, n) == 0);
        cvt_config_free(&cfg);
        /* + generation_config with an eos list (casperhansen/llama-3-70b-instruct-awq) */
        size_t gn;
        char *g = corpus_file("llama-3-70b-instruct-awq.generation_config.json", &gn);
        CHECK(g != NULL);
        if (g) {
            CHECK_EQ_INT(cvt_config_parse("real", t, n, NULL, 0, NULL, 0, g, gn, &cfg), CVT_ERR_NONE);
            CHECK_EQ_INT(cfg.n_eos, 3); /* {128001, 128008, 128009} U {128001, 128009} */
            CHECK_EQ_INT(cfg.bos_token_id, 128000);
            CHECK(cfg.generation_config_json && cfg.generation_config_json_size == gn);
            cvt_config_free(&cfg);
            free(g);
        }
        free(t);
    }
    t = corpus_file("Qwen2.5-72B-Instruct-ko-AWQ.config.json", &n);
    if (t) {
        CHECK_EQ_INT(cvt_config_parse("real", t, n, NULL, 0, NULL, 0, NULL, 0, &cfg), CVT_ERR_NONE);
        CHECK_EQ_INT(cfg.arch, cvt_arch_find("qwen2"));
        CHECK(cfg.bias_roles == CVT_ROLE_BIT(FMT_N_QKV)); /* q/k/v, not o */
        CHECK_EQ_INT(cfg.intermediate_size, 29568);
        CHECK_EQ_INT(cfg.vocab_size, 152064);
        CHECK_EQ_INT(cfg.sliding_window, 0);
        cvt_config_free(&cfg);
        free(t);
    }
    t = corpus_file("Mistral-7B-v0.1-AWQ.config.json", &n);
    if (t) {
        CHECK_EQ_INT(cvt_config_parse("real", t, n, NULL, 0, NULL, 0, NULL, 0, &cfg), CVT_ERR_NONE);
        CHECK_EQ_INT(cfg.arch, cvt_arch_find("mistral"));
        CHECK_EQ_INT(cfg.sliding_window, 4096);
        CHECK_EQ_STR(cfg.torch_dtype, "bfloat16");
        cvt_config_free(&cfg);
        free(t);
    }
    t = corpus_file("mistral-7b-instruct-awq-gemv.config.json", &n);
    if (t) {
        CHECK_EQ_INT(cvt_config_parse("real", t, n, NULL, 0, NULL, 0, NULL, 0, &cfg), CVT_ERR_NONE);
        CHECK_EQ_INT(cfg.quant.variant_mask, CVT_VARIANT_BIT(CVT_VARIANT_GEMV));
        cvt_config_free(&cfg);
        free(t);
    }
    t = corpus_file("LLaMA-30b-AWQ.quant_config.json", &n);
    if (t) {
        CHECK_EQ_INT(cfg_parse("{" BASE_CFG "}", t, NULL, NULL, &cfg), CVT_ERR_NONE);
        CHECK_EQ_INT(cfg.quant.from, CVT_QCFG_QUANT_CONFIG_JSON);
        CHECK_EQ_STR(cfg.quant.version, "gemm");
        CHECK_EQ_INT(cfg.num_key_value_heads, 32);
        CHECK_EQ_INT(cfg.head_dim, 128);
        cvt_config_free(&cfg);
        free(t);
    }
    t = corpus_file("Llama-2-7b-chat-hf-w4-g128-awq.quantize_config.json", &n);
    if (t) {
        CHECK_EQ_INT(cfg_parse("{" BASE_CFG "}", NULL, t, NULL, &cfg), CVT_ERR_NONE);
        CHECK_EQ_INT(cfg.quant.from, CVT_QCFG_QUANTIZE_CONFIG_JSON);
        CHECK_EQ_INT(cfg.quant.variant_mask, CVT_VARIANT_BIT(CVT_VARIANT_GEMM));
        cvt_config_free(&cfg);
        free(t);
    }
    /* Bad ones: each refused with its own code and a message naming the cause. */
    qs_log_set_quiet(true);
    static const struct {
        const char *cfg, *qcfg, *want_msg;
        enum cvt_err want;
    } bad[] = {
        {"{" BASE_CFG ", \"quantization_config\": {\"quant_method\": \"awq\", \"bits\": 8, \"group_size\": 128}}", NULL, "bits", CVT_ERR_UNSUPPORTED},
        {"{" BASE_CFG ", \"quantization_config\": {\"quant_method\": \"bitsandbytes\", \"bits\": 4, \"group_size\": 128}}", NULL, "bitsandbytes", CVT_ERR_UNSUPPORTED},
        {"{" BASE_CFG ", \"quantization_config\": {\"quant_method\": \"awq\", \"bits\": 4, \"group_size\": 128, \"version\": \"marlin\"}}", NULL, "marlin", CVT_ERR_UNSUPPORTED},
        {"{" BASE_CFG ", \"quantization_config\": {\"quant_method\": \"awq\", \"bits\": 4, \"group_size\": 128, \"version\": \"gemm_v9\"}}", NULL, "gemm_v9", CVT_ERR_UNSUPPORTED},
        {"{" BASE_CFG ", \"quantization_config\": {\"quant_method\": \"awq\", \"bits\": 4, \"group_size\": 128}}",
         "{\"zero_point\": true, \"q_group_size\": 64, \"w_bit\": 4, \"version\": \"GEMM\"}", "disagree", CVT_ERR_CONFIG},
        {"{" BASE_CFG ", \"rope_scaling\": {\"type\": \"dynamic\", \"factor\": 2.0}}", NULL, "dynamic", CVT_ERR_UNSUPPORTED},
        {"{" BASE_CFG ", \"rope_scaling\": {\"rope_type\": \"yarn\", \"factor\": 2.0}}", NULL, "yarn", CVT_ERR_UNSUPPORTED},
        {"{\"architectures\": [\"GPTNeoXForCausalLM\"], \"hidden_size\": 4544}", NULL, "GPTNeoXForCausalLM", CVT_ERR_UNSUPPORTED},
        {"{\"model_type\": \"gpt_neox\"}", NULL, "gpt_neox", CVT_ERR_UNSUPPORTED},
        {"{\"architectures\": [\"LlamaForCausalLM\"], \"model_type\": \"mistral\", \"hidden_size\": 8}", NULL, "disagree", CVT_ERR_CONFIG},
        {"[1, 2, 3]", NULL, "JSON object", CVT_ERR_JSON},
        {"{\"architectures\": [\"LlamaForCausalLM\"], \"hidden_size\": 4096", NULL, "JSON object", CVT_ERR_JSON},
        {"{\"architectures\": [\"LlamaForCausalLM\"], \"intermediate_size\": 11008}", NULL, "hidden_size", CVT_ERR_CONFIG},
        {"{" BASE_CFG ", \"num_key_value_heads\": 5}", NULL, "num_key_value_heads", CVT_ERR_CONFIG},
        {"{" BASE_CFG ", \"rms_norm_eps\": -1}", NULL, "rms_norm_eps", CVT_ERR_CONFIG},
        {"{\"architectures\": [\"LlamaForCausalLM\"], \"hidden_size\": 4096, \"intermediate_size\": 11008, "
         "\"num_hidden_layers\": 32, \"num_attention_heads\": 32, \"vocab_size\": 1e30}", NULL, "vocab_size", CVT_ERR_CONFIG},
        {"{" BASE_CFG ", \"vocab_size\": 64}", NULL, "vocab_size", CVT_ERR_JSON}, /* duplicate key */
        {"{" BASE_CFG ", \"eos_token_id\": [2, \"x\"]}", NULL, "eos_token_id", CVT_ERR_CONFIG},
        {"{" BASE_CFG ", \"eos_token_id\": 99999}", NULL, "eos_token_id", CVT_ERR_CONFIG},
        {"{" BASE_CFG ", \"hidden_act\": \"gelu\"}", NULL, "gelu", CVT_ERR_UNSUPPORTED},
        {"{\"architectures\": [\"Qwen2ForCausalLM\"], \"hidden_size\": 64, \"intermediate_size\": 64, \"num_hidden_layers\": 4, "
         "\"num_attention_heads\": 1, \"num_key_value_heads\": 1, \"vocab_size\": 64, \"use_sliding_window\": true, \"max_window_layers\": 2}", NULL, "max_window_layers",
         CVT_ERR_UNSUPPORTED},
        {"{" BASE_CFG ", \"quantization_config\": {\"quant_method\": \"awq\", \"bits\": 4}}", NULL, "group", CVT_ERR_CONFIG},
        {"{" BASE_CFG ", \"tie_word_embeddings\": \"yes\"}", NULL, "tie_word_embeddings", CVT_ERR_CONFIG},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        enum cvt_err e = cfg_parse(bad[i].cfg, bad[i].qcfg, NULL, NULL, &cfg);
        CHECK_MSG(e == bad[i].want, "bad config %zu: got %s, want %s (%s)", i, cvt_err_str(e), cvt_err_str(bad[i].want),
                  qs_log_last());
        CHECK_MSG(strstr(qs_log_last(), bad[i].want_msg) != NULL, "bad config %zu: message '%s' lacks '%s'", i,
                  qs_log_last(), bad[i].want_msg);
        CHECK(cfg.config_json == NULL);
    }
    qs_log_set_quiet(false);
}

/* Quant config spellings: nested under text_config, GPTQ disguised, two agreeing files. */
static void test_config_spellings(void)
{
    struct cvt_hf_config cfg;
    /* quant config nested under text_config (VLM-style wrapper, docs/FORMATS.md P21 c) */
    CHECK_EQ_INT(cfg_parse("{" BASE_CFG ", \"text_config\": {\"quantization_config\": {\"quant_method\": \"awq\", "
                           "\"bits\": 4, \"group_size\": 64, \"version\": \"gemv\"}}}", NULL, NULL, NULL, &cfg),
                 CVT_ERR_NONE);
    CHECK_EQ_INT(cfg.quant.group_size, 64);
    CHECK_EQ_INT(cfg.quant.variant_mask, CVT_VARIANT_BIT(CVT_VARIANT_GEMV));
    cvt_config_free(&cfg);
    /* AutoGPTQ's quantize_config.json has no quant_method: its keys make it GPTQ */
    CHECK_EQ_INT(cfg_parse("{" BASE_CFG "}", NULL, "{\"bits\": 4, \"group_size\": 128, \"desc_act\": false, \"sym\": true}", NULL, &cfg),
                 CVT_ERR_NONE);
    CHECK_EQ_INT(cfg.quant.method, CVT_QM_GPTQ);
    CHECK(!cfg.quant.zero_point && cfg.quant.gptq_v1 && !cfg.quant.act_order);
    CHECK_EQ_INT(cfg.quant.variant_mask, CVT_VARIANT_BIT(CVT_VARIANT_GPTQ));
    cvt_config_free(&cfg);
    /* defaults and two agreeing quant configs (AutoAWQ 0.1.6-0.1.8 wrote both) */
    CHECK_EQ_INT(cfg_parse("{" BASE_CFG ", \"quantization_config\": {\"quant_method\": \"awq\", \"bits\": 4, \"group_size\": 128, "
                           "\"version\": \"gemm\", \"modules_to_not_convert\": [\"gate\"]}}",
                           "{\"zero_point\": true, \"q_group_size\": 128, \"w_bit\": 4, \"version\": \"GEMM\"}", NULL, NULL, &cfg),
                 CVT_ERR_NONE);
    CHECK_EQ_INT(cfg.quant.n_modules_to_not_convert, 1);
    CHECK(cvt_config_skips_module(&cfg, "model.layers.0.block_sparse_moe.gate"));
    CHECK(!cvt_config_skips_module(&cfg, "model.layers.0.self_attn.q_proj"));
    CHECK(cfg.rms_norm_eps == 1e-6 && cfg.rope_theta == 10000.0);
    CHECK_EQ_INT(cfg.max_position_embeddings, 2048);
    cvt_config_free(&cfg);
}

/* GPTQ and compressed-tensors quant configs (docs/FORMATS.md 14.1, 15.1), symmetric AWQ: what
 * is read, and every refusal naming its key. */
static void test_config_gptq_ct(void)
{
    struct cvt_hf_config cfg;
    CHECK_EQ_INT(cfg_parse("{" BASE_CFG ", \"quantization_config\": {\"quant_method\": \"gptq\", \"bits\": 4, \"group_size\": 64, "
                           "\"desc_act\": true, \"sym\": false, \"checkpoint_format\": \"gptq_v2\", \"pack_dtype\": \"int32\", "
                           "\"meta\": {\"quantizer\": [\"gptqmodel:2.2.0\"]}, \"dynamic\": null}}", NULL, NULL, NULL, &cfg),
                 CVT_ERR_NONE);
    CHECK(cfg.quant.method == CVT_QM_GPTQ && cfg.quant.zero_point && cfg.quant.act_order && !cfg.quant.gptq_v1);
    CHECK_EQ_INT(cfg.quant.group_size, 64);
    cvt_config_free(&cfg);
    CHECK_EQ_INT(cfg_parse("{" BASE_CFG ", \"quantization_config\": {\"quant_method\": \"awq\", \"bits\": 4, \"group_size\": 128, \"zero_point\": false}}",
                           NULL, NULL, NULL, &cfg), CVT_ERR_NONE);
    CHECK(cfg.quant.method == CVT_QM_AWQ && !cfg.quant.zero_point);
    cvt_config_free(&cfg);
#define CT_PRE "{" BASE_CFG ", \"quantization_config\": {\"quant_method\": \"compressed-tensors\", \"format\": \"pack-quantized\", " \
               "\"quantization_status\": \"compressed\", "
#define CT_W(w) "\"config_groups\": {\"group_0\": {\"targets\": [\"Linear\"], \"input_activations\": null, \"weights\": {" w "}}}"
    CHECK_EQ_INT(cfg_parse(CT_PRE CT_W("\"num_bits\": 4, \"type\": \"int\", \"symmetric\": true, \"strategy\": \"channel\", \"group_size\": null, "
                                      "\"actorder\": null, \"dynamic\": false")
                           ", \"ignore\": [\"lm_head\", \"re:.*mlp\\\\.gate$\", \"re:model\\\\.layers\\\\.\\\\d+\\\\.self_attn\\\\.k_proj\", \"re:mlp\"], "
                           "\"sparsity_config\": {}, \"kv_cache_scheme\": null}}", NULL, NULL, NULL, &cfg),
                 CVT_ERR_NONE);
    CHECK(cfg.quant.method == CVT_QM_CT && !cfg.quant.zero_point && !cfg.quant.act_order);
    CHECK_EQ_INT(cfg.quant.group_size, -1);
    CHECK_EQ_INT(cfg.quant.n_ignore, 4);
    CHECK(cvt_config_ignores_module(&cfg, "lm_head"));
    CHECK(cvt_config_ignores_module(&cfg, "model.layers.3.mlp.gate"));
    CHECK(!cvt_config_ignores_module(&cfg, "model.layers.3.mlp.gate_proj"));
    CHECK(cvt_config_ignores_module(&cfg, "model.layers.12.self_attn.k_proj"));
    CHECK(!cvt_config_ignores_module(&cfg, "model.layers.x.self_attn.k_proj"));
    CHECK(!cvt_config_ignores_module(&cfg, "model.layers.0.mlp.up_proj")); /* re.match: anchored */
    CHECK(!cvt_config_ignores_module(&cfg, "lm_head2"));
    cvt_config_free(&cfg);
    CHECK_EQ_INT(cfg_parse(CT_PRE CT_W("\"num_bits\": 4, \"type\": \"int\", \"symmetric\": false, \"strategy\": \"group\", \"group_size\": 32, "
                                      "\"actorder\": \"group\"") "}}", NULL, NULL, NULL, &cfg),
                 CVT_ERR_NONE);
    CHECK(cfg.quant.zero_point && cfg.quant.act_order && cfg.quant.group_size == 32);
    cvt_config_free(&cfg);
    static const struct {
        const char *cfg, *qz, *want_msg;
        enum cvt_err want;
    } bad[] = {
        {"{" BASE_CFG ", \"quantization_config\": {\"quant_method\": \"gptq\", \"bits\": 8, \"group_size\": 128}}", NULL, "bits", CVT_ERR_UNSUPPORTED},
        {"{" BASE_CFG ", \"quantization_config\": {\"quant_method\": \"gptq\", \"bits\": 4, \"group_size\": 128, \"checkpoint_format\": \"marlin\"}}", NULL, "marlin", CVT_ERR_UNSUPPORTED},
        {"{" BASE_CFG ", \"quantization_config\": {\"quant_method\": \"gptq\", \"bits\": 4, \"group_size\": 128, \"checkpoint_format\": \"gptq\", \"format\": \"gptq_v2\"}}", NULL, "disagree", CVT_ERR_CONFIG},
        {"{" BASE_CFG ", \"quantization_config\": {\"quant_method\": \"gptq\", \"bits\": 4, \"group_size\": 128, \"dynamic\": {\"-:.*down\": {}}}}", NULL, "dynamic", CVT_ERR_UNSUPPORTED},
        {"{" BASE_CFG ", \"quantization_config\": {\"quant_method\": \"gptq\", \"bits\": 4, \"group_size\": 128, \"lm_head\": true}}", NULL, "lm_head", CVT_ERR_UNSUPPORTED},
        {"{" BASE_CFG ", \"quantization_config\": {\"quant_method\": \"gptq\", \"bits\": 4, \"group_size\": 128, \"pack_dtype\": \"int16\"}}", NULL, "pack_dtype", CVT_ERR_UNSUPPORTED},
        {"{" BASE_CFG ", \"quantization_config\": {\"quant_method\": \"gptq\", \"bits\": 4, \"group_size\": 128, \"desc_act\": true}}",
         "{\"bits\": 4, \"group_size\": 128, \"desc_act\": false, \"sym\": true}", "disagree", CVT_ERR_CONFIG},
        {CT_PRE CT_W("\"num_bits\": 8, \"type\": \"int\", \"symmetric\": true, \"strategy\": \"channel\"") "}}", NULL, "num_bits", CVT_ERR_UNSUPPORTED},
        {CT_PRE CT_W("\"num_bits\": 4, \"type\": \"float\", \"symmetric\": true, \"strategy\": \"channel\"") "}}", NULL, "type", CVT_ERR_UNSUPPORTED},
        {CT_PRE CT_W("\"num_bits\": 4, \"type\": \"int\", \"symmetric\": true, \"strategy\": \"tensor\"") "}}", NULL, "strategy", CVT_ERR_UNSUPPORTED},
        {CT_PRE CT_W("\"num_bits\": 4, \"type\": \"int\", \"symmetric\": true, \"strategy\": \"group\", \"group_size\": 128, \"actorder\": \"sideways\"") "}}", NULL, "actorder", CVT_ERR_UNSUPPORTED},
        {CT_PRE CT_W("\"num_bits\": 4, \"type\": \"int\", \"symmetric\": true, \"strategy\": \"group\", \"group_size\": 128, \"dynamic\": true") "}}", NULL, "dynamic", CVT_ERR_UNSUPPORTED},
        {"{" BASE_CFG ", \"quantization_config\": {\"quant_method\": \"compressed-tensors\", \"format\": \"int-quantized\", \"quantization_status\": \"compressed\", "
         CT_W("\"num_bits\": 4, \"type\": \"int\", \"symmetric\": true, \"strategy\": \"channel\"") "}}", NULL, "int-quantized", CVT_ERR_UNSUPPORTED},
        {"{" BASE_CFG ", \"quantization_config\": {\"quant_method\": \"compressed-tensors\", \"format\": \"pack-quantized\", \"quantization_status\": \"frozen\", "
         CT_W("\"num_bits\": 4, \"type\": \"int\", \"symmetric\": true, \"strategy\": \"channel\"") "}}", NULL, "frozen", CVT_ERR_UNSUPPORTED},
        {CT_PRE "\"config_groups\": {\"group_0\": {\"targets\": [\"re:.*q_proj$\"], \"weights\": {\"num_bits\": 4, \"symmetric\": true, \"strategy\": \"group\", \"group_size\": 128}}, "
         "\"group_1\": {\"targets\": [\"re:.*down_proj$\"], \"weights\": {\"num_bits\": 4, \"symmetric\": true, \"strategy\": \"group\", \"group_size\": 64}}}}}", NULL, "config_groups", CVT_ERR_UNSUPPORTED},
        {CT_PRE "\"config_groups\": {\"group_0\": {\"targets\": [\"Linear\"], \"input_activations\": {\"num_bits\": 8}, \"weights\": {\"num_bits\": 4, \"symmetric\": true, \"strategy\": \"channel\"}}}}}", NULL, "activations", CVT_ERR_UNSUPPORTED},
        {CT_PRE CT_W("\"num_bits\": 4, \"symmetric\": true, \"strategy\": \"channel\"") ", \"sparsity_config\": {\"format\": \"sparse-24-bitmask\"}}}", NULL, "sparsity", CVT_ERR_UNSUPPORTED},
        {CT_PRE CT_W("\"num_bits\": 4, \"symmetric\": true, \"strategy\": \"channel\"") ", \"ignore\": [\"re:(?i)LM_HEAD\"]}}", NULL, "(?i)", CVT_ERR_UNSUPPORTED},
        {CT_PRE CT_W("\"num_bits\": 4, \"symmetric\": true, \"strategy\": \"channel\"") ", \"ignore\": \"lm_head\"}}", NULL, "ignore", CVT_ERR_CONFIG},
    };
    qs_log_set_quiet(true);
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        enum cvt_err e = cfg_parse(bad[i].cfg, NULL, bad[i].qz, NULL, &cfg);
        CHECK_MSG(e == bad[i].want, "bad gptq/ct config %zu: got %s, want %s (%s)", i, cvt_err_str(e),
                  cvt_err_str(bad[i].want), qs_log_last());
        CHECK_MSG(strstr(qs_log_last(), bad[i].want_msg) != NULL, "bad gptq/ct config %zu: message '%s' lacks '%s'", i,
                  qs_log_last(), bad[i].want_msg);
        CHECK(cfg.config_json == NULL);
    }
    qs_log_set_quiet(false);
#undef CT_PRE
#undef CT_W
}

/* A config of family `cls` (a HF class) with 32 heads of 128 and `extra` keys (",\"k\": v..."
 * or ""), parsed into *cfg; the status. */
static enum cvt_err fam_parse(const char *cls, const char *extra, struct cvt_hf_config *cfg)
{
    char c[2048];
    snprintf(c, sizeof c, "{\"architectures\": [\"%s\"], \"hidden_size\": 4096, \"intermediate_size\": 512, "
             "\"num_hidden_layers\": 2, \"num_attention_heads\": 32, \"vocab_size\": 64%s}", cls, extra);
    return cfg_parse(c, NULL, NULL, NULL, cfg);
}

/* A config of family cls with keys extra that must be refused with `want` and a message naming
 * needle and needle2. */
struct refusal {
    const char *cls, *extra, *needle, *needle2;
    enum cvt_err want;
};

static void check_refusals(const char *what, const struct refusal *r, size_t n)
{
    struct cvt_hf_config cfg;
    qs_log_set_quiet(true);
    for (size_t i = 0; i < n; i++) {
        enum cvt_err e = fam_parse(r[i].cls, r[i].extra, &cfg);
        CHECK_MSG(e == r[i].want, "%s case %zu: got %s, want %s (%s)", what, i, cvt_err_str(e),
                  cvt_err_str(r[i].want), qs_log_last());
        CHECK_MSG(strstr(qs_log_last(), r[i].needle) && strstr(qs_log_last(), r[i].needle2),
                  "%s case %zu: message '%s' lacks '%s' or '%s'", what, i, qs_log_last(), r[i].needle,
                  r[i].needle2);
        CHECK(cfg.config_json == NULL);
    }
    qs_log_set_quiet(false);
}

/* Each family's defaults (descriptors, convert/arch/) against transformers' configuration
 * classes, when config.json omits the key: LlamaConfig (configuration_llama.py:
 * num_key_value_heads None -> num_attention_heads, rms_norm_eps 1e-6, max_position_embeddings
 * 2048), MistralConfig (num_key_value_heads 8, rms_norm_eps 1e-6, sliding_window 4096,
 * max_position_embeddings 4096 * 32), Qwen2Config (num_key_value_heads 32, rms_norm_eps 1e-6,
 * 32768, a window only with use_sliding_window), MixtralConfig (num_key_value_heads 8,
 * rms_norm_eps 1e-5, sliding_window None, 4096 * 32, 8 experts, top 2); rope_theta is each
 * class's default_theta (10000; Mixtral 1e6). An explicit null num_key_value_heads is
 * num_attention_heads in every class, a null window none. */
static void test_arch_defaults(void)
{
    static const struct {
        const char *cls;
        double rope_theta, eps;
        int64_t max_pos, kv, sliding_window, experts, top_k;
        unsigned bias_roles;
    } want[] = {
        {"LlamaForCausalLM", 10000.0, 1e-6, 2048, 32, 0, 0, 0, 0},
        {"MistralForCausalLM", 10000.0, 1e-6, 4096 * 32, 8, 4096, 0, 0, 0},
        {"Qwen2ForCausalLM", 10000.0, 1e-6, 32768, 32, 0, 0, 0, CVT_ROLE_BIT(FMT_N_QKV)},
        {"Qwen3ForCausalLM", 10000.0, 1e-6, 32768, 32, 0, 0, 0, 0},
        {"Phi3ForCausalLM", 10000.0, 1e-5, 4096, 32, 0, 0, 0, 0},
        {"MixtralForCausalLM", 1e6, 1e-5, 4096 * 32, 8, 0, 8, 2, 0},
        {"Qwen3MoeForCausalLM", 10000.0, 1e-6, 32768, 4, 0, 128, 8, 0},
    };
    struct cvt_hf_config cfg;
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        CHECK_EQ_INT(fam_parse(want[i].cls, "", &cfg), CVT_ERR_NONE);
        CHECK(cfg.arch && cfg.arch == cvt_arch_by_hf_class(want[i].cls));
        CHECK_MSG(cfg.rope_theta == want[i].rope_theta, "%s rope_theta %g", want[i].cls, cfg.rope_theta);
        CHECK_MSG(cfg.rms_norm_eps == want[i].eps, "%s rms_norm_eps %g", want[i].cls, cfg.rms_norm_eps);
        CHECK_EQ_INT(cfg.rope_scaling.type, QS_ROPE_DEFAULT);
        CHECK_EQ_INT(cfg.max_position_embeddings, want[i].max_pos);
        CHECK_EQ_INT(cfg.num_key_value_heads, want[i].kv);
        CHECK_EQ_INT(cfg.sliding_window, want[i].sliding_window);
        CHECK_EQ_INT(cfg.num_local_experts, want[i].experts);
        CHECK_EQ_INT(cfg.num_experts_per_tok, want[i].top_k);
        CHECK_EQ_INT(cfg.bias_roles, want[i].bias_roles);
        CHECK_EQ_INT(cfg.head_dim, 128);
        cvt_config_free(&cfg);
        /* null: None, which every class turns into num_attention_heads / no window */
        CHECK_EQ_INT(fam_parse(want[i].cls, ", \"num_key_value_heads\": null, \"sliding_window\": null", &cfg),
                     CVT_ERR_NONE);
        CHECK_EQ_INT(cfg.num_key_value_heads, 32);
        CHECK_EQ_INT(cfg.sliding_window, 0);
        cvt_config_free(&cfg);
        /* given: as given */
        CHECK_EQ_INT(fam_parse(want[i].cls, ", \"num_key_value_heads\": 4, \"rms_norm_eps\": 1e-5, \"sliding_window\": 64, "
                               "\"use_sliding_window\": true, \"max_window_layers\": 0", &cfg), CVT_ERR_NONE);
        CHECK_EQ_INT(cfg.num_key_value_heads, 4);
        CHECK(cfg.rms_norm_eps == 1e-5);
        CHECK_EQ_INT(cfg.sliding_window, strcmp(want[i].cls, "LlamaForCausalLM") ? 64 : 0); /* no window in llama */
        cvt_config_free(&cfg);
    }
    /* Qwen3Config: head_dim 128 when absent, whatever hidden / heads is (LLaMA: hidden / heads);
     * attention_bias biases q/k/v and o */
    static const char qw3[] = "{\"architectures\": [\"%s\"], \"hidden_size\": 256, "
                              "\"intermediate_size\": 512, \"num_hidden_layers\": 2, "
                              "\"num_attention_heads\": 4, \"num_key_value_heads\": 2, "
                              "\"vocab_size\": 64%s}";
    char js[512];
    snprintf(js, sizeof js, qw3, "Qwen3ForCausalLM", "");
    CHECK_EQ_INT(cfg_parse(js, NULL, NULL, NULL, &cfg), CVT_ERR_NONE);
    CHECK_EQ_INT(cfg.head_dim, 128);
    CHECK_EQ_INT(cfg.bias_roles, 0);
    cvt_config_free(&cfg);
    snprintf(js, sizeof js, qw3, "LlamaForCausalLM", "");
    CHECK_EQ_INT(cfg_parse(js, NULL, NULL, NULL, &cfg), CVT_ERR_NONE);
    CHECK_EQ_INT(cfg.head_dim, 64);
    cvt_config_free(&cfg);
    snprintf(js, sizeof js, qw3, "Qwen3ForCausalLM", ", \"head_dim\": 32, \"attention_bias\": true");
    CHECK_EQ_INT(cfg_parse(js, NULL, NULL, NULL, &cfg), CVT_ERR_NONE);
    CHECK_EQ_INT(cfg.head_dim, 32);
    CHECK_EQ_INT(cfg.bias_roles, CVT_ROLE_BIT(FMT_N_QKV) | CVT_ROLE_BIT(FMT_N_O));
    cvt_config_free(&cfg);
    /* a default that does not fit the heads is refused and the message says it was a default */
    qs_log_set_quiet(true);
    CHECK_EQ_INT(cfg_parse("{\"architectures\": [\"MistralForCausalLM\"], \"hidden_size\": 256, \"intermediate_size\": 512, "
                           "\"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"vocab_size\": 64}", NULL, NULL, NULL, &cfg),
                 CVT_ERR_CONFIG);
    CHECK(strstr(qs_log_last(), "num_key_value_heads 8") && strstr(qs_log_last(), "no num_key_value_heads") &&
          strstr(qs_log_last(), "MistralForCausalLM"));
    qs_log_set_quiet(false);
}

/* The family keys each descriptor reads: biases, windows (Qwen2's use_sliding_window,
 * max_window_layers and layer_types), experts. */
static void test_family_keys(void)
{
    struct cvt_hf_config cfg;
    CHECK_EQ_INT(fam_parse("LlamaForCausalLM", ", \"attention_bias\": true", &cfg), CVT_ERR_NONE);
    CHECK_EQ_INT(cfg.bias_roles, CVT_ROLE_BIT(FMT_N_QKV) | CVT_ROLE_BIT(FMT_N_O));
    cvt_config_free(&cfg);
    /* Qwen2: a window on every layer (max_window_layers 0), or on none (>= layers); absent
     * sliding_window with use_sliding_window is 4096, null is none */
    static const struct {
        const char *extra;
        int64_t want;
    } qw[] = {
        {", \"use_sliding_window\": true, \"sliding_window\": 512, \"max_window_layers\": 0", 512},
        {", \"use_sliding_window\": true, \"max_window_layers\": 0", 4096},
        {", \"use_sliding_window\": true, \"sliding_window\": null, \"max_window_layers\": 0", 0},
        {", \"use_sliding_window\": true", 0}, /* max_window_layers 28 >= 2 layers: full attention */
        {", \"use_sliding_window\": false, \"sliding_window\": 512, \"max_window_layers\": 0", 0},
        /* layer_types (transformers >= 4.53) wins over max_window_layers */
        {", \"use_sliding_window\": true, \"sliding_window\": 512, \"max_window_layers\": 28, "
         "\"layer_types\": [\"sliding_attention\", \"sliding_attention\"]", 512},
        {", \"use_sliding_window\": true, \"sliding_window\": 512, \"max_window_layers\": 0, "
         "\"layer_types\": [\"full_attention\", \"full_attention\"]", 0},
        {", \"use_sliding_window\": false, \"layer_types\": [\"full_attention\", \"full_attention\"]", 0},
    };
    for (size_t i = 0; i < sizeof qw / sizeof qw[0]; i++) {
        CHECK_MSG(fam_parse("Qwen2ForCausalLM", qw[i].extra, &cfg) == CVT_ERR_NONE, "qwen2 case %zu: %s", i,
                  qs_log_last());
        CHECK_MSG(cfg.sliding_window == qw[i].want, "qwen2 case %zu: window %lld, want %lld", i,
                  (long long)cfg.sliding_window, (long long)qw[i].want);
        cvt_config_free(&cfg);
    }
    /* Mixtral: num_experts is MixtralConfig's other name of num_local_experts */
    CHECK_EQ_INT(fam_parse("MixtralForCausalLM", ", \"num_experts\": 4", &cfg), CVT_ERR_NONE);
    CHECK_EQ_INT(cfg.num_local_experts, 4);
    cvt_config_free(&cfg);
    CHECK_EQ_INT(fam_parse("MixtralForCausalLM", ", \"num_experts\": 4, \"num_local_experts\": 4", &cfg), CVT_ERR_NONE);
    CHECK_EQ_INT(cfg.num_local_experts, 4);
    cvt_config_free(&cfg);
    static const struct refusal bad[] = {
        {"MixtralForCausalLM", ", \"num_local_experts\": 2, \"num_experts_per_tok\": 3", "num_experts_per_tok", "3",
         CVT_ERR_CONFIG},
        {"MixtralForCausalLM", ", \"num_experts\": 4, \"num_local_experts\": 8", "num_experts 4 and num_local_experts 8",
         "disagree", CVT_ERR_CONFIG},
        {"LlamaForCausalLM", ", \"mlp_bias\": true", "mlp_bias", "not supported", CVT_ERR_UNSUPPORTED},
        {"Qwen2ForCausalLM", ", \"use_sliding_window\": true, \"layer_types\": [\"full_attention\", \"sliding_attention\"]",
         "1 of 2 layers (by layer_types", "not supported", CVT_ERR_UNSUPPORTED},
        {"Qwen2ForCausalLM", ", \"use_sliding_window\": false, \"layer_types\": [\"sliding_attention\", \"sliding_attention\"]",
         "no window", "use_sliding_window false", CVT_ERR_CONFIG},
        {"Qwen2ForCausalLM", ", \"layer_types\": [\"full_attention\"]", "\"layer_types\" must be a list of num_hidden_layers (2)",
         "config.json", CVT_ERR_CONFIG},
        {"Qwen2ForCausalLM", ", \"layer_types\": [\"full_attention\", \"chunked_attention\"]", "layer_types[1]",
         "sliding_attention", CVT_ERR_UNSUPPORTED},
        /* Qwen3-MoE: dense layers among the sparse ones are refused */
        {"Qwen3MoeForCausalLM", ", \"mlp_only_layers\": [0]", "mlp_only_layers", "every layer must be sparse",
         CVT_ERR_UNSUPPORTED},
        {"Qwen3MoeForCausalLM", ", \"decoder_sparse_step\": 2", "decoder_sparse_step 2", "config.json",
         CVT_ERR_UNSUPPORTED},
        {"Qwen3MoeForCausalLM", ", \"num_experts\": 16, \"num_local_experts\": 8", "num_experts 16",
         "disagree", CVT_ERR_CONFIG},
        /* Phi-3-*-128k: longrope (or its old name su) is not implemented: refused, never ignored */
        {"Phi3ForCausalLM", ", \"rope_scaling\": {\"type\": \"longrope\", \"short_factor\": [1.0], \"long_factor\": [1.0]}",
         "\"longrope\" is not supported", "config.json", CVT_ERR_UNSUPPORTED},
        {"Phi3ForCausalLM", ", \"rope_scaling\": {\"type\": \"su\", \"short_factor\": [1.0], \"long_factor\": [1.0]}",
         "\"su\" is not supported", "config.json", CVT_ERR_UNSUPPORTED},
        {"Phi3ForCausalLM", ", \"partial_rotary_factor\": 0.75", "partial_rotary_factor 0.75", "config.json",
         CVT_ERR_UNSUPPORTED},
    };
    check_refusals("family", bad, sizeof bad / sizeof bad[0]);
    qs_log_set_quiet(true);
    /* the "supported" list comes from the registry */
    CHECK_EQ_INT(cfg_parse("{\"architectures\": [\"GemmaForCausalLM\"]}", NULL, NULL, NULL, &cfg),
                 CVT_ERR_UNSUPPORTED);
    CHECK(strstr(qs_log_last(), "LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, Phi3ForCausalLM, MixtralForCausalLM, Qwen3MoeForCausalLM, FalconForCausalLM, RWForCausalLM, MptForCausalLM, MPTForCausalLM") != NULL);
    qs_log_set_quiet(false);
}

/* Falcon (FalconConfig, configuration_falcon.py; RWConfig of the tiiuae remote code): the common
 * keys under Falcon's names, FalconConfig's defaults (ffn_hidden_size 4 * hidden, eps 1e-5,
 * 2048 positions, tied embeddings, one kv head with multi_query), biases with "bias", and every
 * layout other than Falcon-7B's refused by name. */
static void test_falcon_keys(void)
{
    struct cvt_hf_config cfg;
    /* tiiuae/falcon-7b's config.json keys, tiny sizes */
    static const char f7[] = "{\"architectures\": [\"%s\"], \"model_type\": \"%s\", "
                             "\"hidden_size\": 256, \"%s\": 4, \"%s\": 2, \"vocab_size\": 64, "
                             "\"layer_norm_epsilon\": 2e-05, \"multi_query\": true, "
                             "\"parallel_attn\": true, \"alibi\": false%s}";
    char js[1024];
    snprintf(js, sizeof js, f7, "FalconForCausalLM", "falcon", "num_attention_heads",
             "num_hidden_layers", ", \"new_decoder_architecture\": false, \"bias\": false");
    CHECK_EQ_INT(cfg_parse(js, NULL, NULL, NULL, &cfg), CVT_ERR_NONE);
    CHECK(cfg.arch == cvt_arch_find("falcon"));
    CHECK_EQ_INT(cfg.num_attention_heads, 4);
    CHECK_EQ_INT(cfg.num_hidden_layers, 2);
    CHECK_EQ_INT(cfg.num_key_value_heads, 1);
    CHECK_EQ_INT(cfg.intermediate_size, 1024); /* ffn_hidden_size None: 4 * hidden_size */
    CHECK_EQ_INT(cfg.head_dim, 64);
    CHECK(cfg.rms_norm_eps == 2e-5 && cfg.rope_theta == 10000.0); /* layer_norm_epsilon */
    CHECK_EQ_INT(cfg.max_position_embeddings, 2048);
    CHECK(cfg.tie_word_embeddings);
    CHECK_EQ_INT(cfg.bias_roles, 0);
    cvt_config_free(&cfg);
    /* the remote-code spelling: n_head, n_layer, RWForCausalLM / RefinedWebModel; given keys
     * win over the defaults */
    snprintf(js, sizeof js, f7, "RWForCausalLM", "RefinedWebModel", "n_head", "n_layer",
             ", \"ffn_hidden_size\": 640, \"tie_word_embeddings\": false, \"bias\": true, "
             "\"activation\": \"gelu\"");
    CHECK_EQ_INT(cfg_parse(js, NULL, NULL, NULL, &cfg), CVT_ERR_NONE);
    CHECK(cfg.arch && strcmp(cfg.arch->name, "falcon") == 0);
    CHECK_EQ_INT(cfg.num_attention_heads, 4);
    CHECK_EQ_INT(cfg.num_hidden_layers, 2);
    CHECK_EQ_INT(cfg.intermediate_size, 640);
    CHECK(!cfg.tie_word_embeddings && cfg.rms_norm_eps == 2e-5);
    CHECK_EQ_INT(cfg.bias_roles, CVT_ROLE_BIT(FMT_N_QKV) | CVT_ROLE_BIT(FMT_N_O) |
                                     CVT_ROLE_BIT(FMT_N_GATE_UP) | CVT_ROLE_BIT(FMT_N_DOWN));
    cvt_config_free(&cfg);
    static const struct refusal bad[] = {
        {"FalconForCausalLM", ", \"alibi\": true", "alibi true", "ALiBi", CVT_ERR_UNSUPPORTED},
        {"FalconForCausalLM", ", \"new_decoder_architecture\": true, \"num_kv_heads\": 3",
         "num_kv_heads 3", "not a multiple", CVT_ERR_CONFIG},
        {"FalconForCausalLM", ", \"new_decoder_architecture\": true, \"num_ln_in_parallel_attn\": 3",
         "num_ln_in_parallel_attn", "3", CVT_ERR_CONFIG},
        {"FalconForCausalLM", ", \"new_decoder_architecture\": true, \"parallel_attn\": false",
         "parallel_attn false", "post_attention_layernorm", CVT_ERR_UNSUPPORTED},
        {"FalconForCausalLM", ", \"new_decoder_architecture\": null", "new_decoder_architecture is null",
         "true or false", CVT_ERR_CONFIG},
        {"FalconForCausalLM", ", \"multi_query\": false", "multi_query false", "per head",
         CVT_ERR_UNSUPPORTED},
        {"FalconForCausalLM", ", \"parallel_attn\": false", "parallel_attn false",
         "post_attention_layernorm", CVT_ERR_UNSUPPORTED},
        {"FalconForCausalLM", ", \"activation\": \"relu\"", "activation \"relu\"", "gelu only",
         CVT_ERR_UNSUPPORTED},
        {"FalconForCausalLM", ", \"multi_query\": 1", "multi_query", "true or false", CVT_ERR_CONFIG},
        /* None is false to transformers where the default is true: refused, not defaulted */
        {"FalconForCausalLM", ", \"parallel_attn\": null", "parallel_attn is null", "true or false",
         CVT_ERR_CONFIG},
        {"FalconForCausalLM", ", \"n_head_kv\": 8", "n_head_kv", "Falcon-40B", CVT_ERR_UNSUPPORTED},
    };
    check_refusals("falcon", bad, sizeof bad / sizeof bad[0]);
    /* new_decoder_architecture (Falcon-40B): kv heads from num_kv_heads (null or absent: the
     * heads), the grouped layout, one or two LayerNorms */
    static const char nda[] = "{\"architectures\": [\"FalconForCausalLM\"], \"hidden_size\": 256, "
                              "\"num_attention_heads\": 4, \"num_hidden_layers\": 2, \"vocab_size\": 64, "
                              "\"new_decoder_architecture\": true%s}";
    static const struct {
        const char *extra;
        int nkv, steps;
    } nds[] = {{", \"num_kv_heads\": 2", 2, 7}, {", \"num_kv_heads\": null", 4, 7},
               {", \"num_kv_heads\": 1, \"num_ln_in_parallel_attn\": 1", 1, 5}};
    char nj[512];
    for (size_t i = 0; i < sizeof nds / sizeof nds[0]; i++) {
        snprintf(nj, sizeof nj, nda, nds[i].extra);
        CHECK_EQ_INT(cfg_parse(nj, NULL, NULL, NULL, &cfg), CVT_ERR_NONE);
        CHECK_MSG(cfg.arch && cfg.arch->qkv_grouped && cfg.num_key_value_heads == nds[i].nkv &&
                      cfg.arch->n_steps == nds[i].steps, "falcon-40b case %zu", i);
        cvt_config_free(&cfg);
    }
    /* two spellings of one key that disagree: refused (the class reads one, ignores the other);
     * that agree, or a null LLaMA spelling: the Falcon one is read */
    static const char two[] = "{\"architectures\": [\"FalconForCausalLM\"], \"hidden_size\": 256, "
                              "\"num_attention_heads\": 4, \"num_hidden_layers\": 2, \"vocab_size\": 64%s}";
    static const char *const conflicts[] = {
        ", \"rms_norm_eps\": 1e-6, \"layer_norm_epsilon\": 1e-5",
        ", \"hidden_act\": \"gelu\", \"activation\": \"relu\"",
        ", \"n_embed\": 512",
        ", \"n_head\": 8",
    };
    qs_log_set_quiet(true);
    for (size_t i = 0; i < sizeof conflicts / sizeof conflicts[0]; i++) {
        snprintf(js, sizeof js, two, conflicts[i]);
        CHECK_MSG(cfg_parse(js, NULL, NULL, NULL, &cfg) == CVT_ERR_CONFIG && strstr(qs_log_last(), "disagree"),
                  "falcon conflict %zu: %s", i, qs_log_last());
    }
    qs_log_set_quiet(false);
    snprintf(js, sizeof js, two, ", \"rms_norm_eps\": null, \"layer_norm_epsilon\": 1e-3, \"n_head\": 4");
    CHECK_EQ_INT(cfg_parse(js, NULL, NULL, NULL, &cfg), CVT_ERR_NONE);
    CHECK(cfg.rms_norm_eps == 1e-3);
    cvt_config_free(&cfg);
}

/* MPT (MptConfig / MptAttentionConfig, configuration_mpt.py; mosaicml/mpt-7b's spelling):
 * d_model, n_heads, n_layers, max_seq_len for the common keys, intermediate = expansion_ratio *
 * d_model (4 when absent), ALiBi with alibi_bias_max (8 when absent), tied embeddings, and every
 * attention or norm option it does not implement refused by name. */
static void test_mpt_keys(void)
{
    struct cvt_hf_config cfg;
    static const char mp[] = "{\"architectures\": [\"%s\"], \"model_type\": \"mpt\", "
                             "\"d_model\": 256, \"n_heads\": 4, \"n_layers\": 2, "
                             "\"vocab_size\": 64, \"no_bias\": true%s}";
    char js[1024];
    snprintf(js, sizeof js, mp, "MPTForCausalLM", ", \"max_seq_len\": 8192, \"attn_config\": "
             "{\"alibi\": true, \"alibi_bias_max\": 16, \"clip_qkv\": null, \"qk_ln\": false}");
    CHECK_EQ_INT(cfg_parse(js, NULL, NULL, NULL, &cfg), CVT_ERR_NONE);
    CHECK(cfg.arch && strcmp(cfg.arch->name, "mpt") == 0);
    CHECK_EQ_INT(cfg.hidden_size, 256);
    CHECK_EQ_INT(cfg.num_attention_heads, 4);
    CHECK_EQ_INT(cfg.num_key_value_heads, 4);
    CHECK_EQ_INT(cfg.num_hidden_layers, 2);
    CHECK_EQ_INT(cfg.intermediate_size, 1024);
    CHECK_EQ_INT(cfg.max_position_embeddings, 8192);
    CHECK(cfg.alibi_bias_max == 16.0 && cfg.tie_word_embeddings && cfg.rms_norm_eps == 1e-5);
    cvt_config_free(&cfg);
    snprintf(js, sizeof js, mp, "MptForCausalLM", ", \"expansion_ratio\": 2");
    CHECK_EQ_INT(cfg_parse(js, NULL, NULL, NULL, &cfg), CVT_ERR_NONE);
    CHECK_EQ_INT(cfg.intermediate_size, 512);
    CHECK(cfg.alibi_bias_max == 8.0); /* MptAttentionConfig's default */
    CHECK_EQ_INT(cfg.max_position_embeddings, 2048);
    cvt_config_free(&cfg);
    static const char *const bad[][3] = {
        {", \"attn_config\": {\"alibi\": false}", "alibi false", "learned position"},
        {", \"attn_config\": {\"clip_qkv\": 6}", "clip_qkv", "not supported"},
        {", \"attn_config\": {\"qk_ln\": true}", "qk_ln", "not supported"},
        {", \"attn_config\": {\"softmax_scale\": 0.1}", "softmax_scale", "not supported"},
        {", \"attn_config\": {\"prefix_lm\": true}", "prefix_lm", "not supported"},
        {", \"attn_config\": {\"attn_type\": \"grouped_query_attention\"}", "grouped_query_attention",
         "multihead_attention only"},
        {", \"logit_scale\": \"inv_sqrt_d_model\"", "logit_scale", "not supported"},
        {", \"norm_type\": \"rmsnorm\"", "norm_type \"rmsnorm\"", "LayerNorm only"},
    };
    qs_log_set_quiet(true);
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        snprintf(js, sizeof js, mp, "MPTForCausalLM", bad[i][0]);
        CHECK_MSG(cfg_parse(js, NULL, NULL, NULL, &cfg) == CVT_ERR_UNSUPPORTED, "mpt case %zu: %s", i,
                  qs_log_last());
        CHECK_MSG(strstr(qs_log_last(), bad[i][1]) && strstr(qs_log_last(), bad[i][2]),
                  "mpt case %zu: message '%s'", i, qs_log_last());
    }
    /* no_bias false, and attn_config of the wrong type */
    char nb[1024];
    snprintf(nb, sizeof nb, "{\"architectures\": [\"MPTForCausalLM\"], \"d_model\": 256, \"n_heads\": 4, "
             "\"n_layers\": 2, \"vocab_size\": 64, \"no_bias\": false}");
    CHECK_EQ_INT(cfg_parse(nb, NULL, NULL, NULL, &cfg), CVT_ERR_UNSUPPORTED);
    CHECK(strstr(qs_log_last(), "no_bias false") != NULL);
    snprintf(js, sizeof js, mp, "MPTForCausalLM", ", \"attn_config\": [1]");
    CHECK_EQ_INT(cfg_parse(js, NULL, NULL, NULL, &cfg), CVT_ERR_CONFIG);
    CHECK(strstr(qs_log_last(), "attn_config") != NULL);
    qs_log_set_quiet(false);
}

/* Gemma 2 / Gemma 3 text (Gemma2Config, Gemma3TextConfig): the classes' defaults (soft-capping
 * 50 / 30 for Gemma 2 only, query_pre_attn_scalar 256, window 4096, every sixth Gemma 3 layer
 * global, rope_local_base_freq 10000), hidden_activation as the spelling of hidden_act,
 * layer_types read as a pattern, and what is not run refused by name. */
static void test_gemma_keys(void)
{
    struct cvt_hf_config cfg;
    static const char gm[] = "{\"architectures\": [\"%s\"], \"model_type\": \"%s\", "
                             "\"hidden_size\": 256, \"intermediate_size\": 512, \"num_hidden_layers\": "
                             "6, \"num_attention_heads\": 4, \"vocab_size\": 64%s}";
    char js[2048];
    snprintf(js, sizeof js, gm, "Gemma2ForCausalLM", "gemma2", "");
    CHECK_EQ_INT(cfg_parse(js, NULL, NULL, NULL, &cfg), CVT_ERR_NONE);
    CHECK(cfg.arch && strcmp(cfg.arch->name, "gemma2") == 0 && cfg.arch->norm_offset == 1.0);
    CHECK_EQ_INT(cfg.head_dim, 256);
    CHECK_EQ_INT(cfg.num_key_value_heads, 4);
    CHECK_EQ_INT(cfg.sliding_window, 4096);
    CHECK_EQ_INT(cfg.sliding_window_pattern, 2);
    CHECK(cfg.attn_softcap == 50.0 && cfg.final_softcap == 30.0 && cfg.tie_word_embeddings);
    CHECK(cfg.attn_scale == 1.0 / 16.0 && cfg.embed_scale == 16.0 && cfg.rope_local_theta == 0.0);
    cvt_config_free(&cfg);
    snprintf(js, sizeof js, gm, "Gemma3ForCausalLM", "gemma3_text",
             ", \"hidden_activation\": \"gelu_pytorch_tanh\", \"query_pre_attn_scalar\": 144, "
             "\"sliding_window\": 512");
    CHECK_EQ_INT(cfg_parse(js, NULL, NULL, NULL, &cfg), CVT_ERR_NONE);
    CHECK(cfg.arch && strcmp(cfg.arch->name, "gemma3") == 0);
    CHECK(cfg.attn_softcap == 0.0 && cfg.final_softcap == 0.0 && cfg.rope_theta == 1e6);
    CHECK(cfg.attn_scale == 1.0 / 12.0 && cfg.rope_local_theta == 10000.0);
    CHECK_EQ_INT(cfg.sliding_window_pattern, 6);
    CHECK_EQ_INT(cfg.sliding_window, 512);
    cvt_config_free(&cfg);
    /* layer_types as a pattern; all global: no window */
    snprintf(js, sizeof js, gm, "Gemma3ForCausalLM", "gemma3_text",
             ", \"layer_types\": [\"sliding_attention\", \"sliding_attention\", \"full_attention\", "
             "\"sliding_attention\", \"sliding_attention\", \"full_attention\"]");
    CHECK_EQ_INT(cfg_parse(js, NULL, NULL, NULL, &cfg), CVT_ERR_NONE);
    CHECK_EQ_INT(cfg.sliding_window_pattern, 3);
    cvt_config_free(&cfg);
    /* tie_word_embeddings null: None, which transformers' tie_weights takes as false */
    snprintf(js, sizeof js, gm, "Gemma2ForCausalLM", "gemma2", ", \"tie_word_embeddings\": null");
    CHECK_EQ_INT(cfg_parse(js, NULL, NULL, NULL, &cfg), CVT_ERR_NONE);
    CHECK(!cfg.tie_word_embeddings);
    cvt_config_free(&cfg);
    snprintf(js, sizeof js, gm, "Gemma2ForCausalLM", "gemma2",
             ", \"layer_types\": [\"full_attention\", \"full_attention\", \"full_attention\", "
             "\"full_attention\", \"full_attention\", \"full_attention\"], \"final_logit_softcapping\": null");
    CHECK_EQ_INT(cfg_parse(js, NULL, NULL, NULL, &cfg), CVT_ERR_NONE);
    CHECK(cfg.sliding_window == 0 && cfg.sliding_window_pattern == 0 && cfg.final_softcap == 0.0);
    cvt_config_free(&cfg);
    /* (fam_parse's two layers: layer_types of two entries) */
    static const struct refusal bad[] = {
        {"Gemma3ForCausalLM", ", \"use_bidirectional_attention\": true", "use_bidirectional_attention",
         "not supported", CVT_ERR_UNSUPPORTED},
        {"Gemma2ForCausalLM", ", \"sliding_window\": null", "sliding_window null", "length", CVT_ERR_CONFIG},
        {"Gemma2ForCausalLM", ", \"hidden_activation\": \"gelu\"", "gelu", "gelu_pytorch_tanh only",
         CVT_ERR_UNSUPPORTED},
        {"Gemma2ForCausalLM", ", \"hidden_act\": \"gelu_pytorch_tanh\", \"hidden_activation\": \"gelu\"",
         "disagree", "hidden_activation", CVT_ERR_CONFIG},
        {"Gemma2ForCausalLM", ", \"mlp_bias\": true", "mlp_bias", "not supported", CVT_ERR_UNSUPPORTED},
        {"Gemma3ForCausalLM", ", \"layer_types\": [\"full_attention\", \"sliding_attention\"]",
         "breaks the pattern", "layer_types[1]", CVT_ERR_UNSUPPORTED},
        {"Gemma3ForCausalLM", ", \"sliding_window_pattern\": 3, \"layer_types\": [\"sliding_attention\", "
         "\"full_attention\"]", "disagree", "sliding_window_pattern 3", CVT_ERR_CONFIG},
        {"Gemma3ForCausalLM", ", \"layer_types\": [\"full_attention\"]", "layer_types", "num_hidden_layers",
         CVT_ERR_CONFIG},
        {"Gemma2ForCausalLM", ", \"attn_logit_softcapping\": 0", "attn_logit_softcapping", "1e+06",
         CVT_ERR_CONFIG},
    };
    check_refusals("gemma", bad, sizeof bad / sizeof bad[0]);
}

/* Everything a config says about the model, as parsed (not the saved text, nor torch_dtype,
 * which transformers 5 spells "dtype"): equal for the same model in two spellings. */
static void check_same_model(const char *what, const struct cvt_hf_config *a, const struct cvt_hf_config *b)
{
    CHECK_MSG(a->arch == b->arch && a->hidden_size == b->hidden_size && a->intermediate_size == b->intermediate_size &&
                  a->num_hidden_layers == b->num_hidden_layers && a->num_attention_heads == b->num_attention_heads &&
                  a->num_key_value_heads == b->num_key_value_heads && a->head_dim == b->head_dim &&
                  a->vocab_size == b->vocab_size && a->max_position_embeddings == b->max_position_embeddings &&
                  a->tie_word_embeddings == b->tie_word_embeddings && a->sliding_window == b->sliding_window &&
                  a->bias_roles == b->bias_roles && a->rms_norm_eps == b->rms_norm_eps,
              "%s: dimensions differ between the spellings", what);
    CHECK_MSG(a->rope_theta == b->rope_theta, "%s: rope_theta %g vs %g", what, a->rope_theta, b->rope_theta);
    CHECK_MSG(a->rope_scaling.type == b->rope_scaling.type && a->rope_scaling.factor == b->rope_scaling.factor &&
                  a->rope_scaling.low_freq_factor == b->rope_scaling.low_freq_factor &&
                  a->rope_scaling.high_freq_factor == b->rope_scaling.high_freq_factor &&
                  a->rope_scaling.original_max_position_embeddings == b->rope_scaling.original_max_position_embeddings,
              "%s: rope_scaling differs between the spellings", what);
    CHECK_MSG(a->n_eos == b->n_eos && a->bos_token_id == b->bos_token_id && a->quant.group_size == b->quant.group_size &&
                  a->quant.variant_mask == b->quant.variant_mask, "%s: tokens or quant config differ", what);
}

/* transformers 5's RoPE spelling: real configs (tests/data/fuzz/fuzz_config/) re-spelled the
 * way transformers 5 saves them ("t5-*": rope_theta and rope_scaling folded into
 * rope_parameters, dtype for torch_dtype; provenance in tests/data/fuzz/README.md) read exactly
 * as their transformers 4 originals. */
static void test_rope_t5_files(void)
{
    static const char *const names[] = {"Llama-3.1-70B-Instruct-AWQ-INT4", "Mistral-7B-Instruct-v0.2-AWQ-4bit",
                                        "Qwen2.5-72B-Instruct-ko-AWQ"};
    static const double theta[] = {500000.0, 1e6, 1e6};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        char f4[256], f5[256];
        size_t n4, n5;
        snprintf(f4, sizeof f4, "%s.config.json", names[i]);
        snprintf(f5, sizeof f5, "t5-%s.config.json", names[i]);
        char *t4 = corpus_file(f4, &n4), *t5 = corpus_file(f5, &n5);
        CHECK_MSG(t4 && t5, "corpus files of %s missing", names[i]);
        struct cvt_hf_config c4, c5;
        /* the t5 file has transformers 5's spelling only, the original transformers 4's only */
        cJSON *j4 = t4 ? cJSON_ParseWithLength(t4, n4) : NULL, *j5 = t5 ? cJSON_ParseWithLength(t5, n5) : NULL;
        CHECK(j4 && j5 && cJSON_GetObjectItem(j5, "rope_parameters") && !cJSON_GetObjectItem(j5, "rope_theta") &&
              !cJSON_GetObjectItem(j5, "rope_scaling") && cJSON_GetObjectItem(j4, "rope_theta") &&
              !cJSON_GetObjectItem(j4, "rope_parameters"));
        cJSON_Delete(j4);
        cJSON_Delete(j5);
        if (t4 && t5) {
            CHECK_EQ_INT(cvt_config_parse("real", t4, n4, NULL, 0, NULL, 0, NULL, 0, &c4), CVT_ERR_NONE);
            CHECK_EQ_INT(cvt_config_parse("t5", t5, n5, NULL, 0, NULL, 0, NULL, 0, &c5), CVT_ERR_NONE);
            check_same_model(names[i], &c4, &c5);
            CHECK_MSG(c5.rope_theta == theta[i], "%s: rope_theta %g, want %g", names[i], c5.rope_theta, theta[i]);
            CHECK_EQ_STR(c5.torch_dtype, "float16");
            if (i == 0) {
                CHECK_EQ_INT(c5.rope_scaling.type, QS_ROPE_LLAMA3);
                CHECK(c5.rope_scaling.factor == 8.0 && c5.rope_scaling.low_freq_factor == 1.0 &&
                      c5.rope_scaling.high_freq_factor == 4.0);
                CHECK_EQ_INT(c5.rope_scaling.original_max_position_embeddings, 8192);
            }
            cvt_config_free(&c4);
            cvt_config_free(&c5);
        }
        free(t4);
        free(t5);
    }
}

/* The RoPE spellings one at a time (convert/cvt_config.c parse_rope; transformers 5
 * modeling_rope_utils.py RotaryEmbeddingConfigMixin): what each gives, and the refusals when two
 * spellings disagree or a RoPE the runtime does not run is asked for. */
static void test_rope_spellings(void)
{
#define L3 "\"rope_type\": \"llama3\", \"factor\": 8.0, \"low_freq_factor\": 1.0, \"high_freq_factor\": 4.0"
    static const struct {
        const char *cls, *extra;
        double theta;
        enum qs_rope_type type;
        double factor;
        int64_t omax;
    } ok[] = {
        /* the bug this reads: only rope_parameters, as transformers 5 saves a Llama-3 config */
        {"LlamaForCausalLM", ", \"rope_parameters\": {\"rope_theta\": 500000.0, \"rope_type\": \"default\"}", 500000.0,
         QS_ROPE_DEFAULT, 0, 0},
        /* no theta anywhere: the class's default_theta */
        {"LlamaForCausalLM", ", \"rope_parameters\": {\"rope_type\": \"default\"}", 10000.0, QS_ROPE_DEFAULT, 0, 0},
        {"MixtralForCausalLM", ", \"rope_parameters\": {\"rope_type\": \"default\"}", 1e6, QS_ROPE_DEFAULT, 0, 0},
        /* both spellings agreeing */
        {"LlamaForCausalLM", ", \"rope_theta\": 500000.0, \"rope_parameters\": {\"rope_theta\": 500000.0}", 500000.0,
         QS_ROPE_DEFAULT, 0, 0},
        {"LlamaForCausalLM", ", \"rope_scaling\": {" L3 ", \"original_max_position_embeddings\": 8192}, \"rope_parameters\": {"
         L3 ", \"original_max_position_embeddings\": 8192, \"rope_theta\": 500000.0}", 500000.0, QS_ROPE_LLAMA3, 8.0, 8192},
        {"LlamaForCausalLM", ", \"rope_scaling\": null, \"rope_parameters\": {\"type\": \"linear\", \"factor\": 2.0}", 10000.0,
         QS_ROPE_LINEAR, 2.0, 0},
        {"LlamaForCausalLM", ", \"rope_scaling\": {\"rope_type\": \"default\"}, \"rope_parameters\": {\"rope_theta\": 1e6}", 1e6,
         QS_ROPE_DEFAULT, 0, 0},
        /* an empty rope_scaling says nothing (transformers 5: `rope_scaling or rope_parameters`) */
        {"LlamaForCausalLM", ", \"rope_scaling\": {}, \"rope_parameters\": {\"type\": \"linear\", \"factor\": 2.0}", 10000.0,
         QS_ROPE_LINEAR, 2.0, 0},
        /* rope_theta inside transformers 4's dict (a transformers 5 alias written back) */
        {"LlamaForCausalLM", ", \"rope_scaling\": {\"rope_type\": \"linear\", \"factor\": 4.0, \"rope_theta\": 1e6}", 1e6,
         QS_ROPE_LINEAR, 4.0, 0},
        /* llama3 without original_max_position_embeddings: the top-level key, else
         * max_position_embeddings (standardize_rope_params) */
        {"LlamaForCausalLM", ", \"max_position_embeddings\": 131072, \"rope_parameters\": {" L3 "}", 10000.0, QS_ROPE_LLAMA3,
         8.0, 131072},
        {"LlamaForCausalLM", ", \"original_max_position_embeddings\": 8192, \"rope_parameters\": {" L3 "}", 10000.0,
         QS_ROPE_LLAMA3, 8.0, 8192},
        {"LlamaForCausalLM", ", \"original_max_position_embeddings\": 8192, \"rope_scaling\": {" L3
         ", \"original_max_position_embeddings\": 8192}", 10000.0, QS_ROPE_LLAMA3, 8.0, 8192},
        /* partial_rotary_factor 1 is plain RoPE */
        {"Qwen2ForCausalLM", ", \"partial_rotary_factor\": 1.0, \"rope_parameters\": {\"partial_rotary_factor\": 1.0, "
         "\"rope_theta\": 1e6}", 1e6, QS_ROPE_DEFAULT, 0, 0},
    };
    struct cvt_hf_config cfg;
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        enum cvt_err e = fam_parse(ok[i].cls, ok[i].extra, &cfg);
        CHECK_MSG(e == CVT_ERR_NONE, "rope case %zu refused: %s", i, qs_log_last());
        if (e)
            continue;
        CHECK_MSG(cfg.rope_theta == ok[i].theta, "rope case %zu: theta %g, want %g", i, cfg.rope_theta, ok[i].theta);
        CHECK_MSG(cfg.rope_scaling.type == ok[i].type && cfg.rope_scaling.factor == ok[i].factor &&
                      cfg.rope_scaling.original_max_position_embeddings == ok[i].omax,
                  "rope case %zu: type %d factor %g L %lld", i, (int)cfg.rope_scaling.type, cfg.rope_scaling.factor,
                  (long long)cfg.rope_scaling.original_max_position_embeddings);
        cvt_config_free(&cfg);
    }
#define LL "LlamaForCausalLM"
    static const struct refusal bad[] = {
        {LL, ", \"rope_theta\": 10000.0, \"rope_parameters\": {\"rope_theta\": 500000.0}", "rope_parameters.rope_theta 500000",
         "rope_theta 10000 disagree", CVT_ERR_CONFIG},
        {LL, ", \"rope_scaling\": {\"rope_type\": \"linear\", \"factor\": 2.0, \"rope_theta\": 1e6}, \"rope_parameters\": "
         "{\"rope_type\": \"linear\", \"factor\": 2.0, \"rope_theta\": 5e5}", "rope_parameters.rope_theta", "rope_scaling.rope_theta",
         CVT_ERR_CONFIG},
        {LL, ", \"rope_scaling\": {" L3 ", \"original_max_position_embeddings\": 8192}, \"rope_parameters\": "
         "{\"rope_type\": \"default\", \"rope_theta\": 500000.0}", "rope_scaling (llama3 factor 8", "rope_parameters (default)",
         CVT_ERR_CONFIG},
        {LL, ", \"rope_scaling\": {\"type\": \"linear\", \"factor\": 2.0}, \"rope_parameters\": {\"type\": \"linear\", \"factor\": 4.0}",
         "linear factor 2", "linear factor 4", CVT_ERR_CONFIG},
        {LL, ", \"original_max_position_embeddings\": 4096, \"rope_parameters\": {" L3 ", \"original_max_position_embeddings\": 8192}",
         "rope_parameters.original_max_position_embeddings 8192", "original_max_position_embeddings 4096", CVT_ERR_CONFIG},
        {LL, ", \"rope_parameters\": {\"rope_type\": \"linear\", \"type\": \"llama3\", \"factor\": 2.0}", "rope_parameters rope_type",
         "disagree", CVT_ERR_CONFIG},
        {LL, ", \"rope_parameters\": {\"full_attention\": {\"rope_type\": \"default\", \"rope_theta\": 1e6}, "
         "\"sliding_attention\": {\"rope_type\": \"default\", \"rope_theta\": 1e4}}", "per-layer-type", "full_attention",
         CVT_ERR_UNSUPPORTED},
        {LL, ", \"rope_parameters\": {\"rope_type\": \"default\", \"rope_theta\": 1e6, \"partial_rotary_factor\": 0.5}",
         "partial_rotary_factor 0.5", "not supported", CVT_ERR_UNSUPPORTED},
        {LL, ", \"partial_rotary_factor\": 0.25", "partial_rotary_factor 0.25", "not supported", CVT_ERR_UNSUPPORTED},
        {LL, ", \"partial_rotary_factor\": 1.0, \"rope_parameters\": {\"partial_rotary_factor\": 0.5}", "partial_rotary_factor 0.5",
         "disagree", CVT_ERR_CONFIG},
        {LL, ", \"rope_parameters\": {\"rope_type\": \"yarn\", \"factor\": 4.0, \"rope_theta\": 1e6}", "rope_parameters type \"yarn\"",
         "not supported", CVT_ERR_UNSUPPORTED},
        {LL, ", \"rope_parameters\": {\"rope_type\": \"linear\"}", "rope_parameters: required key \"factor\"", "config.json",
         CVT_ERR_CONFIG},
        {LL, ", \"rope_parameters\": {\"rope_theta\": \"1e6\"}", "rope_parameters: \"rope_theta\" must be", "got \"1e6\"",
         CVT_ERR_CONFIG},
        {LL, ", \"rope_parameters\": [1]", "\"rope_parameters\" must be null or an object", "config.json", CVT_ERR_CONFIG},
        {LL, ", \"rope_parameters\": {\"rope_theta\": 0}", "\"rope_theta\" must be a number in (0", "got 0", CVT_ERR_CONFIG},
    };
    check_refusals("rope", bad, sizeof bad / sizeof bad[0]);
#undef LL
#undef L3
}

/* --- directory level ------------------------------------------------------------------------------- */

/* The tensors of the directory tests: a GEMM q_proj [256, 128] (G 128), an F32 embedding
 * [64, 4] of i - 100 and a BF16 norm [4] of 1, 65536, 73728, NaN. */
struct dir_model {
    struct canon c;
    struct st_tensor t[16];
    void *keep[8];
    int nkeep, nt;
    float emb[64 * 4];
    uint16_t bf[4];
};

static void dir_model_init(struct dir_model *m)
{
    static const uint16_t bf[4] = {0x3f80, 0x4780, 0x4790, 0x7fc0};
    memset(m, 0, sizeof(*m));
    canon_rand(&m->c, 256, 128, 128);
    m->nt = pack_variant(&m->c, CVT_VARIANT_GEMM, "model.layers.0.self_attn.q_proj", false, false, m->t, m->keep,
                         &m->nkeep);
    for (int i = 0; i < 64 * 4; i++)
        m->emb[i] = (float)i - 100.0f;
    memcpy(m->bf, bf, sizeof(bf));
    m->t[m->nt++] = (struct st_tensor){"model.embed_tokens.weight", "F32", 2, {64, 4}, m->emb, sizeof m->emb};
    m->t[m->nt++] = (struct st_tensor){"model.norm.weight", "BF16", 1, {4}, m->bf, sizeof m->bf};
}

static void dir_model_free(struct dir_model *m)
{
    for (int i = 0; i < m->nkeep; i++)
        free(m->keep[i]);
    canon_free(&m->c);
}

static void test_directory(void)
{
    static struct dir_model m;
    dir_model_init(&m);
    const struct st_tensor *t = m.t;
    const float *emb = m.emb;
    int nt = m.nt;
    char *d = mkdir_tmp("dir-single");
    char dir[512];
    snprintf(dir, sizeof dir, "%s", d);
    write_config(dir, 128, "gemm", NULL);
    struct buf b = st_build(t, nt);
    write_file(dir, "model.safetensors", b.p, b.n);
    free(b.p);
    write_file(dir, "tokenizer.json", "{\"model\": {}}", 13);
    struct cvt_source *src = NULL;
    CHECK_EQ_INT(cvt_source_open(dir, &src), CVT_ERR_NONE);
    if (src) {
        CHECK_EQ_INT(cvt_source_container(src), CVT_CONTAINER_SAFETENSORS);
        CHECK_EQ_INT(cvt_source_n_tensors(src), nt);
        CHECK_EQ_INT(cvt_source_n_tokenizer_files(src), 1);
        CHECK_EQ_STR(cvt_source_tokenizer_file(src, 0)->name, "tokenizer.json");
        CHECK_EQ_INT(cvt_source_total_bytes(src), cvt_source_file(src, 0)->size);
        const struct cvt_src_tensor *e = cvt_source_find(src, "model.embed_tokens.weight");
        CHECK(e && e->dtype == CVT_DT_F32 && e->numel == 256);
        CHECK(cvt_source_find(src, "model.embed_tokens") == NULL);
        uint16_t h[256];
        float f[256];
        if (e) {
            CHECK_EQ_INT(cvt_source_read_f16(src, e, 4, 8, h), CVT_ERR_NONE);
            CHECK(h2f(h[0]) == -96.0f && h2f(h[7]) == -89.0f);
            CHECK_EQ_INT(cvt_source_read_f32(src, e, 0, 256, f), CVT_ERR_NONE);
            CHECK(f[255] == 155.0f);
            CHECK_EQ_INT(cvt_source_read(src, e, f, sizeof f), CVT_ERR_NONE);
            CHECK(memcmp(f, emb, sizeof m.emb) == 0);
            qs_log_set_quiet(true);
            CHECK_EQ_INT(cvt_source_read(src, e, f, 16), CVT_ERR_ARG);
            CHECK_EQ_INT(cvt_source_read_f32(src, e, 250, 7, f), CVT_ERR_ARG);
            qs_log_set_quiet(false);
        }
        const struct cvt_src_tensor *nw = cvt_source_find(src, "model.norm.weight");
        if (nw) {
            qs_log_set_quiet(true);
            CHECK_EQ_INT(cvt_source_read_f16(src, nw, 0, 1, h), CVT_ERR_NONE);
            CHECK_EQ_INT(h[0], 0x3c00);
            CHECK_EQ_INT(cvt_source_read_f16(src, nw, 1, 1, h), CVT_ERR_RANGE); /* 65536 */
            CHECK(strstr(qs_log_last(), "model.norm.weight") && strstr(qs_log_last(), "element 1"));
            CHECK_EQ_INT(cvt_source_read_f32(src, nw, 0, 4, f), CVT_ERR_NAN);
            CHECK(strstr(qs_log_last(), "element 3") != NULL);
            const struct cvt_src_tensor *qw = cvt_source_find(src, "model.layers.0.self_attn.q_proj.qweight");
            CHECK(qw && cvt_source_read_f32(src, qw, 0, 1, f) == CVT_ERR_DTYPE);
            qs_log_set_quiet(false);
        }
        cvt_source_close(src);
    }
    qs_log_set_quiet(true);
    /* qweight but no quant config */
    static const char plain_cfg[] = "{\"architectures\": [\"LlamaForCausalLM\"], \"hidden_size\": 256, \"intermediate_size\": 512, "
                                    "\"num_hidden_layers\": 1, \"num_attention_heads\": 4, \"vocab_size\": 64}";
    write_file(dir, "config.json", plain_cfg, strlen(plain_cfg));
    CHECK_EQ_INT(cvt_source_open(dir, &src), CVT_ERR_CONFIG);
    CHECK(src == NULL);
    CHECK(strstr(qs_log_last(), "quant config") != NULL);
    /* ... fixed by a quant_config.json */
    static const char qc[] = "{\"zero_point\": true, \"q_group_size\": 128, \"w_bit\": 4, \"version\": \"GEMM\"}";
    write_file(dir, "quant_config.json", qc, strlen(qc));
    CHECK_EQ_INT(cvt_source_open(dir, &src), CVT_ERR_NONE);
    cvt_source_close(src);
    /* a second unindexed .safetensors */
    write_file(dir, "extra.safetensors", "x", 1);
    CHECK_EQ_INT(cvt_source_open(dir, &src), CVT_ERR_INDEX);
    rm_file(dir, "extra.safetensors");
    /* broken tokenizer JSON */
    write_file(dir, "tokenizer_config.json", "{oops", 5);
    CHECK_EQ_INT(cvt_source_open(dir, &src), CVT_ERR_JSON);
    CHECK(strstr(qs_log_last(), "tokenizer_config.json") != NULL);
    rm_file(dir, "tokenizer_config.json");
    /* no weights at all; no config; not a directory */
    rm_file(dir, "model.safetensors");
    CHECK_EQ_INT(cvt_source_open(dir, &src), CVT_ERR_MISSING_TENSOR);
    rm_file(dir, "config.json");
    CHECK_EQ_INT(cvt_source_open(dir, &src), CVT_ERR_CONFIG);
    CHECK_EQ_INT(cvt_source_open("/nonexistent/qshard-test", &src), CVT_ERR_IO);
    qs_log_set_quiet(false);
    dir_model_free(&m);
}

/* Sharded: an index naming two shards; then broken in each way. */
static void test_index(void)
{
    static struct dir_model m;
    dir_model_init(&m);
    const struct st_tensor *t = m.t;
    const struct canon c = m.c;
    int nt = m.nt;
    struct cvt_source *src = NULL;
    qs_log_set_quiet(true);
    char sd[512];
    snprintf(sd, sizeof sd, "%s", mkdir_tmp("dir-sharded"));
    write_config(sd, 128, "gemm", NULL);
    struct buf s1 = st_build(t, 3), s2 = st_build(t + 3, nt - 3);
    write_file(sd, "model-00001-of-00002.safetensors", s1.p, s1.n);
    write_file(sd, "model-00002-of-00002.safetensors", s2.p, s2.n);
    char idx[2048];
#define IDX_FMT "{\"metadata\": {\"total_size\": 1}, \"weight_map\": {\"%s\": \"%s\", \"%s\": \"%s\", \"%s\": \"%s\", " \
                "\"%s\": \"%s\", \"%s\": \"%s\"%s}}"
    const char *f1 = "model-00001-of-00002.safetensors", *f2 = "model-00002-of-00002.safetensors";
    snprintf(idx, sizeof idx, IDX_FMT, t[0].name, f1, t[1].name, f1, t[2].name, f1, t[3].name, f2, t[4].name, f2, "");
    write_file(sd, "model.safetensors.index.json", idx, strlen(idx));
    CHECK_EQ_INT(cvt_source_open(sd, &src), CVT_ERR_NONE);
    if (src) {
        CHECK_EQ_INT(cvt_source_container(src), CVT_CONTAINER_SAFETENSORS_SHARDED);
        CHECK_EQ_INT(cvt_source_n_files(src), 2);
        CHECK_EQ_INT(cvt_source_total_bytes(src), s1.n + s2.n);
        struct cvt_awq_linear lin;
        CHECK_EQ_INT(cvt_awq_load(src, cvt_source_config(src), "model.layers.0.self_attn.q_proj", 256, 128, 0, 256, 0, 128, &lin),
                     CVT_ERR_NONE);
        CHECK(lin.q && memcmp(lin.q, c.q, 256 * 128) == 0);
        cvt_awq_linear_free(&lin);
        cvt_source_close(src);
    }
    /* wrong shard */
    snprintf(idx, sizeof idx, IDX_FMT, t[0].name, f1, t[1].name, f2, t[2].name, f1, t[3].name, f2, t[4].name, f2, "");
    write_file(sd, "model.safetensors.index.json", idx, strlen(idx));
    CHECK_EQ_INT(cvt_source_open(sd, &src), CVT_ERR_INDEX);
    CHECK(strstr(qs_log_last(), t[1].name) != NULL);
    /* tensor not listed */
    snprintf(idx, sizeof idx, "{\"weight_map\": {\"%s\": \"%s\", \"%s\": \"%s\", \"%s\": \"%s\", \"%s\": \"%s\"}}", t[0].name, f1,
             t[1].name, f1, t[2].name, f1, t[3].name, f2);
    write_file(sd, "model.safetensors.index.json", idx, strlen(idx));
    CHECK_EQ_INT(cvt_source_open(sd, &src), CVT_ERR_INDEX);
    CHECK(strstr(qs_log_last(), t[4].name) != NULL);
    /* listed but absent */
    snprintf(idx, sizeof idx, IDX_FMT, t[0].name, f1, t[1].name, f1, t[2].name, f1, t[3].name, f2, t[4].name, f2,
             ", \"ghost.weight\": \"model-00002-of-00002.safetensors\"");
    write_file(sd, "model.safetensors.index.json", idx, strlen(idx));
    CHECK_EQ_INT(cvt_source_open(sd, &src), CVT_ERR_INDEX);
    CHECK(strstr(qs_log_last(), "ghost.weight") != NULL);
    /* path traversal in a shard name */
    snprintf(idx, sizeof idx, IDX_FMT, t[0].name, "../x.safetensors", t[1].name, f1, t[2].name, f1, t[3].name, f2, t[4].name, f2, "");
    write_file(sd, "model.safetensors.index.json", idx, strlen(idx));
    CHECK_EQ_INT(cvt_source_open(sd, &src), CVT_ERR_INDEX);
    /* a shard the index does not name */
    snprintf(idx, sizeof idx, IDX_FMT, t[0].name, f1, t[1].name, f1, t[2].name, f1, t[3].name, f2, t[4].name, f2, "");
    write_file(sd, "model.safetensors.index.json", idx, strlen(idx));
    write_file(sd, "model-00003-of-00002.safetensors", s2.p, s2.n);
    CHECK_EQ_INT(cvt_source_open(sd, &src), CVT_ERR_INDEX);
    CHECK(strstr(qs_log_last(), "model-00003-of-00002.safetensors") != NULL);
    rm_file(sd, "model-00003-of-00002.safetensors");
    /* missing shard */
    rm_file(sd, f2);
    CHECK_EQ_INT(cvt_source_open(sd, &src), CVT_ERR_INDEX);
    CHECK(strstr(qs_log_last(), f2) != NULL);
    /* index not JSON */
    write_file(sd, "model.safetensors.index.json", "[]", 2);
    CHECK_EQ_INT(cvt_source_open(sd, &src), CVT_ERR_JSON);
    qs_log_set_quiet(false);
    free(s1.p);
    free(s2.p);
    dir_model_free(&m);
}

int main(void)
{
    T_INIT("cvt_config");
    if (!t_src_tmp("cvt-config"))
        return 1;
    test_configs();
    test_config_spellings();
    test_config_gptq_ct();
    test_arch_defaults();
    test_family_keys();
    test_falcon_keys();
    test_mpt_keys();
    test_gemma_keys();
    test_rope_t5_files();
    test_rope_spellings();
    test_directory();
    test_index();
    return t_src_done();
}

/*
 * fuzz_config.c - libFuzzer target for the config and index readers (convert/cvt_config.c
 * cvt_config_parse, convert/cvt_source.c cvt_index_parse).
 *
 * Input modes, chosen by an optional two-byte prefix "<m>\n":
 *   "q\n" + text  quant_config.json       (next to a fixed valid llama config.json)
 *   "z\n" + text  quantize_config.json    (likewise)
 *   "g\n" + text  generation_config.json  (likewise)
 *   "i\n" + text  model.safetensors.index.json
 *   otherwise     the whole input is config.json
 * so the seed corpus can hold the real files unchanged (tests/data/fuzz/fuzz_config/, from
 * HuggingFace repos, see tests/data/fuzz/README.md) plus prefixed copies. On success the parsed
 * config's invariants are asserted. Logging is quiet. Build and run: `make fuzz`.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cvt_src.h"     /* cvt_config_parse */
#include "cvt_src_int.h" /* cvt_index_parse */
#include "qs_log.h"      /* qs_log_set_quiet */

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const char base[] =
    "{\"architectures\": [\"LlamaForCausalLM\"], \"model_type\": \"llama\", \"hidden_size\": 4096, "
    "\"intermediate_size\": 11008, \"num_hidden_layers\": 32, \"num_attention_heads\": 32, "
    "\"vocab_size\": 32000, \"bos_token_id\": 1, \"eos_token_id\": 2}";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    qs_log_set_quiet(true);
    char mode = 0;
    const char *text = (const char *)data;
    if (size >= 2 && data[1] == '\n' && strchr("qzgi", data[0]) && data[0]) {
        mode = (char)data[0];
        text += 2;
        size -= 2;
    }
    if (mode == 'i') {
        struct cvt_index idx;
        if (cvt_index_parse("fuzz", "model.safetensors.index.json", text, size, ".safetensors", &idx) == CVT_ERR_NONE) {
            if (!idx.n_shards || !idx.weight_map)
                abort();
            for (size_t i = 0; i < idx.n_shards; i++)
                if (strchr(idx.shards[i], '/') || idx.shards[i][0] == '.')
                    abort();
            cvt_index_free(&idx);
        }
        return 0;
    }
    struct cvt_hf_config cfg;
    enum cvt_err e = mode == 0 ? cvt_config_parse("fuzz", text, size, NULL, 0, NULL, 0, NULL, 0, &cfg)
                   : mode == 'q' ? cvt_config_parse("fuzz", base, sizeof base - 1, text, size, NULL, 0, NULL, 0, &cfg)
                   : mode == 'z' ? cvt_config_parse("fuzz", base, sizeof base - 1, NULL, 0, text, size, NULL, 0, &cfg)
                                 : cvt_config_parse("fuzz", base, sizeof base - 1, NULL, 0, NULL, 0, text, size, &cfg);
    if (e != CVT_ERR_NONE) {
        if (cfg.config_json || cfg.quant.n_modules_to_not_convert)
            abort(); /* nothing left behind */
        return 0;
    }
    if (cfg.hidden_size <= 0 || cfg.num_attention_heads <= 0 || cfg.num_key_value_heads <= 0 || cfg.head_dim <= 0 ||
        cfg.num_attention_heads % cfg.num_key_value_heads || cfg.vocab_size <= 0 || cfg.n_eos > CVT_MAX_EOS ||
        !cfg.config_json || (cfg.quant.from && cfg.quant.w_bit != 4) || !cfg.arch)
        abort();
    /* rope_scaling as format/qs_json.h promises: positive factors, llama3 high > low */
    if (cfg.rope_scaling.type != QS_ROPE_DEFAULT &&
        (!(cfg.rope_scaling.factor > 0) ||
         (cfg.rope_scaling.type == QS_ROPE_LLAMA3 &&
          (!(cfg.rope_scaling.high_freq_factor > cfg.rope_scaling.low_freq_factor) ||
           !(cfg.rope_scaling.low_freq_factor > 0) ||
           cfg.rope_scaling.original_max_position_embeddings < 1))))
        abort();
    for (int i = 0; i < cfg.n_eos; i++)
        if (cfg.eos_token_id[i] < 0 || cfg.eos_token_id[i] >= cfg.vocab_size)
            abort();
    cvt_config_free(&cfg);
    return 0;
}

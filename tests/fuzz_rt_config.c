/*
 * fuzz_rt_config.c - libFuzzer target for the runtime's model-config reader
 * (runtime/rt_config.c rt_config_parse): the config section of a rank file is hostile input.
 * On success every invariant the model code relies on is asserted (TP split, padding, ranges,
 * eos ids); on failure the output must be zeroed. Seeds: tests/data/fuzz/fuzz_rt_config/, the
 * config sections of fixture conversions (`qshard convert tests/data/models/<m> --tp 2`, rank
 * 1, printed by `qshard inspect --json`). Build and run: `make fuzz`.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "qs_log.h" /* qs_log_set_quiet */
#include "rt.h"     /* rt_config_parse */

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    qs_log_set_quiet(true);
    struct rt_config c;
    if (rt_config_parse((const char *)data, size, "fuzz", &c) != RT_ERR_NONE) {
        if (c.hidden_size || c.world_size || c.arch)
            abort(); /* a failed parse leaves nothing half-filled */
        return 0;
    }
    int ws = c.world_size;
    if (c.hidden_size < 1 || c.n_layers < 1 || c.head_dim < 2 || c.head_dim % 2 || ws < 1 ||
        c.rank < 0 || c.rank >= ws || c.n_heads % c.n_kv_heads || c.heads_per_rank * ws != c.n_heads ||
        c.kv_heads_per_rank < 1 || c.intermediate_per_rank * (long long)ws != c.intermediate_size_padded ||
        c.intermediate_size_padded < c.intermediate_size ||
        (long long)c.vocab_size_per_rank * ws < c.vocab_size ||
        (long long)(c.vocab_size_per_rank - 1) * ws >= c.vocab_size || c.w_bit != 4 ||
        c.group_size < 16 || c.group_size % 16 || !(c.rms_norm_eps > 0) || !(c.rope_theta > 0) ||
        c.n_eos < 0 || c.n_eos > RT_MAX_EOS || c.bos_token_id >= c.vocab_size ||
        (c.n_experts > 0 && (c.n_experts_per_tok < 1 || c.n_experts_per_tok > c.n_experts)) ||
        (long long)(c.n_heads + 2LL * c.n_kv_heads) * c.head_dim > (1LL << 24))
        abort();
    if (ws <= c.n_kv_heads ? c.kv_heads_per_rank * ws != c.n_kv_heads
                           : c.kv_heads_per_rank != 1 || c.kv_head_replicas * c.n_kv_heads != ws)
        abort();
    for (int i = 0; i < c.n_eos; i++)
        if (c.eos_token_ids[i] < 0 || c.eos_token_ids[i] >= c.vocab_size)
            abort();
    return 0;
}

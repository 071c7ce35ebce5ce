/*
 * gpu_test_ops_rows.cuh - k_sample_rows (every row of a decode step in one launch) for
 * build/gpu_test_ops, area sample (kept apart so that gpu_test_ops.cu stays under the size
 * rule). Each row of a batch of fresh random logit rows with its own parameters (greedy with and
 * without a repetition penalty, temperature, top-k, top-p, min-p, mixed) and its own draw: the
 * batched id must be k_sample's id for that row alone (the same device code; only the general
 * top-p path may differ where a boundary is within rounding, its masses being added with
 * atomics), and the greedy rows' ids must be rt_sampler_next's (runtime/rt_sample.c, the
 * reference). Included once, by gpu_test_ops.cu, after tests/gpu_t.cuh and rt_sample.h.
 */
#ifndef QS_GPU_TEST_OPS_ROWS_CUH
#define QS_GPU_TEST_OPS_ROWS_CUH

#include "gpu_t.cuh"
#include "rt_sample.h"

static void test_sample_rows(void)
{
    const int V = 32000, n = 67;
    const size_t stride = V + 40; /* rows further apart than the vocabulary */
    std::vector<float> lg((size_t)n * stride);
    for (auto &x : lg) x = rng_uniform(-8.0f, 8.0f);
    std::vector<struct k_sample_row> rows(n);
    std::vector<std::vector<uint8_t>> seen(n, std::vector<uint8_t>((V + 7) / 8, 0));
    float *dl = dev_upload(lg);
    uint8_t *dseen = dev_poisoned<uint8_t>((size_t)n * ((V + 7) / 8));
    int32_t *dids = dev_poisoned<int32_t>(n), *did1 = dev_poisoned<int32_t>(1);
    void *h_args = nullptr, *d_args = nullptr;
    TCUDA(cudaMallocHost(&h_args, k_sample_rows_args_bytes(n)));
    TCUDA(cudaMalloc(&d_args, k_sample_rows_args_bytes(n)));
    for (int i = 0; i < n; ++i) {
        struct k_sample_params p = {0.0f, 0, 1.0f, 0.0f, 1.0f};
        switch (i % 6) {
        case 0: break;                                        /* greedy */
        case 1: p.repeat_penalty = 1.3f; break;               /* greedy, penalised history */
        case 2: p.temperature = 0.8f; p.top_k = 40; break;
        case 3: p.temperature = 1.0f; p.top_p = 0.9f; break;
        case 4: p.temperature = 0.7f; p.min_p = 0.05f; break;
        default: p.temperature = 1.1f; p.top_k = 500; p.top_p = 0.95f; p.repeat_penalty = 1.1f;
        }
        rows[i].p = p;
        rows[i].u = rng_uniform(0.0f, 0.999f);
        rows[i].seen = nullptr;
        if (p.repeat_penalty != 1.0f) {
            for (int h = 0; h < 30; ++h) {
                const int id = (int)(rng_u64() % (uint64_t)V);
                seen[i][id / 8] |= (uint8_t)(1u << (id % 8));
            }
            uint8_t *ds = dseen + (size_t)i * ((V + 7) / 8);
            TCUDA(cudaMemcpy(ds, seen[i].data(), seen[i].size(), cudaMemcpyHostToDevice));
            rows[i].seen = ds;
        }
    }
    CHECK_EQ_INT(k_sample_rows(dids, dl, stride, n, V, rows.data(), h_args, d_args, nullptr),
                 K_ERR_NONE);
    const std::vector<int32_t> got = dev_download(dids, n);
    int differ = 0;
    for (int i = 0; i < n; ++i) {
        CHECK_EQ_INT(k_sample(did1, nullptr, dl + (size_t)i * stride, V, rows[i].seen, &rows[i].p,
                              rows[i].p.temperature > 0.0f ? rows[i].u : 0.0, nullptr), K_ERR_NONE);
        const int32_t one = dev_download(did1, 1)[0];
        const bool general_top_p = rows[i].p.top_p < 1.0f && rows[i].p.top_k == 0;
        if (got[i] != one) {
            differ++;
            CHECK_MSG(general_top_p, "sample_rows row %d (case %d): id %d, k_sample alone %d", i,
                      i % 6, got[i], one);
        } else {
            CHECK(got[i] >= 0 && got[i] < V);
        }
        if (rows[i].p.temperature == 0.0f) { /* greedy: the reference's id */
            struct rt_sample_params rp = rt_sample_params_default();
            rp.temperature = 0.0f;
            rp.repeat_penalty = rows[i].p.repeat_penalty;
            struct rt_sampler s = {};
            CHECK(rt_sampler_init(&s, &rp, V) == RT_SAMPLE_ERR_NONE);
            for (int id = 0; id < V; ++id)
                if (seen[i][id / 8] >> (id % 8) & 1) rt_sampler_accept(&s, id);
            int32_t ref = -1;
            CHECK(rt_sampler_next(&s, lg.data() + (size_t)i * stride, V, &ref) == RT_SAMPLE_ERR_NONE);
            CHECK_MSG(got[i] == ref, "sample_rows greedy row %d: id %d, reference %d", i, got[i], ref);
            rt_sampler_free(&s);
        }
    }
    CHECK_MSG(differ * 20 <= n, "sample_rows: %d of %d rows differ from k_sample alone", differ, n);
    qs_log_set_quiet(true);
    rows[3].u = 1.0; /* a sampled row's draw outside [0, 1): refused, naming the row */
    CHECK_EQ_INT(k_sample_rows(dids, dl, stride, n, V, rows.data(), h_args, d_args, nullptr),
                 K_ERR_ARG);
    CHECK(strstr(qs_log_last(), "row 3") != nullptr);
    CHECK_EQ_INT(k_sample_rows(dids, dl, V - 1, n, V, rows.data(), h_args, d_args, nullptr),
                 K_ERR_SHAPE);
    CHECK_EQ_INT(k_sample_rows(dids, dl, stride, 0, V, rows.data(), h_args, d_args, nullptr),
                 K_ERR_SHAPE);
    qs_log_set_quiet(false);
    TCUDA(cudaFree(dl)); TCUDA(cudaFree(dseen)); TCUDA(cudaFree(dids)); TCUDA(cudaFree(did1));
    TCUDA(cudaFree(d_args)); TCUDA(cudaFreeHost(h_args));
}

#endif /* QS_GPU_TEST_OPS_ROWS_CUH */

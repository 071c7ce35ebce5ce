/*
 * cmd_serve.c - `qshard serve MODEL [options]`: the options into struct srv_opts, then
 * srv_run (tools/serve/serve.h).
 */
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "cmd.h"
#include "serve.h"

static const char k_usage[] =
    "usage: qshard serve MODEL [--host 127.0.0.1] [--port 8000] [--api-key KEY]\n"
    "                    [--served-model-name NAME] [--max-num-seqs N] [--max-queue N]\n"
    "                    [--max-batch-tokens N] [--kv-cache-gb G] [--device cpu|cuda]\n"
    "                    [--timeout S] [--chat-template F] [--ctx N]\n"
    "\n"
    "An OpenAI-compatible HTTP server on the batching engine: POST /v1/completions,\n"
    "POST /v1/chat/completions (streaming with \"stream\": true), GET /v1/models, GET /health\n"
    "(503 while the model loads, then 200), GET /metrics (Prometheus), POST /tokenize,\n"
    "POST /detokenize. Every connection's requests are batched together. docs/SERVE.md has\n"
    "the fields, the errors and the metrics.\n"
    "\n";
static const char k_trailer[] =
    "Stops on SIGINT or SIGTERM: no new requests, running ones get --shutdown-timeout seconds,\n"
    "then exit 0.\n"
    "exit codes: 0 stopped cleanly, 1 usage or the address cannot be bound, 2 bad model file,\n"
    "3 runtime failure (GPU, memory), 4 I/O error\n";

int cmd_serve(int argc, char **argv)
{
    struct cli_args a;
    int rc = cli_parse(CLI_SERVE, "qshard serve", k_usage, k_trailer, argc, argv, &a);
    if (rc)
        return rc == CLI_HELP ? QS_EXIT_OK : rc;
    if (a.n_pos != 1)
        return cli_usage_error("expected one MODEL argument, got %d", a.n_pos);
    struct srv_opts o = {
        .session = {.path = a.pos[0], .model = cli_model_opts(&a)},
        .host = a.host ? a.host : "127.0.0.1",
        .port = (int)a.port,
        .api_key = a.api_key ? a.api_key : getenv("QSHARD_API_KEY"),
        .model_name = a.served_model_name ? a.served_model_name : a.pos[0],
        .max_queue = (int)a.max_queue,
        .max_batch_tokens = (int)a.max_batch_tokens,
        .timeout_s = (int)a.timeout,
        .max_body = (size_t)a.max_body_mb << 20,
        .shutdown_timeout_s = (int)a.shutdown_timeout,
        .seed = a.seed,
    };
    if (o.api_key && !o.api_key[0])
        return cli_usage_error("--api-key (or QSHARD_API_KEY) must not be empty");
    if (!o.model_name[0])
        return cli_usage_error("--served-model-name must not be empty");
    const bool cuda = cli_resolve_device(&o.session.model) == RT_DEVICE_CUDA;
    o.session.model.n_seqs = a.max_num_seqs > 0 ? (int)a.max_num_seqs : cuda ? 256 : 8;
    if (!(a.kv_cache_gb > 0))
        o.session.model.kv_mem_fraction = 0.9;
    if (a.chat_template)
        o.chat_family = rt_chat_family_parse(a.chat_template);
    const char *delay = getenv("QSHARD_DEBUG_LOAD_DELAY_MS");
    if (delay)
        o.load_delay_ms = atoi(delay);
    return srv_run(&o);
}

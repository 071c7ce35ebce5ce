/*
 * cli_table.c - the one option table of the qshard commands (tools/cli.h). Each option is
 * defined here once: names, kind, range, default, help, and the commands that take it (an
 * option whose meaning differs between commands, such as -n or --ctx, is one entry per
 * meaning, with disjoint command sets). Order within a section is the --help order.
 */
#include <float.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

#define MAX_N_PREDICT 16777216.0 /* -n upper bound (tokens, 2^24) */
#define MAX_CTX 16777216.0       /* --ctx upper bound (tokens, 2^24) */
#define F(field) offsetof(struct cli_args, field)

// --- custom parsers ------------------------------------------------------------------------

/* --stop STR, repeatable. */
static bool parse_stop(const struct cli_opt *o, const char *arg, struct cli_args *a,
                       const char **why)
{
    (void)o;
    if (!*arg) {
        *why = "empty";
        return false;
    }
    if (a->n_stops == RT_GEN_MAX_STOPS) {
        *why = "too many --stop strings";
        return false;
    }
    a->stops[a->n_stops++] = arg;
    return true;
}

/* "16,64,512" into out[] (at most CLI_MAX_LIST values in [0, hi]; a lone 0 means none unless
 * zero_ok, where 0 is a value like any other). */
static bool parse_list(const char *arg, long hi, bool zero_ok, long *out, int *n_out,
                       const char **why)
{
    int n = 0;
    *why = "not a list of lengths";
    for (const char *p = arg; *p;) {
        char buf[32], *end;
        size_t len = strcspn(p, ",");
        if (len == 0 || len >= sizeof(buf) || n == CLI_MAX_LIST)
            return false;
        memcpy(buf, p, len);
        buf[len] = '\0';
        long v = strtol(buf, &end, 10);
        if (*end || buf[0] == '-' || buf[0] == '+' || v < 0 || v > hi)
            return false;
        out[n++] = v;
        p += len;
        if (*p == ',' && *++p == '\0')
            return false;
    }
    if (n == 0)
        return false;
    if (n == 1 && out[0] == 0 && !zero_ok)
        n = 0;
    for (int i = 0; i < n && !zero_ok; i++)
        if (out[i] == 0)
            return false;
    *n_out = n;
    return true;
}

static bool parse_pp(const struct cli_opt *o, const char *arg, struct cli_args *a,
                     const char **why)
{
    (void)o;
    return parse_list(arg, (long)MAX_CTX, false, a->pp, &a->n_pp, why);
}

static bool parse_tg(const struct cli_opt *o, const char *arg, struct cli_args *a,
                     const char **why)
{
    (void)o;
    return parse_list(arg, (long)MAX_N_PREDICT, false, a->tg, &a->n_tg, why);
}

static bool parse_conc(const struct cli_opt *o, const char *arg, struct cli_args *a,
                       const char **why)
{
    (void)o;
    return parse_list(arg, 65536, false, a->conc, &a->n_conc, why);
}

static bool parse_dp(const struct cli_opt *o, const char *arg, struct cli_args *a,
                     const char **why)
{
    (void)o;
    return parse_list(arg, (long)MAX_CTX, true, a->dp, &a->n_dp, why);
}

// --- the table -----------------------------------------------------------------------------

#define ALL_CMDS 0x7FFFu
#define LISTS "a comma-separated list of up to 16 lengths >= 1 (or 0 for none)"

const struct cli_opt cli_table[] = {
    /* run: the prompt and the output */
    {.lng = "prompt", .shrt = 'p', .kind = CLI_STR, .metavar = "TEXT", .cmds = CLI_RUN,
     .off = F(prompt), .help = "prompt text (UTF-8), encoded as HF tokenizer(text) does"},
    {.lng = "file", .shrt = 'f', .kind = CLI_STR, .metavar = "FILE", .cmds = CLI_RUN,
     .off = F(file), .help = "read the prompt text from FILE ('-': standard input)"},
    {.lng = "tokens", .kind = CLI_STR, .metavar = "1,2,3", .cmds = CLI_RUN | CLI_LOGITS,
     .off = F(tokens), .help = "prompt as token ids instead of text"},
    {.lng = "text", .kind = CLI_STR, .metavar = "TEXT", .cmds = CLI_LOGITS, .off = F(text),
     .help = "prompt text (needs the model's tokenizer)"},
    {.lng = "out", .shrt = 'o', .kind = CLI_STR, .metavar = "FILE", .cmds = CLI_LOGITS,
     .off = F(out), .help = "output .npy (written to a temp name, then renamed)"},
    {.lng = "n-predict", .shrt = 'n', .kind = CLI_INT, .metavar = "N", .cmds = CLI_RUN,
     .off = F(n_predict), .lo = -1, .hi = MAX_N_PREDICT, .def = "128",
     .must = "an integer in [-1, 16777216] (-1: until eos or a full context)",
     .help = "tokens to generate, 0..16777216; -1: until eos, a stop string or a full context"},
    {.lng = "print-ids", .kind = CLI_FLAG, .cmds = CLI_RUN, .off = F(print_ids),
     .help = "print the generated ids (comma-separated, one line) instead of text; the default "
             "for a model without a tokenizer"},
    {.lng = "json", .kind = CLI_FLAG, .cmds = CLI_RUN, .off = F(json),
     .help = "print one JSON object on stdout instead of the text: text, prompt and generated "
             "ids, finish reason, usage counts, timings"},
    {.lng = "logprobs", .kind = CLI_INT, .metavar = "N", .cmds = CLI_RUN, .off = F(logprobs),
     .lo = 1, .hi = RT_GEN_MAX_LOGPROBS,
     .help = "with --json: each generated token's log probability and the N most likely "
             "tokens, 1..20 (raw model distribution; sampled on the host)"},
    {.lng = "chat", .kind = CLI_FLAG, .cmds = CLI_RUN, .off = F(chat),
     .help = "format the prompt with the model's chat template (Llama-2, Llama-3, Mistral, "
             "ChatML, Gemma or Phi-3 family, from tokenizer_config.json)"},
    {.lng = "chat-template", .kind = CLI_CHOICE, .metavar = "F", .cmds = CLI_RUN,
     .off = F(chat_template), .choices = "llama2|llama3|mistral|chatml|qwen|gemma|phi3",
     .help = "force the family: llama2, llama3, mistral, chatml, gemma, phi3 (implies --chat)"},
    {.lng = "system", .kind = CLI_STR, .metavar = "TEXT", .cmds = CLI_RUN, .off = F(system),
     .help = "system message for --chat"},
    {.lng = "stop", .kind = CLI_CUSTOM, .metavar = "STR", .cmds = CLI_RUN, .parse = parse_stop,
     .must = "a non-empty string (at most 16 --stop)",
     .help = "stop when the text contains STR (repeatable, up to 16); generation also stops on "
             "every eos id of the model"},
    {.lng = "ignore-eos", .kind = CLI_FLAG, .cmds = CLI_RUN, .off = F(ignore_eos),
     .help = "keep generating past eos ids (for comparisons)"},
    {.lng = "no-echo", .kind = CLI_FLAG, .cmds = CLI_RUN, .off = F(no_echo),
     .help = "do not print the prompt before the continuation"},
    /* tokenize */
    {.lng = "text", .kind = CLI_STR, .metavar = "TEXT", .cmds = CLI_TOKENIZE, .off = F(text),
     .help = "text to encode (UTF-8); \"\" gives just BOS, if the tokenizer adds one (as HF "
             "tokenizer(\"\"))"},
    {.lng = "file", .shrt = 'f', .kind = CLI_STR, .metavar = "FILE", .cmds = CLI_TOKENIZE,
     .off = F(file), .help = "encode a file's contents ('-': standard input)"},
    {.lng = "decode", .kind = CLI_STR, .metavar = "1,2,3", .cmds = CLI_TOKENIZE,
     .off = F(decode), .help = "decode ids instead (as HF tokenizer.decode)"},
    {.lng = "skip-special-tokens", .kind = CLI_FLAG, .cmds = CLI_TOKENIZE,
     .off = F(skip_special),
     .help = "with --decode: leave out special tokens (HF skip_special_tokens=True)"},
    {.lng = "ids", .kind = CLI_FLAG, .cmds = CLI_TOKENIZE, .off = F(ids_list),
     .help = "print the ids on one line as [1, 2, 3]"},
    {.lng = "no-bos", .kind = CLI_FLAG, .cmds = CLI_RUN | CLI_LOGITS | CLI_TOKENIZE,
     .off = F(no_bos), .help = "do not add BOS (HF add_special_tokens=False)"},
    {.lng = "no-parse-special", .kind = CLI_FLAG, .cmds = CLI_RUN | CLI_TOKENIZE,
     .off = F(no_parse_special),
     .help = "treat \"<s>\", \"<|eot_id|>\"... in the text as plain text"},
    /* perplexity */
    {.lng = "file", .shrt = 'f', .kind = CLI_STR, .metavar = "FILE", .cmds = CLI_PERPLEXITY,
     .off = F(file), .help = "UTF-8 text ('-': standard input)"},
    {.lng = "tokens", .kind = CLI_STR, .metavar = "1,2,3", .cmds = CLI_PERPLEXITY,
     .off = F(tokens),
     .help = "token ids instead of text (models without a tokenizer; no BOS replacement)"},
    {.lng = "ctx", .kind = CLI_INT, .metavar = "N", .cmds = CLI_PERPLEXITY, .off = F(ctx),
     .lo = 4, .hi = MAX_CTX, .def = "512",
     .must = "an integer in [4, 16777216] (half of the chunk is scored)",
     .help = "chunk length in tokens, >= 4 (at most the model's)"},
    {.lng = "chunks", .kind = CLI_INT, .metavar = "N", .cmds = CLI_PERPLEXITY, .off = F(chunks),
     .lo = 1, .hi = INT32_MAX, .help = "evaluate at most N chunks (default: all)"},
    /* bench model */
    {.lng = "n-prompt", .shrt = 'p', .kind = CLI_CUSTOM, .metavar = "LIST",
     .cmds = CLI_BENCH_MODEL, .parse = parse_pp, .def = "512", .must = LISTS,
     .help = "prompt lengths, e.g. 16,64,512 (0: none)"},
    {.lng = "n-gen", .shrt = 'n', .kind = CLI_CUSTOM, .metavar = "LIST", .cmds = CLI_BENCH_MODEL,
     .parse = parse_tg, .def = "128", .must = LISTS, .help = "generation lengths (0: none)"},
    {.lng = "n-depth", .shrt = 'd', .kind = CLI_CUSTOM, .metavar = "LIST",
     .cmds = CLI_BENCH_MODEL, .parse = parse_dp, .def = "0",
     .must = "a comma-separated list of up to 16 depths >= 0",
     .help = "KV cache depths to run every test at"},
    {.lng = "repetitions", .shrt = 'r', .kind = CLI_INT, .metavar = "N", .cmds = CLI_BENCH_MODEL,
     .off = F(reps), .lo = 1, .hi = 1000, .def = "5", .help = "timed runs per test, 1..1000"},
    {.lng = "output", .shrt = 'o', .kind = CLI_CHOICE, .metavar = "md|json",
     .cmds = CLI_BENCH_MODEL, .off = F(output), .choices = "md|json", .def = "md",
     .help = "the table as markdown, or one JSON object {\"tests\": [...]}"},
    {.lng = "ctx", .kind = CLI_INT, .metavar = "N", .cmds = CLI_BENCH_MODEL | CLI_BENCH_BATCH, .off = F(ctx),
     .lo = 2, .hi = MAX_CTX, .help = "KV cache length (default: what the longest test needs)"},
    /* batching engine */
    {.lng = "prompts", .kind = CLI_STR, .metavar = "FILE", .cmds = CLI_RUN, .off = F(prompts),
     .help = "run every request of a JSON-lines FILE ('-': standard input) through the batching "
             "engine: one JSON object per line ({\"prompt\": ...} | {\"messages\": [...]} | "
             "{\"prompt_token_ids\": [...]}, optional max_tokens, temperature, top_p, top_k, "
             "min_p, repetition_penalty, seed, stop, ignore_eos); one JSON line per request "
             "out, in input order"},
    {.lng = "out", .shrt = 'o', .kind = CLI_STR, .metavar = "FILE", .cmds = CLI_RUN,
     .off = F(out), .help = "with --prompts: write the results to FILE (temp name, then renamed) "
                            "instead of standard output"},
    {.lng = "max-num-seqs", .kind = CLI_INT, .metavar = "N", .cmds = CLI_RUN | CLI_BENCH_BATCH,
     .off = F(max_num_seqs), .lo = 1, .hi = 65536, .must = "an integer in [1, 65536]",
     .help = "with --prompts: most sequences at once (default 64 on cuda, 8 on cpu)"},
    {.lng = "max-batch-tokens", .kind = CLI_INT, .metavar = "N",
     .cmds = CLI_RUN | CLI_BENCH_BATCH, .off = F(max_batch_tokens), .lo = 1, .hi = MAX_CTX,
     .help = "with --prompts: tokens per engine step, decode tokens and prompt chunks together "
             "(default: --batch-size)"},
    {.lng = "kv-cache-gb", .kind = CLI_FLOAT, .metavar = "G",
     .cmds = CLI_RUN | CLI_BENCH_BATCH,
     .off = F(kv_cache_gb), .lo = 0, .hi = 1e6, .lo_open = true, .must = "a number of GB > 0",
     .help = "with --prompts: KV cache per rank in GB (default: 90% of the GPU memory free "
             "after the weights; on cpu --max-num-seqs full contexts)"},
    {.lng = "block-size", .kind = CLI_INT, .metavar = "N",
     .cmds = CLI_RUN | CLI_BENCH_BATCH | CLI_SERVE,
     .off = F(block_size), .lo = 1, .hi = 1024, .def = "16",
     .help = "tokens per KV-cache block, 1..1024"},
    /* bench batch */
    {.lng = "concurrency", .kind = CLI_CUSTOM, .metavar = "LIST",
     .cmds = CLI_BENCH_BATCH | CLI_BENCH_SERVE,
     .parse = parse_conc, .def = "1,8,16,32,64,128,256",
     .must = "a comma-separated list of up to 16 counts >= 1",
     .help = "sequences at once, one test each"},
    {.lng = "input-len", .kind = CLI_INT, .metavar = "N", .cmds = CLI_BENCH_BATCH | CLI_BENCH_SERVE,
     .off = F(input_len), .lo = 1, .hi = MAX_CTX, .def = "128", .help = "prompt tokens per request"},
    {.lng = "output-len", .kind = CLI_INT, .metavar = "N", .cmds = CLI_BENCH_BATCH | CLI_BENCH_SERVE,
     .off = F(output_len), .lo = 1, .hi = MAX_CTX, .def = "128",
     .help = "generated tokens per request (eos ignored)"},
    {.lng = "num-prompts", .kind = CLI_INT, .metavar = "N", .cmds = CLI_BENCH_BATCH | CLI_BENCH_SERVE,
     .off = F(num_prompts), .lo = 1, .hi = 1 << 20,
     .help = "requests per test (default: 4 x the concurrency, at least 16)"},
    {.lng = "output", .shrt = 'o', .kind = CLI_CHOICE, .metavar = "md|json",
     .cmds = CLI_BENCH_BATCH | CLI_BENCH_SERVE, .off = F(output), .choices = "md|json", .def = "md",
     .help = "the table as markdown, or one JSON object {\"tests\": [...]}"},
    /* serve */
    {.lng = "host", .kind = CLI_STR, .metavar = "ADDR", .cmds = CLI_SERVE, .off = F(host),
     .def = "127.0.0.1", .help = "address to listen on (an IPv4 or IPv6 literal; 0.0.0.0: every "
                                  "interface)"},
    {.lng = "port", .kind = CLI_INT, .metavar = "N", .cmds = CLI_SERVE, .off = F(port), .lo = 0,
     .hi = 65535, .def = "8000",
     .help = "TCP port (0: any free port; the one taken is printed: \"listening on ...\")"},
    {.lng = "api-key", .kind = CLI_STR, .metavar = "KEY", .cmds = CLI_SERVE, .off = F(api_key),
     .help = "require \"Authorization: Bearer KEY\" on /v1/*, /tokenize, /detokenize "
             "(default: the environment's QSHARD_API_KEY, else none)"},
    {.lng = "api-key", .kind = CLI_STR, .metavar = "KEY", .cmds = CLI_BENCH_SERVE,
     .off = F(api_key),
     .help = "send \"Authorization: Bearer KEY\" (default: the environment's QSHARD_API_KEY)"},
    {.lng = "max-num-seqs", .kind = CLI_INT, .metavar = "N", .cmds = CLI_SERVE,
     .off = F(max_num_seqs), .lo = 1, .hi = 65536, .must = "an integer in [1, 65536]",
     .help = "most sequences in the batch at once (default 256 on cuda, 8 on cpu)"},
    {.lng = "max-batch-tokens", .kind = CLI_INT, .metavar = "N", .cmds = CLI_SERVE,
     .off = F(max_batch_tokens), .lo = 1, .hi = MAX_CTX,
     .help = "tokens per engine step, decode tokens and prompt chunks together (default: "
             "--batch-size)"},
    {.lng = "kv-cache-gb", .kind = CLI_FLOAT, .metavar = "G", .cmds = CLI_SERVE,
     .off = F(kv_cache_gb), .lo = 0, .hi = 1e6, .lo_open = true, .must = "a number of GB > 0",
     .help = "KV cache per rank in GB (default: 90% of the GPU memory free after the weights; "
             "on cpu --max-num-seqs full contexts)"},
    {.lng = "chat-template", .kind = CLI_CHOICE, .metavar = "F", .cmds = CLI_SERVE,
     .off = F(chat_template), .choices = "llama2|llama3|mistral|chatml|qwen|gemma|phi3",
     .help = "the chat template family of /v1/chat/completions: llama2, llama3, mistral, "
             "chatml, qwen, gemma, phi3 (default: recognised from tokenizer_config.json)"},
    {.lng = "ctx", .kind = CLI_INT, .metavar = "N", .cmds = CLI_SERVE, .off = F(ctx), .lo = 2,
     .hi = MAX_CTX, .must = "an integer in [2, 16777216]",
     .help = "context length in tokens: a prompt plus its max_tokens must fit (default: "
             "min(max_position_embeddings, 4096))"},
    {.lng = "seed", .kind = CLI_U64, .metavar = "S", .cmds = CLI_SERVE, .off = F(seed),
     .help = "seeds the default seeds of requests without \"seed\" (default: from the clock)"},
    {.lng = "seed", .kind = CLI_U64, .metavar = "S", .cmds = CLI_BENCH_SERVE, .off = F(seed),
     .help = "seed of the random prompt token ids (default 0)"},
    {.lng = "served-model-name", .kind = CLI_STR, .metavar = "NAME", .cmds = CLI_SERVE,
     .off = F(served_model_name),
     .help = "the model's name in the API (default: MODEL as given, as vLLM)"},
    {.lng = "max-queue", .kind = CLI_INT, .metavar = "N", .cmds = CLI_SERVE, .off = F(max_queue),
     .lo = 1, .hi = 1 << 20, .def = "1024",
     .help = "requests waiting for a sequence slot at most; more get 429"},
    {.lng = "timeout", .kind = CLI_INT, .metavar = "S", .cmds = CLI_SERVE, .off = F(timeout),
     .lo = 1, .hi = 86400, .def = "600",
     .help = "close a connection idle (nothing received or sent) for S seconds"},
    {.lng = "max-body-mb", .kind = CLI_INT, .metavar = "N", .cmds = CLI_SERVE,
     .off = F(max_body_mb), .lo = 1, .hi = 4096, .def = "32",
     .help = "largest request body in MiB; larger gets 413"},
    {.lng = "shutdown-timeout", .kind = CLI_INT, .metavar = "S", .cmds = CLI_SERVE,
     .off = F(shutdown_timeout), .lo = 0, .hi = 3600, .def = "10",
     .help = "on SIGINT/SIGTERM: seconds running requests may take to finish before they are "
             "cancelled"},
    /* bench serve */
    {.lng = "url", .kind = CLI_STR, .metavar = "URL", .cmds = CLI_BENCH_SERVE, .off = F(url),
     .def = "http://127.0.0.1:8000",
     .help = "the server (qshard serve, vllm serve or any OpenAI-compatible one)"},
    {.lng = "model", .kind = CLI_STR, .metavar = "NAME", .cmds = CLI_BENCH_SERVE,
     .off = F(served_model_name),
     .help = "the \"model\" of each request (default: the first of GET /v1/models)"},
    /* bench synth / open / verify */
    {.lng = "size-mb", .kind = CLI_INT, .metavar = "N", .cmds = CLI_BENCH_SYNTH,
     .off = F(size_mb), .lo = 1, .hi = 16777216, .help = "file size in MiB (required)"},
    {.lng = "tensor-mb", .kind = CLI_INT, .metavar = "M", .cmds = CLI_BENCH_SYNTH,
     .off = F(tensor_mb), .lo = 1, .hi = 16777216, .def = "64",
     .help = "size of each tensor in MiB"},
    {.lng = "tensors", .kind = CLI_INT, .metavar = "N", .cmds = CLI_BENCH_SYNTH,
     .off = F(n_tensors), .lo = 1, .hi = 1000000,
     .help = "N equal tensors instead (e.g. a real model's count; sizes from --size-mb)"},
    {.lng = "repeat", .kind = CLI_INT, .metavar = "N", .cmds = CLI_BENCH_OPEN,
     .off = F(repeat), .lo = 1, .hi = 1000000, .def = "50", .help = "timed runs"},
    {.lng = "repeat", .kind = CLI_INT, .metavar = "N", .cmds = CLI_BENCH_VERIFY,
     .off = F(repeat), .lo = 1, .hi = 1000000, .def = "3", .help = "timed runs (best kept)"},
    {.lng = "cold", .kind = CLI_FLAG, .cmds = CLI_BENCH_VERIFY, .off = F(cold),
     .help = "drop the file from the page cache before every timed pass"},
    {.lng = "repeat", .shrt = 'r', .kind = CLI_INT, .metavar = "N", .cmds = CLI_BENCH_LOAD,
     .off = F(repeat), .lo = 1, .hi = 100, .def = "3",
     .help = "process starts timed (median and best reported)"},
    {.lng = "cold", .kind = CLI_FLAG, .cmds = CLI_BENCH_LOAD, .off = F(cold),
     .help = "drop the model's rank files from the page cache (posix_fadvise) before each read "
             "pass and each start, so they come from the disk"},
    /* inspect / verify */
    {.lng = "tensors", .kind = CLI_FLAG, .cmds = CLI_INSPECT, .off = F(tensor_table),
     .help = "every rank file in full: header, sections, tokenizer files, config and the "
             "tensor table (default: a summary of the model)"},
    {.lng = "json", .kind = CLI_FLAG, .cmds = CLI_INSPECT, .off = F(json),
     .help = "the full description (as --tensors) as one JSON document {\"files\": [...]} on "
             "stdout"},
    {.lng = "tensor", .shrt = 't', .kind = CLI_STR, .metavar = "NAME", .cmds = CLI_VERIFY,
     .off = F(tensor), .help = "check only this tensor's checksum (and the structure)"},
    {.lng = "verbose", .shrt = 'v', .kind = CLI_FLAG, .cmds = CLI_VERIFY, .off = F(verbose),
     .help = "progress on stderr"},
    /* convert */
    {.lng = "tp", .shrt = 't', .kind = CLI_INT, .metavar = "N", .cmds = CLI_CONVERT,
     .off = F(tp), .lo = 1, .hi = 4096,
     .help = "tensor-parallel ranks (required; N must divide the attention heads; the error "
             "lists the valid values)"},
    {.lng = "dry-run", .shrt = 'n', .kind = CLI_FLAG, .cmds = CLI_CONVERT, .off = F(dry_run),
     .help = "print the plan (per-rank heads, sizes, padding) and write nothing"},
    {.lng = "no-check", .kind = CLI_FLAG, .cmds = CLI_CONVERT, .off = F(no_check),
     .help = "skip the bitwise self-check of every repacked linear"},
    {.lng = "threads", .shrt = 'j', .kind = CLI_INT, .metavar = "N", .cmds = CLI_CONVERT,
     .off = F(cvt_threads), .lo = 1, .hi = 1024,
     .help = "worker threads (default: one per online core)"},
    {.lng = "quiet", .shrt = 'q', .kind = CLI_FLAG, .cmds = CLI_CONVERT, .off = F(quiet),
     .help = "no progress bar and no info messages"},
    {.lng = "force", .shrt = 'f', .kind = CLI_FLAG, .cmds = CLI_CONVERT, .off = F(force),
     .help = "replace an earlier conversion in OUT_DIR: it stays intact until the new one is "
             "complete, then its manifest and rank files (any tp) are replaced; other files "
             "are left alone"},
    {.lng = "debug-no-fast-path", .kind = CLI_FLAG, .cmds = CLI_CONVERT, .sec = CLI_SEC_DEBUG,
     .off = F(no_fast_path),
     .help = "repack every linear through the generic AWQ decoder instead of the AutoAWQ GEMM "
             "fast path (slower; the same bytes: an A/B check of the two paths)"},
    /* sampling */
    {.lng = "temp", .kind = CLI_FLOAT, .metavar = "T", .cmds = CLI_RUN, .sec = CLI_SEC_SAMPLING,
     .off = F(temp), .lo = 0, .hi = FLT_MAX, .def = "0.8", .must = "a number >= 0",
     .help = "temperature; 0 = greedy (argmax)"},
    {.lng = "top-k", .kind = CLI_INT, .metavar = "K", .cmds = CLI_RUN, .sec = CLI_SEC_SAMPLING,
     .off = F(top_k), .lo = 0, .hi = INT32_MAX, .def = "40", .must = "an integer >= 0",
     .help = "keep the K most likely tokens (0 = off)"},
    {.lng = "top-p", .kind = CLI_FLOAT, .metavar = "P", .cmds = CLI_RUN, .sec = CLI_SEC_SAMPLING,
     .off = F(top_p), .lo = 0, .hi = 1, .lo_open = true, .def = "0.95",
     .help = "nucleus: smallest set with mass >= P (1 = off)"},
    {.lng = "min-p", .kind = CLI_FLOAT, .metavar = "P", .cmds = CLI_RUN, .sec = CLI_SEC_SAMPLING,
     .off = F(min_p), .lo = 0, .hi = 1, .def = "0",
     .help = "drop tokens below P x the top probability (0 = off)"},
    {.lng = "repeat-penalty", .kind = CLI_FLOAT, .metavar = "R", .cmds = CLI_RUN,
     .sec = CLI_SEC_SAMPLING, .off = F(repeat_penalty), .lo = 0, .hi = FLT_MAX, .lo_open = true,
     .def = "1", .must = "a number > 0",
     .help = "CTRL penalty on tokens already seen (1 = off)"},
    {.lng = "seed", .kind = CLI_U64, .metavar = "S", .cmds = CLI_RUN | CLI_BENCH_BATCH,
     .sec = CLI_SEC_SAMPLING, .off = F(seed),
     .help = "PRNG seed: the same seed gives the same output (default: from the clock, "
             "printed with -v)"},
    /* context */
    {.lng = "ctx", .kind = CLI_INT, .metavar = "N", .cmds = CLI_RUN | CLI_LOGITS,
     .sec = CLI_SEC_CONTEXT, .off = F(ctx), .lo = 2, .hi = MAX_CTX,
     .must = "an integer in [2, 16777216]: the context holds at least one prompt token and one "
             "generated token",
     .help = "context limit = KV cache length in tokens, >= 2 (default: "
             "min(max_position_embeddings, 4096)); a logits prompt must fit"},
    {.lng = "truncate", .kind = CLI_FLAG, .cmds = CLI_RUN, .sec = CLI_SEC_CONTEXT,
     .off = F(truncate),
     .help = "keep the last ctx-1 prompt tokens of a prompt that does not fit (default: refuse "
             "it, exit 2)"},
    /* every model command */
    {.lng = "device", .kind = CLI_CHOICE, .metavar = "cpu|cuda", .cmds = CLI_MODEL_CMDS | CLI_BENCH_LOAD,
     .sec = CLI_SEC_MODEL, .off = F(device), .choices = "cpu|cuda",
     .help = "where to run (default: cuda when the binary has CUDA and a GPU is present, else "
             "cpu)"},
    {.lng = "threads", .kind = CLI_INT, .metavar = "N", .cmds = CLI_MODEL_CMDS,
     .sec = CLI_SEC_MODEL, .off = F(threads), .lo = 1, .hi = 4096,
     .help = "CPU threads (default: all online CPUs)"},
    {.lng = "batch-size", .shrt = 'b', .kind = CLI_INT, .metavar = "N", .cmds = CLI_MODEL_CMDS,
     .sec = CLI_SEC_MODEL, .off = F(batch), .lo = 1, .hi = MAX_CTX,
     .help = "most prompt tokens per forward pass (default: 2048 on cuda, 512 on cpu; at most "
             "the context); longer prompts run in chunks"},
    {.lng = "verbose", .shrt = 'v', .kind = CLI_FLAG,
     .cmds = CLI_MODEL_CMDS | CLI_TOKENIZE | CLI_CONVERT, .sec = CLI_SEC_MODEL, .off = F(verbose),
     .help = "debug messages (the resolved config, where each value came from) and where an "
             "error was detected"},
    {.lng = "help", .shrt = 'h', .kind = CLI_FLAG, .cmds = ALL_CMDS, .sec = CLI_SEC_MODEL,
     .off = F(verbose), .help = "this text"},
    /* debug switches of every model command (struct rt_opts fields) */
    {.lng = "debug-no-graph", .kind = CLI_FLAG, .cmds = CLI_MODEL_CMDS, .sec = CLI_SEC_DEBUG,
     .off = F(no_graph), .help = "CUDA: run each decode step op by op instead of replaying "
                                 "its recorded CUDA graph (rt_opts.no_graph)"},
    {.lng = "debug-no-pdl", .kind = CLI_FLAG, .cmds = CLI_MODEL_CMDS, .sec = CLI_SEC_DEBUG,
     .off = F(no_pdl), .help = "CUDA: plain launches, no Programmatic Dependent Launch of the "
                               "W4A16 kernels (rt_opts.no_pdl)"},
    {.lng = "debug-no-defer", .kind = CLI_FLAG, .cmds = CLI_MODEL_CMDS, .sec = CLI_SEC_DEBUG,
     .off = F(no_defer), .help = "CUDA: finish each decode linear's split-K sum itself "
                                 "instead of deferring it to the next op (rt_opts.no_defer)"},
    {.lng = "debug-no-rope-kv", .kind = CLI_FLAG, .cmds = CLI_MODEL_CMDS, .sec = CLI_SEC_DEBUG,
     .off = F(no_rope_kv), .help = "CUDA: RoPE and the KV-cache store as two kernels, not "
                                   "fused (rt_opts.no_rope_kv)"},
    {.lng = "debug-no-wgmma", .kind = CLI_FLAG, .cmds = CLI_MODEL_CMDS, .sec = CLI_SEC_DEBUG,
     .off = F(no_wgmma), .help = "CUDA: dequant + cuBLAS for every prompt chunk above 64 "
                                 "tokens, no wgmma kernel (rt_opts.no_wgmma)"},
    {.lng = "debug-no-p2p", .kind = CLI_FLAG, .cmds = CLI_MODEL_CMDS, .sec = CLI_SEC_DEBUG,
     .off = F(no_p2p), .help = "CUDA, TP > 1: every all-reduce through NCCL, none through our "
                               "peer-to-peer kernel (rt_opts.p2p_allreduce = 0); needed under "
                               "compute-sanitizer or CUDA_LAUNCH_BLOCKING=1"},
    {.lng = "debug-host-sample", .kind = CLI_FLAG, .cmds = CLI_MODEL_CMDS, .sec = CLI_SEC_DEBUG,
     .off = F(host_sample), .help = "choose the next token on the host from the downloaded "
                                    "logits row, not on the GPU (rt_opts.host_sample)"},
};

const size_t cli_table_n = sizeof(cli_table) / sizeof(cli_table[0]);
